// @ts-check
// TTFT / ITL: per-request time to first token and inter-token latency, and both distributions.
// The one renderer of these charts: the live panel runs it in a notebook, and an export
// (explorer/export/host.js) mounts this same module over its recorded states. Each chart is
// its own SVG in its own box, sized from what it must hold (every request's label, rotated
// when long), so no title, label or axis of one chart can reach another.

/**
 * A request's latencies are a KvsLatencyRowDict (explorer/ui/views.py latency_rows), in seconds.
 * @typedef {{label: string, full: string, values: number[]}} Column  one request's values in ms
 */

const LAT_COLORS = { ttft: "#fb8c00", itl: "#1e88e5" };
const LAT_MS = 1000;
const LABEL_CHARS = 24; // ids up to this long are drawn whole; longer ones (vLLM's) are cut in the middle
const CHAR_PX = 6.2; // width of one 10 px label character, about
const LABEL_PX = 11; // height of a label line
const TILT_DEG = 40; // long labels are drawn at this angle
const TILT_SIN = Math.sin((TILT_DEG * Math.PI) / 180),
  TILT_COS = Math.cos((TILT_DEG * Math.PI) / 180);
const PLOT_H = 140,
  TOP = 26,
  LEFT = 52,
  RIGHT = 12,
  AXIS_TITLE_H = 18;
const MIN_SLOT_PX = 16; // the narrowest column a request gets (tilted labels need no more)
const MAX_BINS = 20;
const LOG_BINS_RATIO = 10; // a distribution whose largest value is this many times its smallest gets log bins

/**
 * A request id as an axis label: whole when short, else its head and tail around an ellipsis,
 * kept long enough that no two requests read the same.
 * @param {string[]} ids
 * @returns {string[]}
 */
function axisLabels(ids) {
  const longest = Math.max(0, ...ids.map((id) => id.length));
  for (let keep = LABEL_CHARS; ; keep += 4) {
    const labels = ids.map((id) => {
      if (id.length <= keep) return `#${id}`;
      const head = Math.ceil((keep - 1) / 2),
        tail = Math.floor((keep - 1) / 2);
      return `#${id.slice(0, head)}\u2026${id.slice(id.length - tail)}`;
    });
    if (new Set(labels).size === new Set(ids).size || keep >= longest) return labels;
  }
}

/** "12.3", "0.42", "1,250": a tick value in ms. @param {number} v */
function tickText(v) {
  return v >= 100 ? Math.round(v).toLocaleString("en-US") : v >= 10 ? v.toFixed(1) : v.toFixed(2);
}
/** A count's ticks: whole numbers only. */
const countText = (/** @type {number} */ v) => (Number.isInteger(v) ? String(v) : "");

/**
 * An SVG with a title, a y axis from 0 to `vmax` with its title, and an x axis title under
 * `bottom` px of tick labels. Returns the SVG and the y scale.
 * @param {{width: number, bottom: number, title: string, yTitle: string, xTitle: string, vmax: number, testid: string,
 *   ticks?: (v: number) => string, left?: number}} o
 */
function chartFrame(o) {
  const height = TOP + PLOT_H + o.bottom + AXIS_TITLE_H;
  const left = o.left ?? LEFT;
  const svg = kvsSvg("svg", { width: o.width, height, class: "kvs-lat-chart", "data-testid": o.testid });
  const base = TOP + PLOT_H;
  const y = (/** @type {number} */ v) => base - (v / o.vmax) * PLOT_H;
  svg.append(kvsSvg("text", { x: left, y: 14, class: "kvs-lat-title" }, o.title));
  svg.append(kvsSvg("line", { x1: left, x2: left, y1: TOP, y2: base, class: "kvs-lat-axis-line" }));
  svg.append(kvsSvg("line", { x1: left, x2: o.width - RIGHT, y1: base, y2: base, class: "kvs-lat-axis-line" }));
  const ticks = o.ticks || tickText;
  for (const v of [0, o.vmax / 2, o.vmax]) {
    const text = ticks(v);
    if (text)
      svg.append(kvsSvg("text", { x: left - 4, y: y(v) + 3, "text-anchor": "end", class: "kvs-lat-axis" }, text));
  }
  svg.append(
    kvsSvg(
      "text",
      {
        x: 12,
        y: TOP + PLOT_H / 2,
        "text-anchor": "middle",
        class: "kvs-lat-axis-title",
        transform: `rotate(-90 12 ${TOP + PLOT_H / 2})`,
      },
      o.yTitle,
    ),
  );
  svg.append(
    kvsSvg(
      "text",
      { x: left + (o.width - left - RIGHT) / 2, y: height - 4, "text-anchor": "middle", class: "kvs-lat-axis-title" },
      o.xTitle,
    ),
  );
  return { svg, y, base };
}

/**
 * One column per request, every request labelled: bars (TTFT) or a dot per gap and its mean (ITL).
 * Too many requests for the box: the chart grows wider and its box scrolls.
 * @param {{title: string, columns: Column[], color: string, kind: ("bar"|"dots"), width: number, clock: string, testid: string}} o
 */
function perRequestChart(o) {
  const n = Math.max(1, o.columns.length);
  const labelPx = Math.max(0, ...o.columns.map((c) => c.label.length * CHAR_PX));
  let slot = Math.max(MIN_SLOT_PX, (o.width - LEFT - RIGHT) / n);
  const tilt = labelPx > slot - 6;
  if (!tilt) slot = Math.max(slot, labelPx + 6);
  // A tilted first label reaches left of its column: the plot starts far enough right to hold it,
  // and the columns share what is left of the box.
  const left = tilt ? Math.max(LEFT, Math.ceil(labelPx * TILT_COS - MIN_SLOT_PX / 2) + 24) : LEFT;
  if (tilt) slot = Math.max(MIN_SLOT_PX, (o.width - left - RIGHT) / n);
  const width = Math.max(o.width, left + RIGHT + n * slot);
  const bottom = tilt ? Math.ceil(labelPx * TILT_SIN + LABEL_PX * TILT_COS) + 8 : LABEL_PX + 8;
  // One slow request must not flatten the rest: the axis is cut (kvsCutScale) and what passes it
  // is drawn at the top, marked, its real value in its tooltip.
  const { cap, cut } = kvsCutScale(o.columns.flatMap((c) => c.values));
  const {
    svg,
    y: yOf,
    base,
  } = chartFrame({
    width,
    bottom,
    title: o.title,
    yTitle: `ms (${o.clock})`,
    xTitle: "request",
    vmax: cap,
    testid: o.testid,
    left,
    ticks: (v) => `${tickText(v)}${cut && v === cap ? "\u2191" : ""}`,
  });
  const y = (/** @type {number} */ v) => yOf(Math.min(v, cap));
  const above = (/** @type {number} */ mx, /** @type {number} */ v, /** @type {string} */ tip) => {
    if (v <= cap) return;
    const mark = kvsSvg(
      "text",
      { x: mx + 7, y: TOP + 9, "text-anchor": "middle", class: "kvs-lat-outlier", "data-ms": v.toFixed(1) },
      "\u2191",
    );
    mark.append(
      kvsSvg("title", {}, `${tip} (above this axis, cut at the ${Math.round(KVS_CUT.percentile * 100)}th percentile)`),
    );
    svg.append(mark);
  };
  o.columns.forEach((c, k) => {
    const x = left + k * slot,
      mid = x + slot / 2;
    if (o.kind === "bar" && c.values.length) {
      const bar = kvsSvg("rect", {
        x: x + slot * 0.15,
        y: y(c.values[0]),
        width: Math.max(1, slot * 0.7),
        height: base - y(c.values[0]),
        fill: o.color,
      });
      bar.append(kvsSvg("title", {}, `#${c.full}: ${c.values[0].toFixed(2)} ms`));
      svg.append(bar);
      above(mid, c.values[0], `#${c.full}: ${c.values[0].toFixed(2)} ms`);
    } else if (c.values.length) {
      c.values.forEach((v, j) => {
        const dot = kvsSvg("circle", {
          cx: x + slot * (0.25 + 0.5 * ((j * 0.618) % 1)),
          cy: y(v),
          r: 2.2,
          fill: o.color,
          "fill-opacity": 0.6,
        });
        dot.append(kvsSvg("title", {}, `#${c.full} gap ${j + 1}: ${v.toFixed(2)} ms`));
        svg.append(dot);
      });
      const worst = c.values.reduce((a, b) => Math.max(a, b), 0);
      above(mid, worst, `#${c.full}: its slowest gap ${worst.toFixed(2)} ms`);
      const mean = c.values.reduce((a, b) => a + b, 0) / c.values.length;
      const line = kvsSvg("line", {
        x1: x + slot * 0.1,
        x2: x + slot * 0.9,
        y1: y(mean),
        y2: y(mean),
        class: "kvs-lat-mean",
      });
      line.append(
        kvsSvg("title", {}, `#${c.full}: mean ${mean.toFixed(2)} ms over ${kvsCount(c.values.length, "gap")}`),
      );
      svg.append(line);
    }
    const ly = base + LABEL_PX + 2;
    // The whole id on hover (a <title> beside the label: the label's own text stays the label).
    const label = kvsSvg("g", { class: "kvs-lat-label" }, null);
    label.append(
      kvsSvg("title", {}, `#${c.full}`),
      kvsSvg(
        "text",
        tilt
          ? {
              x: mid,
              y: ly,
              "text-anchor": "end",
              class: "kvs-lat-axis kvs-lat-tick",
              transform: `rotate(${-TILT_DEG} ${mid} ${ly})`,
            }
          : { x: mid, y: ly, "text-anchor": "middle", class: "kvs-lat-axis kvs-lat-tick" },
        c.label,
      ),
    );
    svg.append(label);
  });
  return svg;
}

/**
 * A histogram of `values` (ms): up to MAX_BINS bins between the smallest and the largest.
 * @param {{title: string, values: number[], color: string, width: number, clock: string, testid: string}} o
 */
function histogram(o) {
  const vs = o.values;
  const lo = vs.reduce((a, b) => Math.min(a, b), Infinity),
    hi = vs.reduce((a, b) => Math.max(a, b), -Infinity);
  const bins = hi > lo ? Math.max(1, Math.min(MAX_BINS, Math.ceil(Math.sqrt(vs.length)))) : 1; // all equal: one bar
  // Over a wide range (a few slow gaps among thousands of fast ones) the bins are even in log(ms):
  // linear bins would put nearly everything in the first bar.
  const log = lo > 0 && hi / lo >= LOG_BINS_RATIO;
  const at = (/** @type {number} */ f) => (log ? lo * (hi / lo) ** f : lo + f * (hi > lo ? hi - lo : 1));
  const binOf = (/** @type {number} */ v) =>
    Math.min(
      bins - 1,
      Math.floor((log ? Math.log(v / lo) / Math.log(hi / lo) : (v - lo) / (hi > lo ? hi - lo : 1)) * bins),
    );
  const counts = new Array(bins).fill(0);
  for (const v of vs) counts[binOf(v)] += 1;
  const { svg, y, base } = chartFrame({
    width: o.width,
    bottom: LABEL_PX + 8,
    title: log ? `${o.title} (log bins)` : o.title,
    yTitle: "count",
    xTitle: `ms (${o.clock}${log ? ", log scale" : ""})`,
    vmax: Math.max(1, ...counts),
    testid: o.testid,
    ticks: countText,
  });
  svg.setAttribute("data-bins", log ? "log" : "linear");
  const plotW = o.width - LEFT - RIGHT,
    bw = plotW / bins;
  counts.forEach((c, k) => {
    if (!c) return;
    const bar = kvsSvg("rect", {
      x: LEFT + k * bw + 1,
      y: y(c),
      width: Math.max(1, bw - 2),
      height: base - y(c),
      fill: o.color,
      class: "kvs-lat-bin",
    });
    bar.append(kvsSvg("title", {}, `${tickText(at(k / bins))}\u2013${tickText(at((k + 1) / bins))} ms: ${c}`));
    svg.append(bar);
  });
  const ends =
    hi > lo
      ? [
          [LEFT, lo, "start"],
          [LEFT + plotW, hi, "end"],
        ]
      : [[LEFT + plotW / 2, lo, "middle"]];
  if (log) ends.push([LEFT + plotW / 2, at(0.5), "middle"]); // the middle of a log axis is not the mean of its ends
  for (const [x, v, anchor] of ends) {
    svg.append(
      kvsSvg("text", { x, y: base + LABEL_PX + 2, "text-anchor": anchor, class: "kvs-lat-axis" }, tickText(Number(v))),
    );
  }
  return svg;
}

/**
 * The four charts for these rows, each `width` px wide (a per-request chart may grow wider).
 * @param {KvsLatencyRowDict[]} rows
 * @param {number} width
 * @param {string} clock
 */
function latencyCharts(rows, width, clock) {
  const ttft = rows.filter((r) => r.time_to_first_token !== null && r.time_to_first_token !== undefined);
  const gaps = rows.filter((r) => (r.inter_token_latency || []).length);
  const labelled = (
    /** @type {KvsLatencyRowDict[]} */ rs,
    /** @type {(r: KvsLatencyRowDict) => number[]} */ values,
  ) => {
    const labels = axisLabels(rs.map((r) => String(r.request_id)));
    return rs.map((r, k) => ({
      label: labels[k],
      full: String(r.request_id),
      values: values(r).map((v) => v * LAT_MS),
    }));
  };
  const itlAll = gaps.flatMap((r) => r.inter_token_latency.map((v) => v * LAT_MS));
  const charts = [
    perRequestChart({
      title: "Time to first token per request",
      columns: labelled(ttft, (r) => [Number(r.time_to_first_token)]),
      color: LAT_COLORS.ttft,
      kind: "bar",
      width,
      clock,
      testid: "kvs-lat-ttft",
    }),
    perRequestChart({
      title: "ITL per request (dot: a gap, line: its mean)",
      columns: labelled(gaps, (r) => r.inter_token_latency),
      color: LAT_COLORS.itl,
      kind: "dots",
      width,
      clock,
      testid: "kvs-lat-itl",
    }),
  ];
  if (ttft.length) {
    charts.push(
      histogram({
        title: "TTFT distribution",
        values: ttft.map((r) => Number(r.time_to_first_token) * LAT_MS),
        color: LAT_COLORS.ttft,
        width,
        clock,
        testid: "kvs-lat-ttft-dist",
      }),
    );
  }
  if (itlAll.length) {
    charts.push(
      histogram({
        title: "ITL distribution",
        values: itlAll,
        color: LAT_COLORS.itl,
        width,
        clock,
        testid: "kvs-lat-itl-dist",
      }),
    );
  }
  return charts;
}

const LAT_TWO_COLUMNS_PX = 900; // from this panel width the charts sit two by two

/** @param {KvsRenderContextOf<KvsPanelStates["latency"]>} ctx */
function render({ model, el }) {
  const root = kvsRoot(el, model, "kvs-latency");
  const sub = kvsEl("span", { class: "kvs-sub", "data-testid": "kvs-latency-clock" });
  const head = kvsEl("div", { class: "kvs-lat-head", "data-testid": "kvs-latency-head" });
  const charts = kvsEl("div", { class: "kvs-lat-charts", "data-testid": "kvs-latency-charts" });
  root.append(kvsEl("div", { class: "kvs-title" }, ["TTFT / ITL", sub]), head, charts);
  let drawnWidth = -1;
  function draw() {
    const rows = model.get("rows") || [];
    const clock = model.get("clock") || "engine clock";
    sub.textContent = `${clock}: ${model.get("clock_note") || ""}`;
    sub.title = sub.textContent;
    const nTtft = rows.filter((r) => r.time_to_first_token !== null && r.time_to_first_token !== undefined).length;
    const nGaps = rows.reduce((a, r) => a + (r.inter_token_latency || []).length, 0);
    const hint = !rows.length
      ? "no steps yet: add a request and press Step"
      : !nTtft
        ? "no first token yet: press Step"
        : "";
    head.textContent = [
      kvsCount(rows.length, "request"),
      `${nTtft} with a first token`,
      kvsCount(nGaps, "inter-token gap"),
      clock,
      hint,
    ]
      .filter(Boolean)
      .join(" \u00b7 ");
    root.dataset.empty = hint ? "true" : "false";
    const inner = root.clientWidth - 18;
    drawnWidth = root.clientWidth;
    if (hint || inner <= 0) {
      charts.replaceChildren();
      return;
    }
    const two = inner >= LAT_TWO_COLUMNS_PX;
    const width = Math.floor(two ? (inner - 12) / 2 : inner);
    charts.classList.toggle("kvs-lat-two", two);
    charts.replaceChildren(
      ...latencyCharts(rows, width, clock).map((svg) => kvsEl("div", { class: "kvs-lat-box" }, [svg])),
    );
  }
  const drawSoon = kvsBatched(draw);
  kvsOnChange(model, KVS_PANELS.latency.draw, drawSoon);
  // Drawn for the panel's width: a resized window, a notebook narrowed by a side bar, a panel shown late.
  const sizes = new ResizeObserver(() => {
    if (root.clientWidth !== drawnWidth) drawSoon();
  });
  sizes.observe(root);
  draw();
  return () => sizes.disconnect();
}

export default { render };
