// @ts-check
// Follow / Pause a live vLLM server and the feed's counters (the prefix cache is the prefix tree panel's).

/**
 * The traits this panel reads (widgets/follow.py): `following` (Follow or Pause), `status`
 * (LiveSession.feed_status(): the feed's counters, the last rejection, the rebased count).
 */

/** @param {KvsRenderContext} ctx */
function render({ model, el }) {
  const root = kvsRoot(el, model, "kvs-follow");
  const sender = kvsSender(model);
  const button = kvsEl("button", { "data-testid": "kvs-follow-toggle" });
  const state = kvsEl("span", { "data-testid": "kvs-follow-state" });
  const stats = kvsEl("span", { class: "kvs-follow-stats", "data-testid": "kvs-follow-stats" });
  const notes = kvsEl("div", { class: "kvs-follow-notes", "data-testid": "kvs-follow-notes" });
  root.append(kvsEl("div", { class: "kvs-title" }, ["Live vLLM server"]),
              kvsEl("div", { class: "kvs-follow-bar" }, [button, state, stats]), notes);
  button.addEventListener("click", () => sender.send({ action: model.get("following") ? "pause" : "follow" }));

  function draw() {
    const on = model.get("following"), s = model.get("status") || {}, sv = s.server || {};
    button.textContent = on ? "Pause" : "Follow";
    state.textContent = on ? "following" : `paused${s.pending ? ` (${s.pending} steps waiting)` : ""}`;
    const lost = (s.missed || 0) + (s.dropped_here || 0);
    stats.replaceChildren(
      kvsEl("span", { text: `${s.engine || "vLLM"} at ${s.address || "?"} · run ${(s.run_id || "").slice(0, 8)} · applied ${s.applied || 0}` }),
      kvsEl("span", { class: lost ? "kvs-follow-warn" : "", "data-testid": "kvs-follow-lost",
                      text: ` · missed ${s.missed || 0}, dropped here ${s.dropped_here || 0}`
                        + (s.rebased ? ` (state retaken from ${s.rebased} snapshot${s.rebased > 1 ? "s" : ""})` : ""),
                      title: "a missed step is never patched over: the state comes from a fresh snapshot" }),
      kvsEl("span", { class: s.rejected ? "kvs-follow-warn" : "", text: ` · rejected ${s.rejected || 0}` }),
      kvsEl("span", { text: ` · recorder: sent ${sv.published || 0}, unobserved ${sv.unobserved || 0}, errors ${sv.errors || 0}` }));
    notes.replaceChildren(...(s.notes || []).slice(-3).map((n) => kvsEl("div", { text: n })));
  }
  kvsOnChange(model, KVS_PANELS.follow.draw, draw);
  draw();
}

export default { render };
