// kvscope export host: the panels' own ESM, run over a recorded history, with no kernel.
//
// explorer/export.py inlines this file in a one-file HTML export, next to the history
// (explorer/history.py's packed format: the first snapshot whole, then per step the
// StepRecord and the snapshot's delta) and each panel's ESM and CSS. It stands in for
// anywidget's model (get / set / on / off / send / save_changes) and for the Python side
// of the Dashboard (explorer/dashboard.py's SessionBinder): it turns the scrubbed step's
// record + snapshot into each panel's traits with the same functions as explorer/views.py
// (ported below, checked against Python on every step by tests/explorer/test_export.py),
// answers the panels' actions (scrub, select, block details) from the embedded data, and
// turns engine actions (Step, add request, ...) down with one line on how to run live.
// Nothing is fetched: the page's CSP forbids it, and everything it needs is inline.

const DATA = JSON.parse(document.getElementById("kvs-history").textContent);
const DEFAULTS = JSON.parse(document.getElementById("kvs-panel-defaults").textContent);
const CODES = DATA.codes;            // widgets/block_pool.py's status codes and event bits
const RUN_LIVE = DATA.meta.run_live;  // "make lab" / "python -m explorer app": one line

// ---- 1. the history: the packed steps back to {step, record, snapshot} --------------------
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
function unkeyed(s) {
  const out = { ...s };
  const reqs = out._requests;
  delete out._requests;
  if (reqs) {
    const q = {};
    for (const [name, ids] of Object.entries(out.queues)) q[name] = ids.map((rid) => reqs[rid]);
    out.queues = q;
  }
  return out;
}
function decodeSteps(steps) {
  const entries = [];
  let cur = null;
  for (const item of steps) {
    cur = cur === null || item.snapshot ? item.snapshot : patch(cur, item.delta);
    entries.push({ step: item.step, record: item.record, snapshot: unkeyed(cur) });
  }
  return entries;
}
const ENTRIES = decodeSteps(DATA.steps);

const TOKEN_TEXT = new Map(DATA.token_text.ids.map((id, i) => [id, DATA.token_text.texts[i]]));
const tokenText = (ids) => ids.map((i) => (TOKEN_TEXT.has(Number(i)) ? TOKEN_TEXT.get(Number(i)) : String(i)));

// ---- 2. explorer/views.py, in JavaScript (same names, same results) ------------------------
const EMPTY_RECORD = { step: 0, scheduled: [], batch: {}, sampled: {}, preempted: [], finished: [],
  new_requests: [], blocks: {}, timings_ms: {} };
const PARAM_KEYS = ["temperature", "top_k", "top_p", "max_tokens", "ignore_eos", "seed"];
const get = (obj, key, dflt) => (obj && Object.prototype.hasOwnProperty.call(obj, key) ? obj[key] : dflt);
const nz = (v) => (v === undefined ? null : v);

function allRequests(snapshot) {
  const q = snapshot.queues || {};
  return [...(q.waiting || []), ...(q.running || []), ...(q.finished || [])];
}
function clip(text, limit) {
  const cps = Array.from(text || "");  // Python slices by code point
  if (cps.length <= limit) return cps.join("");
  const tail = Math.floor(limit / 4);
  return cps.slice(0, limit - tail).join("") + " \u2026 " + cps.slice(cps.length - tail).join("");
}
function queuesState(record, snapshot, maxFinished = 50, maxText = 400) {
  record = record || EMPTY_RECORD;
  const scheduled = new Map((record.scheduled || []).map((s) => [s.request_id, s]));
  const sampled = record.sampled || {};
  const row = (req) => {
    const rid = req.request_id;
    const s = scheduled.get(rid);
    return {
      request_id: rid, status: get(req, "status", ""),
      prompt_text: clip(req.prompt_text, maxText), output_text: clip(req.output_text, maxText),
      num_prompt_tokens: (req.prompt_token_ids || []).length, num_output_tokens: (req.output_token_ids || []).length,
      max_tokens: nz(req.max_tokens), num_computed_tokens: get(req, "num_computed_tokens", 0),
      num_cached_tokens: get(req, "num_cached_tokens", 0), num_preemptions: get(req, "num_preemptions", 0),
      finish_reason: nz(req.finish_reason), num_blocks: (req.block_table || []).length,
      scheduled: s === undefined ? null : Object.fromEntries(
        ["num_tokens", "num_computed_before", "is_prefill", "num_cached_tokens", "chunk_index"].map((k) => [k, nz(s[k])])),
      sampled_text: nz((sampled[rid] || {}).text),
    };
  };
  const q = snapshot.queues || {};
  const finished = q.finished || [];
  return {
    queues: { waiting: (q.waiting || []).map(row), running: (q.running || []).map(row),
      finished: finished.slice(Math.max(0, finished.length - maxFinished)).map(row).reverse() },
    finished_total: finished.length,
  };
}
function blockPoolState(record, snapshot) {
  record = record || EMPTY_RECORD;
  const pool = snapshot.block_pool || {};
  const blocks = pool.blocks || [];
  const n = blocks.length;
  const status = new Uint8Array(n), events = new Uint8Array(n), ref = new Uint16Array(n), owner = new Int16Array(n).fill(-1);
  const owners = [];
  const ownerIndex = new Map();
  const shared = [];
  blocks.forEach((b, i) => {
    if (get(b, "is_null", i === 0)) status[i] = CODES.NULL;
    else if (b.is_free) status[i] = b.hash ? CODES.FREE_CACHED : CODES.FREE;
    else status[i] = b.hash ? CODES.IN_USE_HASHED : CODES.IN_USE;
    ref[i] = Math.min(Number(get(b, "ref_count", 0)), 0xffff);
    const idx = [];
    for (const rid of b.owners || []) {
      if (!ownerIndex.has(rid)) { ownerIndex.set(rid, ownerIndex.size); owners.push(rid); }
      idx.push(ownerIndex.get(rid));
    }
    if (idx.length) owner[i] = idx[0];
    if (idx.length > 1) shared.push([i, idx]);
  });
  const recordBlocks = record.blocks || {};
  const counts = {};
  for (const [key, bit] of Object.entries(CODES.EVENT_BITS)) {
    counts[key] = 0;
    for (const bid of recordBlocks[key] || []) {
      if (bid >= 0 && bid < n) { events[bid] |= bit; counts[key] += 1; }
    }
  }
  let free = 0, freeCached = 0, inUse = 0;
  for (const s of status) { if (s === CODES.FREE) free++; else if (s === CODES.FREE_CACHED) freeCached++; if (s >= CODES.IN_USE) inUse++; }
  Object.assign(counts, { free, free_cached: freeCached, in_use: inUse, num_free_blocks: get(pool, "num_free_blocks", 0) });
  const blockSize = Number(get(pool, "block_size", 16));
  const admitted = new Set(record.new_requests || []);
  const hitBlocks = new Map();
  for (const s of record.scheduled || []) {
    if (admitted.has(s.request_id)) hitBlocks.set(s.request_id, Math.floor(get(s, "num_cached_tokens", 0) / blockSize));
  }
  const sameStep = new Set(recordBlocks.same_step_hits || []);
  const tables = [];
  for (const r of (snapshot.queues || {}).running || []) {
    const table = (r.block_table || []).slice();
    if (!table.length) continue;
    const hits = [];
    for (let i = 0; i < Math.min(hitBlocks.get(r.request_id) || 0, table.length); i++) hits.push(i);
    const cached = [];
    for (let i = 0; i < Math.min(Math.floor(Number(r.num_cached_tokens || 0) / blockSize), table.length); i++) cached.push(i);
    tables.push({ request_id: r.request_id, block_table: table, num_computed_tokens: get(r, "num_computed_tokens", 0),
      hits, same_step_hits: hits.filter((i) => sameStep.has(table[i])), cached });
  }
  return { num_blocks: n, block_size: blockSize, status, ref_count: ref, owner, events, owners, shared,
    block_tables: tables, counts, blocks };
}
function cachedBlocks(numCached, table, blockSize, req) {
  const tokens = [...((req || {}).prompt_token_ids || []), ...((req || {}).output_token_ids || [])];
  const out = [];
  for (let i = 0; i < Math.min(Math.floor(Number(numCached || 0) / blockSize), table.length); i++) {
    const lo = i * blockSize, hi = (i + 1) * blockSize;
    out.push({ block: table[i], start: lo, end: hi, text: tokens.length >= hi ? tokenText(tokens.slice(lo, hi)).join("") : "" });
  }
  return out;
}
function slotMappingState(record, blockSize = 16, maxRows = 1024, snapshot = null) {
  record = record || EMPTY_RECORD;
  const batch = record.batch || {};
  const ids = batch.input_ids || [], qsl = batch.query_start_loc || [], seqLens = batch.seq_lens || [];
  const tables = batch.block_tables || [];
  const sampled = record.sampled || {};
  const known = new Map(allRequests(snapshot || {}).map((r) => [r.request_id, r]));
  const segments = (record.scheduled || []).map((s, k) => {
    const start = k < qsl.length ? qsl[k] : 0;
    const end = k + 1 < qsl.length ? qsl[k + 1] : start + s.num_tokens;
    const rid = s.request_id;
    const table = k < tables.length ? tables[k].slice() : [];
    return { request_id: rid, start, end, is_prefill: get(s, "is_prefill", false), chunk_index: nz(s.chunk_index),
      num_computed_before: get(s, "num_computed_before", 0), num_cached_tokens: get(s, "num_cached_tokens", 0),
      seq_len: k < seqLens.length ? seqLens[k] : null, block_table: table,
      sampled_text: nz((sampled[rid] || {}).text),
      cached_blocks: cachedBlocks(get(s, "num_cached_tokens", 0), table, blockSize, known.get(rid)) };
  });
  const shown = ids.slice(0, maxRows);
  return { input_ids: shown, tokens: tokenText(shown), positions: (batch.positions || []).slice(0, maxRows),
    slot_mapping: (batch.slot_mapping || []).slice(0, maxRows), segments, query_start_loc: qsl.slice(),
    logits_indices: (batch.logits_indices || []).slice(), block_size: blockSize, num_rows: ids.length,
    truncated: Math.max(0, ids.length - maxRows) };
}
// A JavaScript object lists integer-like keys first, in numeric order ("2", "10", then
// "r1"), whatever the file says; the export keeps the engine's order of each record's
// sampled requests beside them (`_sampled_order`) where that would differ.
const sampledIds = (record) => record._sampled_order || Object.keys(record.sampled || {});
function samplerState(entries, snapshot, requestId) {
  const record = entries.length ? (entries[entries.length - 1].record || EMPTY_RECORD) : EMPTY_RECORD;
  const requests = sampledIds(record);
  const rid = requestId ? requestId : (requests.length ? requests[0] : "");
  let params = {};
  for (const req of allRequests(snapshot)) {
    if (req.request_id === rid) {
      const sp = req.sampling_params || { max_tokens: nz(req.max_tokens) };
      params = Object.fromEntries(PARAM_KEYS.filter((k) => k in sp).map((k) => [k, sp[k]]));
    }
  }
  for (let i = entries.length - 1; i >= 0; i--) {
    const rec = entries[i].record || EMPTY_RECORD;
    const s = (rec.sampled || {})[rid];
    if (s === undefined) continue;
    const top = (s.top || []).map(([t, p]) => [Number(t), p]);
    const texts = tokenText(top.map(([t]) => t));
    return { requests, request_id: rid, sample: { request_id: rid, step: get(rec, "step", 0), token_id: nz(s.token_id),
      text: nz(s.text), top: top.map(([t, p], k) => [t, texts[k], Number(p)]), params } };
  }
  const note = rid ? `#${rid} has not been sampled yet` : "no request sampled yet";
  return { requests, request_id: rid, sample: { note, params } };
}
function latencyRows(snapshot) {
  const rows = allRequests(snapshot).map((req) => {
    const m = (req.metrics || {}).engine || {};
    return { request_id: req.request_id, time_to_first_token: nz(m.time_to_first_token), inter_token_latency: (m.inter_token_latency || []).slice() };
  });
  const cmp = (a, b) => (a < b ? -1 : a > b ? 1 : 0);
  rows.sort((a, b) => cmp(a.request_id.length, b.request_id.length) || cmp(a.request_id, b.request_id));
  return rows;
}
function probeTargets(snapshot) {
  return ((snapshot.queues || {}).running || []).filter((r) => get(r, "num_computed_tokens", 0) > 0).map((r) => r.request_id);
}
function pyFixed1(x) {
  // Python's f"{x:.1f}" rounds an exact tie to even; toFixed rounds it up. At one decimal
  // the only exact ties are n.25 and n.75.
  if (Number.isInteger(x * 4) && !Number.isInteger(x * 2)) {
    const lo = Math.floor(x * 10) / 10, hi = Math.ceil(x * 10) / 10;
    return (Math.round(lo * 10) % 2 === 0 ? lo : hi).toFixed(1);
  }
  return x.toFixed(1);
}
function summaryLine(record, snapshot) {
  const q = snapshot.queues || {};
  const pool = snapshot.block_pool || {};
  const parts = [`step ${get(snapshot, "step", 0)}`,
    ["waiting", "running", "finished"].map((k) => `${(q[k] || []).length} ${k}`).join(" \u00b7 "),
    `${get(pool, "num_free_blocks", 0)}/${Math.max(0, get(pool, "num_blocks", 1) - 1)} blocks free`];
  const total = record && record.timings_ms ? record.timings_ms.total : undefined;
  if (total !== undefined && total !== null) parts.push(`last step ${pyFixed1(total)} ms`);
  return parts.join(" \u00b7 ");
}
function blockDetail(blocks, blockId, step) {
  if (!(blockId >= 0 && blockId < blocks.length)) return {};
  const b = blocks[blockId];
  const ids = (b.token_ids || []).slice();
  return { block_id: blockId, ref_count: get(b, "ref_count", 0), hash: nz(b.hash), owners: (b.owners || []).slice(),
    token_ids: ids, tokens: ids.length ? tokenText(ids) : [], is_null: !!get(b, "is_null", blockId === 0),
    is_free: !!get(b, "is_free", false), step };
}
// For tests and the curious: every view state of history index i, as explorer/views.py builds it.
function viewStates(i) {
  const e = ENTRIES[i];
  const record = e.record || EMPTY_RECORD, snapshot = e.snapshot || {};
  const bs = Number(get(snapshot.block_pool || {}, "block_size", 16));
  const pool = blockPoolState(record, snapshot);
  return { queues: queuesState(record, snapshot), blocks: pool, slots: slotMappingState(record, bs, 1024, snapshot),
    sampler: samplerState(ENTRIES.slice(0, i + 1), snapshot, ""), latency: latencyRows(snapshot),
    summary: summaryLine(record, snapshot), targets: probeTargets(snapshot) };
}

// ---- 3. anywidget's model, over plain values ----------------------------------------------
function decodeDefault(v) {
  if (v && typeof v === "object" && v.__b64__ !== undefined) {
    const bin = atob(v.__b64__);
    const u = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) u[i] = bin.charCodeAt(i);
    return new DataView(u.buffer);
  }
  return v;
}
function makeModel(name) {
  const values = {};
  for (const [k, v] of Object.entries(DEFAULTS[name] || {})) values[k] = decodeDefault(v);
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

// ---- 4. the Dashboard's binder, for a recording ------------------------------------------
const ENGINE_ACTIONS = new Set(["step", "add", "preset", "set_budget", "reset", "abort"]);
const ENGINE_OFF = `This page is a recording: the engine is not running here. To step it live: ${RUN_LIVE}.`;
const ATTENTION_OFF = `Attention weights are read from the live KV cache, and a recording keeps no KV. To see them: ${RUN_LIVE}.`;

const HOST = {
  models: {},
  viewIndex: ENTRIES.length - 1,
  samplerPinned: false,
  blocks: [],          // the shown snapshot's blocks, for hover details
  timelineSet: false,

  render() {
    const i = this.viewIndex;
    const e = ENTRIES[i];
    const record = e.record || EMPTY_RECORD, snapshot = e.snapshot || {};
    const step = Number(e.step || snapshot.step || 0);
    const live = i === ENTRIES.length - 1;
    const m = this.models;
    for (const model of Object.values(m)) model.update({ step, live });
    if (m.controls) {
      const engineName = (snapshot.model_info || {}).engine || "kvscope";  // as the live binder says it
      let info = `${engineName} \u00b7 ${summaryLine(record, snapshot)}`;
      const metrics = snapshot.metrics || {};
      if (metrics.prefix_cache_queries) info += ` \u00b7 prefix hits ${metrics.prefix_cache_hits || 0}/${metrics.prefix_cache_queries}`;
      // The budgets the shown step ran under, and the step in words (the timeline carries both).
      const config = { ...(snapshot.config || {}), ...(record.budgets || {}) };
      const tl = (DATA.timeline || {}).steps || {};
      const at = (tl.step || []).indexOf(step);
      m.controls.update({ history_len: ENTRIES.length, history_first: Number(ENTRIES[0].step), view_index: live ? -1 : i,
        has_work: false, info, engine: engineName, caption: at >= 0 && tl.caption ? String(tl.caption[at]) : "",
        budget: Object.fromEntries(DATA.meta.budget_keys.filter((k) => k in config).map((k) => [k, config[k]])),
        pool: Object.fromEntries(["num_kv_blocks", "block_size"].filter((k) => k in config).map((k) => [k, config[k]])) });
    }
    if (m.queues) m.queues.update(queuesState(record, snapshot));
    if (m.blocks) {
      const state = blockPoolState(record, snapshot);
      this.blocks = state.blocks;
      delete state.blocks;
      const sel = m.blocks.get("selected");
      if (sel >= 0) state.detail = blockDetail(this.blocks, sel, step);
      m.blocks.update(state);
    }
    if (m.slots) m.slots.update(slotMappingState(record, Number(get(snapshot.block_pool || {}, "block_size", 16)), 1024, snapshot));
    if (m.sampler) {
      const rid = this.samplerPinned ? m.sampler.get("request_id") : "";
      m.sampler.update(samplerState(ENTRIES.slice(0, i + 1), snapshot, rid));
    }
    if (m.timeline && !this.timelineSet) { m.timeline.update(DATA.timeline); this.timelineSet = true; }
    if (m.attention) {
      const info = snapshot.model_info || {};
      const heads = Number(info.num_heads || 0), kv = Number(info.num_kv_heads || 0);
      const state = { requests: probeTargets(snapshot), num_layers: Number(info.num_layers || 0), message: ATTENTION_OFF };
      if (heads && kv && m.attention.get("num_heads") !== heads) {
        state.num_heads = heads;
        state.kv_head_of_head = Array.from({ length: heads }, (_, h) => Math.floor(h / Math.floor(heads / kv)));
      }
      m.attention.update(state);
    }
    drawLatency(latencyRows(snapshot), step, live);
    drawCaption(step);
  },

  scrub(index) {
    const n = ENTRIES.length;
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
      const shown = Number(m.blocks.get("step"));
      if (action === "select_block") m.blocks.update({ selected: id });
      m.blocks.update({ detail: blockDetail(this.blocks, id, shown) });
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
      const k = ENTRIES.findIndex((e) => Number(e.step) === Number(c.step));
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

// ---- 5. TTFT / ITL: small SVG charts (plotly's FigureWidget needs a kernel) ---------------
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

// ---- 6. captions and page --------------------------------------------------------------
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
  const start = DATA.meta.start === "first" ? 0 : ENTRIES.length - 1;
  HOST.scrub(start);
  document.body.dataset.ready = "true";
}

window.kvsExport = { entries: ENTRIES, viewStates, host: HOST, patch };
main().catch((exc) => {
  console.error(exc);
  const box = document.getElementById("kvs-export-error");
  box.textContent = `kvscope export failed to start: ${exc && exc.message ? exc.message : exc}`;
  box.style.display = "";
});
