// Timeline: stacked prefill/decode tokens per step with the budget line, stacked time
// split per step, and a Gantt row per request. One SVG, steps share the x axis; it is as
// wide as the panel and redraws when the panel's width changes.

const NS = "http://www.w3.org/2000/svg";
function svg(tag, attrs = {}, text = null) {
  const n = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, String(v));
  if (text !== null) n.textContent = text;
  return n;
}
const BUDGET_COLOR = "#d32f2f";
const KIND_COLORS = { queued: "#e0e0e0", prefill: "#fb8c00", decode: "#1e88e5", preempted: "#e53935", stalled: "#bdbdbd" };
const TIME_PARTS = [["schedule", "#8e24aa"], ["prepare", "#43a047"], ["forward", "#1e88e5"], ["sample", "#fdd835"], ["update", "#6d4c41"]];

// How a step's forward ran: the attention backend, and layer by layer (eager), a CUDA graph
// replay, or the whole decode as one native call on a CPU.
function pathText(S, i) {
  const backend = S.backend ? S.backend[i] : null;
  const bucket = S.graph_bucket ? S.graph_bucket[i] : null;
  const native = S.forward_path && S.forward_path[i] === "native_decode";
  const path = bucket !== null && bucket !== undefined ? `CUDA graph (bucket ${bucket})`
    : native ? "native decode (one call for all layers)" : "eager";
  return backend ? `${backend} attention, ${path}` : path;
}

const EMPTY_HINT = "no steps yet: add a request and press Step";

function render({ model, el }) {
  const root = kvsRoot(el, model, "kvs-timeline");
  const sender = kvsSender(model);
  const sub = kvsEl("span", { class: "kvs-sub" });
  const holder = kvsEl("div", { class: "kvs-timeline-svg" });
  const legend = kvsEl("div", { class: "kvs-legend" }, [
    ...[["prefill tokens", KIND_COLORS.prefill], ["decode tokens", KIND_COLORS.decode], ["token budget", BUDGET_COLOR]].map(([t, c]) => kvsEl("span", {}, [kvsEl("i", { style: { background: c } }), t])),
    kvsEl("span", { title: "a step that preempted a request (hover it: who, and why)" }, [kvsEl("b", { class: "kvs-preempt-key", text: "\u25bc" }), "preemption"]),
    kvsEl("span", { class: "kvs-muted", text: " | time:" }),
    ...TIME_PARTS.map(([t, c]) => kvsEl("span", {}, [kvsEl("i", { style: { background: c } }), t])),
    kvsEl("span", { class: "kvs-muted", text: " | requests:" }),
    ...["queued", "prefill", "decode", "preempted", "stalled"].map((k) => kvsEl("span", {}, [kvsEl("i", { style: { background: KIND_COLORS[k] } }), k])),
  ]);
  const tip = kvsEl("div", { class: "kvs-tooltip", "data-testid": "kvs-timeline-tooltip" });
  document.body.append(tip);
  root.append(kvsEl("div", { class: "kvs-title" }, ["Timeline", sub]), legend, holder);

  function tipOn(node, text) {
    node.addEventListener("mousemove", (ev) => {
      tip.textContent = typeof text === "function" ? text() : text; tip.style.display = "block";
      // Keep the tooltip inside the window (a long caption near the right edge).
      const w = tip.offsetWidth, h = tip.offsetHeight;
      const x = ev.clientX + 12 + w > window.innerWidth ? Math.max(0, ev.clientX - 12 - w) : ev.clientX + 12;
      const y = ev.clientY + 12 + h > window.innerHeight ? Math.max(0, ev.clientY - 12 - h) : ev.clientY + 12;
      tip.style.left = `${x}px`; tip.style.top = `${y}px`;
    });
    node.addEventListener("mouseleave", () => { tip.style.display = "none"; });
  }

  const LABEL_CHARS = 20, LABEL_CHAR_PX = 5.6;  // the axis font is 9px
  function rowLabel(rid) {
    const name = `#${rid}`;
    if (name.length <= LABEL_CHARS) return name;
    const keep = (LABEL_CHARS - 1) / 2;
    return `${name.slice(0, Math.ceil(keep))}\u2026${name.slice(-Math.floor(keep))}`;
  }
  // The step's bar tooltip: its numbers, then the step in words (explorer/captions.py).
  function stepText(S, i) {
    const p = S.prefill[i] || 0, d = S.decode[i] || 0;
    const head = `step ${S.step[i]}: ${p} prefill + ${d} decode tokens (budget ${S.budget[i]})`
      + (S.preempted && S.preempted[i] ? `, ${S.preempted[i]} preempted` : "");
    const caption = S.caption ? S.caption[i] : "";
    return caption ? `${head}\n${caption}` : head;
  }

  let drawnWidth = 0;
  function draw() {
    const S = model.get("steps") || {};
    const all = S.step || [];
    if (!all.length) {  // a fresh dashboard: say what to do instead of drawing empty axes
      sub.textContent = "";
      drawnWidth = holder.clientWidth;
      holder.replaceChildren(kvsEl("div", { class: "kvs-empty-hint", "data-testid": "kvs-timeline-empty", text: EMPTY_HINT }));
      return;
    }
    const shown = model.get("step");
    // The window ends at the displayed step (scrubbing moves it).
    let endIdx = all.findIndex((s) => s === shown);
    if (endIdx < 0) endIdx = all.length - 1;
    const startIdx = Math.max(0, endIdx - model.get("window") + 1);
    const idx = [];
    for (let i = startIdx; i <= endIdx; i++) idx.push(i);
    sub.textContent = `steps ${all[startIdx]}\u2013${all[endIdx]} of ${all.length} \u00b7 click a bar to show that step`;
    // As wide as the panel (it follows the window and the notebook: see the ResizeObserver).
    drawnWidth = holder.clientWidth;
    const width = Math.max(320, drawnWidth || 900);
    const g = model.get("gantt") || { requests: [], segments: [] };
    const firstStep = all[startIdx] ?? 1, lastStep = all[endIdx] ?? 1;
    const segs = (g.segments || []).filter((s) => s[2] >= firstStep && s[1] <= lastStep);
    const rowsUsed = [...new Set(segs.map((s) => s[0]))].sort((a, b) => a - b);
    const rowOf = new Map(rowsUsed.map((r, k) => [r, k]));
    // The request ids label the Gantt rows, so the left margin grows to fit the longest one
    // shown (ids past LABEL_CHARS are cut in the middle; the tooltip has them whole).
    const longest = Math.max(0, ...rowsUsed.map((r) => rowLabel(g.requests[r]).length));
    const left = Math.max(48, Math.ceil(8 + longest * LABEL_CHAR_PX)), right = 8, plotW = width - left - right;
    const n = Math.max(1, idx.length), bw = plotW / n;
    // Token chart: a lane for preemption markers on top (never on the budget line), then the bars.
    const lane = 13, tokTop = lane + 3, tokH = 110, tokBottom = tokTop + tokH;
    const timeH = 80, rowH = 12, gap = 18;
    const ganttH = Math.max(rowH, rowsUsed.length * rowH);
    const height = tokBottom + gap + timeH + gap + ganttH + 24;
    const root_ = svg("svg", { width, height, "data-testid": "kvs-timeline-chart" });
    const xOf = (i) => left + (i - startIdx) * bw;
    const stepX = (step) => left + (step - firstStep) * bw;

    // 1. Tokens per step, stacked. The y axis fits the largest batch in view; the budget joins
    // the scale only when a batch comes near it, else it is marked at the top edge (off scale):
    // at budget 2,048 a 16-token batch would otherwise be a sliver.
    const tot = idx.map((i) => (S.prefill[i] || 0) + (S.decode[i] || 0));
    const maxTot = Math.max(1, ...tot);
    const maxBudget = Math.max(0, ...idx.map((i) => S.budget[i] || 0));
    const tmax = maxBudget > 0 && maxBudget <= maxTot * 1.25 ? Math.max(maxTot, maxBudget) : maxTot;
    const yTok = (v) => tokBottom - (Math.min(v, tmax) / tmax) * tokH;
    const barH = (v) => (v > 0 ? Math.max(2, (Math.min(v, tmax) / tmax) * tokH) : 0);  // one token still shows
    // The axis title sits in the marker lane (the margin there is free), clear of the max label.
    root_.append(svg("text", { x: 2, y: lane - 3, class: "kvs-axis" }, "tokens"),
      svg("text", { x: left - 4, y: tokTop + 7, class: "kvs-axis kvs-tok-max", "text-anchor": "end" }, tmax),
      svg("text", { x: left - 4, y: tokBottom, class: "kvs-axis", "text-anchor": "end" }, 0),
      svg("line", { x1: left, x2: width - right, y1: tokBottom + 0.5, y2: tokBottom + 0.5, class: "kvs-baseline" }));
    const budgetOn = [], budgetOff = [];
    for (const i of idx) {
      const x = xOf(i), p = S.prefill[i] || 0, d = S.decode[i] || 0;
      const grp = svg("g", { class: `kvs-step-bar${S.step[i] === shown ? " kvs-current" : ""}`, "data-step": S.step[i] });
      grp.append(svg("rect", { x, y: 0, width: Math.max(1, bw), height: tokBottom, fill: "transparent" }));
      const hd = barH(d), hp = barH(p + d) - hd;
      if (d) grp.append(svg("rect", { x: x + 0.5, y: tokBottom - hd, width: Math.max(1, bw - 1), height: hd, fill: KIND_COLORS.decode, class: "kvs-bar-decode" }));
      if (p) grp.append(svg("rect", { x: x + 0.5, y: tokBottom - hd - Math.max(2, hp), width: Math.max(1, bw - 1), height: Math.max(2, hp), fill: KIND_COLORS.prefill, class: "kvs-bar-prefill" }));
      if (S.preempted && S.preempted[i]) {
        const mark = svg("text", { x: x + bw / 2, y: lane - 2, "text-anchor": "middle", class: "kvs-preempt-mark", "data-step": S.step[i] },
          S.preempted[i] > 1 ? `\u25bc${S.preempted[i]}` : "\u25bc");
        grp.append(mark);
      }
      tipOn(grp, () => stepText(S, i));
      grp.addEventListener("click", () => sender.send({ action: "scrub_step", step: S.step[i] }));
      root_.append(grp);
      const b = S.budget[i] || 0;
      if (b > tmax) budgetOff.push(`${x},${tokTop}`, `${x + bw},${tokTop}`);
      else budgetOn.push(`${x},${yTok(b)}`, `${x + bw},${yTok(b)}`);
    }
    if (budgetOn.length) root_.append(svg("polyline", { points: budgetOn.join(" "), fill: "none", stroke: BUDGET_COLOR, "stroke-width": 1.5, "stroke-dasharray": "4 2", class: "kvs-budget-line" }));
    if (budgetOff.length) {
      // Off scale: a faint line at the top edge, and the budget named at the right end.
      root_.append(svg("polyline", { points: budgetOff.join(" "), fill: "none", stroke: BUDGET_COLOR, "stroke-width": 1, "stroke-dasharray": "1 3", class: "kvs-budget-offscale" }));
      const label = svg("text", { x: width - right - 2, y: tokTop + 10, "text-anchor": "end", class: "kvs-budget-label", "data-testid": "kvs-budget-offscale" },
        `budget ${maxBudget} \u2191 (off scale)`);
      tipOn(label, `token budget ${maxBudget} per step: above this chart's scale, which fits the largest batch in view (${maxTot} tokens)`);
      root_.append(label);
    }

    // 2. Time split per step (ms), stacked.
    const y0 = tokBottom + gap;
    const ms = idx.map((i) => TIME_PARTS.reduce((a, [k]) => a + (S[k] ? S[k][i] || 0 : 0), 0));
    const mmax = Math.max(1e-6, ...ms);
    root_.append(svg("text", { x: 2, y: y0 - 4, class: "kvs-axis" }, "ms"), svg("text", { x: left - 4, y: y0 + 8, class: "kvs-axis", "text-anchor": "end" }, mmax.toFixed(mmax < 10 ? 1 : 0)));
    for (const i of idx) {
      let acc = 0;
      const x = xOf(i);
      for (const [k, color] of TIME_PARTS) {
        const v = S[k] ? S[k][i] || 0 : 0;
        if (!v) continue;
        const h = (v / mmax) * timeH;
        const r = svg("rect", { x: x + 0.5, y: y0 + timeH - acc - h, width: Math.max(1, bw - 1), height: h, fill: color });
        tipOn(r, `step ${S.step[i]}: ${TIME_PARTS.map(([kk]) => `${kk} ${(S[kk] ? S[kk][i] || 0 : 0).toFixed(2)}`).join(", ")} ms \u00b7 ${pathText(S, i)}`);
        root_.append(r);
        acc += h;
      }
      // A decode step that replayed a CUDA graph: "G" over its time bar.
      const bucket = S.graph_bucket ? S.graph_bucket[i] : null;
      if (bucket !== null && bucket !== undefined) {
        const mark = svg("text", { x: x + bw / 2, y: y0 + timeH - acc - 2, "text-anchor": "middle", class: "kvs-graph-mark", "data-step": S.step[i] }, "G");
        tipOn(mark, `step ${S.step[i]}: ${pathText(S, i)}`);
        root_.append(mark);
      }
    }

    // 3. Gantt: one row per request seen in the window.
    const gy = y0 + timeH + gap;
    root_.append(svg("text", { x: 2, y: gy - 4, class: "kvs-axis" }, "requests"));
    for (const s of segs) {
      const [ri, a, b, kind, label] = s;
      const rid = g.requests[ri];
      const x = stepX(Math.max(a, firstStep)), x2 = stepX(Math.min(b, lastStep) + 1);
      const y = gy + rowOf.get(ri) * rowH;
      const r = svg("rect", { x: x + 0.5, y: y + 1, width: Math.max(1, x2 - x - 1), height: rowH - 2, fill: KIND_COLORS[kind] || "#999", class: `kvs-gantt-${kind}`, "data-request-id": rid });
      tipOn(r, `#${rid}: ${label || kind}, step${a === b ? ` ${a}` : `s ${a}\u2013${b}`}`);
      root_.append(r);
    }
    for (const [ri, k] of rowOf) {
      const rid = g.requests[ri];
      // The label may be cut; its native title and the tooltip name the request whole.
      const name = svg("g", { class: "kvs-gantt-name" }, null);
      name.append(svg("title", {}, `#${rid}`), svg("text", { x: left - 4, y: gy + k * rowH + rowH - 3, class: "kvs-axis kvs-gantt-label", "text-anchor": "end", fill: kvsColor(rid) }, rowLabel(rid)));
      tipOn(name, `#${rid}`);
      root_.append(name);
    }
    // Step numbers along the bottom.
    const every = Math.max(1, Math.ceil(40 / bw));
    for (let i = startIdx; i <= endIdx; i += every) {
      root_.append(svg("text", { x: xOf(i) + bw / 2, y: height - 4, class: "kvs-axis", "text-anchor": "middle" }, S.step[i]));
    }
    // Displayed-step marker across all three charts.
    if (endIdx >= 0 && all.length) {
      const cur = idx.find((i) => S.step[i] === shown);
      if (cur !== undefined) root_.append(svg("rect", { x: xOf(cur), y: 0, width: Math.max(1, bw), height: height - 14, fill: "none", stroke: "#000", "stroke-width": 1, "stroke-dasharray": "2 2", "pointer-events": "none" }));
    }
    holder.replaceChildren(root_);
  }
  const drawSoon = kvsBatched(draw);
  for (const k of ["steps", "gantt", "window", "step"]) model.on(`change:${k}`, drawSoon);
  // Follow the panel's width: a resized window, a narrower notebook, a panel shown later.
  const resize = new ResizeObserver(() => { if (Math.abs(holder.clientWidth - drawnWidth) >= 1) drawSoon(); });
  resize.observe(holder);
  draw();
  return () => { resize.disconnect(); tip.remove(); sender.dispose(); };
}

export default { render };
