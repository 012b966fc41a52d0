"""The StepRecord / EngineSnapshot dict schema: the one definition of their keys.

Every producer (kvscope's engine in engine/report/records.py, the vLLM drivers in
explorer/) emits these shapes, and every consumer (explorer.ui.views, explorer.core.history,
export, the panels' JavaScript) reads them. Each shape is a TypedDict: its annotations
are the keys, defined here (the block events' keys are engine.core.block_pool.BlockEvents'
fields: BlockEventsDict is defined next to it, in the layer below). Producers return these
types and consumers take them, so mypy checks every key and value that crosses.

Code reads and writes keys through the constants of engine/report/keys.py
(`SCHED.NUM_TOKENS == "num_tokens"`, each re-exported here), or as literal keys of a value
typed with its shape: either way a misspelt or renamed key is a type error where it is used,
not a silent missing `.get()`; this module checks at import that the constants list exactly
each shape's keys. `problems(value, shape)` lists every key a dict has that its shape does not
define (tests run the producers through it), and `widget_schema()` is what the panels'
JavaScript gets: widgets/_schema.js is generated from it (`python -m engine.report --write`; a
test checks that the file is current).

Shapes whose keys belong to another definition stay open here: `config` (the engine's
config dataclass: EngineConfig, or explorer's VllmConfig), `sampling_params`
(SamplingParams' fields) and the tensor-parallel facts (engine/report/model_info.py).
"""
from __future__ import annotations

import dataclasses
import json
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict, Union

from ..config import SCHEDULER_KNOBS
from ..core.block_pool import BlockEvents, BlockEventsDict
from .keys import (
    AHEAD,
    BATCH,
    BLOCK,
    BUDGET,
    CCHANGE,
    CHANGES,
    CLOCK,
    DECODES,
    EV,
    INFO,
    METRICS,
    POOL,
    QUEUE,
    RCHANGE,
    REC,
    REQ,
    RMETRICS,
    SAMPLE,
    SCHED,
    SNAP,
    TIME,
    Keys,
)
from .list_prefix import ListPrefix

# -- StepRecord ------------------------------------------------------------------------------------


class ScheduledDict(TypedDict):
    """One entry of `StepRecord.scheduled`: what the step computed for one request."""
    request_id: str
    num_tokens: int
    num_computed_before: int  # KV that existed before the step, prefix-cache hits included
    is_prefill: bool
    num_cached_tokens: int    # prefix-cache hits when admitted in this step (0 otherwise)
    chunk_index: int | None   # which prefill chunk (from 0); None for a decode


# A token id an observer never saw: a live feed that carries no token ids, or a position whose
# token the device sampled and vLLM then dropped (its request ended while the step ran).
UNKNOWN_TOKEN = -1


class _BatchFields(TypedDict):
    """The keys every BatchDict has."""
    input_ids: list[int]
    positions: list[int]
    query_start_loc: list[int]
    seq_lens: list[int]
    slot_mapping: list[int]
    block_tables: list[Sequence[int]]   # kvscope's engine: views of the requests' tables (records.batch_dict)
    logits_indices: list[int]


class BatchDict(_BatchFields, total=False):
    """The packed batch (vLLM v1's names); `block_tables` per scheduled request, valid entries
    only. Those of KV cache group 0 (full attention); a model with more groups (sliding-window
    layers) adds each other group's slot mapping and block tables, in group order."""
    group_slot_mappings: list[list[int]]
    group_block_tables: list[list[list[int]]]


class SampledDict(TypedDict):
    """One sampled token: `top` lists (token_id, probability) candidates, best first (pairs,
    not lists: a tuple of numbers is left out of the garbage collector's walks, and the sampler
    makes them so; JSON writes each as a list)."""
    token_id: int | None   # None where a live feed leaves token ids out (KVSCOPE_FEED_TOKENS=0)
    text: str | None
    top: list[tuple[int, float]]


class TimingsDict(TypedDict, total=False):
    """Milliseconds per phase, plus how the forward ran."""
    schedule: float
    prepare: float
    forward: float
    sample: float
    update: float
    total: float
    collectives: float       # part of forward: rank 0's wait in all-reduce / gather
    explorer_record: float   # the vLLM driver's own cost of building the record
    backend: str | None
    cuda_graph_bucket: int | None
    forward_path: str        # 'eager' | 'cuda_graph' | 'native_decode'


class BudgetsDict(TypedDict, total=False):
    """The scheduler knobs the step ran under (engine.config.SCHEDULER_KNOBS)."""
    max_num_batched_tokens: int
    max_num_seqs: int
    enable_chunked_prefill: bool
    enable_prefix_caching: bool
    scheduler_reserve_full_isl: bool
    scheduling_policy: str


class ScheduledAheadDict(TypedDict):
    """A step scheduled before the step in flight had sampled (async scheduling, vLLM's
    AsyncScheduler): its decode inputs were placeholders for that step's tokens."""
    in_flight_step: int            # the step that still ran when this one was scheduled
    # request id -> the token its placeholder input turned out to be (UNKNOWN_TOKEN where the
    # observer has no token ids); a request whose token was dropped (it ended meanwhile) is left out
    placeholders: dict[str, int]


class StepRecordDict(TypedDict):
    """`StepRecord.to_dict()`: what one `step()` did."""
    step: int
    scheduled: list[ScheduledDict]
    batch: BatchDict
    sampled: dict[str, SampledDict]
    preempted: list[str]
    finished: list[str]
    new_requests: list[str]
    blocks: BlockEventsDict
    num_free_blocks: int     # after the step's frees
    timings_ms: TimingsDict
    engine_time_s: float     # the engine clock after this step
    wall_time_s: float
    token_budget: int
    num_running: int
    num_waiting: int
    budgets: BudgetsDict
    # Where `batch` comes from: "runner" (the model runner's own inputs), "scheduler" (derived
    # from the scheduler's block tables: a live server's runner is in other processes or on a
    # GPU), None (no batch recorded).
    batch_source: str | None
    # Async scheduling: this step was scheduled while `in_flight_step` still ran (None: with
    # nothing in flight). Its state, as every record's, is after the step that landed.
    scheduled_ahead: ScheduledAheadDict | None
    changes: ChangesDict   # what the step changed in the engine's state (apply() below)


# -- EngineSnapshot --------------------------------------------------------------------------------


class ClockLatenciesDict(TypedDict):
    """vLLM's per-request metrics, derived from one clock's event times (ClockEvents.derived)."""
    time_to_first_token: float | None
    inter_token_latency: Sequence[float]
    time_per_output_token: float | None
    e2e_request_latency: float | None
    request_queue_time: float | None


class ClockDict(TypedDict):
    """One request's event times on one clock (seconds), and vLLM's metrics derived from them.
    The growing lists are Sequences: a history's snapshots hold them as ListPrefix views."""
    arrival_time: float | None
    first_scheduled_time: float | None
    first_token_time: float | None
    token_times: Sequence[float]
    preempted_times: list[float]
    finished_time: float | None
    time_to_first_token: float | None
    inter_token_latency: Sequence[float]
    time_per_output_token: float | None
    e2e_request_latency: float | None
    request_queue_time: float | None


class RequestMetricsDict(TypedDict):
    """A request's latency marks on two clocks (RequestMetrics.to_dict)."""
    engine: ClockDict   # advances only while a step executes
    wall: ClockDict


class _RequestFields(TypedDict):
    """One request in a snapshot's queues (every key but the optional ones of RequestDict)."""
    request_id: str
    status: str          # engine.request.RequestStatus' values
    prompt_token_ids: list[int]
    output_token_ids: Sequence[int]   # growing lists: ListPrefix views in a history (list_prefix.py)
    prompt_text: str | None
    output_text: str
    num_computed_tokens: int
    num_cached_tokens: int
    block_table: Sequence[int]
    num_preemptions: int
    finish_reason: str | None
    max_tokens: int
    sampling_params: dict[str, Any]   # SamplingParams' fields
    priority: int                     # vLLM's scheduling priority (lower first); 0 in kvscope's engine
    metrics: RequestMetricsDict


class RequestDict(_RequestFields, total=False):
    """One request in a snapshot's queues; the two counts only where its token ids are left
    out (a live feed with KVSCOPE_FEED_TOKENS=0); its hash domain only where it has one (vLLM:
    a cache_salt or a LoRA adapter make its block hashes differ from the same tokens' without)."""
    num_prompt_tokens: int
    num_output_tokens: int
    cache_salt: str        # vLLM's Request.cache_salt, where set
    lora_name: str         # vLLM's Request.lora_request.lora_name, where set
    # A model with several KV cache groups (model_info's kv_cache_groups): the request's block
    # table in each group after the first (the null block 0 where blocks left a sliding window),
    # and each group's own prefix-hit length when it was admitted (the hit is the shortest).
    group_block_tables: list[list[int]]
    group_hit_tokens: list[int]


class QueuesDict(TypedDict):
    """The scheduler's queues after a step, each request as a RequestDict."""
    waiting: list[RequestDict]
    running: list[RequestDict]
    finished: list[RequestDict]   # every finished request of the engine's life


class BlockDict(TypedDict):
    """One physical block, 0 .. num_blocks-1 (block 0 is the null block)."""
    block_id: int
    ref_count: int
    hash: str | None      # 16 hex digits, or None when not cached
    token_ids: list[int]
    owners: list[str]     # the running requests whose block tables hold it
    is_null: bool
    is_free: bool


class BlockPoolDict(TypedDict):
    """The block pool after a step: its size and every block's state."""
    num_blocks: int
    block_size: int
    num_free_blocks: int
    blocks: list[BlockDict]


class EngineMetricsDict(TypedDict):
    """Engine-wide counters since start (EngineMetrics.to_dict)."""
    num_steps: int
    engine_time_s: float
    kv_cache_usage: float
    prefix_cache_hits: int
    prefix_cache_queries: int
    num_preemptions: int
    num_generated_tokens: int
    num_prompt_tokens_computed: int


class _KVCacheGroupFields(TypedDict):
    kind: str                   # "full_attention", "sliding_window" or "mamba" (kv_cache_groups.kv_cache_group)
    sliding_window: int | None  # tokens, for a sliding_window group
    layers: list[int]           # the layers whose KV the group holds (empty where no model says)


class KVCacheGroupDict(_KVCacheGroupFields, total=False):
    """One of model_info's kv_cache_groups, in kvscope's order (full attention first)."""
    vllm_group: int   # a vLLM driver's: the group's index in vLLM's kv_cache_groups (the order a replay allocates)


class ModelInfoDict(TypedDict, total=False):
    """What the header and panels say about the model and how it runs (engine/report/model_info.py)."""
    engine: str             # set by engines other than kvscope's ("vLLM 0.32.0")
    engine_version: str
    name: str
    architecture: str | None
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    dtype: str
    compute_dtype: str
    device: str
    max_model_len: int
    attention_backend: str | None
    cuda_graphs: Any
    cuda_graphs_off: str | None
    native_decode: int | None
    native_decode_off: str | None
    native_linear_rows: int | None   # a CPU linear of up to this many rows runs on the native panels
    native_rows_source: str | None   # where both limits come from (runner/crossover.py's describe())
    cpu_gemm_dtype: str | None
    kv_bytes_per_block: int | None
    intermediate_size: int | None
    tie_word_embeddings: bool | None
    tensor_parallel_size: int
    pipeline_parallel_size: int
    data_parallel_size: int
    data_parallel_rank: int
    async_scheduling: bool
    model_path: str
    tp_backend: str | None
    num_heads_per_rank: int
    num_kv_heads_per_rank: int
    kv_bytes_per_block_per_rank: int
    kv_bytes_per_rank: int
    tensor_parallel: dict[str, Any]   # per-rank facts (engine/report/model_info.py)
    live: bool              # a live server's recorder says so (its times are on the wall clock)
    kv_cache_groups: list[KVCacheGroupDict]   # one per KV cache group, as vLLM's kv_cache_groups


class EngineSnapshotDict(TypedDict):
    """`EngineSnapshot.to_dict()`: the engine's whole state after a step."""
    step: int
    config: dict[str, Any]   # the engine config dataclass' fields
    model_info: ModelInfoDict
    metrics: EngineMetricsDict
    queues: QueuesDict
    block_pool: BlockPoolDict


# -- a step's changes (engine/report/changes.py applies them) --------------------------------------


class ClockChangeDict(TypedDict):
    """One clock of a request's metrics as a change: its event times, `token_times` as a tail
    (from index `token_times_from` on); the consumer derives the latencies (ClockEvents)."""
    arrival_time: float | None
    first_scheduled_time: float | None
    first_token_time: float | None
    finished_time: float | None
    preempted_times: list[float]
    token_times_from: int
    token_times_tail: list[float]


class _RequestStateFields(TypedDict):
    """The state fields every request change has (RequestFieldsDict adds the optional ones)."""
    request_id: str
    status: str
    num_computed_tokens: int
    num_cached_tokens: int
    num_preemptions: int
    finish_reason: str | None


class RequestFieldsDict(_RequestStateFields, total=False):
    """A request's fields as a producer hands them to changes.Sent.change, which adds the tails."""
    output_text: str              # where the producer spells tokens (not a live feed)
    prompt_token_ids: list[int]   # the first time only, with the four below
    prompt_text: str | None
    max_tokens: int
    sampling_params: dict[str, Any]
    priority: int
    cache_salt: str               # the first time only, where set (RequestDict)
    lora_name: str
    num_prompt_tokens: int        # token ids left out (KVSCOPE_FEED_TOKENS=0)
    num_output_tokens: int
    # Several KV cache groups: sent whole with each change (a sliding table is not append-only:
    # blocks that leave the window turn into the null block).
    group_block_tables: list[list[int]]
    group_hit_tokens: list[int]


class RequestChangeDict(RequestFieldsDict):
    """A request the step touched (not finished: those travel whole in `finished`). Its growing
    lists travel as tails: the output token ids from `output_from` on, the block table from
    `table_from` on. What never changes comes once, when the request is new to the consumer."""
    output_from: int
    output_tail: list[int]
    table_from: int
    table_tail: list[int]
    clocks: dict[str, ClockChangeDict]   # RMETRICS.ENGINE, RMETRICS.WALL


class DecodesDict(TypedDict):
    """The requests whose step was a plain decode, as columns, a row each: the consumer held the
    request and the step changed nothing of it but one more output token (`output_tokens`), its
    time on each clock, the computed count and the output text. One change for a batch of
    decodes, where a request change each cost a dict and two clock dicts a request a step."""
    request_ids: list[str]
    num_computed_tokens: list[int]
    output_tokens: list[int]
    output_texts: list[str]
    engine_token_times: list[float]
    wall_token_times: list[float]


class QueueOrderDict(TypedDict):
    """The waiting and running queues as request ids, in order."""
    waiting: list[str]
    running: list[str]


class _ChangesFields(TypedDict):
    """The keys every ChangesDict has."""
    step: int
    requests: dict[str, RequestChangeDict]
    queues: QueueOrderDict
    finished: list[RequestDict]        # requests that finished since, whole (each sent once)
    blocks: list[BlockDict]            # every block whose dict changed; `owners` is derived by apply
    num_free_blocks: int
    metrics: EngineMetricsDict


class ChangesDict(_ChangesFields, total=False):
    """What changed in the engine's state since the previous refresh point (the previous step's
    changes, or the snapshot the consumer started from): apply(snapshot, changes) is the state
    after it, for every engine."""
    config: dict[str, Any]          # when the config changed (live knobs)
    model_info: ModelInfoDict       # when the model facts changed
    snapshot: EngineSnapshotDict    # the whole state instead (steps were missed, or a restart)
    restart: str                    # why the history starts again (a new server run)
    decodes: DecodesDict            # the plain decodes, as columns (kvscope's engine, vLLM in process)


# -- key constants (engine/report/keys.py) --------------------------------------------------------
# Each shape's constants, checked here: they must list exactly the shape's keys, in its order.
KEYS_OF: dict[type[Keys], type] = {
    REC: StepRecordDict, SCHED: ScheduledDict, BATCH: BatchDict, SAMPLE: SampledDict, EV: BlockEventsDict,
    TIME: TimingsDict, BUDGET: BudgetsDict, SNAP: EngineSnapshotDict, QUEUE: QueuesDict, REQ: RequestDict,
    RMETRICS: RequestMetricsDict, CLOCK: ClockDict, POOL: BlockPoolDict, BLOCK: BlockDict, METRICS: EngineMetricsDict,
    INFO: ModelInfoDict, CHANGES: ChangesDict, RCHANGE: RequestChangeDict, CCHANGE: ClockChangeDict,
    DECODES: DecodesDict, AHEAD: ScheduledAheadDict}


def key_mismatches(keys: type[Keys], shape: type) -> str:
    """How `keys`' constants differ from `shape`'s keys ("" when they list them exactly, in order)."""
    want = tuple(shape.__annotations__)
    if keys.ALL == want:
        return ""
    missing, extra = [k for k in want if k not in keys.ALL], [k for k in keys.ALL if k not in want]
    return (f"{keys.__name__} lists {shape.__name__}'s keys " +
            (f"without {missing} and with {extra}" if missing or extra else f"out of order (its order: {list(want)})"))


def _check_keys() -> None:
    wrong = [m for m in (key_mismatches(k, s) for k, s in KEYS_OF.items()) if m]
    events = tuple(f.name for f in dataclasses.fields(BlockEvents))
    if events != EV.ALL:
        wrong.append(f"BlockEvents' fields {list(events)} are not BlockEventsDict's keys {list(EV.ALL)}")
    if set(SCHEDULER_KNOBS) != set(BUDGET.ALL):
        wrong.append(f"engine.config.SCHEDULER_KNOBS {list(SCHEDULER_KNOBS)} are not BudgetsDict's keys")
    if wrong:
        raise TypeError("engine/report/keys.py and the shapes disagree: " + "; ".join(wrong))


_check_keys()

# -- the block pool panel's byte columns -----------------------------------------------------------
# Status codes of its `status` column (one uint8 per block), and the bit of each block event in
# its `events` column. A same-step hit (a hit on a block hashed earlier in this same step) also
# carries the hit bit.
BLOCK_STATUS = {"null": 0, "free": 1, "free_cached": 2, "in_use": 3, "in_use_hashed": 4}
NULL, FREE, FREE_CACHED, IN_USE, IN_USE_HASHED = BLOCK_STATUS.values()
EVENT_BITS = {EV.ALLOCATED: 1, EV.HITS: 2, EV.FREED: 4, EV.EVICTED: 8, EV.CACHED: 16, EV.SAME_STEP_HITS: 32}
# What each event means, in the order legends list them.
EVENT_MEANINGS = {
    EV.ALLOCATED: ("allocated", "handed out to a request in this step"),
    EV.HITS: ("prefix hit", "prefix-cache hit: a request admitted in this step takes this block from the "
                            "cache instead of computing it"),
    EV.SAME_STEP_HITS: ("same-step hit", "hit on a block computed in this same step: its KV is written by "
                                         "this step's forward before any layer reads it"),
    EV.FREED: ("freed", "its last owner let go (finished, aborted or preempted)"),
    EV.EVICTED: ("evicted", "a cached block reused for new tokens: its hash is forgotten"),
    EV.CACHED: ("cached", "full, hashed and registered in the prefix cache in this step"),
}

# -- checking a producer ---------------------------------------------------------------------------
_HINTS: dict[type, dict[str, Any]] = {}


def _hints(shape: type) -> dict[str, Any]:
    if shape not in _HINTS:
        _HINTS[shape] = typing.get_type_hints(shape)
    return _HINTS[shape]


def problems(value: Any, shape: Any, path: str = "") -> list[str]:
    """Every key of `value` (recursively) that `shape` does not define, and every required
    key it lacks, as 'path: what' lines (empty: the value fits the schema)."""
    out: list[str] = []
    origin = typing.get_origin(shape)
    if value is None or shape is Any:
        return out
    if typing.is_typeddict(shape):
        if not isinstance(value, dict):
            return [f"{path or '.'}: a {type(value).__name__}, not a {shape.__name__} dict"]
        hints = _hints(shape)
        for key, sub in value.items():
            if key not in hints:
                out.append(f"{path}.{key}: not a key of {shape.__name__}")
            else:
                out.extend(problems(sub, hints[key], f"{path}.{key}"))
        missing = [k for k in shape.__required_keys__ if k not in value]
        if missing:
            out.append(f"{path or '.'}: {shape.__name__} lacks {missing}")
    elif origin in (list, Sequence) and isinstance(value, (list, ListPrefix)):
        (item,) = typing.get_args(shape)
        for i, sub in enumerate(value):
            out.extend(problems(sub, item, f"{path}[{i}]"))
    elif origin is dict and isinstance(value, dict):
        _, item = typing.get_args(shape)
        for key, sub in value.items():
            out.extend(problems(sub, item, f"{path}[{key!r}]"))
    elif origin in (Union, types.UnionType):
        dicts = [a for a in typing.get_args(shape) if a is not type(None)]
        if len(dicts) == 1:
            out.extend(problems(value, dicts[0], path))
    return out


def record_problems(record: Mapping[str, object]) -> list[str]:
    """`problems` of a StepRecord dict."""
    return problems(record, StepRecordDict, "record")


def snapshot_problems(snapshot: Mapping[str, object]) -> list[str]:
    return problems(snapshot, EngineSnapshotDict, "snapshot")


# -- the panels' copy ------------------------------------------------------------------------------
JS_PATH = Path(__file__).resolve().parents[2] / "widgets" / "_schema.js"


def widget_schema() -> dict[str, Any]:
    """What the panels read: the record keys they use, the block status codes, and each
    block event's key, bit, label and meaning in legend order."""
    return {"block_status": dict(BLOCK_STATUS),
            "block_events": [{"key": k, "bit": EVENT_BITS[k], "label": label, "tip": tip}
                             for k, (label, tip) in EVENT_MEANINGS.items()],
            "record": list(REC.ALL), "snapshot": list(SNAP.ALL), "request": list(REQ.ALL),
            "block": list(BLOCK.ALL)}


def widget_schema_js() -> str:
    """widgets/_schema.js: `const KVS_SCHEMA = {...};`, prepended to every panel's ESM."""
    return ("// Generated from engine/report/schema.py by `python -m engine.report --write`: do not edit.\n"
            "// The record keys, block status codes and block event bits the panels read.\n"
            f"const KVS_SCHEMA = {json.dumps(widget_schema(), indent=1)};\n")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--write"]:
        JS_PATH.write_text(widget_schema_js())
        print(f"wrote {JS_PATH}")
        return 0
    if args == ["--check"]:
        current = JS_PATH.read_text() if JS_PATH.exists() else ""
        ok = current == widget_schema_js()
        print("widgets/_schema.js is current" if ok else "widgets/_schema.js is stale: run with --write")
        return 0 if ok else 1
    print("usage: python -m engine.report --write | --check", file=sys.stderr)
    return 2
