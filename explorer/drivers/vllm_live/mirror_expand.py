"""The schema's dicts of a live engine core's compact state (mirror_state.py): a step's
StepRecord dict with its `changes` (engine/report/changes.py's ChangesDict), a request's dict,
and a whole EngineSnapshot dict. Only the expanding side (the client) builds them."""
from __future__ import annotations

from typing import cast

from engine.core.block_pool import BlockEventsDict
from engine.report.changes import Sent, hold_tokens, request_fields
from engine.report.records import StepRecord, group_fields_of
from engine.report.schema import (
    AHEAD,
    BATCH,
    BLOCK,
    BUDGET,
    CHANGES,
    POOL,
    QUEUE,
    RCHANGE,
    REQ,
    SAMPLE,
    SCHED,
    SNAP,
    TIME,
    UNKNOWN_TOKEN,
    BatchDict,
    BlockDict,
    BudgetsDict,
    ChangesDict,
    EngineMetricsDict,
    EngineSnapshotDict,
    ModelInfoDict,
    QueuesDict,
    RequestChangeDict,
    RequestDict,
    RequestFieldsDict,
    ScheduledAheadDict,
    StepRecordDict,
)
from engine.request import RequestMetrics

from .mirror_state import BodyStep, MirrorState, Req, Sched, Update


class Expander(MirrorState):
    """A MirrorState that spells itself as kvscope's record, changes and snapshot dicts."""

    # -- what a consumer reads -------------------------------------------------------------------
    @property
    def metrics(self) -> EngineMetricsDict:
        # COUNTERS are the rest of EngineMetricsDict's keys (a dict mypy cannot follow key by key).
        return cast(EngineMetricsDict, {"num_steps": self.step_count, "engine_time_s": self.engine_time,
                                        "kv_cache_usage": self.usage, **self.counters})

    def budgets(self, token_budget: int | None = None) -> BudgetsDict:
        c = self.config
        return {BUDGET.MAX_NUM_BATCHED_TOKENS: int(token_budget or c["max_num_batched_tokens"]),
                BUDGET.MAX_NUM_SEQS: c["max_num_seqs"], BUDGET.ENABLE_CHUNKED_PREFILL: c["enable_chunked_prefill"],
                BUDGET.ENABLE_PREFIX_CACHING: c["enable_prefix_caching"],
                BUDGET.SCHEDULER_RESERVE_FULL_ISL: c["scheduler_reserve_full_isl"],
                BUDGET.SCHEDULING_POLICY: "unified"}  # vLLM v1 has one policy: prefill and decode under one budget

    def _record(self, step: BodyStep) -> StepRecordDict:
        u = cast(Update, step.update)  # apply() sets it before the record
        sched = u.sched
        rec = StepRecord(step=self.step_count)
        bs, tokens = self.block_size, self.tokens
        budget = sched.op.token_budget if sched is not None else None
        if sched is not None:
            order, ns, bs_ = sched.order, sched.op.num_tokens, sched.before
            # every key a BatchDict always has, filled below, and with several KV cache groups each
            # other group's slots and tables
            batch = cast(BatchDict, {k: [] for k in BATCH.ALL if k in BatchDict.__required_keys__})
            ids_, pos_, slots_, qsl, seq_lens, tables, logits = (batch[BATCH.INPUT_IDS], batch[BATCH.POSITIONS],
                                                                 batch[BATCH.SLOT_MAPPING], [0], batch[BATCH.SEQ_LENS],
                                                                 batch[BATCH.BLOCK_TABLES], batch[BATCH.LOGITS_INDICES])
            groups = range(self.other_groups)
            group_slots: list[list[int]] = [[] for _ in groups]
            group_tables: list[list[list[int]]] = [[] for _ in groups]
            if self.other_groups:
                batch[BATCH.GROUP_SLOT_MAPPINGS], batch[BATCH.GROUP_BLOCK_TABLES] = group_slots, group_tables
            for row, idx in enumerate(order):
                req = self._req(idx)
                b, n = bs_[row], ns[row]
                admitted = idx in sched.admitted
                is_decode = sched.decode[row]
                rec.scheduled.append({SCHED.REQUEST_ID: req.rid, SCHED.NUM_TOKENS: n, SCHED.NUM_COMPUTED_BEFORE: b,
                                      SCHED.IS_PREFILL: not is_decode, SCHED.NUM_CACHED_TOKENS: b if admitted else 0,
                                      SCHED.CHUNK_INDEX: sched.chunk.get(row)})
                if admitted:
                    rec.new_requests.append(req.rid)
                table = sched.tables.get(idx, req.table)
                pos = range(b, b + n)
                pos_.extend(pos)
                slots_.extend(table[p // bs] * bs + p % bs for p in pos)
                if tokens:
                    known_ids = req.tokens(b, b + n)
                    # UNKNOWN_TOKEN: a position whose token the device sampled and vLLM then dropped
                    # (its request ended while the step ran): the feed never saw it.
                    ids_.extend(known_ids + [UNKNOWN_TOKEN] * (n - len(known_ids)))
                qsl.append(qsl[-1] + n)
                seq_lens.append(b + n)
                tables.append(table[:(b + n + bs - 1) // bs])
                if self.other_groups:   # the tables the model runner read (mirror_state.Req.runner_tables)
                    runner = sched.runner_tables.get(idx, req.runner_tables)
                    for g in groups:
                        group_slots[g].extend(runner[g][p // bs] * bs + p % bs for p in pos)
                        group_tables[g].append(runner[g][:(b + n + bs - 1) // bs])
                if is_decode or b + n >= sched.known[row]:
                    logits.append(qsl[-1] - 1)
            batch[BATCH.QUERY_START_LOC] = qsl
            rec.batch, rec.batch_source = batch, "scheduler"
            rec.preempted = sorted(self._req(i).rid for i in sched.op.preempted)
            rec.scheduled_ahead = self._ahead(sched)
        for idx, new in zip(u.ids, u.new_tokens):
            sampler = self.requests.get(idx) or step.gone.get(idx)
            if sampler is not None and (new if tokens else new > 0):
                # Without token ids (KVSCOPE_FEED_TOKENS=0) the sampled token is unknown: None.
                rec.sampled[sampler.rid] = {SAMPLE.TOKEN_ID: new[-1] if tokens else None, SAMPLE.TEXT: None,
                                            SAMPLE.TOP: []}
        rec.finished = list(dict.fromkeys(u.finished_ids + [r.rid for r in step.finished]))
        if u.events:
            # The recorder's events hold every block event's key (pool_notes.new_events).
            rec.blocks = cast(BlockEventsDict, {k: list(v) for k, v in u.events.items()})
        rec.num_free_blocks = self.num_free
        step_ms, sched_ms, update_ms = u.step_s * 1e3, u.schedule_s * 1e3, u.update_s * 1e3
        rec.timings_ms = {TIME.SCHEDULE: sched_ms, TIME.PREPARE: 0.0,
                          TIME.FORWARD: max(0.0, step_ms - sched_ms - update_ms), TIME.SAMPLE: 0.0,
                          TIME.UPDATE: update_ms, TIME.TOTAL: step_ms, TIME.COLLECTIVES: 0.0,
                          TIME.BACKEND: "vLLM server", TIME.CUDA_GRAPH_BUCKET: None, TIME.FORWARD_PATH: "eager"}
        rec.engine_time_s, rec.wall_time_s = self.engine_time, u.wall
        rec.token_budget = int(budget or self.config["max_num_batched_tokens"])
        rec.budgets = self.budgets(rec.token_budget)
        rec.num_running, rec.num_waiting = len(self.running), len(self.waiting)
        return rec.to_dict()

    def _ahead(self, sched: Sched) -> ScheduledAheadDict | None:
        """Async scheduling: the step in flight when this one was scheduled, and the token each
        placeholder input turned out to be (UNKNOWN_TOKEN where the feed carries no token ids). A
        token vLLM dropped (its request ended while the step ran) is left out, as kvscope's engine
        leaves it out (engine/runner/batch.fill_placeholders)."""
        ahead, sched.ahead_of = sched.ahead_of, None   # the step in flight landed before this one
        if ahead is None or ahead.step is None:
            return None
        held: dict[str, int] = {}
        for idx, k in sched.placeholders.items():   # rows of the schedule, as the batch's (_req finds each)
            req = self._req(idx)
            if not self.tokens:
                held[req.rid] = UNKNOWN_TOKEN
            elif k < len(req.output):
                held[req.rid] = req.output[k]
        return {AHEAD.IN_FLIGHT_STEP: ahead.step, AHEAD.PLACEHOLDERS: held}

    def _changes(self, step: BodyStep, block_ids: list[int]) -> ChangesDict:
        """The step's ChangesDict: what changed since the previous body, for a consumer that
        holds the state after it (engine/report/changes.py)."""
        if self.sent is None:
            self.sent = Sent()
        running = set(self.running)
        held: dict[int, list[int]] = {}
        requests: dict[str, RequestChangeDict] = {}
        for idx, first in step.touched.items():
            req = self.requests.get(idx)
            if req is None or req.finish_reason is not None:
                continue  # finished: its whole dict travels in `finished`
            table = req.table if idx in running else []
            for t in (table, *(req.group_tables if table else ())):  # every KV cache group's blocks
                self._hold(req, t, first, held)
            requests[req.rid] = self._request_change(req, table)
        dirty = set(block_ids) | held.keys()
        blocks = [self._block(b, held.get(b)) for b in sorted(dirty)]
        reqs = self.requests
        return {CHANGES.STEP: self.step_count, CHANGES.REQUESTS: requests,
                CHANGES.QUEUES: {QUEUE.WAITING: [reqs[i].rid for i in self.waiting if i in reqs],
                                 QUEUE.RUNNING: [reqs[i].rid for i in self.running if i in reqs]},
                CHANGES.FINISHED: [self.finished_dict(r) for r in step.finished], CHANGES.BLOCKS: blocks,
                CHANGES.NUM_FREE_BLOCKS: self.num_free, CHANGES.METRICS: self.metrics}

    def _hold(self, req: Req, table: list[int], first: int, held: dict[int, list[int]]) -> None:
        """The tokens `req` keeps in its blocks from table index `first` on (computed ones only)."""
        if table[first:]:
            n = req.computed
            tokens = req.tokens(first * self.block_size, n) if self.tokens else []
            hold_tokens(held, table, first, self.block_size, tokens, n, self.null_block)

    def _block(self, b: int, held: list[int] | None) -> BlockDict:
        h = self.hash[b]
        if held is None:
            known = self.memo.get(b)
            held = known[1] if known is not None and h is not None and known[0] == h else []
        is_null = b == self.null_block
        ref = 0 if is_null else self.ref[b]  # vLLM does not keep the null block's (sliding groups drive it below 0)
        return {BLOCK.BLOCK_ID: b, BLOCK.REF_COUNT: ref, BLOCK.HASH: h, BLOCK.TOKEN_IDS: held, BLOCK.OWNERS: [],
                BLOCK.IS_NULL: is_null, BLOCK.IS_FREE: ref == 0 and not is_null}

    def _first_seen(self, req: Req) -> dict:
        fields = {REQ.PROMPT_TOKEN_IDS: list(req.prompt), REQ.PROMPT_TEXT: "", REQ.MAX_TOKENS: req.max_tokens,
                  REQ.SAMPLING_PARAMS: req.params, **req.domain}
        if not self.tokens:
            fields[REQ.NUM_PROMPT_TOKENS] = req.n_prompt
        return fields

    def _request_change(self, req: Req, table: list[int]) -> RequestChangeDict:
        sent = cast(Sent, self.sent)  # _changes made it
        fields = request_fields(req.rid, req.status, req.computed, req.cached, req.preemptions, req.finish_reason)
        fields.update(self._group_fields(req, bool(table)))
        # Metrics has RequestMetrics' shape as Sent reads it (two clocks of ClockEvents' times);
        # _first_seen's open dict holds the prompt and its hash domain, once.
        change = sent.change(req.rid, fields, req.output, table, cast(RequestMetrics, req.metrics),
                             lambda: self._first_seen(req))
        if not self.tokens:
            change[RCHANGE.NUM_OUTPUT_TOKENS] = req.n_output
        return change

    def request_dict(self, req: Req, table: list[int]) -> RequestDict:
        """One request as a snapshot shows it (kvscope's request dict)."""
        # _first_seen's open dict holds the prompt's fields and the hash domain's.
        d: RequestDict = cast(RequestDict, {REQ.REQUEST_ID: req.rid, REQ.STATUS: req.status, **self._first_seen(req),
             REQ.OUTPUT_TOKEN_IDS: list(req.output), REQ.OUTPUT_TEXT: "", REQ.NUM_COMPUTED_TOKENS: req.computed,
             REQ.NUM_CACHED_TOKENS: req.cached, REQ.BLOCK_TABLE: list(table), REQ.NUM_PREEMPTIONS: req.preemptions,
             REQ.FINISH_REASON: req.finish_reason, REQ.METRICS: req.metrics.to_dict(),
             **self._group_fields(req, bool(table))})
        if not self.tokens:
            d[REQ.NUM_OUTPUT_TOKENS] = req.n_output
        return d

    def _group_fields(self, req: Req, holds_blocks: bool) -> RequestFieldsDict:
        """With several KV cache groups: the request's table in each past the first (whole: a
        sliding window's is not append-only) and each group's own hit at its admission."""
        return group_fields_of(self.other_groups + 1, req.group_tables if holds_blocks else None, req.group_hits)

    def finished_dict(self, req: Req) -> RequestDict:
        if req.frozen is None:  # a finished request no longer changes: its dict is built once
            req.frozen = self.request_dict(req, []) | {REQ.STATUS: "finished"}
        return req.frozen

    def snapshot_dict(self) -> EngineSnapshotDict:
        """The whole EngineSnapshot dict. It is a refresh point: the consumer holds every
        request whole afterwards (a later body's changes continue from it)."""
        self.settle()
        if self.sent is None:
            self.sent = Sent()
        reqs = self.requests
        running = [reqs[i] for i in self.running if i in reqs]
        held: dict[int, list[int]] = {}
        owners: dict[int, list[str]] = {}
        null = self.null_block
        for r in running:
            for t in (r.table, *r.group_tables):  # every KV cache group's blocks: one pool holds them all
                self._hold(r, t, 0, held)
                for b in t:
                    if b != null:
                        owners.setdefault(b, []).append(r.rid)
        blocks: list[BlockDict] = []
        for b in range(len(self.ref)):
            d = self._block(b, held.get(b))
            if b in owners:
                d[BLOCK.OWNERS] = owners[b]
            blocks.append(d)
        queues: QueuesDict = {QUEUE.WAITING: [self.request_dict(reqs[i], []) for i in self.waiting if i in reqs],
                  QUEUE.RUNNING: [self.request_dict(r, r.table) for r in running],
                  QUEUE.FINISHED: [self.finished_dict(r) for r in self.finished]}
        in_running = set(self.running)
        for r in reqs.values():
            self.sent.hold(r.rid, r.output, r.table if r.idx in in_running else [], cast(RequestMetrics, r.metrics))
        return {SNAP.STEP: self.step_count, SNAP.CONFIG: dict(self.config),
                SNAP.MODEL_INFO: cast(ModelInfoDict, dict(self.model_info)),  # the recorder's model facts
                SNAP.METRICS: self.metrics, SNAP.QUEUES: queues,
                SNAP.BLOCK_POOL: {POOL.NUM_BLOCKS: len(self.ref), POOL.BLOCK_SIZE: self.block_size,
                                  POOL.NUM_FREE_BLOCKS: self.num_free, POOL.BLOCKS: blocks}}
