// @ts-check
// KV block pool: one canvas cell per physical block (4,096 stay fluid), a legend for
// every mark, hover tooltip with details fetched from Python, per-request block tables.
// Linked: hovering a block or a table entry lights the same block / request / tokens in
// the other panels (kvsLink), and what they point at lights up here.

// The `status` codes and the event bits come from the record schema (KVS_SCHEMA, generated
// from engine/report/schema.py); the events' colours and icons are KVS_EVENTS in _common.js.
/** @type {{[key: string]: number}} */
const STATUS = KVS_SCHEMA.block_status;
const { null: NULL_BLOCK, free: FREE, free_cached: FREE_CACHED, in_use: IN_USE, in_use_hashed: IN_USE_HASHED } = STATUS;
/** How a status reads in the hover text, by its schema key. @type {{[key: string]: string}} */
const STATUS_WORDS = {
  null: "null",
  free: "free",
  free_cached: "free (cached)",
  in_use: "in use",
  in_use_hashed: "in use (hashed)",
};
/** @type {{[code: number]: string}} */
const STATUS_NAMES = Object.fromEntries(Object.entries(STATUS).map(([key, code]) => [code, STATUS_WORDS[key] ?? key]));
/** @type {{[key: string]: number}} */
const EVENT_BIT = Object.fromEntries(KVS_SCHEMA.block_events.map((e) => [e.key, e.bit]));
const SAME_STEP = EVENT_BIT.same_step_hits,
  EVICTED = EVENT_BIT.evicted;
// Which event outlines a cell when a block has several: a same-step hit wins (the block
// was also allocated, hit and cached in this step), "cached" only when nothing else.
const OUTLINE_ORDER = ["same_step_hits", "allocated", "hits", "freed", "evicted", "cached"].map(
  (key) => /** @type {KvsEvent} */ (KVS_EVENTS.find(([, k]) => k === key)),
);
const eventNames = (/** @type {number} */ ev) => KVS_EVENTS.filter(([b]) => ev & b).map(([, , name]) => name);

// Block numbers at every pool size: the id and refcount in big cells, the id alone in a
// small font in middle cells, and in the smallest cells a badge over the hovered block.
const FULL_LABEL_PX = 26,
  ID_LABEL_PX = 15;
/** @param {number} cell */
function labelKind(cell) {
  return cell >= FULL_LABEL_PX ? "full" : cell >= ID_LABEL_PX ? "ids" : "hover";
}

/** @param {number} n */
function cellSizeFor(n) {
  if (n <= 256) return 26;
  if (n <= 1024) return 15;
  return 10;
}

/**
 * What the pool panel draws from: the model's columns, decoded once per change.
 * @typedef {{cols: {status: Uint8Array, ref: Uint16Array, owner: Int16Array, events: Uint8Array, group: Uint8Array},
 *   owners: string[], groupLabels: string[], ownersOf: Map<number, string[]>, lit: Set<number>,
 *   geom: {cell: number, ncols: number, n: number}}} PoolState
 * The panel's model: its state typed by KvsPanelStates["blocks"] (generated from widgets/block_pool.py;
 * `block_tables` rows are KvsBlockTableRowDict). The `detail` trait is outside the state's parts
 * (widgets/hover.py block_detail fills it on hover), so its shape is spelled here; and a block-table
 * cell the panel keeps to light up:
 * @typedef {KvsModelOf<KvsPanelStates["blocks"]>} PoolModel
 * @typedef {{block_id: number, ref_count: number, hash: (string|null), owners: string[], token_ids: number[],
 *   tokens: string[], is_null: boolean, is_free: boolean, step: number}} BlockDetail
 * @typedef {[HTMLElement, string, number]} TableCell  [element, request id, block]
 * @typedef {ReturnType<typeof kvsLink>} Link
 * @typedef {ReturnType<typeof kvsSender>} Sender
 */
/** @param {PoolState} P @param {PoolModel} model */
function readColumns(P, model) {
  P.cols = {
    status: kvsArray(model.get("status"), Uint8Array),
    ref: kvsArray(model.get("ref_count"), Uint16Array),
    owner: kvsArray(model.get("owner"), Int16Array),
    events: kvsArray(model.get("events"), Uint8Array),
    group: kvsArray(model.get("group"), Uint8Array),
  };
  P.groupLabels = model.get("group_labels") || [];
  P.owners = model.get("owners") || [];
  // Each entry is a pair [block_id, [indices into owners]] (its Python type can only say a list of both).
  const shared = /** @type {Array<[number, number[]]>} */ (model.get("shared") || []);
  P.ownersOf = new Map(shared.map(([b, idx]) => [b, idx.map((k) => P.owners[k])]));
}
/** @param {PoolState} P @param {number} i @returns {string[]} */
function blockOwners(P, i) {
  if (P.ownersOf.has(i)) return /** @type {string[]} */ (P.ownersOf.get(i));
  const o = P.cols.owner[i];
  return o >= 0 && o < P.owners.length ? [P.owners[o]] : [];
}
// Blocks a focus points at: its blocks, else the blocks its requests own.
/** @param {PoolState} P @param {?KvsFocus} f */
function litBlocks(P, f) {
  /** @type {Set<number>} */
  const out = new Set();
  if (!f) return out;
  if (f.blocks) {
    for (const b of f.blocks) out.add(b);
    return out;
  }
  if (f.requests) {
    const want = new Set(f.requests);
    for (let i = 0; i < P.cols.owner.length; i++)
      if (P.cols.owner[i] >= 0 && blockOwners(P, i).some((r) => want.has(r))) out.add(i);
  }
  return out;
}
/** @param {PoolState} P @param {number} i */
function fillFor(P, i) {
  const s = P.cols.status[i];
  if (s === NULL_BLOCK) return KVS_MARKS.null;
  if (s === FREE) return KVS_MARKS.free;
  if (s === FREE_CACHED) return KVS_MARKS.freeCached;
  const o = P.cols.owner[i];
  return kvsColor(o >= 0 ? P.owners[o] : null, s === IN_USE);
}
// A same-step hit: diagonal stripes over the cell, so it never reads as a plain hit.
/** @param {CanvasRenderingContext2D} ctx @param {number} x @param {number} y @param {number} cell @param {string} color */
function hatch(ctx, x, y, cell, color) {
  ctx.save();
  ctx.beginPath();
  ctx.rect(x + 1, y + 1, cell - 2, cell - 2);
  ctx.clip();
  ctx.strokeStyle = color;
  ctx.globalAlpha = 0.55;
  ctx.lineWidth = cell >= 14 ? 1.5 : 1;
  ctx.beginPath();
  const gap = cell >= 14 ? 6 : 4;
  for (let d = -cell; d < cell; d += gap) {
    ctx.moveTo(x + d, y + cell);
    ctx.lineTo(x + d + cell, y);
  }
  ctx.stroke();
  ctx.restore();
}

/**
 * The pool's canvas: one cell per block, as many columns as the panel's width holds.
 * @param {PoolState} P @param {HTMLCanvasElement} canvas @param {number} panelWidth @param {number} selected @param {number} numBlocks
 */
function drawPool(P, canvas, panelWidth, selected, numBlocks) {
  const n = numBlocks;
  const cell = cellSizeFor(n);
  const width = Math.max(200, Math.min(panelWidth - 20 || 700, 1200));
  const ncols = Math.max(1, Math.floor(width / cell));
  const nrows = Math.ceil(n / ncols);
  P.geom = { cell, ncols, n };
  const dpr = window.devicePixelRatio || 1;
  canvas.width = Math.ceil(ncols * cell * dpr);
  canvas.height = Math.ceil(Math.max(1, nrows) * cell * dpr);
  canvas.style.width = `${ncols * cell}px`;
  canvas.style.height = `${Math.max(1, nrows) * cell}px`;
  const ctx = /** @type {CanvasRenderingContext2D} */ (canvas.getContext("2d"));
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, ncols * cell, nrows * cell);
  const kind = labelKind(cell);
  canvas.dataset.labels = kind;
  ctx.textAlign = "center";
  ctx.textBaseline = "middle";
  for (let i = 0; i < n; i++)
    drawCell(ctx, P, i, (i % ncols) * cell, Math.floor(i / ncols) * cell, cell, kind, selected);
}

/**
 * One block's cell: fill (stripes when shared), hash corner, event outline, label, focus.
 * @param {CanvasRenderingContext2D} ctx @param {PoolState} P @param {number} i @param {number} x @param {number} y
 * @param {number} cell @param {string} kind @param {number} selected
 */
function drawCell(ctx, P, i, x, y, cell, kind, selected) {
  const s = P.cols.status[i];
  const shared = s >= IN_USE ? P.ownersOf.get(i) : null;
  if (shared && shared.length > 1) {
    // a shared block: one stripe per owner, in its colour
    const w = (cell - 1) / shared.length;
    shared.forEach((rid, k) => {
      ctx.fillStyle = kvsColor(rid, s === IN_USE);
      ctx.fillRect(x + 0.5 + k * w, y + 0.5, w, cell - 1);
    });
  } else {
    ctx.fillStyle = fillFor(P, i);
    ctx.fillRect(x + 0.5, y + 0.5, cell - 1, cell - 1);
  }
  if (s === FREE_CACHED || s === IN_USE_HASHED) {
    // a registered hash: a small corner mark
    ctx.fillStyle = KVS_MARKS.hashed;
    ctx.fillRect(x + cell - 4, y + 1, 3, 3);
  }
  const ev = P.cols.events[i];
  if (ev) {
    const bit = /** @type {KvsEvent} */ (OUTLINE_ORDER.find(([b]) => ev & b));
    if (ev & SAME_STEP) hatch(ctx, x, y, cell, bit[3]);
    ctx.strokeStyle = bit[3];
    ctx.lineWidth = cell >= 14 ? 2.5 : 2;
    if (ev & SAME_STEP) ctx.setLineDash([Math.max(2, cell / 6), Math.max(1.5, cell / 12)]);
    ctx.strokeRect(x + 1.5, y + 1.5, cell - 3, cell - 3);
    ctx.setLineDash([]);
    if (ev & EVICTED) {
      // evicted: a cross
      ctx.beginPath();
      ctx.moveTo(x + 2, y + 2);
      ctx.lineTo(x + cell - 2, y + cell - 2);
      ctx.moveTo(x + cell - 2, y + 2);
      ctx.lineTo(x + 2, y + cell - 2);
      ctx.stroke();
    } else if (cell >= 26) {
      // the event's icon, top left, in its colour
      ctx.fillStyle = bit[3];
      ctx.font = "bold 9px sans-serif";
      ctx.fillText(bit[4], x + 6, y + 7);
    }
  }
  if (P.cols.group[i] > 0) {
    // held in another KV cache group's table (a sliding window's): a corner triangle
    ctx.fillStyle = KVS_WHY_LOOKS.group_cut;
    ctx.beginPath();
    ctx.moveTo(x + 1, y + cell - 1);
    ctx.lineTo(x + 1, y + cell - 6);
    ctx.lineTo(x + 6, y + cell - 1);
    ctx.fill();
  }
  if (P.cols.ref[i] > 1) {
    // shared by several requests: a dark bottom bar
    ctx.fillStyle = "#000";
    ctx.fillRect(x + 1, y + cell - 3, cell - 2, 2);
  }
  if (kind === "full") {
    ctx.font = `${Math.max(8, cell / 2.6)}px sans-serif`;
    ctx.fillStyle = s === NULL_BLOCK ? "#eee" : "#222";
    ctx.fillText(P.cols.ref[i] > 1 ? `${i}\u00b7${P.cols.ref[i]}` : String(i), x + cell / 2, y + cell / 2 + 1);
  } else if (kind === "ids") {
    // the id alone; the refcount is the bottom bar and the tooltip
    ctx.font = `${i >= 1000 ? 6 : 7}px sans-serif`;
    ctx.fillStyle = s === NULL_BLOCK ? "#ddd" : "#333";
    ctx.fillText(String(i), x + cell / 2, y + cell / 2);
  }
  if (P.lit.has(i) || i === selected) {
    if (P.lit.has(i)) {
      // linked: a yellow halo inside a dark ring
      ctx.strokeStyle = KVS_MARKS.focus;
      ctx.lineWidth = 4;
      ctx.strokeRect(x + 2, y + 2, cell - 4, cell - 4);
    }
    ctx.strokeStyle = i === selected ? KVS_MARKS.selected : KVS_MARKS.focusInk;
    ctx.lineWidth = 2;
    ctx.strokeRect(x + 1, y + 1, cell - 2, cell - 2);
  }
}

/** The legend: every fill, mark and this step's event counts. @param {PoolModel} model */
function legendRows(model) {
  /** @type {{[key: string]: number}} */
  const c = model.get("counts") || {};
  const groups = model.get("group_labels") || [];
  const evs = KVS_EVENTS.map(([bit, key, name, color, icon, tipText]) => {
    const s = kvsSwatch(
      { border: color, icon, dashed: bit === SAME_STEP },
      `${name} ${c[key] ?? 0}`,
      `kvs-leg-ev-${key}`,
      `${name}: ${tipText}`,
    );
    s.classList.add("kvs-leg-event");
    if (bit === SAME_STEP) s.classList.add("kvs-leg-same-step");
    return s;
  });
  const someOwners = ["0", "1", "2"];
  return [
    kvsEl("div", { class: "kvs-leg-row" }, [
      kvsSwatch({ fill: KVS_MARKS.null }, "null", "kvs-leg-null", "block 0: padding in block tables, never handed out"),
      kvsSwatch({ fill: KVS_MARKS.free }, `free ${c.free ?? 0}`, "kvs-leg-free", "free, holds nothing reusable"),
      kvsSwatch(
        { fill: KVS_MARKS.freeCached },
        `free, cached ${c.free_cached ?? 0}`,
        "kvs-leg-cached",
        "free, but its tokens are still in the prefix cache: a later request with the same prefix can take it back",
      ),
      kvsSwatch(
        { stripes: someOwners.map((r) => kvsColor(r)) },
        `in use ${c.in_use ?? 0}`,
        "kvs-leg-used",
        "in use: filled with its owner's colour (the queues' colour of that request); pale: not yet full",
      ),
      kvsSwatch(
        { fill: kvsColor("0", true) },
        "pale = filling",
        "kvs-leg-partial",
        "in use and not yet full, so not hashed and not shareable yet",
      ),
      kvsSwatch(
        { fill: kvsColor("0"), icon: "\u25aa", color: KVS_MARKS.hashed },
        "corner = hashed",
        "kvs-leg-hashed",
        "a small dark corner: the block is full and its hash is registered in the prefix cache",
      ),
      kvsSwatch(
        { stripes: [kvsColor("0"), kvsColor("1")] },
        "stripes + bar = shared",
        "kvs-leg-shared",
        "a block held by several requests (a shared prefix) is drawn in each owner's colour, with a dark bar underneath",
      ),
      ...(groups.length > 1
        ? [
            kvsSwatch(
              { fill: kvsColor("0"), icon: "\u25e3", color: KVS_WHY_LOOKS.group_cut },
              `corner = ${groups[1]}`,
              "kvs-leg-group",
              `a purple corner: the block is in a ${groups[1]} group's table (its own KV cache group: the full-attention layers' blocks have none)`,
            ),
          ]
        : []),
      kvsEl(
        "span",
        {
          class: "kvs-leg-notation",
          "data-testid": "kvs-leg-notation",
          title: "a cell's label: the block id, then its refcount when more than one request holds it",
        },
        [kvsEl("b", { class: "kvs-mono", text: "7\u00b72" }), " = block 7, refcount 2"],
      ),
      kvsSwatch(
        { border: KVS_MARKS.focusInk, fill: KVS_MARKS.focus },
        "linked",
        "kvs-leg-focus",
        "what you point at in any panel (a slot, a table entry, a request, an attention column) lights up here",
      ),
    ]),
    kvsEl("div", { class: "kvs-leg-row" }, [kvsEl("span", { class: "kvs-muted", text: "this step:" }), ...evs]),
  ];
}

/**
 * A block's tooltip text; `d` is the detail Python sent (hash and tokens) when it is this block ({}: none).
 * @param {PoolState} P @param {number} i @param {Partial<BlockDetail>} d
 */
function describeBlock(P, i, d) {
  const s = P.cols.status[i];
  const ev = eventNames(P.cols.events[i]);
  const own = blockOwners(P, i);
  let text = `block ${i} \u00b7 ${STATUS_NAMES[s] ?? "?"} \u00b7 refcount ${P.cols.ref[i]}`;
  if (own.length) text += `\n${own.length > 1 ? "owners" : "owner"} ${own.map((r) => "#" + r).join(" ")}`;
  if (P.cols.group[i] > 0) text += `\nin the ${P.groupLabels[P.cols.group[i]] ?? "other"} group's tables`;
  if (ev.length) text += `\nthis step: ${ev.join(", ")}`;
  if (P.cols.events[i] & SAME_STEP) text += `\nsame-step ${KVS_SAME_STEP_TIP}`;
  if (d.block_id === i) {
    if (d.hash) text += `\nhash ${d.hash}`;
    if (d.token_ids && d.token_ids.length) {
      text += `\ntokens ${JSON.stringify(d.token_ids)}`;
      if (d.tokens && d.tokens.length) text += `\n"${d.tokens.join("")}"`;
    }
  }
  return text;
}

/** The pinned block's detail: refcount, owners, hash, this step's events, its tokens. @param {PoolState} P @param {BlockDetail} d */
function detailNodes(P, d) {
  const toks = (d.token_ids || []).map((id, k) =>
    kvsEl("span", { class: "kvs-tok", title: `id ${id}` }, [
      kvsEl("b", { text: kvsTok(d.tokens && d.tokens[k]) || id }),
      kvsEl("sub", { text: id }),
    ]),
  );
  const ev = d.block_id < P.cols.events.length ? P.cols.events[d.block_id] : 0;
  const events = ev
    ? kvsEl("div", { class: "kvs-block-events", "data-testid": "kvs-block-detail-events" }, [
        `this step: ${eventNames(ev).join(", ")}`,
        ev & SAME_STEP
          ? kvsEl("span", { class: "kvs-same-step-note", text: ` \u2014 same-step ${KVS_SAME_STEP_TIP}` })
          : null,
      ])
    : null;
  return [
    kvsEl("div", {}, [
      kvsEl("b", { text: `block ${d.block_id}` }),
      ` \u00b7 refcount ${d.ref_count} \u00b7 owners ${(d.owners || []).map((x) => "#" + x).join(" ") || "none"} \u00b7 hash ${d.hash ?? "none"}`,
    ]),
    ...(events ? [events] : []),
    kvsEl(
      "div",
      { class: "kvs-toks" },
      toks.length
        ? toks
        : [
            kvsEl("span", {
              class: "kvs-muted",
              text: d.is_null ? "the null block: padding, never allocated" : "no tokens",
            }),
          ],
    ),
  ];
}

/**
 * One request's block table: logical -> physical cells, linked and clickable.
 * @param {KvsBlockTableRowDict} r @param {number} bs @param {Link} link @param {Sender} sender @param {TableCell[]} tableCells
 */
function tableRow(r, bs, link, sender, tableCells) {
  const rid = r.request_id;
  const hits = new Set(r.hits || []),
    same = new Set(r.same_step_hits || []),
    cached = new Set(r.cached || []);
  const cells = r.block_table.map((b, logical) => {
    const full = (logical + 1) * bs <= r.num_computed_tokens;
    const kind = same.has(logical) ? " kvs-bt-same-step" : hits.has(logical) ? " kvs-bt-hit" : "";
    const why = same.has(logical)
      ? ` \u00b7 same-step ${KVS_SAME_STEP_TIP}`
      : hits.has(logical)
        ? " \u00b7 prefix hit in this step (KV from an earlier step)"
        : cached.has(logical)
          ? " \u00b7 from the prefix cache (a hit when the request was admitted)"
          : "";
    const cell = kvsEl(
      "span",
      {
        class: `kvs-bt-cell${full ? "" : " kvs-bt-partial"}${kind}${cached.has(logical) ? " kvs-bt-cached" : ""}`,
        "data-block": b,
        "data-logical": logical,
        title: `#${rid}: logical ${logical} (positions ${logical * bs}\u2013${(logical + 1) * bs - 1}) \u2192 physical ${b}${why}`,
        onclick: () => {
          link.pin({ source: "blocks", blocks: [b], requests: [rid] });
          sender.send({ action: "select_block", block_id: b });
        },
        onmouseenter: () => link.hover({ source: "blocks", blocks: [b], requests: [rid] }),
        onmouseleave: () => link.leave("blocks"),
      },
      [cached.has(logical) ? kvsEl("span", { class: "kvs-bt-icon", text: "\u21ba" }) : null, String(b)],
    );
    tableCells.push([cell, rid, b]);
    return cell;
  });
  const chip = kvsEl("span", {
    class: "kvs-chip kvs-bt-rid",
    style: { background: kvsColor(rid, true), borderColor: kvsColor(rid) },
    text: `#${rid}`,
    onmouseenter: () => link.hover({ source: "blocks", blocks: null, requests: [rid] }),
    onmouseleave: () => link.leave("blocks"),
    onclick: () => link.pin({ source: "blocks", blocks: null, requests: [rid] }),
  });
  const groups = r.groups || [];
  if (!groups.length)
    return kvsEl("div", { class: "kvs-bt-row", "data-testid": `kvs-bt-${rid}`, "data-request-id": rid }, [
      chip,
      ...cells,
    ]);
  // Several KV cache groups (sliding-window layers): the first row is group 0's, each other
  // group's table follows on a row of its own, each named with its prefix hit.
  return kvsEl("div", { class: "kvs-bt-groups", "data-testid": `kvs-bt-${rid}`, "data-request-id": rid }, [
    kvsEl("div", { class: "kvs-bt-row" }, [chip, groupTag(groups[0]), ...cells]),
    ...groups
      .slice(1)
      .map((g, k) =>
        kvsEl("div", { class: "kvs-bt-row kvs-bt-group", "data-group": k + 1 }, [
          groupTag(g),
          ...g.block_table.map((b, logical) => groupCell(r, g, b, logical, bs, link, sender, tableCells)),
        ]),
      ),
  ]);
}

/** A KV cache group's name on its block-table row, with its own prefix hit (and whether it cut the request's). @param {KvsGroupRowDict} g */
function groupTag(g) {
  const hit = g.hit_tokens == null ? "" : ` \u00b7 hit ${g.hit_tokens}`;
  return kvsEl("span", {
    class: `kvs-bt-group-tag${g.cut ? " kvs-bt-cut" : ""}`,
    "data-testid": "kvs-bt-group-tag",
    text: `${g.label}${hit}${g.cut ? " \u2190 cut" : ""}`,
    title: g.cut
      ? "this group's prefix hit was the shortest: the request's hit is cut to it (every group must hit)"
      : "this group's own prefix hit when the request was admitted (the request's is the shortest of the groups')",
  });
}

/**
 * One entry of another group's table: a block, or the null block 0 where a block left the sliding window.
 * @param {KvsBlockTableRowDict} r @param {KvsGroupRowDict} g @param {number} b @param {number} logical @param {number} bs
 * @param {Link} link @param {Sender} sender @param {TableCell[]} tableCells
 */
function groupCell(r, g, b, logical, bs, link, sender, tableCells) {
  const rid = r.request_id,
    range = `positions ${logical * bs}\u2013${(logical + 1) * bs - 1}`;
  if (b === 0) {
    return kvsEl("span", {
      class: "kvs-bt-cell kvs-bt-null",
      "data-block": 0,
      "data-logical": logical,
      text: "\u2205",
      title: `#${rid} ${g.label}: logical ${logical} (${range}) \u2192 the null block: these tokens left the window, their block was freed`,
    });
  }
  const cell = kvsEl("span", {
    class: `kvs-bt-cell${(logical + 1) * bs <= r.num_computed_tokens ? "" : " kvs-bt-partial"}`,
    "data-block": b,
    "data-logical": logical,
    text: String(b),
    title: `#${rid} ${g.label}: logical ${logical} (${range}) \u2192 physical ${b}`,
    onclick: () => {
      link.pin({ source: "blocks", blocks: [b], requests: [rid] });
      sender.send({ action: "select_block", block_id: b });
    },
    onmouseenter: () => link.hover({ source: "blocks", blocks: [b], requests: [rid] }),
    onmouseleave: () => link.leave("blocks"),
  });
  tableCells.push([cell, rid, b]);
  return cell;
}

/**
 * The pointer over the canvas: hovering a block publishes its focus, shows its number and a
 * tooltip, and (once the pointer rests) asks Python for its hash and tokens; a click pins it.
 * Returns which block is hovered (-1: none).
 * @param {{P: PoolState, model: KvsModel, canvas: HTMLCanvasElement, tip: HTMLElement, hoverNum: HTMLElement,
 *   link: Link, sender: Sender, describe: (i: number) => string, blockFocus: (i: number) => KvsFocus}} o
 */
function wirePointer({ P, model, canvas, tip, hoverNum, link, sender, describe, blockFocus }) {
  let hover = -1;
  /** @type {ReturnType<typeof setTimeout> | undefined} */
  let detailTimer;
  /** @param {MouseEvent} ev */
  function blockAt(ev) {
    const r = canvas.getBoundingClientRect();
    const cx = Math.floor((ev.clientX - r.left) / P.geom.cell),
      cy = Math.floor((ev.clientY - r.top) / P.geom.cell);
    if (cx < 0 || cx >= P.geom.ncols || cy < 0) return -1;
    const i = cy * P.geom.ncols + cx;
    return i < P.geom.n ? i : -1;
  }
  /** @param {number} i */
  function showHoverNum(i) {
    if (labelKind(P.geom.cell) === "full") {
      hoverNum.style.display = "none";
      return;
    }
    hoverNum.textContent = String(i);
    hoverNum.style.display = "block";
    hoverNum.style.left = `${canvas.offsetLeft + (i % P.geom.ncols) * P.geom.cell + P.geom.cell / 2}px`;
    const row = Math.floor(i / P.geom.ncols); // above the cell, or below it on the first row (never clipped)
    hoverNum.style.top = `${canvas.offsetTop + (row === 0 ? P.geom.cell : row * P.geom.cell)}px`;
    hoverNum.style.transform = row === 0 ? "translate(-50%, 0)" : "translate(-50%, -100%)";
  }
  canvas.addEventListener("mousemove", (/** @type {MouseEvent} */ ev) => {
    const i = blockAt(ev);
    if (i !== hover) {
      hover = i;
      if (i >= 0) link.hover(blockFocus(i));
      else link.leave("blocks");
      clearTimeout(detailTimer);
      // Ask Python for hash and tokens only once the pointer rests on a block.
      if (i >= 0) detailTimer = setTimeout(() => sender.send({ action: "block_detail", block_id: i }), 60);
    }
    if (i < 0) {
      tip.style.display = "none";
      hoverNum.style.display = "none";
      return;
    }
    showHoverNum(i);
    tip.textContent = describe(i);
    tip.style.display = "block";
    kvsPlaceTip(tip, ev); // a long token list flips and wraps, never past the window's edge
  });
  canvas.addEventListener("mouseleave", () => {
    hover = -1;
    tip.style.display = "none";
    hoverNum.style.display = "none";
    link.leave("blocks");
  });
  canvas.addEventListener("click", (/** @type {MouseEvent} */ ev) => {
    const i = blockAt(ev);
    if (i < 0) return;
    link.pin(blockFocus(i));
    sender.send({ action: "select_block", block_id: i === model.get("selected") ? -1 : i });
  });
  return { hovered: () => hover };
}

/** @param {KvsRenderContextOf<KvsPanelStates["blocks"]>} ctx */
function render({ model, el }) {
  const root = kvsRoot(el, model, "kvs-block-pool");
  const sender = kvsSender(model);
  const title = kvsEl("div", { class: "kvs-title" }, ["KV block pool", kvsEl("span", { class: "kvs-sub" })]);
  const legend = kvsEl("div", { class: "kvs-legend", "data-testid": "kvs-block-legend" });
  const canvas = kvsEl("canvas", { class: "kvs-pool-canvas", "data-testid": "kvs-pool-canvas" });
  const tip = kvsEl("div", { class: "kvs-tooltip", "data-testid": "kvs-block-tooltip" });
  const detailBox = kvsEl("div", { class: "kvs-block-detail", "data-testid": "kvs-block-detail" });
  const tables = kvsEl("div", { class: "kvs-block-tables", "data-testid": "kvs-block-tables" });
  // Over the hovered cell: its number, readable at any pool size.
  const hoverNum = kvsEl("div", { class: "kvs-pool-hover-num", "data-testid": "kvs-pool-hover-num" });
  root.append(
    title,
    legend,
    kvsEl("div", { class: "kvs-canvas-wrap" }, [canvas, hoverNum]),
    detailBox,
    kvsEl("div", { class: "kvs-title kvs-bt-title" }, [
      "Block tables",
      kvsEl("span", { class: "kvs-sub", text: "logical \u2192 physical \u00b7 \u21ba = KV from the prefix cache" }),
    ]),
    tables,
  );
  document.body.append(tip);

  /** @type {PoolState} ownersOf: block -> [request ids] of a block with several owners; lit: blocks matching the focus */
  const P = {
    cols: {
      status: new Uint8Array(0),
      ref: new Uint16Array(0),
      owner: new Int16Array(0),
      events: new Uint8Array(0),
      group: new Uint8Array(0),
    },
    owners: [],
    groupLabels: [],
    ownersOf: new Map(),
    lit: new Set(),
    geom: { cell: 10, ncols: 1, n: 0 },
  };
  /** @type {?KvsFocus} */
  let focus = null; // what another panel (or this one) points at
  const frozen = () => !!model.get("frozen");

  function draw() {
    drawPool(P, canvas, root.clientWidth, frozen() ? -1 : model.get("selected"), model.get("num_blocks"));
  }

  function drawLegend() {
    legend.replaceChildren(...legendRows(model));
    title.querySelector(".kvs-sub").textContent =
      `${model.get("num_blocks")} blocks \u00d7 ${model.get("block_size")} tokens \u00b7 block 0 is the null block`;
  }

  /** @type {TableCell[]} */
  let tableCells = []; // [element, request id, block]
  function drawTables() {
    const rows = model.get("block_tables") || [];
    const bs = model.get("block_size");
    tableCells = [];
    tables.replaceChildren(...rows.map((r) => tableRow(r, bs, link, sender, tableCells)));
    if (!rows.length) tables.append(kvsEl("span", { class: "kvs-muted", text: "no request holds blocks" }));
    lightTables();
  }
  function lightTables() {
    for (const [cell, rid, b] of tableCells) cell.classList.toggle("kvs-lit", kvsMatch(focus, b, rid) > 0);
  }

  const describe = (/** @type {number} */ i) => describeBlock(P, i, model.get("detail") || {});

  function drawDetail() {
    const d = model.get("detail") || {};
    const sel = model.get("selected");
    detailBox.replaceChildren(
      ...(sel < 0 || d.block_id !== sel
        ? [kvsEl("span", { class: "kvs-muted", text: "hover a block for details, click to pin" })]
        : detailNodes(P, d)),
    );
  }

  const blockFocus = (/** @type {number} */ i) => {
    const own = blockOwners(P, i);
    return { source: "blocks", blocks: [i], requests: own.length ? own : null };
  };
  const link = kvsLink(model, (f) => {
    focus = f;
    P.lit = litBlocks(P, f);
    draw();
    lightTables();
  });

  const pointer = wirePointer({ P, model, canvas, tip, hoverNum, link, sender, describe, blockFocus });
  function refocus() {
    P.lit = litBlocks(P, focus);
  }
  function redrawAll() {
    readColumns(P, model);
    refocus();
    draw();
    drawLegend();
    drawTables();
    drawDetail();
  }
  const poolSoon = kvsBatched(() => {
    readColumns(P, model);
    refocus();
    draw();
    drawLegend();
    drawDetail();
  }); // detail shows the events
  kvsOnChange(model, KVS_PANELS.blocks.pool, poolSoon, ["frozen"]);
  kvsOnChange(model, KVS_PANELS.blocks.legend, drawLegend);
  kvsOnChange(model, KVS_PANELS.blocks.tables, () => {
    drawTables();
    refocus();
    draw();
  });
  model.on("change:selected", () => {
    draw();
    drawDetail();
  });
  model.on("change:detail", () => {
    drawDetail();
    const i = pointer.hovered();
    if (i >= 0 && tip.style.display === "block") tip.textContent = describe(i);
  });
  focus = link.current();
  redrawAll();
  // The first layout may have no width yet (e.g. an output area still attaching).
  const ro = new ResizeObserver(() => draw());
  ro.observe(root);
  return () => {
    ro.disconnect();
    tip.remove();
    sender.dispose();
    link.dispose();
  };
}

export default { render };
