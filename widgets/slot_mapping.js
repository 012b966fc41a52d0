// Slot mapping: an overview strip of the packed batch (query_start_loc ticks, sampled
// rows marked), then one block of token cells per scheduled request.

function render({ model, el }) {
  const root = kvsRoot(el, model, "kvs-slot-mapping");
  const title = kvsEl("div", { class: "kvs-title" }, ["Slot mapping", kvsEl("span", { class: "kvs-sub" })]);
  const strip = kvsEl("div", { class: "kvs-strip", "data-testid": "kvs-batch-strip" });
  const body = kvsEl("div", { class: "kvs-segments" });
  root.append(title, strip, body);

  function draw() {
    const ids = model.get("input_ids"), toks = model.get("tokens"), pos = model.get("positions");
    const slots = model.get("slot_mapping"), segs = model.get("segments");
    const qsl = model.get("query_start_loc"), logits = new Set(model.get("logits_indices"));
    const bs = model.get("block_size"), nrows = model.get("num_rows");
    title.querySelector(".kvs-sub").textContent = nrows
      ? `${nrows} tokens \u00b7 ${segs.length} requests \u00b7 query_start_loc [${qsl.join(", ")}] \u00b7 logits_indices [${[...logits].join(", ")}]`
      : "no batch in this step";
    // Overview strip: widths proportional to each request's tokens.
    strip.replaceChildren(...segs.map((s) => kvsEl("div", {
      class: `kvs-strip-seg ${s.is_prefill ? "kvs-prefill" : "kvs-decode"}`,
      style: { flexGrow: String(Math.max(1, s.end - s.start)), background: kvsColor(s.request_id, true), borderColor: kvsColor(s.request_id) },
      title: `#${s.request_id}: rows [${s.start}, ${s.end})`,
    }, [kvsEl("span", { text: `#${s.request_id} [${s.start},${s.end})` })])));
    body.replaceChildren(...segs.map((s) => {
      const kind = s.is_prefill ? `prefill chunk ${s.chunk_index ?? 0}` : "decode";
      const head = kvsEl("div", { class: "kvs-seg-head" }, [
        kvsEl("span", { class: "kvs-chip", style: { background: kvsColor(s.request_id, true), borderColor: kvsColor(s.request_id) }, text: `#${s.request_id}` }),
        kvsEl("span", { text: `${kind} \u00b7 ${s.end - s.start} tokens \u00b7 rows [${s.start}, ${s.end}) \u00b7 seq_len ${s.seq_len}` }),
        kvsEl("span", { class: "kvs-muted", text: `computed before ${s.num_computed_before}${s.num_cached_tokens ? ` (${s.num_cached_tokens} cached)` : ""} \u00b7 block_table [${(s.block_table || []).join(", ")}]` }),
      ]);
      const cells = [];
      const last = Math.min(s.end, ids.length);
      for (let r = s.start; r < last; r++) {
        const slot = slots[r];
        const block = slot < 0 ? "-" : Math.floor(slot / bs), off = slot < 0 ? "-" : slot % bs;
        const sampled = logits.has(r);
        cells.push(kvsEl("div", {
          class: `kvs-cell${sampled ? " kvs-logits" : ""}${r === s.start ? " kvs-qsl" : ""}`,
          "data-row": r, title: `row ${r} \u00b7 token id ${ids[r]} \u00b7 position ${pos[r]} \u00b7 slot ${slot} = block ${block} \u00d7 ${bs} + ${off}${sampled ? " \u00b7 sampled (logits index)" : ""}`,
        }, [
          kvsEl("div", { class: "kvs-cell-tok", text: kvsTok(toks[r]) || ids[r] }),
          kvsEl("div", { class: "kvs-cell-pos", text: `p${pos[r]}` }),
          kvsEl("div", { class: "kvs-cell-slot", text: `${slot}\u2192(${block},${off})` }),
          sampled ? kvsEl("div", { class: "kvs-cell-sampled", text: s.sampled_text != null ? `\u2192 ${kvsTok(s.sampled_text)}` : "\u2192 sample" }) : null,
        ]));
      }
      if (s.end > last) cells.push(kvsEl("div", { class: "kvs-muted", text: `\u2026 ${s.end - last} more rows not sent` }));
      return kvsEl("div", { class: "kvs-seg", "data-testid": `kvs-seg-${s.request_id}`, style: { borderLeftColor: kvsColor(s.request_id) } },
        [head, kvsEl("div", { class: "kvs-cells" }, cells)]);
    }));
  }
  const drawSoon = kvsBatched(draw);
  for (const k of ["input_ids", "tokens", "positions", "slot_mapping", "segments", "query_start_loc", "logits_indices", "block_size", "num_rows"]) {
    model.on(`change:${k}`, drawSoon);
  }
  draw();
}

export default { render };
