"""kvscope's engine as a producer of changes (engine/report/changes.py explains the contract).

`ChangeNotes` remembers what changed since the last refresh point: the requests an action
touched between steps (added, aborted), whether the config changed (a live knob), and what
the consumer holds of each request (`Sent`). `take` turns that, the step's SchedulerOutput
and the block pool's touched blocks into the step's `changes`, and makes now the refresh
point. It costs O(what the step touched), never O(pool).
"""
from __future__ import annotations

from ..config import EngineConfig
from ..core.scheduler import Scheduler, SchedulerOutput
from ..request import Request
from .changes import DecodeRow, Sent, decodes_dict, request_fields
from .records import Decode, block_dicts, group_fields, request_dict
from .schema import CHANGES, QUEUE, REQ, ChangesDict, EngineMetricsDict, RequestChangeDict


class ChangeNotes:
    """What kvscope's engine changed since the last `take` (see the module doc)."""

    def __init__(self) -> None:
        self.sent = Sent()
        self.requests: set[str] = set()   # touched outside a step: added, aborted
        self.config_changed = False
        self._finished_sent = 0           # scheduler.finished[:n] went out already
        self._scheduled: list[SchedulerOutput] = []   # steps scheduled since the last take

    def scheduled(self, out: SchedulerOutput) -> None:
        """A step was scheduled: its requests, the preempted and the admitted ones changed."""
        self._scheduled.append(out)

    def take(self, step: int, out: SchedulerOutput | None, *, requests: dict[str, Request], scheduler: Scheduler,
             config: EngineConfig, metrics: EngineMetricsDict, decode: Decode) -> ChangesDict:
        """The changes since the last call; `out` is the SchedulerOutput of the step that landed
        (None: no step, only actions since the last refresh point). Under async scheduling the
        next step was scheduled already: its schedule is part of the state too."""
        touched = self.requests
        self.requests = set()
        pool = scheduler.kv.pool
        blocks = pool.take_touched()
        holders: dict[int, tuple[Request, int]] = {}   # block -> a scheduled request holding it, and where
        outs, self._scheduled = self._scheduled, []
        for o in outs:
            touched.update(o.preempted)
            touched.update(o.new_requests)
            for rid in o.preempted:
                self.sent.table_went_back(rid)
        # The positions each request's tokens are written into: the steps scheduled since, and the
        # step that landed (async scheduling: scheduled before the last take), as one span each.
        spans: dict[str, tuple[Request, int, int]] = {}
        for o in (outs if out is None or any(x is out for x in outs) else (*outs, out)):
            for s in o.scheduled:
                lo, hi = s.num_computed_before, s.num_computed_before + s.num_tokens - 1
                had = spans.get(s.request.request_id)
                spans[s.request.request_id] = (s.request, lo, hi) if had is None else \
                    (s.request, min(had[1], lo), max(had[2], hi))
        touched.update(spans)
        bs = config.block_size
        for writer, lo, hi in spans.values():  # the blocks those tokens go into, in every KV cache group
            table = writer.block_table
            for i in range(lo // bs, min(hi // bs + 1, len(table))):
                blocks.add(table[i])
                holders[table[i]] = (writer, i)   # records.block_dicts reads a holder's block_table
            for extra in writer.extra_block_tables:
                blocks.update(extra[lo // bs:hi // bs + 1])
        finished = scheduler.finished[self._finished_sent:]
        self._finished_sent = len(scheduler.finished)
        done = {r.request_id for r in finished}
        changed: dict[str, RequestChangeDict] = {}
        decoded: list[DecodeRow] = []
        sent = self.sent
        for rid in sorted(touched - done):
            req = requests.get(rid)
            if req is None:
                continue
            # A plain decode goes as a row of the decodes (one KV cache group: the others' tables come whole).
            if len(req.group_hit_tokens) < 2 and sent.decoded(
                    rid, (req.status.value, req.num_cached_tokens, req.num_preemptions), req.output_token_ids,
                    req.block_table, req.metrics):
                decoded.append((rid, req.num_computed_tokens, req.cached_text("output", decode), req.output_token_ids,
                                req.metrics))
            else:
                changed[rid] = self._request_change(req, decode)
        sent.forget(done)
        changes: ChangesDict = {
            CHANGES.STEP: step, CHANGES.REQUESTS: changed,
            CHANGES.QUEUES: {QUEUE.WAITING: [r.request_id for r in scheduler.waiting],
                             QUEUE.RUNNING: [r.request_id for r in scheduler.running]},
            CHANGES.FINISHED: [request_dict(r, decode) for r in finished],
            CHANGES.BLOCKS: block_dicts(pool, config.block_size, list(scheduler.running), blocks, holders)
            if blocks else [],
            CHANGES.NUM_FREE_BLOCKS: pool.num_free_blocks, CHANGES.METRICS: metrics.copy()}
        if decoded:
            changes[CHANGES.DECODES] = decodes_dict(decoded)
        if self.config_changed:
            changes[CHANGES.CONFIG] = config.to_dict()
            self.config_changed = False
        return changes

    def skip(self, scheduler: Scheduler) -> None:
        """A lean step (EngineConfig.record_steps False, a benchmark's): no changes are built, and
        what they would have carried is let go, so nothing piles up over a long run."""
        scheduler.kv.pool.take_touched()
        self.requests.clear()
        self._scheduled.clear()
        self._finished_sent = len(scheduler.finished)

    def _request_change(self, req: Request, decode: Decode) -> RequestChangeDict:
        fields = request_fields(req.request_id, req.status.value, req.num_computed_tokens, req.num_cached_tokens,
                                req.num_preemptions, req.finish_reason)
        fields[REQ.OUTPUT_TEXT] = req.cached_text("output", decode)
        fields.update(group_fields(req))

        def first_seen() -> dict[str, object]:
            text = req.prompt_text if req.prompt_text is not None else req.cached_text("prompt", decode)
            return {REQ.PROMPT_TOKEN_IDS: list(req.prompt_token_ids), REQ.PROMPT_TEXT: text,
                    REQ.MAX_TOKENS: req.params.max_tokens, REQ.SAMPLING_PARAMS: req.params.to_dict(), REQ.PRIORITY: 0}

        return self.sent.change(req.request_id, fields, req.output_token_ids, req.block_table, req.metrics, first_seen)
