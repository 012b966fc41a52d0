// @ts-check
// Sampler: horizontal probability bars of the top candidates; the chosen token marked.

/**
 * The traits this panel reads (explorer/ui/views.py sampler_state; KvsSamplerState): `requests`
 * (ids sampled in the shown step), `request_id` (the one shown) and `sample` (KvsSamplerSample):
 * the chosen token and `top`, [token id, text, probability] of the candidates, the highest
 * first; only {note, params} before the request's first token.
 */

/** @param {KvsRenderContextOf<KvsPanelStates["sampler"]>} ctx */
function render({ model, el }) {
  const root = kvsRoot(el, model, "kvs-sampler");
  const sender = kvsSender(model);
  const sel = kvsEl("select", { "data-testid": "kvs-sampler-request" });
  const sub = kvsEl("span", { class: "kvs-sub" });
  const params = kvsEl("div", { class: "kvs-params", "data-testid": "kvs-sampler-params" });
  const bars = kvsEl("div", { class: "kvs-bars", "data-testid": "kvs-sampler-bars" });
  root.append(
    kvsEl("div", { class: "kvs-title" }, ["Sampler", sub]),
    kvsEl("label", {}, ["request ", sel]),
    params,
    bars,
  );
  sel.addEventListener("change", () => sender.send({ action: "select", request_id: sel.value }));

  function draw() {
    const reqs = model.get("requests"),
      cur = model.get("request_id"),
      s = model.get("sample") || {};
    const opts = !cur || reqs.includes(cur) ? reqs : [cur, ...reqs];
    sel.replaceChildren(
      ...(opts.length ? opts : [""]).map((r) =>
        kvsEl("option", { value: r, text: r ? `#${r}${reqs.includes(r) ? "" : " (not sampled now)"}` : "(none)" }),
      ),
    );
    sel.value = cur;
    if (!s.top) {
      sub.textContent = "";
      params.replaceChildren();
      bars.replaceChildren(kvsEl("span", { class: "kvs-muted", text: s.note || "no request sampled yet" }));
      return;
    }
    sub.textContent = s.step === model.get("step") ? `sampled in step ${s.step}` : `last sampled in step ${s.step}`;
    const p = s.params || {};
    params.replaceChildren(
      ...Object.entries(p).map(([k, v]) =>
        kvsEl("span", { class: "kvs-chip", text: `${k} ${v === null ? "none" : v}` }),
      ),
    );
    const maxP = Math.max(1e-9, ...s.top.map((t) => t[2]));
    bars.replaceChildren(
      ...s.top.map(([id, text, prob]) => {
        const chosen = id === s.token_id;
        return kvsEl(
          "div",
          {
            class: `kvs-bar-row${chosen ? " kvs-chosen" : ""}`,
            "data-testid": chosen ? "kvs-sampler-chosen" : null,
            title: `token id ${id}`,
          },
          [
            kvsEl("span", { class: "kvs-cand kvs-mono", text: kvsTok(text) || `<${id}>` }),
            kvsEl("span", { class: "kvs-bar-track" }, [
              kvsEl("span", {
                class: "kvs-bar-fill",
                style: {
                  width: `${((100 * prob) / maxP).toFixed(1)}%`,
                  background: chosen ? kvsColor(s.request_id) : "#9e9e9e",
                },
              }),
            ]),
            kvsEl("span", { class: "kvs-prob", text: `${(100 * prob).toFixed(2)}%` }),
            chosen ? kvsEl("span", { class: "kvs-chip kvs-chosen-chip", text: "chosen" }) : null,
          ],
        );
      }),
    );
    if (s.note) {
      // the record has no candidates: the chosen token (when known) and why
      if (s.token_id !== null) {
        bars.append(
          kvsEl("div", { class: "kvs-bar-row kvs-chosen", "data-testid": "kvs-sampler-chosen" }, [
            kvsEl("span", {
              class: "kvs-cand kvs-mono",
              title: `token id ${s.token_id}`,
              text: kvsTok(s.text) || `<${s.token_id}>`,
            }),
            kvsEl("span"),
            kvsEl("span"),
            kvsEl("span", { class: "kvs-chip kvs-chosen-chip", text: "chosen" }),
          ]),
        );
      }
      bars.append(
        kvsEl("div", { class: "kvs-muted kvs-sampler-note", "data-testid": "kvs-sampler-note", text: s.note }),
      );
    } else if (!s.top.some((t) => t[0] === s.token_id)) {
      bars.append(
        kvsEl("div", { class: "kvs-bar-row kvs-chosen", "data-testid": "kvs-sampler-chosen" }, [
          kvsEl("span", { class: "kvs-cand kvs-mono", text: kvsTok(s.text) }),
          kvsEl("span", { class: "kvs-muted", text: "chosen (outside the top list)" }),
        ]),
      );
    }
  }
  const drawSoon = kvsBatched(draw);
  kvsOnChange(model, KVS_PANELS.sampler.draw, drawSoon, ["step"]);
  draw();
  return () => sender.dispose();
}

export default { render };
