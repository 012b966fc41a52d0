// @ts-check
// Slot mapping: an overview strip of the packed batch (query_start_loc ticks, sampled
// rows marked), then per scheduled request its token cells, grouped and tinted by the
// KV block each lands in. Positions a prefix hit took from the cache come first, as
// "from cache" cells (one per block). A decode is one compact row. Linked: hovering a
// cell lights its block, request and token in the other panels (kvsLink).

/**
 * The traits this panel reads (explorer/ui/views.py slot_mapping_state; typed by KvsPanelStates["slots"],
 * generated from widgets/slot_mapping.py): the packed batch's per-row lists (`input_ids`, `tokens`,
 * `positions`, `slot_mapping`, cut to the rows sent), `query_start_loc`, `logits_indices`, `block_size`,
 * `num_rows`, `truncated`, and `segments` (KvsSlotSegmentDict: one scheduled request's rows [start, end),
 * its `cached_blocks` (KvsCachedBlockDict) and its tables in the other KV cache groups).
 * @typedef {{ids: number[], toks: string[], pos: number[], slots: number[], groupSlots: number[][],
 *   logits: Set<number>, bs: number}} SlotData  the packed batch's rows, as draw() hands them on
 */

/** What a cell's tint, marks and text mean. */
function slotLegend() {
  return kvsEl("div", { class: "kvs-legend", "data-testid": "kvs-slot-legend" }, [
    kvsSwatch(
      { stripes: [kvsBlockTint(1), kvsBlockTint(2), kvsBlockTint(3)], border: "#bbb" },
      "tint = KV block",
      "kvs-slot-leg-block",
      "cells are tinted by the physical block their KV is written to; a tag like b5 opens each block's group",
    ),
    kvsSwatch(
      { fill: "#e3ecf7", border: KVS_MARKS.cache, icon: "\u21ba" },
      "from cache",
      "kvs-slot-leg-cache",
      "positions whose KV a prefix-cache hit supplied: not computed in this step, one cell per block",
    ),
    kvsSwatch(
      { fill: "#fce4ec", border: KVS_MARKS.sampled, icon: "\u2192" },
      "sampled row",
      "kvs-slot-leg-sampled",
      "a logits index: the sampler reads this row's output to choose the next token",
    ),
    kvsSwatch(
      { border: "#333", fill: "#fff" },
      "first row = query_start_loc",
      "kvs-slot-leg-qsl",
      "a thick left edge marks where each request's rows start",
    ),
    kvsEl("span", { class: "kvs-muted", text: "cell: token \u00b7 position\u2192slot" }),
  ]);
}

/** @param {string} rid */
function chip(rid) {
  return kvsEl("span", {
    class: "kvs-chip",
    style: { background: kvsColor(rid, true), borderColor: kvsColor(rid) },
    text: `#${rid}`,
  });
}

/** The overview strip: one segment per request, as wide as its rows. @param {KvsSlotSegmentDict} s */
function stripSegment(s) {
  return kvsEl(
    "div",
    {
      class: `kvs-strip-seg ${s.is_prefill ? "kvs-prefill" : "kvs-decode"}`,
      style: {
        flexGrow: String(Math.max(1, s.end - s.start)),
        background: kvsColor(s.request_id, true),
        borderColor: kvsColor(s.request_id),
      },
      title: `#${s.request_id}: rows [${s.start}, ${s.end})`,
    },
    [kvsEl("span", { text: `#${s.request_id} [${s.start},${s.end})` })],
  );
}

/**
 * The panel's linked elements: each is registered with the block, request and position it
 * shows, lights up when the Dashboard's focus matches it, and publishes its own focus.
 * @param {ReturnType<typeof kvsLink>} link
 */
function makeLinker(link) {
  /** @type {Array<[HTMLElement, number, string, ?number]>} */
  let lit = [];
  const L = {
    reset() {
      lit = [];
    },
    /** Hover: a focus; click: pinned. @param {HTMLElement} node @param {KvsFocus} f */
    bind(node, f) {
      node.addEventListener("mouseenter", () => link.hover(f));
      node.addEventListener("mouseleave", () => link.leave("slots"));
      node.addEventListener("click", () => link.pin(f));
      return node;
    },
    /** Bound, and lit when a focus matches. @param {HTMLElement} node @param {number} block @param {string} rid @param {?number} pos @param {KvsFocus} f */
    add(node, block, rid, pos, f) {
      lit.push([node, block, rid, pos]);
      return L.bind(node, f);
    },
    /** @param {?KvsFocus} focus */
    light(focus) {
      for (const [node, b, rid, pos] of lit) {
        const m = kvsMatch(focus, b, rid, pos);
        node.classList.toggle("kvs-lit", m === 1);
        node.classList.toggle("kvs-lit-strong", m === 2);
      }
    },
  };
  return L;
}
/** @typedef {ReturnType<typeof makeLinker>} Linker */

/** A block a prefix hit took from the cache: one "from cache" cell. @param {Linker} L @param {KvsSlotSegmentDict} s @param {KvsCachedBlockDict} c */
function cacheCell(L, s, c) {
  const node = kvsEl(
    "div",
    {
      class: "kvs-cache-cell",
      "data-block": c.block,
      "data-testid": `kvs-cache-${s.request_id}-${c.block}`,
      style: { background: kvsBlockTint(c.block) },
      title: `#${s.request_id} positions ${c.start}\u2013${c.end - 1}: KV from the prefix cache, in block ${c.block} (a hit: not computed in this step)${c.text ? `\n"${c.text}"` : ""}`,
    },
    [
      kvsEl("div", { class: "kvs-cache-head", text: `\u21ba b${c.block}` }),
      kvsEl("div", { class: "kvs-cache-text", text: c.text ? kvsTok(c.text) : `p${c.start}\u2013${c.end - 1}` }),
    ],
  );
  return L.add(node, c.block, s.request_id, null, {
    source: "slots",
    blocks: [c.block],
    requests: [s.request_id],
    tokens: null,
  });
}

/** A request's rows of the batch, grouped by the KV block each lands in. @param {Linker} L @param {KvsSlotSegmentDict} s @param {SlotData} data */
function rowCells(L, s, data) {
  const { ids, toks, pos, slots, groupSlots, logits, bs } = data;
  const groups = [];
  let group = null,
    groupBlock = null;
  const last = Math.min(s.end, ids.length);
  for (let r = s.start; r < last; r++) {
    const slot = slots[r];
    const block = slot < 0 ? -1 : Math.floor(slot / bs),
      off = slot < 0 ? "-" : slot % bs;
    if (group === null || block !== groupBlock) {
      groupBlock = block;
      const tag = kvsEl("span", {
        class: "kvs-blk-tag",
        text: block < 0 ? "pad" : `b${block}`,
        title: `KV block ${block}`,
      });
      if (block >= 0)
        L.add(tag, block, s.request_id, null, {
          source: "slots",
          blocks: [block],
          requests: [s.request_id],
          tokens: null,
        });
      group = kvsEl("div", { class: "kvs-blk", "data-block": block, style: { background: kvsBlockTint(block) } }, [
        tag,
      ]);
      groups.push(group);
    }
    const sampled = logits.has(r);
    const cell = kvsEl(
      "div",
      {
        class: `kvs-cell${sampled ? " kvs-logits" : ""}${r === s.start ? " kvs-qsl" : ""}`,
        "data-row": r,
        "data-block": block,
        "data-pos": pos[r],
        title: `#${s.request_id} row ${r} \u00b7 token id ${ids[r]} \u00b7 position ${pos[r]} \u00b7 slot ${slot} = block ${block} \u00d7 ${bs} + ${off}${sampled ? " \u00b7 sampled (logits index)" : ""}`,
      },
      [
        kvsEl("div", { class: "kvs-cell-tok", text: kvsTok(toks[r]) || ids[r] }),
        kvsEl("div", { class: "kvs-cell-slot", text: `${pos[r]}\u2192${slot}` }),
        // Other KV cache groups (sliding-window layers) write this token's K/V to a slot of their own.
        ...groupSlots.map((g, k) =>
          kvsEl("div", {
            class: "kvs-cell-slot kvs-cell-group-slot",
            "data-group": k + 1,
            title: `${(s.groups || [])[k]?.label || `group ${k + 1}`}: slot ${g[r]}`,
            text: `\u21b3${g[r]}`,
          }),
        ),
      ],
    );
    group.append(
      L.add(cell, block, s.request_id, pos[r], {
        source: "slots",
        blocks: [block],
        requests: [s.request_id],
        tokens: [[s.request_id, pos[r]]],
      }),
    );
    if (sampled) {
      group.append(
        kvsEl("span", {
          class: "kvs-cell-sampled",
          "data-testid": "kvs-slot-sampled",
          title: "the token sampled from this row",
          text: s.sampled_text != null ? `\u2192 ${kvsTok(s.sampled_text)}` : "\u2192 sample",
        }),
      );
    }
  }
  if (s.end > last)
    groups.push(kvsEl("div", { class: "kvs-muted", text: `\u2026 ${s.end - last} more rows not sent` }));
  return groups;
}

/**
 * One scheduled request: a decode on one compact row, a prefill chunk with its cells under a head.
 * @param {Linker} L @param {KvsSlotSegmentDict} s @param {SlotData} data
 */
function segmentRow(L, s, data) {
  const reqFocus = { source: "slots", blocks: null, requests: [s.request_id], tokens: null };
  const table = [
    `block_table [${(s.block_table || []).join(", ")}]`,
    ...(s.groups || []).map((g) => `${g.label} [${g.block_table.join(", ")}]`),
  ].join(" \u00b7 ");
  if (!s.is_prefill) {
    return kvsEl(
      "div",
      {
        class: "kvs-seg kvs-seg-decode",
        "data-testid": `kvs-seg-${s.request_id}`,
        style: { borderLeftColor: kvsColor(s.request_id) },
      },
      [
        L.bind(chip(s.request_id), reqFocus),
        kvsEl("span", { class: "kvs-seg-kind", text: "decode" }),
        ...rowCells(L, s, data),
        kvsEl("span", {
          class: "kvs-muted kvs-seg-meta",
          title: table,
          text: `seq_len ${s.seq_len} \u00b7 ${(s.block_table || []).length} blocks`,
        }),
      ],
    );
  }
  const head = kvsEl("div", { class: "kvs-seg-head" }, [
    L.bind(chip(s.request_id), reqFocus),
    kvsEl("span", {
      class: "kvs-seg-kind",
      title: kvsChunkTitle(s.chunk_index),
      text: `prefill chunk ${kvsChunkNumber(s.chunk_index)} \u00b7 ${s.end - s.start} tokens \u00b7 rows [${s.start}, ${s.end}) \u00b7 seq_len ${s.seq_len}`,
    }),
    kvsEl("span", { class: "kvs-muted", text: `computed before ${s.num_computed_before} \u00b7 ${table}` }),
  ]);
  const cells = [...(s.cached_blocks || []).map((c) => cacheCell(L, s, c)), ...rowCells(L, s, data)];
  return kvsEl(
    "div",
    { class: "kvs-seg", "data-testid": `kvs-seg-${s.request_id}`, style: { borderLeftColor: kvsColor(s.request_id) } },
    [head, kvsEl("div", { class: "kvs-cells" }, cells)],
  );
}

/** @param {KvsRenderContextOf<KvsPanelStates["slots"]>} ctx */
function render({ model, el }) {
  const root = kvsRoot(el, model, "kvs-slot-mapping");
  // Where the batch came from when it is not the engine's own (a live server's feed derives it).
  const source = kvsEl("span", { class: "kvs-batch-source", "data-testid": "kvs-batch-source" });
  const sub = kvsEl("span", { class: "kvs-sub" });
  const strip = kvsEl("div", { class: "kvs-strip", "data-testid": "kvs-batch-strip" });
  const body = kvsEl("div", { class: "kvs-segments" });
  root.append(kvsEl("div", { class: "kvs-title" }, ["Slot mapping", source, sub]), slotLegend(), strip, body);
  /** @type {?KvsFocus} */
  let focus = null;
  const link = kvsLink(model, (f) => {
    focus = f;
    L.light(focus);
  });
  const L = makeLinker(link);

  function draw() {
    const segs = model.get("segments"),
      qsl = model.get("query_start_loc"),
      nrows = model.get("num_rows");
    const logits = new Set(model.get("logits_indices"));
    const data = {
      ids: model.get("input_ids"),
      toks: model.get("tokens"),
      pos: model.get("positions"),
      slots: model.get("slot_mapping"),
      groupSlots: model.get("group_slot_mappings") || [],
      logits,
      bs: model.get("block_size"),
    };
    L.reset();
    const [badge, why] = model.get("batch_source_words") || [];
    source.textContent = badge || "";
    source.title = why || "";
    source.dataset.source = model.get("batch_source") || "";
    source.hidden = !badge;
    sub.textContent = nrows
      ? `${kvsCount(nrows, "token")} \u00b7 ${kvsCount(segs.length, "request")} \u00b7 query_start_loc [${qsl.join(", ")}] \u00b7 logits_indices [${[...logits].join(", ")}]`
      : "no batch in this step";
    strip.replaceChildren(...segs.map(stripSegment)); // widths proportional to each request's tokens
    body.replaceChildren(...segs.map((s) => segmentRow(L, s, data)));
    L.light(focus);
  }
  kvsOnChange(model, KVS_PANELS.slots.draw, kvsBatched(draw));
  focus = link.current();
  draw();
  return () => link.dispose();
}

export default { render };
