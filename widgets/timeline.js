// @ts-check
// Timeline: stacked prefill/decode tokens per step with the budget line, stacked time
// split per step, and a Gantt row per request. One SVG, steps share the x axis; it is as
// wide as the panel and redraws when the panel's width changes.
//
// Readable at every step: the token axis is a square-root scale (a 1-token decode next to a
// 300-token prefill is still a bar you can see and click, never under MIN_BAR_PX), and the
// ms axis is cut at a high percentile, so one slow step (a first plotly draw, a compile) is
// marked as an outlier instead of flattening every other bar. Scrubbing never hides the run:
// the whole run stays drawn (up to `window` steps) with a cursor on the shown step.

const BUDGET_COLOR = "#d32f2f";
const AHEAD_COLOR = "#00897b"; // a step scheduled ahead (async scheduling): a line under its bar
/** @type {{[kind: string]: string}} */
const KIND_COLORS = {
  queued: "#e0e0e0",
  prefill: "#fb8c00",
  decode: "#1e88e5",
  preempted: "#e53935",
  stalled: "#bdbdbd",
};
/** @typedef {"schedule"|"prepare"|"forward"|"sample"|"update"} TimePart  a KvsTimelineSteps field of ms per step */
/** @type {[TimePart, string][]} */
const TIME_PARTS = [
  ["schedule", "#8e24aa"],
  ["prepare", "#43a047"],
  ["forward", "#1e88e5"],
  ["sample", "#fdd835"],
  ["update", "#6d4c41"],
];
const GANTT_KINDS = ["queued", "prefill", "decode", "preempted", "stalled"];

// Geometry (px). The token chart has a lane for preemption markers on top, then the bars.
const MIN_BAR_PX = 6; // the shortest token bar: one decode token stays visible and clickable
const MIN_PART_PX = 2; // the shortest prefill part stacked on decodes
const MARK_LANE = 13,
  TOK_H = 110,
  TIME_H = 80,
  ROW_H = 12,
  GAP = 18,
  AXIS_H = 24;
const MIN_WIDTH = 320,
  FALLBACK_WIDTH = 900,
  MIN_LEFT = 48,
  RIGHT = 8,
  TICK_SPACING_PX = 40;
const LABEL_CHARS = 20,
  LABEL_CHAR_PX = 5.6; // the axis font is 9px

const EMPTY_HINT = "no steps yet: add a request and press Step";

/**
 * The traits (explorer/ui/views.py timeline_state) are `steps` (KvsTimelineSteps: one list per field,
 * entry i the i-th step's) and `gantt` (KvsTimelineGantt).
 * @typedef {{startIdx: number, endIdx: number, curIdx: number}} Span
 * @typedef {(node: SVGElement, text: string | (() => string)) => void} TipOn
 * @typedef {{tipOn: TipOn, scrub: (step: number) => Promise<KvsAck>}} DrawCtx  what the charts call back
 */

// How a step's forward ran: the attention backend, and layer by layer (eager), a CUDA graph
// replay, or the whole decode as one native call on a CPU.
/** @param {KvsTimelineSteps} S @param {number} i */
function pathText(S, i) {
  const backend = S.backend ? S.backend[i] : null;
  const bucket = S.graph_bucket ? S.graph_bucket[i] : null;
  const native = S.forward_path && S.forward_path[i] === "native_decode";
  const path =
    bucket !== null && bucket !== undefined
      ? `CUDA graph (bucket ${bucket})`
      : native
        ? "native decode (one call for all layers)"
        : "eager";
  return backend ? `${backend} attention, ${path}` : path;
}

/**
 * The steps drawn: the whole run when it fits `window`, else the latest `window` steps, or a
 * window around the shown step when that one is older. Scrubbing moves only the cursor.
 * @param {number[]} all @param {number} shown @param {number} window @returns {Span}
 */
function stepSpan(all, shown, window) {
  const n = all.length;
  let curIdx = all.indexOf(shown);
  if (curIdx < 0) curIdx = n - 1;
  const w = Math.max(1, window || n);
  let startIdx = Math.max(0, n - w);
  if (curIdx < startIdx) startIdx = Math.max(0, curIdx - Math.floor(w / 2));
  return { startIdx, endIdx: Math.min(n - 1, startIdx + w - 1), curIdx };
}

/** A square-root scale of `top` tokens over `h` px; `height(v)` never under MIN_BAR_PX for v > 0. @param {number} top @param {number} h */
function tokenScale(top, h) {
  const frac = (/** @type {number} */ v) => Math.sqrt(Math.min(Math.max(v, 0), top) / top);
  return {
    top,
    y: (/** @type {number} */ v) => frac(v) * h,
    height: (/** @type {number} */ v) => (v > 0 ? Math.max(MIN_BAR_PX, frac(v) * h) : 0),
  };
}

/** @param {string} rid */
function rowLabel(rid) {
  const name = `#${rid}`;
  if (name.length <= LABEL_CHARS) return name;
  const keep = (LABEL_CHARS - 1) / 2;
  return `${name.slice(0, Math.ceil(keep))}\u2026${name.slice(-Math.floor(keep))}`;
}

// Async scheduling: the step still running when step i was scheduled (null: none was).
/** @param {KvsTimelineSteps} S @param {number} i @returns {number | null} */
function aheadOf(S, i) {
  const a = S.scheduled_ahead ? S.scheduled_ahead[i] : null;
  return a === undefined ? null : a;
}

// The step's bar tooltip: its numbers, then the step in words (explorer/ui/captions.py).
/** @param {KvsTimelineSteps} S @param {number} i */
function stepText(S, i) {
  const p = S.prefill[i] || 0,
    d = S.decode[i] || 0;
  const head =
    `step ${S.step[i]}: ${p} prefill + ${d} decode tokens (budget ${S.budget[i]})` +
    (S.preempted && S.preempted[i] ? `, ${S.preempted[i]} preempted` : "") +
    (aheadOf(S, i) !== null ? `, scheduled while step ${aheadOf(S, i)} still ran (async scheduling)` : "");
  const caption = S.caption ? S.caption[i] : "";
  return caption ? `${head}\n${caption}` : head;
}

function legend() {
  const item = (/** @type {string[]} */ [t, c]) => kvsEl("span", {}, [kvsEl("i", { style: { background: c } }), t]);
  return kvsEl("div", { class: "kvs-legend" }, [
    ...[
      ["prefill tokens", KIND_COLORS.prefill],
      ["decode tokens", KIND_COLORS.decode],
      ["token budget", BUDGET_COLOR],
    ].map(item),
    kvsEl("span", { title: "a step that preempted a request (hover it: who, and why)" }, [
      kvsEl("b", { class: "kvs-preempt-key", text: "\u25bc" }),
      "preemption",
    ]),
    kvsEl(
      "span",
      {
        class: "kvs-ahead-key",
        "data-testid": "kvs-ahead-key",
        title:
          "a step scheduled while the step before still ran (async scheduling): its decode inputs were placeholders for that step's tokens",
      },
      [kvsEl("i", { style: { background: AHEAD_COLOR } }), "scheduled ahead"],
    ),
    kvsEl("span", { class: "kvs-muted", text: " | time:" }),
    ...TIME_PARTS.map(item),
    kvsEl("span", { title: "a step slower than the ms axis: its bar is cut at the top, its time written on it" }, [
      kvsEl("b", { class: "kvs-outlier-key", text: "\u2191" }),
      "slow step (cut)",
    ]),
    kvsEl("span", { class: "kvs-muted", text: " | requests:" }),
    ...GANTT_KINDS.map((k) => item([k, KIND_COLORS[k]])),
  ]);
}

/** Tooltips that follow the pointer and stay inside the window. @param {HTMLElement} tip @returns {TipOn} */
function makeTips(tip) {
  return function tipOn(node, text) {
    node.addEventListener("mousemove", (ev) => {
      tip.textContent = typeof text === "function" ? text() : text;
      tip.style.display = "block";
      kvsPlaceTip(tip, ev);
    });
    node.addEventListener("mouseleave", () => {
      tip.style.display = "none";
    });
  };
}

/**
 * Layout of one drawing: x of each step, the charts' tops, the rows of the Gantt in view.
 * @param {KvsTimelineSteps} S @param {KvsTimelineGantt} g @param {Span} span @param {number} width
 */
function layout(S, g, span, width) {
  const firstStep = S.step[span.startIdx] ?? 1,
    lastStep = S.step[span.endIdx] ?? 1;
  const segs = (g.segments || []).filter((s) => s[2] >= firstStep && s[1] <= lastStep);
  const rowsUsed = [...new Set(segs.map((s) => s[0]))].sort((a, b) => a - b);
  // The request ids label the Gantt rows, so the left margin grows to fit the longest one
  // shown (ids past LABEL_CHARS are cut in the middle; the tooltip has them whole).
  const longest = Math.max(0, ...rowsUsed.map((r) => rowLabel(g.requests[r]).length));
  const left = Math.max(MIN_LEFT, Math.ceil(8 + longest * LABEL_CHAR_PX));
  const n = Math.max(1, span.endIdx - span.startIdx + 1),
    bw = (width - left - RIGHT) / n;
  const tokTop = MARK_LANE + 3,
    tokBottom = tokTop + TOK_H;
  const timeTop = tokBottom + GAP,
    ganttTop = timeTop + TIME_H + GAP;
  const height = ganttTop + Math.max(ROW_H, rowsUsed.length * ROW_H) + AXIS_H;
  return {
    width,
    left,
    bw,
    firstStep,
    lastStep,
    segs,
    rowOf: new Map(rowsUsed.map((r, k) => [r, k])),
    tokTop,
    tokBottom,
    timeTop,
    ganttTop,
    height,
    xOf: (/** @type {number} */ i) => left + (i - span.startIdx) * bw,
    stepX: (/** @type {number} */ step) => left + (step - firstStep) * bw,
  };
}
/** @typedef {ReturnType<typeof layout>} Layout */

/**
 * 1. Tokens per step, stacked, on a square-root axis; the budget line; preemption marks.
 * @param {SVGElement} out @param {KvsTimelineSteps} S @param {Span} span @param {Layout} L @param {DrawCtx} ctx
 */
function drawTokens(out, S, span, L, ctx) {
  const idx = [];
  for (let i = span.startIdx; i <= span.endIdx; i++) idx.push(i);
  // The axis fits the largest batch in view; the budget joins it only when a batch comes
  // near it, else it is marked at the top edge (at budget 2,048 a 16-token batch is small).
  const maxTot = Math.max(1, ...idx.map((i) => (S.prefill[i] || 0) + (S.decode[i] || 0)));
  const maxBudget = Math.max(0, ...idx.map((i) => S.budget[i] || 0));
  const sc = tokenScale(maxBudget > 0 && maxBudget <= maxTot * 1.25 ? Math.max(maxTot, maxBudget) : maxTot, TOK_H);
  const yTok = (/** @type {number} */ v) => L.tokBottom - sc.y(v);
  const mid = Math.round(sc.top / 4); // half the height on a square-root axis
  out.append(
    kvsSvg("text", { x: 2, y: MARK_LANE - 3, class: "kvs-axis" }, "tokens (\u221a scale)"),
    kvsSvg(
      "text",
      { x: L.left - 4, y: L.tokTop + 7, class: "kvs-axis kvs-tok-max", "text-anchor": "end" },
      String(sc.top),
    ),
    kvsSvg("line", { x1: L.left, x2: L.width - RIGHT, y1: yTok(mid), y2: yTok(mid), class: "kvs-gridline" }),
    kvsSvg(
      "text",
      { x: L.left - 4, y: yTok(mid) + 3, class: "kvs-axis kvs-tok-mid", "text-anchor": "end" },
      String(mid),
    ),
    kvsSvg("text", { x: L.left - 4, y: L.tokBottom, class: "kvs-axis", "text-anchor": "end" }, "0"),
    kvsSvg("line", {
      x1: L.left,
      x2: L.width - RIGHT,
      y1: L.tokBottom + 0.5,
      y2: L.tokBottom + 0.5,
      class: "kvs-baseline",
    }),
  );
  const budgetOn = [],
    budgetOff = [];
  for (const i of idx) {
    const x = L.xOf(i),
      p = S.prefill[i] || 0,
      d = S.decode[i] || 0,
      bw = Math.max(1, L.bw - 1);
    const grp = kvsSvg("g", {
      class: `kvs-step-bar${i === span.curIdx ? " kvs-current" : ""}`,
      "data-step": S.step[i],
    });
    grp.append(kvsSvg("rect", { x, y: 0, width: Math.max(1, L.bw), height: L.tokBottom, fill: "transparent" }));
    const hd = sc.height(d),
      hp = p ? Math.max(MIN_PART_PX, sc.height(p + d) - hd) : 0;
    if (d)
      grp.append(
        kvsSvg("rect", {
          x: x + 0.5,
          y: L.tokBottom - hd,
          width: bw,
          height: hd,
          fill: KIND_COLORS.decode,
          class: "kvs-bar-decode",
        }),
      );
    if (p)
      grp.append(
        kvsSvg("rect", {
          x: x + 0.5,
          y: L.tokBottom - hd - hp,
          width: bw,
          height: hp,
          fill: KIND_COLORS.prefill,
          class: "kvs-bar-prefill",
        }),
      );
    if (S.preempted && S.preempted[i]) {
      const n = S.preempted[i];
      grp.append(overBar(L, x, MARK_LANE - 2, "kvs-preempt-mark", S.step[i], n > 1 ? `\u25bc${n}` : "\u25bc"));
    }
    if (aheadOf(S, i) !== null)
      // under the bar: scheduled before the step before it had sampled
      grp.append(
        kvsSvg("rect", {
          x: x + 0.5,
          y: L.tokBottom + 1.5,
          width: bw,
          height: 2,
          fill: AHEAD_COLOR,
          class: "kvs-ahead-mark",
        }),
      );
    ctx.tipOn(grp, () => stepText(S, i));
    grp.addEventListener("click", () => ctx.scrub(S.step[i]));
    out.append(grp);
    const b = S.budget[i] || 0;
    if (b > sc.top) budgetOff.push(`${x},${L.tokTop}`, `${x + L.bw},${L.tokTop}`);
    else budgetOn.push(`${x},${yTok(b)}`, `${x + L.bw},${yTok(b)}`);
  }
  if (budgetOn.length)
    out.append(
      kvsSvg("polyline", {
        points: budgetOn.join(" "),
        fill: "none",
        stroke: BUDGET_COLOR,
        "stroke-width": 1.5,
        "stroke-dasharray": "4 2",
        class: "kvs-budget-line",
      }),
    );
  if (budgetOff.length) {
    // Off scale: a faint line at the top edge, and the budget named at the right end.
    out.append(
      kvsSvg("polyline", {
        points: budgetOff.join(" "),
        fill: "none",
        stroke: BUDGET_COLOR,
        "stroke-width": 1,
        "stroke-dasharray": "1 3",
        class: "kvs-budget-offscale",
      }),
    );
    const label = kvsSvg(
      "text",
      {
        x: L.width - RIGHT - 2,
        y: L.tokTop + 10,
        "text-anchor": "end",
        class: "kvs-budget-label",
        "data-testid": "kvs-budget-offscale",
      },
      `budget ${maxBudget} \u2191 (off scale)`,
    );
    ctx.tipOn(
      label,
      `token budget ${maxBudget} per step: above this chart's scale, which fits the largest batch in view (${maxTot} tokens)`,
    );
    out.append(label);
  }
}

/**
 * 2. Time split per step (ms), stacked; steps above the cut are drawn to it and marked.
 * @param {SVGElement} out @param {KvsTimelineSteps} S @param {Span} span @param {Layout} L @param {DrawCtx} ctx
 */
function drawTimes(out, S, span, L, ctx) {
  const y0 = L.timeTop;
  /** @param {TimePart} k @param {number} i */
  const partMs = (k, i) => (S[k] ? S[k][i] || 0 : 0);
  const total = (/** @type {number} */ i) => TIME_PARTS.reduce((a, [k]) => a + partMs(k, i), 0);
  const idx = [];
  for (let i = span.startIdx; i <= span.endIdx; i++) idx.push(i);
  const { cap, cut } = kvsCutScale(idx.map(total)); // the ms axis
  const fmt = (/** @type {number} */ v) => v.toFixed(v < 10 ? 1 : 0);
  out.append(
    kvsSvg("text", { x: 2, y: y0 - 4, class: "kvs-axis" }, "ms"),
    kvsSvg(
      "text",
      {
        x: L.left - 4,
        y: y0 + 8,
        class: "kvs-axis kvs-ms-max",
        "text-anchor": "end",
        "data-cut": cut ? "true" : "false",
      },
      `${fmt(cap)}${cut ? "\u2191" : ""}`,
    ),
  );
  for (const i of idx) {
    const x = L.xOf(i),
      t = total(i),
      scale = t > cap ? cap / t : 1;
    const text =
      `step ${S.step[i]}: ${TIME_PARTS.map(([k]) => `${k} ${partMs(k, i).toFixed(2)}`).join(", ")} ms \u00b7 ${pathText(S, i)}` +
      (t > cap
        ? `\n${fmt(t)} ms in all: above this axis (cut at the ${Math.round(KVS_CUT.percentile * 100)}th percentile of the steps in view)`
        : "");
    let acc = 0;
    for (const [k, color] of TIME_PARTS) {
      const v = partMs(k, i);
      if (!v) continue;
      const h = ((v * scale) / cap) * TIME_H;
      const r = kvsSvg("rect", {
        x: x + 0.5,
        y: y0 + TIME_H - acc - h,
        width: Math.max(1, L.bw - 1),
        height: h,
        fill: color,
        class: "kvs-time-part",
        "data-step": S.step[i],
      });
      ctx.tipOn(r, text);
      out.append(r);
      acc += h;
    }
    if (t > cap) {
      // the slow step: a break mark at the top and its real time
      const mark = overBar(L, x, y0 - 2, "kvs-ms-outlier", S.step[i], L.bw >= 26 ? `\u2191${fmt(t)}` : "\u2191", {
        "data-ms": t.toFixed(1),
      });
      ctx.tipOn(mark, text);
      out.append(mark);
    }
    // A decode step that replayed a CUDA graph: "G" over its time bar.
    const bucket = S.graph_bucket ? S.graph_bucket[i] : null;
    if (bucket !== null && bucket !== undefined) {
      const mark = overBar(L, x, y0 + TIME_H - acc - 2, "kvs-graph-mark", S.step[i], "G");
      ctx.tipOn(mark, `step ${S.step[i]}: ${pathText(S, i)}`);
      out.append(mark);
    }
  }
}

/** A mark centred over a step's bar (a preemption's \u25bc, a slow step's \u2191, a CUDA graph's G).
 * @param {Layout} L @param {number} x the bar's left @param {number} y its baseline @param {string} cls
 * @param {number} step @param {string} text @param {Object<string, string>} [more] other attributes */
function overBar(L, x, y, cls, step, text, more = {}) {
  return kvsSvg("text", { x: x + L.bw / 2, y, "text-anchor": "middle", class: cls, "data-step": step, ...more }, text);
}

/** 3. Gantt: one row per request seen in the steps drawn. @param {SVGElement} out @param {KvsTimelineGantt} g @param {Layout} L @param {DrawCtx} ctx */
function drawGantt(out, g, L, ctx) {
  const gy = L.ganttTop;
  out.append(kvsSvg("text", { x: 2, y: gy - 4, class: "kvs-axis" }, "requests"));
  for (const [ri, a, b, kind, label] of L.segs) {
    const rid = g.requests[ri];
    const x = L.stepX(Math.max(a, L.firstStep)),
      x2 = L.stepX(Math.min(b, L.lastStep) + 1);
    const y = gy + /** @type {number} */ (L.rowOf.get(ri)) * ROW_H; // every segment's row is in rowOf
    const r = kvsSvg("rect", {
      x: x + 0.5,
      y: y + 1,
      width: Math.max(1, x2 - x - 1),
      height: ROW_H - 2,
      fill: KIND_COLORS[kind] || "#999",
      class: `kvs-gantt-${kind}`,
      "data-request-id": rid,
    });
    ctx.tipOn(r, `#${rid}: ${label || kind}, step${a === b ? ` ${a}` : `s ${a}\u2013${b}`}`);
    out.append(r);
  }
  for (const [ri, k] of L.rowOf) {
    const rid = g.requests[ri];
    // The label may be cut; its native title and the tooltip name the request whole.
    const name = kvsSvg("g", { class: "kvs-gantt-name" }, null);
    name.append(
      kvsSvg("title", {}, `#${rid}`),
      kvsSvg(
        "text",
        {
          x: L.left - 4,
          y: gy + k * ROW_H + ROW_H - 3,
          class: "kvs-axis kvs-gantt-label",
          "text-anchor": "end",
          fill: kvsColor(rid),
        },
        rowLabel(rid),
      ),
    );
    ctx.tipOn(name, `#${rid}`);
    out.append(name);
  }
}

/**
 * Step numbers along the bottom, and the cursor on the shown step across all three charts.
 * @param {SVGElement} out @param {KvsTimelineSteps} S @param {Span} span @param {Layout} L
 */
function drawAxisAndCursor(out, S, span, L) {
  const every = Math.max(1, Math.ceil(TICK_SPACING_PX / L.bw));
  for (let i = span.startIdx; i <= span.endIdx; i += every) {
    out.append(
      kvsSvg(
        "text",
        { x: L.xOf(i) + L.bw / 2, y: L.height - 4, class: "kvs-axis", "text-anchor": "middle" },
        S.step[i],
      ),
    );
  }
  if (span.curIdx < span.startIdx || span.curIdx > span.endIdx) return;
  const x = L.xOf(span.curIdx);
  out.append(
    kvsSvg("rect", {
      x,
      y: 0,
      width: Math.max(1, L.bw),
      height: L.height - 14,
      class: "kvs-cursor",
      "data-testid": "kvs-timeline-cursor",
      "data-step": S.step[span.curIdx],
      "pointer-events": "none",
    }),
  );
  // The shown step's number under the cursor, even where the axis skips it.
  out.append(
    kvsSvg(
      "text",
      {
        x: x + L.bw / 2,
        y: L.height - 4,
        class: "kvs-axis kvs-cursor-label",
        "text-anchor": "middle",
        "pointer-events": "none",
      },
      S.step[span.curIdx],
    ),
  );
}

/** @param {KvsRenderContextOf<KvsPanelStates["timeline"]>} ctx */
function render({ model, el }) {
  const root = kvsRoot(el, model, "kvs-timeline");
  const sender = kvsSender(model);
  const sub = kvsEl("span", { class: "kvs-sub", "data-testid": "kvs-timeline-sub" });
  const holder = kvsEl("div", { class: "kvs-timeline-svg" });
  const tip = kvsEl("div", { class: "kvs-tooltip", "data-testid": "kvs-timeline-tooltip" });
  document.body.append(tip);
  root.append(kvsEl("div", { class: "kvs-title" }, ["Timeline", sub]), legend(), holder);
  /** @type {DrawCtx} */
  const ctx = { tipOn: makeTips(tip), scrub: (step) => sender.send({ action: "scrub_step", step }) };

  let drawnWidth = 0;
  function draw() {
    const S = model.get("steps") || {};
    const all = S.step || [];
    drawnWidth = holder.clientWidth;
    const key = root.querySelector(".kvs-ahead-key"); // named only where a step was scheduled ahead
    if (key instanceof HTMLElement) key.hidden = !(S.scheduled_ahead || []).some((a) => a !== null);
    if (!all.length) {
      // a fresh dashboard: say what to do instead of drawing empty axes
      sub.textContent = "";
      holder.replaceChildren(
        kvsEl("div", { class: "kvs-empty-hint", "data-testid": "kvs-timeline-empty", text: EMPTY_HINT }),
      );
      return;
    }
    const span = stepSpan(all, model.get("step"), model.get("window"));
    const range =
      span.startIdx === 0 && span.endIdx === all.length - 1
        ? `all ${all.length} steps`
        : `steps ${all[span.startIdx]}\u2013${all[span.endIdx]} of ${all.length}`;
    const latest = span.curIdx === all.length - 1;
    sub.textContent = `${range} \u00b7 ${latest ? "showing the latest step" : `cursor on step ${all[span.curIdx]}`} \u00b7 click a bar to show that step`;
    // As wide as the panel (it follows the window and the notebook: see the ResizeObserver).
    const L = layout(
      S,
      model.get("gantt") || { requests: [], segments: [] },
      span,
      Math.max(MIN_WIDTH, drawnWidth || FALLBACK_WIDTH),
    );
    const out = kvsSvg("svg", {
      width: L.width,
      height: L.height,
      "data-testid": "kvs-timeline-chart",
      "data-first-step": all[span.startIdx],
      "data-last-step": all[span.endIdx],
    });
    drawTokens(out, S, span, L, ctx);
    drawTimes(out, S, span, L, ctx);
    drawGantt(out, model.get("gantt") || { requests: [], segments: [] }, L, ctx);
    drawAxisAndCursor(out, S, span, L);
    holder.replaceChildren(out);
  }
  const drawSoon = kvsBatched(draw);
  kvsOnChange(model, KVS_PANELS.timeline.draw, drawSoon, ["window", "step"]);
  // Follow the panel's width: a resized window, a narrower notebook, a panel shown later.
  const resize = new ResizeObserver(() => {
    if (Math.abs(holder.clientWidth - drawnWidth) >= 1) drawSoon();
  });
  resize.observe(holder);
  draw();
  return () => {
    resize.disconnect();
    tip.remove();
    sender.dispose();
  };
}

export default { render };
