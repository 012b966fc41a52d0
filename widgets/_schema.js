// Generated from engine/report/schema.py by `python -m engine.report --write`: do not edit.
// The record keys, block status codes and block event bits the panels read.
const KVS_SCHEMA = {
 "block_status": {
  "null": 0,
  "free": 1,
  "free_cached": 2,
  "in_use": 3,
  "in_use_hashed": 4
 },
 "block_events": [
  {
   "key": "allocated",
   "bit": 1,
   "label": "allocated",
   "tip": "handed out to a request in this step"
  },
  {
   "key": "hits",
   "bit": 2,
   "label": "prefix hit",
   "tip": "prefix-cache hit: a request admitted in this step takes this block from the cache instead of computing it"
  },
  {
   "key": "same_step_hits",
   "bit": 32,
   "label": "same-step hit",
   "tip": "hit on a block computed in this same step: its KV is written by this step's forward before any layer reads it"
  },
  {
   "key": "freed",
   "bit": 4,
   "label": "freed",
   "tip": "its last owner let go (finished, aborted or preempted)"
  },
  {
   "key": "evicted",
   "bit": 8,
   "label": "evicted",
   "tip": "a cached block reused for new tokens: its hash is forgotten"
  },
  {
   "key": "cached",
   "bit": 16,
   "label": "cached",
   "tip": "full, hashed and registered in the prefix cache in this step"
  }
 ],
 "record": [
  "step",
  "scheduled",
  "batch",
  "sampled",
  "preempted",
  "finished",
  "new_requests",
  "blocks",
  "num_free_blocks",
  "timings_ms",
  "engine_time_s",
  "wall_time_s",
  "token_budget",
  "num_running",
  "num_waiting",
  "budgets",
  "batch_source",
  "scheduled_ahead",
  "changes"
 ],
 "snapshot": [
  "step",
  "config",
  "model_info",
  "metrics",
  "queues",
  "block_pool"
 ],
 "request": [
  "request_id",
  "status",
  "prompt_token_ids",
  "output_token_ids",
  "prompt_text",
  "output_text",
  "num_computed_tokens",
  "num_cached_tokens",
  "block_table",
  "num_preemptions",
  "finish_reason",
  "max_tokens",
  "sampling_params",
  "priority",
  "metrics",
  "num_prompt_tokens",
  "num_output_tokens",
  "cache_salt",
  "lora_name",
  "group_block_tables",
  "group_hit_tokens"
 ],
 "block": [
  "block_id",
  "ref_count",
  "hash",
  "token_ids",
  "owners",
  "is_null",
  "is_free"
 ]
};
