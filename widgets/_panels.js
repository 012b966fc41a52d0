// Generated from the panels' state classes (widgets/<panel>.py PARTS) by `python -m widgets --write`:
// do not edit. Each panel's parts and the fields each redraws on (_common.js kvsOnChange).
const KVS_PANELS = {
 "attention": {
  "choices": [
   "requests",
   "request_id",
   "layer",
   "head",
   "num_layers",
   "layer_names",
   "kv_head_of_head",
   "thumbs",
   "thumb_heads",
   "thumb_shape"
  ],
  "weights": [
   "probs",
   "context_len",
   "row_positions",
   "block_table",
   "message",
   "probe_step",
   "num_prompt_tokens",
   "tokens"
  ]
 },
 "blocks": {
  "pool": [
   "num_blocks",
   "block_size",
   "status",
   "ref_count",
   "owner",
   "events",
   "group",
   "group_labels",
   "owners",
   "shared"
  ],
  "legend": [
   "counts"
  ],
  "tables": [
   "block_tables"
  ]
 },
 "controls": {
  "status": [
   "info",
   "busy",
   "engine"
  ],
  "history": [
   "history_len",
   "history_first",
   "history_dropped",
   "view_index"
  ],
  "error": [
   "error",
   "error_field"
  ],
  "caption": [
   "caption",
   "notice"
  ],
  "knobs": [
   "budget",
   "pool"
  ]
 },
 "follow": {
  "draw": [
   "following",
   "status",
   "parked_at"
  ]
 },
 "latency": {
  "draw": [
   "rows",
   "clock",
   "clock_note"
  ]
 },
 "tree": {
  "draw": [
   "tree"
  ]
 },
 "queues": {
  "draw": [
   "queues",
   "finished_total"
  ]
 },
 "sampler": {
  "draw": [
   "requests",
   "request_id",
   "sample"
  ]
 },
 "slots": {
  "draw": [
   "input_ids",
   "tokens",
   "positions",
   "slot_mapping",
   "group_slot_mappings",
   "segments",
   "query_start_loc",
   "logits_indices",
   "block_size",
   "num_rows",
   "truncated",
   "batch_source",
   "batch_source_words"
  ]
 },
 "tensor_parallel": {
  "draw": [
   "info",
   "ranks",
   "weights",
   "last_step",
   "recent",
   "note"
  ]
 },
 "timeline": {
  "draw": [
   "steps",
   "gantt"
  ]
 },
 "why": {
  "summary": [
   "summary"
  ],
  "request": [
   "request"
  ]
 },
 "fleet": {
  "draw": [
   "following",
   "ranks",
   "rows",
   "summary"
  ]
 },
 "whatif": {
  "draw": [
   "runs",
   "steps",
   "parting",
   "index",
   "notes"
  ]
 }
};
