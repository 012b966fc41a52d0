// Generated from the panels' state classes (widgets/<panel>.py PARTS) by `python -m widgets --write`:
// do not edit. Each part of a panel's state as tsc sees it (widgets/kvs_types.d.ts: KvsModelOf).

/** What can be chosen: the requests with KV, the layer and head, and each head's thumbnail. */
interface KvsAttentionChoices {
  requests: Array<string>;
  request_id: string;
  layer: number;
  head: number;
  num_layers: number;
  layer_names: Array<string>;
  kv_head_of_head: Array<number>;
  thumbs: KvsBytes;
  thumb_heads: Array<number>;
  thumb_shape: Array<number>;
}

/** The chosen head's weights (or why there are none). */
interface KvsAttentionWeights {
  probs: KvsBytes;
  context_len: number;
  row_positions: Array<number>;
  block_table: Array<number>;
  message: string;
  probe_step: number;
  num_prompt_tokens: number;
  tokens: Array<string>;
}

/** The canvas: one cell per block, from the byte columns (explorer.ui.views.BLOCK_COLUMNS). */
interface KvsBlockPoolCells {
  num_blocks: number;
  block_size: number;
  status: KvsBytes;
  ref_count: KvsBytes;
  owner: KvsBytes;
  events: KvsBytes;
  group: KvsBytes;
  group_labels: Array<string>;
  owners: Array<string>;
  shared: Array<Array<number | Array<number>>>;
}

/** The legend's counts: each event of this step, and the blocks by status. */
interface KvsBlockPoolLegend {
  counts: {[key: string]: number};
}

/** The per-request block tables. */
interface KvsBlockPoolTables {
  block_tables: Array<KvsBlockTableRowDict>;
}

/** The status line and the engine's badge. */
interface KvsControlsStatus {
  info: string;
  busy: boolean;
  engine: string;
}

/** The history slider. */
interface KvsControlsHistory {
  history_len: number;
  history_first: number;
  history_dropped: number;
  view_index: number;
}

/** An action's error, and the input it is about. */
interface KvsControlsError {
  error: string;
  error_field: string;
}

/** The shown step in words, and a notice. */
interface KvsControlsCaption {
  caption: string;
  notice: string;
}

/** The scheduler's and the pool's knobs. */
interface KvsControlsKnobs {
  budget: KvsControlsBudget;
  pool: KvsControlsPool;
}

/** What explorer.ui.follow_view sets: following or paused, the feed's counters, and the step the Dashboard's view is parked at while it follows (None: it shows the latest). */
interface KvsFollowState {
  following: boolean;
  status: KvsFollowStatus;
  parked_at: number | null;
}

/** What explorer.ui.views.latency_state returns. */
interface KvsLatencyState {
  rows: Array<KvsLatencyRowDict>;
  clock: string;
  clock_note: string;
}

/** What the panel draws: explorer.ui.why_view.tree_state's tree. */
interface KvsPrefixTreeState {
  tree: KvsPrefixTreeDict;
}

/** What explorer.ui.views.queues_state returns: the three queues' rows, and how many requests have finished (the rows may stop at the latest ones). */
interface KvsQueuesState {
  queues: KvsQueueCardsDict;
  finished_total: number;
}

/** What explorer.ui.views.sampler_state returns. */
interface KvsSamplerState {
  requests: Array<string>;
  request_id: string;
  sample: KvsSamplerSample;
}

/** What explorer.ui.views.slot_mapping_state returns (the traits below say each field). */
interface KvsSlotMappingState {
  input_ids: Array<number>;
  tokens: Array<string>;
  positions: Array<number>;
  slot_mapping: Array<number>;
  group_slot_mappings: Array<Array<number>>;
  segments: Array<KvsSlotSegmentDict>;
  query_start_loc: Array<number>;
  logits_indices: Array<number>;
  block_size: number;
  num_rows: number;
  truncated: number;
  batch_source: string;
  batch_source_words: Array<string>;
}

/** What explorer.ui.tp_view.tensor_parallel_state returns. */
interface KvsTensorParallelState {
  info: KvsTpInfoDict;
  ranks: Array<KvsTpRankDict>;
  weights: Array<KvsTpWeightDict>;
  last_step: KvsTpLastStepDict | KvsTpNoStepDict;
  recent: Array<Array<number>>;
  note: string;
}

/** What explorer.ui.views.timeline_state returns: per-step columns and the Gantt. */
interface KvsTimelineState {
  steps: KvsTimelineSteps;
  gantt: KvsTimelineGantt;
}

/** explorer.ui.why_view.summary_state: the run's classes and what the proofs found. */
interface KvsWhySummaryState {
  summary: KvsWhySummaryDict;
}

/** explorer.ui.why_view.request_state: the selected request's tokens, classes and causes (or {}: none). */
interface KvsWhyRequestState {
  request: KvsWhyRequestKnownDict | KvsWhyRequestUnknownDict | KvsWhyNoRequestDict;
}

/** What the panel draws: Follow / Pause, each engine core, the latest requests' routing and its totals. */
interface KvsFleetDrawState {
  following: boolean;
  ranks: Array<KvsFleetRankDict>;
  rows: Array<KvsRoutingRowDict>;
  summary: KvsFleetSummaryDict;
}

/** `whatif_state` (explorer.ui.whatif_view): the WhatIfPanel's traits. */
interface KvsWhatIfStateDict {
  runs: KvsWhatIfRunsDict;
  steps: KvsWhatIfStepsDict;
  parting: KvsPartingDict | KvsNoPartingDict;
  index: number;
  notes: Array<string>;
}

/** One running request's block table: logical -> physical, and which logical indices came from the cache. */
interface KvsBlockTableRowDict {
  request_id: string;
  block_table: Array<number>;
  num_computed_tokens: number;
  hits: Array<number>;
  same_step_hits: Array<number>;
  cached: Array<number>;
  groups?: Array<KvsGroupRowDict>;
}

/** The scheduler knobs (engine.config.SCHEDULER_KNOBS, as engine.report.schema.BudgetsDict has them): live, those in force; scrubbed back, those the shown step ran under (a recording may lack some). */
interface KvsControlsBudget {
  max_num_batched_tokens?: number;
  max_num_seqs?: number;
  enable_chunked_prefill?: boolean;
  enable_prefix_caching?: boolean;
  scheduler_reserve_full_isl?: boolean;
  scheduling_policy?: string;
}

/** The pool knobs of the engine's config (explorer.ui.layout.POOL_KEYS): Apply / Reset builds a new engine. */
interface KvsControlsPool {
  num_kv_blocks?: number | null;
  block_size?: number;
}

/** Session.feed_status() and the engine's name: the feed's counters, and whether the Session follows it. */
interface KvsFollowStatus {
  address?: string;
  rank?: number;
  run_id?: string;
  seq?: number;
  pending?: number;
  received?: number;
  applied?: number;
  rejected?: number;
  dropped_here?: number;
  missed?: number;
  resyncs?: number;
  stale?: number;
  rebased?: number;
  last_rejection?: string | null;
  server?: KvsFollowServerCounters;
  tokens_left_out?: boolean;
  scheduled_ahead?: number | null;
  stopped?: string | null;
  notes?: Array<string>;
  kv_events?: {[key: string]: number};
  following: boolean;
  history: {[key: string]: number | null};
  engine: string;
}

/** One request's row of the latency panel (explorer.ui.views.latency_rows), in seconds. */
interface KvsLatencyRowDict {
  request_id: string;
  time_to_first_token: number | null;
  inter_token_latency: Array<number>;
}

/** The prefix tree at the shown step (explorer.ui.why_view.tree_state): the panel's `tree`. */
interface KvsPrefixTreeDict {
  step: number;
  first_step: number;
  last_step: number;
  bins: number;
  nodes: Array<KvsTreeNodeDict>;
  hidden: number;
  num_present: number;
  num_evicted: number;
  num_hits: number;
  block_size: number;
  unmapped: number;
  notes: Array<string>;
  kv_events: KvsKvEventsAgreementDict | null;
}

/** The three queues' cards (finished: the latest, newest first). */
interface KvsQueueCardsDict {
  waiting: Array<KvsQueueRowDict>;
  running: Array<KvsQueueRowDict>;
  finished: Array<KvsQueueRowDict>;
}

/** The request's latest sample: the token chosen and the top candidates; before its first token, only `note` and `params`. */
interface KvsSamplerSample {
  request_id?: string;
  step?: number;
  token_id?: number | null;
  text?: string | null;
  top?: Array<[number, string, number]>;
  params: KvsSamplerParams;
  note?: string;
}

/** One scheduled request's rows [start, end) of the packed batch (start, end: query_start_loc). */
interface KvsSlotSegmentDict {
  request_id: string;
  start: number;
  end: number;
  is_prefill: boolean;
  chunk_index: number | null;
  num_computed_before: number;
  num_cached_tokens: number;
  seq_len: number | null;
  block_table: Array<number>;
  sampled_text: string | null;
  cached_blocks: Array<KvsCachedBlockDict>;
  groups: Array<KvsSlotGroupTableDict>;
}

/** The group and the model (the snapshot's model_info and pool size; None where the engine did not say). */
interface KvsTpInfoDict {
  name: string | null;
  num_layers: number | null;
  hidden_size: number | null;
  num_heads: number | null;
  num_kv_heads: number | null;
  head_dim: number | null;
  vocab_size: number | null;
  intermediate_size: number | null;
  dtype: string | null;
  kv_bytes_per_rank: number | null;
  kv_bytes_per_block_per_rank: number | null;
  size: number;
  backend: string | null;
  num_blocks: number | null;
}

/** One rank's share: [lo, hi) of query heads, KV heads, vocabulary rows and MLP rows, and its KV pool. */
interface KvsTpRankDict {
  rank: number;
  device: string;
  heads: Array<number>;
  kv_heads: Array<number>;
  vocab?: Array<number>;
  intermediate?: Array<number>;
  kv_bytes: number;
  kv_bytes_per_block?: number;
}

/** One weight, in forward order (engine/parallel/sharding.py sharding_layout): how it is split and what follows. */
interface KvsTpWeightDict {
  name: string;
  shape: Array<number>;
  split: "rows" | "columns" | null;
  unit: string | null;
  per_rank: Array<Array<number>> | null;
  packed_into: string | null;
  after: "all_reduce" | "gather" | null;
  bias: boolean;
  tied_to?: string | null;
}

/** The displayed step's times in ms: rank 0's collectives, the forward and the whole step. */
interface KvsTpLastStepDict {
  step: number;
  collectives_ms: number;
  forward_ms: number;
  total_ms: number;
}

/** `last_step` before any step ran: {}. */
interface KvsTpNoStepDict {
}

/** The steps as columns: entry i of each list is the i-th step's. */
interface KvsTimelineSteps {
  step: Array<number>;
  prefill: Array<number>;
  decode: Array<number>;
  budget: Array<number>;
  preempted: Array<number>;
  schedule: Array<number>;
  prepare: Array<number>;
  forward: Array<number>;
  sample: Array<number>;
  update: Array<number>;
  backend: Array<string | null>;
  graph_bucket: Array<number | null>;
  forward_path: Array<string>;
  scheduled_ahead: Array<number | null>;
  caption: Array<string>;
}

/** The Gantt chart: one row per request, run-length segments of what it did per step. */
interface KvsTimelineGantt {
  requests: Array<string>;
  segments: Array<[number, number, number, "queued" | "prefill" | "decode" | "preempted" | "stalled", string]>;
}

/** `summary_state`: the why panel's `summary`, RunSummary.to_dict() and what the panel adds. */
interface KvsWhySummaryDict {
  requests: number;
  prompt_tokens: number;
  classes: {[key: string]: number};
  readmissions: number;
  readmission_tokens: number;
  readmission_classes: {[key: string]: number};
  preemptions: number;
  hittable_tokens: number;
  hit_rate: number | null;
  text: string;
  engine: string | null;
  notes: Array<string>;
  rows: Array<KvsSummaryRowDict>;
  classes_known: Array<KvsClassLookDict>;
  engine_note: string;
  proof: KvsProofReportDict | null;
}

/** `request_state` of a request admitted by the shown step: its prompt, admissions, preemptions, proofs. */
interface KvsWhyRequestKnownDict {
  request_id: string;
  known: true;
  prompt_len: number;
  why: string;
  domain: string;
  tokens: Array<string>;
  tokens_cut: number;
  admissions: Array<KvsWhyAdmissionDict>;
  preemptions: Array<KvsWhyPreemptionDict>;
  proofs: {[key: string]: KvsProofDict};
}

/** `request_state` of a request not admitted by the shown step: only its id. */
interface KvsWhyRequestUnknownDict {
  request_id: string;
  known: false;
}

/** The why panel's `request` while no request is chosen: {}. */
interface KvsWhyNoRequestDict {
}

/** One engine core in the fleet panel: its feed's counters (Session.feed_status) and its load. */
interface KvsFleetRankDict {
  label: string;
  address: string;
  step: number;
  applied: number;
  missed: number;
  dropped_here: number;
  running: number;
  waiting: number;
  free_blocks: number;
  num_blocks: number;
  scheduled_ahead: number | null;
  requests: number;
}

/** One request's routing (explorer.core.fleet.Fleet.routing): where it ran, and what the best rank held. */
interface KvsRoutingRowDict {
  request_id: string;
  rank: number;
  label: string;
  arrival_time: number | null;
  hit_tokens: number;
  prompt_blocks: number;
  would_hit: Array<number | null>;
  best_rank: number | null;
  best_tokens: number | null;
  loss_tokens: number;
  known: boolean;
}

/** The routing totals, and how many of the rows the panel shows. */
interface KvsFleetSummaryDict {
  requests: number;
  per_rank: Array<number>;
  measured: number;
  hit_tokens: number;
  best_tokens: number;
  loss_tokens: number;
  requests_with_loss: number;
  shown: number;
  total: number;
}

/** Both runs' labels: "a" at the recorded settings, "b" the variant. */
interface KvsWhatIfRunsDict {
  a: KvsWhatIfRunLabelDict;
  b: KvsWhatIfRunLabelDict;
}

/** Both runs' columns. */
interface KvsWhatIfStepsDict {
  a: KvsWhatIfRunDict;
  b: KvsWhatIfRunDict;
}

/** Where the runs first part (explorer.whatif.parting.Parting.to_dict()): the n-th step of both, in words. */
interface KvsPartingDict {
  index: number;
  step_a: number;
  step_b: number;
  text: string;
  requests: Array<string>;
}

/** A `parting` of runs that never part (within the steps shown): {}. */
interface KvsNoPartingDict {
}

/** A request's block table in one KV cache group, as a block-table row shows it (`group_rows`). */
interface KvsGroupRowDict {
  label: string;
  block_table: Array<number>;
  hit_tokens: number | null;
  cut: boolean;
}

/** The recorder's own counters, as the server last sent them (explorer.drivers.vllm_live.recorder). */
interface KvsFollowServerCounters {
  published?: number;
  unobserved?: number;
  errors?: number;
  steps?: number;
  recorder_ms?: number;
  recorder_cpu_ms?: number;
  publisher_cpu_ms?: number;
  backlog?: number;
  unrecorded?: number;
}

/** One node of the prefix tree panel: a cached prefix, one block of tokens. */
interface KvsTreeNodeDict {
  id: string;
  parent: string | null;
  depth: number;
  num_tokens: number;
  text: string;
  present: boolean;
  blocks: Array<number>;
  owners: Array<string>;
  users: Array<string>;
  first_by: string;
  hits: number;
  stored: Array<number>;
  evictions: Array<KvsTreeEvictionDict>;
  unused: boolean;
  lifeline: Array<number>;
  folded: boolean;
  domain: string;
}

/** vLLM's own prefix tree (its KV events) against the ledger's present nodes. */
interface KvsKvEventsAgreementDict {
  blocks: number;
  agree: boolean;
  only_here: Array<string>;
  only_in_events: Array<string>;
  counters: {[key: string]: number};
}

/** One request's card in the queues panel. */
interface KvsQueueRowDict {
  request_id: string;
  label: string;
  status: string;
  prompt_text: string;
  output_text: string;
  num_prompt_tokens: number;
  num_output_tokens: number;
  max_tokens: number | null;
  num_computed_tokens: number;
  num_cached_tokens: number;
  num_preemptions: number;
  finish_reason: string | null;
  num_blocks: number;
  scheduled: KvsQueueScheduledDict | null;
  sampled_text: string | null;
  why: KvsWhyRowDict | null;
}

/** The request's sampling parameters the sampler shows (those its SamplingParams has). */
interface KvsSamplerParams {
  temperature?: number;
  top_k?: number;
  top_p?: number;
  max_tokens?: number;
  ignore_eos?: boolean;
  seed?: number | null;
}

/** One block of a prefix hit in the slot-mapping panel: positions [start, end) and their text. */
interface KvsCachedBlockDict {
  block: number;
  start: number;
  end: number;
  text: string;
}

/** A scheduled request's block table in another KV cache group (a sliding window's). */
interface KvsSlotGroupTableDict {
  label: string;
  block_table: Array<number>;
}

/** One row of RunSummary.rows(): a class's tokens and their share of the prompt tokens. */
interface KvsSummaryRowDict {
  class: string;
  label: string;
  tokens: number;
  share: number;
}

/** One miss class as the why panel's legend shows it (explorer.why.CLASSES). */
interface KvsClassLookDict {
  key: string;
  label: string;
  tip: string;
}

/** `ProofReport.to_dict()` (explorer.why.proof): the tokens of each class the replays proved. */
interface KvsProofReportDict {
  proven: {[key: string]: number};
  unproven: {[key: string]: number};
  preemptions: number;
  preemptions_removed: number;
  notes: Array<string>;
  replays: KvsReplayLabelsDict;
}

/** One admission of the why panel's request (Admission, its evictions and divergence in words). */
interface KvsWhyAdmissionDict {
  step: number;
  tokens: number;
  hit: number;
  resumed: boolean;
  classes: {[key: string]: number};
  spans: Array<Array<number | string>>;
  divergence: KvsWhyDivergenceDict | null;
  evictions: Array<string>;
  lost: number;
  notes: Array<string>;
  seen: number;
  seen_by: string | null;
}

/** One preemption of the why panel's request, in words, with its proof. */
interface KvsWhyPreemptionDict {
  text: string;
  proof: KvsPreemptionProofDict | null;
}

/** One class's proof for one request (RequestWhy.proofs[class]). */
interface KvsProofDict {
  verdict: string;
  tokens: number;
  proven: number;
  says: string;
  replay?: string | null;
  control?: string | null;
  control_hit?: number | null;
  replay_hit?: number | null;
  resumed?: number | null;
}

/** What a run is (the panel's `runs` entry): its label, and its settings (explorer.core.recording.SettingsDict). */
interface KvsWhatIfRunLabelDict {
  label: string;
  settings: {[key: string]: unknown};
}

/** One run's columns, one entry per step (the panel's `steps` entry). */
interface KvsWhatIfRunDict {
  step: Array<number>;
  time: Array<number | null>;
  kv_usage: Array<number>;
  free_blocks: Array<number>;
  num_waiting: Array<number>;
  num_running: Array<number>;
  scheduled: Array<Array<Array<string | number>>>;
  preempted: Array<Array<Array<string | null>>>;
  waiting: Array<Array<string>>;
  finished: Array<Array<string>>;
}

/** One eviction of a prefix-tree node, up to the shown step. */
interface KvsTreeEvictionDict {
  step: number;
  by: string | null;
  block: number;
  age_steps: number | null;
  age_s: number | null;
}

/** What this step scheduled for a queue card's request (its ScheduledDict's fields, None where absent). */
interface KvsQueueScheduledDict {
  num_tokens: number | null;
  num_computed_before: number | null;
  is_prefill: boolean | null;
  num_cached_tokens: number | null;
  chunk_index: number | null;
}

/** A queue card's why column (`queues_state`'s `why`: explorer.ui.why_view.why_rows). */
interface KvsWhyRowDict {
  text: string;
  cls: string;
}

/** What each replay changed, by its name: 'recorded' and 'big' always, the others where they ran. */
interface KvsReplayLabelsDict {
  recorded?: string;
  big?: string;
  small?: string;
  plain?: string;
  full?: string;
  one_group?: string;
}

/** Where an admission leaves the longest prefix it shares with an earlier request, in words. */
interface KvsWhyDivergenceDict {
  position: number;
  text: string;
  other_request: string | null;
  other_text: string | null;
  before: string;
  other_known: boolean;
}

/** A preemption's proof (PreemptionWhy.proof). */
interface KvsPreemptionProofDict {
  replayed: boolean;
  for_request: string | null;
  removed: boolean;
  replay: string;
  verdict: string;
  says: string;
}

/** Each panel's state by the panel's name. */
interface KvsPanelStates {
  "attention": KvsAttentionChoices & KvsAttentionWeights;
  "blocks": KvsBlockPoolCells & KvsBlockPoolLegend & KvsBlockPoolTables;
  "controls": KvsControlsStatus & KvsControlsHistory & KvsControlsError & KvsControlsCaption & KvsControlsKnobs;
  "follow": KvsFollowState;
  "latency": KvsLatencyState;
  "tree": KvsPrefixTreeState;
  "queues": KvsQueuesState;
  "sampler": KvsSamplerState;
  "slots": KvsSlotMappingState;
  "tensor_parallel": KvsTensorParallelState;
  "timeline": KvsTimelineState;
  "why": KvsWhySummaryState & KvsWhyRequestState;
  "fleet": KvsFleetDrawState;
  "whatif": KvsWhatIfStateDict;
}
