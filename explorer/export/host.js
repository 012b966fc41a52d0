// kvscope export host: the panels' own ESM, run over a recorded history, with no kernel.
//
// explorer/export/page.py inlines this file in a one-file HTML export, next to each panel's ESM
// and CSS and every panel state of every kept step, computed at export time in Python by the
// Dashboard's own view code (explorer/export/states.py: the first step whole, then each step's
// delta, explorer/core/history.py's format). This host has no view code: it patches the steps back,
// stands in for anywidget's model (get / set / on / off / send / save_changes) and for the
// Python side of the Dashboard (explorer/ui/dashboard.py's SessionBinder) by handing the shown
// step's states to the panels, answers the panels' actions (scrub, select, block details)
// from the embedded states, draws the TTFT/ITL charts (plotly needs a kernel), and turns
// engine actions (Step, add request, ...) down with one line on how to run live.
// Nothing is fetched: the page's CSP forbids it, and everything it needs is inline.

/**
 * The embedded document (explorer/export/page.py build_export_data).
 * @typedef {{format: string, version: number, meta: Meta, timeline: Object, captions: Array<[number, string]>,
 *   views: Array<Object>}} ExportData  views: StepViews whole, then one Delta per step
 * @typedef {{title: string, panels: string[], start: ("first"|"last"), run_live: string, notice: string,
 *   first_step: number, last_step: number}} Meta
 * A delta (explorer/core/history.py diff): {"=": value} | {"+": appended} | {"i": {index: Delta}} |
 * {"d": {key: Delta}, "x": [removed keys]}; no delta: unchanged.
 * @typedef {Object} Delta
 * One kept step's panel states (explorer/export/states.py _entry_views), each as the binder sends it:
 * @typedef {{step: number, controls: Object, queues: Object, blocks: Object, block_details: Array<Object>,
 *   slots: Object, sampler: SamplerChoices, attention: Object, latency: Array<LatencyRow>}} StepViews
 *   blocks: BlockPoolPanel traits, its byte columns as PackedColumn; block_details: per block id,
 *   BlockPoolPanel.block_detail without `step` (the shown step is added here)
 * @typedef {{__array__: ("B"|"H"|"h"), values: number[]}} PackedColumn  a bytes trait (Python array typecode)
 * @typedef {{requests: string[], default: string, samples: Object<string, Object>}} SamplerChoices
 *   the SamplerPanel's `sample` for each request the user could select; `default`: what "" selects
 * @typedef {{request_id: string, time_to_first_token: ?number, inter_token_latency: number[]}} LatencyRow
 */

/** @type {ExportData} */
const DATA = JSON.parse(document.getElementById("kvs-history").textContent);
const DEFAULTS = JSON.parse(document.getElementById("kvs-panel-defaults").textContent);
const RUN_LIVE = DATA.meta.run_live;  // "make lab" / "python -m explorer app": one line

// ---- 1. the embedded steps: deltas back to whole states -----------------------------------
function patch(old, d) {
  if (d === null || d === undefined) return old;
  if ("=" in d) return d["="];
  if ("+" in d) return typeof old === "string" ? old + d["+"] : old.concat(d["+"]);
  if ("i" in d) {
    const out = old.slice();
    for (const [i, sub] of Object.entries(d.i)) out[Number(i)] = patch(out[Number(i)], sub);
    return out;
  }
  const out = { ...old };
  for (const k of d.x || []) delete out[k];
  for (const [k, sub] of Object.entries(d.d || {})) out[k] = patch(out[k], sub);
  return out;
}
/** @returns {StepViews[]} (consecutive steps share what did not change) */
function decodeViews(packed) {
  const out = [];
  for (const item of packed) out.push(out.length ? patch(out[out.length - 1], item) : item);
  return out;
}
const VIEWS = decodeViews(DATA.views);
const get = (obj, key, dflt) => (obj && Object.prototype.hasOwnProperty.call(obj, key) ? obj[key] : dflt);

// ---- 2. anywidget's model, over plain values ----------------------------------------------
// Bytes traits arrive in a live notebook as DataView (ipywidgets 8); here they come as base64
// (the panels' defaults) or as a PackedColumn. A column a step left alone is the same object
// as the step before's, so it keeps its DataView and the panel sees no change.
const TYPED = { B: Uint8Array, H: Uint16Array, h: Int16Array };
const columns = new WeakMap();
function decodeTrait(v) {
  if (!v || typeof v !== "object") return v;
  if (v.__b64__ !== undefined) {
    const bin = atob(v.__b64__);
    const u = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) u[i] = bin.charCodeAt(i);
    return new DataView(u.buffer);
  }
  if (v.__array__ !== undefined) {
    if (!columns.has(v)) columns.set(v, new DataView(TYPED[v.__array__].from(v.values).buffer));
    return columns.get(v);
  }
  return v;
}
const traits = (state) => Object.fromEntries(Object.entries(state).map(([k, v]) => [k, decodeTrait(v)]));
function makeModel(name) {
  const values = traits(DEFAULTS[name] || {});
  const handlers = new Map();
  const emit = (ev, ...args) => (handlers.get(ev) || []).slice().forEach((h) => h(...args));
  return {
    get: (k) => values[k],
    set: (k, v) => { values[k] = v; emit(`change:${k}`); },
    on: (ev, h) => { if (!handlers.has(ev)) handlers.set(ev, []); handlers.get(ev).push(h); },
    off: (ev, h) => {
      if (!ev) { handlers.clear(); return; }
      handlers.set(ev, (handlers.get(ev) || []).filter((x) => h && x !== h));
    },
    save_changes: () => {},
    send: (content) => { Promise.resolve().then(() => HOST.onAction(name, content)); },
    // Host side: what the kernel would sync (trait changes), and custom messages (acks).
    update(state) {
      const changed = Object.keys(state).filter((k) => values[k] !== state[k]);
      for (const k of changed) values[k] = state[k];
      for (const k of changed) emit(`change:${k}`);
    },
    custom(msg) { emit("msg:custom", msg, []); },
  };
}

// ---- 3. the Dashboard's binder, for a recording ------------------------------------------
const ENGINE_ACTIONS = new Set(["step", "add", "preset", "set_budget", "reset", "abort"]);
const ENGINE_OFF = `This page is a recording: the engine is not running here. To step it live: ${RUN_LIVE}.`;
const ATTENTION_OFF = `Attention weights are read from the live KV cache, and a recording keeps no KV. To see them: ${RUN_LIVE}.`;

const HOST = {
  models: {},
  viewIndex: VIEWS.length - 1,
  samplerPinned: false,  // the user chose the sampler's request (else: the step's default)
  timelineSet: false,

  /** Every panel from VIEWS[viewIndex], as SessionBinder.render sends it. */
  render() {
    const i = this.viewIndex;
    const v = VIEWS[i];
    const live = i === VIEWS.length - 1;
    const m = this.models;
    for (const model of Object.values(m)) model.update({ step: v.step, live });
    if (m.controls) {
      m.controls.update({ ...v.controls, history_len: VIEWS.length, history_first: VIEWS[0].step,
        view_index: live ? -1 : i, has_work: false });
    }
    if (m.queues) m.queues.update(v.queues);
    if (m.blocks) {
      m.blocks.update(traits(v.blocks));
      const sel = m.blocks.get("selected");
      if (sel >= 0) m.blocks.update({ detail: this.blockDetail(sel) });
    }
    if (m.slots) m.slots.update(v.slots);
    if (m.sampler) m.sampler.update(this.samplerState());
    if (m.timeline && !this.timelineSet) { m.timeline.update(DATA.timeline); this.timelineSet = true; }
    if (m.attention) m.attention.update({ ...v.attention, message: ATTENTION_OFF });
    drawLatency(v.latency, v.step, live);
    drawCaption(v.step);
  },

  /** The SamplerPanel's traits for the selected request (views.sampler_state, from Python). */
  samplerState() {
    const s = VIEWS[this.viewIndex].sampler;
    const picked = this.samplerPinned ? this.models.sampler.get("request_id") : "";
    const rid = get(s.samples, picked, undefined) !== undefined ? picked : s.default;
    return { requests: s.requests, request_id: rid, sample: s.samples[rid] };
  },

  /** BlockPoolPanel.block_detail of the shown step ({} for no such block). */
  blockDetail(id) {
    const d = VIEWS[this.viewIndex].block_details[id];
    return d ? { ...d, step: Number(this.models.blocks.get("step")) } : {};
  },

  scrub(index) {
    const n = VIEWS.length;
    this.viewIndex = index === null || index < 0 || index >= n ? n - 1 : index;
    this.render();
  },

  onAction(name, content) {
    if (!content || typeof content !== "object" || !("action" in content)) return;
    let error = null;
    try {
      this.handle(name, content);
    } catch (exc) {
      error = String(exc && exc.message ? exc.message : exc);
      console.error("kvscope export: action failed", content, exc);
    }
    if ("seq" in content) this.models[name].custom({ type: "ack", seq: content.seq, error });
  },

  handle(name, c) {
    const m = this.models;
    const action = c.action;
    if (ENGINE_ACTIONS.has(action)) {
      if (m.controls) m.controls.update({ error: ENGINE_OFF });
      throw new Error(ENGINE_OFF);
    }
    // Panel-local actions (the panels' own handle_action in Python).
    if (name === "controls" && action === "clear_error") { m.controls.update({ error: "" }); return; }
    if (name === "blocks" && (action === "block_detail" || action === "select_block")) {
      const id = Number(get(c, "block_id", -1));
      if (action === "select_block") m.blocks.update({ selected: id });
      m.blocks.update({ detail: this.blockDetail(id) });
      return;
    }
    if (name === "queues" && action === "select") m.queues.update({ selected: String(c.request_id || "") });
    if (name === "sampler" && action === "select") m.sampler.update({ request_id: String(c.request_id || "") });
    if (name === "attention" && action === "select") {
      const s = {};
      if (c.request_id !== null && c.request_id !== undefined) s.request_id = String(c.request_id);
      if (c.layer !== null && c.layer !== undefined) s.layer = Number(c.layer);
      if (c.head !== null && c.head !== undefined) s.head = Number(c.head);
      m.attention.update(s);
    }
    // What the binder does with them.
    if (action === "scrub") this.scrub(Number(get(c, "index", -1)));
    else if (action === "scrub_step") {
      const k = VIEWS.findIndex((v) => v.step === Number(c.step));
      if (k >= 0) this.scrub(k);
    } else if (action === "live") this.scrub(null);
    else if (action === "select") {
      const rid = String(c.request_id || "");
      if ((name === "queues" || name === "sampler") && m.sampler) {
        m.sampler.update({ request_id: rid });
        this.samplerPinned = !!rid;
      }
      if ((name === "queues" || name === "attention") && m.attention && rid) m.attention.update({ request_id: rid });
      this.render();
    } else if (action === "refresh" && m.attention) m.attention.update({ message: ATTENTION_OFF });
  },
};

// ---- 4. TTFT / ITL: small SVG charts (plotly's FigureWidget needs a kernel) ---------------
const SVG_NS = "http://www.w3.org/2000/svg";
function svgEl(tag, attrs = {}, text = null) {
  const n = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, String(v));
  if (text !== null) n.textContent = text;
  return n;
}
const SHORT_LABEL_CHARS = 9, LABEL_CHAR_PX = 5.5, ROTATED_DEG = -40, ROTATED_SIN = 0.64, MAX_LABEL_PX = 120;
function chart(title, rows, color, unit, kind) {
  // rows: [[label, [values in ms]]]; kind "bar": one bar per row; "dots": a dot per value and a mean line.
  // Whole request ids under the bars: rotated when long (ids cut to fit could read the same).
  const longest = Math.max(0, ...rows.map(([label]) => label.length));
  const rotate = longest > SHORT_LABEL_CHARS;
  const bottom = rotate ? Math.min(MAX_LABEL_PX, 16 + Math.ceil(longest * LABEL_CHAR_PX * ROTATED_SIN)) : 34;
  const W = 520, H = 156 + bottom, left = 46, top = 22, right = 8;
  const all = rows.flatMap(([, vs]) => vs);
  const vmax = Math.max(1e-9, ...all);
  const plotW = W - left - right, plotH = H - top - bottom;
  const bw = plotW / Math.max(1, rows.length);
  const y = (v) => top + plotH - (v / vmax) * plotH;
  const s = svgEl("svg", { width: W, height: H, class: "kvs-lat-chart" });
  s.append(svgEl("text", { x: left, y: 13, class: "kvs-lat-title" }, title));
  s.append(svgEl("line", { x1: left, x2: left, y1: top, y2: top + plotH, stroke: "#999" }));
  s.append(svgEl("line", { x1: left, x2: W - right, y1: top + plotH, y2: top + plotH, stroke: "#999" }));
  s.append(svgEl("text", { x: left - 4, y: top + 4, "text-anchor": "end", class: "kvs-lat-axis" }, vmax.toFixed(vmax < 10 ? 1 : 0)));
  s.append(svgEl("text", { x: left - 4, y: top + plotH, "text-anchor": "end", class: "kvs-lat-axis" }, "0"));
  s.append(svgEl("text", { x: 4, y: top + plotH / 2, class: "kvs-lat-axis" }, unit));
  if (!rows.length) s.append(svgEl("text", { x: left + 8, y: top + plotH / 2, class: "kvs-lat-axis" }, "nothing yet"));
  const every = Math.max(1, Math.ceil(rows.length / Math.max(1, Math.floor(plotW / (rotate ? 12 : 34)))));
  rows.forEach(([label, vs], k) => {
    const x = left + k * bw;
    if (kind === "bar" && vs.length) {
      const r = svgEl("rect", { x: x + bw * 0.15, y: y(vs[0]), width: Math.max(1, bw * 0.7), height: top + plotH - y(vs[0]), fill: color });
      r.append(svgEl("title", {}, `${label}: ${vs[0].toFixed(2)} ${unit}`));
      s.append(r);
    } else if (vs.length) {
      vs.forEach((v, j) => {
        const c = svgEl("circle", { cx: x + bw * (0.25 + 0.5 * ((j * 0.618) % 1)), cy: y(v), r: 2.2, fill: color, "fill-opacity": 0.6 });
        c.append(svgEl("title", {}, `${label} gap ${j + 1}: ${v.toFixed(2)} ${unit}`));
        s.append(c);
      });
      const mean = vs.reduce((a, b) => a + b, 0) / vs.length;
      const t = svgEl("line", { x1: x + bw * 0.1, x2: x + bw * 0.9, y1: y(mean), y2: y(mean), stroke: "#333", "stroke-width": 1.5 });
      t.append(svgEl("title", {}, `${label} mean ${mean.toFixed(2)} ${unit} over ${vs.length} gaps`));
      s.append(t);
    }
    if (k % every !== 0) return;
    const lx = x + bw / 2, ly = H - bottom + 12;
    const text = svgEl("text", rotate ? { x: lx, y: ly, "text-anchor": "end", class: "kvs-lat-axis kvs-lat-tick", transform: `rotate(${ROTATED_DEG} ${lx} ${ly})` }
      : { x: lx, y: ly, "text-anchor": "middle", class: "kvs-lat-axis kvs-lat-tick" }, label);
    s.append(text);
  });
  return s;
}
let latencyRoot = null;
function drawLatency(rows, step, live) {
  if (!latencyRoot) return;
  const nTtft = rows.filter((r) => r.time_to_first_token !== null).length;
  const nItl = rows.reduce((a, r) => a + r.inter_token_latency.length, 0);
  latencyRoot.dataset.step = String(step);
  latencyRoot.dataset.live = live ? "true" : "false";
  latencyRoot.querySelector(".kvs-lat-head").textContent =
    `${rows.length} requests \u00b7 ${nTtft} with a first token \u00b7 ${nItl} inter-token gaps \u00b7 engine clock`;
  const ms = 1000;
  const charts = latencyRoot.querySelector(".kvs-lat-charts");
  charts.replaceChildren(
    chart("Time to first token per request", rows.filter((r) => r.time_to_first_token !== null).map((r) => [`#${r.request_id}`, [r.time_to_first_token * ms]]), "#fb8c00", "ms", "bar"),
    chart("Inter-token latency per request (dots: each gap, line: mean)", rows.filter((r) => r.inter_token_latency.length).map((r) => [`#${r.request_id}`, r.inter_token_latency.map((v) => v * ms)]), "#1e88e5", "ms", "dots"),
  );
}

// ---- 5. captions and page --------------------------------------------------------------
function drawCaption(step) {
  const box = document.querySelector('[data-testid="kvs-export-caption"]');
  if (!box) return;
  let text = "";
  for (const [s, t] of DATA.captions || []) if (s <= step) text = t;
  box.textContent = text;
  box.style.display = text ? "" : "none";
}

function importModule(source) {
  // Each panel's ESM as the panel wrote it; a blob: URL, or a data: URL where blob: is refused.
  const blobUrl = URL.createObjectURL(new Blob([source], { type: "text/javascript" }));
  return import(blobUrl).catch(() => import(`data:text/javascript;charset=utf-8,${encodeURIComponent(source)}`));
}

function disableEngineControls(el) {
  // Step, Run N, Play, Reset and the forms need a kernel; the history row stays.
  for (const tid of ["kvs-step-btn", "kvs-run-n", "kvs-run-btn", "kvs-play-btn", "kvs-speed", "kvs-reset-btn"]) {
    const node = el.querySelector(`[data-testid="${tid}"]`);
    if (node) { node.disabled = true; node.title = ENGINE_OFF; }
  }
  // The drawer holds the add-request form and the knobs: all engine actions.
  for (const tid of ["kvs-add-form", "kvs-budget", "kvs-pool", "kvs-drawer", "kvs-drawer-toggle"]) {
    const node = el.querySelector(`[data-testid="${tid}"]`);
    if (node) node.style.display = "none";
  }
  // A recording has no "live": the history's own end is its last step.
  const live = el.querySelector('[data-testid="kvs-live-btn"]');
  if (live) {
    live.style.display = "none";
    const last = document.createElement("button");
    last.dataset.testid = "kvs-export-last";
    last.className = "kvs-export-last";
    last.textContent = "last step \u21e5";
    last.title = "show the recording's last step";
    last.addEventListener("click", () => HOST.scrub(null));
    live.after(last);
  }
  const root = el.querySelector('[data-testid="kvs-controls"]');
  if (root) {
    const note = document.createElement("div");
    note.className = "kvs-export-notice";
    note.dataset.testid = "kvs-export-notice";
    note.textContent = ENGINE_OFF;
    root.append(note);
  }
}

async function main() {
  const layout = document.getElementById("kvs-export-root");
  const slot = (name) => layout.querySelector(`[data-panel="${name}"]`);
  for (const name of DATA.meta.panels) {
    const source = document.querySelector(`script[data-kvs-esm="${name}"]`);
    const where = slot(name);
    if (!source || !where) continue;
    const model = makeModel(name);
    HOST.models[name] = model;
    const mod = await importModule(source.textContent);
    const widget = mod.default;
    const render = widget.render || (widget.default && widget.default.render);
    await render({ model, el: where });
  }
  latencyRoot = slot("latency");
  if (HOST.models.controls) disableEngineControls(slot("controls"));
  const start = DATA.meta.start === "first" ? 0 : VIEWS.length - 1;
  HOST.scrub(start);
  document.body.dataset.ready = "true";
}

// For tests and the curious: the decoded steps, the host (its panel models), the decoder.
window.kvsExport = { views: VIEWS, host: HOST, patch };
main().catch((exc) => {
  console.error(exc);
  const box = document.getElementById("kvs-export-error");
  box.textContent = `kvscope export failed to start: ${exc && exc.message ? exc.message : exc}`;
  box.style.display = "";
});
