"""The notebook side of the feed: `LiveSource` reads the recorder's messages (a bounded queue
filled by a thread) and hands them to a Session as steps; `LiveDriver` is the Session's driver
of it, without controls (the server's traffic comes from its own clients).

    from explorer import Session
    s = Session.attach("tcp://127.0.0.1:5590")   # the server's KVSCOPE_FEED
    s.follow()                                   # apply steps as they come (s.pause() stops)

Each step message carries a compact body (mirror.py). The source applies it to its `Mirror`,
the state the recorder keeps too, which spells it as the StepRecord dict whose `changes` the
Session applies to its history (engine/report/changes.py); the source also spells token ids
(with the model folder's tokenizer), counts prefix hits in vLLM's KV-event tree, and notices a
body that does not fit before the Session sees it. Failure modes:
- nothing answers at the address: TimeoutError naming the address and how to start the recorder;
- the server restarted (a new run id) or vLLM cleared its cache (AllBlocksCleared): the next
  step carries a fresh snapshot and `restart`, so the Session starts its history again, and
  `notes` says why;
- a malformed, foreign or other-schema message: counted in `status()["rejected"]`, skipped;
- a slow notebook: the queue keeps the newest `max_queue` messages, older ones are dropped and
  counted; the recorder counts what it could not send (its counters travel with every message).
  After a missed step the state comes from a fresh snapshot (`status()["rebased"]`), never
  from a guess; requests that finished in the missed steps and that the snapshot no longer
  holds stay in the finished queue, marked.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

from engine.report.changes import whole
from engine.report.records import EngineSnapshot, StepRecord
from engine.report.schema import CHANGES, EV, REC, REQ, SAMPLE, SNAP, EngineSnapshotDict
from engine.tokenizer import OutputText, fast_decoder

from . import protocol
from .mirror import Mirror
from .wire import Arrived, SnapshotMessage, StepMessage, StoppedMessage

log = logging.getLogger(__name__)

# How long steps a snapshot is ahead by may take to arrive before the snapshot stands in for them.
CATCH_UP_GRACE_S = 3.0
PROMPT_HASHES = 20_000   # requests whose prompt block hashes a source keeps (the fleet's routing view)
TEXTS_KEPT = 8_192       # spelled prompts and outputs a source keeps
WATCH_ONLY = ("this session follows a live vLLM server: its traffic comes from the server's own clients "
              "(send requests to the server's OpenAI API), and its budgets and pool are its command line's")


class LiveSource:
    """A recorder's feed as a Session's Source (explorer/core/engine_protocol.py): one engine
    core (one data-parallel rank) of a server."""

    def __init__(self, address: str, model: str | None = None, *, timeout: float = 10.0, max_queue: int = 1000,
                 snapshot_address: str | None = None, kv_events: Any = None, tokenizer: Any = None) -> None:
        import zmq

        self.zmq = zmq
        self.address = address
        self.snapshot_address = snapshot_address or protocol.snapshot_address(address)
        self.timeout = float(timeout)
        self._ctx = zmq.Context()
        self._queue: deque[StepMessage] = deque()
        self._max_queue = int(max_queue)
        self._qlock = threading.Lock()
        self.counters = {"received": 0, "applied": 0, "rejected": 0, "dropped_here": 0, "missed": 0,
                         "resyncs": 0, "stale": 0, "rebased": 0}
        self.last_rejection: str | None = None
        self.stopped: str | None = None   # the recorder's words when it stopped recording
        self.notes: list[str] = []
        self.server_counters: dict = {}
        self.tokens_left_out = False
        # What the fleet view reads beside the schema's dicts: each request's prompt block hashes
        # (the keys the pool shows), kept for the latest PROMPT_HASHES requests.
        self.prompt_hashes: OrderedDict[str, list[str]] = OrderedDict()
        # rid -> its prompt's text (and how many ids it spells), its output's decoder
        self._texts: dict[str, tuple[tuple[int, str] | None, OutputText | None]] = {}
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.RCVHWM, max(1, self._max_queue))
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.SUBSCRIBE, protocol.TOPIC)
        self._sub.connect(address)
        self._last_message = time.monotonic()
        try:
            self._take_snapshot()
        except BaseException:  # nothing answers there: leave no socket behind
            self._sub.close(0)
            self._ctx.term()
            raise
        self.tokenizer = tokenizer if tokenizer is not None else self._load_tokenizer(model)
        self._decoder = fast_decoder(self.tokenizer) if self.tokenizer is not None else None
        if isinstance(kv_events, str):  # an address; or a KvEventSubscriber already listening
            from .kv_events import KvEventSubscriber

            kv_events = KvEventSubscriber(kv_events)
        self.kv_events = kv_events
        self._cleared_seen = 0
        # A snapshot ahead of the state held here (steps never came), and when it was seen.
        self._ahead: tuple[SnapshotMessage, float] | None = None
        self._running = True
        self._thread = threading.Thread(target=self._receive, name="kvscope-feed", daemon=True)
        self._thread.start()

    # -- the snapshot endpoint --------------------------------------------------------------------
    def _fetch_snapshot(self, timeout: float) -> SnapshotMessage:
        zmq = self.zmq
        req = self._ctx.socket(zmq.REQ)
        req.setsockopt(zmq.LINGER, 0)
        req.setsockopt(zmq.RCVTIMEO, int(timeout * 1000))
        req.setsockopt(zmq.SNDTIMEO, int(timeout * 1000))
        req.connect(self.snapshot_address)
        try:
            req.send(protocol.encode({"schema": protocol.SCHEMA_VERSION, "want": "snapshot"}))
            reply = req.recv()
        except zmq.Again:
            raise TimeoutError(
                f"no kvscope recorder answered at {self.snapshot_address} within {timeout:g} s (feed "
                f"{self.address}): start the vLLM server with "
                f"--scheduler-cls explorer.drivers.vllm_live.RecordingScheduler "
                f"and {protocol.ENV_FEED}={self.address}, or tunnel its port (docs/attach.md)"
            ) from None
        finally:
            req.close(0)
        try:
            return protocol.decode_snapshot([reply])
        except protocol.FeedError as exc:
            raise ValueError(f"the recorder at {self.snapshot_address} answered, but: {exc}") from None

    def _take_snapshot(self, msg: SnapshotMessage | None = None) -> None:
        msg = msg or self._fetch_snapshot(self.timeout)
        self.run_id, self.seq, self.rank = msg.run_id, msg.seq, msg.rank
        self.server_counters = msg.counters
        self.tokens_left_out = msg.tokens_left_out
        self.mirror = Mirror.from_wire(msg.state)
        for r in [*self.mirror.requests.values(), *self.mirror.finished]:
            self._keep_hashes(r.rid, r.hashes)
        self.step_count = self.mirror.step_count
        self.config = SimpleNamespace(**self.mirror.config)
        self._texts.clear()

    def _keep_hashes(self, rid: str, hashes: list[str]) -> None:
        self.prompt_hashes[rid] = hashes
        while len(self.prompt_hashes) > PROMPT_HASHES:
            self.prompt_hashes.popitem(last=False)

    # -- the feed thread ----------------------------------------------------------------------------
    def _receive(self) -> None:
        for frames in protocol.received_messages(self.zmq, self._sub, lambda: self._running):
            self.counters["received"] += 1
            self._last_message = time.monotonic()
            try:
                msg = protocol.decode_feed(frames)
            except protocol.FeedError as exc:
                self.counters["rejected"] += 1
                self.last_rejection = str(exc)
                continue
            if isinstance(msg, StoppedMessage):
                self._stopped(msg)
                continue
            with self._qlock:
                if len(self._queue) >= self._max_queue:  # a slow notebook: the oldest step goes
                    self._queue.popleft()
                    self.counters["dropped_here"] += 1
                self._queue.append(msg)

    def _stopped(self, msg: StoppedMessage) -> None:
        """The recorder stopped: the step it lost is counted as missed, its words kept in the
        notes (and logged); the panels keep the last state that came."""
        if msg.run_id != self.run_id or self.stopped is not None:
            return
        self.stopped = msg.error
        self.counters["missed"] += max(0, msg.seq - self.seq - len(self._queue))
        self.notes.append(self.stopped)
        log.warning(self.stopped)

    # -- the Source protocol ------------------------------------------------------------------------
    @property
    def model_info(self) -> dict:
        return self.mirror.model_info

    @property
    def scheduled_ahead(self) -> int | None:
        """With vLLM's async scheduling: the step whose allocations the latest state already
        holds (scheduled before this step's update), else None."""
        return self.mirror.scheduled_ahead

    def snapshot(self) -> EngineSnapshot:
        """The whole state held here (a refresh point: later steps' changes continue from it)."""
        snap = self.mirror.snapshot_dict()
        self._add_text(snap)
        return EngineSnapshot.from_dict(snap)

    def pending(self) -> int:
        """Steps ready to apply: the messages received and not yet seen (those already in the
        snapshot this source joined with are dropped, counted as stale), or 1 when vLLM cleared
        its cache or a snapshot must fill in steps that ended requests but never arrived."""
        if self._cleared():
            return 1
        with self._qlock:
            while self._queue and self._queue[0].run_id == self.run_id and self._queue[0].seq <= self.seq:
                self._queue.popleft()
                self.counters["stale"] += 1
            if self._queue:
                return len(self._queue)
        return int(self._needs_catch_up())

    def step(self) -> StepRecord:
        """The next step: a received body expanded into its record (its changes in, its token
        ids spelled), or a record whose changes carry a whole snapshot (missed steps, a
        restart, vLLM's cache cleared)."""
        if self._cleared():
            self._cleared_seen = len(self.kv_events.cleared_at)
            return self._restart("vLLM cleared its prefix cache (AllBlocksCleared)")
        while True:
            with self._qlock:
                msg = self._queue.popleft() if self._queue else None
            if msg is None:
                return self._catch_up()
            if msg.run_id != self.run_id:
                return self._restart(f"the server restarted (run {self.run_id[:8]} -> {msg.run_id[:8]})")
            if msg.seq > self.seq:
                break
            self.counters["stale"] += 1  # already in the snapshot this source joined with
        applied, self.seq = self.seq, msg.seq
        self._ahead = None  # steps came after all
        self.server_counters = msg.counters
        if msg.seq != applied + 1:
            self.counters["missed"] += msg.seq - applied - 1
            return self._rebase(msg)  # a body moves on the state it follows: a missed one needs a fresh state
        try:
            rec = self.mirror.apply(msg.body, expand=True)
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            self.notes.append(f"a step did not fit the state held here ({type(exc).__name__}: {exc})")
            return self._rebase(msg)
        for op in msg.body.ops:
            if isinstance(op, Arrived):
                self._keep_hashes(op.request_id, op.prompt_hashes)
        self._add_text_to_changes(rec)
        self._held(rec)
        return StepRecord.from_dict(rec)

    def _held(self, rec: Mapping[str, Any]) -> None:
        """The state held here moved on to the step whose record is `rec`."""
        self._count_hits(rec)
        self.step_count = rec[REC.STEP]
        self.counters["applied"] += 1

    def _whole_record(self, step: int, restart: str | None = None) -> StepRecord:
        """A record of `step` whose changes replace the state with the one held here."""
        snap: EngineSnapshotDict = {**self.mirror.snapshot_dict(), SNAP.STEP: step}
        self._add_text(snap)
        rec = StepRecord(step=step).to_dict()
        rec[REC.CHANGES] = whole(snap, step, restart=restart)
        if restart is None:
            self._held(rec)
        return StepRecord.from_dict(rec)

    def _rebase(self, msg: StepMessage) -> StepRecord:
        """After missed steps: a record whose changes are a fresh snapshot, taken after `msg` was
        sent; the steps it already holds are dropped as stale. The requests that ended in the
        missed steps come from its finished queue; one it no longer holds is kept, marked."""
        try:
            fresh = self._fetch_snapshot(min(self.timeout, 2.0))
        except (TimeoutError, ValueError) as exc:
            self.notes.append(f"steps were missed and no snapshot came to fill them in: {exc}; the panels keep "
                              f"the state of step {self.step_count}")
            self.seq = msg.seq
            return self._whole_record(self.step_count + 1)
        if fresh.run_id != self.run_id:
            return self._restart("the server restarted while steps were missed")
        with self._qlock:
            while self._queue and self._queue[0].run_id == self.run_id and self._queue[0].seq <= fresh.seq:
                self._queue.popleft()
                self.counters["stale"] += 1
        self.counters["rebased"] += 1
        return self._whole_record(self._adopt(fresh))

    def _adopt(self, fresh: SnapshotMessage) -> int:
        """Hold a fresh snapshot's state, keeping as finished (marked) the requests held here
        that it no longer has: they ended in steps this side never got. Returns the step the
        history shows it as (after the one it holds, at least)."""
        old, step = self.mirror, self.step_count + 1
        self._take_snapshot(fresh)
        new = self.mirror
        have = {r.rid for r in (*new.requests.values(), *new.finished)}
        lost = [r for i in (*old.running, *old.waiting) if (r := old.requests.get(i)) is not None and r.rid not in have]
        for r in lost:
            r.status, r.finish_reason, r.frozen, r.table = "finished", "unknown (dropped)", None, []
        kept = [r for r in old.finished if r.rid not in have]
        new.finished = deque([*kept, *lost, *new.finished], maxlen=new.finished.maxlen)
        new.step_count = self.step_count = max(step, new.step_count)
        return new.step_count

    def _needs_catch_up(self) -> bool:
        """No step came for a second but the state shows requests in flight: the steps that ended
        them may have been dropped. True when a fresh snapshot is ahead of the state held here and
        the steps it is ahead by still have not come a grace period later: a slow step (a busy
        server takes seconds) or a message still on its way is waited for, never overtaken."""
        if self.stopped is not None:  # no snapshot comes from a recorder that stopped
            return False
        now = time.monotonic()
        if self._ahead is not None:
            msg, seen = self._ahead
            return now - seen >= CATCH_UP_GRACE_S and now - self._last_message >= CATCH_UP_GRACE_S
        m = self.mirror
        if not (m.running or m.waiting) or now - self._last_message < 1.0:
            return False
        self._last_message = now
        try:
            msg = self._fetch_snapshot(min(self.timeout, 2.0))
        except (TimeoutError, ValueError):
            return False
        if msg.run_id == self.run_id and msg.seq > self.seq and not self._queue:
            self._ahead = (msg, time.monotonic())  # a step the snapshot holds was sent: wait for it first
        return False

    def _catch_up(self) -> StepRecord:
        """The snapshot `_needs_catch_up` found ahead, as a step whose changes carry it whole."""
        if self._ahead is None:
            raise ValueError("no step from the server is waiting")
        (msg, _), self._ahead = self._ahead, None
        self.counters["missed"] += msg.seq - self.seq
        step = self._adopt(msg)
        self.notes.append(f"caught up from a snapshot after missing steps up to seq {self.seq}")
        return self._whole_record(step)

    def _restart(self, why: str) -> StepRecord:
        """Start again from a fresh snapshot: a record whose changes restart the history."""
        self.counters["resyncs"] += 1
        with self._qlock:
            kept = [m for m in self._queue if m.run_id != self.run_id]
            self._queue.clear()
        self._take_snapshot()
        with self._qlock:
            self._queue.extend(m for m in kept if m.run_id == self.run_id)
        self.notes.append(f"{why}: resynchronised from a fresh snapshot at step {self.step_count}; "
                          "the history starts again")
        log.warning(self.notes[-1])
        return self._whole_record(self.step_count, restart=self.notes[-1])

    def _cleared(self) -> bool:
        kv = self.kv_events
        return kv is not None and len(kv.cleared_at) > self._cleared_seen

    def _count_hits(self, rec: Mapping[str, Any]) -> None:
        kv = self.kv_events
        hits = rec.get(REC.BLOCKS, {}).get(EV.HITS)
        if kv is None or not hits:
            return
        keys = self.mirror.hash
        with kv.lock:
            for b in hits:
                kv.tree.add_hit(keys[b])

    def status(self) -> dict:
        """What the feed did: this side's counters, the recorder's, the run, notes."""
        status = {"address": self.address, "rank": self.rank, "run_id": self.run_id, "seq": self.seq,
                  "pending": len(self._queue), **self.counters, "last_rejection": self.last_rejection,
                  "server": dict(self.server_counters), "tokens_left_out": self.tokens_left_out,
                  "scheduled_ahead": self.scheduled_ahead, "stopped": self.stopped, "notes": list(self.notes)}
        if self.kv_events is not None:
            status["kv_events"] = dict(self.kv_events.counters)
        return status

    # -- text --------------------------------------------------------------------------------------
    def _load_tokenizer(self, model: str | None) -> Any:
        folder = model or self.mirror.config.get("model")
        if not folder or not os.path.isdir(str(folder)):
            if model:
                raise ValueError(f"model {model!r} is not a local folder: pass the model's folder for its tokenizer")
            self.notes.append("no tokenizer: the server's model folder is not on this machine; text shows as "
                              "token ids (attach(..., model=PATH) decodes them)")
            return None
        from engine.tokenizer import load_tokenizer

        try:
            return load_tokenizer(folder)
        except ValueError as exc:
            if model:
                raise
            self.notes.append(f"no tokenizer: {exc}; text shows as token ids")
            return None

    def _decode(self, ids: list[int]) -> str:
        if self._decoder is None or not ids:
            return ""
        return self._decoder(ids)

    def _text(self, rid: str, which: str, ids: list[int]) -> str:
        """A request's prompt text (spelled once), or its output's as vLLM returns it (without
        special tokens), decoded as its tokens arrive, as vLLM's detokenizer does."""
        if self._decoder is None:
            return ""
        if len(self._texts) > TEXTS_KEPT:  # a server runs for days: spell the latest requests' again if asked
            self._texts.clear()
        prompt, output = self._texts.get(rid, (None, None))
        if which == "prompt":
            if prompt is None or prompt[0] != len(ids):
                prompt = (len(ids), self._decode(ids))
                self._texts[rid] = (prompt, output)
            return prompt[1]
        if output is None:
            output = self._decoder.output_text()
            self._texts[rid] = (prompt, output)
        return output(ids)

    def _add_text_to_changes(self, rec: Mapping[str, Any]) -> None:
        """Spell the step's tokens in its changes (the recorder has no tokenizer), so whoever
        applies them gets the texts: each changed request's output, a new one's prompt, the
        finished requests' and the sampled tokens; and say why each finished request ended."""
        changes = rec[REC.CHANGES]
        for r in changes[CHANGES.FINISHED]:
            self._spell(r)
        if self.tokenizer is None:
            return
        for s in rec.get(REC.SAMPLED, {}).values():
            if s.get(SAMPLE.TOKEN_ID) is not None and not s.get(SAMPLE.TEXT):
                s[SAMPLE.TEXT] = self._decode([s[SAMPLE.TOKEN_ID]])
        by_rid = {r.rid: r for r in self.mirror.requests.values()}
        for rid, change in changes[CHANGES.REQUESTS].items():
            req = by_rid.get(rid)
            if REQ.PROMPT_TOKEN_IDS in change:
                change[REQ.PROMPT_TEXT] = self._text(rid, "prompt", change[REQ.PROMPT_TOKEN_IDS])
            change[REQ.OUTPUT_TEXT] = self._text(rid, "output", req.output if req is not None else [])

    def _add_text(self, snap: Mapping[str, Any]) -> None:
        """Spell the tokens of a whole snapshot's requests (a join, a rebase, a restart)."""
        for q in snap[SNAP.QUEUES].values():
            for r in q:
                self._spell(r)

    def _spell(self, r: dict) -> None:
        rid = r[REQ.REQUEST_ID]
        if self.tokenizer is not None and not r.get(REQ.OUTPUT_TEXT) and not r.get(REQ.PROMPT_TEXT):
            r[REQ.PROMPT_TEXT] = self._text(rid, "prompt", r.get(REQ.PROMPT_TOKEN_IDS) or [])
            r[REQ.OUTPUT_TEXT] = self._text(rid, "output", r.get(REQ.OUTPUT_TOKEN_IDS) or [])
        if r.get(REQ.FINISH_REASON) == "abort":
            req = next((x for x in self.mirror.finished if x.rid == rid), None)
            r[REQ.FINISH_REASON] = finish_words("abort", req.stop if req is not None else [],
                                                r.get(REQ.OUTPUT_TEXT) if self.tokenizer is not None else None)

    def close(self) -> None:
        self._running = False
        self._thread.join(timeout=1.0)
        self._sub.close(0)
        self._ctx.term()
        if self.kv_events is not None:
            self.kv_events.close()


def finish_words(reason: str, stop: list[str], text: str | None) -> str:
    """Why a request ended, as its client saw it. vLLM's engine core ends a request on a stop
    *string* only when the server's front end, which detokenizes, tells it to abort: the
    OpenAI client then gets finish_reason "stop" while the engine core counts an abort."""
    if reason != "abort" or not stop:
        return reason
    if text is None:
        return "abort or stop string (the server's front end ended it)"
    hit = next((s for s in stop if s and s in text), None)
    return f"stop string {hit!r} (the server's front end ended it)" if hit is not None else "abort"


class LiveDriver:
    """The EngineDriver of a live feed: nothing to build (the server exists already), nothing to
    control (`controls` None, `watch_only` says why)."""

    config_fields: frozenset[str] = frozenset()
    watch_only = WATCH_ONLY
    controls = None

    def __init__(self, source: LiveSource) -> None:
        self.engine = self.source = source
        self.llm = None
        self.name = source.model_info.get("engine", "vLLM (live server)")

    @classmethod
    def connect(cls, address: str, model: str | None = None, **options: Any) -> LiveDriver:
        return cls(LiveSource(address, model, **options))

    def rebuild(self, **config_fields: Any) -> LiveDriver:
        raise ValueError("reset: the server's pool and model are set on its command line; restart the server "
                         "and this session resynchronises by itself")

    def shutdown(self) -> None:
        self.source.close()
