// @ts-check
// Controls panel. Every action goes Python-ward as {action, seq}; Python acks each seq
// after the action ran, so we can show "running" with a pending count and Play can wait
// for a step's result before asking for the next one.
//
// One compact bar (Step, Run N, Play, Reset, the history) stays in view; the add-request
// form, the presets and the knobs live in a drawer under it, open on a tall screen and
// folded on a laptop's (1366x768), so the queues, pool and slot mapping start above the fold.

const RUN_N_DEFAULT = 8,
  BURST_DEFAULT = 8;
const PLAY_INTERVALS_MS = [0, 100, 250, 500, 1000, 2000];
const DRAWER_OPEN_MIN_HEIGHT = 900; // px of window height from which the drawer starts open
const LIVE = -1; // view_index while the panels follow the engine
// The form's fields Python must not fill in by itself: empty is an error naming the field.
const REQUIRED_FIELDS = ["max_tokens", "temperature", "top_k", "top_p"];
const POLICIES = ["unified", "prefill_first"];
// Keys on the history slider (the rest of the page, JupyterLab included, never sees them).
/** @type {{[key: string]: number}} */
const SLIDER_KEYS = { ArrowLeft: -1, ArrowDown: -1, ArrowRight: 1, ArrowUp: 1, PageDown: -10, PageUp: 10 };
const APPLY_TEXT = "Apply (rebuilds the engine)";

/** @typedef {{[name: string]: HTMLInputElement|HTMLTextAreaElement|HTMLSelectElement}} Inputs */
/** @typedef {KvsModelOf<KvsPanelStates["controls"]>} ControlsModel  the panel's model, its parts' fields typed */
/**
 * The panel's parts (buildBar, buildConfirm, buildForm, buildKnobs), the state -> DOM functions
 * (makeViews, makeKnobViews, wireActions, render) and what goes Python-ward (act: an action, acked):
 * @typedef {Inputs & {prompt: HTMLTextAreaElement, ignore_eos: HTMLInputElement, chat_template: HTMLInputElement}} FormInputs
 * @typedef {{el: HTMLElement, text: HTMLElement, save: HTMLButtonElement, discard: HTMLButtonElement,
 *   cancel: HTMLButtonElement}} Confirm
 * @typedef {{status: HTMLElement, engine: HTMLElement, stepBtn: HTMLButtonElement, runN: HTMLInputElement,
 *   runBtn: HTMLButtonElement, playBtn: HTMLButtonElement, speed: HTMLSelectElement, resetBtn: HTMLButtonElement,
 *   drawerBtn: HTMLButtonElement, slider: HTMLInputElement, sliderLabel: HTMLElement, liveBtn: HTMLButtonElement,
 *   caption: HTMLElement, notice: HTMLElement, errText: HTMLElement, errClose: HTMLButtonElement, confirm: Confirm,
 *   scrubTarget: (number|null), errLine: HTMLElement, rows: HTMLElement[]}} Ui
 * @typedef {{f: FormInputs, addBtn: HTMLButtonElement, burstN: HTMLInputElement, presetBtns: HTMLButtonElement[],
 *   el: HTMLElement}} Form
 * @typedef {{b: Record<keyof KvsControlsBudget, HTMLInputElement|HTMLSelectElement>,
 *   pool: Record<keyof KvsControlsPool, HTMLInputElement>, budgetNote: HTMLElement, applyBtn: HTMLButtonElement,
 *   poolNote: HTMLElement, scope: HTMLElement, poolRow: HTMLElement, el: HTMLElement}} Knobs
 * @typedef {{status: () => void, history: () => void, error: () => void, caption: () => void,
 *   chatTemplate: () => void, knobs: (force?: boolean) => void, poolDirty: () => void, play: () => void,
 *   stopPlay: () => void, setDrawer: (open: boolean) => void, readOnly: () => void}} Views
 * @typedef {{name: string, label: string, hint?: string}} Preset  one of the `presets` trait (widgets/controls.py)
 * @typedef {{type: string, seq: (string|null), error: (string|null), frozen?: boolean}} Ack
 * @typedef {(content: {action: string, [key: string]: unknown}) => Promise<Ack>} Act
 */

/** @param {Inputs[string]} input */

function numOrNull(input) {
  const v = input.value.trim();
  if (v === "") return null;
  const n = Number(v);
  return Number.isFinite(n) ? n : v; // a non-number goes through: Python names the field
}
// A required field: empty goes to Python as "" so its error names the field.
/** @param {Inputs[string]} input */
function numOrEmpty(input) {
  const v = numOrNull(input);
  return v === null ? "" : v;
}
/** @param {string} text @param {HTMLElement} input @param {{[name: string]: string}} [attrs] */
const labelled = (text, input, attrs = {}) => kvsEl("label", attrs, [text, input]);
/** Object.entries of the knobs' inputs, keyed by the knob (the state's field) each edits: a Record's keys are K.
 * @template {string} K @template V @param {Record<K, V>} inputs @returns {[K, V][]} */
const knobEntries = (inputs) => /** @type {[K, V][]} */ (Object.entries(inputs));

/** Row 1 and 2: stepping, and the history scrubber. @param {ControlsModel} model @returns {Ui} */
function buildBar(model) {
  const ui = /** @type {Ui} */ ({
    status: kvsEl("span", { class: "kvs-status", "data-testid": "kvs-status" }),
    engine: kvsEl("span", { class: "kvs-engine-badge", "data-testid": "kvs-engine-badge" }),
    stepBtn: kvsEl("button", {
      class: "kvs-step-btn",
      "data-testid": "kvs-step-btn",
      title: "Run one engine step",
      text: "Step",
    }),
    runN: kvsEl("input", {
      type: "number",
      min: 1,
      value: RUN_N_DEFAULT,
      class: "kvs-run-n",
      "data-testid": "kvs-run-n",
    }),
    runBtn: kvsEl("button", { class: "kvs-run-btn", "data-testid": "kvs-run-btn", text: "Run N" }),
    playBtn: kvsEl("button", { class: "kvs-play-btn", "data-testid": "kvs-play-btn", text: "\u25b6 Play" }),
    speed: kvsEl(
      "select",
      { class: "kvs-speed", "data-testid": "kvs-speed", title: "Pause between Play steps" },
      PLAY_INTERVALS_MS.map((ms) => kvsEl("option", { value: ms, text: ms === 0 ? "max speed" : `${ms} ms` })),
    ),
    resetBtn: kvsEl("button", {
      class: "kvs-reset-btn",
      "data-testid": "kvs-reset-btn",
      title: "A new engine with the pool knobs below; the history is cleared",
      text: "Reset",
    }),
    drawerBtn: kvsEl("button", {
      class: "kvs-drawer-btn",
      "data-testid": "kvs-drawer-toggle",
      "aria-expanded": "false",
      title: "the add-request form, presets, token budget and pool knobs",
    }),
    slider: kvsEl("input", {
      type: "range",
      min: 0,
      value: 0,
      class: "kvs-history-slider",
      "data-testid": "kvs-history-slider",
    }),
    sliderLabel: kvsEl("span", { class: "kvs-history-label", "data-testid": "kvs-history-label" }),
    liveBtn: kvsEl("button", { class: "kvs-live-btn", "data-testid": "kvs-live-btn", text: "\u25cf Live" }),
    caption: kvsEl("div", { class: "kvs-caption", "data-testid": "kvs-caption", "aria-live": "polite" }),
    notice: kvsEl("div", { class: "kvs-notice", "data-testid": "kvs-notice", role: "status" }),
    errText: kvsEl("span", { class: "kvs-error-text" }),
    errClose: kvsEl("button", { class: "kvs-error-close", title: "Dismiss", text: "\u00d7" }),
    confirm: buildConfirm(),
  });
  ui.speed.value = String(model.get("play_interval_ms"));
  ui.scrubTarget = null; // the history index keyed or dragged to, until its scrub is answered
  ui.errLine = kvsEl("div", { class: "kvs-error", "data-testid": "kvs-error", role: "alert" }, [
    ui.errText,
    ui.errClose,
  ]);
  ui.rows = [
    kvsEl("div", { class: "kvs-row" }, [
      ui.engine,
      ui.stepBtn,
      ui.runN,
      ui.runBtn,
      ui.playBtn,
      ui.speed,
      ui.resetBtn,
      ui.drawerBtn,
      ui.status,
    ]),
    kvsEl("div", { class: "kvs-row kvs-history" }, [
      kvsEl("span", { text: "History" }),
      ui.slider,
      ui.sliderLabel,
      ui.liveBtn,
    ]),
    ui.caption,
    ui.notice,
    ui.errLine,
    ui.confirm.el,
  ];
  return ui;
}

/** What a rebuild asks before it throws a run away: it names what goes, offers to save the run
 * as one HTML file first (explorer/export), and does nothing until one of its buttons is pressed.
 * @returns {Confirm} */
function buildConfirm() {
  const text = kvsEl("span", { class: "kvs-confirm-text", "data-testid": "kvs-rebuild-text" });
  const save = kvsEl("button", {
    class: "kvs-rebuild-save",
    "data-testid": "kvs-rebuild-save",
    text: "Save this run as HTML, then rebuild",
    title:
      "writes the whole history to one HTML file next to the notebook (scrubbing, hovering and the charts work offline), then builds the new engine",
  });
  const discard = kvsEl("button", {
    class: "kvs-rebuild-discard",
    "data-testid": "kvs-rebuild-discard",
    text: "Rebuild, discard the run",
  });
  const cancel = kvsEl("button", { class: "kvs-rebuild-cancel", "data-testid": "kvs-rebuild-cancel", text: "Cancel" });
  const el = kvsEl(
    "div",
    { class: "kvs-confirm", "data-testid": "kvs-rebuild-confirm", role: "alertdialog", hidden: true },
    [text, kvsEl("span", { class: "kvs-confirm-buttons" }, [save, discard, cancel])],
  );
  return { el, text, save, discard, cancel };
}

/** "3 steps and 2 requests, 1 of them unfinished": what a new engine would discard; "" when nothing
 * (explorer/ui/views.py run_words says it the same way).
 * @param {{steps?: number, requests?: number, unfinished?: number}} run the `run_summary` trait ({}: none) */
function runWords(run) {
  const steps = Number(run.steps) || 0,
    requests = Number(run.requests) || 0,
    open = Number(run.unfinished) || 0;
  const parts = [];
  if (steps) parts.push(kvsCount(steps, "step"));
  if (requests) parts.push(kvsCount(requests, "request") + (open ? `, ${open} of them unfinished` : ""));
  return parts.join(" and ");
}

/** The drawer's add-request form and presets. @param {ControlsModel} model @returns {Form} */
function buildForm(model) {
  const d = model.get("form_defaults");
  /** @type {FormInputs} */
  const f = {
    prompt: kvsEl("textarea", { rows: 2, class: "kvs-prompt", "data-testid": "kvs-prompt", placeholder: "prompt" }),
    max_tokens: kvsEl("input", { type: "number", min: 1, class: "kvs-max-tokens", "data-testid": "kvs-max-tokens" }),
    temperature: kvsEl("input", {
      type: "number",
      min: 0,
      step: 0.1,
      class: "kvs-temperature",
      "data-testid": "kvs-temperature",
    }),
    top_k: kvsEl("input", { type: "number", min: 0, class: "kvs-top-k", "data-testid": "kvs-top-k" }),
    top_p: kvsEl("input", {
      type: "number",
      min: 0,
      max: 1,
      step: 0.05,
      class: "kvs-top-p",
      "data-testid": "kvs-top-p",
    }),
    seed: kvsEl("input", { type: "number", min: 0, class: "kvs-seed", "data-testid": "kvs-seed", placeholder: "none" }),
    ignore_eos: kvsEl("input", { type: "checkbox", class: "kvs-ignore-eos", "data-testid": "kvs-ignore-eos" }),
    chat_template: kvsEl("input", { type: "checkbox", class: "kvs-chat-template", "data-testid": "kvs-chat-template" }),
  };
  f.prompt.value = d.prompt ?? "";
  for (const k of ["max_tokens", "temperature", "top_k", "top_p", "seed"]) f[k].value = d[k] ?? "";
  /** @type {HTMLInputElement} */ (f.ignore_eos).checked = !!d.ignore_eos;
  const addBtn = kvsEl("button", { class: "kvs-add-btn", "data-testid": "kvs-add-btn", text: "Add request" });
  const burstN = kvsEl("input", {
    type: "number",
    min: 1,
    value: BURST_DEFAULT,
    class: "kvs-burst-n",
    "data-testid": "kvs-burst-n",
  });
  const presetBtns = model.get("presets").map((/** @type {Preset} */ p) =>
    kvsEl("button", {
      class: "kvs-preset",
      "data-testid": `kvs-preset-${p.name}`,
      title: p.hint || "",
      text: p.label,
    }),
  );
  const el = kvsEl("div", { class: "kvs-add-form", "data-testid": "kvs-add-form" }, [
    f.prompt,
    kvsEl("div", { class: "kvs-row" }, [
      labelled("max_tokens ", f.max_tokens),
      labelled("temperature ", f.temperature),
      labelled("top_k ", f.top_k),
      labelled("top_p ", f.top_p),
      labelled("seed ", f.seed),
      labelled("ignore_eos ", f.ignore_eos),
      labelled("apply chat template ", f.chat_template, { class: "kvs-chat-template-label" }),
      addBtn,
    ]),
    kvsEl("div", { class: "kvs-row" }, [
      kvsEl("span", { class: "kvs-muted", text: "Presets (they add requests, and may step):" }),
      ...presetBtns,
      labelled("N ", burstN),
    ]),
  ]);
  return { f, addBtn, burstN, presetBtns, el };
}

/** The drawer's knobs: the scheduler's (live) and the pool's (applied by rebuilding the engine). @returns {Knobs} */
function buildKnobs() {
  /** @type {Knobs["b"]} */
  const b = {
    max_num_batched_tokens: kvsEl("input", { type: "number", min: 1, "data-testid": "kvs-budget-tokens" }),
    max_num_seqs: kvsEl("input", { type: "number", min: 1, "data-testid": "kvs-budget-seqs" }),
    enable_chunked_prefill: kvsEl("input", { type: "checkbox", "data-testid": "kvs-budget-chunked" }),
    enable_prefix_caching: kvsEl("input", { type: "checkbox", "data-testid": "kvs-budget-prefix" }),
    scheduler_reserve_full_isl: kvsEl("input", {
      type: "checkbox",
      "data-testid": "kvs-budget-full-isl",
      title:
        "vLLM's scheduler_reserve_full_isl: admit a waiting request only when blocks for its whole " +
        "sequence fit the pool (off: only its first chunk must fit)",
    }),
    scheduling_policy: kvsEl(
      "select",
      { "data-testid": "kvs-budget-policy" },
      POLICIES.map((p) => kvsEl("option", { value: p, text: p })),
    ),
  };
  /** @type {Knobs["pool"]} */
  const pool = {
    num_kv_blocks: kvsEl("input", { type: "number", min: 2, "data-testid": "kvs-pool-blocks", placeholder: "auto" }),
    block_size: kvsEl("input", { type: "number", min: 1, "data-testid": "kvs-pool-block-size" }),
  };
  // Scrubbed back, the knobs show the budgets the shown step ran under (read-only).
  const budgetNote = kvsEl("span", { class: "kvs-budget-note kvs-muted", "data-testid": "kvs-budget-note" });
  const applyBtn = kvsEl("button", {
    class: "kvs-pool-apply",
    "data-testid": "kvs-pool-apply",
    text: APPLY_TEXT,
    title:
      "Build a new engine with this pool (same model): asks first, and offers to save the run, since the history and every request start again",
  });
  const poolNote = kvsEl("span", { class: "kvs-pool-note", "data-testid": "kvs-pool-note" });
  const scope = kvsEl("span", { class: "kvs-muted", "data-testid": "kvs-budget-scope" });
  const poolRow = kvsEl("div", { class: "kvs-row kvs-pool", "data-testid": "kvs-pool" }, [
    kvsEl("span", { class: "kvs-muted", text: "Pool (new engine):" }),
    labelled("KV blocks ", pool.num_kv_blocks),
    labelled("block size ", pool.block_size),
    applyBtn,
    poolNote,
  ]);
  const el = kvsEl("div", { class: "kvs-knobs" }, [
    kvsEl("div", { class: "kvs-row kvs-budget", "data-testid": "kvs-budget" }, [
      scope,
      labelled("token budget ", b.max_num_batched_tokens),
      labelled("max seqs ", b.max_num_seqs),
      labelled("chunked prefill ", b.enable_chunked_prefill),
      labelled("prefix caching ", b.enable_prefix_caching),
      labelled("reserve whole sequence ", b.scheduler_reserve_full_isl),
      labelled("policy ", b.scheduling_policy),
      budgetNote,
    ]),
    poolRow,
  ]);
  return { b, pool, budgetNote, applyBtn, poolNote, scope, poolRow, el };
}

/**
 * State -> DOM: one function per part of the panel.
 * @param {ControlsModel} model @param {HTMLElement} root @param {Ui} ui @param {Form} form @param {Knobs} knobs
 * @param {ReturnType<typeof kvsSender>} sender @param {HTMLElement} drawer @returns {Views} the rest filled in later
 */
function makeViews(model, root, ui, form, knobs, sender, drawer) {
  const views = /** @type {Views} */ ({});
  views.status = () => {
    const n = sender.pending();
    const busy = n > 0 || model.get("busy");
    root.classList.toggle("kvs-running", busy);
    const parts = [];
    if (busy) parts.push(n > 1 ? `running\u2026 (${n - 1} queued)` : "running\u2026");
    const engine = model.get("engine") || "";
    const info = model.get("info") || "";
    parts.push(engine && info.startsWith(`${engine} \u00b7 `) ? info.slice(engine.length + 3) : info); // the badge names it
    ui.status.textContent = parts.filter(Boolean).join(" \u00b7 ");
    ui.status.title = ui.status.textContent;
    root.dataset.busy = busy ? "true" : "false";
    ui.engine.textContent = engine;
    ui.engine.style.display = engine ? "" : "none";
    ui.engine.dataset.engine = /vllm/i.test(engine) ? "vllm" : "kvscope";
    ui.engine.title = /vllm/i.test(engine)
      ? `the panels show vLLM's own scheduler and block pool (${engine})`
      : `the panels show kvscope's engine (${engine})`;
  };
  views.history = () => {
    const len = model.get("history_len"),
      first = model.get("history_first"),
      idx = model.get("view_index");
    ui.slider.max = String(Math.max(0, len - 1));
    ui.slider.disabled = len === 0;
    // Not while the person drags it or keyed scrubs are still on their way: an ack of an earlier
    // scrub would put the thumb back, and the next key would move from there (presses lost).
    if (!ui.slider.matches(":active") && ui.scrubTarget === null)
      ui.slider.value = String(idx === LIVE ? Math.max(0, len - 1) : idx);
    const shown = idx === LIVE ? len - 1 : idx,
      dropped = model.get("history_dropped") || 0;
    // A bounded history (a live server's) keeps its latest steps: the slider starts at the first kept.
    ui.sliderLabel.textContent =
      len === 0
        ? "no steps yet"
        : `step ${first + shown} of ${first + len - 1}` +
          (dropped ? ` \u00b7 kept from step ${first} (${dropped} earlier dropped)` : "");
    ui.sliderLabel.dataset.first = String(first);
    ui.sliderLabel.dataset.dropped = String(dropped);
    ui.slider.title = dropped
      ? `the history keeps its latest steps: it starts at step ${first}; ${dropped} earlier steps were dropped`
      : "";
    ui.liveBtn.disabled = idx === LIVE;
    ui.liveBtn.classList.toggle("kvs-on", idx === LIVE);
  };
  // The input an error is about, outlined until it is edited or the error goes; the drawer
  // opens when that input is in it.
  const fieldInputs = { ...form.f, ...knobs.b, ...knobs.pool, n: ui.runN };
  views.error = () => {
    const msg = model.get("error");
    ui.errText.textContent = msg;
    ui.errLine.style.display = msg ? "" : "none";
    if (msg) views.stopPlay();
    const bad = msg ? model.get("error_field") || "" : "";
    for (const [k, input] of Object.entries(fieldInputs)) {
      const on = k === bad;
      input.classList.toggle("kvs-invalid", on);
      if (on) input.setAttribute("aria-invalid", "true");
      else input.removeAttribute("aria-invalid");
      if (on && drawer.contains(input)) views.setDrawer(true);
    }
  };
  for (const input of Object.values(fieldInputs)) {
    input.addEventListener("input", () => {
      input.classList.remove("kvs-invalid");
      input.removeAttribute("aria-invalid");
    });
  }
  views.caption = () => {
    const text = model.get("caption") || "";
    const idx = model.get("view_index");
    const step =
      idx === LIVE ? model.get("history_first") + model.get("history_len") - 1 : model.get("history_first") + idx;
    ui.caption.textContent = text && step > 0 ? `step ${step}: ${text}` : text;
    ui.caption.title = ui.caption.textContent;
    const note = model.get("notice") || "";
    ui.notice.textContent = note;
    ui.notice.style.display = note ? "" : "none";
  };
  return views;
}

/**
 * The knobs and the chat-template switch follow the model (more state -> DOM).
 * @param {ControlsModel} model @param {Form} form @param {Knobs} knobs @param {Views} views
 */
function makeKnobViews(model, form, knobs, views) {
  let chatTouched = false; // the person's own choice wins over the default
  form.f.chat_template.addEventListener("change", () => {
    chatTouched = true;
  });
  views.chatTemplate = () => {
    const available = !!model.get("chat_template_available");
    const box = form.f.chat_template;
    box.disabled = !available;
    if (!available) box.checked = false;
    else if (!chatTouched) box.checked = true;
    /** @type {HTMLElement} */ (box.parentElement).title = available
      ? "Wrap the prompt in the model's chat template (one user turn, then the assistant's turn), as a chat app " +
        "does: Instruct models answer best this way. The presets follow this switch too."
      : "this model's tokenizer has no chat template: the prompt goes in as typed";
  };
  views.knobs = (force = false) => {
    const bud = model.get("budget") || {};
    const idx = model.get("view_index");
    const scrubbed = idx !== LIVE;
    const watching = !!model.get("read_only"); // a live server's budgets: its command line's
    knobs.scope.textContent = watching ? "Server's budgets (read-only):" : "Scheduler (live):";
    knobs.scope.title = watching ? model.get("read_only") : "applied from the next step on";
    knobs.budgetNote.textContent = scrubbed
      ? `(step ${model.get("history_first") + idx} ran under these${watching ? "" : "; Live to change them"})`
      : "";
    for (const [k, input] of knobEntries(knobs.b)) {
      input.disabled = scrubbed || watching;
      if (!(k in bud) || (input === document.activeElement && force !== true && !scrubbed)) continue;
      if (input.type === "checkbox") /** @type {HTMLInputElement} */ (input).checked = !!bud[k];
      else input.value = String(bud[k]);
    }
    const pl = model.get("pool") || {};
    for (const [k, input] of knobEntries(knobs.pool)) {
      if (input !== document.activeElement || force === true)
        input.value = pl[k] === null || pl[k] === undefined ? "" : String(pl[k]);
    }
    views.poolDirty();
  };
  // A pool knob typed but not applied says so: it takes a new engine.
  views.poolDirty = () => {
    const pl = model.get("pool") || {};
    const dirty = knobEntries(knobs.pool).some(
      ([k, input]) => input.value.trim() !== (pl[k] === null || pl[k] === undefined ? "" : String(pl[k])),
    );
    knobs.applyBtn.classList.toggle("kvs-pending", dirty);
    knobs.poolNote.textContent = dirty
      ? "not applied yet: Apply builds a new engine (same model); it asks before it clears the history"
      : "";
  };
  for (const input of Object.values(knobs.pool)) input.addEventListener("input", views.poolDirty);
}

/**
 * Clicks and edits -> actions (Play is a browser timer paced by the acks).
 * @param {ControlsModel} model @param {Ui} ui @param {Form} form @param {Knobs} knobs @param {Views} views @param {Act} act
 */
function wireActions(model, ui, form, knobs, views, act) {
  let playing = false,
    timer = /** @type {ReturnType<typeof setTimeout> | null} */ (null);
  views.play = () => {
    ui.playBtn.textContent = playing ? "\u275a\u275a Pause" : "\u25b6 Play";
    ui.playBtn.classList.toggle("kvs-on", playing);
    /** @type {HTMLElement} */ (ui.playBtn.closest(".kvs-controls")).dataset.playing = playing ? "true" : "false";
  };
  views.stopPlay = () => {
    playing = false;
    if (timer) clearTimeout(timer);
    timer = null;
    views.play();
  };
  function playTick() {
    timer = null;
    if (!playing) return;
    if (!model.get("has_work")) {
      views.stopPlay();
      return;
    }
    act({ action: "step", n: 1, source: "play" }).then((ack) => {
      if (ack.error || model.get("error")) {
        views.stopPlay();
        return;
      }
      if (playing) timer = setTimeout(playTick, Number(ui.speed.value));
    });
  }
  ui.stepBtn.addEventListener("click", () => act({ action: "step", n: 1 }));
  ui.runBtn.addEventListener("click", () => act({ action: "step", n: Math.max(1, Number(ui.runN.value) || 1) }));
  ui.playBtn.addEventListener("click", () => {
    if (playing) {
      views.stopPlay();
      return;
    }
    playing = true;
    views.play();
    playTick();
  });
  ui.speed.addEventListener("change", () => {
    model.set("play_interval_ms", Number(ui.speed.value));
    model.save_changes();
  });
  wireRebuild(model, ui, knobs, views, act);
  const f = form.f;
  const required = () => Object.fromEntries(REQUIRED_FIELDS.map((k) => [k, numOrEmpty(f[k])]));
  form.addBtn.addEventListener("click", () =>
    act({
      action: "add",
      prompt: f.prompt.value,
      ...required(),
      seed: numOrNull(f.seed),
      ignore_eos: f.ignore_eos.checked,
      chat_template: f.chat_template.checked && !f.chat_template.disabled,
    }),
  );
  model.get("presets").forEach((/** @type {Preset} */ p, /** @type {number} */ i) =>
    form.presetBtns[i].addEventListener("click", () =>
      act({
        action: "preset",
        name: p.name,
        n: Math.max(1, Number(form.burstN.value) || 1),
        max_tokens: numOrEmpty(f.max_tokens),
        temperature: numOrEmpty(f.temperature),
        chat_template: f.chat_template.checked && !f.chat_template.disabled,
      }),
    ),
  );
  for (const [k, input] of knobEntries(knobs.b)) {
    // After the answer, show the knobs in force: a rejected value springs back. A value already
    // in force sends nothing (a sprung-back field fires "change" again when it loses focus).
    input.addEventListener("change", () => {
      const value =
        input.type === "checkbox"
          ? /** @type {HTMLInputElement} */ (input).checked
          : input.tagName === "SELECT"
            ? input.value
            : numOrNull(input);
      if (value === (model.get("budget") || {})[k]) return;
      act({ action: "set_budget", [k]: value }).then(() => views.knobs(true));
    });
  }
  ui.errClose.addEventListener("click", () => act({ action: "clear_error" }));
  ui.liveBtn.addEventListener("click", () => act({ action: "live" }));
  wireSlider(model, ui, views, act);
}

/** Reset and Apply build a new engine, which discards the run: only a click on Apply or Reset
 * does it, and when there is a run to lose it first says what goes and offers to save it.
 * Enter in a pool knob only moves to Apply (a typed number must never cost a run).
 * @param {ControlsModel} model @param {Ui} ui @param {Knobs} knobs @param {Views} views @param {Act} act */
function wireRebuild(model, ui, knobs, views, act) {
  const c = ui.confirm;
  const close = () => {
    c.el.hidden = true;
  };
  const rebuild = (/** @type {boolean} */ save) => {
    close();
    act({
      action: "reset",
      num_kv_blocks: numOrNull(knobs.pool.num_kv_blocks),
      block_size: numOrNull(knobs.pool.block_size),
      ...(save ? { save_run: true } : {}),
    }).then(() => views.knobs(true));
  };
  const ask = () => {
    views.stopPlay();
    const lost = runWords(model.get("run_summary") || {});
    if (!lost) {
      rebuild(false);
      return;
    }
    c.text.textContent = `A new engine starts with no history: this run's ${lost} would be discarded.`;
    c.save.hidden = !(model.get("run_summary") || {}).can_save; // no HTML export installed: no offer
    c.el.hidden = false;
    c.cancel.focus();
  };
  ui.resetBtn.addEventListener("click", ask);
  knobs.applyBtn.addEventListener("click", ask);
  c.save.addEventListener("click", () => rebuild(true));
  c.discard.addEventListener("click", () => rebuild(false));
  c.cancel.addEventListener("click", close);
  c.el.addEventListener("keydown", (ev) => {
    if (ev.key === "Escape") close();
  });
  for (const input of Object.values(knobs.pool)) {
    input.addEventListener("keydown", (ev) => {
      if (ev.key !== "Enter") return;
      ev.preventDefault();
      views.poolDirty();
      knobs.applyBtn.focus();
    });
  }
  // A run that changed under an open question (a step, another rebuild) makes it stale.
  model.on("change:run_summary", close);
}

/**
 * The history slider: coalesced scrubs, and keys that stay in the slider.
 * @param {ControlsModel} model @param {Ui} ui @param {Views} views @param {Act} act
 */
function wireSlider(model, ui, views, act) {
  // One scrub at a time; presses meanwhile move `ui.scrubTarget` (where the person asked to be),
  // and only the latest is sent next: every press counts, none floods the kernel.
  let scrubInFlight = false,
    scrubNext = /** @type {number|null} */ (null);
  /** @param {number} index */
  function scrub(index) {
    ui.scrubTarget = index;
    if (scrubInFlight) {
      scrubNext = index;
      return;
    }
    scrubInFlight = true;
    act({ action: "scrub", index }).then(() => {
      scrubInFlight = false;
      if (scrubNext !== null) {
        const i = scrubNext;
        scrubNext = null;
        scrub(i);
        return;
      }
      ui.scrubTarget = null;
      views.history();
    });
  }
  ui.slider.addEventListener("input", () => scrub(Number(ui.slider.value)));
  // Once the slider has focus, the keys move the history, and no key reaches JupyterLab
  // (in command mode its shortcuts would collapse headings, change the active cell, or
  // cut/insert cells). Lab listens on the document in the bubbling phase.
  ui.slider.addEventListener("keydown", (ev) => {
    const last = Math.max(0, model.get("history_len") - 1);
    const cur = ui.scrubTarget === null ? Number(ui.slider.value) : ui.scrubTarget;
    let next = null;
    if (ev.key in SLIDER_KEYS) next = cur + SLIDER_KEYS[ev.key];
    else if (ev.key === "Home") next = 0;
    else if (ev.key === "End") next = last;
    if (next !== null) {
      ev.preventDefault();
      next = Math.max(0, Math.min(last, next));
      if (next !== cur) {
        ui.slider.value = String(next);
        scrub(next);
      }
    }
    if (ev.key !== "Escape" && ev.key !== "Tab") ev.stopPropagation();
  });
  for (const type of /** @type {("keyup"|"keypress")[]} */ (["keyup", "keypress"])) {
    ui.slider.addEventListener(type, (ev) => {
      if (ev.key !== "Escape" && ev.key !== "Tab") ev.stopPropagation();
    });
  }
}

/** @param {KvsRenderContextOf<KvsPanelStates["controls"]>} ctx */
function render({ model, el }) {
  const root = kvsRoot(el, model, "kvs-controls");
  /** @type {?Views} */
  let views = null;
  const sender = kvsSender(model, (n) => {
    root.dataset.pending = String(n);
    if (views) views.status();
  });
  const ui = buildBar(model);
  const form = buildForm(model);
  const knobs = buildKnobs();
  const drawer = kvsEl("div", { class: "kvs-drawer", "data-testid": "kvs-drawer" }, [form.el, knobs.el]);
  root.append(...ui.rows, drawer);
  views = makeViews(model, root, ui, form, knobs, sender, drawer);
  views.setDrawer = (open) => {
    drawer.hidden = !open;
    root.dataset.drawer = open ? "open" : "closed";
    ui.drawerBtn.setAttribute("aria-expanded", open ? "true" : "false");
    const watching = !!model.get("read_only");
    ui.drawerBtn.textContent = watching
      ? `${open ? "\u25be" : "\u25b8"} the server's budgets`
      : open
        ? "\u25be requests & knobs"
        : "\u25b8 add request \u00b7 presets \u00b7 knobs";
  };
  // A Session that only watches (a live server): whatever would drive the engine is hidden.
  const drivers = [ui.stepBtn, ui.runN, ui.runBtn, ui.playBtn, ui.speed, ui.resetBtn, form.el, knobs.poolRow];
  views.readOnly = () => {
    const why = model.get("read_only") || "";
    root.dataset.readOnly = why ? "true" : "false";
    for (const e of drivers) e.hidden = !!why;
    if (why) views.stopPlay();
    views.setDrawer(!drawer.hidden);
    views.knobs();
  };
  ui.drawerBtn.addEventListener("click", () => views.setDrawer(drawer.hidden));
  views.setDrawer(window.innerHeight >= DRAWER_OPEN_MIN_HEIGHT);
  makeKnobViews(model, form, knobs, views);
  /** @type {Act} */
  const act = (content) =>
    sender.send(content).then((ack) => {
      views.status();
      return ack;
    });
  wireActions(model, ui, form, knobs, views, act);

  const P = KVS_PANELS.controls;
  kvsOnChange(model, P.status, views.status);
  kvsOnChange(model, P.history, views.history);
  kvsOnChange(model, P.error, views.error);
  kvsOnChange(model, P.caption, views.caption, P.history); // "step N:" before the caption
  model.on("change:chat_template_available", views.chatTemplate);
  kvsOnChange(model, P.knobs, () => views.knobs(), ["view_index"]);
  model.on("change:play_interval_ms", () => {
    ui.speed.value = String(model.get("play_interval_ms"));
  });
  model.on("change:read_only", views.readOnly);
  views.status();
  views.history();
  views.error();
  views.knobs();
  views.play();
  views.caption();
  views.chatTemplate();
  views.readOnly();
  return () => {
    views.stopPlay();
    sender.dispose();
  };
}

export default { render };
