// KV block pool: one canvas cell per physical block (4,096 stay fluid), legend with
// counts, hover tooltip with details fetched from Python, per-request block tables.

// The `status` codes and `events` bits, spelled once for the browser (Python spells them
// once too, in widgets/block_pool.py). Events: [bit, StepRecord.blocks key, label, colour,
// what it means]; the legend lists them in this order.
const STATUS_NAMES = ["null", "free", "free (cached)", "in use", "in use (hashed)"];
const SAME_STEP = 32;
const SAME_STEP_TIP = "hit on a block computed in this same step: its KV is written by this step's forward before any layer reads it";
const EVENT_BITS = [
  [1, "allocated", "allocated", "#2e7d32", "handed out to a request in this step"],
  [2, "hits", "prefix hit", "#1565c0", "prefix-cache hit: a request admitted in this step takes this block from the cache instead of computing it"],
  [SAME_STEP, "same_step_hits", "same-step hit", "#00897b", SAME_STEP_TIP],
  [4, "freed", "freed", "#ef6c00", "its last owner let go (finished, aborted or preempted)"],
  [8, "evicted", "evicted", "#c62828", "a cached block reused for new tokens: its hash is forgotten"],
  [16, "cached", "cached", "#6a1b9a", "full, hashed and registered in the prefix cache in this step"],
];
// Which event outlines a cell when a block has several: a same-step hit wins (the block
// was also allocated, hit and cached in this step), "cached" only when nothing else.
const OUTLINE_ORDER = [SAME_STEP, 1, 2, 4, 8, 16].map((b) => EVENT_BITS.find(([x]) => x === b));
const eventNames = (ev) => EVENT_BITS.filter(([b]) => ev & b).map(([, , name]) => name);

function cellSizeFor(n) {
  if (n <= 256) return 26;
  if (n <= 1024) return 15;
  return 10;
}

function render({ model, el }) {
  const root = kvsRoot(el, model, "kvs-block-pool");
  const sender = kvsSender(model);
  const title = kvsEl("div", { class: "kvs-title" }, ["KV block pool", kvsEl("span", { class: "kvs-sub" })]);
  const legend = kvsEl("div", { class: "kvs-legend", "data-testid": "kvs-block-legend" });
  const canvas = kvsEl("canvas", { class: "kvs-pool-canvas", "data-testid": "kvs-pool-canvas" });
  const tip = kvsEl("div", { class: "kvs-tooltip", "data-testid": "kvs-block-tooltip" });
  const detailBox = kvsEl("div", { class: "kvs-block-detail", "data-testid": "kvs-block-detail" });
  const tables = kvsEl("div", { class: "kvs-block-tables", "data-testid": "kvs-block-tables" });
  root.append(title, legend, kvsEl("div", { class: "kvs-canvas-wrap" }, [canvas]), detailBox,
    kvsEl("div", { class: "kvs-title" }, ["Block tables", kvsEl("span", { class: "kvs-sub", text: "logical \u2192 physical" })]), tables);
  document.body.append(tip);

  let cols = { status: new Uint8Array(0), ref: new Uint16Array(0), owner: new Int16Array(0), events: new Uint8Array(0) };
  let owners = [];
  let hover = -1;
  let highlightReq = null;  // request whose blocks are outlined (hovering its table)
  let geom = { cell: 10, ncols: 1, n: 0 };

  function readColumns() {
    cols = {
      status: kvsArray(model.get("status"), Uint8Array),
      ref: kvsArray(model.get("ref_count"), Uint16Array),
      owner: kvsArray(model.get("owner"), Int16Array),
      events: kvsArray(model.get("events"), Uint8Array),
    };
    owners = model.get("owners") || [];
  }

  function fillFor(i) {
    const s = cols.status[i];
    if (s === 0) return "#555";
    if (s === 1) return "#f4f4f4";
    if (s === 2) return "#c5d9ef";
    const o = cols.owner[i];
    return kvsColor(o >= 0 ? owners[o] : null, s === 3);
  }

  // A same-step hit: diagonal stripes over the cell, so it never reads as a plain hit.
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
    for (let d = -cell; d < cell; d += gap) { ctx.moveTo(x + d, y + cell); ctx.lineTo(x + d + cell, y); }
    ctx.stroke();
    ctx.restore();
  }

  function draw() {
    const n = model.get("num_blocks");
    const cell = cellSizeFor(n);
    const width = Math.max(200, Math.min(root.clientWidth - 20 || 700, 1200));
    const ncols = Math.max(1, Math.floor(width / cell));
    const nrows = Math.ceil(n / ncols);
    geom = { cell, ncols, n };
    const dpr = window.devicePixelRatio || 1;
    canvas.width = Math.ceil(ncols * cell * dpr);
    canvas.height = Math.ceil(Math.max(1, nrows) * cell * dpr);
    canvas.style.width = `${ncols * cell}px`;
    canvas.style.height = `${Math.max(1, nrows) * cell}px`;
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, ncols * cell, nrows * cell);
    const hiBlocks = new Set();
    if (highlightReq !== null) {
      const t = (model.get("block_tables") || []).find((r) => r.request_id === highlightReq);
      if (t) t.block_table.forEach((b) => hiBlocks.add(b));
    }
    const selected = model.get("selected");
    ctx.font = `${Math.max(8, cell / 2.6)}px sans-serif`;
    ctx.textAlign = "center";
    ctx.textBaseline = "middle";
    for (let i = 0; i < n; i++) {
      const x = (i % ncols) * cell, y = Math.floor(i / ncols) * cell;
      ctx.fillStyle = fillFor(i);
      ctx.fillRect(x + 0.5, y + 0.5, cell - 1, cell - 1);
      const s = cols.status[i];
      if (s === 2 || s === 4) {  // a registered hash: a small corner mark
        ctx.fillStyle = "#1f4e79";
        ctx.fillRect(x + cell - 4, y + 1, 3, 3);
      }
      const ev = cols.events[i];
      if (ev) {
        const bit = OUTLINE_ORDER.find(([b]) => ev & b);
        if (ev & SAME_STEP) hatch(ctx, x, y, cell, bit[3]);
        ctx.strokeStyle = bit[3];
        ctx.lineWidth = cell >= 14 ? 2.5 : 2;
        if (ev & SAME_STEP) ctx.setLineDash([Math.max(2, cell / 6), Math.max(1.5, cell / 12)]);
        ctx.strokeRect(x + 1.5, y + 1.5, cell - 3, cell - 3);
        ctx.setLineDash([]);
        if (ev & 8) {  // evicted: a cross
          ctx.beginPath(); ctx.moveTo(x + 2, y + 2); ctx.lineTo(x + cell - 2, y + cell - 2);
          ctx.moveTo(x + cell - 2, y + 2); ctx.lineTo(x + 2, y + cell - 2); ctx.stroke();
        }
      }
      if (cols.ref[i] > 1) {  // shared by several requests: a dark bottom bar
        ctx.fillStyle = "#000";
        ctx.fillRect(x + 1, y + cell - 3, cell - 2, 2);
      }
      if (cell >= 26) {
        ctx.fillStyle = s === 0 ? "#eee" : "#222";
        ctx.fillText(cols.ref[i] > 1 ? `${i}\u00b7${cols.ref[i]}` : String(i), x + cell / 2, y + cell / 2);
      }
      if (hiBlocks.has(i) || i === selected || i === hover) {
        ctx.strokeStyle = i === selected ? "#000" : "#ffb300";
        ctx.lineWidth = 2;
        ctx.strokeRect(x + 1, y + 1, cell - 2, cell - 2);
      }
    }
  }

  function drawLegend() {
    const c = model.get("counts") || {};
    const sw = (color, text, tid) => kvsEl("span", { class: "kvs-leg", "data-testid": tid }, [kvsEl("i", { style: { background: color } }), text]);
    const evs = EVENT_BITS.map(([bit, key, name, color, tipText]) => kvsEl("span", {
      class: `kvs-leg kvs-leg-event${bit === SAME_STEP ? " kvs-leg-same-step" : ""}`,
      "data-testid": `kvs-leg-ev-${key}`, title: `${name}: ${tipText}`,
    }, [kvsEl("i", { style: { borderColor: color, color } }), `${name} ${c[key] ?? 0}`]));
    legend.replaceChildren(
      sw("#555", "null", "kvs-leg-null"), sw("#f4f4f4", `free ${c.free ?? 0}`, "kvs-leg-free"),
      sw("#c5d9ef", `free, cached ${c.free_cached ?? 0}`, "kvs-leg-cached"), sw("linear-gradient(90deg, hsl(200,62%,52%), hsl(337,62%,52%), hsl(115,62%,52%))", `in use ${c.in_use ?? 0} (owner colour; pale = not yet full/hashed)`, "kvs-leg-used"),
      kvsEl("span", { class: "kvs-muted", text: "this step:" }), ...evs,
    );
    title.querySelector(".kvs-sub").textContent =
      `${model.get("num_blocks")} blocks \u00d7 ${model.get("block_size")} tokens \u00b7 block 0 is the null block \u00b7 bar = shared (refcount > 1), corner = hashed`;
  }

  function drawTables() {
    const rows = model.get("block_tables") || [];
    const bs = model.get("block_size");
    tables.replaceChildren(...rows.map((r) => {
      const hits = new Set(r.hits || []), same = new Set(r.same_step_hits || []);
      const cells = r.block_table.map((b, logical) => {
        const full = (logical + 1) * bs <= r.num_computed_tokens;
        const kind = same.has(logical) ? " kvs-bt-same-step" : hits.has(logical) ? " kvs-bt-hit" : "";
        const why = same.has(logical) ? ` \u00b7 same-step ${SAME_STEP_TIP}` : hits.has(logical) ? " \u00b7 prefix hit (KV from an earlier step)" : "";
        return kvsEl("span", {
          class: `kvs-bt-cell${full ? "" : " kvs-bt-partial"}${kind}`, "data-block": b,
          title: `logical ${logical} \u2192 physical ${b}${why}`, text: b,
          onclick: () => sender.send({ action: "select_block", block_id: b }),
        });
      });
      return kvsEl("div", {
        class: "kvs-bt-row", "data-testid": `kvs-bt-${r.request_id}`,
        onmouseenter: () => { highlightReq = r.request_id; draw(); },
        onmouseleave: () => { highlightReq = null; draw(); },
      }, [kvsEl("span", { class: "kvs-chip", style: { background: kvsColor(r.request_id, true), borderColor: kvsColor(r.request_id) }, text: `#${r.request_id}` }), ...cells]);
    }));
    if (!rows.length) tables.append(kvsEl("span", { class: "kvs-muted", text: "no request holds blocks" }));
  }

  function describe(i) {
    const s = cols.status[i];
    const o = cols.owner[i];
    const ev = eventNames(cols.events[i]);
    let text = `block ${i} \u00b7 ${STATUS_NAMES[s] ?? "?"} \u00b7 refcount ${cols.ref[i]}`;
    if (o >= 0) text += `\nowner #${owners[o]}`;
    if (ev.length) text += `\nthis step: ${ev.join(", ")}`;
    if (cols.events[i] & SAME_STEP) text += `\nsame-step ${SAME_STEP_TIP}`;
    const d = model.get("detail") || {};
    if (d.block_id === i) {
      if (d.owners && d.owners.length > 1) text += `\nowners ${d.owners.map((x) => "#" + x).join(" ")}`;
      if (d.hash) text += `\nhash ${d.hash}`;
      if (d.token_ids && d.token_ids.length) {
        text += `\ntokens ${JSON.stringify(d.token_ids)}`;
        if (d.tokens && d.tokens.length) text += `\n"${d.tokens.join("")}"`;
      }
    }
    return text;
  }

  function drawDetail() {
    const d = model.get("detail") || {};
    const sel = model.get("selected");
    if (sel < 0 || d.block_id !== sel) { detailBox.replaceChildren(kvsEl("span", { class: "kvs-muted", text: "hover a block for details, click to pin" })); return; }
    const toks = (d.token_ids || []).map((id, k) => kvsEl("span", { class: "kvs-tok", title: `id ${id}` }, [
      kvsEl("b", { text: kvsTok(d.tokens && d.tokens[k]) || id }), kvsEl("sub", { text: id }),
    ]));
    const ev = d.block_id < cols.events.length ? cols.events[d.block_id] : 0;
    const events = ev ? kvsEl("div", { class: "kvs-block-events", "data-testid": "kvs-block-detail-events" }, [
      `this step: ${eventNames(ev).join(", ")}`,
      ev & SAME_STEP ? kvsEl("span", { class: "kvs-same-step-note", text: ` \u2014 same-step ${SAME_STEP_TIP}` }) : null,
    ]) : null;
    detailBox.replaceChildren(
      kvsEl("div", {}, [kvsEl("b", { text: `block ${d.block_id}` }),
        ` \u00b7 refcount ${d.ref_count} \u00b7 owners ${(d.owners || []).map((x) => "#" + x).join(" ") || "none"} \u00b7 hash ${d.hash ?? "none"}`]),
      ...(events ? [events] : []),
      kvsEl("div", { class: "kvs-toks" }, toks.length ? toks : [kvsEl("span", { class: "kvs-muted", text: d.is_null ? "the null block: padding, never allocated" : "no tokens" })]),
    );
  }

  let detailTimer = null;
  function blockAt(ev) {
    const r = canvas.getBoundingClientRect();
    const cx = Math.floor((ev.clientX - r.left) / geom.cell), cy = Math.floor((ev.clientY - r.top) / geom.cell);
    if (cx < 0 || cx >= geom.ncols || cy < 0) return -1;
    const i = cy * geom.ncols + cx;
    return i < geom.n ? i : -1;
  }
  canvas.addEventListener("mousemove", (ev) => {
    const i = blockAt(ev);
    if (i !== hover) {
      hover = i;
      draw();
      clearTimeout(detailTimer);
      // Ask Python for hash and tokens only once the pointer rests on a block.
      if (i >= 0) detailTimer = setTimeout(() => sender.send({ action: "block_detail", block_id: i }), 60);
    }
    if (i < 0) { tip.style.display = "none"; return; }
    tip.textContent = describe(i);
    tip.style.display = "block";
    tip.style.left = `${ev.clientX + 14}px`;
    tip.style.top = `${ev.clientY + 14}px`;
  });
  canvas.addEventListener("mouseleave", () => { hover = -1; tip.style.display = "none"; draw(); });
  canvas.addEventListener("click", (ev) => {
    const i = blockAt(ev);
    if (i >= 0) sender.send({ action: "select_block", block_id: i === model.get("selected") ? -1 : i });
  });

  function redrawAll() { readColumns(); draw(); drawLegend(); drawTables(); drawDetail(); }
  const poolSoon = kvsBatched(() => { readColumns(); draw(); drawLegend(); drawDetail(); });  // detail shows the events
  for (const k of ["status", "ref_count", "owner", "events", "owners", "num_blocks", "block_size"]) model.on(`change:${k}`, poolSoon);
  model.on("change:counts", drawLegend);
  model.on("change:block_tables", () => { drawTables(); draw(); });
  model.on("change:selected", () => { draw(); drawDetail(); });
  model.on("change:detail", () => { drawDetail(); if (hover >= 0 && tip.style.display === "block") tip.textContent = describe(hover); });
  redrawAll();
  // The first layout may have no width yet (e.g. an output area still attaching).
  const ro = new ResizeObserver(() => draw());
  ro.observe(root);
  return () => { ro.disconnect(); tip.remove(); sender.dispose(); };
}

export default { render };
