// kvscope shared helpers. Prepended to every panel's ESM by widgets/_base.py, so the
// panels stay plain ES modules that load nothing from the network.

// One colour per request id, the same in every panel. Numeric ids ("0", "1", ...)
// walk the hue circle by the golden angle so neighbours never look alike.
function kvsColor(rid, light = false) {
  if (rid === null || rid === undefined || rid === "") return light ? "#eee" : "#999";
  let n = /^\d+$/.test(String(rid)) ? Number(rid) : 0;
  if (!/^\d+$/.test(String(rid))) {
    for (const ch of String(rid)) n = (n * 31 + ch.charCodeAt(0)) >>> 0;
  }
  const hue = (n * 137.508 + 200) % 360;
  return light ? `hsl(${hue.toFixed(0)}, 70%, 88%)` : `hsl(${hue.toFixed(0)}, 62%, 52%)`;
}

// Bytes traits arrive as DataView (ipywidgets 8), ArrayBuffer or a typed array.
// Copying into a fresh buffer keeps Int32Array/Float32Array aligned.
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

// Small DOM builder: kvsEl("div", {class: "x", "data-testid": "y"}, [children or text]).
function kvsEl(tag, attrs = {}, children = []) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "text") node.textContent = String(v);
    else if (k === "style" && typeof v === "object") Object.assign(node.style, v);
    else if (k.startsWith("on") && typeof v === "function") node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of [].concat(children)) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

// Tokens often are whitespace or newlines: make them visible in cells.
function kvsTok(text) {
  if (text === null || text === undefined) return "";
  return String(text).replace(/\n/g, "\u21b5").replace(/\t/g, "\u21e5").replace(/ /g, "\u00b7");
}

// The panel root: stable test id, class, and data-step following the model.
function kvsRoot(el, model, testid, extraClass = "") {
  const root = kvsEl("div", { class: `kvs-panel ${testid} ${extraClass}`.trim(), "data-testid": testid });
  const sync = () => {
    root.dataset.step = String(model.get("step"));
    root.dataset.live = model.get("live") ? "true" : "false";
  };
  sync();
  model.on("change:step", sync);
  model.on("change:live", sync);
  el.append(root);
  return root;
}

// Sends {action, seq} and resolves when Python acknowledges that seq. Each view has
// its own prefix, so two views of one model never confuse each other's acks.
function kvsSender(model, onPendingChange = () => {}) {
  const prefix = Math.random().toString(36).slice(2, 8);
  let n = 0;
  const waiting = new Map();
  const onMsg = (msg) => {
    if (!msg || msg.type !== "ack" || !waiting.has(msg.seq)) return;
    const resolve = waiting.get(msg.seq);
    waiting.delete(msg.seq);
    onPendingChange(waiting.size);
    resolve(msg);
  };
  model.on("msg:custom", onMsg);
  return {
    send(content) {
      const seq = `${prefix}:${++n}`;
      const done = new Promise((resolve) => waiting.set(seq, resolve));
      onPendingChange(waiting.size);
      model.send({ ...content, seq });
      return done;
    },
    pending: () => waiting.size,
    dispose: () => model.off("msg:custom", onMsg),
  };
}

// One redraw for many trait changes: a step's message sets several traits at once, each
// firing its own change event; batching them into a microtask draws once, with all of them.
function kvsBatched(fn) {
  let queued = false;
  return () => {
    if (queued) return;
    queued = true;
    queueMicrotask(() => { queued = false; fn(); });
  };
}
