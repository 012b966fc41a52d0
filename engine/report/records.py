"""What the engine reports: one StepRecord per step, and EngineSnapshot for the full state.
Both are plain dataclasses whose to_dict() is JSON-able (the explorer's only input); their
dict shapes and keys are defined in engine/report/schema.py."""
from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from ..config import SCHEDULER_KNOBS, EngineConfig
from ..core.block_pool import NULL_BLOCK_ID, BlockEvents, BlockPool
from ..core.hashing import hash_hex
from ..core.scheduler import Scheduler, SchedulerOutput
from ..request import Request, RequestStatus
from ..runner.batch import Batch, SampleResult
from .list_prefix import ListPrefix
from .schema import (
    BATCH,
    BLOCK,
    EV,
    METRICS,
    POOL,
    QUEUE,
    REC,
    REQ,
    SAMPLE,
    SCHED,
    SNAP,
    TIME,
    BatchDict,
    BlockDict,
    BlockEventsDict,
    BlockPoolDict,
    BudgetsDict,
    ChangesDict,
    EngineMetricsDict,
    EngineSnapshotDict,
    ModelInfoDict,
    QueuesDict,
    RequestDict,
    RequestFieldsDict,
    SampledDict,
    ScheduledAheadDict,
    ScheduledDict,
    StepRecordDict,
    TimingsDict,
)

if TYPE_CHECKING:  # the model side (torch): only its type is read here, so a replay without a model imports this
    from ..runner.model_runner import ModelRunnerOutput

Decode = Callable[[Sequence[int]], str]  # token ids -> text (engine.tokenizer.fast_decoder)


def empty_batch() -> BatchDict:
    """The batch of a step that recorded none."""
    return {BATCH.INPUT_IDS: [], BATCH.POSITIONS: [], BATCH.QUERY_START_LOC: [], BATCH.SEQ_LENS: [],
            BATCH.SLOT_MAPPING: [], BATCH.BLOCK_TABLES: [], BATCH.LOGITS_INDICES: []}


def batch_dict(batch: Batch) -> BatchDict:
    """The StepRecord's `batch`: the batch's own lists, built for this step alone (the record
    shares them), but for group 0's tables, the requests' own lists (runner/batch.py): each a
    view of its list at its length in this step (list_prefix.py), so a history holds every
    table once, not once a step."""
    tables: list[Sequence[int]] = list(batch.block_tables) if batch.block_table_lens is None else \
        [ListPrefix(t, n) for t, n in zip(batch.block_tables, batch.block_table_lens)]
    out: BatchDict = {
        BATCH.INPUT_IDS: batch.input_ids, BATCH.POSITIONS: batch.positions,
        BATCH.QUERY_START_LOC: batch.query_start_loc, BATCH.SEQ_LENS: batch.seq_lens,
        BATCH.SLOT_MAPPING: batch.slot_mapping, BATCH.BLOCK_TABLES: tables, BATCH.LOGITS_INDICES: batch.logits_indices}
    if batch.group_block_tables:
        out[BATCH.GROUP_SLOT_MAPPINGS] = batch.group_slot_mappings
        out[BATCH.GROUP_BLOCK_TABLES] = batch.group_block_tables
    return out


def changes_to_come() -> ChangesDict:
    """What a StepRecord holds until its producer sets the step's changes, which every producer
    does before the record leaves it (a lean engine's records keep it: EngineConfig.record_steps):
    an empty placeholder, not yet a ChangesDict."""
    return cast("ChangesDict", {})


@dataclass
class StepRecord:
    """What one `step()` did: the schedule, the packed batch, sampled tokens, block events."""

    step: int
    scheduled: list[ScheduledDict] = field(default_factory=list)
    batch: BatchDict = field(default_factory=empty_batch)
    sampled: dict[str, SampledDict] = field(default_factory=dict)
    preempted: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    new_requests: list[str] = field(default_factory=list)
    blocks: BlockEventsDict = field(default_factory=lambda: BlockEvents().to_dict())
    num_free_blocks: int = 0
    timings_ms: TimingsDict = field(default_factory=lambda: TimingsDict())
    engine_time_s: float = 0.0
    wall_time_s: float = 0.0
    token_budget: int = 0
    num_running: int = 0
    num_waiting: int = 0
    # The scheduler knobs this step ran under (keys: engine.config.SCHEDULER_KNOBS); they
    # may change between steps, so a view of an old step shows the budgets it had.
    budgets: BudgetsDict = field(default_factory=lambda: BudgetsDict())
    # Where `batch` comes from: "runner" (the runner's own inputs), "scheduler" (derived from
    # the scheduler's block tables), None (no batch recorded).
    batch_source: str | None = None
    scheduled_ahead: ScheduledAheadDict | None = None   # async scheduling (the schema's StepRecordDict)
    # What the step changed in the engine's state (engine/report/changes.py: apply).
    changes: ChangesDict = field(default_factory=changes_to_come)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StepRecord:
        """A StepRecord around a record dict (a live feed's): its parts are used as they are;
        keys it lacks keep their defaults, keys that are not the record's are left out."""
        return cls(**{k: v for k, v in d.items() if k in REC.ALL})

    @staticmethod
    def budgets_of(config: Any) -> BudgetsDict:
        """The scheduler knobs of `config` (an EngineConfig, or anything with those fields).
        SCHEDULER_KNOBS are BudgetsDict's keys (engine/report/schema.py checks it at import)."""
        return cast("BudgetsDict", {k: getattr(config, k) for k in SCHEDULER_KNOBS if hasattr(config, k)})

    @property
    def num_batched_tokens(self) -> int:
        return sum(s[SCHED.NUM_TOKENS] for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    def to_dict(self) -> StepRecordDict:
        """The record as its dict, sharing its parts: every producer builds them for this record
        alone and leaves them alone once the record is out, so a Session (which keeps the dict)
        copies nothing: a copy of a large step's batch and top-k lists costs about what the
        step's changes do (docs/performance.md, "The Session's own work")."""
        return {
            REC.STEP: self.step, REC.SCHEDULED: self.scheduled, REC.BATCH: self.batch, REC.SAMPLED: self.sampled,
            REC.PREEMPTED: self.preempted, REC.FINISHED: self.finished, REC.NEW_REQUESTS: self.new_requests,
            REC.BLOCKS: self.blocks, REC.NUM_FREE_BLOCKS: self.num_free_blocks, REC.TIMINGS_MS: self.timings_ms,
            REC.ENGINE_TIME_S: self.engine_time_s, REC.WALL_TIME_S: self.wall_time_s,
            REC.TOKEN_BUDGET: self.token_budget, REC.NUM_RUNNING: self.num_running, REC.NUM_WAITING: self.num_waiting,
            REC.BUDGETS: self.budgets, REC.BATCH_SOURCE: self.batch_source,
            REC.SCHEDULED_AHEAD: self.scheduled_ahead, REC.CHANGES: self.changes,
        }


def group_fields(req: Request) -> RequestFieldsDict:
    """A request's tables in the KV cache groups past the first and every group's hit (nothing in
    an engine of one group; the engine gives each request of a multi-group one a hit per group)."""
    hits = req.group_hit_tokens
    return group_fields_of(len(hits), req.extra_block_tables, hits)


def group_fields_of(num_groups: int, tables: Sequence[Sequence[int]] | None,
                    hits: Sequence[int] | None) -> RequestFieldsDict:
    """The RequestDict fields of a model of `num_groups` KV cache groups (none for one): the
    request's `tables` past the first group (None or empty: it holds no blocks) and each group's
    own prefix hit at its admission (None: not admitted yet). Every producer's, one spelling."""
    if num_groups < 2:
        return cast(RequestFieldsDict, {})
    return cast(RequestFieldsDict, {
        REQ.GROUP_BLOCK_TABLES: [list(t) for t in tables] if tables else [[] for _ in range(num_groups - 1)],
        REQ.GROUP_HIT_TOKENS: list(hits) if hits else [0] * num_groups})


def _events_copy(e: BlockEventsDict) -> BlockEventsDict:
    return {EV.ALLOCATED: list(e[EV.ALLOCATED]), EV.FREED: list(e[EV.FREED]), EV.CACHED: list(e[EV.CACHED]),
            EV.HITS: list(e[EV.HITS]), EV.EVICTED: list(e[EV.EVICTED]), EV.SAME_STEP_HITS: list(e[EV.SAME_STEP_HITS])}


def request_dict(req: Request, decode: Decode) -> RequestDict:
    """One request as the snapshot shows it; `decode` turns token ids into text."""
    prompt_text = req.prompt_text if req.prompt_text is not None else req.cached_text("prompt", decode)
    return {
        REQ.REQUEST_ID: req.request_id,
        REQ.STATUS: req.status.value,
        REQ.PROMPT_TOKEN_IDS: list(req.prompt_token_ids),
        REQ.OUTPUT_TOKEN_IDS: list(req.output_token_ids),
        REQ.PROMPT_TEXT: prompt_text,
        REQ.OUTPUT_TEXT: req.cached_text("output", decode),
        REQ.NUM_COMPUTED_TOKENS: req.num_computed_tokens,
        REQ.NUM_CACHED_TOKENS: req.num_cached_tokens,
        REQ.BLOCK_TABLE: list(req.block_table),
        REQ.NUM_PREEMPTIONS: req.num_preemptions,
        REQ.FINISH_REASON: req.finish_reason,
        REQ.MAX_TOKENS: req.params.max_tokens,
        REQ.SAMPLING_PARAMS: req.params.to_dict(),
        REQ.PRIORITY: 0,  # kvscope's policies order by arrival
        REQ.METRICS: req.metrics.to_dict(),
        **group_fields(req),
    }


@dataclass
class EngineSnapshot:
    """The engine's whole state after a step: queues, every block of the pool, metrics."""

    step: int
    config: dict[str, Any]
    model_info: ModelInfoDict
    metrics: EngineMetricsDict
    queues: QueuesDict
    block_pool: BlockPoolDict

    def to_dict(self) -> EngineSnapshotDict:
        return {SNAP.STEP: self.step, SNAP.CONFIG: dict(self.config), SNAP.MODEL_INFO: self.model_info.copy(),
                SNAP.METRICS: self.metrics.copy(), SNAP.QUEUES: self.queues, SNAP.BLOCK_POOL: self.block_pool}

    @classmethod
    def from_dict(cls, d: EngineSnapshotDict) -> EngineSnapshot:
        """An EngineSnapshot around a snapshot dict (a live feed's): its parts are used as they are."""
        return cls(step=d[SNAP.STEP], config=d[SNAP.CONFIG], model_info=d[SNAP.MODEL_INFO], metrics=d[SNAP.METRICS],
                   queues=d[SNAP.QUEUES], block_pool=d[SNAP.BLOCK_POOL])


@contextmanager
def gc_paused() -> Iterator[None]:
    """Build many small acyclic containers (a snapshot: a dict per block and per request)
    without Python's cyclic GC: its collections, triggered every few hundred allocations,
    scan every object the process holds (an explorer's whole history), and made a snapshot
    of a 2,912-block pool take 61 ms instead of 7 ms."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def block_pool_dict(pool: BlockPool, block_size: int, live: list[Request]) -> BlockPoolDict:
    """Every block 0..num_blocks-1 with refcount, hash, owners and the token ids it holds."""
    return {POOL.NUM_BLOCKS: pool.num_blocks, POOL.BLOCK_SIZE: block_size,
            POOL.NUM_FREE_BLOCKS: pool.num_free_blocks, POOL.BLOCKS: block_dicts(pool, block_size, live)}


def block_dicts(pool: BlockPool, block_size: int, live: list[Request], only: set[int] | None = None,
                holders: Mapping[int, tuple[Request, int]] | None = None) -> list[BlockDict]:
    """The dicts of every block (or of the block ids in `only`, in id order); a block's owners
    are the `live` requests holding it, its tokens those of its first owner (else its cached ones).
    `holders`: block id -> (a request, the block's index in its table) known to hold it (a step's
    scheduled request, for the blocks its new tokens went into). A block that one running request
    holds (ref count 1) is then its own answer; only the others are searched for in every table,
    so a decode step's record costs O(its blocks), not O(every table)."""
    owners: dict[int, list[str]] = {}
    tokens: dict[int, list[int]] = {}

    def own(req: Request, i: int, b: int) -> None:
        owners.setdefault(b, []).append(req.request_id)
        if b not in tokens:
            lo = i * block_size
            tokens[b] = req.all_token_ids[lo:min(lo + block_size, req.num_computed_tokens)]

    search = only
    if only is not None and holders:
        search = set()
        for b in only:
            ref, held = pool.blocks[b].ref_count, holders.get(b)
            if ref == 1 and held is not None and held[0].status == RequestStatus.RUNNING \
                    and held[0].block_table[held[1]] == b:
                own(held[0], held[1], b)
            elif ref > 0:   # held by requests the hints do not name (a free block has no owner)
                search.add(b)
    if search is None or search:
        for req in live:
            for table in (req.block_table, *req.extra_block_tables):  # every KV cache group's
                for i, b in enumerate(table):
                    if b != NULL_BLOCK_ID and (search is None or b in search):
                        own(req, i, b)
    blocks: list[BlockDict] = []
    for blk in (pool.blocks if only is None else [pool.blocks[b] for b in sorted(only)]):
        b = blk.block_id
        kept = tokens.get(b)   # a slice of its owner's tokens, the dict's own (the pool's tuple becomes a list)
        blocks.append({
            BLOCK.BLOCK_ID: b, BLOCK.REF_COUNT: blk.ref_count, BLOCK.HASH: hash_hex(blk.block_hash),
            BLOCK.TOKEN_IDS: kept if kept is not None else list(blk.token_ids), BLOCK.OWNERS: owners.get(b, []),
            BLOCK.IS_NULL: b == 0, BLOCK.IS_FREE: pool.is_free(b),
        })
    return blocks


def step_record(step: int, out: SchedulerOutput, batch: Batch | None, ran: ModelRunnerOutput | None,
                sampled_rows: list[Request], results: list[SampleResult], finished: list[str],
                timings: TimingsDict, *, scheduler: Scheduler, config: EngineConfig, backend: str,
                engine_time: float, decode: Decode) -> StepRecord:
    """The StepRecord of one step, from what the step's calls returned: the scheduler's output,
    the packed batch (None: nothing ran), the runner's output, the sampled rows and results,
    the finished ids and the phase times (ms). It takes the pool's block events."""
    lean = not config.record_steps  # lean: no batch or token text (a benchmark's throughput)
    rec = StepRecord(step=step)
    rec.scheduled = [{SCHED.REQUEST_ID: s.request.request_id, SCHED.NUM_TOKENS: s.num_tokens,
                      SCHED.NUM_COMPUTED_BEFORE: s.num_computed_before, SCHED.IS_PREFILL: s.is_prefill,
                      SCHED.NUM_CACHED_TOKENS: s.num_cached_tokens, SCHED.CHUNK_INDEX: s.chunk_index}
                     for s in out.scheduled]
    if batch is not None and not lean:
        rec.batch = batch_dict(batch)
        rec.batch_source = "runner"
    rec.sampled = {r.request_id: {SAMPLE.TOKEN_ID: res.token_id, SAMPLE.TEXT: None if lean else decode([res.token_id]),
                                  SAMPLE.TOP: res.top}
                   for r, res in zip(sampled_rows, results)}
    rec.preempted, rec.finished, rec.new_requests = list(out.preempted), finished, list(out.new_requests)
    rec.blocks = scheduler.kv.pool.take_events().to_dict()
    rec.num_free_blocks = scheduler.kv.pool.num_free_blocks
    rec.timings_ms = {**timings, TIME.BACKEND: backend,
                      TIME.CUDA_GRAPH_BUCKET: ran.cuda_graph_bucket if ran is not None else None,
                      TIME.FORWARD_PATH: ran.forward_path if ran is not None else "eager"}
    rec.engine_time_s = engine_time
    rec.wall_time_s = time.time()
    rec.token_budget = out.token_budget
    rec.budgets = rec.budgets_of(config)
    rec.num_running, rec.num_waiting = len(scheduler.running), len(scheduler.waiting)
    return rec


def engine_metrics(step: int, engine_time: float, scheduler: Scheduler) -> EngineMetricsDict:
    """The engine's counters after `step` steps (`engine_time` seconds inside them)."""
    kv = scheduler.kv
    return {METRICS.NUM_STEPS: step, METRICS.ENGINE_TIME_S: engine_time,
            METRICS.PREFIX_CACHE_HITS: kv.prefix_cache_hits, METRICS.PREFIX_CACHE_QUERIES: kv.prefix_cache_queries,
            METRICS.KV_CACHE_USAGE: kv.pool.usage, METRICS.NUM_PREEMPTIONS: scheduler.num_preemptions,
            METRICS.NUM_GENERATED_TOKENS: scheduler.num_generated_tokens,
            METRICS.NUM_PROMPT_TOKENS_COMPUTED: scheduler.num_computed_prompt_tokens}


def engine_snapshot(step: int, config: EngineConfig, model_info: ModelInfoDict, metrics: EngineMetricsDict,
                    scheduler: Scheduler, decode: Decode) -> EngineSnapshot:
    """The whole state after a step: config, model facts, metrics, the three queues and every block."""
    with gc_paused():
        return EngineSnapshot(
            step=step, config=config.to_dict(), model_info=model_info, metrics=metrics,
            queues={QUEUE.WAITING: [request_dict(r, decode) for r in scheduler.waiting],
                    QUEUE.RUNNING: [request_dict(r, decode) for r in scheduler.running],
                    QUEUE.FINISHED: [request_dict(r, decode) for r in scheduler.finished]},
            block_pool=block_pool_dict(scheduler.kv.pool, config.block_size, list(scheduler.running)))
