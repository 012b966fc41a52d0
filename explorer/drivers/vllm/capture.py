"""What one vLLM step did, observed on vLLM's own objects while the step runs.

vLLM keeps no per-step record, so `StepCapture` wraps a few methods of the live objects
(instance attributes only: the classes and every other engine are untouched) and writes
down what they returned or changed:

- the scheduler's `schedule`: the `SchedulerOutput`, plus each scheduled request's token
  counts as they were when it was scheduled (`update_from_output` moves them on later);
- the block pool, through pool_notes.PoolNotes (the recorder's hooks too): the block ids vLLM
  allocated, hit, freed, cached and evicted, every block whose refcount or hash changed, and
  the tokens of each block it hashed;
- the model runner's `_prepare_inputs` / `execute_model` / `sample_tokens`: their times, and
  after `execute_model` the packed batch exactly as vLLM's buffers hold it (input ids,
  positions, query_start_loc, seq_lens, slot_mapping, block tables, the rows it samples).

Nothing here recomputes a number vLLM already has: every value is read, not derived.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.report.schema import BATCH, EV, BatchDict

from .pool_notes import PoolNotes

BLOCK_EVENTS = EV.ALL  # the StepRecord's block events, in their order


@dataclass
class Capture:
    """One step as observed. `batch` is None when no forward ran."""

    out: Any = None                                   # vLLM's SchedulerOutput
    # internal id -> (num_tokens, num_prompt_tokens) when scheduled
    counts: dict[str, tuple[int, int]] = field(default_factory=dict)
    token_budget: int = 0
    batch: BatchDict | None = None
    batch_req_ids: list[str] = field(default_factory=list)  # internal ids in the batch's row order
    # block event (BLOCK_EVENTS) -> block ids, in the order they happened
    blocks: dict[str, list[int]] = field(default_factory=lambda: {k: [] for k in BLOCK_EVENTS})
    cached_tokens: dict[int, list[int]] = field(default_factory=dict)  # block id -> the token ids vLLM hashed into it
    # Every block whose refcount or hash changed (pool_notes' `dirty`): a block that lost a
    # reference but is still shared among them, whose dict changed (owners, refcount) with no
    # "freed" event.
    dirty_blocks: set[int] = field(default_factory=set)
    # vLLM's phases (seconds): schedule, prepare, execute, sample, update
    seconds: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(("schedule", "prepare", "execute", "sample", "update"), 0.0))


class StepCapture:
    """Hooks on one vLLM engine core's scheduler, block pool and model runner.

    `now` is the capture events go to. Between `end()` and the next `begin()` it collects
    what happens outside a step (an abort's frees), which the next step then reports: blocks
    that change between steps show in the next record rather than vanish."""

    def __init__(self, scheduler: Any, runner: Any | None, executor: Any = None,
                 group_order: list[int] | None = None) -> None:
        self.scheduler = scheduler
        self.group_order = group_order  # vLLM's KV cache groups in kvscope's order (groups.KVGroups)
        self.pool = scheduler.kv_cache_manager.block_pool
        self.runner = runner  # None where the model runs in worker processes (tensor parallel)
        self.executor = executor
        self._originals: list[tuple[Any, str]] = []
        self._wrap(scheduler, "schedule", self._schedule)
        self._wrap(scheduler, "update_from_output", self._timed("update"))
        self.notes = PoolNotes(self.pool)
        self.now = self._next()
        if runner is not None:
            runner_hooks: list[tuple[str, Callable[..., Any]]] = [
                ("_prepare_inputs", self._timed("prepare")), ("execute_model", self._execute_model),
                ("sample_tokens", self._timed("sample"))]
            for name, hook in runner_hooks:
                self._wrap(runner, name, hook)

    def begin(self) -> Capture:
        """Right before vLLM's step: the step's capture, holding what happened since the last one."""
        self.notes.begin(self.now.blocks)  # a same-step hit is one on a block hashed from now on
        return self.now

    def end(self) -> Capture:
        """After vLLM's step: its capture (with the model in worker processes, rank 0's batch
        asked for); events from now on go to the next step's."""
        done = self.now
        out = done.out
        if self.runner is None and self.executor is not None and out is not None and out.total_num_scheduled_tokens:
            done.batch_req_ids, done.batch = self.executor.collective_rpc(
                rank0_batch, args=(out.total_num_scheduled_tokens, self.group_order), unique_reply_rank=0)
        _, cached, cleared = self.notes.take()  # done.dirty_blocks is the set the hooks filled till now
        if cleared:
            done.dirty_blocks = set(range(len(self.pool.blocks)))
        for request, pairs, block_size in cached:
            ids = request.all_token_ids  # a full block's tokens stay as they were when it was hashed
            for b, i in pairs:
                done.cached_tokens[b] = list(ids[i * block_size:(i + 1) * block_size])
        self.now = self._next()
        return done

    def _next(self) -> Capture:
        """The capture events go to from now on: its block events and changed blocks are the
        lists and the set the pool's hooks fill (read live between steps, after an abort)."""
        cap = Capture(dirty_blocks=self.notes.dirty)
        self.notes.begin(cap.blocks)
        return cap

    def close(self) -> None:
        """Put vLLM's own methods back."""
        self.notes.close()
        for obj, name in self._originals:
            obj.__dict__.pop(name, None)
        self._originals.clear()

    # -- wrapping -------------------------------------------------------------------------
    def _wrap(self, obj: Any, name: str, hook: Callable[..., Any]) -> None:
        original = getattr(obj, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return hook(original, *args, **kwargs)

        setattr(obj, name, wrapper)
        self._originals.append((obj, name))

    def _timed(self, key: str) -> Callable[..., Any]:
        """A hook that only adds the wrapped call's time to the step's `seconds[key]`."""

        def hook(original, *args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.now.seconds[key] += time.perf_counter() - t0

        return hook

    # -- scheduler ------------------------------------------------------------------------
    def _schedule(self, original, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        out = original(*args, **kwargs)
        self.now.seconds["schedule"] += time.perf_counter() - t0
        requests = self.scheduler.requests
        self.now.out = out
        self.now.counts = {rid: (requests[rid].num_tokens, requests[rid].num_prompt_tokens)
                           for rid in out.num_scheduled_tokens}
        self.now.token_budget = int(self.scheduler.max_num_scheduled_tokens)
        return out

    # -- model runner ---------------------------------------------------------------------
    def _execute_model(self, original, scheduler_output, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        result = original(scheduler_output, *args, **kwargs)
        self.now.seconds["execute"] += time.perf_counter() - t0
        num_tokens = scheduler_output.total_num_scheduled_tokens
        if num_tokens > 0:
            self.now.batch_req_ids, self.now.batch = read_batch(self.runner, num_tokens, self.group_order)
        return result

def read_batch(runner: Any, num_tokens: int, order: list[int] | None = None) -> tuple[list[str], BatchDict]:
    """The packed batch of the step that just ran, from the model runner's persistent buffers
    (vLLM v1's names). Rows follow the runner's input batch, which is the order of
    `query_start_loc`; `logits_indices` lists the rows whose sample vLLM keeps (it computes
    logits for the last row of every request and discards those of unfinished prefill chunks).
    `order`: vLLM's KV cache groups in kvscope's order (explorer.drivers.vllm.groups); the first
    gives the plain slot mapping and block tables, the others their `group_*` lists."""
    ib = runner.input_batch
    num_reqs = int(ib.num_reqs)
    req_ids = [str(r) for r in ib.req_ids[:num_reqs]]
    qsl = [int(x) for x in runner.query_start_loc.cpu[: num_reqs + 1].tolist()]
    discard = runner.discard_request_mask.np[:num_reqs]
    slots, tables = zip(*(_group_rows(ib.block_table[g], num_reqs, num_tokens) for g in order or [0]))
    batch: BatchDict = {
        BATCH.INPUT_IDS: runner.input_ids.gpu[:num_tokens].tolist(),
        BATCH.POSITIONS: runner.positions[:num_tokens].tolist(),
        BATCH.QUERY_START_LOC: qsl,
        BATCH.SEQ_LENS: runner.seq_lens[:num_reqs].tolist(),
        BATCH.SLOT_MAPPING: slots[0],
        BATCH.BLOCK_TABLES: tables[0],
        BATCH.LOGITS_INDICES: [qsl[i + 1] - 1 for i in range(num_reqs) if not bool(discard[i])],
    }
    if len(slots) > 1:
        batch[BATCH.GROUP_SLOT_MAPPINGS], batch[BATCH.GROUP_BLOCK_TABLES] = list(slots[1:]), list(tables[1:])
    return req_ids, batch


def _group_rows(table: Any, num_reqs: int, num_tokens: int) -> tuple[list[int], list[list[int]]]:
    """One KV cache group's slot mapping and block-table rows (vLLM's BlockTable of that group)."""
    per_row, rows = table.num_blocks_per_row[:num_reqs], table.block_table.cpu
    return (table.slot_mapping.gpu[:num_tokens].tolist(),
            [rows[i, : int(per_row[i])].tolist() for i in range(num_reqs)])


def rank0_batch(worker: Any, num_tokens: int, order: list[int] | None = None) -> tuple[list[str], BatchDict]:
    """Runs in a vLLM worker process (collective_rpc): that rank's batch of the latest step."""
    return read_batch(worker.model_runner, num_tokens, order)


def rank_facts(worker: Any) -> dict[str, Any]:
    """Runs in each vLLM worker (collective_rpc): what this rank holds, read from its own model
    and KV cache: its query / KV heads, vocabulary rows, MLP rows and KV pool bytes."""
    runner = worker.model_runner
    rank = int(getattr(worker, "rank", 0))
    layers = [m for m in runner.compilation_config.static_forward_context.values()
              if hasattr(m, "impl") and hasattr(m, "kv_cache")]
    caches = [m.kv_cache[0] if isinstance(m.kv_cache, (list, tuple)) else m.kv_cache for m in layers]
    kv_bytes = sum(int(t.numel() * t.element_size()) for t in caches)
    num_blocks = int(caches[0].shape[0]) if caches else 0
    heads, kv_heads = int(layers[0].num_heads), int(layers[0].num_kv_heads)
    facts = {"rank": rank, "device": str(runner.device), "heads": [rank * heads, (rank + 1) * heads],
             "kv_heads": [rank * kv_heads, (rank + 1) * kv_heads], "kv_bytes": kv_bytes,
             "kv_bytes_per_block": kv_bytes // max(1, num_blocks)}
    model = getattr(runner.model, "model", runner.model)
    shard = getattr(getattr(model, "embed_tokens", None), "shard_indices", None)
    if shard is not None:
        facts["vocab"] = [int(shard.org_vocab_start_index), int(shard.org_vocab_end_index)]
    try:
        part = int(model.layers[0].mlp.gate_up_proj.output_size_per_partition) // 2
        facts["intermediate"] = [rank * part, (rank + 1) * part]
    except AttributeError:
        pass
    return facts
