"""The state of one vLLM engine core as the live feed carries it, kept in compact form, and
the compact step that moves it on: one code for both ends of the feed.

The recorder (recorder.py) turns what vLLM's scheduler did into a *body* (below) on a thread
of its own, applies it to its `Mirror` (so a client that joins gets that state whole) and
sends it. The client (client.py) applies the same body to its own `Mirror` with
`expand=True`, which also spells the step as kvscope's StepRecord dict with its `changes`
(engine/report/changes.py's ChangesDict), and a whole EngineSnapshot dict when asked: the
Session and every consumer read the schema's dicts, never this form.

A body (wire.py's `Body`, a typed struct; each op below is one of its array-like structs, so it
travels as the list shown) is {"ops": [...], "blocks": [ids, refcounts, hash keys], "cached":
[[block, request, table index]], "cleared": bool, "queues": [running, waiting] | None, "free":
int, "usage": float}, with "groups": [[i, tables, hits | None]] for a model of several KV cache
groups (each running request's tables past kvscope's first, whole, after the update, and each
group's own hit where vLLM looked its prefix up since the last body); requests are small
integers (indices the recorder gives them), and `ops` are, in the order vLLM did them:

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
from itertools import chain, compress
from operator import add, sub
from typing import Literal, cast, overload

from engine.report.schema import (
    REC,
    StepRecordDict,
)

from .mirror_expand import Expander
from .mirror_state import DEFER_AT_MOST, NO_BLOCKS, BodyStep, Req, Sched, Update, stamp
from .wire import Arrived, Body, RanNothing, Scheduled, Updated


class Mirror(Expander):
    """One engine core's state for the feed (mirror_state.MirrorState), moved on by the bodies
    the module doc describes, and spelled as the schema's dicts (mirror_expand.Expander)."""

    # -- applying a body -------------------------------------------------------------------------
    @overload
    def apply(self, body: Body, expand: Literal[True]) -> StepRecordDict: ...

    @overload
    def apply(self, body: Body, expand: bool = False) -> StepRecordDict | None: ...

    def apply(self, body: Body, expand: bool = False) -> StepRecordDict | None:
        """Move the state on by one body; with `expand`, return its StepRecord dict, `changes` in."""
        step = BodyStep()
        for op in body.ops:
            if isinstance(op, Scheduled):
                self._schedule(op, step, expand)
            elif isinstance(op, Updated):
                self._update(op, step)
            elif isinstance(op, Arrived):
                self._arrive(op, step)
            elif isinstance(op, RanNothing):  # a schedule that ran nothing: no record
                if op.sid is not None:
                    self.pending.pop(op.sid, None)
            else:
                for idx, reason in op.finished:
                    req = self.requests.get(idx)
                    if req is not None and req.finish_reason is None:
                        self._finish(req, reason, op.wall_time, self.engine_time, step)
        for g in body.groups or ():  # several KV cache groups: after the update
            req = self.requests.get(g.idx)
            if req is not None:
                req.group_tables = g.tables
                if g.hits is not None:
                    req.group_hits = g.hits
        ref, hashes = self.ref, self.hash
        if body.cleared:
            self.settle()
            hashes[:] = [None] * len(hashes)
            self.memo.clear()
        ids, refs, keys = body.blocks
        for b, r, h in zip(ids, refs, keys):
            ref[b] = r
            hashes[b] = h
        bs = self.block_size
        for b, idx, i in body.cached:
            req = self.requests.get(idx) or step.gone.get(idx)
            key = hashes[b]
            if req is not None and key is not None:
                if self.tokens and self.defer_decodes:  # the block's tokens may be deferred ones
                    self._memo_due.append((b, key, req, i))
                else:
                    self.memo[b] = (key, req.tokens(i * bs, (i + 1) * bs) if self.tokens else [])
        if body.queues is not None:
            self.running, self.waiting = list(body.queues[0]), list(body.queues[1])
        self.num_free, self.usage = body.free, body.usage
        if step.update is None:
            # No step ran (an abort between steps): its record keeps the last step's number and
            # schedules nothing, and a Session brings its latest entry up to date with it
            # (Session._append) instead of adding a step vLLM never ran.
            step.update = Update(None, body.wall or time.time(), 0.0, 0.0, 0.0, [], [], [], {})
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

    def _arrive(self, op: Arrived, step: BodyStep) -> None:
        req = Req(op.idx, op.request_id, list(op.prompt), op.num_prompt, op.max_tokens, op.sampling_params,
                  list(op.stop), list(op.prompt_hashes), dict(op.domain))
        req.metrics.wall.arrival_time, req.metrics.engine.arrival_time = op.arrival_time, self.engine_time
        self.requests[op.idx] = req
        step.touched[op.idx] = 0

    def _schedule(self, op: Scheduled, step: BodyStep, expand: bool = False) -> None:
        sid, order, ns, new, cached_ids = op.sid, op.order, op.num_tokens, op.new, op.cached_ids
        cached_before, cached_blocks, cached_out = op.cached_before, op.cached_new_blocks, op.cached_outputs
        resumed, preempted = op.resumed, op.preempted
        reqs, counters = self.requests, self.counters
        admitted = set(resumed)
        if not new and cached_ids == order:  # running requests only (decode steps): vLLM's lists line up
            bs_, outs = cached_before, cached_out
        else:
            before = dict(zip(cached_ids, cached_before))
            with_placeholders = dict(zip(cached_ids, cached_out))  # outputs + tokens still being sampled
            for k, (idx, b, table) in enumerate(new):
                req = reqs[idx]
                before[idx], with_placeholders[idx] = b, req.n_output
                req.table = list(table)
                req.runner_tables = [list(g[0][k]) for g in op.groups]
                admitted.add(idx)
            bs_, outs = list(map(before.__getitem__, order)), list(map(with_placeholders.__getitem__, order))
        for idx, blocks in compress(zip(cached_ids, cached_blocks), cached_blocks):  # those given blocks
            if idx not in admitted:
                reqs[idx].table += cast("list[int]", blocks)   # (those given blocks: compress dropped None)
        for g, (_, group_blocks) in enumerate(op.groups):   # the other KV cache groups' likewise
            for idx, blocks in compress(zip(cached_ids, group_blocks), group_blocks):
                if idx not in admitted:
                    reqs[idx].runner_tables[g] += cast("list[int]", blocks)
        for idx in resumed:
            k = cached_ids.index(idx)
            self._reset_table(reqs[idx], list(cached_blocks[k] or ()), [list(g[1][k] or ()) for g in op.groups])
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
        sched = Sched(op, list(bs_), admitted, known, decode, chunk)
        if expand and self.pending:   # the steps scheduled ahead, for the records
            self._note_ahead(sched, rs, outs)
        self.pending[sid] = sched

    def _note_ahead(self, sched: Sched, rows: list[Req], outs: list[int]) -> None:
        """A schedule made while another was in flight (async scheduling): that one, and the decode
        rows whose input was a placeholder for its token (vLLM counted more outputs than had landed).
        A client that joins between the two takes the pending schedule from the wire without this:
        that one step's record is not marked."""
        in_flight = next((s for s in reversed(self.pending.values()) if s.order), None)
        if in_flight is None:   # only schedules that ran nothing: no token in flight
            return
        sched.ahead_of = in_flight
        for req, n, is_decode in zip(rows, outs, sched.decode):
            if is_decode and n > req.n_output:
                sched.placeholders[req.idx] = req.n_output

    def _reset_table(self, req: Req, table: list[int], runner_tables: list[list[int]] | None = None) -> None:
        """A request's tables start again (preempted, resumed, finished): a step scheduled before
        that, whose record is still to come, keeps the tables it ran with."""
        for s in self.pending.values():
            if req.idx in s.names and req.idx not in s.tables:
                s.tables[req.idx] = req.table
                s.runner_tables[req.idx] = req.runner_tables
        req.table = table
        req.runner_tables = runner_tables or []
        req.group_tables = []  # a running request's come with the body's groups
        if self.sent is not None:
            self.sent.table_went_back(req.rid)

    def _finish(self, req: Req, reason: str, wall: float, engine: float, step: BodyStep) -> None:
        self.settle()  # a finished request's outputs are whole
        req.finish_reason, req.status = reason, "finished"
        stamp(req.metrics, "finished_time", wall, engine)
        self._reset_table(req, [])
        step.finished.append(req)
        step.gone[req.idx] = req
        if any(req.idx in s.names for s in self.pending.values()):
            self._gone[req.idx] = req

    def _update(self, op: Updated, step: BodyStep) -> None:
        sid, wall, ids, finished = op.sid, op.wall_time, op.ids, op.finished
        # Each request's new token ids, or (KVSCOPE_FEED_TOKENS=0) their counts.
        new_tokens = cast("list[list[int]]", op.new_tokens)
        engine_start = self.engine_time
        self.step_count += 1
        self.engine_time = engine = engine_start + op.step_s
        # Still pending while its requests finish: they keep their tables for it.
        sched = self.pending.get(sid) if sid is not None else None
        if sched is not None:
            sched.step = self.step_count
        u = step.update = Update(sched, wall, op.step_s, op.schedule_s, op.update_s, ids, new_tokens, finished,
                                 op.events)
        counters = self.counters
        touched = step.touched
        if sched is not None:
            for idx in sched.admitted:
                stamp(self._req(idx).metrics, "first_scheduled_time", wall, engine_start)
                touched.setdefault(idx, NO_BLOCKS)
            preempted = sched.op.preempted
            for idx in preempted:
                touched.setdefault(idx, NO_BLOCKS)
                m = self._req(idx).metrics
                m.wall.preempted_times.append(wall)
                m.engine.preempted_times.append(engine_start)
            counters["num_preemptions"] += len(preempted)
        reqs = self.requests
        counts = list(map(len, new_tokens)) if self.tokens else cast("list[int]", op.new_tokens)
        decodes = self.tokens and counts.count(1) == len(counts)  # one token each: the common step
        if decodes and self.defer_decodes:
            self._decodes.append((ids, list(chain.from_iterable(new_tokens)), wall, engine))
            if len(self._decodes) >= DEFER_AT_MOST:
                self.settle()
        else:
            self.settle()  # the deferred tokens come first
            self._add_outputs(list(map(reqs.get, ids)), new_tokens, counts, decodes, wall, engine)
        generated = sum(counts)
        if self.sent is not None:
            for idx in ids:
                touched.setdefault(idx, NO_BLOCKS)
        counters["num_generated_tokens"] += generated
        for k, reason in finished:
            req = reqs.get(ids[k])
            if req is not None and req.finish_reason is None:
                self._finish(req, reason, wall, engine, step)
                u.finished_ids.append(req.rid)
        if sid is not None:
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
