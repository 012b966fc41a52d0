"""The live feed against vLLM's own state, after every step: vLLM 0.32's Scheduler, or its
AsyncScheduler driven the way vLLM's engine core drives it (step N+1 scheduled before step
N's update), with kvscope's recorder as its scheduler class (tests/oracle/vllm_side.py
without a model), followed by the real client (`LiveSource`), whose records are applied
(engine.report.changes.apply) as a Session applies them.

    python -m tests.oracle.live_differential --workloads 200 [--async] [--seed 0] [--plant NAME]
        [--groups full+sliding]   # a sliding-window KV cache group beside the full one

After every message it compares, with vLLM's objects read directly:
- the record: each scheduled request's tokens and the computed tokens it starts from (the
  step's own SchedulerOutput, also under async scheduling), whether it is a prefill, its
  chunk index, the admissions, preemptions, sampled tokens and finishes, and the packed
  batch (positions and slots from the block tables vLLM held when it scheduled the step, in
  every KV cache group);
- the state: both queues in order; each request's status, prompt, outputs, computed tokens,
  block table (and with several KV cache groups its table in each other group), preemptions and
  (for finished ones) finish reason; every block's refcount,
  prefix-cache hash (as vLLM's KV events name it), owners, whether it is free and the tokens
  it holds; the number of free blocks;
- the block events (allocated, hits, same-step hits, freed, cached, evicted) the records told
  over the workload against those vLLM's pool made, seen through a wrapper of each per-block
  call (the recorder hooks only per-operation calls and reads the rest from the blocks);
- the record and the state against the schema (engine/report/schema.py), the state against
  the client's own whole snapshot, and, for a second client that joins midway (with async
  scheduling: while a step is in flight), its state too.
Aborts come between steps and between a step's schedule and its update. A difference
prints the workload as a literal; the last line is JSON counts; exit status 1 on any.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import random
import sys
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from .outcome import print_outcome
from .workloads import Workload, random_workload

MAX_ITERATIONS = 20_000
ABORT_CHANCE = 0.04
PLANTED = ("events-by-latest-schedule", "abort-frees-unseen", "sync-scheduler-under-async", "names-kept",
           "evictions-unseen", "empty-step-drops-events", "group-tables-at-admission-only",
           "group-slots-from-admission-only", "placeholder-is-the-landed-token")
PLANT_GROUPS = {"group-tables-at-admission-only": "full+sliding",   # the workloads a fault shows in ("full" else)
                "group-slots-from-admission-only": "full+sliding"}


class Difference(AssertionError):
    pass


@dataclass
class Counts:
    workloads: int = 0
    steps: int = 0
    async_steps_ahead: int = 0     # steps whose state already held the next step's allocations
    placeholders: int = 0          # decode inputs scheduled as placeholders, each checked against its token
    preemptions: int = 0
    hits: int = 0
    evictions: int = 0             # blocks vLLM evicted from the prefix cache as it handed them out
    chunks: int = 0
    aborts_in_flight: int = 0      # aborted between a step's schedule and its update
    aborts_between: int = 0
    joined: int = 0                # steps checked on a client that joined midway
    window_nulls: int = 0          # null blocks in running requests' sliding-window tables, summed over checks
    differences: int = 0
    failures: list[str] = field(default_factory=list)

    def add(self, other: Counts) -> None:
        for k, v in other.__dict__.items():
            if k != "failures":
                setattr(self, k, getattr(self, k) + v)
        self.failures += other.failures

    def summary(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "failures"}


_KEYS: dict = {}


def _key(h) -> str | None:
    """A pool block's hash as vLLM's KV events carry it (vLLM's own conversion)."""
    from vllm.v1.core.kv_cache_utils import get_block_hash, maybe_convert_block_hash

    from explorer.drivers.vllm_live.protocol import event_key

    if h is None:
        return None
    key = _KEYS.get(h)
    if key is None:
        key = _KEYS[h] = event_key(maybe_convert_block_hash(get_block_hash(h)))
    return key


def _status(status) -> str:
    name = status.name
    if name.startswith("FINISHED"):
        return "finished"
    return {"RUNNING": "running", "PREEMPTED": "preempted"}.get(name, "waiting")


class Truth:
    """vLLM's state read from its objects, and the tokens each hashed block was filled with
    (seen on the tables of the requests that held it)."""

    def __init__(self, sched) -> None:
        self.s = sched
        self.kv = sched.kv_cache_manager
        self.pool = self.kv.block_pool
        self.bs = int(sched.cache_config.block_size)
        self.memo: dict[int, tuple[str, list[int]]] = {}
        self.finished: dict[str, object] = {}
        # The KV cache groups in kvscope's order: a full-attention one first (records show its table
        # as a request's block_table, the others as group_block_tables).
        specs = [g.kv_cache_spec for g in sched.kv_cache_config.kv_cache_groups]
        self.order = sorted(range(len(specs)), key=lambda g: type(specs[g]).__name__ != "FullAttentionSpec")
        self.null = self.pool.null_block.block_id
        self.by_hash: dict[bytes, list[int]] = {}  # a block hash -> the tokens it stands for
        self.hashed_upto: dict[str, int] = {}

    def tables(self) -> dict[str, list[int]]:
        first = self.order[0]
        return {r.request_id: list(self.kv.get_block_ids(r.request_id)[first]) for r in self.s.running}

    def group_tables(self) -> dict[str, list[list[int]]]:
        """Each running request's table in every group, kvscope's order."""
        return {r.request_id: [list(ids[g]) for g in self.order]
                for r in self.s.running for ids in (self.kv.get_block_ids(r.request_id),)}

    def scan_all(self) -> None:
        """scan() over every group's tables, and the tokens behind each request's block hashes: a
        sliding-window block can be hashed and leave the window within one schedule (async
        scheduling hashes a block when the step after it is scheduled), never seen in a table."""
        for rid, tables in self.group_tables().items():
            for table in tables:
                self.scan({rid: table})
        bs = self.bs
        for req in (*self.s.requests.values(), *self.finished.values()):
            hashes, start = req.block_hashes, self.hashed_upto.get(req.request_id, 0)
            ids = req.all_token_ids
            for i in range(start, min(len(hashes), len(ids) // bs)):
                self.by_hash[hashes[i]] = list(ids[i * bs:(i + 1) * bs])
            self.hashed_upto[req.request_id] = max(start, min(len(hashes), len(ids) // bs))

    def scan(self, tables: dict[str, list[int]]) -> None:
        """Note the tokens of every full, hashed block in `tables`."""
        bs = self.bs
        for rid, table in tables.items():
            req = self.s.requests.get(rid) or self.finished.get(rid)
            if req is None:
                continue
            ids = req.all_token_ids
            for i, b in enumerate(table):
                if b == self.null:
                    continue
                h = self.pool.blocks[b].block_hash
                if h is not None and (i + 1) * bs <= len(ids):
                    self.memo[b] = (_key(h), list(ids[i * bs:(i + 1) * bs]))

    def state(self) -> dict:
        s, bs = self.s, self.bs
        running = list(s.running)
        every = self.group_tables()
        held: dict[int, list[int]] = {}
        owners: dict[int, list[str]] = {}
        for r in running:
            for table in every[r.request_id]:
                for i, b in enumerate(table):
                    if b == self.null:
                        continue
                    owners.setdefault(b, []).append(r.request_id)
                    held.setdefault(b, list(r.all_token_ids[i * bs:min((i + 1) * bs, r.num_computed_tokens)]))
        blocks = []
        for blk in self.pool.blocks:
            b, key = blk.block_id, _key(blk.block_hash)
            tokens = held.get(b)
            if tokens is None:
                known = self.memo.get(b)
                tokens = known[1] if known is not None and key is not None and known[0] == key else []
                if not tokens and key is not None and len(self.order) > 1:
                    from vllm.v1.core.kv_cache_utils import get_block_hash

                    tokens = self.by_hash.get(get_block_hash(blk.block_hash), [])
            ref = 0 if blk.is_null else blk.ref_cnt  # vLLM does not keep the null block's
            blocks.append({"block_id": b, "ref_count": ref, "hash": key, "token_ids": tokens,
                           "owners": owners.get(b, []), "is_null": blk.is_null,
                           "is_free": blk.ref_cnt == 0 and not blk.is_null})

        def req(r, tables: list[list[int]]) -> dict:
            d = {"request_id": r.request_id, "status": _status(r.status),
                 "prompt_token_ids": list(r.prompt_token_ids), "output_token_ids": list(r.output_token_ids),
                 "num_computed_tokens": r.num_computed_tokens, "block_table": tables[0],
                 "num_preemptions": r.num_preemptions}
            if len(self.order) > 1:
                d["group_block_tables"] = tables[1:]
            return d

        waiting = [*s.waiting, *(getattr(s, "kv_holding_waiting", ()) or ())]
        none = [[] for _ in self.order]
        return {"waiting": [req(r, none) for r in waiting], "running": [req(r, every[r.request_id]) for r in running],
                "blocks": blocks, "num_free_blocks": self.pool.get_num_free_blocks()}


def _projected(snapshot: dict) -> dict:
    keys = ("request_id", "status", "prompt_token_ids", "output_token_ids", "num_computed_tokens", "block_table",
            "num_preemptions", "group_block_tables")
    q = snapshot["queues"]
    return {"waiting": [{k: r[k] for k in keys if k in r} for r in q["waiting"]],
            "running": [{k: r[k] for k in keys if k in r} for r in q["running"]],
            "blocks": snapshot["block_pool"]["blocks"], "num_free_blocks": snapshot["block_pool"]["num_free_blocks"]}


def _first_difference(a, b, path: str = "") -> str | None:
    if type(a) is not type(b):
        return f"{path}: {a!r:.300} != {b!r:.300}"
    if isinstance(a, dict):
        for k in [*a, *(k for k in b if k not in a)]:
            d = _first_difference(a.get(k, "<missing>"), b.get(k, "<missing>"), f"{path}.{k}")
            if d:
                return d
        return None
    if isinstance(a, list) and len(a) == len(b):
        return next((d for i, (x, y) in enumerate(zip(a, b)) if (d := _first_difference(x, y, f"{path}[{i}]"))), None)
    return None if a == b else f"{path}: {a!r:.300} != {b!r:.300}"


class PoolCalls:
    """Every block event vLLM's pool made, noted call by call: its per-block calls
    (`_maybe_evict_cached_block`, `_insert_block_hash`) wrapped as well as the per-operation
    ones, outside the recorder's own hooks (instance attributes, as the recorder's are)."""

    def __init__(self, pool) -> None:
        from explorer.drivers.vllm.capture import BLOCK_EVENTS

        self.pool = pool
        self.events: dict[str, list[int]] = {k: [] for k in BLOCK_EVENTS}
        self.hashed_now: set[int] = set()
        for name in ("get_new_blocks", "touch", "free_blocks", "_insert_block_hash", "_maybe_evict_cached_block"):
            setattr(pool, name, functools.partial(getattr(self, "_" + name.lstrip("_")), getattr(pool, name)))

    def _get_new_blocks(self, original, n):
        blocks = original(n)
        self.events["allocated"] += [b.block_id for b in blocks]
        return blocks

    def _touch(self, original, blocks):
        blocks = list(blocks)
        hits = [b.block_id for b in blocks if not b.is_null]
        self.events["hits"] += hits
        self.events["same_step_hits"] += [b for b in hits if b in self.hashed_now]
        return original(blocks)

    def _free_blocks(self, original, blocks):
        blocks = list(blocks)
        result = original(blocks)
        self.events["freed"] += [b.block_id for b in blocks if b.ref_cnt == 0 and not b.is_null
                                 and (b.pool is None or b.pool is self.pool)]
        return result

    def _insert_block_hash(self, original, key, block, *args, **kwargs):
        result = original(key, block, *args, **kwargs)
        self.events["cached"].append(block.block_id)
        self.hashed_now.add(block.block_id)
        return result

    def _maybe_evict_cached_block(self, original, block):
        evicted = original(block)
        if evicted:
            self.events["evicted"].append(block.block_id)
        return evicted


class Scheduled:
    """What the harness saw of one SchedulerOutput when vLLM scheduled it."""

    def __init__(self, sched, out, async_: bool, chunks: dict[str, int], order: list[int],
                 in_flight: Scheduled | None = None) -> None:
        from vllm.v1.core.sched.scheduler import Scheduler

        reqs = sched.requests
        new = {d.req_id: d.num_computed_tokens for d in out.scheduled_new_reqs}
        c = out.scheduled_cached_reqs
        before = new | dict(zip(c.req_ids, c.num_computed_tokens))
        self.admitted = [r for r in out.num_scheduled_tokens if r in new or r in c.resumed_req_ids]
        self.preempted = sorted(out.preempted_req_ids or ())
        self.rows = []
        kv = sched.kv_cache_manager
        for rid, n in out.num_scheduled_tokens.items():
            r = reqs[rid]
            b = before[rid]
            # A decode computes the request's latest token: the last one it knows (synchronous),
            # or the one still being sampled by the step before (async: a placeholder).
            latest = r.num_tokens + r.num_output_placeholders - (1 if async_ else 0)
            decode = n == 1 and b >= r.num_prompt_tokens and r.num_computed_tokens == latest
            if rid in self.admitted:
                chunks[rid] = 0
            chunk = None
            if not decode:
                chunk = chunks.get(rid, 0)
                chunks[rid] = chunk + 1
            self.rows.append({"request_id": rid, "num_tokens": n, "num_computed_before": b, "is_prefill": not decode,
                              "num_cached_tokens": b if rid in self.admitted else 0, "chunk_index": chunk})
        # `order`: the groups in kvscope's order (Truth.order), the full-attention one first: the
        # records' plain tables, then each other group's
        ids = {rid: kv.get_block_ids(rid) for rid in out.num_scheduled_tokens}
        self.tables = {rid: list(t[order[0]]) for rid, t in ids.items()}
        self.group_tables = {rid: [list(t[g]) for g in order[1:]] for rid, t in ids.items()}
        self.samples = {rid for rid in out.num_scheduled_tokens if not reqs[rid].is_prefill_chunk}
        self.is_scheduler = isinstance(sched, Scheduler)
        # Async scheduling: the output still in flight, and each decode whose input was a
        # placeholder for its token (vLLM's placeholders before this schedule added its own),
        # as the index that token gets in the request's outputs. `step`: its record's number.
        self.in_flight, self.step = in_flight, None
        self.placeholders = {row["request_id"]: len(reqs[row["request_id"]].output_token_ids) for row in self.rows
                             if not row["is_prefill"] and reqs[row["request_id"]].num_output_placeholders
                             - (row["request_id"] in self.samples) > 0} if in_flight is not None else {}


class Run:
    """One workload, stepped, followed and compared (see the module doc)."""

    def __init__(self, w: Workload, seed: int, async_: bool) -> None:
        from explorer.drivers.vllm_live import protocol
        from explorer.drivers.vllm_live.recorder import RecordingScheduler
        from explorer.drivers.vllm_live.server import free_port

        from .vllm_side import VllmScheduler

        self.w, self.seed, self.async_ = w, seed, async_
        self.rng = random.Random(seed * 7919 + 1)
        os.environ[protocol.ENV_FEED] = f"tcp://127.0.0.1:{free_port()}"
        os.environ[protocol.ENV_SNAPSHOT] = f"tcp://127.0.0.1:{free_port()}"
        self.feed, self.snapshots = os.environ[protocol.ENV_FEED], os.environ[protocol.ENV_SNAPSHOT]
        self.side = VllmScheduler(w, RecordingScheduler, async_scheduling=async_)
        self.s = self.side.scheduler
        self.truth = Truth(self.s)
        self.pool_calls = PoolCalls(self.truth.pool)
        self.told: dict[str, list[int]] = {k: [] for k in self.pool_calls.events}  # client 0's records' events
        self.counts = Counts(workloads=1)
        self.chunks: dict[str, int] = {}
        self.scheduled: dict[int, Scheduled] = {}
        self.sampled: dict[str, int] = {}
        self.outputs: list = []
        self.clients: list = []
        self.join_at = self.rng.randint(1, 40)

    # -- vLLM's calls, as its engine core makes them ---------------------------------------------
    def schedule(self):
        self.pool_calls.hashed_now = set()  # a same-step hit is one on a block hashed in this schedule
        in_flight = next((x for x in reversed(self.scheduled.values()) if x.rows), None)
        out = self.s.schedule()
        self.scheduled[id(out)] = Scheduled(self.s, out, self.async_, self.chunks, self.truth.order, in_flight)
        self.truth.scan_all()
        return out

    def update(self, out) -> None:
        from vllm.v1.outputs import ModelRunnerOutput

        seen = self.scheduled.pop(id(out))
        ids = list(out.num_scheduled_tokens)
        tokens = {}
        for rid in ids:
            r = self.s.requests.get(rid)
            if rid in seen.samples and r is not None:
                tokens[rid] = self.w.sampled_token(rid, len(r.output_token_ids))
        # The tables the step was scheduled with, of the requests still alive: one aborted since
        # has had its blocks freed, maybe hashed anew for another request (its tokens were noted
        # when it was aborted).
        before = {**{r: t for r, t in seen.tables.items() if r in self.s.requests}, **self.truth.tables()}
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                sampled_token_ids=[[tokens[r]] if r in tokens else [] for r in ids])
        self.truth.scan_all()  # every group's blocks, before the update frees a finished request's
        result = self.s.update_from_output(out, mro)
        outputs = [o for eco in result.values() for o in eco.outputs]
        for o in outputs:
            if o.finish_reason is not None:
                self.truth.finished[o.request_id] = self.side.requests_seen[o.request_id]
        self.truth.scan(before)
        self.truth.scan_all()
        self.check(seen, outputs)

    def abort(self, in_flight: bool) -> None:
        from vllm.v1.request import RequestStatus

        live = [r.request_id for r in (*self.s.running, *self.s.waiting)]
        if not live:
            return
        rid = self.rng.choice(live)
        self.truth.scan_all()
        self.truth.finished[rid] = self.s.requests[rid]
        self.s.finish_requests(rid, RequestStatus.FINISHED_ABORTED)
        if in_flight:
            self.counts.aborts_in_flight += 1
        else:
            self.counts.aborts_between += 1
            self.check(None, [])

    def run(self) -> Counts:
        w = self.w
        last_arrival = max(r.arrival_step for r in w.requests)
        queue: deque = deque()
        depth = 2 if self.async_ else 1
        self._connect()
        for it in range(MAX_ITERATIONS):
            for r in w.requests:
                if r.arrival_step == it:
                    self.side.add(r)
            if self.rng.random() < ABORT_CHANCE and not queue:
                self.abort(in_flight=False)
            if it == self.join_at:
                self._connect()
            if self.s.has_requests() and len(queue) < depth:
                queue.appendleft(self.schedule())
                if len(queue) < depth and self.s.has_requests():
                    continue  # vLLM's engine core schedules again before it waits for a result
            if queue:
                if self.rng.random() < ABORT_CHANCE:
                    self.abort(in_flight=True)
                self.update(queue.pop())
            if it > last_arrival and not queue and not self.s.has_requests():
                self._check_names_forgotten()
                self._check_block_events()
                return self.counts
        raise Difference(f"the workload did not finish in {MAX_ITERATIONS} iterations")

    # -- following and comparing -------------------------------------------------------------------
    def _connect(self) -> None:
        from explorer.drivers.vllm_live.client import LiveSource

        pub = self.s._rec.publisher
        before = pub.subscribers
        src = LiveSource(self.feed, snapshot_address=self.snapshots, timeout=5.0)
        end = time.monotonic() + 5
        while pub.subscribers <= before and time.monotonic() < end:
            time.sleep(0.002)
        if pub.subscribers <= before:
            raise Difference("the client never subscribed")
        self.clients.append([src, src.snapshot().to_dict()])

    def _check_names_forgotten(self) -> None:
        """Every request finished: the recorder holds none of their names (nothing leaks)."""
        pub = self.s._rec.publisher
        if not pub.flush(10):
            raise Difference("the recorder did not publish every step in 10 s")
        if pub.by_id or pub.names:
            raise Difference(f"every request finished, yet the recorder still names {sorted(pub.by_id)[:5]} "
                             f"({len(pub.by_id)} names, {len(pub.names)} indices)")

    def _check_block_events(self) -> None:
        """The block events the records told, with those the recorder holds for the next step
        (an abort's frees after the last step), are vLLM's, each kind as a multiset (a step's
        events are told with the step they belong to, not in the order of the calls)."""
        pending = self.s._rec.between
        self.counts.evictions += len(self.pool_calls.events["evicted"])
        for kind, made in self.pool_calls.events.items():
            told = self.told[kind] + pending[kind]
            if sorted(told) != sorted(made):
                missing = sorted(set(made) - set(told))[:8]
                extra = sorted(set(told) - set(made))[:8]
                raise Difference(f"block events '{kind}': the records told {len(told)}, vLLM's pool made {len(made)} "
                                 f"(not told: {missing}; told but not made: {extra})")

    def close(self) -> None:
        for src, _ in self.clients:
            src.close()
        self.s.shutdown()

    def check(self, seen: Scheduled | None, outputs: list) -> None:
        from engine.report import schema
        from engine.report.changes import apply

        pub = self.s._rec.publisher
        if not pub.flush(10):
            raise Difference("the recorder did not publish within 10 s")
        truth = self.truth.state()
        self.counts.window_nulls += sum(t.count(self.truth.null) for r in truth["running"]
                                        for t in r.get("group_block_tables", ()))
        for k, client in enumerate(self.clients):
            src = client[0]
            records = []
            end = time.monotonic() + 10
            while src.seq < pub.seq and time.monotonic() < end:
                if src.pending():
                    rec = src.step().to_dict()
                    records.append(rec)
                    client[1] = apply(client[1], rec["changes"])
                else:
                    time.sleep(0.001)
            if src.seq != pub.seq:
                raise Difference(f"client {k} stopped at seq {src.seq}, the recorder at {pub.seq}")
            ran = seen is None or seen.rows or outputs  # vLLM schedules nothing to tell its workers of finishes
            if len(records) > 1 or (ran and not records):
                raise Difference(f"client {k}: {len(records)} records for one step")
            if not records:
                continue  # nothing ran: the recorder told nothing, the client holds the state it was checked at
            if not k:
                for kind, ids in records[0]["blocks"].items():
                    self.told[kind] += ids
            self._check_record(records[0], seen, outputs, count=not k)  # one that just joined too: a whole batch
            if k:
                self.counts.joined += 1
            elif src.scheduled_ahead is not None:
                self.counts.async_steps_ahead += 1
            if src.counters["missed"] or src.counters["rebased"] or src.counters["rejected"]:
                raise Difference(f"client {k} lost steps: {src.counters}, {src.notes[1:]}")
            state = client[1]
            for rec in records:  # those that admit, preempt or finish requests, and every fourth
                busy = rec["new_requests"] or rec["preempted"] or rec["finished"] or rec["step"] % 4 == 1
                problems = schema.record_problems(rec) if busy else []
                if problems:
                    raise Difference(f"the record does not fit the schema: {problems[:3]}")
            # The records' changes carry every dict the state is made of (checked above); the
            # state itself is checked now and then, as the check costs more than the step.
            problems = schema.snapshot_problems(state) if state["step"] % 16 == 1 else []
            if problems:
                raise Difference(f"the state does not fit the schema: {problems[:3]}")
            mine = _projected(state)
            diff = truth != mine and _first_difference(truth, mine)
            if diff:
                raise Difference(f"client {k}, step {state['step']}: the state differs from vLLM's at {diff}")
            whole = src.snapshot().to_dict()
            diff = whole != state and _first_difference(whole, state)
            if diff:
                raise Difference(f"client {k}, step {state['step']}: its whole snapshot differs from the changes "
                                 f"at {diff}")
            self._check_finished(state)

    def _check_finished(self, state: dict) -> None:
        finished = {r["request_id"]: r for r in state["queues"]["finished"]}
        for rid, r in self.truth.finished.items():
            if r is None:
                continue
            mine = finished.get(rid)
            if mine is None:
                raise Difference(f"request {rid} finished in vLLM but not in the state")
            want = r.get_finished_reason().name.lower()
            if mine["finish_reason"] != want or mine["output_token_ids"] != list(r.output_token_ids):
                raise Difference(f"request {rid}: finished ({mine['finish_reason']}, {mine['output_token_ids']}) but "
                                 f"vLLM says ({want}, {list(r.output_token_ids)})")
            clocks = mine["metrics"]
            if any(len(clocks[c]["token_times"]) != len(mine["output_token_ids"]) for c in ("engine", "wall")):
                raise Difference(f"request {rid}: a token time per output token expected")

    def _check_record(self, rec: dict, seen: Scheduled | None, outputs: list, count: bool = True) -> None:
        c = self.counts if count else Counts()
        c.steps += 1
        if seen is None:  # an abort between steps: a record without a step
            if rec["scheduled"]:
                raise Difference("a record without a step scheduled something")
            return
        got = rec["scheduled"]
        if got != seen.rows:
            diff = _first_difference(seen.rows, got)
            raise Difference(f"step {rec['step']}: scheduled differs from its SchedulerOutput at {diff}")
        if rec["new_requests"] != seen.admitted or rec["preempted"] != seen.preempted:
            raise Difference(f"step {rec['step']}: admitted {rec['new_requests']} / preempted {rec['preempted']}, "
                             f"vLLM {seen.admitted} / {seen.preempted}")
        sampled = {o.request_id: o.new_token_ids[-1] for o in outputs if o.new_token_ids}
        if {k: v["token_id"] for k, v in rec["sampled"].items()} != sampled:
            raise Difference(f"step {rec['step']}: sampled {rec['sampled']} but vLLM {sampled}")
        done = [o.request_id for o in outputs if o.finish_reason is not None]
        if rec["finished"][:len(done)] != done:
            raise Difference(f"step {rec['step']}: finished {rec['finished']} but vLLM {done}")
        self._check_batch(rec, seen)
        self._check_ahead(rec, seen, count)
        c.preemptions += len(rec["preempted"])
        c.hits += len(rec["blocks"]["hits"])
        c.chunks += sum(s["is_prefill"] and s["chunk_index"] > 0 for s in rec["scheduled"])

    def _check_ahead(self, rec: dict, seen: Scheduled, first_client: bool) -> None:
        """A step scheduled while another was in flight is marked with that step's number and the
        token each placeholder input turned out to be (a client that joined meanwhile took the
        pending schedule from the wire, unmarked: only the first client's records are held to it)."""
        seen.step = rec["step"]
        if not first_client:
            return
        want = None
        # (a schedule of nothing, to tell of finishes, is no step; nor one whose in-flight step told nothing)
        if seen.in_flight is not None and seen.in_flight.step is not None and seen.rows:
            held = {}
            for rid, k in seen.placeholders.items():
                r = self.s.requests.get(rid) or self.truth.finished.get(rid)
                if r is not None and k < len(r.output_token_ids):   # a dropped token is left out
                    held[rid] = r.output_token_ids[k]
            want = {"in_flight_step": seen.in_flight.step, "placeholders": held}
            self.counts.placeholders += len(held)
        if rec["scheduled_ahead"] != want:
            raise Difference(f"step {rec['step']}: scheduled_ahead {rec['scheduled_ahead']}, vLLM {want}")

    def _check_batch(self, rec: dict, seen: Scheduled) -> None:
        bs = self.truth.bs
        batch = rec["batch"]
        qsl = batch["query_start_loc"]
        for row, s in enumerate(seen.rows):
            rid, b, n = s["request_id"], s["num_computed_before"], s["num_tokens"]
            table = seen.tables[rid]
            lo, hi = qsl[row], qsl[row + 1]
            want = {"positions": list(range(b, b + n)),
                    "slot_mapping": [table[p // bs] * bs + p % bs for p in range(b, b + n)]}
            got = {"positions": batch["positions"][lo:hi], "slot_mapping": batch["slot_mapping"][lo:hi]}
            r = self.s.requests.get(rid) or self.truth.finished.get(rid)
            if r is not None:
                known = list(r.all_token_ids[b:b + n])
                want["input_ids"] = known + [-1] * (n - len(known))  # sampled on the device, dropped by vLLM
                got["input_ids"] = batch["input_ids"][lo:hi]
            if got != want or batch["block_tables"][row] != table[:(b + n + bs - 1) // bs] or hi - lo != n:
                raise Difference(f"step {rec['step']}: the batch row of {rid} differs: {got} != {want}")
            self._check_group_rows(rec, row, rid, b, n, seen.group_tables[rid])

    def _check_group_rows(self, rec: dict, row: int, rid: str, b: int, n: int, tables: list[list[int]]) -> None:
        """Each other KV cache group's slots of one row, from that group's table as vLLM held it when
        it scheduled the step, and its block-table row: the model runner's, which keeps a block
        where the scheduler has since put the null block (tokens that left a sliding window)."""
        batch, bs = rec["batch"], self.truth.bs
        if len(batch.get("group_slot_mappings", ())) != len(tables):
            raise Difference(f"step {rec['step']}: {len(batch.get('group_slot_mappings', ()))} other groups' slots, "
                             f"vLLM has {len(tables)} other groups")
        lo, hi = batch["query_start_loc"][row], batch["query_start_loc"][row + 1]
        for g, table in enumerate(tables):
            want = [table[p // bs] * bs + p % bs for p in range(b, b + n)]
            got, held = batch["group_slot_mappings"][g][lo:hi], batch["group_block_tables"][g][row]
            if got != want or len(held) != (b + n + bs - 1) // bs or any(
                    t not in (h, self.truth.null) for h, t in zip(held, table)):
                raise Difference(f"step {rec['step']}: group {g + 1}'s batch row of {rid} differs: slots {got} != "
                                 f"{want}, table {held} against vLLM's {table}")


def run_workload(w: Workload, seed: int, async_: bool) -> tuple[Counts, str | None]:
    run = None
    try:
        run = Run(w, seed, async_)
        return run.run(), None
    except Difference as exc:
        counts = run.counts if run is not None else Counts(workloads=1)
        counts.differences = 1
        return counts, str(exc)
    finally:
        if run is not None:
            run.close()


@contextmanager
def planted(bug: str):
    """Put back a way the recorder could part from vLLM, to show the comparison catches it."""
    from explorer.drivers.vllm_live import recorder

    if bug == "events-by-latest-schedule":  # a step's record taken from the latest schedule, not its own
        original = recorder._Notes.begin_update

        def begin_update(self, out):
            if self.caps:
                out = list(self.caps.values())[-1].out
            return original(self, out)

        cls, name, patch = recorder._Notes, "begin_update", begin_update
    elif bug == "abort-frees-unseen":  # the blocks an abort frees are not read again
        take = recorder.PoolNotes.take

        def patch(self):
            dirty, cached, cleared = take(self)
            return [b for b in dirty if self.pool.blocks[b].ref_cnt > 0], cached, cleared

        cls, name = recorder.PoolNotes, "take"
    elif bug == "sync-scheduler-under-async":  # the recorder subclasses Scheduler whatever the config says
        cls, name, patch = recorder.RecordingScheduler, "__new__", lambda c, *a, **k: object.__new__(c)
    elif bug == "names-kept":  # a finished request's name is never forgotten
        cls, name, patch = recorder._Publisher, "_forget_finished", lambda self, ops: None
    elif bug == "evictions-unseen":  # the blocks vLLM evicts as it hands them out are not noted
        def patch(self, original, num_blocks):
            blocks = original(num_blocks)
            self.events["allocated"] += [b.block_id for b in blocks]
            self.dirty.update(b.block_id for b in blocks)
            return blocks

        cls, name = recorder.PoolNotes, "_get_new_blocks"
    elif bug == "empty-step-drops-events":  # a step that ran nothing takes its block events with it
        updated = recorder._Notes.updated

        def patch(self, cap, result):
            if cap.out is not None and not cap.out.total_num_scheduled_tokens:
                cap.events = recorder.new_events()
            return updated(self, cap, result)

        cls, name = recorder._Notes, "updated"
    elif bug == "group-tables-at-admission-only":  # other groups' tables sent when admitted, never again
        def patch(self):
            g = self.groups
            if not g.several:
                return None
            return [[r.request_id, g.tables(r.request_id)[1:], h] for r in self.s.running
                    if (h := g.hits.pop(r.request_id, None)) is not None]

        cls, name = recorder._Notes, "_group_tables"
    elif bug == "group-slots-from-admission-only":  # other groups' new blocks sent at admission, never again
        sched_op = recorder._Publisher._sched_op

        def patch(self, sid, out, budget, tables, group_tables):
            return sched_op(self, sid, out, budget, tables, [(new, [None] * len(c)) for new, c in group_tables])

        cls, name = recorder._Publisher, "_sched_op"
    elif bug == "placeholder-is-the-landed-token":  # async: a placeholder taken for the latest landed token
        from explorer.drivers.vllm_live import mirror

        note_ahead = mirror.Mirror._note_ahead

        def patch(self, sched, rows, outs):
            note_ahead(self, sched, rows, outs)
            sched.placeholders = {i: k - 1 for i, k in sched.placeholders.items()}

        cls, name = mirror.Mirror, "_note_ahead"
    else:
        raise ValueError(f"unknown bug {bug!r}; one of {PLANTED}")
    original_attr = cls.__dict__[name]
    setattr(cls, name, staticmethod(patch) if name == "__new__" else patch)
    try:
        yield
    finally:
        setattr(cls, name, original_attr)


def live_workload(seed: int, groups: str = "full") -> Workload:
    """random_workload's, or for "sliding+full" its full+sliding one with vLLM given the sliding
    group first (as vLLM orders a Gemma 3's groups): the feed's plain tables must stay the full one's."""
    if groups == "sliding+full":
        return replace(random_workload(seed, "full+sliding"), vllm_group_order="sliding,full")
    return random_workload(seed, groups)


def run_many(seeds: range, async_: bool, groups: str = "full") -> Counts:
    total = Counts()
    for seed in seeds:
        w = live_workload(seed, groups)
        counts, failure = run_workload(w, seed, async_)
        total.add(counts)
        if failure and len(total.failures) < 3:
            total.failures.append(f"seed {seed} ({'async' if async_ else 'sync'} scheduling): {failure}\n{w!r}")
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0, help="first workload seed")
    ap.add_argument("--async", dest="async_", action="store_true",
                    help="vLLM's AsyncScheduler, as a GPU server runs it")
    ap.add_argument("--groups", choices=("full", "full+sliding", "sliding+full"), default="full",
                    help="KV cache groups: full attention, or a sliding-window group beside it (after it, or first "
                         "in vLLM's order)")
    ap.add_argument("--plant", choices=PLANTED, help="put back one fault; exit 0 when a workload catches it")
    args = ap.parse_args(argv)
    import gc

    from . import vllm_side  # noqa: F401  (import vLLM once, before timing)
    gc.freeze()
    t0 = time.monotonic()
    seeds = range(args.seed, args.seed + args.workloads)
    if args.plant:
        with planted(args.plant):
            groups = PLANT_GROUPS.get(args.plant, args.groups)
            caught = next((s for s in seeds if run_workload(live_workload(s, groups), s, args.async_)[1]), None)
        print(json.dumps({"plant": args.plant, "first_seed": caught}))
        return 0 if caught is not None else 1
    total = run_many(seeds, args.async_, args.groups)
    return print_outcome(total, f"live feed vs vLLM 0.32 ({'async' if args.async_ else 'synchronous'} scheduling): "
                                f"{args.workloads} workloads in {time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
