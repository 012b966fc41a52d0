// @ts-check
// Attention: what one request's queries read from the paged KV cache, for one layer and
// head. A decode step (one query) is a bar chart over the key tokens, banded by KV block,
// prompt and generated tokens told apart; a prefill chunk is a heatmap (rows: queries,
// columns: keys) with token labels on both axes. Cells never shrink below a readable size:
// a long context scrolls. Every head has a thumbnail to pick it by (grouped by the KV head
// it reads: GQA). The title says which step the weights belong to. Linked: hovering a key
// lights its block, request and token in the other panels (kvsLink), and back.

/**
 * The traits this panel reads (widgets/attention.py, filled from an AttentionProbe): which
 * `request_id`, `layer` and `head` of `num_layers`; the probed context (`context_len` keys,
 * their `tokens`, `num_prompt_tokens` of them from the prompt, `block_size`, `block_table`);
 * `row_positions` (the query positions, one row each) and `probs`, a DataView over float32
 * weights [rows, context_len]; per-head thumbnails (`thumbs`: uint8 [heads, ...thumb_shape],
 * `thumb_heads`, `kv_head_of_head`); `probe_step`, the step the weights were read at; and
 * `message`, why there is no heatmap (a recording, a finished request, a feed without weights).
 */
/**
 * Where the heatmap's cells are (drawHeatmap), in CSS px: `cw` x `rh` cells, `rows` queries by
 * `n` keys, from (`left`, `top`), `H` high, at `dpr` device pixels per px.
 * @typedef {{kind: "map", cw: number, rh: number, rows: number, n: number, top: number, left: number, H: number, dpr: number}} HeatGeom
 * A decode's bars (barsSvg): their columns are elements, lit one by one.
 * @typedef {{kind: "bars"}} BarsGeom
 * What paintHeatAxes draws the axes from (drawHeatmap's geometry, the block table and tokens).
 * @typedef {{left: number, top: number, H: number, n: number, rows: number, cw: number, rh: number, bs: number,
 *   table: number[], npt: number, toks: string[], pos: number[]}} HeatAxes
 * What a pick sends with action "select" (widgets/attention.py).
 * @typedef {{request_id?: string, layer?: number, head?: number}} AttnSelect
 * The panel's model: its state's fields typed (widgets/attention.py AttentionChoices, AttentionWeights).
 * @typedef {KvsModelOf<KvsPanelStates["attention"]>} AttnModel
 */

// A compact perceptual ramp (viridis stops), sampled linearly.
const RAMP = [
  [68, 1, 84],
  [59, 82, 139],
  [33, 145, 140],
  [94, 201, 98],
  [253, 231, 37],
];
/** @param {number} v */
function ramp(v) {
  const x = Math.max(0, Math.min(1, v)) * (RAMP.length - 1);
  const i = Math.min(RAMP.length - 2, Math.floor(x)),
    f = x - i;
  return RAMP[i].map((c, k) => Math.round(c + (RAMP[i + 1][k] - c) * f));
}
const RAMP_CSS = `linear-gradient(90deg, ${[0, 0.25, 0.5, 0.75, 1].map((v) => `rgb(${ramp(v).join(",")}) ${v * 100}%`).join(", ")})`;
const MASKED = [235, 235, 235];
const MIN_CELL = 12,
  MAX_CELL = 28,
  MAX_CANVAS = 16000; // px: readable cells; a canvas stays drawable
const PROMPT_BAR = "#78909c";
/** @param {?string|undefined} t @param {number} [k] */
const short = (t, k = 10) => {
  const s = kvsTok(t);
  return s.length > k ? s.slice(0, k - 1) + "\u2026" : s;
};
/** @param {number} p */
const fmt = (p) => (p >= 0.01 ? p.toFixed(3) : p.toExponential(1));

/** A head's thumbnail of this step's weights (null when none was sent). @param {AttnModel} model @param {number} h */
function thumbCanvas(model, h) {
  const hs = model.get("thumb_heads") || [],
    [th, tw] = model.get("thumb_shape") || [0, 0];
  const k = hs.indexOf(h);
  if (k < 0 || !th || !tw) return null;
  const px = kvsArray(model.get("thumbs"), Uint8Array);
  if (px.length < (k + 1) * th * tw) return null;
  const c = kvsEl("canvas", { class: "kvs-thumb", "data-testid": `kvs-thumb-${h}` });
  c.width = tw;
  c.height = th;
  const img = new ImageData(tw, th);
  for (let i = 0; i < th * tw; i++) {
    const [R, G, B] = ramp(px[k * th * tw + i] / 255);
    img.data.set([R, G, B, 255], i * 4);
  }
  c.getContext("2d").putImageData(img, 0, 0);
  c.style.width = "48px";
  c.style.height = `${Math.max(8, Math.min(32, Math.round((48 * th) / tw)))}px`;
  return c;
}

/** The weights painted at data resolution (one pixel per query x key), on an offscreen canvas.
 * @param {Float32Array} data @param {number} n @param {number} rows @param {number[]} pos @param {number} gmax
 * @param {boolean} rowNorm */
function heatImage(data, n, rows, pos, gmax, rowNorm) {
  const img = new ImageData(n, rows);
  for (let r = 0; r < rows; r++) {
    let rmax = 0;
    if (rowNorm) for (let c = 0; c < n; c++) rmax = Math.max(rmax, data[r * n + c]);
    const scaleBy = rowNorm ? rmax : gmax;
    for (let c = 0; c < n; c++) {
      const k = (r * n + c) * 4,
        v = data[r * n + c];
      const [R, G, B] = c > pos[r] ? MASKED : ramp(scaleBy > 0 ? Math.sqrt(v / scaleBy) : 0);
      img.data[k] = R;
      img.data[k + 1] = G;
      img.data[k + 2] = B;
      img.data[k + 3] = 255;
    }
  }
  const off = document.createElement("canvas");
  off.width = n;
  off.height = rows;
  /** @type {CanvasRenderingContext2D} */ (off.getContext("2d")).putImageData(img, 0, 0);
  return off;
}

/** Over the heatmap: block boundaries and ids, where generated tokens start, key and query labels.
 * @param {CanvasRenderingContext2D} ctx @param {HeatAxes} g */
function paintHeatAxes(ctx, g) {
  const { left, top, H, n, rows, cw, rh, bs, table, npt, toks, pos } = g;
  // Block boundaries and physical block ids, over the key labels.
  ctx.strokeStyle = "rgba(255,255,255,0.9)";
  ctx.lineWidth = 1;
  ctx.font = "9px sans-serif";
  ctx.fillStyle = "#37474f";
  ctx.textBaseline = "top";
  for (let b = 0; b * bs < n; b++) {
    const x = left + b * bs * cw;
    if (b > 0) {
      ctx.beginPath();
      ctx.moveTo(x + 0.5, top);
      ctx.lineTo(x + 0.5, top + H);
      ctx.stroke();
    }
    if (bs * cw >= 18 && table[b] !== undefined) ctx.fillText(`b${table[b]}`, x + 2, 1);
  }
  if (npt > 0 && npt < n) {
    // where the generated tokens start
    ctx.strokeStyle = KVS_MARKS.sampled;
    ctx.setLineDash([3, 2]);
    ctx.beginPath();
    ctx.moveTo(left + npt * cw + 0.5, 12);
    ctx.lineTo(left + npt * cw + 0.5, top + H);
    ctx.stroke();
    ctx.setLineDash([]);
  }
  // Key labels (rotated, above) and query labels (left): the tokens themselves.
  ctx.font = "10px monospace";
  const everyX = Math.max(1, Math.ceil(11 / cw));
  for (let c = 0; c < n; c += everyX) {
    ctx.save();
    ctx.translate(left + (c + 0.5) * cw + 3, top - 3);
    ctx.rotate(-Math.PI / 3);
    ctx.textBaseline = "middle";
    ctx.fillStyle = c >= npt && npt > 0 ? KVS_MARKS.sampled : "#263238";
    ctx.fillText(short(toks[c], 9), 0, 0);
    ctx.restore();
  }
  ctx.textBaseline = "middle";
  ctx.textAlign = "right";
  ctx.fillStyle = "#263238";
  const everyY = Math.max(1, Math.ceil(11 / rh));
  for (let r = 0; r < rows; r += everyY)
    ctx.fillText(`${short(toks[pos[r]], 8)} ${pos[r]}`, left - 3, top + (r + 0.5) * rh);
  ctx.textAlign = "left";
  ctx.save();
  ctx.translate(8, top + H / 2);
  ctx.rotate(-Math.PI / 2);
  ctx.textAlign = "center";
  ctx.fillStyle = "#78909c";
  ctx.fillText("queries", 0, 0);
  ctx.restore();
}

/** A decode's one query row: a bar per key, over its KV blocks, prompt vs generated under the labels.
 * @param {AttnModel} model @param {Float32Array} data @param {number} n @param {number} q @param {number} gmax
 * @param {number} width @param {(g: SVGElement, c: number) => void} onCol */
function barsSvg(model, data, n, q, gmax, width, onCol) {
  const toks = model.get("tokens"),
    bs = model.get("block_size"),
    table = model.get("block_table");
  const npt = Math.min(n, model.get("num_prompt_tokens") || n);
  const left = 34,
    top = 16,
    H = 110,
    labelH = 64,
    kindH = 16;
  const bw = Math.max(n * MIN_CELL > MAX_CANVAS ? MAX_CANVAS / n : MIN_CELL, Math.min(MAX_CELL, (width - left) / n));
  const W = Math.ceil(n * bw);
  const svg = kvsSvg("svg", {
    width: left + W + 4,
    height: top + H + labelH + kindH + 4,
    class: "kvs-attn-bars",
    "data-testid": "kvs-attn-bars",
  });
  // KV blocks: alternating bands with their physical ids.
  for (let b = 0; b * bs < n; b++) {
    const x = left + b * bs * bw,
      w = Math.min(bs, n - b * bs) * bw;
    svg.append(
      kvsSvg("rect", {
        x,
        y: top,
        width: w,
        height: H,
        fill: kvsBlockTint(table[b] ?? -1),
        class: "kvs-attn-band",
        "data-block": table[b],
      }),
    );
    svg.append(kvsSvg("text", { x: x + 2, y: top - 4, class: "kvs-attn-blabel" }, `b${table[b] ?? "?"}`));
    if (b > 0)
      svg.append(
        kvsSvg("line", { x1: x, x2: x, y1: top - 12, y2: top + H, stroke: "#90a4ae", "stroke-dasharray": "2 2" }),
      );
  }
  svg.append(kvsSvg("text", { x: left - 4, y: top + 8, "text-anchor": "end", class: "kvs-attn-axis" }, fmt(gmax)));
  svg.append(kvsSvg("text", { x: left - 4, y: top + H, "text-anchor": "end", class: "kvs-attn-axis" }, "0"));
  const every = Math.max(1, Math.ceil(11 / bw));
  for (let c = 0; c < n; c++) {
    const v = data[c],
      x = left + c * bw,
      h = gmax > 0 ? ((H - 2) * v) / gmax : 0;
    const g = kvsSvg("g", { class: "kvs-attn-col", "data-pos": c });
    g.append(kvsSvg("rect", { x, y: top, width: bw, height: H + labelH, class: "kvs-attn-hit", fill: "transparent" }));
    g.append(
      kvsSvg("rect", {
        x: x + 1,
        y: top + H - h,
        width: Math.max(1, bw - 2),
        height: h,
        fill: c < npt ? PROMPT_BAR : KVS_MARKS.sampled,
        class: "kvs-attn-bar",
      }),
    );
    if (c % every === 0) {
      const lx = x + bw / 2 + 3,
        ly = top + H + 6;
      g.append(
        kvsSvg(
          "text",
          {
            x: lx,
            y: ly,
            transform: `rotate(-60 ${lx} ${ly})`,
            "text-anchor": "end",
            class: `kvs-attn-xlabel${c === q ? " kvs-attn-q" : ""}`,
            "data-pos": c,
          },
          short(toks[c]),
        ),
      );
    }
    g.append(
      kvsSvg(
        "title",
        {},
        `key position ${c} ${JSON.stringify(kvsTok(toks[c] ?? ""))} (${c < npt ? "prompt" : "generated"}) \u00b7 block ${table[Math.floor(c / bs)] ?? "?"} offset ${c % bs}\nweight ${data[c].toFixed(4)}${c === q ? "\nthe query's own token" : ""}`,
      ),
    );
    onCol(g, c);
    svg.append(g);
  }
  // Prompt vs generated, under the labels.
  const ky = top + H + labelH;
  const kinds = kvsSvg("g", { "data-testid": "kvs-attn-kinds" });
  kinds.append(kvsSvg("rect", { x: left, y: ky, width: npt * bw, height: kindH - 4, fill: PROMPT_BAR }));
  kinds.append(kvsSvg("text", { x: left + 3, y: ky + kindH - 7, class: "kvs-attn-kind" }, `prompt (${npt})`));
  if (n > npt) {
    kinds.append(
      kvsSvg("rect", { x: left + npt * bw, y: ky, width: (n - npt) * bw, height: kindH - 4, fill: KVS_MARKS.sampled }),
    );
    kinds.append(
      kvsSvg(
        "text",
        { x: left + npt * bw + 3, y: ky + kindH - 7, class: "kvs-attn-kind" },
        (n - npt) * bw > 70 ? `generated (${n - npt})` : `gen ${n - npt}`,
      ),
    );
  }
  svg.append(kinds);
  return svg;
}

/** Over the heatmap: the columns the linked focus points at (the very token stronger).
 * @param {HTMLCanvasElement} overlay @param {HeatGeom} geom @param {?KvsFocus} focus @param {string|null} rid
 * @param {(c: number) => number|null} blockOf */
function paintFocus(overlay, geom, focus, rid, blockOf) {
  const ctx = /** @type {CanvasRenderingContext2D} */ (overlay.getContext("2d"));
  ctx.setTransform(geom.dpr, 0, 0, geom.dpr, 0, 0);
  ctx.clearRect(0, 0, overlay.width, overlay.height);
  if (!focus) return;
  for (let c = 0; c < geom.n; c++) {
    const m = kvsMatch(focus, blockOf(c), rid, c);
    if (!m) continue;
    const x = geom.left + c * geom.cw;
    ctx.fillStyle = m === 2 ? "rgba(255, 214, 0, 0.55)" : "rgba(255, 214, 0, 0.25)";
    ctx.fillRect(x, geom.top, geom.cw, geom.H);
    ctx.strokeStyle = KVS_MARKS.focusInk;
    ctx.lineWidth = m === 2 ? 2 : 1;
    ctx.strokeRect(x + 0.5, geom.top - 4, geom.cw - 1, geom.H + 4);
  }
}

/** The panel's controls, legend, heatmap canvases and bar box, appended to `root`. @param {HTMLElement} root */
function buildDom(root) {
  const reqSel = kvsEl("select", { class: "kvs-attn-request", "data-testid": "kvs-attn-request" });
  const layerSel = kvsEl("select", { class: "kvs-attn-layer", "data-testid": "kvs-attn-layer" });
  const heads = kvsEl("div", { class: "kvs-heads", "data-testid": "kvs-attn-heads" });
  const norm = kvsEl("input", { type: "checkbox", "data-testid": "kvs-attn-rownorm" });
  const refresh = kvsEl("button", { "data-testid": "kvs-attn-refresh", text: "\u21bb probe now" });
  const msg = kvsEl("div", { class: "kvs-muted kvs-attn-msg", "data-testid": "kvs-attn-message" });
  const scaleMax = kvsEl("span", { class: "kvs-scale-max" });
  const scale = kvsEl("div", { class: "kvs-attn-scale", "data-testid": "kvs-attn-scale" }, [
    kvsEl("span", { text: "weight 0" }),
    kvsEl("i", { class: "kvs-scale-bar", style: { background: RAMP_CSS } }),
    scaleMax,
    kvsEl("span", { class: "kvs-muted", text: "(colour \u221d \u221aweight)" }),
    kvsSwatch(
      { fill: `rgb(${MASKED.join(",")})`, border: "#ccc" },
      "masked (a later key)",
      "kvs-attn-leg-masked",
      "causal mask: a query never reads keys after its own position",
    ),
    kvsSwatch({ fill: PROMPT_BAR, border: PROMPT_BAR }, "prompt", "kvs-attn-leg-prompt"),
    kvsSwatch({ fill: KVS_MARKS.sampled, border: KVS_MARKS.sampled }, "generated", "kvs-attn-leg-generated"),
  ]);
  const canvas = kvsEl("canvas", { class: "kvs-attn-canvas", "data-testid": "kvs-attn-canvas" });
  const overlay = kvsEl("canvas", { class: "kvs-attn-overlay" });
  const mapBox = kvsEl("div", { class: "kvs-attn-map" }, [canvas, overlay]);
  const bars = kvsEl("div", { class: "kvs-attn-bars-box" });
  const tip = kvsEl("div", { class: "kvs-tooltip" });
  const sub = kvsEl("span", { class: "kvs-sub", "data-testid": "kvs-attn-sub" });
  root.append(
    kvsEl("div", { class: "kvs-title" }, ["Attention", sub]),
    kvsEl("div", { class: "kvs-row" }, [
      kvsEl("label", {}, ["request ", reqSel]),
      kvsEl("label", {}, ["layer ", layerSel]),
      kvsEl("label", {}, [norm, " scale each row to its max"]),
      refresh,
    ]),
    heads,
    msg,
    scale,
    kvsEl("div", { class: "kvs-attn-wrap" }, [mapBox, bars]),
  );
  return { reqSel, layerSel, heads, norm, refresh, msg, scaleMax, scale, canvas, overlay, mapBox, bars, tip, sub };
}

/** The head picker: query heads grouped by the KV head they read (GQA), each with its thumbnail.
 * @param {AttnModel} model @param {(c: AttnSelect) => void} select */
function headButtons(model, select) {
  const kv = model.get("kv_head_of_head"),
    head = model.get("head");
  const groups = new Map();
  kv.forEach((/** @type {number} */ g, /** @type {number} */ h) => {
    if (!groups.has(g)) groups.set(g, []);
    groups.get(g).push(h);
  });
  const some = (model.get("thumb_heads") || []).length > 0;
  return [
    kvsEl("span", {
      class: "kvs-muted",
      text: some ? "pick a head (thumbnails: this step's weights) \u00b7 by KV head:" : "heads by KV head:",
    }),
    ...[...groups.entries()].map(([g, hs]) =>
      kvsEl(
        "span",
        {
          class: `kvs-head-group${hs.includes(head) ? " kvs-active" : ""}`,
          "data-testid": `kvs-kv-group-${g}`,
          title: `query heads ${hs.join(", ")} read KV head ${g}`,
        },
        [
          kvsEl("span", { class: "kvs-kv-label", text: `KV ${g}` }),
          ...hs.map((/** @type {number} */ h) =>
            kvsEl(
              "button",
              {
                class: `kvs-head${h === head ? " kvs-on" : ""}`,
                "data-testid": `kvs-head-${h}`,
                title: `head ${h}`,
                onclick: () => select({ head: h }),
              },
              [thumbCanvas(model, h), kvsEl("span", { text: `h${h}` })],
            ),
          ),
        ],
      ),
    ),
  ];
}

/** Both canvases sized to `w` x `h` CSS px at this screen's pixel ratio; the first one's context, cleared.
 * @param {HTMLCanvasElement[]} canvases @param {number} w @param {number} h @param {number} dpr */
function sizeCanvases(canvases, w, h, dpr) {
  for (const c of canvases) {
    c.width = w * dpr;
    c.height = h * dpr;
    c.style.width = `${w}px`;
    c.style.height = `${h}px`;
  }
  const ctx = /** @type {CanvasRenderingContext2D} */ (canvases[0].getContext("2d"));
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  return ctx;
}

/** A heatmap cell's tooltip: the query, the key (its block and offset), the weight.
 * @param {AttnModel} model @param {Float32Array} data @param {number} n @param {number} r @param {number} c */
function cellText(model, data, n, r, c) {
  const toks = model.get("tokens"),
    bs = model.get("block_size"),
    table = model.get("block_table");
  const q = model.get("row_positions")[r];
  return `query pos ${q} (${kvsTok(toks[q] ?? "")})\nkey pos ${c} (${kvsTok(toks[c] ?? "")}) in block ${table[Math.floor(c / bs)] ?? "?"} offset ${c % bs}\np = ${c > q ? "masked" : data[r * n + c].toFixed(4)}`;
}

/**
 * The heatmap of a prefill's weights on the canvas (the data at its own resolution, scaled up
 * unsmoothed), with its token and block axes; returns where its cells are.
 * @param {AttnModel} model @param {{canvas: HTMLCanvasElement, overlay: HTMLCanvasElement}} c @param {Float32Array} data
 * @param {{n: number, pos: number[], rows: number, gmax: number, rowNorm: boolean, width: number}} o
 * @returns {HeatGeom}
 */
function drawHeatmap(model, c, data, o) {
  const { n, pos, rows } = o;
  const toks = model.get("tokens"),
    bs = model.get("block_size"),
    table = model.get("block_table");
  const npt = model.get("num_prompt_tokens") || 0;
  const off = heatImage(data, n, rows, pos, o.gmax, o.rowNorm);
  const left = 96,
    top = 78;
  const cw = Math.max(n * MIN_CELL > MAX_CANVAS ? MAX_CANVAS / n : MIN_CELL, Math.min(MAX_CELL, (o.width - left) / n));
  const rh = Math.max(rows * MIN_CELL > MAX_CANVAS ? MAX_CANVAS / rows : MIN_CELL, Math.min(MAX_CELL, 420 / rows));
  const W = Math.ceil(n * cw),
    H = Math.ceil(rows * rh);
  const dpr = window.devicePixelRatio || 1;
  const ctx = sizeCanvases([c.canvas, c.overlay], W + left + 4, H + top + 4, dpr);
  ctx.imageSmoothingEnabled = false;
  ctx.drawImage(off, left, top, W, H);
  paintHeatAxes(ctx, { left, top, H, n, rows, cw, rh, bs, table, npt, toks, pos });
  return { kind: "map", cw, rh, rows, n, top, left, H, dpr };
}

/**
 * The pointer over the heatmap: a cell's weight in a tooltip; its key column lights the same
 * token and block in the other panels (click: pinned).
 * @param {{model: AttnModel, canvas: HTMLCanvasElement, tip: HTMLElement, link: KvsLinkHandle,
 *   colFocus: (c: number) => KvsFocus, geom: () => ?(HeatGeom|BarsGeom), data: () => Float32Array}} w
 */
function wireHeatPointer({ model, canvas, tip, link, colFocus, geom, data }) {
  let hoverCol = -1;
  canvas.addEventListener("mousemove", (/** @type {MouseEvent} */ ev) => {
    const g = geom();
    if (!g || g.kind !== "map") return;
    const rect = canvas.getBoundingClientRect();
    const c = Math.floor((ev.clientX - rect.left - g.left) / g.cw),
      r = Math.floor((ev.clientY - rect.top - g.top) / g.rh);
    const inCol = c >= 0 && c < g.n && ev.clientY - rect.top < g.top + g.H;
    if (inCol && c !== hoverCol) {
      hoverCol = c;
      link.hover(colFocus(c));
    }
    if (!inCol && hoverCol >= 0) {
      hoverCol = -1;
      link.leave("attention");
    }
    if (c < 0 || r < 0 || c >= g.n || r >= g.rows) {
      tip.style.display = "none";
      return;
    }
    tip.textContent = cellText(model, data(), g.n, r, c);
    tip.style.display = "block";
    kvsPlaceTip(tip, ev);
  });
  canvas.addEventListener("mouseleave", () => {
    tip.style.display = "none";
    hoverCol = -1;
    link.leave("attention");
  });
  canvas.addEventListener("click", () => {
    if (hoverCol >= 0) link.pin(colFocus(hoverCol));
  });
}

/** @param {KvsRenderContextOf<KvsPanelStates["attention"]>} ctx */
function render({ model, el }) {
  const root = kvsRoot(el, model, "kvs-attention");
  const sender = kvsSender(model);
  const { reqSel, layerSel, heads, norm, refresh, msg, scaleMax, scale, canvas, overlay, mapBox, bars, tip, sub } =
    buildDom(root);
  document.body.append(tip);
  const select = (/** @type {AttnSelect} */ c) => sender.send({ action: "select", ...c });
  reqSel.addEventListener("change", () => select({ request_id: reqSel.value }));
  layerSel.addEventListener("change", () => select({ layer: Number(layerSel.value) }));
  refresh.addEventListener("click", () => sender.send({ action: "refresh" }));
  norm.addEventListener("change", () => drawMap());
  function drawSelectors() {
    const reqs = model.get("requests"),
      cur = model.get("request_id");
    const opts = reqs.includes(cur) || !cur ? reqs : [cur, ...reqs];
    reqSel.replaceChildren(
      ...(opts.length ? opts : [""]).map((/** @type {string} */ r) =>
        kvsEl("option", { value: r, text: r ? `#${r}` : "(none)" }),
      ),
    );
    reqSel.value = cur;
    const nl = model.get("num_layers");
    const names = model.get("layer_names") || []; // a sliding-window layer names its window
    layerSel.replaceChildren(
      ...Array.from({ length: Math.max(1, nl) }, (_, i) => kvsEl("option", { value: i, text: names[i] ?? String(i) })),
    );
    layerSel.value = String(model.get("layer"));
    heads.replaceChildren(...headButtons(model, select));
  }
  // ---- what is shown, and the linked focus ----
  let data = new Float32Array(0);
  /** @type {?(HeatGeom|BarsGeom)} */
  let geom = null; // heatmap: {cw, rh, rows, n, top, left}; bars: {bw, n, left}
  /** @type {Array<[SVGElement, number]>} */
  let barCols = []; // bars: [element, position]
  /** @type {?KvsFocus} */
  let focus = null;
  const link = kvsLink(model, (f) => {
    focus = f;
    light();
  });
  const blockOf = (/** @type {number} */ c) =>
    (model.get("block_table") || [])[Math.floor(c / model.get("block_size"))];
  /** @param {number} c @returns {KvsFocus} */
  const colFocus = (c) => ({
    source: "attention",
    blocks: [blockOf(c)],
    requests: [model.get("request_id")],
    tokens: [[model.get("request_id"), c]],
  });
  function light() {
    const rid = model.get("request_id");
    for (const [node, c] of barCols) {
      const m = kvsMatch(focus, blockOf(c), rid, c);
      node.classList.toggle("kvs-lit", m === 1);
      node.classList.toggle("kvs-lit-strong", m === 2);
    }
    if (geom && geom.kind === "map") paintFocus(overlay, geom, focus, rid, blockOf);
  }
  function drawMap() {
    data = kvsArray(model.get("probs"), Float32Array);
    const n = model.get("context_len"),
      pos = model.get("row_positions"),
      rows = pos.length;
    const m = model.get("message");
    msg.textContent = m;
    msg.style.display = m ? "" : "none";
    const step = model.get("probe_step"),
      shown = model.get("step");
    const rid = model.get("request_id");
    const ok = rows && n && data.length >= rows * n;
    const decode = ok && rows === 1;
    sub.textContent = ok
      ? `weights of step ${step} \u00b7 #${rid} \u00b7 layer ${model.get("layer")} \u00b7 head ${model.get("head")} (KV head ${model.get("kv_head_of_head")[model.get("head")] ?? "?"}) \u00b7 ${decode ? `the decode query at position ${pos[0]}` : `${rows} queries`} \u00d7 ${n} keys \u00b7 read from the paged cache${step !== shown ? ` \u2014 NOT step ${shown}` : ""}`
      : "";
    root.dataset.probeStep = String(step);
    mapBox.style.display = ok && !decode ? "" : "none";
    bars.style.display = decode ? "" : "none";
    scale.style.display = ok ? "" : "none";
    barCols = [];
    geom = null;
    if (!ok) {
      bars.replaceChildren();
      return;
    }
    let gmax = 0;
    for (let i = 0; i < rows * n; i++) gmax = Math.max(gmax, data[i]);
    scaleMax.textContent = `${fmt(gmax)}${norm.checked && !decode ? " (each row: its own max)" : ""}`;
    if (decode) drawBars(n, pos[0], gmax);
    else drawHeat(n, pos, rows, gmax);
    light();
  }

  function avail() {
    return Math.max(240, (root.clientWidth || 900) - 30);
  }

  /** @param {number} n @param {number} q @param {number} gmax */
  function drawBars(n, q, gmax) {
    bars.replaceChildren(
      barsSvg(model, data, n, q, gmax, avail(), (g, c) => {
        g.addEventListener("mouseenter", () => link.hover(colFocus(c)));
        g.addEventListener("mouseleave", () => link.leave("attention"));
        g.addEventListener("click", () => link.pin(colFocus(c)));
        barCols.push([g, c]);
      }),
    );
    geom = { kind: "bars" };
  }

  /** @param {number} n @param {number[]} pos @param {number} rows @param {number} gmax */
  function drawHeat(n, pos, rows, gmax) {
    geom = drawHeatmap(model, { canvas, overlay }, data, { n, pos, rows, gmax, rowNorm: norm.checked, width: avail() });
  }
  wireHeatPointer({ model, canvas, tip, link, colFocus, geom: () => geom, data: () => data });

  const selectorsSoon = kvsBatched(drawSelectors);
  kvsOnChange(model, KVS_PANELS.attention.choices, selectorsSoon);
  const drawMapSoon = kvsBatched(drawMap);
  kvsOnChange(model, KVS_PANELS.attention.weights, drawMapSoon, ["step"]);
  focus = link.current();
  drawSelectors();
  drawMap();
  return () => {
    tip.remove();
    sender.dispose();
    link.dispose();
  };
}

export default { render };
