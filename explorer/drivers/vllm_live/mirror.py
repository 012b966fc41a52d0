"""The state of one vLLM engine core as the live feed carries it, kept in compact form, and
the compact step that moves it on: one code for both ends of the feed.

The recorder (recorder.py) turns what vLLM's scheduler did into a *body* (below) on a thread
of its own, applies it to its `Mirror` (so a client that joins gets that state whole) and
sends it. The client (client.py) applies the same body to its own `Mirror` with
`expand=True`, which also spells the step as kvscope's StepRecord dict with its `changes`
(engine/report/changes.py's ChangesDict), and a whole EngineSnapshot dict when asked: the
Session and every consumer read the schema's dicts, never this form.

A body is {"ops": [...], "blocks": [ids, refcounts, hash keys], "cached": [[block, request,
table index]], "cleared": bool, "queues": [running, waiting] | None, "free": int, "usage":
float}, with "groups": [[i, tables, hits | None]] for a model of several KV cache groups (each
running request's tables past kvscope's first, whole, after the update, and each group's own
hit where vLLM looked its prefix up since the last body); requests are small integers (indices
the recorder gives them), and `ops` are, in the order vLLM did them:

- ["a", i, request_id, prompt, num_prompt, max_tokens, sampling_params, arrival_time, stop,
  prompt_hashes, domain]: a request arrived (its name, prompt and parameters: the only time
  they go; `domain`: its priority, and its cache_salt and LoRA name where it has them);
- ["s", sid, order, num_tokens, new, cached_ids, cached_before, cached_new_blocks,
  cached_outputs, resumed, preempted, token_budget]: vLLM's SchedulerOutput `sid`, as it is
  (`new` = [[i, computed before, block ids]]; the cached requests' lists are vLLM's own);
- ["f", wall_time, [[i, reason]]]: requests finished outside a step (an abort);
- ["u", sid, wall_time, step_s, schedule_s, update_s, ids, new_tokens, [[k, reason]],
  events]: the update of SchedulerOutput `sid`: each request's new tokens (or their counts
  when token ids are left out), which finished and why, and the step's block events. It
  ends a body, and the body is that step's record;
- ["x", sid]: the update of a SchedulerOutput that ran nothing (vLLM tells its workers
  about finished requests that way): no record.

With vLLM's async scheduling the next step is scheduled before this one's update, so a body
may hold an "s" whose "u" comes in a later body: the state after a body is vLLM's state
after that update, the next step's allocations included (`Mirror.scheduled_ahead` says which
step they belong to), and each record is keyed by its own SchedulerOutput.
"""
from __future__ import annotations

import time
from collections import deque
from itertools import chain, compress
from operator import add, sub
from typing import Literal, cast, overload

from engine.core.block_pool import BlockEventsDict
from engine.report.changes import Sent, hold_tokens, request_fields
from engine.report.records import StepRecord, group_fields_of
from engine.report.schema import (
    BATCH,
    BLOCK,
    BUDGET,
    CHANGES,
    INFO,
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
    BatchDict,
    BlockDict,
    BudgetsDict,
    ChangesDict,
    ClockDict,
    EngineMetricsDict,
    EngineSnapshotDict,
    ModelInfoDict,
    QueuesDict,
    RequestChangeDict,
    RequestDict,
    RequestFieldsDict,
    RequestMetricsDict,
    StepRecordDict,
)
from engine.request import ClockEvents, RequestMetrics

COUNTERS = ("prefix_cache_hits", "prefix_cache_queries", "num_preemptions", "num_generated_tokens",
            "num_prompt_tokens_computed")


_DEFER_AT_MOST = 256   # deferred decode steps held at most (then settled): memory stays small
UNKNOWN_TOKEN = -1     # a batch position whose token id never reached the scheduler (see _record)
_NO_BLOCKS = 1 << 62   # a touched request whose blocks did not change (only its outputs or times did)


class _Clock:
    """One clock of a request's event times, shaped as engine.request.ClockEvents (what
    engine.report.changes reads), with the first token's time taken from the token times."""

    __slots__ = ("arrival_time", "finished_time", "first_scheduled_time", "preempted_times", "token_times")

    def __init__(self) -> None:
        self.arrival_time: float | None = None
        self.first_scheduled_time: float | None = None
        self.finished_time: float | None = None
        self.token_times: list[float] = []
        self.preempted_times: list[float] = []

    @property
    def first_token_time(self) -> float | None:
        return self.token_times[0] if self.token_times else None

    def to_dict(self) -> ClockDict:
        return ClockEvents(self.arrival_time, self.first_scheduled_time, self.first_token_time, list(self.token_times),
                           list(self.preempted_times), self.finished_time).to_dict()

    def to_wire(self) -> list:
        return [self.arrival_time, self.first_scheduled_time, self.finished_time, self.token_times,
                self.preempted_times]

    def from_wire(self, w: list) -> None:
        self.arrival_time, self.first_scheduled_time, self.finished_time = w[0], w[1], w[2]
        self.token_times, self.preempted_times = list(w[3]), list(w[4])


class _Metrics:
    """A request's two clocks (engine.request.RequestMetrics' shape)."""

    __slots__ = ("engine", "wall")

    def __init__(self) -> None:
        self.engine, self.wall = _Clock(), _Clock()

    def to_dict(self) -> RequestMetricsDict:
        return {RMETRICS.ENGINE: self.engine.to_dict(), RMETRICS.WALL: self.wall.to_dict()}


class Req:
    """One request as the feed knows it (vLLM's Request stays in the server)."""

    __slots__ = (
        "cached",
        "chunks",
        "computed",
        "domain",
        "finish_reason",
        "frozen",
        "group_hits",
        "group_tables",
        "hashes",
        "idx",
        "max_tokens",
        "metrics",
        "n_hidden",
        "n_prompt",
        "output",
        "params",
        "preemptions",
        "prompt",
        "rid",
        "status",
        "stop",
        "table",
        "te",
        "tw",
    )

    def __init__(self, idx: int, rid: str, prompt: list[int], n_prompt: int, max_tokens: int, params: dict,
                 stop: list[str], hashes: list[str], domain: dict | None = None) -> None:
        self.idx, self.rid, self.prompt, self.n_prompt = idx, rid, prompt, n_prompt
        self.output: list[int] = []
        self.n_hidden = 0   # outputs counted but not held (token ids left out of the feed)
        self.max_tokens, self.params, self.stop, self.hashes = max_tokens, params, stop, hashes
        # priority, and cache_salt / lora_name where set: RequestDict's keys, sent once
        self.domain: dict = domain if domain is not None else {REQ.PRIORITY: 0}
        self.status = "waiting"
        self.computed = self.cached = self.preemptions = self.chunks = 0
        self.finish_reason: str | None = None
        self.table: list[int] = []
        self.group_tables: list[list[int]] = []  # several KV cache groups: its table in each past the first
        self.group_hits: list[int] | None = None  # and each group's own hit at its admission
        self.metrics = _Metrics()
        self.frozen: RequestDict | None = None
        self.tw, self.te = self.metrics.wall.token_times, self.metrics.engine.token_times  # the hot path's handles

    @property
    def n_output(self) -> int:
        return len(self.output) + self.n_hidden

    def tokens(self, start: int = 0, end: int | None = None) -> list[int]:
        """Its token ids [start, end): the prompt's, then the outputs'."""
        prompt, n = self.prompt, len(self.prompt)
        end = n + len(self.output) if end is None else end
        if end <= n:
            return prompt[start:end]
        if start >= n:
            return self.output[start - n:end - n]
        return prompt[start:] + self.output[:end - n]

    # -- the wire ----------------------------------------------------------------------------
    def to_wire(self) -> list:
        m = self.metrics
        return [self.idx, self.rid, self.prompt, self.n_prompt, self.output, self.n_output, self.max_tokens,
                self.params, self.stop, self.hashes, self.status, self.computed, self.cached, self.preemptions,
                self.finish_reason, self.table, self.chunks, [m.engine.to_wire(), m.wall.to_wire()], self.domain,
                self.group_tables, self.group_hits]

    @classmethod
    def from_wire(cls, w: list) -> Req:
        r = cls(w[0], w[1], list(w[2]), w[3], w[6], w[7], list(w[8]), list(w[9]), dict(w[18]))
        r.output = list(w[4])
        r.n_hidden = w[5] - len(r.output)
        r.status, r.computed, r.cached, r.preemptions, r.finish_reason = w[10], w[11], w[12], w[13], w[14]
        r.table, r.chunks = list(w[15]), w[16]
        r.group_tables, r.group_hits = [list(t) for t in w[19]], w[20]
        r.metrics.engine.from_wire(w[17][0])
        r.metrics.wall.from_wire(w[17][1])
        r.tw, r.te = r.metrics.wall.token_times, r.metrics.engine.token_times
        return r


def _stamp(m: _Metrics, event: str, wall: float, engine: float) -> None:
    """An event's time on both clocks, the first time it happens."""
    if getattr(m.wall, event) is None:
        setattr(m.wall, event, wall)
    if getattr(m.engine, event) is None:
        setattr(m.engine, event, engine)


class Mirror:
    """One engine core's state for the feed (see the module doc). `tokens` False: the feed
    carries counts instead of token ids (KVSCOPE_FEED_TOKENS=0).

    `defer_decodes` (the recorder's copy, which is read only when a client joins): a step in
    which every request decoded one token is kept as two lists, and its tokens and times reach
    the requests in runs of such steps, one extend per request and run instead of three
    appends per request and step, before anything reads them (`settle`)."""

    def __init__(self, config: dict, model_info: dict, *, null_block: int = 0, num_free: int | None = None,
                 finished_keep: int = 256, tokens: bool = True, defer_decodes: bool = False) -> None:
        self.config, self.model_info = config, model_info
        self.block_size = int(config["block_size"])
        n = int(config["num_kv_blocks"])
        self.null_block = null_block
        self.other_groups = max(0, len(model_info.get(INFO.KV_CACHE_GROUPS) or []) - 1)  # past kvscope's first
        self.tokens = tokens
        self.requests: dict[int, Req] = {}
        self.running: list[int] = []
        self.waiting: list[int] = []
        self.finished: deque[Req] = deque(maxlen=finished_keep)
        self.ref = [0] * n
        self.hash: list[str | None] = [None] * n
        self.memo: dict[int, tuple[str, list[int]]] = {}   # block -> (hash, the tokens it was hashed with)
        self.num_free = n - 1 if num_free is None else num_free
        self.usage = 0.0
        self.step_count = 0
        self.engine_time = 0.0
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.pending: dict[int, _Sched] = {}   # scheduled, not yet updated (async scheduling)
        self.scheduled_ahead: int | None = None  # the step whose allocations the state already holds
        self._gone: dict[int, Req] = {}        # finished requests a pending schedule still names
        self.sent: Sent | None = None          # what the consumer holds (expanding side only)
        self.defer_decodes = defer_decodes
        self._decodes: list[tuple[list[int], list[int], float, float]] = []  # (ids, tokens, wall, engine)
        self._memo_due: list[tuple[int, str, Req, int]] = []  # (block, hash, request, table index), after them
        # The last scheduled batch: its request indices, its Reqs, their prompt lengths less one.
        self._rows: tuple[list[int], list[Req], list[int]] = ([], [], [])

    # -- applying a body -------------------------------------------------------------------------
    @overload
    def apply(self, body: dict, expand: Literal[True]) -> StepRecordDict: ...

    @overload
    def apply(self, body: dict, expand: bool = False) -> StepRecordDict | None: ...

    def apply(self, body: dict, expand: bool = False) -> StepRecordDict | None:
        """Move the state on by one body; with `expand`, return its StepRecord dict, `changes` in."""
        step = _Step()
        for op in body["ops"]:
            kind = op[0]
            if kind == "s":
                self._schedule(op, step)
            elif kind == "u":
                self._update(op, step)
            elif kind == "a":
                self._arrive(op, step)
            elif kind == "x":  # a schedule that ran nothing: no record
                self.pending.pop(op[1], None)
            elif kind == "f":
                for idx, reason in op[2]:
                    req = self.requests.get(idx)
                    if req is not None and req.finish_reason is None:
                        self._finish(req, reason, op[1], self.engine_time, step)
            else:
                raise ValueError(f"unknown op {kind!r}")
        for idx, tables, hits in body.get("groups") or ():  # several KV cache groups: after the update
            req = self.requests.get(idx)
            if req is not None:
                req.group_tables = tables
                if hits is not None:
                    req.group_hits = hits
        ref, hashes = self.ref, self.hash
        if body.get("cleared"):
            self.settle()
            hashes[:] = [None] * len(hashes)
            self.memo.clear()
        ids, refs, keys = body["blocks"]
        for b, r, h in zip(ids, refs, keys):
            ref[b] = r
            hashes[b] = h
        bs = self.block_size
        for b, idx, i in body["cached"]:
            req = self.requests.get(idx) or step.gone.get(idx)
            if req is not None and hashes[b] is not None:
                if self.tokens and self.defer_decodes:  # the block's tokens may be deferred ones
                    self._memo_due.append((b, hashes[b], req, i))
                else:
                    self.memo[b] = (hashes[b], req.tokens(i * bs, (i + 1) * bs) if self.tokens else [])
        if body["queues"] is not None:
            self.running, self.waiting = list(body["queues"][0]), list(body["queues"][1])
        self.num_free, self.usage = body["free"], body["usage"]
        if step.update is None:
            # No step ran (an abort between steps): its record keeps the last step's number and
            # schedules nothing, and a Session brings its latest entry up to date with it
            # (Session._append) instead of adding a step vLLM never ran.
            step.update = _Update(None, body.get("wall") or time.time(), 0.0, 0.0, 0.0, [], [], [], {})
        self.scheduled_ahead = (self.step_count + 1) if self.pending else None
        record = None
        if expand:
            record = self._record(step)
            record[REC.CHANGES] = self._changes(step, ids)
        for req in step.finished:
            self.requests.pop(req.idx, None)
            self.finished.append(req)
        if self.sent is not None:
            self.sent.forget(r.rid for r in step.finished)
        if self._gone:
            named = {i for s in self.pending.values() for i in s.names}
            self._gone = {i: r for i, r in self._gone.items() if i in named}
        return record

    def _arrive(self, op: list, step: _Step) -> None:
        _, idx, rid, prompt, n_prompt, max_tokens, params, arrival, stop, hashes, domain = op
        req = Req(idx, rid, list(prompt), n_prompt, max_tokens, params, list(stop), list(hashes), dict(domain))
        req.metrics.wall.arrival_time, req.metrics.engine.arrival_time = arrival, self.engine_time
        self.requests[idx] = req
        step.touched[idx] = 0

    def _schedule(self, op: list, step: _Step) -> None:
        _, sid, order, ns, new, cached_ids, cached_before, cached_blocks, cached_out, resumed, preempted, _budget = op
        reqs, counters = self.requests, self.counters
        admitted = set(resumed)
        if not new and cached_ids == order:  # running requests only (decode steps): vLLM's lists line up
            bs_, outs = cached_before, cached_out
        else:
            before = dict(zip(cached_ids, cached_before))
            with_placeholders = dict(zip(cached_ids, cached_out))  # outputs + tokens still being sampled
            for idx, b, table in new:
                req = reqs[idx]
                before[idx], with_placeholders[idx] = b, req.n_output
                req.table = list(table)
                admitted.add(idx)
            bs_, outs = list(map(before.__getitem__, order)), list(map(with_placeholders.__getitem__, order))
        for idx, blocks in compress(zip(cached_ids, cached_blocks), cached_blocks):  # those given blocks
            if idx not in admitted:
                reqs[idx].table += blocks
        for idx in resumed:
            self._reset_table(reqs[idx], list(dict(zip(cached_ids, cached_blocks))[idx] or ()))
        if order != self._rows[0]:  # a batch other than the last step's
            rows = [reqs[i] for i in order]
            self._rows = (order, rows, [r.n_prompt - 1 for r in rows])
        rs, prompts_less_one = self._rows[1], self._rows[2]
        for req, c in zip(rs, map(add, bs_, ns)):
            req.computed = c
        # A decode computes one token, the request's latest, past its prompt (under async
        # scheduling, one still being sampled): n == 1, b == prompt + outputs (+ placeholders) - 1
        # and outputs >= 1.
        if ns.count(1) == len(ns) and list(map(sub, bs_, outs)) == prompts_less_one and min(outs, default=1) >= 1:
            decode = [True] * len(ns)  # the common step, without a loop in Python
        else:
            decode = [n == 1 and w >= 1 and b == r.n_prompt + w - 1 for r, b, n, w in zip(rs, bs_, ns, outs)]
        chunk: dict[int, int] = {}  # row -> prefill chunk index
        known: dict[int, int] = {}  # row -> tokens the request knew (its logits row is sampled if it reaches them)
        if admitted or not all(decode):
            self.settle()  # their outputs are read below
        if admitted:
            b_of = dict(zip(order, bs_))
            for idx in admitted:
                req = reqs[idx]
                req.status = "running"
                req.cached, req.chunks = b_of[idx], 0
                counters["prefix_cache_hits"] += b_of[idx]
                counters["prefix_cache_queries"] += req.n_prompt + req.n_output
        if not all(decode):
            for row in [k for k, d in enumerate(decode) if not d]:
                req = rs[row]
                chunk[row], known[row] = req.chunks, req.n_prompt + req.n_output
                req.chunks += 1
                counters["num_prompt_tokens_computed"] += ns[row]
        for idx in preempted:
            req = reqs[idx]
            req.status = "preempted"
            req.computed = 0
            req.preemptions += 1
            self._reset_table(req, [])
        if self.sent is not None:  # the consumer's side: which blocks may hold new tokens
            touched, bs = step.touched, self.block_size
            for idx, b in zip(order, bs_):
                first = 0 if idx in admitted else b // bs
                touched[idx] = min(first, touched.get(idx, first))
            for idx in preempted:
                touched[idx] = 0
        self.pending[sid] = _Sched(op, list(bs_), admitted, known, decode, chunk)

    def _reset_table(self, req: Req, table: list[int]) -> None:
        """A request's table starts again (preempted, resumed, finished): a step scheduled before
        that, whose record is still to come, keeps the table it ran with."""
        for s in self.pending.values():
            if req.idx in s.names and req.idx not in s.tables:
                s.tables[req.idx] = req.table
        req.table = table
        req.group_tables = []  # a running request's come with the body's groups
        if self.sent is not None:
            self.sent.table_went_back(req.rid)

    def _finish(self, req: Req, reason: str, wall: float, engine: float, step: _Step) -> None:
        self.settle()  # a finished request's outputs are whole
        req.finish_reason, req.status = reason, "finished"
        _stamp(req.metrics, "finished_time", wall, engine)
        self._reset_table(req, [])
        step.finished.append(req)
        step.gone[req.idx] = req
        if any(req.idx in s.names for s in self.pending.values()):
            self._gone[req.idx] = req

    def _req(self, idx: int) -> Req:
        return self.requests.get(idx) or self._gone[idx]

    def _update(self, op: list, step: _Step) -> None:
        _, sid, wall, step_s, schedule_s, update_s, ids, new_tokens, finished, events = op
        engine_start = self.engine_time
        self.step_count += 1
        self.engine_time = engine = engine_start + step_s
        sched = self.pending.get(sid)  # still pending while its requests finish: they keep their tables for it
        u = step.update = _Update(sched, wall, step_s, schedule_s, update_s, ids, new_tokens, finished, events)
        counters = self.counters
        touched = step.touched
        if sched is not None:
            for idx in sched.admitted:
                _stamp(self._req(idx).metrics, "first_scheduled_time", wall, engine_start)
                touched.setdefault(idx, _NO_BLOCKS)
            preempted = sched.op[10]
            for idx in preempted:
                touched.setdefault(idx, _NO_BLOCKS)
                m = self._req(idx).metrics
                m.wall.preempted_times.append(wall)
                m.engine.preempted_times.append(engine_start)
            counters["num_preemptions"] += len(preempted)
        reqs = self.requests
        counts = list(map(len, new_tokens)) if self.tokens else new_tokens
        decodes = self.tokens and counts.count(1) == len(counts)  # one token each: the common step
        if decodes and self.defer_decodes:
            self._decodes.append((ids, list(chain.from_iterable(new_tokens)), wall, engine))
            if len(self._decodes) >= _DEFER_AT_MOST:
                self.settle()
        else:
            self.settle()  # the deferred tokens come first
            self._add_outputs(list(map(reqs.get, ids)), new_tokens, counts, decodes, wall, engine)
        generated = sum(counts)
        if self.sent is not None:
            for idx in ids:
                touched.setdefault(idx, _NO_BLOCKS)
        counters["num_generated_tokens"] += generated
        for k, reason in finished:
            req = reqs.get(ids[k])
            if req is not None and req.finish_reason is None:
                self._finish(req, reason, wall, engine, step)
                u.finished_ids.append(req.rid)
        self.pending.pop(sid, None)

    def _add_outputs(self, rs: list[Req | None], new_tokens: list, counts: list[int], decodes: bool, wall: float,
                     engine: float) -> None:
        if decodes and None not in rs:  # the common step, lean
            decoded = cast("list[Req]", rs)  # None is not in it
            for r in decoded:
                r.tw.append(wall)
            for r in decoded:
                r.te.append(engine)
            for r, new in zip(decoded, new_tokens):
                r.output += new
            return
        for req, new, k in zip(rs, new_tokens, counts):
            if req is None or not k:
                continue
            req.tw += [wall] * k
            req.te += [engine] * k
            if self.tokens:
                req.output += new
            else:
                req.n_hidden += k

    def settle(self) -> None:
        """Give the requests the decode steps deferred so far (`defer_decodes`), a run of steps
        over the same requests at a time, then the tokens of the blocks hashed meanwhile."""
        log = self._decodes
        if log:
            self._decodes = []
            reqs = self.requests
            start = 0
            for end in range(1, len(log) + 1):
                if end < len(log) and log[end][0] == log[start][0]:
                    continue
                run = log[start:end]
                walls, engines = [e[2] for e in run], [e[3] for e in run]
                for req, new in zip(map(reqs.get, run[0][0]), zip(*[e[1] for e in run])):
                    if req is not None:
                        req.output += new
                        req.tw += walls
                        req.te += engines
                start = end
        if self._memo_due:
            bs, memo = self.block_size, self.memo
            for b, h, req, i in self._memo_due:
                memo[b] = (h, req.tokens(i * bs, (i + 1) * bs))
            self._memo_due = []

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

    def _record(self, step: _Step) -> StepRecordDict:
        u = cast(_Update, step.update)  # apply() sets it before the record
        sched = u.sched
        rec = StepRecord(step=self.step_count)
        bs, tokens = self.block_size, self.tokens
        budget = sched.op[11] if sched is not None else None
        if sched is not None:
            order, ns, bs_ = sched.order, sched.op[3], sched.before
            # every key a BatchDict always has, filled below (one KV cache group: none of the optional ones)
            batch = cast(BatchDict, {k: [] for k in BATCH.ALL if k in BatchDict.__required_keys__})
            ids_, pos_, slots_, qsl, seq_lens, tables, logits = (batch[BATCH.INPUT_IDS], batch[BATCH.POSITIONS],
                                                                 batch[BATCH.SLOT_MAPPING], [0], batch[BATCH.SEQ_LENS],
                                                                 batch[BATCH.BLOCK_TABLES], batch[BATCH.LOGITS_INDICES])
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
                if is_decode or b + n >= sched.known[row]:
                    logits.append(qsl[-1] - 1)
            batch[BATCH.QUERY_START_LOC] = qsl
            rec.batch, rec.batch_source = batch, "scheduler"
            rec.preempted = sorted(self._req(i).rid for i in sched.op[10])
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

    def _changes(self, step: _Step, block_ids: list[int]) -> ChangesDict:
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
        # _Metrics has RequestMetrics' shape as Sent reads it (two clocks of ClockEvents' times);
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

    # -- the wire ----------------------------------------------------------------------------------
    def to_wire(self) -> dict:
        """The whole state, for a joining client (`from_wire` rebuilds it)."""
        self.settle()
        return {"config": self.config, "model_info": self.model_info, "null_block": self.null_block,
                "tokens": self.tokens, "finished_keep": self.finished.maxlen, "step": self.step_count,
                "engine_time": self.engine_time, "counters": self.counters, "usage": self.usage, "free": self.num_free,
                "ref": self.ref, "hash": self.hash, "memo": [[b, h, t] for b, (h, t) in self.memo.items()],
                "requests": [r.to_wire() for r in self.requests.values()],
                "finished": [r.to_wire() for r in self.finished], "running": self.running, "waiting": self.waiting,
                "pending": [[sid, s.op, [s.before, list(s.admitted), s.known, s.decode, s.chunk], s.tables]
                            for sid, s in self.pending.items()],
                "gone": [r.to_wire() for r in self._gone.values()]}

    @classmethod
    def from_wire(cls, w: dict) -> Mirror:
        m = cls(w["config"], w["model_info"], null_block=w["null_block"], num_free=w["free"],
                finished_keep=w["finished_keep"], tokens=w["tokens"])
        m.step_count, m.engine_time, m.counters, m.usage = w["step"], w["engine_time"], dict(w["counters"]), w["usage"]
        m.ref, m.hash = list(w["ref"]), list(w["hash"])
        m.memo = {b: (h, list(t)) for b, h, t in w["memo"]}
        for rw in w["requests"]:
            r = Req.from_wire(rw)
            m.requests[r.idx] = r
        m.finished.extend(Req.from_wire(rw) for rw in w["finished"])
        m._gone = {r.idx: r for r in map(Req.from_wire, w["gone"])}
        m.running, m.waiting = list(w["running"]), list(w["waiting"])
        for sid, op, (before, admitted, known, decode, chunk), tables in w["pending"]:
            m.pending[sid] = _Sched(op, list(before), set(admitted), dict(known), list(decode), dict(chunk),
                                    {i: list(t) for i, t in tables.items()})
        m.scheduled_ahead = (m.step_count + 1) if m.pending else None
        return m


class _Sched:
    """A schedule whose update is still to come: vLLM's SchedulerOutput in compact form (`op`),
    and what was derived from it when it was applied, row by row (for its record)."""

    __slots__ = ("_names", "admitted", "before", "chunk", "decode", "known", "op", "order", "tables")

    def __init__(self, op: list, before: list, admitted: set, known: dict, decode: list, chunk: dict,
                 tables: dict | None = None) -> None:
        self.op, self.order, self.before, self.admitted = op, op[2], before, admitted
        self.known, self.decode, self.chunk = known, decode, chunk
        self.tables: dict[int, list[int]] = tables or {}   # tables reset before the record: as they ran
        self._names: set[int] | None = None

    @property
    def names(self) -> set[int]:
        """The requests it scheduled or preempted (its record reads both, even once aborted)."""
        if self._names is None:
            self._names = {*self.order, *self.op[10]}
        return self._names


class _Update:
    __slots__ = (
        "events",
        "finished",
        "finished_ids",
        "ids",
        "new_tokens",
        "sched",
        "schedule_s",
        "step_s",
        "update_s",
        "wall",
    )

    def __init__(self, sched, wall, step_s, schedule_s, update_s, ids, new_tokens, finished, events) -> None:
        self.sched, self.wall, self.step_s, self.schedule_s, self.update_s = sched, wall, step_s, schedule_s, update_s
        self.ids, self.new_tokens, self.finished, self.events = ids, new_tokens, finished, events
        self.finished_ids: list[str] = []


class _Step:
    """What one body touched, as it is applied."""

    __slots__ = ("finished", "gone", "touched", "update")

    def __init__(self) -> None:
        self.touched: dict[int, int] = {}   # request -> first table index whose block may hold new tokens
        self.finished: list[Req] = []
        self.gone: dict[int, Req] = {}
        self.update: _Update | None = None
