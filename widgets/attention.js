// Attention heatmap: rows are query positions, columns KV positions grouped by block;
// the head picker groups query heads by the KV head they share (GQA).

// A compact perceptual ramp (viridis stops), sampled linearly.
const RAMP = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
function ramp(v) {
  const x = Math.max(0, Math.min(1, v)) * (RAMP.length - 1);
  const i = Math.min(RAMP.length - 2, Math.floor(x)), f = x - i;
  return RAMP[i].map((c, k) => Math.round(c + (RAMP[i + 1][k] - c) * f));
}

function render({ model, el }) {
  const root = kvsRoot(el, model, "kvs-attention");
  const sender = kvsSender(model);
  const reqSel = kvsEl("select", { class: "kvs-attn-request", "data-testid": "kvs-attn-request" });
  const layerSel = kvsEl("select", { class: "kvs-attn-layer", "data-testid": "kvs-attn-layer" });
  const heads = kvsEl("div", { class: "kvs-heads", "data-testid": "kvs-attn-heads" });
  const norm = kvsEl("input", { type: "checkbox", "data-testid": "kvs-attn-rownorm" });
  const refresh = kvsEl("button", { "data-testid": "kvs-attn-refresh", text: "\u21bb probe now" });
  const msg = kvsEl("div", { class: "kvs-muted kvs-attn-msg", "data-testid": "kvs-attn-message" });
  const canvas = kvsEl("canvas", { class: "kvs-attn-canvas", "data-testid": "kvs-attn-canvas" });
  const tip = kvsEl("div", { class: "kvs-tooltip" });
  const sub = kvsEl("span", { class: "kvs-sub" });
  root.append(
    kvsEl("div", { class: "kvs-title" }, ["Attention", sub]),
    kvsEl("div", { class: "kvs-row" }, [
      kvsEl("label", {}, ["request ", reqSel]), kvsEl("label", {}, ["layer ", layerSel]),
      kvsEl("label", {}, [norm, " scale each row to its max"]), refresh,
    ]),
    heads, msg, kvsEl("div", { class: "kvs-attn-wrap" }, [canvas]),
  );
  document.body.append(tip);
  const select = (c) => sender.send({ action: "select", ...c });
  reqSel.addEventListener("change", () => select({ request_id: reqSel.value }));
  layerSel.addEventListener("change", () => select({ layer: Number(layerSel.value) }));
  refresh.addEventListener("click", () => sender.send({ action: "refresh" }));
  norm.addEventListener("change", () => drawMap());

  function drawSelectors() {
    const reqs = model.get("requests"), cur = model.get("request_id");
    const opts = reqs.includes(cur) || !cur ? reqs : [cur, ...reqs];
    reqSel.replaceChildren(...(opts.length ? opts : [""]).map((r) => kvsEl("option", { value: r, text: r ? `#${r}` : "(none)" })));
    reqSel.value = cur;
    const nl = model.get("num_layers");
    layerSel.replaceChildren(...Array.from({ length: Math.max(1, nl) }, (_, i) => kvsEl("option", { value: i, text: i })));
    layerSel.value = String(model.get("layer"));
    const kv = model.get("kv_head_of_head"), head = model.get("head");
    const groups = new Map();
    kv.forEach((g, h) => { if (!groups.has(g)) groups.set(g, []); groups.get(g).push(h); });
    heads.replaceChildren(kvsEl("span", { class: "kvs-muted", text: "heads by KV head:" }), ...[...groups.entries()].map(([g, hs]) =>
      kvsEl("span", { class: `kvs-head-group${hs.includes(head) ? " kvs-active" : ""}`, "data-testid": `kvs-kv-group-${g}`, title: `query heads ${hs.join(", ")} read KV head ${g}` }, [
        kvsEl("span", { class: "kvs-kv-label", text: `KV ${g}` }),
        ...hs.map((h) => kvsEl("button", { class: `kvs-head${h === head ? " kvs-on" : ""}`, "data-testid": `kvs-head-${h}`, text: `h${h}`, onclick: () => select({ head: h }) })),
      ])));
  }

  let geom = { cw: 1, rh: 1, rows: 0, n: 0 };
  let data = new Float32Array(0);
  function drawMap() {
    data = kvsArray(model.get("probs"), Float32Array);
    const n = model.get("context_len"), pos = model.get("row_positions"), rows = pos.length;
    const m = model.get("message");
    msg.textContent = m;
    msg.style.display = m ? "" : "none";
    const step = model.get("probe_step");
    sub.textContent = rows ? `#${model.get("request_id")} \u00b7 layer ${model.get("layer")} \u00b7 head ${model.get("head")} (KV head ${model.get("kv_head_of_head")[model.get("head")] ?? "?"}) \u00b7 ${rows} queries \u00d7 ${n} keys \u00b7 read from the paged cache at step ${step}` : "";
    canvas.style.display = rows && n ? "" : "none";
    if (!rows || !n || data.length < rows * n) return;
    const rowNorm = norm.checked;
    // Paint at data resolution, then scale up without smoothing.
    const img = new ImageData(n, rows);
    let gmax = 0;
    for (let i = 0; i < data.length; i++) gmax = Math.max(gmax, data[i]);
    for (let r = 0; r < rows; r++) {
      let rmax = 0;
      if (rowNorm) for (let c = 0; c < n; c++) rmax = Math.max(rmax, data[r * n + c]);
      const scale = rowNorm ? rmax : gmax;
      for (let c = 0; c < n; c++) {
        const k = (r * n + c) * 4, v = data[r * n + c];
        const future = c > pos[r];  // causal mask: a query never sees later keys
        const [R, G, B] = future ? [235, 235, 235] : ramp(scale > 0 ? Math.sqrt(v / scale) : 0);
        img.data[k] = R; img.data[k + 1] = G; img.data[k + 2] = B; img.data[k + 3] = 255;
      }
    }
    const off = document.createElement("canvas");
    off.width = n; off.height = rows;
    off.getContext("2d").putImageData(img, 0, 0);
    const maxW = Math.max(240, Math.min(root.clientWidth - 60 || 800, 1000));
    const cw = Math.max(0.5, Math.min(14, maxW / n)), rh = Math.max(1, Math.min(rows < 4 ? 28 : 14, 480 / rows));
    const top = 16, left = 40;
    const W = Math.ceil(n * cw), H = Math.ceil(rows * rh);
    const dpr = window.devicePixelRatio || 1;
    canvas.width = (W + left + 4) * dpr; canvas.height = (H + top + 4) * dpr;
    canvas.style.width = `${W + left + 4}px`; canvas.style.height = `${H + top + 4}px`;
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(off, left, top, W, H);
    geom = { cw, rh, rows, n, top, left };
    // Block boundaries and physical block ids.
    const bs = model.get("block_size"), table = model.get("block_table");
    ctx.strokeStyle = "rgba(255,255,255,0.9)";
    ctx.lineWidth = 1;
    ctx.font = "9px sans-serif";
    ctx.fillStyle = "#444";
    ctx.textBaseline = "bottom";
    for (let b = 0; b * bs < n; b++) {
      const x = left + b * bs * cw;
      if (b > 0) { ctx.beginPath(); ctx.moveTo(x + 0.5, top); ctx.lineTo(x + 0.5, top + H); ctx.stroke(); }
      if (bs * cw >= 18 && table[b] !== undefined) ctx.fillText(`b${table[b]}`, x + 2, top - 2);
    }
    ctx.textBaseline = "middle";
    ctx.textAlign = "right";
    const every = Math.ceil(12 / rh);
    for (let r = 0; r < rows; r += every) ctx.fillText(String(pos[r]), left - 3, top + (r + 0.5) * rh);
    ctx.textAlign = "left";
  }

  canvas.addEventListener("mousemove", (ev) => {
    const rect = canvas.getBoundingClientRect();
    const c = Math.floor((ev.clientX - rect.left - geom.left) / geom.cw), r = Math.floor((ev.clientY - rect.top - geom.top) / geom.rh);
    if (c < 0 || r < 0 || c >= geom.n || r >= geom.rows) { tip.style.display = "none"; return; }
    const toks = model.get("tokens"), bs = model.get("block_size"), table = model.get("block_table");
    const q = model.get("row_positions")[r];
    tip.textContent = `query pos ${q} (${kvsTok(toks[q] ?? "")})\nkey pos ${c} (${kvsTok(toks[c] ?? "")}) in block ${table[Math.floor(c / bs)] ?? "?"} offset ${c % bs}\np = ${c > q ? "masked" : data[r * geom.n + c].toFixed(4)}`;
    tip.style.display = "block";
    tip.style.left = `${ev.clientX + 14}px`;
    tip.style.top = `${ev.clientY + 14}px`;
  });
  canvas.addEventListener("mouseleave", () => { tip.style.display = "none"; });

  for (const k of ["requests", "request_id", "layer", "head", "num_layers", "kv_head_of_head"]) model.on(`change:${k}`, drawSelectors);
  const drawMapSoon = kvsBatched(drawMap);
  for (const k of ["probs", "context_len", "row_positions", "block_table", "message", "probe_step"]) model.on(`change:${k}`, drawMapSoon);
  drawSelectors();
  drawMap();
  return () => { tip.remove(); sender.dispose(); };
}

export default { render };
