// @ts-check
// Prefix tree panel: the prefix cache as a tree of cached blocks, at the shown step. Each row is
// one cached prefix (a block's content), named by the engine's block hash, the id the pool's
// tooltip shows; its lifeline runs over the whole run: where a block held it (a bar), each hit
// (a tick), each eviction (a cross), and the shown step (a line). Linked: hovering a row lights
// its blocks in the pool (kvsLink) and a hovered block lights its row; a click pins it and
// opens its detail. The slider scrubs every panel to a step.

/**
 * The traits this panel reads (explorer/ui/why_view.py tree_state): `tree`, a KvsPrefixTreeDict
 * (widgets/prefix_tree.py) of KvsTreeNodeDict nodes.
 */

const TREE_LOOK = {
  present: KVS_MARKS.hashed,
  gone: "#bdbdbd",
  hit: KVS_MARKS.cache,
  evicted: "#c62828",
  cursor: "#111",
};
const LIFE_W = 220,
  LIFE_H = 16;

/** Steps where the prefix held a block: [[from, to|null]]. @param {KvsTreeNodeDict} n */
function heldSpans(n) {
  const ev = [...n.stored.map((s) => [s, 1]), ...n.evictions.map((e) => [e.step, -1])].sort(
    (a, b) => a[0] - b[0] || a[1] - b[1],
  );
  /** @type {[number, number|null][]} */
  const out = [];
  let count = 0,
    from = null;
  for (const [s, d] of ev) {
    count += d;
    if (count > 0 && from === null) from = s;
    if (count <= 0 && from !== null) {
      out.push([from, s]);
      from = null;
    }
  }
  if (from !== null) out.push([from, null]);
  return out;
}

/** The node's lifeline over the run. @param {KvsTreeNodeDict} n @param {KvsPrefixTreeDict} t */
function lifeline(n, t) {
  const first = t.first_step,
    last = Math.max(t.last_step, first + 1);
  const x = (/** @type {number} */ s) => ((s - first) / (last - first)) * (LIFE_W - 4) + 2;
  const svg = kvsSvg("svg", { width: LIFE_W, height: LIFE_H, class: "kvs-life", "data-testid": "kvs-tree-life" });
  svg.append(kvsSvg("line", { x1: 0, x2: LIFE_W, y1: LIFE_H - 3, y2: LIFE_H - 3, stroke: "#eee" }));
  for (const [a, b] of heldSpans(n)) {
    const b2 = b === null ? t.step : b;
    svg.append(
      kvsSvg("rect", {
        x: x(a),
        y: LIFE_H - 6,
        width: Math.max(1, x(b2) - x(a)),
        height: 4,
        fill: TREE_LOOK.present,
        opacity: 0.6,
      }),
    );
  }
  const peak = Math.max(1, ...n.lifeline);
  const w = (LIFE_W - 4) / n.lifeline.length;
  n.lifeline.forEach((h, i) => {
    if (!h) return;
    const hh = 2 + Math.round(((LIFE_H - 8) * h) / peak);
    svg.append(
      kvsSvg("rect", {
        x: 2 + i * w,
        y: LIFE_H - 7 - hh,
        width: Math.max(1, w - 0.5),
        height: hh,
        fill: TREE_LOOK.hit,
      }),
    );
  });
  for (const e of n.evictions) {
    svg.append(
      kvsSvg(
        "text",
        { x: x(e.step), y: LIFE_H - 2, "font-size": 9, fill: TREE_LOOK.evicted, "text-anchor": "middle" },
        "\u2715",
      ),
    );
  }
  svg.append(
    kvsSvg("line", { x1: x(t.step), x2: x(t.step), y1: 0, y2: LIFE_H, stroke: TREE_LOOK.cursor, "stroke-width": 1 }),
  );
  return svg;
}

/** @param {KvsTreeNodeDict} n */
function nodeTitle(n) {
  const lines = [
    `${n.id} \u00b7 ${n.num_tokens} tokens${n.domain ? ` \u00b7 ${n.domain}` : ""}`,
    JSON.stringify(n.text),
  ];
  lines.push(
    n.present
      ? `held by block${n.blocks.length > 1 ? "s" : ""} ${n.blocks.join(", ") || "(none shown)"}`
      : "not cached at this step",
  );
  lines.push(`first computed by #${n.first_by}; ${kvsCount(n.hits, "hit")} until this step`);
  for (const e of n.evictions) {
    lines.push(
      `evicted at step ${e.step} (block ${e.block}) by #${e.by ?? "?"}'s allocation` +
        (e.age_steps !== null ? `, ${e.age_steps} steps after it joined the free queue` : ""),
    );
  }
  if (n.unused) lines.push("evicted unused: no request hit it before it went");
  return lines.join("\n");
}

/** What a row's colours and marks mean. */
function treeLegend() {
  return kvsEl("div", { class: "kvs-legend kvs-tree-legend" }, [
    kvsSwatch({ fill: TREE_LOOK.present, border: TREE_LOOK.present }, "holds a block"),
    kvsSwatch({ fill: "#fff", border: TREE_LOOK.gone, dashed: true }, "evicted (no block)"),
    kvsSwatch({ fill: TREE_LOOK.hit, border: TREE_LOOK.hit }, "hits over the run"),
    kvsSwatch({ fill: "#fff", border: TREE_LOOK.evicted, icon: "\u2715" }, "an eviction"),
    kvsSwatch({ fill: "#fff3e0", border: "#e65100" }, "evicted unused"),
  ]);
}

/** One node's row: its id, text, blocks at the shown step, hits and lifeline.
 * @param {KvsTreeNodeDict} n @param {KvsPrefixTreeDict} t the tree @param {boolean} isPinned
 * @param {{onmouseenter: Function, onmouseleave: Function, onclick: Function}} on */
function treeRow(n, t, isPinned, on) {
  return kvsEl(
    "div",
    {
      class: `kvs-tree-row${n.present ? "" : " kvs-tree-gone"}${n.unused ? " kvs-tree-unused" : ""}${isPinned ? " kvs-tree-pinned" : ""}`,
      "data-testid": "kvs-tree-node",
      "data-key": n.id,
      "data-present": n.present ? "true" : "false",
      "data-blocks": n.blocks.join(" "),
      "data-hits": n.hits,
      title: nodeTitle(n),
      ...on,
    },
    [
      kvsEl("span", { class: "kvs-tree-indent", style: { width: `${Math.min(n.depth, 12) * 12}px` } }),
      kvsEl("span", { class: "kvs-mono kvs-tree-id", text: n.id }),
      kvsEl("span", { class: "kvs-tree-text", text: kvsTok(n.text) }),
      kvsEl("span", {
        class: "kvs-chip kvs-tree-blocks",
        "data-testid": "kvs-tree-blocks",
        text: n.present ? (n.blocks.length ? `block ${n.blocks.join(", ")}` : "cached") : "evicted",
      }),
      kvsEl("span", { class: `kvs-tree-hits${n.hits ? "" : " kvs-muted"}`, text: `hits ${n.hits}` }),
      lifeline(n, t),
    ],
  );
}

/** @param {KvsRenderContextOf<KvsPanelStates["tree"]>} ctx */
function render({ model, el }) {
  const root = kvsRoot(el, model, "kvs-prefix-tree");
  const sender = kvsSender(model);
  const sub = kvsEl("span", { class: "kvs-sub", "data-testid": "kvs-tree-sub" });
  const title = kvsEl("div", { class: "kvs-title" }, ["Prefix tree", sub]);
  const slider = /** @type {HTMLInputElement} */ (
    kvsEl("input", {
      type: "range",
      class: "kvs-tree-slider",
      "data-testid": "kvs-tree-slider",
      title: "scrub every panel to a step",
    })
  );
  const stepLabel = kvsEl("span", { class: "kvs-tree-step", "data-testid": "kvs-tree-step" });
  const live = kvsEl("button", {
    class: "kvs-tree-live",
    "data-testid": "kvs-tree-live",
    text: "live",
    title: "back to the latest step",
  });
  const counts = kvsEl("span", { class: "kvs-tree-counts", "data-testid": "kvs-tree-counts" });
  const agree = kvsEl("span", { class: "kvs-tree-agree", "data-testid": "kvs-tree-agree" });
  // Evicted prefixes with nothing cached under them fold away: the cache as it is comes first.
  const fold = kvsEl("button", {
    class: "kvs-tree-fold",
    "data-testid": "kvs-tree-fold",
    title: "evicted prefixes with no cached prefix under them",
  });
  const bar = kvsEl("div", { class: "kvs-tree-bar" }, [stepLabel, slider, live, counts, fold, agree]);
  const legend = treeLegend();
  const rows = kvsEl("div", { class: "kvs-tree-rows", "data-testid": "kvs-tree-rows" });
  const detail = kvsEl("div", { class: "kvs-tree-detail", "data-testid": "kvs-tree-detail" });
  root.append(title, bar, legend, rows, detail);
  let focus = /** @type {?KvsFocus} */ (null),
    pinned = /** @type {?string} */ (null),
    unfolded = false;
  /** @type {[HTMLElement, KvsTreeNodeDict][]} */
  let drawn = [];
  const link = kvsLink(model, (f) => {
    focus = f;
    light();
  });

  slider.addEventListener("change", () => sender.send({ action: "scrub_step", step: Number(slider.value) }));
  slider.addEventListener("input", () => {
    stepLabel.textContent = `step ${slider.value}`;
  });
  live.addEventListener("click", () => sender.send({ action: "live" }));
  fold.addEventListener("click", () => {
    unfolded = !unfolded;
    draw();
  });

  /** @param {KvsTreeNodeDict} n */
  const nodeFocus = (n) => ({
    source: "tree",
    blocks: n.blocks.length ? n.blocks : null,
    requests: n.blocks.length ? null : n.users,
    tokens: null,
  });
  function light() {
    for (const [row, n] of drawn) {
      let on = false;
      if (focus && focus.source !== "tree") {
        if (focus.blocks)
          on = n.blocks.some((b) => /** @type {KvsFocus & {blocks: number[]}} */ (focus).blocks.includes(b));
        else if (focus.requests)
          on = [...n.owners, ...n.users].some((r) =>
            /** @type {KvsFocus & {requests: string[]}} */ (focus).requests.includes(r),
          );
      } else if (focus && focus.source === "tree") {
        on = focus.blocks
          ? n.blocks.some((b) => /** @type {KvsFocus & {blocks: number[]}} */ (focus).blocks.includes(b))
          : false;
      }
      row.classList.toggle("kvs-lit", on);
    }
  }
  function showDetail(/** @type {?KvsTreeNodeDict} */ n) {
    if (!n) {
      detail.replaceChildren(
        kvsEl("span", { class: "kvs-muted", text: "hover a node for its blocks in the pool; click to pin it here" }),
      );
      return;
    }
    detail.replaceChildren(kvsEl("pre", { class: "kvs-tree-detail-text", text: nodeTitle(n) }));
  }
  function draw() {
    const t = model.get("tree") || {};
    const nodes = t.nodes || [];
    const atLive = model.get("live");
    sub.textContent =
      `the prefix cache at step ${t.step ?? "?"}` + (atLive ? "" : " (scrubbed: the panels show this step)");
    slider.min = String(t.first_step ?? 0);
    slider.max = String(t.last_step ?? 0);
    slider.value = String(t.step ?? 0);
    stepLabel.textContent = `step ${t.step ?? 0}`;
    live.disabled = !!atLive;
    counts.textContent =
      `${kvsCount(t.num_present || 0, "prefix", "prefixes")} cached \u00b7 ${t.num_evicted || 0} evicted \u00b7 ${kvsCount(t.num_hits || 0, "hit")}` +
      (t.hidden ? ` \u00b7 ${t.hidden} more not drawn` : "");
    const kv = t.kv_events;
    agree.textContent = kv
      ? kv.agree
        ? `vLLM's KV events: ${kv.blocks} blocks, the same prefixes \u2713`
        : `vLLM's KV events differ: ${kv.blocks} blocks; only here ${kv.only_here.join(", ") || "-"}, only in events ${kv.only_in_events.join(", ") || "-"}`
      : "";
    agree.className = `kvs-tree-agree ${kv && !kv.agree ? "kvs-tree-warn" : ""}`;
    const folded = nodes.filter((n) => n.folded).length;
    fold.hidden = !folded;
    fold.textContent = unfolded
      ? `hide ${kvsCount(folded, "evicted prefix", "evicted prefixes")}`
      : `show ${kvsCount(folded, "evicted prefix", "evicted prefixes")}`;
    fold.dataset.unfolded = String(unfolded);
    drawn = [];
    if (!nodes.length) {
      rows.replaceChildren(
        kvsEl("span", {
          class: "kvs-muted",
          "data-testid": "kvs-tree-empty",
          text: "no block was cached by this step",
        }),
      );
      showDetail(null);
      return;
    }
    const visible = nodes.filter((n) => unfolded || !n.folded);
    if (!visible.length) {
      rows.replaceChildren(
        kvsEl("span", {
          class: "kvs-muted",
          "data-testid": "kvs-tree-empty",
          text: "nothing is cached at this step: every prefix was evicted (show them above)",
        }),
      );
      showDetail(null);
      return;
    }
    rows.replaceChildren(
      ...visible.map((n) => {
        const row = treeRow(n, t, pinned === n.id, {
          onmouseenter: () => {
            link.hover(nodeFocus(n));
            if (!pinned) showDetail(n);
          },
          onmouseleave: () => link.leave("tree"),
          onclick: () => {
            pinned = pinned === n.id ? null : n.id;
            link.pin(nodeFocus(n));
            showDetail(pinned ? n : null);
            draw();
          },
        });
        drawn.push([row, n]);
        return row;
      }),
    );
    const p = nodes.find((n) => n.id === pinned);
    showDetail(p || null);
    light();
  }
  kvsOnChange(model, KVS_PANELS.tree.draw, draw, ["live"]);
  focus = link.current();
  draw();
  return () => {
    sender.dispose();
    link.dispose();
  };
}

export default { render };
