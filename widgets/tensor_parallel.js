// @ts-check
// Tensor parallel: per-rank shares, each weight drawn as a matrix striped by rank, the
// collectives between them, and the last step's collective time.

/**
 * The traits this panel reads (explorer/ui/tp_view.py, typed by widgets/tensor_parallel.py): `info`
 * (KvsTpInfoDict: the group and the model), `ranks` (KvsTpRankDict[]), `weights` (KvsTpWeightDict[]),
 * `last_step` and `recent` (collective times per step), and `note`.
 * @typedef {KvsPanelStates["tensor_parallel"]} TpState
 * @typedef {KvsTpLastStepDict | {step?: undefined}} TpLastStep  `last_step`: the displayed step's times, or {}
 */

const KVS_RANK_COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f"];
const kvsRankColor = (/** @type {number} */ r) => KVS_RANK_COLORS[r % KVS_RANK_COLORS.length];

/** @param {number|null|undefined} n */
function kvsBytes(n) {
  if (n === null || n === undefined) return "?";
  const units = ["B", "KiB", "MiB", "GiB"];
  let v = Number(n),
    u = 0;
  while (v >= 1024 && u < units.length - 1) {
    v /= 1024;
    u++;
  }
  return `${v.toFixed(v >= 100 || u === 0 ? 0 : 1)} ${units[u]}`;
}

const kvsRange = (/** @type {number[]|null|undefined} */ r) =>
  r ? (r[1] - r[0] === 1 ? `${r[0]}` : `${r[0]}\u2013${r[1] - 1}`) : "all";

// One weight as a small matrix: stripes across rows (output features) or columns (input
// features), one colour per rank; a replicated weight is grey with "every rank".
/** @param {KvsTpWeightDict} w @param {number} size */
function kvsMatrix(w, size) {
  const box = kvsEl("div", {
    class: `kvs-tp-matrix kvs-tp-${w.split || "replicated"}`,
    "data-testid": "kvs-tp-matrix",
  });
  if (!w.split || size <= 1) {
    box.append(
      kvsEl("span", {
        class: "kvs-tp-stripe kvs-tp-all",
        style: { background: size <= 1 ? kvsRankColor(0) : "#bdbdbd" },
        title: size <= 1 ? "rank 0 holds all of it" : "every rank holds all of it",
      }),
    );
    return box;
  }
  (w.per_rank || []).forEach(([lo, hi], r) => {
    box.append(
      kvsEl("span", {
        class: "kvs-tp-stripe",
        style: { background: kvsRankColor(r) },
        title: `rank ${r}: ${w.split} ${lo}\u2013${hi - 1}${w.unit ? ` (${w.unit})` : ""}`,
      }),
    );
  });
  return box;
}

/** @param {string|null} after @param {number} size */
function kvsCollective(after, size) {
  if (!after || size <= 1) return null;
  const text = after === "gather" ? "gather logits \u2192 rank 0" : "all-reduce (sum)";
  return kvsEl("div", {
    class: `kvs-tp-coll kvs-tp-${after}`,
    "data-testid": "kvs-tp-collective",
    text: `\u21d3 ${text}`,
  });
}

/** @param {KvsRenderContextOf<TpState>} ctx */
function render({ model, el }) {
  const root = kvsRoot(el, model, "kvs-tensor-parallel");
  const sub = kvsEl("span", { class: "kvs-sub" });
  const note = kvsEl("div", { class: "kvs-tp-note", "data-testid": "kvs-tp-note" });
  const ranks = kvsEl("div", { class: "kvs-tp-ranks", "data-testid": "kvs-tp-ranks" });
  const last = kvsEl("div", { class: "kvs-tp-last", "data-testid": "kvs-tp-last" });
  const weights = kvsEl("div", { class: "kvs-tp-weights", "data-testid": "kvs-tp-weights" });
  root.append(kvsEl("div", { class: "kvs-title" }, ["Tensor parallel", sub]), note, ranks, last, weights);

  /** @param {KvsTpInfoDict} info */
  function drawRanks(info) {
    const head = ["rank", "device", "q heads", "KV heads", "vocab rows", "MLP rows", "KV pool"];
    const rows = model
      .get("ranks")
      .map((r) =>
        kvsEl("tr", {}, [
          kvsEl("td", {}, [
            kvsEl("span", { class: "kvs-tp-swatch", style: { background: kvsRankColor(r.rank) } }),
            `${r.rank}`,
          ]),
          kvsEl("td", { class: "kvs-mono", text: r.device }),
          kvsEl("td", { text: `${kvsRange(r.heads)} (${r.heads[1] - r.heads[0]})` }),
          kvsEl("td", { text: `${kvsRange(r.kv_heads)} (${r.kv_heads[1] - r.kv_heads[0]})` }),
          kvsEl("td", { text: kvsRange(r.vocab) }),
          kvsEl("td", { text: kvsRange(r.intermediate) }),
          kvsEl("td", { text: kvsBytes(r.kv_bytes) }),
        ]),
      );
    ranks.replaceChildren(
      kvsEl("table", {}, [
        kvsEl("thead", {}, [
          kvsEl(
            "tr",
            {},
            head.map((h) => kvsEl("th", { text: h })),
          ),
        ]),
        kvsEl("tbody", {}, rows),
      ]),
      kvsEl("div", {
        class: "kvs-muted",
        text:
          `${info.num_blocks ?? "?"} KV blocks with the same ids and slots on every rank; ` +
          `each rank stores only its KV heads (${kvsBytes(info.kv_bytes_per_block_per_rank)} per block). ` +
          "Scheduler, block manager and sampler run on rank 0 only.",
      }),
    );
  }

  function drawLast() {
    const s = /** @type {TpLastStep} */ (model.get("last_step") || {}); // {} before the first step
    const recent = /** @type {[number, number, number][]} */ (model.get("recent") || []); // [step, collectives_ms, forward_ms]
    if (s.step === undefined || s.step === null) {
      last.replaceChildren(
        kvsEl("span", { class: "kvs-muted", text: "no step yet: collective time appears after the first step" }),
      );
      return;
    }
    const share =
      s.forward_ms > 0
        ? ` (${((100 * s.collectives_ms) / s.forward_ms).toFixed(0)}% of forward ${s.forward_ms.toFixed(1)} ms)`
        : "";
    const maxMs = Math.max(1e-6, ...recent.map((r) => r[2]));
    const bars = kvsEl(
      "div",
      { class: "kvs-tp-spark", title: "per step: forward (light) and its collectives (dark), ms" },
      recent.map(([step, coll, fwd]) =>
        kvsEl(
          "span",
          {
            class: "kvs-tp-bar",
            title: `step ${step}: collectives ${coll.toFixed(1)} ms of forward ${fwd.toFixed(1)} ms`,
            style: { height: `${((100 * fwd) / maxMs).toFixed(1)}%` },
          },
          [
            kvsEl("span", {
              class: "kvs-tp-bar-coll",
              style: { height: `${fwd > 0 ? ((100 * coll) / fwd).toFixed(1) : 0}%` },
            }),
          ],
        ),
      ),
    );
    last.replaceChildren(
      kvsEl("div", {}, [
        kvsEl("b", { text: `step ${s.step}: ` }),
        `collectives ${s.collectives_ms.toFixed(1)} ms${share}, measured on rank 0`,
      ]),
      recent.length > 1 ? bars : null,
    );
  }

  /** @param {KvsTpInfoDict} info */
  function drawWeights(info) {
    const size = info.size || 1;
    const items = [];
    const layerStart = model.get("weights").findIndex((w) => w.name === "input_layernorm");
    const layerEnd = model.get("weights").findIndex((w) => w.name === "norm");
    model.get("weights").forEach((w, i) => {
      if (i === layerStart)
        items.push(
          kvsEl("div", {
            class: "kvs-tp-section",
            text: `\u00d7 ${info.num_layers ?? "?"} decoder layers \u2014 attention`,
          }),
        );
      if (w.name === "post_attention_layernorm") items.push(kvsEl("div", { class: "kvs-tp-section", text: "MLP" }));
      if (i === layerEnd) items.push(kvsEl("div", { class: "kvs-tp-section", text: "after the last layer" }));
      const how =
        !w.split || size <= 1
          ? size <= 1
            ? "whole"
            : "replicated"
          : `split by ${w.split}${w.unit ? ` (${w.unit})` : ""}`;
      const tags = [
        w.packed_into ? kvsEl("span", { class: "kvs-chip", text: `packed in ${w.packed_into}` }) : null,
        w.bias ? kvsEl("span", { class: "kvs-chip", text: "+ bias" }) : null,
        w.tied_to ? kvsEl("span", { class: "kvs-chip", text: `tied to ${w.tied_to}` }) : null,
      ];
      items.push(
        kvsEl("div", { class: "kvs-tp-weight", "data-testid": "kvs-tp-weight", "data-name": w.name }, [
          kvsEl("span", { class: "kvs-tp-name kvs-mono", text: w.name }),
          kvsMatrix(w, size),
          kvsEl("span", { class: "kvs-tp-shape kvs-mono", text: `[${w.shape.join(" \u00d7 ")}]` }),
          kvsEl("span", { class: "kvs-tp-how", text: how }),
          ...tags,
        ]),
      );
      if (w.name === "v_proj" && size > 1) {
        // (a split model's info names both head counts)
        items.push(
          kvsEl("div", {
            class: "kvs-tp-local",
            text: `attention on each rank's own ${/** @type {number} */ (info.num_heads) / size} q heads and ${/** @type {number} */ (info.num_kv_heads) / size} KV heads, over its own KV pool (no communication)`,
          }),
        );
      }
      const coll = kvsCollective(w.after, size);
      if (coll) items.push(coll);
    });
    if (size > 1)
      items.push(
        kvsEl("div", {
          class: "kvs-tp-local",
          text: "sampler on rank 0 \u2192 next step's inputs sent to every worker over its pipe",
        }),
      );
    weights.replaceChildren(...items);
  }

  function draw() {
    const info = model.get("info") || {};
    const size = info.size || 1;
    sub.textContent =
      size > 1
        ? `${size} ranks \u00b7 ${info.backend || "?"} \u00b7 ${info.name || ""}`
        : `1 rank (tensor_parallel_size=1) \u00b7 ${info.name || ""}`;
    note.textContent = model.get("note") || "";
    note.style.display = model.get("note") ? "" : "none";
    drawRanks(info);
    drawLast();
    drawWeights(info);
  }
  const drawSoon = kvsBatched(draw);
  kvsOnChange(model, KVS_PANELS.tensor_parallel.draw, drawSoon, ["step"]);
  draw();
  return () => {};
}

export default { render };
