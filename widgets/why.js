// @ts-check
// Why panel: why each prompt token of the selected request hit or missed the prefix cache. The
// run's summary on top (where the missed prompt tokens went), then the request: its prompt token
// by token, coloured by class (hover a token: its class and what caused it), where it leaves the
// longest prefix an earlier request had computed, the evictions behind it, its preemptions, and
// for each cause the replay that proves it (Prove causes replays the run through vLLM's
// scheduler). Linked: hovering the request lights it in the other panels (kvsLink).

/**
 * The traits this panel reads (explorer/ui/why_view.py, typed by widgets/why.py): `summary`
 * (KvsWhySummaryDict), `request`, `proving`, `prove_off`.
 * @typedef {[number, number, string, string]} WhySpan  [start, end, class, detail] (explorer/why/model.py Span.to_list)
 * @typedef {KvsWhyRequestKnownDict | KvsWhyRequestUnknownDict | Partial<KvsWhyRequestUnknownDict>} WhyRequestShown
 *   `request`: a request admitted by the shown step, one not admitted yet, or {} (none chosen)
 */

/** A bar of classes, widths by tokens. @param {Object<string, number>} classes @param {KvsClassLookDict[]} known @param {string} testid */
function classBar(classes, known, testid) {
  const total = Object.values(classes).reduce((a, b) => a + b, 0) || 1;
  return kvsEl(
    "div",
    { class: "kvs-why-bar", "data-testid": testid },
    known
      .filter((c) => classes[c.key])
      .map((c) =>
        kvsEl("div", {
          class: "kvs-why-seg",
          "data-class": c.key,
          title: `${c.label}: ${classes[c.key]} tokens \u2014 ${c.tip}`,
          style: { width: `${(100 * classes[c.key]) / total}%`, background: KVS_WHY_LOOKS[c.key] || "#999" },
        }),
      ),
  );
}

/** Class counts as chips. @param {Object<string, number>} classes @param {KvsClassLookDict[]} known */
function classChips(classes, known) {
  return known
    .filter((c) => classes[c.key])
    .map((c) =>
      kvsSwatch(
        { fill: KVS_WHY_LOOKS[c.key], border: KVS_WHY_LOOKS[c.key] },
        `${c.label} ${classes[c.key]}`,
        `kvs-why-count-${c.key}`,
        c.tip,
      ),
    );
}

/** A class's label. @param {KvsClassLookDict[]} known @param {string} key */
function whyLabel(known, key) {
  return (known.find((c) => c.key === key) || { label: key }).label;
}

/**
 * The prompt token by token, each tinted by its class.
 * @param {KvsWhyRequestKnownDict} r the request @param {KvsWhyAdmissionDict} a its admission
 * @param {KvsClassLookDict[]} known
 */
function whyTokens(r, a, known) {
  const box = kvsEl("div", { class: "kvs-why-tokens", "data-testid": "kvs-why-tokens" });
  const cls = new Array(r.tokens.length),
    detail = new Array(r.tokens.length);
  for (const [s, e, c, d] of /** @type {WhySpan[]} */ (a.spans))
    for (let i = s; i < Math.min(e, r.tokens.length); i++) {
      cls[i] = c;
      detail[i] = d;
    }
  r.tokens.forEach((t, i) => {
    const c = cls[i] || "never_seen";
    box.append(
      kvsEl("span", {
        class: "kvs-why-tok",
        "data-testid": "kvs-why-tok",
        "data-class": c,
        "data-pos": i,
        style: {
          borderBottomColor: KVS_WHY_LOOKS[c] || "#999",
          background: kvsMix(KVS_WHY_LOOKS[c] || "#999999", "#ffffff", 0.78),
        },
        title: `token ${i}: ${whyLabel(known, c)}${detail[i] ? ` \u2014 ${detail[i]}` : ""}`,
        text: kvsTok(t),
      }),
    );
  });
  if (r.tokens_cut) box.append(kvsEl("span", { class: "kvs-muted", text: ` \u2026 ${r.tokens_cut} more tokens` }));
  return box;
}

/**
 * One row per cause of the request: its verdict and the replay behind it.
 * @param {KvsWhyRequestKnownDict} r the request @param {KvsClassLookDict[]} known
 */
function whyProofRows(r, known) {
  return Object.entries(r.proofs || {}).map(([k, p]) => {
    const label = whyLabel(known, k);
    return kvsEl(
      "div",
      { class: "kvs-why-proof", "data-testid": "kvs-why-proof", "data-class": k, "data-verdict": p.verdict },
      [
        kvsSwatch({ fill: KVS_WHY_LOOKS[k], border: KVS_WHY_LOOKS[k] }, label),
        kvsEl("span", {
          class: "kvs-chip kvs-why-verdict",
          style: { background: VERDICT_LOOK[p.verdict] || "#999", color: "#fff" },
          text: p.verdict,
        }),
        kvsEl("span", { text: ` ${p.says || ""}` }),
        p.replay
          ? kvsEl("span", {
              class: "kvs-muted",
              text: ` \u2014 replay: ${p.replay}${p.control ? `; control: ${p.control}` : ""}`,
            })
          : null,
      ],
    );
  });
}

/** @type {{[verdict: string]: string}} */
const VERDICT_LOOK = { proven: "#2e7d32", "partly proven": "#f9a825", confirmed: "#546e7a", unproven: "#9e9e9e" };

/** @param {KvsRenderContextOf<KvsPanelStates["why"]>} ctx */
function render({ model, el }) {
  const root = kvsRoot(el, model, "kvs-why");
  const sender = kvsSender(model);
  const proveTip =
    "replay this run through vLLM's own scheduler, once per cause removed: a cause counts as proven where removing it makes the tokens hit";
  const prove = kvsEl("button", {
    class: "kvs-why-prove",
    "data-testid": "kvs-why-prove",
    text: "Prove causes",
    title: proveTip,
  });
  const proving = kvsEl("span", { class: "kvs-why-proving", "data-testid": "kvs-why-proving" });
  const title = kvsEl("div", { class: "kvs-title" }, ["Why: the prompt and the prefix cache", prove, proving]);
  const summary = kvsEl("div", { class: "kvs-why-summary", "data-testid": "kvs-why-summary" });
  const request = kvsEl("div", { class: "kvs-why-request", "data-testid": "kvs-why-request" });
  root.append(title, summary, request);
  prove.addEventListener("click", () => sender.send({ action: "prove" }));
  const link = kvsLink(model, () => {});

  function known() {
    return (model.get("summary") || {}).classes_known || [];
  }

  function drawSummary() {
    const s = model.get("summary") || {};
    const parts = [
      kvsEl("div", {
        class: "kvs-why-line",
        "data-testid": "kvs-why-summary-text",
        text: s.text || "no request was admitted yet",
      }),
    ];
    if (s.classes && Object.keys(s.classes).length) {
      parts.push(
        classBar(s.classes, known(), "kvs-why-run-bar"),
        kvsEl("div", { class: "kvs-legend kvs-why-legend" }, classChips(s.classes, known())),
      );
    }
    if (s.engine_note) parts.push(kvsEl("div", { class: "kvs-muted", text: s.engine_note }));
    const p = s.proof;
    if (p) {
      const said = Object.keys({ ...p.proven, ...p.unproven }).map((k) => {
        const a = p.proven[k] || 0,
          b = p.unproven[k] || 0;
        const label = whyLabel(known(), k);
        return `${label}: ${a} of ${a + b} tokens proven`;
      });
      if (p.preemptions)
        said.push(`preemptions: ${p.preemptions_removed} of ${p.preemptions} removed by a larger pool`);
      parts.push(
        kvsEl("div", {
          class: "kvs-why-proofline",
          "data-testid": "kvs-why-proof-summary",
          text:
            `replayed through vLLM's scheduler: ${said.join("; ") || "nothing to prove"}` +
            (p.notes.length ? ` (${p.notes.join("; ")})` : ""),
        }),
      );
    }
    summary.replaceChildren(...parts);
  }

  function drawRequest() {
    const r = /** @type {WhyRequestShown} */ (model.get("request") || {});
    if (!r.request_id) {
      request.replaceChildren(
        kvsEl("span", { class: "kvs-muted", text: "click a request card to see why its prompt hit or missed" }),
      );
      return;
    }
    if (!r.known) {
      request.replaceChildren(kvsEl("span", { class: "kvs-muted", text: `#${r.request_id}: not admitted yet` }));
      return;
    }
    const rid = r.request_id;
    const head = kvsEl(
      "div",
      {
        class: "kvs-why-head",
        "data-request-id": rid,
        onmouseenter: () => link.hover({ source: "why", blocks: null, requests: [rid], tokens: null }),
        onmouseleave: () => link.leave("why"),
      },
      [
        kvsEl("span", {
          class: "kvs-chip kvs-rid",
          style: { background: kvsColor(rid, true), borderColor: kvsColor(rid) },
          text: `#${rid}`,
        }),
        kvsEl("span", { text: ` ${r.prompt_len} prompt tokens \u00b7 ${r.why}` }),
        r.domain ? kvsEl("span", { class: "kvs-chip", text: r.domain }) : null,
      ],
    );
    const parts = [head];
    const first = r.admissions[0];
    if (first) {
      parts.push(
        kvsEl("div", {
          class: "kvs-why-adm",
          text: `admitted at step ${first.step}: its lookup covered the prompt's ${first.tokens} tokens`,
        }),
        classBar(first.classes, known(), "kvs-why-req-bar"),
        kvsEl("div", { class: "kvs-legend kvs-why-legend" }, classChips(first.classes, known())),
        whyTokens(r, first, known()),
      );
      const d = first.divergence;
      parts.push(
        kvsEl("div", {
          class: "kvs-why-divergence",
          "data-testid": "kvs-why-divergence",
          text: d
            ? `first divergent token: position ${d.position}, ${JSON.stringify(d.text)}` +
              (d.other_request !== null
                ? ` \u2014 #${d.other_request} had ${d.other_text === null ? "nothing more" : JSON.stringify(d.other_text)} there, after the ${d.position} tokens they share (\u2026${JSON.stringify(d.before)})`
                : " \u2014 no earlier request had computed any of its prefix")
            : "no divergent token: an earlier request had computed this whole prompt",
        }),
      );
      if (first.evictions.length)
        parts.push(
          kvsEl(
            "ul",
            { class: "kvs-why-evictions", "data-testid": "kvs-why-evictions" },
            first.evictions.map((/** @type {string} */ e) => kvsEl("li", { text: e })),
          ),
        );
      for (const n of first.notes) parts.push(kvsEl("div", { class: "kvs-muted", text: n }));
    }
    const proofs = whyProofRows(r, known());
    parts.push(
      kvsEl(
        "div",
        { class: "kvs-why-proofs", "data-testid": "kvs-why-proofs" },
        proofs.length
          ? proofs
          : [kvsEl("span", { class: "kvs-muted", text: "causes not proven yet: press Prove causes" })],
      ),
    );
    for (const a of r.admissions.slice(1)) {
      parts.push(
        kvsEl("div", {
          class: "kvs-why-readmit",
          "data-testid": "kvs-why-readmission",
          text:
            `re-admitted at step ${a.step} after a preemption: ${a.tokens} tokens looked up again (prompt and output), ` +
            Object.entries(a.classes)
              .map(([k, n]) => `${n} ${whyLabel(known(), k)}`)
              .join(", ") +
            " \u2014 vLLM's /metrics leave these out of prefix_cache_queries and hits (its preempted counters hold them)",
        }),
      );
    }
    for (const p of r.preemptions) {
      parts.push(
        kvsEl(
          "div",
          {
            class: "kvs-why-preemption",
            "data-testid": "kvs-why-preemption",
            "data-verdict": p.proof ? p.proof.verdict : "unproven",
          },
          [
            kvsEl("span", { text: p.text }),
            p.proof ? kvsEl("span", { class: "kvs-muted", text: ` \u2014 ${p.proof.verdict}: ${p.proof.says}` }) : null,
          ],
        ),
      );
    }
    request.replaceChildren(...parts);
  }

  function drawProving() {
    const p = model.get("proving") || "";
    proving.textContent = p;
    proving.classList.toggle("kvs-why-failed", p.startsWith("could not"));
    const off = model.get("prove_off") || ""; // a page that cannot prove (an export) says why
    prove.disabled = !!off || p.startsWith("proving");
    prove.title = off || proveTip;
  }
  kvsOnChange(
    model,
    KVS_PANELS.why.summary,
    kvsBatched(() => {
      drawSummary();
      drawRequest();
    }),
  );
  kvsOnChange(model, KVS_PANELS.why.request, kvsBatched(drawRequest));
  model.on("change:proving", drawProving);
  model.on("change:prove_off", drawProving);
  drawSummary();
  drawRequest();
  drawProving();
  return () => {
    sender.dispose();
    link.dispose();
  };
}

export default { render };
