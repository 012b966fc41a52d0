// @ts-check
// The engine cores of a data-parallel server side by side: Follow / Pause, each core's load,
// and where each request went with its routing loss.

/**
 * The traits this panel reads (widgets/fleet.py FleetDrawState): `following`, `ranks` (one
 * KvsFleetRankDict per engine core), `rows` (the latest requests, KvsRoutingRowDict) and `summary`
 * (their totals, KvsFleetSummaryDict).
 */

/** @param {KvsRenderContextOf<KvsPanelStates["fleet"]>} ctx */
function render({ model, el }) {
  const root = kvsRoot(el, model, "kvs-fleet");
  const sender = kvsSender(model);
  const button = kvsEl("button", { "data-testid": "kvs-fleet-toggle" });
  const state = kvsEl("span", { "data-testid": "kvs-fleet-state" });
  const summary = kvsEl("div", { class: "kvs-fleet-summary", "data-testid": "kvs-fleet-summary" });
  const ranks = kvsEl("table", { "data-testid": "kvs-fleet-ranks" });
  const routing = kvsEl("div", { class: "kvs-fleet-routing", "data-testid": "kvs-fleet-routing" });
  const heading = kvsEl("span", { "data-testid": "kvs-fleet-title" });
  const title = kvsEl("div", { class: "kvs-title" }, [
    heading,
    kvsEl("span", { class: "kvs-sub", text: "one recorder per data-parallel rank" }),
  ]);
  root.append(title, kvsEl("div", { class: "kvs-fleet-bar" }, [button, state]), ranks, summary, routing);
  button.addEventListener("click", () => sender.send({ action: model.get("following") ? "pause" : "follow" }));

  /** @param {string|number} text @param {{[name: string]: unknown}} [attrs] */
  const cell = (text, attrs = {}) => kvsEl("td", { text: String(text), ...attrs });
  const head = (/** @type {string[]} */ names) =>
    kvsEl(
      "tr",
      {},
      names.map((n) => kvsEl("th", { text: n })),
    );

  function draw() {
    const on = model.get("following"),
      rs = model.get("ranks") || [],
      rows = model.get("rows") || [];
    const s = /** @type {Partial<KvsFleetSummaryDict>} */ (model.get("summary") || {}); // {} before the first state
    heading.textContent = `Fleet: ${rs.length} engine core${rs.length === 1 ? "" : "s"}`;
    button.textContent = on ? "Pause" : "Follow";
    state.textContent = on ? "following every rank" : "paused";
    ranks.replaceChildren(
      head(["engine core", "step", "running", "waiting", "free blocks", "requests", "feed"]),
      ...rs.map((r, k) =>
        kvsEl("tr", { "data-rank": String(k), "data-step": String(r.step) }, [
          cell(r.label, { title: r.address }),
          cell(r.step),
          cell(r.running),
          cell(r.waiting),
          cell(`${r.free_blocks} / ${r.num_blocks}`),
          cell(r.requests),
          cell(`applied ${r.applied}, missed ${r.missed}` + (r.dropped_here ? `, dropped ${r.dropped_here}` : ""), {
            class: r.missed || r.dropped_here ? "kvs-fleet-loss" : "",
          }),
        ]),
      ),
    );
    const lost = s.loss_tokens || 0;
    summary.replaceChildren(
      kvsEl("span", {
        text: `${s.requests || 0} requests (${(s.per_rank || []).map((n, k) => `${rs[k] ? rs[k].label : k}: ${n}`).join(", ")}); `,
      }),
      kvsEl("span", {
        text: `prefix hits ${s.hit_tokens || 0} tokens where they ran, ${s.best_tokens || 0} on the best rank at arrival; `,
      }),
      kvsEl("span", {
        class: lost ? "kvs-fleet-loss" : "",
        "data-testid": "kvs-fleet-loss",
        text: `routing loss ${lost} tokens (${s.requests_with_loss || 0} request${s.requests_with_loss === 1 ? "" : "s"})`,
        title:
          "tokens a request would have found in the prefix cache of the rank that held the longest prefix of its prompt when it arrived, minus those it found where it ran",
      }),
      (s.total || 0) > (s.shown || 0)
        ? kvsEl("span", { class: "kvs-muted", text: ` · latest ${s.shown} of ${s.total} shown` })
        : "",
    );
    const table = kvsEl("table", {}, [
      head(["request", "ran on", "hit", ...rs.map((r) => `${r.label} at arrival`), "loss"]),
    ]);
    for (const row of rows) {
      const tr = kvsEl("tr", { "data-request-id": row.request_id, "data-rank": String(row.rank) }, [
        kvsEl("td", {
          text: row.request_id.slice(0, 28),
          title: row.request_id,
          style: { color: kvsColor(row.request_id) },
        }),
        cell(row.label),
        cell(row.hit_tokens),
      ]);
      (row.would_hit || []).forEach((t, k) =>
        tr.append(
          cell(t === null ? "?" : t, {
            class: k === row.best_rank ? "kvs-fleet-best" : "",
            title: t === null ? "before this core's kept history" : "",
          }),
        ),
      );
      if (!row.known) for (let k = (row.would_hit || []).length; k < rs.length; k++) tr.append(cell("?"));
      tr.append(cell(row.known ? row.loss_tokens : "?", { class: row.loss_tokens ? "kvs-fleet-loss" : "" }));
      table.append(tr);
    }
    routing.replaceChildren(rows.length ? table : kvsEl("span", { class: "kvs-muted", text: "no requests yet" }));
  }
  kvsOnChange(model, KVS_PANELS.fleet.draw, draw, [], true); // (following, ranks, rows, summary; no Dashboard hold)
  draw();
}

export default { render };
