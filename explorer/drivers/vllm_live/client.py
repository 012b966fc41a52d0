"""The notebook side of the feed: `LiveEngine` reads the recorder's messages (a bounded
queue filled by a thread), `LiveSession` is a Session over it, so history, metrics, the
Dashboard and export_html work as for an engine stepped here.

    from explorer import Session
    s = Session.attach("tcp://127.0.0.1:5590")   # the server's KVSCOPE_FEED
    s.follow()                                   # apply steps as they come (s.pause() stops)

`step(n)` applies up to n received steps (none waiting: it returns []). Failure modes:
- nothing answers at the address: TimeoutError naming the address and how to start the recorder;
- the server restarted (a new run id) or vLLM cleared its cache (AllBlocksCleared): the
  session resynchronises from a fresh snapshot, starts its history again and says so in `notes`;
- a malformed, foreign or other-schema message: counted in `feed_status()["rejected"]`, skipped;
- a slow notebook: the queue keeps the newest `max_queue` messages, older ones are dropped and
  counted; the recorder counts what it could not send (its counters travel with every message).
  Each step carries only its changes (explorer.drivers.vllm_live.changes), so after a missed step the
  state comes from a fresh snapshot (`feed_status()["rebased"]`), never from a guess.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from types import SimpleNamespace
from typing import Any

from engine.report.records import StepRecord

from ...core.session import Session
from . import changes, protocol

log = logging.getLogger(__name__)

READ_ONLY = ("this session follows a live vLLM server: its traffic comes from the server's own clients "
             "(send requests to the server's OpenAI API)")


class _Dict:
    """A dict behind the `to_dict()` the Session calls."""

    def __init__(self, d: dict) -> None:
        self.d = d
        self.step = d.get("step", 0)

    def to_dict(self) -> dict:
        return self.d


class LiveEngine:
    """The engine protocol (explorer.core.engine_protocol.Engine) over a recorder's feed."""

    read_only = READ_ONLY + "; the budgets are the server's command line"

    def __init__(self, address: str, model: str | None = None, *, timeout: float = 10.0,
                 max_queue: int = 1000, snapshot_address: str | None = None) -> None:
        import zmq

        self.zmq = zmq
        self.address = address
        self.snapshot_address = snapshot_address or protocol.snapshot_address(address)
        self.timeout = float(timeout)
        self._ctx = zmq.Context()
        self._queue: deque[dict] = deque()
        self._max_queue = int(max_queue)
        self._qlock = threading.Lock()
        self.counters = {"received": 0, "applied": 0, "rejected": 0, "dropped_here": 0, "missed": 0,
                         "resyncs": 0, "stale": 0, "rebased": 0}
        self.last_rejection: str | None = None
        self.notes: list[str] = []
        self.server_counters: dict = {}
        self.tokens_left_out = False
        self._finished: dict[str, dict] = {}
        self._texts: dict = {}
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.RCVHWM, max(1, self._max_queue))
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.SUBSCRIBE, protocol.TOPIC)
        self._sub.connect(address)
        self._last_message = time.monotonic()
        self._take_snapshot(first=True)
        self.tokenizer = self._load_tokenizer(model)
        self._running = True
        self._thread = threading.Thread(target=self._receive, name="kvscope-feed", daemon=True)
        self._thread.start()

    # -- the snapshot endpoint --------------------------------------------------------------------
    def _fetch_snapshot(self, timeout: float) -> dict:
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
                f"{self.address}): start the vLLM server with --scheduler-cls explorer.drivers.vllm_live.RecordingScheduler "
                f"and {protocol.ENV_FEED}={self.address}, or tunnel its port (README: Attach to a running vLLM server)"
            ) from None
        finally:
            req.close(0)
        try:
            return protocol.decode([reply], "snapshot")
        except protocol.FeedError as exc:
            raise ValueError(f"the recorder at {self.snapshot_address} answered, but: {exc}") from None

    def _take_snapshot(self, first: bool = False) -> None:
        msg = self._fetch_snapshot(self.timeout)
        self.run_id, self.seq = msg["run_id"], msg["seq"]
        self.server_counters = msg.get("counters") or {}
        self.tokens_left_out = bool(msg.get("tokens_left_out"))
        snap = msg["snapshot"]
        self._finished = {r["request_id"]: r for r in snap["queues"]["finished"]}
        self._snap = snap
        self.step_count = int(snap.get("step", 0))
        self.config = SimpleNamespace(**snap.get("config", {}))
        if not first:
            self._texts.clear()

    # -- the feed thread ----------------------------------------------------------------------------
    def _receive(self) -> None:
        zmq = self.zmq
        poller = zmq.Poller()
        poller.register(self._sub, zmq.POLLIN)
        while self._running:
            try:
                if not poller.poll(100):
                    continue
                frames = self._sub.recv_multipart(zmq.NOBLOCK)
            except zmq.ZMQError:
                return
            self.counters["received"] += 1
            self._last_message = time.monotonic()
            try:
                msg = protocol.decode(frames)
            except protocol.FeedError as exc:
                self.counters["rejected"] += 1
                self.last_rejection = str(exc)
                continue
            with self._qlock:
                if len(self._queue) >= self._max_queue:  # a slow notebook: the oldest step goes
                    self._queue.popleft()
                    self.counters["dropped_here"] += 1
                self._queue.append(msg)

    def pending(self) -> int:
        with self._qlock:
            return len(self._queue)

    # -- the engine protocol ----------------------------------------------------------------------
    @property
    def model_info(self) -> dict:
        return self._snap.get("model_info", {})

    def has_unfinished_requests(self) -> bool:
        """True when a step is waiting that this session has not seen (steps already in the
        snapshot it joined with are dropped here, counted as stale)."""
        with self._qlock:
            while self._queue and self._queue[0]["run_id"] == self.run_id and self._queue[0]["seq"] <= self.seq:
                self._queue.popleft()
                self.counters["stale"] += 1
            return bool(self._queue)

    def step(self) -> _Dict:
        """Apply the next received step; its record."""
        while True:
            with self._qlock:
                if not self._queue:
                    raise ValueError("no step from the server is waiting")
                msg = self._queue.popleft()
            if msg["run_id"] != self.run_id:
                self._restart(f"the server restarted (run {self.run_id[:8]} -> {msg['run_id'][:8]})")
                raise _Resync()
            if msg["seq"] <= self.seq:  # already in the snapshot we joined with
                self.counters["stale"] += 1
                continue
            applied = self.seq
            self.seq = msg["seq"]
            break
        self.server_counters = msg.get("counters") or {}
        rec = msg["record"]
        snap = None
        if msg["seq"] == applied + 1:
            try:
                snap = changes.apply(self._snap, msg["changes"], rec["step"])
            except changes.OutOfStep as exc:
                self.notes.append(f"step {rec['step']} did not fit the state held here ({exc})")
        else:
            self.counters["missed"] += msg["seq"] - applied - 1
        if snap is None:  # steps were missed: the state comes from a fresh snapshot
            rec, snap = self._rebase(msg)
        for r in snap["queues"]["finished"]:
            self._finished[r["request_id"]] = r
        snap["queues"]["finished"] = list(self._finished.values())
        self._add_text(rec, snap)
        self._snap = snap
        self.step_count = rec["step"]
        self.counters["applied"] += 1
        return _Dict(rec)

    def _rebase(self, msg: dict) -> tuple[dict, dict]:
        """After missed steps: (record, snapshot) from a fresh snapshot, taken after `msg` was
        sent. Its step's own record goes with it when it was received (else an empty record of
        that step); the steps it already holds are dropped as stale. The requests that finished
        in the missed steps come from its finished queue; one it no longer holds is kept, marked."""
        try:
            fresh = self._fetch_snapshot(min(self.timeout, 2.0))
        except (TimeoutError, ValueError) as exc:
            self.notes.append(f"steps were missed and no snapshot came to fill them in: {exc}; the panels keep "
                              f"the state of step {self.step_count}")
            return msg["record"], {**self._snap, "step": msg["record"]["step"], "queues": dict(self._snap["queues"])}
        if fresh["run_id"] != self.run_id:
            self._restart("the server restarted while steps were missed")
            raise _Resync()
        snap = fresh["snapshot"]
        rec = msg["record"] if msg["seq"] == fresh["seq"] else None
        with self._qlock:
            while self._queue and self._queue[0]["run_id"] == self.run_id and self._queue[0]["seq"] <= fresh["seq"]:
                held = self._queue.popleft()
                self.counters["stale"] += 1
                if held["seq"] == fresh["seq"]:
                    rec = held["record"]
        if rec is None:
            rec = StepRecord(step=int(snap.get("step", msg["record"]["step"]))).to_dict()
        self.seq = max(self.seq, fresh["seq"])
        self.counters["rebased"] += 1
        q = snap["queues"]
        live = {r["request_id"] for k in ("waiting", "running", "finished") for r in q[k]} | set(self._finished)
        for r in [*self._snap["queues"]["running"], *self._snap["queues"]["waiting"]]:
            if r["request_id"] not in live:  # it finished in a missed step the snapshot no longer holds
                self._finished[r["request_id"]] = {**r, "status": "finished", "finish_reason": "unknown (dropped)"}
        snap["step"] = rec["step"]
        return rec, snap

    def catch_up(self) -> bool:
        """No step came for a while but the state shows requests in flight: the steps that ended
        them may have been dropped. Take a fresh snapshot; True when it was ahead of us."""
        q = self._snap["queues"]
        if not (q["running"] or q["waiting"]) or time.monotonic() - self._last_message < 1.0:
            return False
        self._last_message = time.monotonic()
        try:
            msg = self._fetch_snapshot(min(self.timeout, 2.0))
        except (TimeoutError, ValueError):
            return False
        if msg["run_id"] != self.run_id or msg["seq"] <= self.seq or self.pending():
            return False
        self.counters["missed"] += msg["seq"] - self.seq
        self.seq = msg["seq"]
        snap = msg["snapshot"]
        for r in snap["queues"]["finished"]:
            self._finished[r["request_id"]] = r
        snap["queues"]["finished"] = list(self._finished.values())
        snap["step"] = self.step_count  # the history's latest entry shows the server as it is now
        self._add_text({}, snap)
        self._snap = snap
        self.notes.append(f"caught up from a snapshot after missing steps up to seq {self.seq}")
        return True

    def _restart(self, why: str) -> None:
        self.counters["resyncs"] += 1
        with self._qlock:
            kept = [m for m in self._queue if m["run_id"] != self.run_id]
            self._queue.clear()
        self._take_snapshot()
        with self._qlock:
            self._queue.extend(m for m in kept if m["run_id"] == self.run_id)
        self.notes.append(f"{why}: resynchronised from a fresh snapshot at step {self.step_count}; "
                          "the history starts again")
        log.warning(self.notes[-1])

    def resync(self, why: str) -> None:
        """Start again from a fresh snapshot (after vLLM's AllBlocksCleared, for example)."""
        self._restart(why)

    def snapshot(self) -> _Dict:
        return _Dict(self._snap)

    def add_request(self, *args: Any, **kwargs: Any) -> str:
        raise ValueError(f"add_request: {READ_ONLY}")

    def abort_request(self, request_id: str) -> None:
        raise ValueError(f"abort: {READ_ONLY}")

    def update_scheduler_config(self, **knobs: Any) -> Any:
        raise ValueError("the budgets are the server's own (its command line); a live session shows them read-only")

    def attention_probe(self, request_id: str, layer: int = 0, head: int | None = None) -> Any:
        raise ValueError("attention weights are not in the live feed: the server's queries and KV live on its "
                         "devices. Step vLLM in this process (Session(engine='vllm')) to see them")

    # -- text --------------------------------------------------------------------------------------
    def _load_tokenizer(self, model: str | None) -> Any:
        folder = model or self._snap.get("config", {}).get("model")
        if not folder or not os.path.isdir(str(folder)):
            if model:
                raise ValueError(f"model {model!r} is not a local folder: pass the model's folder for its tokenizer")
            self.notes.append("no tokenizer: the server's model folder is not on this machine; text shows as "
                              "token ids (attach(..., model=PATH) decodes them)")
            return None
        from engine.tokenizer import load_tokenizer

        return load_tokenizer(folder)

    def _decode(self, ids: list[int]) -> str:
        if self.tokenizer is None or not ids:
            return ""
        return self.tokenizer.decode(ids)

    def _add_text(self, rec: dict, snap: dict) -> None:
        if self.tokenizer is None:
            return
        for s in rec.get("sampled", {}).values():
            if s.get("token_id") is not None and not s.get("text"):
                s["text"] = self._decode([s["token_id"]])
        for q in snap["queues"].values():
            for r in q:
                for which in ("prompt", "output"):
                    ids = r.get(f"{which}_token_ids") or []
                    key = (r["request_id"], which)
                    cached = self._texts.get(key)
                    if cached is None or cached[0] != len(ids):
                        cached = self._texts[key] = (len(ids), self._decode(ids))
                    r[f"{which}_text"] = cached[1]

    def close(self) -> None:
        self._running = False
        self._thread.join(timeout=1.0)
        self._sub.close(0)
        self._ctx.term()


class _Resync(Exception):
    """Raised inside Session.step when the feed moved to a new run: LiveSession restarts."""


class LiveDriver:
    """The EngineDriver of a live feed (nothing to build: the server exists already)."""

    config_fields = frozenset()

    def __init__(self, engine: LiveEngine) -> None:
        self.engine = engine
        self.llm = None
        self.name = engine.model_info.get("engine", "vLLM (live server)")

    def rebuild(self, **config_fields: Any) -> "LiveDriver":
        raise ValueError("reset: the server's pool and model are set on its command line; restart the server "
                         "and this session resynchronises by itself")

    def shutdown(self) -> None:
        self.engine.close()


class LiveSession(Session):
    """A Session that follows a live vLLM server (see the module docstring)."""

    def __init__(self, address: str, model: str | None = None, *, timeout: float = 10.0, max_queue: int = 1000,
                 kv_events: Any = None, snapshot_address: str | None = None) -> None:
        engine = LiveEngine(address, model, timeout=timeout, max_queue=max_queue, snapshot_address=snapshot_address)
        super().__init__(engine=LiveDriver(engine))
        self.address = address
        if isinstance(kv_events, str):  # an address; or a KvEventSubscriber already listening
            from .kv_events import KvEventSubscriber

            kv_events = KvEventSubscriber(kv_events)
        self.kv_events = kv_events
        self._cleared_seen = 0
        self._batched: list[str] | None = None
        self._poll_lock = threading.Lock()
        self._follow: threading.Thread | None = None
        self._follow_stop = threading.Event()

    @property
    def notes(self) -> list[str]:
        return self.engine.notes

    def step(self, n: int = 1) -> list:
        """Apply up to `n` steps received from the server (none waiting: [])."""
        self._check_cleared()
        try:
            records = super().step(n)
        except _Resync:
            with self._lock:
                self._start_history()
                self.last_error = self.engine.notes[-1]
            self._notify("reset")
            return []
        self._count_hits(records)
        return records

    def poll(self, max_steps: int = 10_000) -> list:
        """Apply every step received so far (at most `max_steps`); views hear one 'step' event."""
        with self._poll_lock:  # the Follow thread and a caller's wait_for take turns
            self._batched = []
            try:
                records = self.step(max(1, min(max_steps, self.engine.pending() or 1)))
                if not records and self.engine.catch_up():
                    with self._lock:
                        self._refresh_current()
                    self._notify("feed")
            finally:
                held, self._batched = self._batched, None
            for event in dict.fromkeys(held):  # each kind once, in order: a view redraws once per poll
                super()._notify(event)
        return records

    def _notify(self, event: str) -> None:
        held = getattr(self, "_batched", None)
        if held is not None:
            held.append(event)
        else:
            super()._notify(event)

    def follow_panel(self) -> Any:
        """The Follow / Pause panel for this session (widgets.follow; the Dashboard shows it)."""
        from ...ui.follow_view import follow_panel

        return follow_panel(self)

    def wait_for(self, predicate, timeout: float = 30.0, interval: float = 0.05) -> bool:
        """Apply steps as they come until predicate(session) holds or `timeout` passes."""
        end = time.monotonic() + timeout
        while True:
            self.poll()
            if predicate(self):
                return True
            if time.monotonic() >= end:
                return False
            time.sleep(interval)

    def follow(self, interval: float = 0.1) -> None:
        """Apply steps in a thread as they arrive (the Dashboard's Follow)."""
        if self._follow is not None and self._follow.is_alive():
            return
        self._follow_stop.clear()

        def run() -> None:
            while not self._follow_stop.wait(interval):
                try:
                    self.poll(256)
                except Exception:  # noqa: BLE001 - following must outlive one bad step
                    log.exception("following the live feed failed")

        self._follow = threading.Thread(target=run, name="kvscope-follow", daemon=True)
        self._follow.start()

    def pause(self) -> None:
        """Stop applying steps; they wait in the bounded queue (the oldest dropped, counted)."""
        self._follow_stop.set()
        if self._follow is not None:
            self._follow.join(timeout=2.0)
        self._follow = None

    @property
    def following(self) -> bool:
        return self._follow is not None and self._follow.is_alive()

    def feed_status(self) -> dict:
        """What the feed did: this side's counters, the recorder's, the run, notes."""
        e = self.engine
        status = {"address": self.address, "run_id": e.run_id, "seq": e.seq, "pending": e.pending(),
                  "following": self.following, **e.counters, "last_rejection": e.last_rejection,
                  "server": dict(e.server_counters), "tokens_left_out": e.tokens_left_out, "notes": list(e.notes)}
        if self.kv_events is not None:
            status["kv_events"] = dict(self.kv_events.counters)
        return status

    def _check_cleared(self) -> None:
        kv = self.kv_events
        if kv is not None and len(kv.cleared_at) > self._cleared_seen:
            self._cleared_seen = len(kv.cleared_at)
            with self._lock:
                self.engine.resync("vLLM cleared its prefix cache (AllBlocksCleared)")
                self._start_history()
            self._notify("reset")

    def _count_hits(self, records: list) -> None:
        kv = self.kv_events
        if kv is None or not records:
            return
        with kv.lock:
            for entry in self._history[-len(records):]:
                if entry.record is None:
                    continue
                blocks = entry.snapshot["block_pool"]["blocks"]
                for b in entry.record["blocks"].get("hits", ()):
                    kv.tree.add_hit(blocks[b].get("event_key"))

    def close(self) -> None:
        self.pause()
        if self.kv_events is not None:
            self.kv_events.close()
        self._driver.shutdown()


def attach(address: str, model: str | None = None, **options: Any) -> LiveSession:
    """Follow the kvscope recorder of a running vLLM server at `address` (its KVSCOPE_FEED)."""
    return LiveSession(address, model, **options)
