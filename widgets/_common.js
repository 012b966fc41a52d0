// @ts-check
// kvscope shared helpers. Prepended to every panel's ESM by widgets/_base.py, so the
// panels stay plain ES modules that load nothing from the network.

// ---- colours: spelled once here, used by every panel -----------------------------------
// What a step did to a block owns a saturated colour and an icon; no request colour is
// near any of them (tests/widgets/test_js.py measures it), so a colour never means both.
// Each event's bit, StepRecord.blocks key, label and meaning come from KVS_SCHEMA (_schema.js,
// generated from engine/report/schema.py); its look is here, by key.
/** @type {{[key: string]: [string, string]}} */
const KVS_EVENT_LOOKS = {
  allocated: ["#2e7d32", "+"],
  hits: ["#1565c0", "\u21ba"],
  same_step_hits: ["#00897b", "\u21c9"],
  freed: ["#ef6c00", "\u2212"],
  evicted: ["#c62828", "\u2715"],
  cached: ["#6a1b9a", "#"],
};
// [bit, StepRecord.blocks key, label, colour, icon, what it means]; legends list them in this order.
/** @typedef {[number, string, string, string, string, string]} KvsEvent */
/** @type {KvsEvent[]} */
const KVS_EVENTS = KVS_SCHEMA.block_events.map((e) => [e.bit, e.key, e.label, ...KVS_EVENT_LOOKS[e.key], e.tip]);
const KVS_SAME_STEP_TIP = (KVS_EVENTS.find(([, key]) => key === "same_step_hits") || [])[5] || "";
// Other marks, one meaning each. `cache` (tokens whose KV came from the prefix cache) is
// the prefix-hit colour on purpose: it is the same fact seen from the request's side.
const KVS_MARKS = {
  cache: "#1565c0",
  sampled: "#ad1457",
  focus: "#ffd600",
  focusInk: "#111",
  selected: "#000",
  null: "#555",
  free: "#f4f4f4",
  freeCached: "#c5d9ef",
  hashed: "#1f4e79",
  none: "#9e9e9e",
};
// Why a prompt token hit or missed the prefix cache (explorer/why): one colour per class, the
// same on a queue card's why chip, in the why panel and in the export. A hit is the prefix-hit
// colour (the same fact); an eviction the evicted event's.
/** @type {{[cls: string]: string}} */
const KVS_WHY_LOOKS = {
  hit: KVS_MARKS.cache,
  evicted: "#c62828",
  below_block: "#f9a825",
  never_seen: "#9e9e9e",
  other_domain: "#8d6e63",
  recomputed: "#ef6c00",
  caching_off: "#546e7a",
  left_window: "#ab47bc",
  no_mamba_checkpoint: "#00897b",
  group_cut: "#6a1b9a",
};
// Requests: twelve colours, neighbours far apart; numeric ids take them in turn.
const KVS_REQUEST_COLORS = [
  "#909bdf",
  "#c9a25e",
  "#c059c0",
  "#84bf40",
  "#506a7c",
  "#f3ae91",
  "#59c3cf",
  "#794d34",
  "#e278b6",
  "#8f9325",
  "#77c59c",
  "#c7b0dd",
];

/** `hex` moved toward `toward` by `f` (0..1), as an rgb() colour.
 * @param {string} hex @param {string} toward @param {number} f @returns {string} */
function kvsMix(hex, toward, f) {
  const a = [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16));
  const b = [1, 3, 5].map((i) => parseInt(toward.slice(i, i + 2), 16));
  return `rgb(${a.map((x, k) => Math.round(x + (b[k] - x) * f)).join(", ")})`;
}
const KVS_REQUEST_LIGHT = KVS_REQUEST_COLORS.map((c) => kvsMix(c, "#ffffff", 0.68));

/** @param {string|number} rid @returns {number} */
function kvsColorIndex(rid) {
  const s = String(rid);
  if (/^\d+$/.test(s)) return Number(s) % KVS_REQUEST_COLORS.length;
  let n = 0;
  for (const ch of s) n = (n * 31 + ch.charCodeAt(0)) >>> 0;
  return n % KVS_REQUEST_COLORS.length;
}
// One colour per request id, the same in every panel (`light`: the pale fill).
/** @param {string|number|null|undefined} rid @param {boolean} [light] @returns {string} */
function kvsColor(rid, light = false) {
  if (rid === null || rid === undefined || rid === "") return light ? "#eee" : KVS_MARKS.none;
  const i = kvsColorIndex(rid);
  return light ? KVS_REQUEST_LIGHT[i] : KVS_REQUEST_COLORS[i];
}
// A pale tint per physical block (slot cells are coloured by the block they land in):
// greys and creams, so a block tint never reads as a request or an event.
const KVS_BLOCK_TINTS = ["#eceff1", "#fff8e1", "#e0f2f1", "#fbe9e7", "#ede7f6", "#f1f8e9", "#e3f2fd", "#fce4ec"];
/** @param {number|null|undefined} block @returns {string} */
function kvsBlockTint(block) {
  return block === null || block === undefined || block < 0 ? "#fff" : KVS_BLOCK_TINTS[block % KVS_BLOCK_TINTS.length];
}
// A legend swatch: kvsSwatch({fill, border, icon, dashed, stripes}, text, testid, title).
// The icon is drawn by CSS (::before), so a legend entry's text is its label alone.
/**
 * @param {{fill?: string, border?: string, icon?: string, dashed?: boolean, stripes?: string[], color?: string}} look
 * @param {string} text @param {?string} [testid] @param {?string} [title] @returns {HTMLSpanElement}
 */
function kvsSwatch(look, text, testid = null, title = null) {
  const i = kvsEl("i", {
    class: "kvs-sw",
    style: {
      background: look.fill || "transparent",
      borderColor: look.border || "#aaa",
      borderStyle: look.dashed ? "dashed" : "solid",
      color: look.color || look.border || "#333",
    },
    "data-icon": look.icon || null,
  });
  if (look.stripes)
    i.style.backgroundImage = `linear-gradient(90deg, ${look.stripes.map((c, k, a) => `${c} ${((100 * k) / a.length).toFixed(0)}% ${((100 * (k + 1)) / a.length).toFixed(0)}%`).join(", ")})`;
  return kvsEl("span", { class: "kvs-leg", "data-testid": testid, title }, [i, text]);
}

// Bytes traits arrive as DataView (ipywidgets 8), ArrayBuffer or a typed array.
// Copying into a fresh buffer keeps Int32Array/Float32Array aligned.
/**
 * @template {Uint8Array|Uint16Array|Int16Array|Int32Array|Float32Array} T
 * @param {any} value @param {{new(buffer: ArrayBufferLike, byteOffset?: number, length?: number): T, new(length: number): T, BYTES_PER_ELEMENT: number}} Ctor
 * @returns {T}
 */
function kvsArray(value, Ctor) {
  if (!value) return new Ctor(0);
  let bytes;
  if (value instanceof DataView) bytes = new Uint8Array(value.buffer, value.byteOffset, value.byteLength);
  else if (value instanceof ArrayBuffer) bytes = new Uint8Array(value);
  else if (ArrayBuffer.isView(value)) bytes = new Uint8Array(value.buffer, value.byteOffset, value.byteLength);
  else return new Ctor(0);
  const copy = bytes.slice();
  return new Ctor(copy.buffer, 0, Math.floor(copy.byteLength / Ctor.BYTES_PER_ELEMENT));
}

// A tooltip next to the pointer, kept inside the window: it flips to the pointer's other
// side near the right or bottom edge, and never starts above or left of the window.
const KVS_TIP_OFFSET = 12,
  KVS_TIP_MARGIN = 4;
/** @param {HTMLElement} tip @param {{clientX: number, clientY: number}} ev @returns {void} */
function kvsPlaceTip(tip, ev) {
  const w = tip.offsetWidth,
    h = tip.offsetHeight;
  const vw = document.documentElement.clientWidth || window.innerWidth,
    vh = window.innerHeight;
  let x = ev.clientX + KVS_TIP_OFFSET,
    y = ev.clientY + KVS_TIP_OFFSET;
  if (x + w > vw - KVS_TIP_MARGIN) x = ev.clientX - KVS_TIP_OFFSET - w;
  if (y + h > vh - KVS_TIP_MARGIN) y = ev.clientY - KVS_TIP_OFFSET - h;
  x = Math.max(KVS_TIP_MARGIN, Math.min(x, vw - KVS_TIP_MARGIN - w));
  y = Math.max(KVS_TIP_MARGIN, Math.min(y, vh - KVS_TIP_MARGIN - h));
  tip.style.left = `${x}px`;
  tip.style.top = `${y}px`;
}

// Prefill chunks are counted from 1 on screen, as the captions say them ("chunk 2"); the
// StepRecord's chunk_index counts from 0, and the hover title says so.
/** @param {number|null|undefined} chunkIndex @returns {number} */
function kvsChunkNumber(chunkIndex) {
  return (Number(chunkIndex) || 0) + 1;
}
/** @param {number|null|undefined} chunkIndex @returns {string} */
function kvsChunkTitle(chunkIndex) {
  return `chunk ${kvsChunkNumber(chunkIndex)} of this prompt (the StepRecord's chunk_index ${Number(chunkIndex) || 0} counts from 0)`;
}

// The SVG builder: kvsSvg("rect", {x: 1, width: 4}, "title text"); null or undefined attributes are left out.
const KVS_SVG_NS = "http://www.w3.org/2000/svg";
/** @param {string} tag @param {{[name: string]: any}} [attrs] @param {?(string|number)} [text] @returns {SVGElement} */
function kvsSvg(tag, attrs = {}, text = null) {
  const n = document.createElementNS(KVS_SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) if (v !== null && v !== undefined) n.setAttribute(k, String(v));
  if (text !== null) n.textContent = /** @type {string} */ (text); // a number is written as its text
  return n;
}

// Small DOM builder: kvsEl("div", {class: "x", "data-testid": "y"}, [children or text]).
/**
 * @param {string} tag @param {{[name: string]: any}} [attrs]
 * @param {any} [children] a node, a text, or an array of them (null, undefined and false are skipped)
 * @returns {any} the element (any: callers use the properties of the element they asked for)
 */
function kvsEl(tag, attrs = {}, children = []) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "text") node.textContent = String(v);
    else if (k === "style" && typeof v === "object") Object.assign(node.style, v);
    else if (k.startsWith("on") && typeof v === "function") node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of /** @type {any[]} */ ([]).concat(children)) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

// A value axis that one outlier must not flatten: cut at this percentile (with headroom) when the
// largest value is more than `ratio` times it, and at least `min` values are drawn. The timeline's
// ms axis and the TTFT/ITL charts share it; what passes the cut is drawn at the top with a mark.
const KVS_CUT = { percentile: 0.95, ratio: 1.5, headroom: 1.1, min: 5 };

/** The axis top for `values`: their largest, or the cut. @param {number[]} values @returns {{cap: number, cut: boolean}} */
function kvsCutScale(values) {
  const max = values.reduce((a, b) => Math.max(a, b), 1e-6); // no spread: thousands of gaps
  if (values.length < KVS_CUT.min) return { cap: max, cut: false };
  const sorted = [...values].sort((a, b) => a - b);
  const p = sorted[Math.floor(KVS_CUT.percentile * (sorted.length - 1))];
  if (!(p > 0) || max <= p * KVS_CUT.ratio) return { cap: max, cut: false };
  return { cap: p * KVS_CUT.headroom, cut: true };
}

// "1 token", "3 tokens": a count with its noun in the right number.
/** @param {number} n @param {string} noun @param {string} [plural] @returns {string} */
function kvsCount(n, noun, plural = `${noun}s`) {
  return `${n} ${Number(n) === 1 ? noun : plural}`;
}

// Tokens often are whitespace or newlines: make them visible in cells.
/** @param {?string|undefined} text @returns {string} */
function kvsTok(text) {
  if (text === null || text === undefined) return "";
  return String(text).replace(/\n/g, "\u21b5").replace(/\t/g, "\u21e5").replace(/ /g, "\u00b7");
}

// The panel root: stable test id, class, and data-step / data-live / data-frozen following
// the model. A frozen panel (a still: its binder stopped following the Session) swallows
// every click and edit before the panel's own handlers see it, and says which step it
// froze at; a panel with a title can be collapsed to it (the dashboard on a laptop).
const KVS_FROZEN_EVENTS = [
  "click",
  "dblclick",
  "mousedown",
  "mouseup",
  "change",
  "input",
  "keydown",
  "submit",
  "contextmenu",
];
/** @param {HTMLElement} el @param {KvsModel} model @param {string} testid @param {string} [extraClass] @returns {HTMLDivElement} */
function kvsRoot(el, model, testid, extraClass = "") {
  const root = kvsEl("div", { class: `kvs-panel ${testid} ${extraClass}`.trim(), "data-testid": testid });
  const badge = kvsEl("span", { class: "kvs-frozen-badge", "data-testid": "kvs-frozen-badge" });
  const frozen = () => !!model.get("frozen");
  const sync = () => {
    root.dataset.step = String(model.get("step"));
    // The step the Dashboard shows (a Pause holds it there: follow.js).
    kvsLinkBus(/** @type {string} */ (model.get("link_group")) || "kvs-default").shown = Number(model.get("step"));
    root.dataset.live = model.get("live") ? "true" : "false";
    root.dataset.frozen = frozen() ? "true" : "false";
    badge.textContent = `frozen at step ${model.get("step")}`;
    badge.title = "a still: this picture no longer follows the session, and clicks on it do nothing";
  };
  sync();
  const heldSync = kvsHeldOr(model, sync);
  for (const k of ["step", "live", "frozen"]) model.on(`change:${k}`, heldSync);
  for (const type of KVS_FROZEN_EVENTS) {
    root.addEventListener(
      type,
      (/** @type {Event} */ e) => {
        if (frozen()) {
          e.stopImmediatePropagation();
          e.preventDefault();
        }
      },
      true,
    );
  }
  el.append(root);
  // Once the panel has drawn its title: the badge and the collapse toggle go in it.
  queueMicrotask(() => {
    const title = [...root.children].find((c) => c.classList.contains("kvs-title"));
    if (!title) {
      root.prepend(badge);
      return;
    }
    const toggle = kvsEl("button", {
      class: "kvs-collapse",
      "data-testid": "kvs-collapse",
      title: "collapse / expand this panel",
      text: "\u25be",
    });
    toggle.addEventListener("click", () => {
      const collapsed = root.classList.toggle("kvs-collapsed");
      toggle.textContent = collapsed ? "\u25b8" : "\u25be";
    });
    title.append(badge, toggle);
  });
  return root;
}

// Sends {action, seq} and resolves when Python acknowledges that seq. Each view has
// its own prefix, so two views of one model never confuse each other's acks. A frozen
// panel sends nothing but hover look-ups (KVS_FROZEN_ACTIONS; widgets/_base.py agrees).
const KVS_FROZEN_ACTIONS = new Set(["block_detail"]);
/**
 * An action for Python: its name and its fields (widgets/_base.py dispatch).
 * @typedef {{action: string, [field: string]: unknown}} KvsAction
 * Python's answer to one action (widgets/_base.py _on_browser_msg): `error` the text of what
 * failed, or null; a frozen panel answers itself, with seq null and `frozen`.
 * @typedef {{type: "ack", seq: string|null, error: string|null, frozen?: boolean}} KvsAck
 * What kvsSender returns.
 * @typedef {{send: (content: KvsAction) => Promise<KvsAck>, pending: () => number, dispose: () => void}} KvsSender
 */
/** @param {KvsModel} model @param {(pending: number) => void} [onPendingChange] @returns {KvsSender} */
function kvsSender(model, onPendingChange = (_pending) => {}) {
  const prefix = Math.random().toString(36).slice(2, 8);
  let n = 0;
  /** @type {Map<string|null, (ack: KvsAck) => void>} */
  const waiting = new Map();
  /** @param {?KvsAck} msg a custom message from Python (only acks are sent) */
  const onMsg = (msg) => {
    if (!msg || msg.type !== "ack" || !waiting.has(msg.seq)) return;
    const resolve = /** @type {(ack: KvsAck) => void} */ (waiting.get(msg.seq));
    waiting.delete(msg.seq);
    onPendingChange(waiting.size);
    resolve(msg);
  };
  model.on("msg:custom", onMsg);
  return {
    send(content) {
      if (model.get("frozen") && !KVS_FROZEN_ACTIONS.has(content.action)) {
        return Promise.resolve({ type: "ack", seq: null, error: null, frozen: true });
      }
      const seq = `${prefix}:${++n}`;
      /** @type {Promise<KvsAck>} */
      const done = new Promise((resolve) => waiting.set(seq, resolve));
      onPendingChange(waiting.size);
      model.send({ ...content, seq });
      return done;
    },
    pending: () => waiting.size,
    dispose: () => model.off("msg:custom", onMsg),
  };
}

// Redraw on the fields a panel's state part sends (KVS_PANELS, generated from the panel's state
// classes in widgets/<panel>.py), and on any further traits named here (step, frozen, ...). While
// the Dashboard is held (kvsHold), a redraw waits, and runs once when the hold is released;
// `whileHeld` redraws at once even then (the Follow panel, which says it is pausing).
/**
 * @param {KvsModel} model @param {readonly string[]} fields @param {() => void} handler
 * @param {string[]} [more] @param {boolean} [whileHeld] @returns {void}
 */
function kvsOnChange(model, fields, handler, more = [], whileHeld = false) {
  const guarded = whileHeld ? handler : kvsHeldOr(model, handler);
  for (const k of [...fields, ...more]) model.on(`change:${k}`, guarded);
}

// ---- holding a Dashboard at the step it shows ---------------------------------------------
// Pause on a live server's Follow panel must act at once, even while the kernel runs a cell (it
// hears the click only when that cell ends, and steps keep arriving from its follow thread). So
// the browser holds every panel of the Dashboard at the step shown at the click: their redraws
// wait; the kernel then shows that step and pauses, and the hold is released (follow.js).
// A step reaches the panels one widget message at a time, so at the click some may still show
// the step before: they go on up to the held step, and only redraws past it wait.
/** @param {KvsModel} model @param {() => void} handler @returns {() => void} */
function kvsHeldOr(model, handler) {
  return () => {
    const bus = kvsLinkBus(/** @type {string} */ (model.get("link_group")) || "kvs-default");
    if (bus.held !== null && Number(model.get("step")) > bus.held) bus.deferred.add(handler);
    else handler();
  };
}
/** @param {KvsModel} model @param {number} step @returns {void} */
function kvsHold(model, step) {
  kvsLinkBus(/** @type {string} */ (model.get("link_group")) || "kvs-default").held = step;
}
/** @param {KvsModel} model @returns {void} */
function kvsRelease(model) {
  const bus = kvsLinkBus(/** @type {string} */ (model.get("link_group")) || "kvs-default");
  bus.held = null;
  const waiting = [...bus.deferred];
  bus.deferred.clear();
  for (const redraw of waiting) redraw();
}

// One redraw for many trait changes: a step's message sets several traits at once, each
// firing its own change event; batching them into a microtask draws once, with all of them.
/** @param {() => void} fn @returns {() => void} */
function kvsBatched(fn) {
  let queued = false;
  return () => {
    if (queued) return;
    queued = true;
    queueMicrotask(() => {
      queued = false;
      fn();
    });
  };
}

// ---- linked highlighting: one channel per Dashboard ---------------------------------------
// The panels of one Dashboard are separate widget views in one page (JupyterLab, Voila, an
// export). They share `link_group` (explorer's SessionBinder sets it) and, through it, a
// channel on `window`: hovering or clicking a slot cell, a block-table entry, a block, a
// queue card or an attention column publishes a focus, and every panel of the group lights
// what matches it. A focus: {source, blocks: [id] | null, requests: [rid] | null,
// tokens: [[rid, position]] | null}. A click pins its focus (click again: unpinned); a
// hover shows over the pinned one. Frozen panels neither publish nor light up.
/** @param {string} group @returns {KvsLinkBus} */
function kvsLinkBus(group) {
  const all = (window.__kvsLinks = window.__kvsLinks || new Map());
  if (!all.has(group))
    all.set(group, { hover: null, pinned: null, listeners: new Set(), held: null, deferred: new Set() });
  return /** @type {KvsLinkBus} */ (all.get(group));
}
/**
 * What kvsLink returns: publish a focus (hover, pin: a second pin of the same focus unpins it),
 * take back this source's hover (leave), read the focus shown now (current).
 * @typedef {{hover: (f: KvsFocus) => void, leave: (source: string) => void, pin: (f: KvsFocus) => void,
 *   current: () => ?KvsFocus, dispose: () => void}} KvsLinkHandle
 */
/** @param {KvsModel} model @param {(f: ?KvsFocus) => void} onFocus @returns {KvsLinkHandle} */
function kvsLink(model, onFocus) {
  // Set by join() below, before anything reads it.
  let bus = /** @type {KvsLinkBus} */ (/** @type {unknown} */ (null));
  const live = () => !model.get("frozen");
  /** @param {?KvsFocus} f */
  const handler = (f) => onFocus(live() ? f : null);
  const current = () => (bus && live() ? bus.hover || bus.pinned : null);
  const notify = () => {
    const f = bus.hover || bus.pinned;
    for (const h of [...bus.listeners]) h(f);
  };
  const join = () => {
    if (bus) bus.listeners.delete(handler);
    bus = kvsLinkBus(model.get("link_group") || "kvs-default");
    bus.listeners.add(handler);
  };
  join();
  const rejoin = () => {
    join();
    handler(bus.hover || bus.pinned);
  };
  model.on("change:link_group", rejoin);
  model.on("change:frozen", rejoin);
  return {
    /** @param {KvsFocus} f */
    hover(f) {
      if (live()) {
        bus.hover = f;
        notify();
      }
    },
    /** @param {string} source */
    leave(source) {
      if (bus.hover && bus.hover.source === source) {
        bus.hover = null;
        notify();
      }
    },
    /** @param {KvsFocus} f */
    pin(f) {
      if (!live()) return;
      const same = bus.pinned && JSON.stringify(bus.pinned) === JSON.stringify(f);
      bus.pinned = same ? null : f;
      bus.hover = null;
      notify();
    },
    current,
    dispose() {
      bus.listeners.delete(handler);
    },
  };
}
// How an element holding `position` of `request`, in physical `block`, matches a focus:
// 0 not at all, 1 lit (same block / request), 2 the very token.
/** @param {?KvsFocus} f @param {number|null} block @param {string|null} request @param {?number} [position] @returns {0|1|2} */
function kvsMatch(f, block, request, position = null) {
  if (!f || (!f.blocks && !f.requests)) return 0;
  if (f.tokens && position !== null && f.tokens.some(([r, p]) => r === request && p === position)) return 2;
  if (f.blocks && (block === null || !f.blocks.includes(block))) return 0;
  if (f.requests && (request === null || !f.requests.includes(request))) return 0;
  return 1;
}
