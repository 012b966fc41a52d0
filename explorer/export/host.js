// @ts-check
// kvscope export host: the panels' own ESM, run over a recorded history, with no kernel.
//
// explorer/export/page.py inlines this file in a one-file HTML export, next to each panel's ESM
// and CSS and every panel state of every kept step, computed at export time in Python by the
// Dashboard's own view code (explorer/export/states.py: the first step whole, then each step's
// delta, explorer/core/history.py's format). This host has no view code: it patches the steps back,
// stands in for anywidget's model (get / set / on / off / send / save_changes) and for the
// Python side of the Dashboard (explorer/ui/dashboard.py's SessionBinder) by handing the shown
// step's states to the panels, answers the panels' actions (scrub, select, block details)
// from the embedded states, and turns engine actions (Step, add request, ...) down with one
// line on how to run live. The TTFT/ITL charts are the latency panel's own (widgets/latency.js).
// Nothing is fetched: the page's CSP forbids it, and everything it needs is inline.

/**
 * The embedded document (explorer/export/page.py build_export_data).
 * @typedef {{format: string, version: number, meta: Meta, timeline: PanelState, captions: Array<[number, string]>,
 *   views: Array<Object>, why: WhyChoices}} ExportData  views: StepViews whole, then one Delta per step
 * @typedef {{title: string, panels: string[], links: Object<string, string[]>, keeps_choice: string[], start: ("first"|"last"),
 *   run_live: string, notice: string, first_step: number, last_step: number}} Meta
 *   links: a request chosen in one panel -> the panels it is chosen in (explorer/ui/layout.py SELECTION_LINKS)
 *   keeps_choice: the panels a cleared choice leaves on their request (layout.KEEPS_CHOICE)
 * A delta (explorer/core/history.py diff): {"=": value} | {"+": appended} | {"i": {index: Delta}} |
 * {"d": {key: Delta}, "x": [removed keys]}; no delta: unchanged.
 * @typedef {{"=": unknown} | {"+": string | unknown[]} | {i: Object<string, Delta>}
 *   | {d?: Object<string, Delta>, x?: string[]}} Delta
 * One kept step's panel states (explorer/export/states.py step_views), each as the binder sends it:
 * @typedef {{step: number, controls: PanelState, queues: PanelState, blocks: PanelState, block_details: Array<PanelState>,
 *   slots: PanelState, sampler: SamplerChoices, attention: PanelState, latency: LatencyState, tree: PanelState}
 *   & Object<string, PanelState>} StepViews  (and each other panel's: explorer/ui/panel_views.py PANEL_VIEWS)
 *   blocks: BlockPoolPanel traits, its byte columns as PackedColumn; block_details: per block id,
 *   BlockPoolPanel.block_detail without `step` (the shown step is added here)
 * @typedef {{__array__: ("B"|"H"|"h"), values: number[]}} PackedColumn  a bytes trait (Python array typecode)
 * @typedef {{requests: string[], default: string, samples: Object<string, Object>}} SamplerChoices
 * @typedef {{summary: Array<[number, Object]>, requests: Object<string, Array<[number, Object]>>,
 *   default: Array<[number, string]>}} WhyChoices  the why panel's states, one item per step where they change
 *   the SamplerPanel's `sample` for each request the user could select; `default`: what "" selects
 * @typedef {{rows: Array<Object>, clock: string, clock_note: string}} LatencyState  LatencyPanel's traits
 * @typedef {Object<string, unknown>} PanelState  a panel's traits, by name, as Python sends them
 */

/** The text of one of the page's embedded JSON scripts (explorer/export/page.py writes them). @param {string} id */
function embedded(id) {
  const node = document.getElementById(id);
  if (!node || node.textContent === null) throw new Error(`this page lacks its embedded ${id}`);
  return node.textContent;
}
/** @type {ExportData} */
const DATA = JSON.parse(embedded("kvs-history"));
const DEFAULTS = JSON.parse(embedded("kvs-panel-defaults"));
const RUN_LIVE = DATA.meta.run_live; // "make lab" / "python -m explorer app": one line

// ---- 1. the embedded steps: deltas back to whole states -----------------------------------
/** `old` with delta `d` applied (a new value; `old` is left as it was).
 * @param {any} old any JSON value from Python: the delta says which (string, array, object, ...)
 * @param {Delta | null | undefined} d @returns {any} */
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
/** @param {Array<Object>} packed @returns {StepViews[]} (consecutive steps share what did not change) */
function decodeViews(packed) {
  /** @type {StepViews[]} */
  const out = [];
  for (const item of packed) out.push(out.length ? patch(out[out.length - 1], item) : item);
  return out;
}
const VIEWS = decodeViews(DATA.views);
/** @param {Object<string, unknown> | null | undefined} obj @param {string} key @param {unknown} dflt */
const get = (obj, key, dflt) => (obj && Object.prototype.hasOwnProperty.call(obj, key) ? obj[key] : dflt);

// ---- 2. anywidget's model, over plain values ----------------------------------------------
// Bytes traits arrive in a live notebook as DataView (ipywidgets 8); here they come as base64
// (the panels' defaults) or as a PackedColumn. A column a step left alone is the same object
// as the step before's, so it keeps its DataView and the panel sees no change.
/** @type {Record<string, Uint8ArrayConstructor | Uint16ArrayConstructor | Int16ArrayConstructor>} */
const TYPED = { B: Uint8Array, H: Uint16Array, h: Int16Array };
/** @type {WeakMap<object, DataView>} */
const columns = new WeakMap();
/** @param {any} v a trait value as Python wrote it (any JSON; base64 and PackedColumn decoded) */
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
/** @param {object} state */
const traits = (state) => Object.fromEntries(Object.entries(state).map(([k, v]) => [k, decodeTrait(v)]));
/**
 * The stand-in for anywidget's model; `update` and `custom` are the host's side (what the kernel would send).
 * @typedef {KvsModel & {update(state: Object<string, unknown>): void, custom(msg: object): void}} HostModel
 * A panel's action as the host reads it (its fields unchecked: they are turned with String() / Number()).
 * @typedef {{action: unknown, seq?: unknown, request_id?: unknown, layer?: unknown, head?: unknown,
 *   step?: unknown, index?: unknown, block_id?: unknown}} ActionContent
 */
/** @param {string} name @returns {HostModel} */
function makeModel(name) {
  const values = traits(DEFAULTS[name] || {});
  const handlers = new Map();
  /** @param {string} ev @param {...unknown} args */
  const emit = (ev, ...args) =>
    (handlers.get(ev) || []).slice().forEach((/** @type {(...args: unknown[]) => void} */ h) => h(...args));
  return {
    get: (k) => values[k],
    set: (k, v) => {
      values[k] = v;
      emit(`change:${k}`);
    },
    on: (ev, h) => {
      if (!handlers.has(ev)) handlers.set(ev, []);
      handlers.get(ev).push(h);
    },
    off: (ev, h) => {
      if (!ev) {
        handlers.clear();
        return;
      }
      handlers.set(
        ev,
        (handlers.get(ev) || []).filter((/** @type {(...args: unknown[]) => void} */ x) => h && x !== h),
      );
    },
    save_changes: () => {},
    send: (content) => {
      Promise.resolve().then(() => HOST.onAction(name, content));
    },
    // Host side: what the kernel would sync (trait changes), and custom messages (acks).
    update(state) {
      const changed = Object.keys(state).filter((k) => values[k] !== state[k]);
      for (const k of changed) values[k] = state[k];
      for (const k of changed) emit(`change:${k}`);
    },
    custom(msg) {
      emit("msg:custom", msg, []);
    },
  };
}

// ---- 3. the Dashboard's binder, for a recording ------------------------------------------
/** @type {Set<unknown>} */
const ENGINE_ACTIONS = new Set(["step", "add", "preset", "set_budget", "reset", "abort"]);
const ENGINE_OFF = `This page is a recording: the engine is not running here. To step it live: ${RUN_LIVE}.`;
const ATTENTION_OFF = `Attention weights are read from the live KV cache, and a recording keeps no KV. To see them: ${RUN_LIVE}.`;
const WHY_OFF =
  "this page is a recording: causes are proven when it is written (export_html(..., prove=True)) or in a notebook (Prove causes)";

// The panels render() draws from more than their own state of the step; every other panel shows
// exactly its VIEWS entry, as the binder sent it (explorer/ui/panel_views.py PANEL_VIEWS, a new panel too).
/** The last state of `changes` ([step, state] items in step order) at or before `step`.
 * @template T @param {Array<[number, T]>} changes @param {number} step @param {T} before @returns {T} */
function atStep(changes, step, before) {
  let out = before;
  for (const [at, state] of changes || []) {
    if (at > step) break;
    out = state;
  }
  return out;
}

const HOST_DRAWN = new Set(["controls", "blocks", "sampler", "timeline", "attention", "why"]);

const HOST = {
  /** @type {Object<string, HostModel>} */
  models: {},
  viewIndex: VIEWS.length - 1,
  samplerPinned: false, // the user chose the sampler's request (else: the step's default)
  timelineSet: false,

  /** Every panel from VIEWS[viewIndex], as SessionBinder.render sends it. */
  render() {
    const i = this.viewIndex;
    const v = VIEWS[i];
    const live = i === VIEWS.length - 1;
    const m = this.models;
    for (const model of Object.values(m)) model.update({ step: v.step, live });
    if (m.controls) {
      m.controls.update({
        ...v.controls,
        history_len: VIEWS.length,
        history_first: VIEWS[0].step,
        view_index: live ? -1 : i,
        has_work: false,
      });
    }
    if (m.blocks) {
      m.blocks.update(traits(v.blocks));
      const sel = m.blocks.get("selected");
      if (sel >= 0) m.blocks.update({ detail: this.blockDetail(sel) });
    }
    if (m.sampler) m.sampler.update(this.samplerState());
    if (m.timeline && !this.timelineSet) {
      m.timeline.update(DATA.timeline);
      this.timelineSet = true;
    }
    if (m.attention) m.attention.update({ ...v.attention, message: ATTENTION_OFF });
    for (const [name, model] of Object.entries(m)) if (!HOST_DRAWN.has(name) && v[name]) model.update(v[name]);
    if (m.why) m.why.update(this.whyState());
    drawCaption(v.step);
  },

  /** The WhyPanel's traits as they stood after the shown step: the run's summary and the chosen
   * request's why (made in Python, one item per step where they change). */
  whyState() {
    const w = DATA.why || { summary: [], requests: {}, default: [] };
    const step = VIEWS[this.viewIndex].step;
    const picked = String(this.models.why.get("request_id") || "");
    const rid = get(w.requests, picked, undefined) !== undefined ? picked : atStep(w.default, step, "");
    const request = rid ? atStep(w.requests[rid], step, { request_id: rid, known: false }) : {};
    return { summary: atStep(w.summary, step, {}), request, prove_off: WHY_OFF };
  },

  /** The SamplerPanel's traits for the selected request (views.sampler_state, from Python). */
  samplerState() {
    const s = VIEWS[this.viewIndex].sampler;
    const picked = this.samplerPinned ? this.models.sampler.get("request_id") : "";
    const rid = get(s.samples, picked, undefined) !== undefined ? picked : s.default;
    return { requests: s.requests, request_id: rid, sample: s.samples[rid] };
  },

  /** BlockPoolPanel.block_detail of the shown step ({} for no such block). @param {number} id */
  blockDetail(id) {
    const d = VIEWS[this.viewIndex].block_details[id];
    return d ? { ...d, step: Number(this.models.blocks.get("step")) } : {};
  },

  /** @param {number | null} index the step's index in VIEWS; null (or out of range): the last */
  scrub(index) {
    const n = VIEWS.length;
    this.viewIndex = index === null || index < 0 || index >= n ? n - 1 : index;
    this.render();
  },

  /** @param {string} name @param {unknown} content */
  onAction(name, content) {
    if (!content || typeof content !== "object" || !("action" in content)) return;
    let error = null;
    try {
      this.handle(name, content);
    } catch (exc) {
      error = String(exc instanceof Error ? exc.message : exc);
      console.error("kvscope export: action failed", content, exc);
    }
    if ("seq" in content) this.models[name].custom({ type: "ack", seq: content.seq, error });
  },

  /** @param {string} name @param {ActionContent} c */
  handle(name, c) {
    const m = this.models;
    const action = c.action;
    if (ENGINE_ACTIONS.has(action)) {
      if (m.controls) m.controls.update({ error: ENGINE_OFF });
      throw new Error(ENGINE_OFF);
    }
    // Panel-local actions (the panels' own handle_action in Python).
    if (name === "controls" && action === "clear_error") {
      m.controls.update({ error: "" });
      return;
    }
    if (name === "blocks" && (action === "block_detail" || action === "select_block")) {
      const id = Number(get(c, "block_id", -1));
      if (action === "select_block") m.blocks.update({ selected: id });
      m.blocks.update({ detail: this.blockDetail(id) });
      return;
    }
    if (name === "queues" && action === "select") m.queues.update({ selected: String(c.request_id || "") });
    if (name === "attention" && action === "select") {
      /** @type {{request_id?: string, layer?: number, head?: number}} */
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
      // The panels a choice in this one links to (SessionBinder._select, from the same table).
      const rid = String(c.request_id || "");
      for (const target of /** @type {string[]} */ (get(DATA.meta.links, name, []))) {
        if (!m[target]) continue;
        // layout.chosen: a panel in keeps_choice stays on its request when the choice is cleared
        if (rid || !DATA.meta.keeps_choice.includes(target)) m[target].update({ request_id: rid });
        if (target === "sampler") this.samplerPinned = !!m.sampler.get("request_id");
      }
      this.render();
    } else if (action === "refresh" && m.attention) m.attention.update({ message: ATTENTION_OFF });
  },
};

// ---- 4. captions and page --------------------------------------------------------------
/** @param {number} step */
function drawCaption(step) {
  const box = /** @type {?HTMLElement} */ (document.querySelector('[data-testid="kvs-export-caption"]'));
  if (!box) return;
  let text = "";
  for (const [s, t] of DATA.captions || []) if (s <= step) text = t;
  box.textContent = text;
  box.style.display = text ? "" : "none";
}

/** @param {string} source */
function importModule(source) {
  // Each panel's ESM as the panel wrote it; a blob: URL, or a data: URL where blob: is refused.
  const blobUrl = URL.createObjectURL(new Blob([source], { type: "text/javascript" }));
  return import(blobUrl).catch(() => import(`data:text/javascript;charset=utf-8,${encodeURIComponent(source)}`));
}

/** @param {Element} el */
function disableEngineControls(el) {
  // Step, Run N, Play, Reset and the forms need a kernel; the history row stays.
  for (const tid of ["kvs-step-btn", "kvs-run-n", "kvs-run-btn", "kvs-play-btn", "kvs-speed", "kvs-reset-btn"]) {
    /** @type {HTMLButtonElement | HTMLInputElement | HTMLSelectElement | null} */
    const node = el.querySelector(`[data-testid="${tid}"]`);
    if (node) {
      node.disabled = true;
      node.title = ENGINE_OFF;
    }
  }
  // The drawer holds the add-request form and the knobs: all engine actions.
  for (const tid of ["kvs-add-form", "kvs-budget", "kvs-pool", "kvs-drawer", "kvs-drawer-toggle"]) {
    /** @type {HTMLElement | null} */
    const node = el.querySelector(`[data-testid="${tid}"]`);
    if (node) node.style.display = "none";
  }
  // A recording has no "live": the history's own end is its last step.
  /** @type {HTMLButtonElement | null} */
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
  const layout = /** @type {HTMLElement} */ (document.getElementById("kvs-export-root"));
  const slot = (/** @type {string} */ name) => layout.querySelector(`[data-panel="${name}"]`);
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
  if (HOST.models.controls) disableEngineControls(/** @type {Element} */ (slot("controls")));
  const start = DATA.meta.start === "first" ? 0 : VIEWS.length - 1;
  HOST.scrub(start);
  document.body.dataset.ready = "true";
}

// For tests and the curious: the decoded steps, the host (its panel models), the decoder.
window.kvsExport = { views: VIEWS, host: HOST, patch };
main().catch((exc) => {
  console.error(exc);
  const box = /** @type {HTMLElement} */ (document.getElementById("kvs-export-error"));
  box.textContent = `kvscope export failed to start: ${exc && exc.message ? exc.message : exc}`;
  box.style.display = "";
});
