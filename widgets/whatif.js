// @ts-check
// What-if: the recorded run (a) and a variant (b) side by side, one slider for both, the first
// step where they part marked on the strip and said in words above it. Everything is drawn from
// the synced traits: moving the slider needs no round trip to Python.

/** @type {Array<"a" | "b">} */
const WHATIF_RUNS = ["a", "b"];
/** @type {Record<string, string>} */
const WHATIF_LINE = { a: "#455a64", b: "#ef6c00" };
const WHATIF_STRIP_H = 54,
  WHATIF_PAD = 4,
  WHATIF_AXIS_W = 34; // the strip's y scale (0-100% KV) in its left margin
const WHATIF_PART_COLOR = "#c62828";

/**
 * The panel's model: its state (widgets/whatif.py WhatIfStateDict), each run's columns a KvsWhatIfRunDict.
 * @typedef {KvsModelOf<KvsPanelStates["whatif"]>} WhatIfModel
 * `parting`: where the runs first part, or {} when they never do.
 * @typedef {KvsPartingDict | {index?: undefined}} WhatIfParting
 * One scheduled row of a step: [request, tokens, computed before, prefix hits, kind] (explorer/ui/whatif_view.py).
 * @typedef {[string, number, number, number, string]} Scheduled
 * One preemption of a step: [victim, for whom (or null)].
 * @typedef {[string, (string|null)]} Preempted
 */

/** @param {Scheduled} s */
function whatifRow(s) {
  return `${s[0]}|${s[1]}|${s[2]}|${s[3]}`;
}

/** The KV-usage strip of both runs, the parting's mark and the step shown.
 * @param {WhatIfModel} model @param {HTMLElement} strip @param {number} n */
function whatifStrip(model, strip, n) {
  const S = model.get("steps") || {},
    i = model.get("index"),
    p = /** @type {WhatIfParting} */ (model.get("parting") || {});
  const w = Math.max(200, strip.clientWidth || 600);
  const x = (/** @type {number} */ k) => WHATIF_AXIS_W + (n > 1 ? (k / (n - 1)) * (w - WHATIF_AXIS_W - WHATIF_PAD) : 0);
  const y = (/** @type {number} */ u) => WHATIF_STRIP_H - WHATIF_PAD - u * (WHATIF_STRIP_H - 2 * WHATIF_PAD);
  const svg = kvsSvg("svg", {
    width: w,
    height: WHATIF_STRIP_H,
    role: "img",
    "aria-label": "KV usage per step of both runs",
  });
  for (const u of [0, 0.5, 1]) {
    // the y scale: the pool's share in use
    svg.append(
      kvsSvg("line", { x1: WHATIF_AXIS_W, x2: w - WHATIF_PAD, y1: y(u), y2: y(u), stroke: "#e0e0e0" }),
      kvsSvg(
        "text",
        {
          x: WHATIF_AXIS_W - 4,
          y: y(u) + 3,
          "text-anchor": "end",
          "font-size": 9,
          fill: "#666",
          class: "kvs-whatif-tick",
        },
        `${u * 100}%`,
      ),
    );
  }
  for (const k of WHATIF_RUNS) {
    /** @type {KvsWhatIfRunDict | undefined} */
    const run = S[k];
    if (!run || !run.kv_usage.length) continue;
    svg.append(
      kvsSvg("polyline", {
        points: run.kv_usage.map((u, j) => `${x(j).toFixed(1)},${y(u).toFixed(1)}`).join(" "),
        fill: "none",
        stroke: WHATIF_LINE[k],
        "stroke-width": 1.5,
        "data-run": k,
      }),
    );
  }
  if (p.index !== undefined) {
    const mark = kvsSvg("line", {
      x1: x(p.index),
      x2: x(p.index),
      y1: 0,
      y2: WHATIF_STRIP_H,
      stroke: WHATIF_PART_COLOR,
      "stroke-width": 2,
      "stroke-dasharray": "4 2",
      "data-testid": "kvs-whatif-mark",
    });
    mark.append(kvsSvg("title", {}, `they part here: ${p.text}`));
    svg.append(mark);
  }
  if (n)
    svg.append(kvsSvg("line", { x1: x(i), x2: x(i), y1: 0, y2: WHATIF_STRIP_H, stroke: "#111", "stroke-width": 1 }));
  const legend = kvsEl("div", { class: "kvs-sub" }, [
    "KV usage per step: ",
    ...WHATIF_RUNS.map((k) =>
      kvsEl("span", {
        style: { color: WHATIF_LINE[k] },
        text: `\u2014 ${((model.get("runs") || {})[k] || {}).label || k}  `,
      }),
    ),
    p.index !== undefined ? kvsEl("span", { style: { color: WHATIF_PART_COLOR }, text: "\u2506 first parting" }) : "",
  ]);
  strip.replaceChildren(svg, legend);
}

/** One run's step `i`: its schedule (rows the other run lacks marked), KV usage, queues.
 * @param {WhatIfModel} model @param {HTMLElement} view @param {"a" | "b"} k @param {KvsWhatIfRunDict | undefined} other
 * @param {number} i */
function whatifRun(model, view, k, other, i) {
  const S = model.get("steps") || {},
    run = S[k],
    R = (model.get("runs") || {})[k] || {};
  if (!run || i >= run.step.length) {
    view.replaceChildren(
      kvsEl("div", { class: "kvs-whatif-label", text: R.label || k }),
      kvsEl("div", { class: "kvs-muted", text: "no step here: this run ended earlier" }),
    );
    view.dataset.step = "";
    return;
  }
  const mine = /** @type {Scheduled[]} */ (run.scheduled[i]);
  const theirs = new Set(
    other && i < other.step.length ? /** @type {Scheduled[]} */ (other.scheduled[i]).map(whatifRow) : [],
  );
  const time = run.time[i] === null || run.time[i] === undefined ? "" : ` \u00b7 t=${run.time[i].toFixed(3)} s`;
  const usage = run.kv_usage[i];
  const bar = kvsEl("div", { class: "kvs-whatif-kv", title: `KV usage ${(100 * usage).toFixed(0)}%` }, [
    kvsEl("div", { style: { width: `${(100 * usage).toFixed(1)}%`, background: WHATIF_LINE[k] } }),
  ]);
  const rows = mine.map((/** @type {Scheduled} */ s) =>
    kvsEl("tr", { class: theirs.has(whatifRow(s)) ? "" : "kvs-whatif-diff", "data-request": s[0] }, [
      kvsEl("td", {}, [kvsEl("span", { class: "kvs-chip", style: { background: kvsColor(s[0], true) }, text: s[0] })]),
      kvsEl("td", { text: s[4] }),
      kvsEl("td", { text: s[1] }),
      kvsEl("td", { text: s[2] }),
      kvsEl("td", { text: s[3] || "" }),
    ]),
  );
  const table = kvsEl("table", { class: "kvs-whatif-table" }, [
    kvsEl(
      "tr",
      {},
      ["request", "", "tokens", "from", "prefix hit"].map((h) => kvsEl("th", { text: h })),
    ),
    ...rows,
  ]);
  const pre = /** @type {Preempted[]} */ (run.preempted[i]).map((/** @type {Preempted} */ [v, f]) =>
    kvsEl("div", {
      class: "kvs-whatif-preempt",
      "data-testid": "kvs-whatif-preempted",
      text: `req ${v} preempted${f && f !== v ? ` for req ${f}` : ""}`,
    }),
  );
  const fin = run.finished[i].length
    ? kvsEl("div", { class: "kvs-sub", text: `finished: ${run.finished[i].join(", ")}` })
    : "";
  view.replaceChildren(
    kvsEl("div", { class: "kvs-whatif-label" }, [
      kvsEl("span", { style: { color: WHATIF_LINE[k] }, text: "\u25a0 " }),
      R.label || k,
    ]),
    kvsEl("div", { class: "kvs-sub", "data-testid": `kvs-whatif-${k}-step`, text: `step ${run.step[i]}${time}` }),
    bar,
    kvsEl("div", {
      class: "kvs-sub",
      text: `${run.free_blocks[i]} free blocks \u00b7 ${run.num_running[i]} running \u00b7 ${run.num_waiting[i]} waiting`,
    }),
    mine.length ? table : kvsEl("div", { class: "kvs-muted", text: "nothing scheduled" }),
    ...pre,
    fin,
    run.waiting[i].length ? kvsEl("div", { class: "kvs-sub", text: `waiting: ${run.waiting[i].join(", ")}` }) : "",
  );
  view.dataset.step = String(run.step[i]);
}

/** @param {KvsRenderContextOf<KvsPanelStates["whatif"]>} ctx */
function render({ model, el }) {
  const root = kvsRoot(el, model, "kvs-whatif");
  const title = kvsEl("div", { class: "kvs-title" }, ["What-if"]);
  const parting = kvsEl("div", { class: "kvs-whatif-parting", "data-testid": "kvs-whatif-parting" });
  const jump = kvsEl("button", { "data-testid": "kvs-whatif-jump", text: "go to the parting" });
  const strip = kvsEl("div", { class: "kvs-whatif-strip", "data-testid": "kvs-whatif-strip" });
  const prev = kvsEl("button", { "data-testid": "kvs-whatif-prev", text: "\u25c0", title: "previous step" });
  const next = kvsEl("button", { "data-testid": "kvs-whatif-next", text: "\u25b6", title: "next step" });
  const slider = kvsEl("input", { type: "range", min: 0, value: 0, "data-testid": "kvs-whatif-slider" });
  const where = kvsEl("span", { class: "kvs-whatif-where", "data-testid": "kvs-whatif-where" });
  const cols = kvsEl("div", { class: "kvs-whatif-cols" });
  const views = Object.fromEntries(
    WHATIF_RUNS.map((k) => [k, kvsEl("div", { class: "kvs-whatif-run", "data-testid": `kvs-whatif-${k}` })]),
  );
  const notes = kvsEl("div", { class: "kvs-muted kvs-whatif-notes", "data-testid": "kvs-whatif-notes" });
  cols.append(views.a, views.b);
  root.append(
    title,
    kvsEl("div", { class: "kvs-whatif-head" }, [parting, jump]),
    strip,
    kvsEl("div", { class: "kvs-whatif-bar" }, [prev, slider, next, where]),
    cols,
    notes,
  );

  const count = () =>
    Math.max(...WHATIF_RUNS.map((k) => ((model.get("steps") || {})[k] || { step: [] }).step.length), 0);
  const go = (/** @type {number} */ i) => {
    const n = count();
    if (!n) return;
    const clamped = Math.max(0, Math.min(n - 1, i));
    if (clamped === model.get("index")) return;
    model.set("index", clamped);
    model.save_changes();
  };
  slider.addEventListener("input", () => go(Number(slider.value)));
  prev.addEventListener("click", () => go(model.get("index") - 1));
  next.addEventListener("click", () => go(model.get("index") + 1));
  jump.addEventListener("click", () => {
    const p = /** @type {WhatIfParting} */ (model.get("parting") || {});
    if (p.index !== undefined) go(p.index);
  });
  strip.addEventListener("click", (/** @type {MouseEvent} */ ev) => {
    const box = strip.getBoundingClientRect();
    const at = (ev.clientX - box.left - WHATIF_AXIS_W) / Math.max(1, box.width - WHATIF_AXIS_W - WHATIF_PAD);
    go(Math.max(0, Math.round(at * (count() - 1))));
  });

  const draw = kvsBatched(() => {
    const R = model.get("runs") || {},
      S = model.get("steps") || {},
      p = /** @type {WhatIfParting} */ (model.get("parting") || {});
    const n = count(),
      i = Math.min(model.get("index"), Math.max(0, n - 1));
    title.replaceChildren(
      "What-if",
      kvsEl("span", { class: "kvs-sub", text: `${(R.a || {}).label || "a"} vs ${(R.b || {}).label || "b"}` }),
    );
    slider.max = String(Math.max(0, n - 1));
    slider.value = String(i);
    root.dataset.index = String(i);
    where.textContent = n ? `step ${i + 1} of ${n}` : "no steps";
    if (p.index !== undefined) {
      parting.replaceChildren(kvsEl("b", { text: i === p.index ? "They part here: " : "First parting: " }), p.text);
      parting.classList.toggle("kvs-whatif-here", i === p.index);
      jump.style.display = "";
    } else {
      parting.replaceChildren(n ? "The two runs never part: the same schedule at every step." : "");
      jump.style.display = "none";
    }
    whatifRun(model, views.a, "a", S.b, i);
    whatifRun(model, views.b, "b", S.a, i);
    whatifStrip(model, strip, n);
    notes.replaceChildren(...(model.get("notes") || []).map((/** @type {string} */ t) => kvsEl("div", { text: t })));
  });
  kvsOnChange(model, KVS_PANELS.whatif.draw, draw, [], true); // (runs, steps, parting, index, notes; no Dashboard hold)
  if (typeof ResizeObserver !== "undefined")
    new ResizeObserver(() => whatifStrip(model, strip, count())).observe(strip);
  draw();
}

export default { render };
