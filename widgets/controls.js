// Controls panel. Every action goes Python-ward as {action, seq}; Python acks each seq
// after the action ran, so we can show "running" with a pending count and Play can wait
// for a step's result before asking for the next one.

function numOrNull(input) {
  const v = input.value.trim();
  if (v === "") return null;
  const n = Number(v);
  return Number.isFinite(n) ? n : v;  // a non-number goes through: Python names the field
}

function render({ model, el }) {
  const root = kvsRoot(el, model, "kvs-controls");
  const status = kvsEl("span", { class: "kvs-status", "data-testid": "kvs-status" });
  const sender = kvsSender(model, (n) => {
    root.dataset.pending = String(n);
    showStatus();
  });

  // Row 1: stepping.
  const stepBtn = kvsEl("button", { class: "kvs-step-btn", "data-testid": "kvs-step-btn", title: "Run one engine step", text: "Step" });
  const runN = kvsEl("input", { type: "number", min: 1, value: 8, class: "kvs-run-n", "data-testid": "kvs-run-n" });
  const runBtn = kvsEl("button", { class: "kvs-run-btn", "data-testid": "kvs-run-btn", text: "Run N" });
  const playBtn = kvsEl("button", { class: "kvs-play-btn", "data-testid": "kvs-play-btn", text: "\u25b6 Play" });
  const speed = kvsEl("select", { class: "kvs-speed", "data-testid": "kvs-speed", title: "Pause between Play steps" },
    [0, 100, 250, 500, 1000, 2000].map((ms) => kvsEl("option", { value: ms, text: ms === 0 ? "max speed" : `${ms} ms` })));
  speed.value = String(model.get("play_interval_ms"));
  const resetBtn = kvsEl("button", { class: "kvs-reset-btn", "data-testid": "kvs-reset-btn", title: "New engine, history cleared", text: "Reset" });
  root.append(kvsEl("div", { class: "kvs-row" }, [stepBtn, runN, runBtn, playBtn, speed, resetBtn, status]));

  // Row 2: history scrubber.
  const slider = kvsEl("input", { type: "range", min: 0, value: 0, class: "kvs-history-slider", "data-testid": "kvs-history-slider" });
  const sliderLabel = kvsEl("span", { class: "kvs-history-label", "data-testid": "kvs-history-label" });
  const liveBtn = kvsEl("button", { class: "kvs-live-btn", "data-testid": "kvs-live-btn", text: "\u25cf Live" });
  root.append(kvsEl("div", { class: "kvs-row kvs-history" }, [kvsEl("span", { text: "History" }), slider, sliderLabel, liveBtn]));

  // The shown step in words (explorer/captions.py), and a hint that is not an error.
  const caption = kvsEl("div", { class: "kvs-caption", "data-testid": "kvs-caption", "aria-live": "polite" });
  const notice = kvsEl("div", { class: "kvs-notice", "data-testid": "kvs-notice", role: "status" });
  root.append(caption, notice);

  // Error line: the engine's message, shown until dismissed or the next good action.
  const errText = kvsEl("span", { class: "kvs-error-text" });
  const errClose = kvsEl("button", { class: "kvs-error-close", title: "Dismiss", text: "\u00d7" });
  const errLine = kvsEl("div", { class: "kvs-error", "data-testid": "kvs-error", role: "alert" }, [errText, errClose]);
  root.append(errLine);

  // Row 3: add-request form and presets.
  const d = model.get("form_defaults");
  const f = {
    prompt: kvsEl("textarea", { rows: 2, class: "kvs-prompt", "data-testid": "kvs-prompt", placeholder: "prompt" }),
    max_tokens: kvsEl("input", { type: "number", min: 1, class: "kvs-max-tokens", "data-testid": "kvs-max-tokens" }),
    temperature: kvsEl("input", { type: "number", min: 0, step: 0.1, class: "kvs-temperature", "data-testid": "kvs-temperature" }),
    top_k: kvsEl("input", { type: "number", min: 0, class: "kvs-top-k", "data-testid": "kvs-top-k" }),
    top_p: kvsEl("input", { type: "number", min: 0, max: 1, step: 0.05, class: "kvs-top-p", "data-testid": "kvs-top-p" }),
    seed: kvsEl("input", { type: "number", min: 0, class: "kvs-seed", "data-testid": "kvs-seed", placeholder: "none" }),
    ignore_eos: kvsEl("input", { type: "checkbox", class: "kvs-ignore-eos", "data-testid": "kvs-ignore-eos" }),
    chat_template: kvsEl("input", { type: "checkbox", class: "kvs-chat-template", "data-testid": "kvs-chat-template" }),
  };
  f.prompt.value = d.prompt ?? "";
  for (const k of ["max_tokens", "temperature", "top_k", "top_p", "seed"]) f[k].value = d[k] ?? "";
  f.ignore_eos.checked = !!d.ignore_eos;
  const addBtn = kvsEl("button", { class: "kvs-add-btn", "data-testid": "kvs-add-btn", text: "Add request" });
  const labelled = (text, input) => kvsEl("label", {}, [text, input]);
  const burstN = kvsEl("input", { type: "number", min: 1, value: 8, class: "kvs-burst-n", "data-testid": "kvs-burst-n" });
  const presetBtns = model.get("presets").map((p) => kvsEl("button", {
    class: "kvs-preset", "data-testid": `kvs-preset-${p.name}`, title: p.hint || "", text: p.label,
  }));
  const presetRow = kvsEl("div", { class: "kvs-row" }, [kvsEl("span", { class: "kvs-muted", text: "Presets:" }), ...presetBtns, labelled("N ", burstN)]);
  root.append(kvsEl("div", { class: "kvs-add-form", "data-testid": "kvs-add-form" }, [
    f.prompt,
    kvsEl("div", { class: "kvs-row" }, [
      labelled("max_tokens ", f.max_tokens), labelled("temperature ", f.temperature), labelled("top_k ", f.top_k),
      labelled("top_p ", f.top_p), labelled("seed ", f.seed), labelled("ignore_eos ", f.ignore_eos),
      kvsEl("label", { class: "kvs-chat-template-label" }, ["apply chat template ", f.chat_template]),
      addBtn,
    ]),
    presetRow,
  ]));

  // Row 4: scheduler knobs (live) and pool knobs (applied by Reset).
  const b = {
    max_num_batched_tokens: kvsEl("input", { type: "number", min: 1, "data-testid": "kvs-budget-tokens" }),
    max_num_seqs: kvsEl("input", { type: "number", min: 1, "data-testid": "kvs-budget-seqs" }),
    enable_chunked_prefill: kvsEl("input", { type: "checkbox", "data-testid": "kvs-budget-chunked" }),
    enable_prefix_caching: kvsEl("input", { type: "checkbox", "data-testid": "kvs-budget-prefix" }),
    scheduler_reserve_full_isl: kvsEl("input", {
      type: "checkbox", "data-testid": "kvs-budget-full-isl",
      title: "vLLM's scheduler_reserve_full_isl: admit a waiting request only when blocks for its whole "
        + "sequence fit the pool (off: only its first chunk must fit)",
    }),
    scheduling_policy: kvsEl("select", { "data-testid": "kvs-budget-policy" },
      ["unified", "prefill_first"].map((p) => kvsEl("option", { value: p, text: p }))),
  };
  // Scrubbed back, the knobs show the budgets the shown step ran under (read-only).
  const budgetNote = kvsEl("span", { class: "kvs-budget-note kvs-muted", "data-testid": "kvs-budget-note" });
  const pool = {
    num_kv_blocks: kvsEl("input", { type: "number", min: 2, "data-testid": "kvs-pool-blocks", placeholder: "auto" }),
    block_size: kvsEl("input", { type: "number", min: 1, "data-testid": "kvs-pool-block-size" }),
  };
  root.append(kvsEl("div", { class: "kvs-row kvs-budget", "data-testid": "kvs-budget" }, [
    labelled("token budget ", b.max_num_batched_tokens), labelled("max seqs ", b.max_num_seqs),
    labelled("chunked prefill ", b.enable_chunked_prefill), labelled("prefix caching ", b.enable_prefix_caching),
    labelled("reserve whole sequence ", b.scheduler_reserve_full_isl),
    labelled("policy ", b.scheduling_policy), budgetNote,
    kvsEl("span", { class: "kvs-sep" }),
    labelled("KV blocks ", pool.num_kv_blocks), labelled("block size ", pool.block_size),
  ]));

  // ---- state -> DOM ----
  let playing = false;
  let timer = null;
  function showStatus() {
    const n = sender.pending();
    const busy = n > 0 || model.get("busy");
    root.classList.toggle("kvs-running", busy);
    const parts = [];
    if (busy) parts.push(n > 1 ? `running\u2026 (${n - 1} queued)` : "running\u2026");
    parts.push(model.get("info"));
    status.textContent = parts.filter(Boolean).join(" \u00b7 ");
    root.dataset.busy = busy ? "true" : "false";
  }
  function showHistory() {
    const len = model.get("history_len");
    const first = model.get("history_first");
    const idx = model.get("view_index");
    slider.max = String(Math.max(0, len - 1));
    slider.disabled = len === 0;
    if (!slider.matches(":active")) slider.value = String(idx < 0 ? Math.max(0, len - 1) : idx);
    const shown = idx < 0 ? len - 1 : idx;
    sliderLabel.textContent = len === 0 ? "no steps yet" : `step ${first + shown} of ${first + len - 1}`;
    liveBtn.disabled = idx < 0;
    liveBtn.classList.toggle("kvs-on", idx < 0);
  }
  // The input an error is about, outlined until it is edited or the error goes.
  const fieldInputs = { ...f, ...b, ...pool, n: runN };
  function showError() {
    const msg = model.get("error");
    errText.textContent = msg;
    errLine.style.display = msg ? "" : "none";
    if (msg) stopPlay();
    const bad = msg ? model.get("error_field") || "" : "";
    for (const [k, input] of Object.entries(fieldInputs)) {
      const on = k === bad;
      input.classList.toggle("kvs-invalid", on);
      if (on) input.setAttribute("aria-invalid", "true"); else input.removeAttribute("aria-invalid");
    }
  }
  for (const input of Object.values(fieldInputs)) {
    input.addEventListener("input", () => { input.classList.remove("kvs-invalid"); input.removeAttribute("aria-invalid"); });
  }
  function showCaption() {
    const text = model.get("caption") || "";
    const idx = model.get("view_index");
    const step = idx < 0 ? model.get("history_first") + model.get("history_len") - 1 : model.get("history_first") + idx;
    caption.textContent = text && step > 0 ? `step ${step}: ${text}` : text;
    caption.title = caption.textContent;
    const note = model.get("notice") || "";
    notice.textContent = note;
    notice.style.display = note ? "" : "none";
  }
  let chatTouched = false;  // the person's own choice wins over the default
  f.chat_template.addEventListener("change", () => { chatTouched = true; });
  function showChatTemplate() {
    const available = !!model.get("chat_template_available");
    f.chat_template.disabled = !available;
    if (!available) f.chat_template.checked = false;
    else if (!chatTouched) f.chat_template.checked = true;
    f.chat_template.parentElement.title = available
      ? "Wrap the prompt in the model's chat template (one user turn, then the assistant's turn), as a chat app "
        + "does: Instruct models answer best this way"
      : "this model's tokenizer has no chat template: the prompt goes in as typed";
  }
  function showKnobs(force = false) {
    const bud = model.get("budget") || {};
    const idx = model.get("view_index");
    const scrubbed = idx >= 0;
    budgetNote.textContent = scrubbed ? `(step ${model.get("history_first") + idx} ran under these; Live to change them)` : "";
    for (const [k, input] of Object.entries(b)) {
      input.disabled = scrubbed;
      if (!(k in bud) || (input === document.activeElement && force !== true && !scrubbed)) continue;
      if (input.type === "checkbox") input.checked = !!bud[k];
      else input.value = String(bud[k]);
    }
    const pl = model.get("pool") || {};
    for (const [k, input] of Object.entries(pool)) {
      if (input !== document.activeElement) input.value = pl[k] === null || pl[k] === undefined ? "" : String(pl[k]);
    }
  }
  function showPlay() {
    playBtn.textContent = playing ? "\u275a\u275a Pause" : "\u25b6 Play";
    playBtn.classList.toggle("kvs-on", playing);
    root.dataset.playing = playing ? "true" : "false";
  }

  // ---- actions ----
  const act = (content) => sender.send(content).then((ack) => { showStatus(); return ack; });
  function stopPlay() {
    playing = false;
    if (timer) clearTimeout(timer);
    timer = null;
    showPlay();
  }
  function playTick() {
    timer = null;
    if (!playing) return;
    if (!model.get("has_work")) { stopPlay(); return; }
    act({ action: "step", n: 1, source: "play" }).then((ack) => {
      if (ack.error || model.get("error")) { stopPlay(); return; }
      if (playing) timer = setTimeout(playTick, Number(speed.value));
    });
  }
  stepBtn.addEventListener("click", () => act({ action: "step", n: 1 }));
  runBtn.addEventListener("click", () => act({ action: "step", n: Math.max(1, Number(runN.value) || 1) }));
  playBtn.addEventListener("click", () => {
    if (playing) { stopPlay(); return; }
    playing = true;
    showPlay();
    playTick();
  });
  speed.addEventListener("change", () => { model.set("play_interval_ms", Number(speed.value)); model.save_changes(); });
  resetBtn.addEventListener("click", () => {
    stopPlay();
    act({ action: "reset", num_kv_blocks: numOrNull(pool.num_kv_blocks), block_size: numOrNull(pool.block_size) });
  });
  addBtn.addEventListener("click", () => act({
    action: "add", prompt: f.prompt.value, max_tokens: numOrNull(f.max_tokens), temperature: numOrNull(f.temperature),
    top_k: numOrNull(f.top_k), top_p: numOrNull(f.top_p), seed: numOrNull(f.seed), ignore_eos: f.ignore_eos.checked,
    chat_template: f.chat_template.checked && !f.chat_template.disabled,
  }));
  model.get("presets").forEach((p, i) => presetBtns[i].addEventListener("click", () => act({
    action: "preset", name: p.name, n: Math.max(1, Number(burstN.value) || 1),
    max_tokens: numOrNull(f.max_tokens), temperature: numOrNull(f.temperature),
  })));
  for (const [k, input] of Object.entries(b)) {
    // After the answer, show the knobs in force: a rejected value springs back.
    input.addEventListener("change", () => act({
      action: "set_budget",
      [k]: input.type === "checkbox" ? input.checked : input.tagName === "SELECT" ? input.value : numOrNull(input),
    }).then(() => showKnobs(true)));
  }
  errClose.addEventListener("click", () => act({ action: "clear_error" }));
  // Scrubbing: coalesce slider moves so at most one scrub is in flight.
  let scrubInFlight = false;
  let scrubNext = null;
  function scrub(index) {
    if (scrubInFlight) { scrubNext = index; return; }
    scrubInFlight = true;
    act({ action: "scrub", index }).then(() => {
      scrubInFlight = false;
      if (scrubNext !== null) { const i = scrubNext; scrubNext = null; scrub(i); }
    });
  }
  slider.addEventListener("input", () => scrub(Number(slider.value)));
  // Once the slider has focus, the keys move the history, and no key reaches JupyterLab
  // (in command mode its shortcuts would collapse headings, change the active cell, or
  // cut/insert cells). Lab listens on the document in the bubbling phase.
  const SLIDER_KEYS = { ArrowLeft: -1, ArrowDown: -1, ArrowRight: 1, ArrowUp: 1, PageDown: -10, PageUp: 10 };
  slider.addEventListener("keydown", (ev) => {
    const last = Math.max(0, model.get("history_len") - 1);
    const cur = Number(slider.value);
    let next = null;
    if (ev.key in SLIDER_KEYS) next = cur + SLIDER_KEYS[ev.key];
    else if (ev.key === "Home") next = 0;
    else if (ev.key === "End") next = last;
    if (next !== null) {
      ev.preventDefault();
      next = Math.max(0, Math.min(last, next));
      if (next !== cur) { slider.value = String(next); scrub(next); }
    }
    if (ev.key !== "Escape" && ev.key !== "Tab") ev.stopPropagation();
  });
  for (const type of ["keyup", "keypress"]) {
    slider.addEventListener(type, (ev) => { if (ev.key !== "Escape" && ev.key !== "Tab") ev.stopPropagation(); });
  }
  liveBtn.addEventListener("click", () => act({ action: "live" }));

  model.on("change:info", showStatus);
  model.on("change:busy", showStatus);
  model.on("change:history_len", showHistory);
  model.on("change:history_first", showHistory);
  model.on("change:view_index", showHistory);
  model.on("change:error", showError);
  model.on("change:error_field", showError);
  for (const k of ["caption", "notice", "view_index", "history_len", "history_first"]) model.on(`change:${k}`, showCaption);
  model.on("change:chat_template_available", showChatTemplate);
  model.on("change:view_index", () => showKnobs());
  model.on("change:budget", () => showKnobs());
  model.on("change:pool", () => showKnobs());
  model.on("change:play_interval_ms", () => { speed.value = String(model.get("play_interval_ms")); });
  showStatus(); showHistory(); showError(); showKnobs(); showPlay(); showCaption(); showChatTemplate();
  return () => { stopPlay(); sender.dispose(); };
}

export default { render };
