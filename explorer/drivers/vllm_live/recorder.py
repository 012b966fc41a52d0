"""The recorder: vLLM 0.32's own v1 scheduler, unchanged in what it decides, publishing every
step to kvscope.

    KVSCOPE_FEED=tcp://127.0.0.1:5590 python -m vllm.entrypoints.openai.api_server \\
        --model DIR --scheduler-cls explorer.drivers.vllm_live.RecordingScheduler

It runs in each of vLLM's engine-core processes (one per data-parallel rank), next to the KV
cache manager and its block pool. `RecordingScheduler` is vLLM's `Scheduler`, or its
`AsyncScheduler` where the server's `async_scheduling` setting selects that one (a custom
`--scheduler-cls` replaces vLLM's choice, so the recorder makes it again): the server keeps
its behaviour.

On vLLM's scheduler thread the recorder only takes what the step touched: references to the
SchedulerOutput and the EngineCoreOutputs, the block ids of the block pool's calls
(explorer/drivers/vllm/pool_notes.py), and at the end of each update the refcount and hash of each block that
changed and, when a queue moved, the queues' request ids. A thread of its own
(`_Publisher`), woken once vLLM's thread has scheduled the next step and waits for the model,
turns that into the compact body mirror.py spells and publishes it without blocking: no
subscriber, or one that does not read, costs a counter, never a wait. It applies the bodies
to its `Mirror` (a joining client's snapshot) in runs, and all of them before a snapshot is
taken.

Each step is keyed by its SchedulerOutput, so vLLM's async scheduling (schedule N+1 before
update N) keeps each step's events apart; the state after a step is vLLM's state after its
update, so with async scheduling it holds the next step's allocations too (the mirror says
which step's). A recorder that cannot bind its addresses logs one error and the engine
core serves without a feed.
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from operator import attrgetter
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from engine.report.schema import INFO
from engine.sampling_params import SamplingParams

from ..vllm.groups import KVGroups
from ..vllm.pool_notes import PoolNotes, new_events
from ..vllm.records import hash_domain, kv_events_use_int_hashes
from . import protocol
from .mirror import Mirror
from .wire import (
    Arrived,
    Body,
    FinishedBetween,
    GroupTables,
    Op,
    RanNothing,
    Scheduled,
    SnapshotMessage,
    StepMessage,
    StoppedMessage,
    Updated,
)

log = logging.getLogger("vllm.kvscope_recorder")  # a child of vLLM's logger: its handler and format

_LOOK_EVERY_S = 0.05  # as long as the feed thread's idle wait: an idle recorder looks each time it wakes
# Bodies are applied to the recorder's mirror in runs of this many (and before a snapshot):
# applied one per step, between vLLM's steps, the mirror's requests are out of this thread's
# caches each time, and applying took twice as long.
_APPLY_EVERY = 32
# ... and between two of them the thread sleeps this long, so that vLLM's scheduler thread, if it
# waits for the GIL, takes it: a run held the GIL for up to the interpreter's switch interval
# (5 ms) at a time, and a sleep(0) hands it over for certain only to a thread that waited that long.
_YIELD_S = 50e-6
_REQUEST_ID, _NEW_TOKEN_IDS, _FINISH_REASON = map(attrgetter, ("request_id", "new_token_ids", "finish_reason"))
# A block's refcount and hash, read in C for every block a step touched (`_block_hash`: the
# field behind KVCacheBlock's property, without a Python call per block).
_REF_CNT, _BLOCK_HASH = attrgetter("ref_cnt"), attrgetter("_block_hash")


def _vllm_config(args: tuple, kwargs: dict) -> Any:
    return kwargs["vllm_config"] if "vllm_config" in kwargs else args[0]


class RecordingScheduler(Scheduler):
    """vLLM's v1 Scheduler (or AsyncScheduler, as the server's config selects), unchanged in
    what it decides, publishing each step to kvscope."""

    def __new__(cls, *args: Any, **kwargs: Any) -> RecordingScheduler:
        if cls is RecordingScheduler and getattr(_vllm_config(args, kwargs).scheduler_config, "async_scheduling",
                                                 False):
            cls = AsyncRecordingScheduler  # what vLLM would have picked without --scheduler-cls
        return super().__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._rec: _Notes | None = None
        settings = protocol.feed_settings(rank=_rank(self.vllm_config))
        try:
            self._rec = _Notes(self, settings)
        except Exception as exc:  # noqa: BLE001 - the recorder must never take the server down
            log.error("%s (data-parallel rank %d): %s: %s. The server serves as usual; set %s to a free address "
                      "(rank r binds its ports + %d r)", protocol.NO_FEED, settings["rank"], type(exc).__name__, exc,
                      protocol.ENV_FEED, protocol.RANK_STRIDE)

    # -- vLLM's calls -------------------------------------------------------------------------
    def add_request(self, request: Any) -> None:
        new = request.request_id not in self.requests
        super().add_request(request)
        if self._rec is not None and new:
            self._rec.arrived(request)

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        rec = self._rec
        if rec is None:
            return super().schedule(*args, **kwargs)
        cap = rec.begin_schedule()
        try:
            out = super().schedule(*args, **kwargs)
        finally:
            rec.end_call()
        rec.scheduled(cap, out)
        return out

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        rec = self._rec
        if rec is None:
            return super().update_from_output(scheduler_output, model_runner_output)
        cap = rec.begin_update(scheduler_output)
        try:
            result = super().update_from_output(scheduler_output, model_runner_output)
        finally:
            rec.end_call()
        rec.updated(cap, result)
        return result

    def finish_requests(self, request_ids: Any, finished_status: Any) -> Any:
        result = super().finish_requests(request_ids, finished_status)
        if self._rec is not None and result:
            self._rec.finished_outside(result, finished_status)
        return result

    def shutdown(self) -> None:
        if self._rec is not None:
            self._rec.close()
        super().shutdown()


class AsyncRecordingScheduler(RecordingScheduler, AsyncScheduler):
    """The recorder over vLLM's AsyncScheduler (schedule step N+1 while step N runs)."""


def _runner_owned_tables(out: Any, group: int = 0) -> tuple[list[list[int]], list]:
    """Copies, taken on the scheduler thread before the step runs, of the block-id lists that
    vLLM's model runner makes its own: a new request's and a resumed one's. A single-worker
    executor (a GPU server at tensor parallel 1, or an engine core in the API server's process)
    hands the runner the SchedulerOutput itself, and the runner extends those lists in later
    steps, so by the time the recorder's thread reads them they may hold blocks of steps to
    come. The other requests' new blocks are only read by the runner: they go as they are.
    `group`: the KV cache group the feed's tables follow (kvscope's group 0, in vLLM's order)."""
    new = [list(d.block_ids[group]) for d in out.scheduled_new_reqs]
    c = out.scheduled_cached_reqs
    cached = [b and b[group] for b in c.new_block_ids]
    if c.resumed_req_ids:
        cached = [list(b) if b and rid in c.resumed_req_ids else b for rid, b in zip(c.req_ids, cached)]
    return new, cached


class _Cap:
    """One step as the scheduler thread notes it: its SchedulerOutput, its block events, times."""

    __slots__ = ("events", "out", "schedule_s", "sid", "started", "update_s")

    def __init__(self, sid: int | None, events: dict) -> None:
        self.sid, self.out, self.events = sid, None, events
        self.started = time.perf_counter()
        self.schedule_s = self.update_s = 0.0


class _Notes:
    """The recorder on vLLM's scheduler thread: notes, then hands them to the publisher at the
    end of each update, and wakes it once the next schedule is made (`_hand_over`; see the
    module doc). Its own time there is counted in
    `recorder_ms` / `recorder_cpu_ms` (the block-pool hooks' share of vLLM's calls aside)."""

    def __init__(self, scheduler: Scheduler, settings: dict) -> None:
        self.s = scheduler
        self.pool = scheduler.kv_cache_manager.block_pool
        self.groups = KVGroups(scheduler)  # several where the model mixes kinds of layers (Gemma 3)
        self.first_group = self.groups.order[0]  # kvscope's group 0: full attention where there is one
        info = _model_info(scheduler.vllm_config) | {INFO.KV_CACHE_GROUPS: self.groups.describe()}
        self.mirror = Mirror(_config_dict(scheduler.vllm_config, scheduler), info,
                             null_block=int(self.pool.null_block.block_id),
                             num_free=int(self.pool.get_num_free_blocks()), finished_keep=settings["finished"],
                             tokens=settings["tokens"], defer_decodes=True)
        self.publisher = _Publisher(settings, self.mirror, int(self.mirror.block_size), len(self.pool.blocks))
        self.notes = PoolNotes(self.pool)
        self.between = new_events()       # block events outside any step (an abort's frees)
        self.notes.begin(self.between)
        self.items: list[tuple] = []      # what happened since the last hand-over, in order
        self.caps: dict[int, _Cap] = {}   # id(SchedulerOutput) -> its step, until its update
        self.sid = 0
        self.in_step = False
        self.queues_moved = True
        self.counters = self.publisher.counters

    def _own(self, t0: float, c0: float) -> None:
        c = self.counters
        c["recorder_ms"] += (time.perf_counter() - t0) * 1e3
        c["recorder_cpu_ms"] += (time.thread_time() - c0) * 1e3

    def _lengths(self) -> tuple[int, int]:
        s = self.s
        return len(s.running), len(s.waiting)

    def _take_between(self) -> dict:
        between, self.between = self.between, new_events()
        return between

    # -- the calls ---------------------------------------------------------------------------
    def arrived(self, request: Any) -> None:
        self.items.append(("a", request))
        self.queues_moved = True

    def begin_schedule(self) -> _Cap:
        self.sid += 1
        cap = _Cap(self.sid, self._take_between())  # what happened between steps is told with this one
        self.notes.begin(cap.events)
        self.in_step = True
        self._before = self._lengths()
        return cap

    def end_call(self) -> None:
        self.notes.begin(self.between)
        self.in_step = False

    def scheduled(self, cap: _Cap, out: Any) -> None:
        t0, c0 = time.perf_counter(), time.thread_time()
        cap.schedule_s = t0 - cap.started
        cap.out = out
        self.caps[id(out)] = cap
        self.items.append(("s", cap.sid, out, int(self.s.max_num_scheduled_tokens),
                           _runner_owned_tables(out, self.first_group),
                           [_runner_owned_tables(out, g) for g in self.groups.order[1:]]))
        if (out.scheduled_new_reqs or out.preempted_req_ids or out.scheduled_cached_reqs.resumed_req_ids
                or self._lengths() != self._before):
            self.queues_moved = True
        self.publisher.wake_up()   # the step before is handed over: see _hand_over
        self._own(t0, c0)

    def begin_update(self, out: Any) -> _Cap:
        cap = self.caps.pop(id(out), None)
        if cap is None:  # scheduled before this recorder (never): a step of its own
            cap = _Cap(None, new_events())
            cap.out = out
        events = self._take_between()  # an abort between schedule and update is this step's
        for k, v in events.items():
            cap.events[k] += v
        self.notes.begin(cap.events)
        self.in_step = True
        self._before = self._lengths()
        cap.update_s = time.perf_counter()
        return cap

    def updated(self, cap: _Cap, result: Any) -> None:
        t0, c0 = time.perf_counter(), time.thread_time()
        cap.update_s = t0 - cap.update_s
        if cap.out is not None and _ran_nothing(cap.out, _outputs(result)):
            # vLLM ran nothing (a step that tells its workers of finished requests): no record
            # comes of it (the publisher's "x"), so the block events it carries, an abort's frees
            # between steps among them, are told with the next step, before that step's own.
            for kind, ids in cap.events.items():
                self.between[kind][:0] = ids
            cap.events = new_events()
        self.items.append(("u", cap, result, time.time(), t0 - cap.started, self._group_tables()))
        if self._lengths() != self._before:
            self.queues_moved = True
        self._hand_over(wake=False)
        self._own(t0, c0)

    def _group_tables(self) -> list | None:
        """With several KV cache groups: each running request's tables past kvscope's first
        (whole: a sliding window's is not append-only) and, where vLLM looked its prefix up since
        the last update, each group's own hit. Read here: they change in the next schedule."""
        g = self.groups
        if not g.several:
            return None
        hits = g.hits
        return [[r.request_id, g.tables(r.request_id)[1:], hits.pop(r.request_id, None)] for r in self.s.running]

    def finished_outside(self, requests: list, status: Any) -> None:
        t0, c0 = time.perf_counter(), time.thread_time()
        from vllm.v1.request import RequestStatus

        for r in requests:
            self.groups.hits.pop(r.request_id, None)
        reason = RequestStatus.get_finished_reason(status)
        self.items.append(("f", [r.request_id for r in requests], reason.name.lower() if reason else "abort",
                           time.time()))
        self.queues_moved = True
        if not self.in_step and not self.caps:  # between steps: published now, with the state it left
            self._hand_over()  # (while a step is in flight it is that step's: its update publishes it)
        self._own(t0, c0)

    def _hand_over(self, wake: bool = True) -> None:
        """Give the publisher what happened since the last hand-over, with the state of each
        block it touched and, when a queue moved, the queues (read here: they change next step).

        A step's update hands over without waking the publisher: vLLM's scheduler thread goes on
        to schedule the next step at once, and a publisher at work then would hold the GIL that
        thread waits for. `scheduled` wakes it once that schedule is made, when the thread sends
        the step to the model and waits for its forward; a server gone idle is caught by the
        publisher's own look every _LOOK_EVERY_S."""
        dirty, cached, cleared = self.notes.take()
        blocks = self.pool.blocks
        if cleared:
            dirty = list(range(len(blocks)))
        touched = list(map(blocks.__getitem__, dirty))
        queues = None
        if self.queues_moved:
            s = self.s
            queues = ([r.request_id for r in s.running],
                      [r.request_id for r in (*s.waiting, *(getattr(s, "kv_holding_waiting", ()) or ()))])
            self.queues_moved = False
        self.publisher.put((self.items, dirty, list(map(_REF_CNT, touched)), list(map(_BLOCK_HASH, touched)), cached,
                            cleared, queues, int(self.pool.get_num_free_blocks()), float(self.pool.get_usage()),
                            time.time()), wake)
        self.items = []

    def close(self) -> None:
        self.notes.close()
        self.groups.close()
        self.publisher.close()


class _Publisher:
    """The feed's thread and its two sockets. It turns each hand-over into a body
    (mirror.py) and publishes it on an XPUB socket (it tells how many subscribe; with none,
    a step is counted as `unobserved`); bodies reach the recorder's Mirror in runs of
    `_APPLY_EVERY`, and all of them before a snapshot is answered. The XPUB socket's
    per-subscriber queue holds SNDHWM messages: a subscriber that does not read loses
    the messages past it, and only it. Each message carries a sequence number, so every
    subscriber counts exactly what it missed. Snapshots (the mirror's whole state) are
    answered between steps. Its CPU time is counted in `publisher_cpu_ms`."""

    def __init__(self, settings: dict, mirror: Mirror, block_size: int, num_blocks: int) -> None:
        import zmq

        self.zmq = zmq
        self.mirror = mirror
        self.tokens = settings["tokens"]
        self.rank = settings["rank"]
        self.block_size = block_size
        self.run_id = uuid.uuid4().hex
        self.seq = 0
        self.subscribers = 0
        self.counters = {"published": 0, "unobserved": 0, "errors": 0, "steps": 0, "recorder_ms": 0.0,
                         "recorder_cpu_ms": 0.0, "publisher_cpu_ms": 0.0, "backlog": 0, "unrecorded": 0}
        # Why the recorder stopped (a step it could not turn into a body): None while it records.
        self.stopped: str | None = None
        self.by_id: dict[str, int] = {}
        self.names: dict[int, str] = {}  # by_id reversed
        self.unapplied: list[Body] = []  # bodies published but not yet applied to the mirror
        self.rows: dict[int, tuple[list[str], list[int]]] = {}  # step -> its scheduled requests, names and indices
        self.last_rows: tuple[list[str], list[int]] = ([], [])  # the last schedule's, until a request arrives
        self.next_idx = 0
        self.next_look = 0.0  # when (time.monotonic) subscriptions and snapshot requests are next looked at
        self.int_hashes = kv_events_use_int_hashes()
        # Each block's hash object and its key as last published: a block a step only freed or
        # hit keeps its hash object, so its key is not made again (most blocks a step touches).
        self.hash_objs: list[Any] = [None] * num_blocks
        self.hash_keys: list[str | None] = [None] * num_blocks
        self.carry: Body | None = None   # a hand-over in which no step ran: told with the next one
        self.queue: deque = deque()
        self.wake = threading.Event()
        self.idle = threading.Event()
        self.idle.set()
        for address in (settings["feed"], settings["snapshot"]):
            if not protocol.is_loopback(address):
                log.warning("kvscope recorder binds %s, which is not a loopback address: the feed carries "
                            "prompts; prefer 127.0.0.1 and an SSH tunnel", address)
        self.ctx = zmq.Context()
        try:
            self.pub = self.ctx.socket(zmq.XPUB)
            self.pub.setsockopt(zmq.SNDHWM, settings["hwm"])
            self.pub.setsockopt(zmq.XPUB_VERBOSER, 1)
            self.pub.setsockopt(zmq.LINGER, 0)
            self.pub.setsockopt(zmq.SNDBUF, settings["sndbuf"])
            self.rep = self.ctx.socket(zmq.REP)
            self.rep.setsockopt(zmq.LINGER, 0)
            self.pub.bind(settings["feed"])
            self.rep.bind(settings["snapshot"])
        except zmq.ZMQError as exc:
            self.ctx.destroy(linger=0)
            raise OSError(f"cannot bind the feed {settings['feed']} or its snapshot endpoint {settings['snapshot']}: "
                          f"{exc}") from None
        self._running = True
        self._thread = threading.Thread(target=self._run, name=f"kvscope-recorder-{self.rank}", daemon=True)
        self._thread.start()
        log.info("kvscope recorder: run %s, data-parallel rank %d, feed %s, snapshots %s, token ids %s", self.run_id,
                 self.rank, settings["feed"], settings["snapshot"], "on" if self.tokens else "left out")

    def put(self, handover: tuple, wake: bool = True) -> None:
        self.idle.clear()
        self.queue.append(handover)
        if wake:
            self.wake.set()

    def wake_up(self) -> None:
        """Publish what was handed over (its thread is woken only if something waits)."""
        if self.queue:
            self.wake.set()

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every hand-over so far is published (tests and benchmarks)."""
        self.wake_up()
        end = time.monotonic() + timeout
        while (self.queue or not self.idle.is_set()) and time.monotonic() < end:
            self.idle.wait(0.01)
        return not self.queue

    # -- the thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        zmq = self.zmq
        while self._running:
            self.wake.wait(_LOOK_EVERY_S)
            self.wake.clear()
            c0 = time.thread_time()
            try:
                now = time.monotonic()
                # Subscriptions and snapshot requests are looked at every _LOOK_EVERY_S, not at
                # every step: reading a socket's flags makes ZMQ take in its commands (syscalls).
                look = now >= self.next_look
                if look:
                    self.next_look = now + _LOOK_EVERY_S
                    self._count_subscribers()
                self.counters["backlog"] = max(self.counters["backlog"], len(self.queue))
                while self.queue:
                    self._publish(self.queue.popleft())
                    if self.queue:
                        time.sleep(0)  # let vLLM's scheduler thread have the GIL between steps
                if look:
                    self._answer_snapshot()
            except zmq.ZMQError:
                if self._running:
                    log.exception("kvscope recorder: the feed's sockets failed")
                return
            except Exception:  # the recorder must never take the server down
                self.counters["errors"] += 1
                log.exception("kvscope recorder: a step could not be recorded")
            finally:
                self.counters["publisher_cpu_ms"] += (time.thread_time() - c0) * 1e3
                if not self.queue:
                    self.idle.set()

    def _count_subscribers(self) -> None:
        zmq = self.zmq
        while self.pub.get(zmq.EVENTS) & zmq.POLLIN:  # a flag read: poll() builds a Poller each call
            try:
                frame = self.pub.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if frame[:1] == b"\x01":
                self.subscribers += 1
            elif frame[:1] == b"\x00":
                self.subscribers = max(0, self.subscribers - 1)

    def _publish(self, handover: tuple) -> None:
        if self.stopped is not None:
            self.counters["unrecorded"] += 1
            return
        try:
            body = self._body(handover)
        except Exception as exc:  # noqa: BLE001 - the recorder must never take the server down
            self._stop(exc)
            return
        if self.carry is not None:
            body = _merged(self.carry, body)
            self.carry = None
        if not any(isinstance(op, (Updated, FinishedBetween)) for op in body.ops):
            self.carry = body  # no step ran: its notes wait for the next one
            return
        self.unapplied.append(body)
        if len(self.unapplied) >= _APPLY_EVERY:
            self._catch_up()
        self._forget_finished(body.ops)
        self.seq += 1
        self.counters["steps"] += 1
        if self.subscribers > 0:
            msg = StepMessage(protocol.SCHEMA_VERSION, self.run_id, self.rank, self.seq, dict(self.counters), body)
            try:  # never blocks: at a subscriber's HWM, ZMQ drops the message for that subscriber only
                self.pub.send_multipart((protocol.TOPIC, protocol.encode(msg)), self.zmq.NOBLOCK)
                self.counters["published"] += 1
            except self.zmq.ZMQError:
                self.counters["errors"] += 1
                log.exception("kvscope recorder: publishing failed")
        else:
            self.counters["unobserved"] += 1

    def _stop(self, exc: Exception) -> None:
        """A step that could not be recorded: the mirror no longer matches the server and no
        later body would apply, so the recorder stops, and says so to every subscriber (a
        'stopped' message whose seq skips the lost step: a gap no snapshot can fill) and to
        every snapshot request. The server goes on serving."""
        self.seq += 1
        self.counters["errors"] += 1
        self.stopped = (f"the recorder could not record step seq {self.seq} ({type(exc).__name__}: {exc}; the "
                        "server's log has the traceback): its state no longer matches the server's, so it stopped; "
                        "the server keeps serving; restart it to follow it again")
        log.exception("kvscope recorder: %s", self.stopped)
        msg = StoppedMessage(protocol.SCHEMA_VERSION, self.run_id, self.rank, self.seq, self.stopped,
                             dict(self.counters))
        try:
            self.pub.send_multipart((protocol.TOPIC, protocol.encode(msg)), self.zmq.NOBLOCK)
        except self.zmq.ZMQError:
            pass  # at a subscriber's HWM: it learns from its snapshot request instead

    def _catch_up(self) -> None:
        bodies, self.unapplied = self.unapplied, []
        for body in bodies:
            self.mirror.apply(body)
            time.sleep(_YIELD_S)

    def _forget_finished(self, ops: list[Op]) -> None:
        """Forget the names of the requests these ops finish (a later request may reuse a name)."""
        for op in ops:
            if isinstance(op, Updated) and op.finished:
                gone = [op.ids[k] for k, _ in op.finished]
            elif isinstance(op, FinishedBetween):
                gone = [idx for idx, _ in op.finished]
            else:
                continue
            for idx in gone:
                rid = self.names.pop(idx, None)
                if rid is not None and self.by_id.get(rid) == idx:
                    del self.by_id[rid]

    def _answer_snapshot(self) -> None:
        zmq = self.zmq
        if not self.rep.get(zmq.EVENTS) & zmq.POLLIN:  # the common case, without raising zmq.Again
            return
        self._count_subscribers()  # a joining client subscribes before it asks: its steps must be sent
        try:
            request = self.rep.recv(zmq.NOBLOCK)
        except zmq.Again:
            return
        try:
            import msgspec

            ask = msgspec.msgpack.decode(request)
            ok = isinstance(ask, dict) and ask.get("schema") == protocol.SCHEMA_VERSION
        except Exception:  # noqa: BLE001
            ok = False
        reply: SnapshotMessage | dict
        if ok and self.stopped is not None:
            reply = {"schema": protocol.SCHEMA_VERSION, "kind": "error", "error": self.stopped}
        elif ok:
            self._catch_up()
            reply = SnapshotMessage(protocol.SCHEMA_VERSION, self.run_id, self.rank, self.seq, self.mirror.to_wire(),
                                    dict(self.counters), tokens_left_out=not self.tokens)
        else:
            reply = {"schema": protocol.SCHEMA_VERSION, "kind": "error",
                     "error": f"this recorder speaks kvscope feed schema {protocol.SCHEMA_VERSION}"}
        self.rep.send(protocol.encode(reply))

    # -- a hand-over as a body (mirror.py) ---------------------------------------------------------
    def _index(self, rid: str) -> int:
        idx = self.by_id.get(rid)
        if idx is None:
            idx = self.by_id[rid] = self.next_idx
            self.names[idx] = rid
            self.next_idx += 1
        return idx

    def _key(self, h: Any) -> str | None:
        """A pool block's hash as vLLM's KV events name it (records.RecordBuilder.hash_key)."""
        if h is None:
            return None
        h = bytes(h)[:-4]  # BlockHashWithGroupId: the hash, then 4 bytes of KV cache group
        return (h[-8:] if self.int_hashes else h[:8]).hex()

    def _keys(self, dirty: list[int], hashes: list[Any]) -> list[str | None]:
        """The hash keys of the blocks `dirty` (None: no hash), made only for a hash object a
        block did not hold when last published."""
        objs, keys, key = self.hash_objs, self.hash_keys, self._key
        out: list[str | None] = []
        for b, h in zip(dirty, hashes):
            if h is None:
                objs[b] = None
                out.append(None)
            elif objs[b] is h:
                out.append(keys[b])
            else:
                objs[b], keys[b] = h, key(h)
                out.append(keys[b])
        return out

    def _body(self, handover: tuple) -> Body:
        items, dirty, refs, hashes, cached, cleared, queues, free, usage, wall = handover
        ix = self.by_id
        ops: list[Op] = []
        groups = None
        for item in items:
            kind = item[0]
            if kind == "s":
                ops.append(self._sched_op(*item[1:]))
            elif kind == "u":
                ops.append(self._update_op(*item[1:5]))
                if item[5] is not None:
                    groups = [GroupTables(ix[rid], tables, hits) for rid, tables, hits in item[5] if rid in ix]
            elif kind == "a":
                ops.append(self._arrive_op(item[1]))
            else:
                _, rids, reason, t = item
                ops.append(FinishedBetween(t, [(ix[r], reason) for r in rids if r in ix]))
        get = ix.get
        return Body(ops, (dirty, refs, self._keys(dirty, hashes)),
                    [(b, get(req.request_id, -1), i) for req, pairs, _ in cached for b, i in pairs], cleared,
                    None if queues is None else ([get(r, -1) for r in queues[0]], [get(r, -1) for r in queues[1]]),
                    free, usage, wall, groups)

    def _arrive_op(self, request: Any) -> Arrived:
        rid = request.request_id
        self.last_rows = ([], [])  # a name may come back with a new request
        prompt = list(request.prompt_token_ids or ())
        n = len(prompt)
        sp = getattr(request, "sampling_params", None)
        hashes = [(bytes(h)[-8:] if self.int_hashes else bytes(h)[:8]).hex()
                  for h in list(getattr(request, "block_hashes", ()) or ())[:n // self.block_size]]
        return Arrived(self._index(rid), rid, prompt if self.tokens else [], n,
                       int(getattr(request, "max_tokens", None) or getattr(sp, "max_tokens", 1) or 1),
                       _params(request).to_dict(),
                       float(request.arrival_time), [str(x) for x in (getattr(sp, "stop", None) or ())], hashes,
                       hash_domain(request))

    def _indices(self, rids: Any) -> list[int]:
        try:
            return list(map(self.by_id.__getitem__, rids))
        except KeyError:  # a request the recorder never saw arrive (never, but a name costs nothing)
            return [self._index(r) for r in rids]

    def _sched_op(self, sid: int, out: Any, budget: int, tables: tuple[list, list],
                  group_tables: list[tuple[list, list]]) -> Scheduled:
        indices = self._indices
        c = out.scheduled_cached_reqs
        rids = list(out.num_scheduled_tokens)
        # The same batch as the last step (decodes): vLLM's same name objects, compared by identity
        # first, so no request's name is hashed again (each would be a cache miss on this thread).
        if rids == self.last_rows[0]:
            order = self.last_rows[1]
        else:
            order = indices(rids)
            self.last_rows = (rids, order)
        self.rows[sid] = (rids, order)
        new_tables, cached_tables = tables
        return Scheduled(sid, order, list(out.num_scheduled_tokens.values()),
                         [(self._index(d.req_id), d.num_computed_tokens, t)
                          for d, t in zip(out.scheduled_new_reqs, new_tables)],
                         order if c.req_ids == rids else indices(c.req_ids), c.num_computed_tokens,
                         cached_tables, c.num_output_tokens, indices(c.resumed_req_ids),
                         indices(out.preempted_req_ids or ()), budget, group_tables)

    def _update_op(self, cap: _Cap, result: Any, wall: float, step_s: float) -> Updated | RanNothing:
        scheduled = None
        if cap.sid is not None:
            scheduled = self.rows.pop(cap.sid, None)
            if len(self.rows) > 4:  # steps whose update never came (an engine error): forget them
                for sid in [s for s in self.rows if s < cap.sid]:
                    del self.rows[sid]
        outs = _outputs(result)
        if _ran_nothing(cap.out, outs):
            return RanNothing(cap.sid)  # nothing ran (vLLM tells its workers about finished requests)
        # Column by column: no tuple per request (each would be one more object for the collector).
        rids, new, reasons = (list(map(_REQUEST_ID, outs)), list(map(_NEW_TOKEN_IDS, outs)),
                              list(map(_FINISH_REASON, outs)))
        # vLLM reports a step's requests in the order it scheduled them (the common case): their
        # indices are the schedule's, already looked up.
        ids = scheduled[1] if scheduled is not None and rids == scheduled[0] else self._indices(rids)
        finished = [] if reasons.count(None) == len(reasons) else \
            [(k, r.name.lower()) for k, r in enumerate(reasons) if r is not None]
        return Updated(cap.sid, wall, step_s, cap.schedule_s, cap.update_s, ids,
                       new if self.tokens else list(map(len, new)), finished, cap.events)

    def close(self) -> None:
        self._running = False
        self.wake.set()
        self._thread.join(timeout=1.0)
        self.pub.close(0)
        self.rep.close(0)
        self.ctx.term()


def _outputs(result: Any) -> list:
    """A step's EngineCoreOutput list: one EngineCoreOutputs per front-end client, joined."""
    clients = list((result or {}).values())
    return clients[0].outputs if len(clients) == 1 else [o for eco in clients for o in eco.outputs]


def _ran_nothing(out: Any, outs: list) -> bool:
    """vLLM ran nothing this step (it tells its workers of finished requests): no record."""
    return not outs and (out is None or not out.total_num_scheduled_tokens)


def _merged(first: Body, then: Body) -> Body:
    """Two bodies as one (the first had no step to carry it)."""
    states = dict(zip(first.blocks[0], zip(first.blocks[1], first.blocks[2])))
    states.update(zip(then.blocks[0], zip(then.blocks[1], then.blocks[2])))
    ids = sorted(states)
    return Body(first.ops + then.ops, (ids, [states[b][0] for b in ids], [states[b][1] for b in ids]),
                first.cached + then.cached, first.cleared or then.cleared,
                then.queues if then.queues is not None else first.queues, then.free, then.usage, then.wall,
                then.groups)


def _rank(vc: Any) -> int:
    pc = vc.parallel_config
    return int(getattr(pc, "data_parallel_index", None) or getattr(pc, "data_parallel_rank", 0) or 0)


def _params(request: Any) -> SamplingParams:
    """vLLM's sampling params in kvscope's fields (what the request dict shows)."""
    # None (a request without sampling params) fails in the try below and gets the defaults.
    sp: Any = getattr(request, "sampling_params", None)
    try:
        return SamplingParams(temperature=max(0.0, float(sp.temperature)), top_k=max(0, int(sp.top_k or 0)),
                              top_p=float(sp.top_p) if 0 < float(sp.top_p) <= 1 else 1.0,
                              max_tokens=max(1, int(getattr(request, "max_tokens", None) or sp.max_tokens or 1)),
                              ignore_eos=bool(sp.ignore_eos), stop_token_ids=list(sp.stop_token_ids or ()),
                              seed=sp.seed if sp.seed is None or sp.seed >= 0 else None, logprobs_top=0)
    except Exception:  # noqa: BLE001 - a field kvscope cannot show is not a reason to lose the request
        return SamplingParams(logprobs_top=0)


def _model_info(vc: Any) -> dict:
    from engine.dtypes import dtype_name

    mc = vc.model_config
    hf = mc.hf_config
    heads = int(hf.num_attention_heads)
    pc = vc.parallel_config
    import vllm

    return {"engine": f"vLLM {vllm.__version__} (live server)", "engine_version": vllm.__version__,
            "name": str(mc.model).rstrip("/").split("/")[-1], "model_path": str(mc.model),
            "architecture": getattr(hf, "model_type", None), "num_layers": int(hf.num_hidden_layers),
            "num_heads": heads, "num_kv_heads": int(getattr(hf, "num_key_value_heads", None) or heads),
            "head_dim": int(getattr(hf, "head_dim", None) or hf.hidden_size // heads),
            "hidden_size": int(hf.hidden_size), "vocab_size": int(mc.get_vocab_size()),
            "dtype": dtype_name(mc.dtype), "compute_dtype": dtype_name(mc.dtype),
            "device": str(getattr(vc.device_config, "device_type", "")), "max_model_len": int(mc.max_model_len),
            "attention_backend": None, "cuda_graphs": None,
            "cuda_graphs_off": "enforce_eager" if mc.enforce_eager else None,
            "tensor_parallel_size": int(pc.tensor_parallel_size),
            "pipeline_parallel_size": int(pc.pipeline_parallel_size),
            "data_parallel_size": int(getattr(pc, "data_parallel_size", 1) or 1), "data_parallel_rank": _rank(vc),
            "async_scheduling": bool(getattr(vc.scheduler_config, "async_scheduling", False)),
            "kv_bytes_per_block": _kv_bytes_per_block(vc), "live": True}


def _kv_bytes_per_block(vc: Any) -> int:
    """K and V of one block over every layer and KV head (all tensor-parallel ranks together):
    what one block of the pool costs in memory (a what-if turns a memory size into blocks with it)."""
    mc, cc = vc.model_config, vc.cache_config
    hf = mc.hf_config
    heads = int(hf.num_attention_heads)
    kv_heads = int(getattr(hf, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(hf, "head_dim", None) or hf.hidden_size // heads)
    cache_dtype = str(getattr(cc, "cache_dtype", "auto"))
    itemsize = 1 if cache_dtype.startswith("fp8") else int(mc.dtype.itemsize)
    return 2 * int(hf.num_hidden_layers) * kv_heads * head_dim * itemsize * int(cc.block_size)


def _config_dict(vc: Any, s: Scheduler) -> dict:
    mc, sc, cc = vc.model_config, vc.scheduler_config, vc.cache_config
    from engine.dtypes import dtype_name

    return {"model": str(mc.model), "block_size": int(cc.block_size),
            "num_kv_blocks": int(s.kv_cache_manager.block_pool.num_gpu_blocks),
            "max_num_batched_tokens": int(sc.max_num_batched_tokens), "max_num_seqs": int(sc.max_num_seqs),
            "max_model_len": int(mc.max_model_len), "enable_prefix_caching": bool(cc.enable_prefix_caching),
            "enable_chunked_prefill": bool(sc.enable_chunked_prefill), "scheduling_policy": "unified",
            "scheduler_reserve_full_isl": bool(getattr(s, "scheduler_reserve_full_isl", True)),
            # vLLM's own knobs that change its decisions (a recording replays with them).
            "long_prefill_token_threshold": int(sc.long_prefill_token_threshold),
            "long_prefill_token_threshold_adaptive": bool(getattr(sc, "long_prefill_token_threshold_adaptive", False)),
            "policy": str(sc.policy), "prefix_caching_hash_algo": str(cc.prefix_caching_hash_algo),
            "watermark": float(getattr(sc, "watermark", 0.0) or 0.0),
            "max_num_active_seqs": getattr(sc, "max_num_active_seqs", None),
            "async_scheduling": bool(getattr(sc, "async_scheduling", False)),
            "tensor_parallel_size": int(vc.parallel_config.tensor_parallel_size), "dtype": dtype_name(mc.dtype),
            "enforce_eager": bool(mc.enforce_eager), "device": str(getattr(vc.device_config, "device_type", ""))}
