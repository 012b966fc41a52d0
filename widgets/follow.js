// @ts-check
// Follow / Pause a live vLLM server and the feed's counters (the prefix cache is the prefix tree panel's).

/**
 * The traits this panel reads (widgets/follow.py): `following` (Follow or Pause), `status`
 * (KvsFollowStatus: Session.feed_status(), the feed's counters, the last rejection, the rebased count) and
 * `parked_at` (the step the view is scrubbed back to while following, or null).
 *
 * Pause holds the Dashboard's panels at the step they show at once, in the browser (kvsHold):
 * the kernel may be running a cell and hear the click only when it ends, while its follow thread
 * keeps applying steps. It then shows that step and pauses; `following` turning false releases
 * the hold. Follow releases it and returns the view to the latest step.
 */

/** @param {KvsRenderContextOf<KvsPanelStates["follow"]>} ctx */
function render({ model, el }) {
  const root = kvsRoot(el, model, "kvs-follow");
  const sender = kvsSender(model);
  const button = kvsEl("button", { "data-testid": "kvs-follow-toggle" });
  const state = kvsEl("span", { "data-testid": "kvs-follow-state" });
  const stats = kvsEl("span", { class: "kvs-follow-stats", "data-testid": "kvs-follow-stats" });
  const notes = kvsEl("div", { class: "kvs-follow-notes", "data-testid": "kvs-follow-notes" });
  root.append(
    kvsEl("div", { class: "kvs-title" }, ["Live vLLM server"]),
    kvsEl("div", { class: "kvs-follow-bar" }, [button, state, stats]),
    notes,
  );
  /** @type {?number} */
  let pausingAt = null; // Pause clicked, the kernel has not answered yet: the panels are held here
  button.addEventListener("click", () => {
    if (model.get("following") && pausingAt === null) {
      const shown = kvsLinkBus(/** @type {string} */ (model.get("link_group")) || "kvs-default").shown;
      pausingAt = shown ?? Number(model.get("step"));
      kvsHold(model, pausingAt);
      sender.send({ action: "pause", at_step: pausingAt });
    } else {
      pausingAt = null;
      kvsRelease(model);
      sender.send({ action: "follow" });
    }
    draw();
  });

  function draw() {
    const on = model.get("following"),
      s = model.get("status") || {},
      sv = s.server || {};
    if (!on && pausingAt !== null) {
      // the kernel paused: the panels now show the held step
      pausingAt = null;
      kvsRelease(model);
    }
    const parked = model.get("parked_at");
    button.textContent = on && pausingAt === null ? "Pause" : "Follow";
    state.textContent =
      pausingAt !== null
        ? `pausing at step ${pausingAt}\u2026 (held here; the kernel is busy)`
        : on
          ? parked == null
            ? "following"
            : `following; the view is parked at step ${parked}: Live shows the latest`
          : `paused${s.pending ? ` (${s.pending} steps waiting)` : ""}`;
    const lost = (s.missed || 0) + (s.dropped_here || 0);
    stats.replaceChildren(
      kvsEl("span", {
        text: `${s.engine || "vLLM"} at ${s.address || "?"} · run ${(s.run_id || "").slice(0, 8)} · applied ${s.applied || 0}`,
      }),
      kvsEl("span", {
        class: lost ? "kvs-follow-warn" : "",
        "data-testid": "kvs-follow-lost",
        text:
          ` · missed ${s.missed || 0}, dropped here ${s.dropped_here || 0}` +
          (s.rebased ? ` (state retaken from ${s.rebased} snapshot${s.rebased > 1 ? "s" : ""})` : ""),
        title: "a missed step is never patched over: the state comes from a fresh snapshot",
      }),
      kvsEl("span", { class: s.rejected ? "kvs-follow-warn" : "", text: ` · rejected ${s.rejected || 0}` }),
      kvsEl("span", {
        text: ` · recorder: sent ${sv.published || 0}, unobserved ${sv.unobserved || 0}, errors ${sv.errors || 0}`,
      }),
    );
    notes.replaceChildren(...(s.notes || []).slice(-3).map((n) => kvsEl("div", { text: n })));
  }
  kvsOnChange(model, KVS_PANELS.follow.draw, draw, [], true); // redraws while held: it says it is pausing
  draw();
}

export default { render };
