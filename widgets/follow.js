// @ts-check
// Follow / Pause a live vLLM server, the feed's counters, and vLLM's prefix cache as a hash tree.

/**
 * The traits this panel reads (widgets/follow.py): `following` (Follow or Pause), `status`
 * (LiveSession.feed_status(): the feed's counters, the last rejection, the rebased count) and
 * `tree` (vLLM's prefix cache from its KV events: {roots, num_blocks, counters}).
 */

/** @param {KvsRenderContext} ctx */
function render({ model, el }) {
  const root = kvsRoot(el, model, "kvs-follow");
  const sender = kvsSender(model);
  const button = kvsEl("button", { "data-testid": "kvs-follow-toggle" });
  const state = kvsEl("span", { "data-testid": "kvs-follow-state" });
  const stats = kvsEl("span", { class: "kvs-follow-stats", "data-testid": "kvs-follow-stats" });
  const notes = kvsEl("div", { class: "kvs-follow-notes", "data-testid": "kvs-follow-notes" });
  const tree = kvsEl("div", { class: "kvs-tree", "data-testid": "kvs-follow-tree" });
  root.append(kvsEl("div", { class: "kvs-title" }, ["Live vLLM server"]),
              kvsEl("div", { class: "kvs-follow-bar" }, [button, state, stats]), notes, tree);
  button.addEventListener("click", () => sender.send({ action: model.get("following") ? "pause" : "follow" }));

  function node(n) {
    const label = [kvsEl("span", { text: n.key, title: `${n.num_tokens} tokens; stored ${n.stored}x` }),
                   kvsEl("span", { class: n.hits ? "kvs-hits" : "kvs-muted", text: ` hits ${n.hits}` })];
    if (n.text) label.push(kvsEl("span", { class: "kvs-muted", text: ` ${JSON.stringify(n.text)}` }));
    if (n.orphan) label.push(kvsEl("span", { class: "kvs-orphan", text: " (parent evicted)" }));
    const li = kvsEl("li", { "data-key": n.key }, label);
    if (n.children && n.children.length) li.append(kvsEl("ul", {}, n.children.map(node)));
    return li;
  }

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
    const t = model.get("tree") || {};
    if (!t.roots) {
      tree.replaceChildren(kvsEl("span", { class: "kvs-muted", text: "no KV events: attach with kv_events=ENDPOINT to see vLLM's prefix cache" }));
    } else if (!t.roots.length) {
      tree.replaceChildren(kvsEl("span", { class: "kvs-muted", text: "vLLM's prefix cache is empty" }));
    } else {
      tree.replaceChildren(kvsEl("div", { class: "kvs-sub", text: `prefix cache (vLLM KV events): ${t.num_blocks} blocks` }),
                           kvsEl("ul", {}, t.roots.map(node)));
    }
  }
  kvsOnChange(model, KVS_PANELS.follow.draw, draw);
  draw();
}

export default { render };
