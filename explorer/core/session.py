"""Session: drives one engine step by step (or follows one it cannot drive), keeps every
step's record and snapshot, and tells its views what changed.

The engine knows nothing of Jupyter; the Session is what a notebook (or the Dashboard)
holds. Everything it hands out is plain JSON-able data: `StepRecord.to_dict()`,
`EngineSnapshot.to_dict()` and the metrics dict (explorer/core/metrics.py).
"""
from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from typing import Any, Literal, cast

from engine import LLM, EngineConfig, SamplingParams, StepRecord
from engine.report.changes import apply
from engine.report.list_prefix import ListPrefix
from engine.report.probe import AttentionProbeDict
from engine.report.schema import CHANGES, QUEUE, REC, SNAP, EngineSnapshotDict, StepRecordDict

from .engine_protocol import Controls, EngineDriver, Source, make_driver
from .follow import Follower, wait_until
from .history import History, HistoryEntry, HistoryWindowDict
from .metrics import SessionMetricsDict, session_metrics

log = logging.getLogger(__name__)

# 'follow' / 'pause': following started or stopped; 'reset': the history starts again (a new
# engine, or a server that restarted).
EVENTS = ("step", "add", "reset", "budget", "abort", "error", "follow", "pause")
Observer = Callable[[str, "Session"], None]
# A Session that follows a live server keeps this many steps unless told otherwise: at a GPU
# server's 50-100 steps a second, an unbounded history fills the notebook's memory.
LIVE_HISTORY = 2000
# ... and at most about this many MiB of what its steps added (explorer/core/history.py: a big
# server's step adds megabytes: each running request's growing lists are copied per step).
LIVE_HISTORY_MIB = 1024.0
# ... and this many finished requests in each state (a server runs requests for days).
LIVE_FINISHED = 1000

_SAMPLING_FIELDS = frozenset(f.name for f in dataclasses.fields(SamplingParams))


class Session:
    """Drives an engine one step at a time and keeps its history for scrubbing back.

    `Session(llm_or_config=None, *, engine="kvscope", debug_invariants=False, max_history=None,
    max_history_mib=None, max_finished=None, **config_fields)` accepts an `LLM`, an
    `EngineConfig`, a model folder (str / path) or None
    (the default model, with `config_fields` as EngineConfig overrides). `engine="vllm"` steps
    vLLM itself (explorer.drivers.vllm.engine: `config_fields` are VllmConfig fields or vLLM
    engine arguments); any engine of explorer.core.engine_protocol.ENGINES, or a ready
    EngineDriver, works the same. `Session.attach(address)` follows a live vLLM server.
    `engine_name` says which engine the panels show.

    History holds one `HistoryEntry` per engine step plus the entry it started from; each
    snapshot is the previous one with the step's `changes` applied (engine/report/changes.py).
    `max_history` keeps only the latest that many steps, `max_history_mib` only about that many
    MiB of what they added, `max_finished` that many finished requests in each state (None: no
    bound). The latest entry's
    snapshot is updated after `add_request`, `abort` and `set_budget`, so it always shows the
    engine as it is now (requests added before step k+1 appear in entry k, in the waiting queue).

    `controls` is None for an engine the Session only watches (a live server): the actions
    then raise ValueError saying so, and the Dashboard shows no Step. `follow()` applies
    steps in a thread as they become ready; `pause()` stops it.

    Observers (`subscribe`) are called with (event, session) after each change (EVENTS). An
    observer that raises is logged and skipped: a broken view must not break the engine. Bad
    input raises ValueError to the caller, and is also kept in `last_error` and announced as
    'error'; the session and its history are unchanged by a failed call. `last_error` is
    cleared by the next action that succeeds. Queries (`probe`, `entry`, `metrics`) neither set
    nor clear it.
    """

    def __init__(self, llm_or_config: LLM | EngineConfig | str | Any | None = None, *,
                 engine: str | EngineDriver = "kvscope", debug_invariants: bool = False,
                 max_history: int | None = None, max_history_mib: float | None = None,
                 max_finished: int | None = None, **config_fields: Any) -> None:
        self._lock = threading.RLock()  # a follow thread and a click must not interleave
        self._observers: list[Observer] = []
        self.last_error: str | None = None
        if debug_invariants:
            config_fields["check_invariants"] = True
        self.check_changes = debug_invariants  # each step: the applied snapshot equals a whole one
        self._max_history = max_history
        self._max_history_mib = max_history_mib
        if max_finished is not None and (isinstance(max_finished, bool) or not isinstance(max_finished, int)
                                         or max_finished < 1):
            raise ValueError(f"max_finished must be an integer >= 1 (finished requests kept) or None, "
                             f"got {max_finished!r}")
        self._max_finished = max_finished
        self._finished_shown: set[str] = set()  # set with each history's first entry (_new_history)
        self._driver: EngineDriver = make_driver(engine, llm_or_config, config_fields)
        self._follower = Follower(self.poll)
        self._held: list[str] | None = None  # events held back while a poll applies several steps
        self._poll_lock = threading.Lock()   # the follow thread and a caller's wait_for take turns
        self._start_history()

    def _start_history(self) -> None:
        snap = self.source.snapshot().to_dict()
        if self.controls is not None:
            self.controls.take_changes()  # the snapshot is the refresh point: what came before is in it
        self._history = self._new_history(snap)

    def _finished_kept(self, snapshot: EngineSnapshotDict) -> EngineSnapshotDict:
        """`snapshot` with its finished queue cut to the latest `max_finished` requests, and
        every request that finished since the previous step's entry, however many (aborts
        between steps included): each finished request is in the entry of a step, where a
        recording or the why-ledger reads it."""
        if self._max_finished is None:
            return snapshot
        queues = snapshot["queues"]
        done = queues["finished"]
        if len(done) > self._max_finished:
            cut, shown = len(done) - self._max_finished, self._finished_shown
            done = [r for i, r in enumerate(done) if i >= cut or r["request_id"] not in shown]
            snapshot = cast(EngineSnapshotDict, {**snapshot, "queues": {**queues, "finished": done}})
        self._finished_shown = {r["request_id"] for r in done}
        return snapshot

    def _new_history(self, snapshot: EngineSnapshotDict) -> History:
        # The finished requests a step's entry has shown (_finished_kept's bound spares the rest).
        self._finished_shown = {r["request_id"] for r in snapshot["queues"]["finished"]}
        return History(HistoryEntry(step=snapshot[SNAP.STEP], record=None, snapshot=snapshot), self._max_history,
                       max_mib=self._max_history_mib)

    @classmethod
    def attach(cls, address: str | list[str], model: str | None = None, *, max_history: int | None = LIVE_HISTORY,
               max_history_mib: float | None = LIVE_HISTORY_MIB, max_finished: int | None = LIVE_FINISHED,
               ranks: int | None = None, **options: Any) -> Any:
        """Follow a running vLLM server whose scheduler is kvscope's recorder
        (`--scheduler-cls explorer.drivers.vllm_live.RecordingScheduler`, feed at `address`, e.g.
        "tcp://127.0.0.1:5590"): a Session without controls that applies the server's steps
        (`follow()`, `pause()`, `feed_status()`). `model`: the model folder, for token texts;
        `options`: explorer.drivers.vllm_live.client.LiveSource's (timeout, max_queue,
        kv_events, snapshot_address). It keeps the latest `max_history` steps, and no more than
        about `max_history_mib` MiB of what they added (history_window says where it starts),
        each state with its latest `max_finished` finished requests.

        A data-parallel server has one engine core per rank, and a list of addresses names
        several servers: then it returns an explorer.core.fleet.Fleet of one Session per
        engine core (`ranks`: a server's rank count, instead of asking rank 1, 2, ...)."""
        from .fleet import attach

        return attach(cls, address, model, ranks=ranks, session_options={
            "max_history": max_history, "max_history_mib": max_history_mib, "max_finished": max_finished}, **options)

    # -- read-only views ------------------------------------------------------------------
    @property
    def llm(self) -> Any:
        """The LLM object behind the engine (kvscope's `LLM`, or vLLM's `LLM`; None for a server)."""
        return self._driver.llm

    @property
    def engine(self) -> Any:
        """The engine object (kvscope's LLMEngine, explorer.drivers.vllm.engine.VllmEngine, or a
        live server's LiveSource)."""
        return self._driver.engine

    @property
    def source(self) -> Source:
        """The engine as something to show (explorer/core/engine_protocol.py)."""
        return self._driver.source

    @property
    def controls(self) -> Controls | None:
        """The engine as something to drive; None when this session only watches it."""
        return self._driver.controls

    @property
    def watch_only(self) -> str:
        """Why this session cannot drive its engine ("" when it can)."""
        return self._driver.watch_only if self.controls is None else ""

    @property
    def engine_name(self) -> str:
        """Which engine this session shows, as the panels name it ("kvscope", "vLLM 0.32.0")."""
        return self._driver.name

    @property
    def config(self) -> EngineConfig | Any:
        return self.source.config

    @property
    def history(self) -> list[HistoryEntry]:
        """Every step kept, oldest first (a copy: appending to it changes nothing)."""
        return list(self._history.entries)

    @property
    def history_window(self) -> HistoryWindowDict:
        """Where the kept history starts: its first step, the steps dropped before it, the bounds
        (`max_steps`, `max_mib`) and, under a MiB bound, the MiB its steps added."""
        return self._history.window

    @property
    def current(self) -> HistoryEntry:
        """The latest entry (the one the history started from before any step)."""
        return self._history.entries[-1]

    def entry(self, step: int) -> HistoryEntry:
        """The history entry of engine step `step` (for scrubbing)."""
        entries = self._history.entries
        for e in reversed(entries):
            if e.step == step:
                return e
        raise ValueError(f"step {step!r} is not in the history (it holds steps {entries[0].step}..{entries[-1].step}"
                         + (f"; {self._history.dropped} earlier steps were dropped)" if self._history.dropped else ")"))

    @property
    def records(self) -> list[StepRecordDict]:
        """The StepRecord dicts of the history, oldest first."""
        return [e.record for e in self._history.entries if e.record is not None]

    # -- actions --------------------------------------------------------------------------
    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None, *,
                    request_id: str | None = None, **sampling_fields: Any) -> str:
        """Queue a request; returns its id. `sampling_fields` build SamplingParams (or
        override fields of `params`). Bad input raises ValueError naming the field."""
        with self._action():
            controls = self._need_controls("add_request")
            unknown = set(sampling_fields) - _SAMPLING_FIELDS
            if unknown:
                raise ValueError(f"unknown sampling field(s) {sorted(unknown)}; known: {sorted(_SAMPLING_FIELDS)}")
            if params is None:
                params = SamplingParams(**sampling_fields)
            elif sampling_fields:
                params = dataclasses.replace(params, **sampling_fields)
            rid = controls.add_request(prompt, params, request_id=request_id)
            self._apply_actions(controls)
        self._notify("add")
        return rid

    def step(self, n: int = 1) -> list[StepRecord]:
        """Apply up to `n` engine steps, stopping early once none is ready (an engine with
        nothing to do, a feed with nothing received). With none ready it returns []."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            self._fail(ValueError(f"n must be an integer >= 1, got {n!r}"))
        records: list[StepRecord] = []
        for _ in range(n):
            with self._action():
                if not self.source.pending():
                    break
                rec = self.source.step()
                event = self._append(rec)
            if event != "abort":   # a change between steps is no step
                records.append(rec)
            self._notify(event)
        return records

    def _append(self, rec: StepRecord) -> str:
        """Add a step's entry: the previous snapshot with its changes applied ('step'), or, for
        changes that restart the history (a new server run), a history that starts again ('reset'),
        or, for changes between two steps, the latest entry brought up to date ('abort')."""
        record = rec.to_dict()
        changes = record[REC.CHANGES]
        if CHANGES.RESTART in changes:
            snapshot = changes[CHANGES.SNAPSHOT]
            self._history = self._new_history(snapshot)
            return "reset"  # why: the source's notes
        if rec.step == self.current.step and CHANGES.SNAPSHOT not in changes and not record[REC.SCHEDULED]:
            # A change between two steps (a live server's abort while nothing ran: the feed
            # carries it under the last step's number): the latest entry shows the state as it
            # is now, as after an action here (_apply_actions), and no step is added, so the
            # history's steps stay vLLM's. The finished bound spares it until the next step.
            self._history.replace_last(apply(self.current.snapshot, changes))
            return "abort"
        if CHANGES.SNAPSHOT not in changes and rec.step != self.current.step + 1:
            # A step this history never saw (taken on the engine directly): its changes went with
            # it, so the state comes whole, never from a guess.
            snapshot = self.source.snapshot().to_dict()
        else:
            snapshot = apply(self.current.snapshot, changes)
        snapshot = self._finished_kept(snapshot)
        if self.check_changes:
            self._check_against_whole(snapshot, f"step {rec.step}")
        self._history.append(HistoryEntry(step=rec.step, record=record, snapshot=snapshot))
        return "step"

    def run_until_idle(self, max_steps: int = 10_000) -> list[StepRecord]:
        """Step until every request has finished (at most `max_steps` steps)."""
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
            self._fail(ValueError(f"max_steps must be an integer >= 1, got {max_steps!r}"))
        return self.step(max_steps)

    def set_budget(self, **knobs: Any) -> dict[str, Any]:
        """Change scheduler knobs (max_num_batched_tokens, max_num_seqs,
        enable_chunked_prefill, enable_prefix_caching, scheduler_reserve_full_isl, scheduling_policy)
        between steps. Validated by the engine; returns the knobs now in force."""
        with self._action():
            controls = self._need_controls("set_budget")
            if not knobs:
                raise ValueError("set_budget needs at least one knob, e.g. max_num_batched_tokens=64")
            config = controls.update_scheduler_config(**knobs)
            self._apply_actions(controls)
            in_force = {k: getattr(config, k) for k in knobs}
        self._notify("budget")
        return in_force

    def reset(self, **config_fields: Any) -> None:
        """A new engine with this one's config changed by `config_fields` (pool and model
        knobs: num_kv_blocks, block_size, model, dtype, ...); the history starts again.
        The new engine is built before the old one is let go: on bad input, or a config
        the engine refuses, the old engine and its history stay."""
        with self._action():
            new = self._driver.rebuild(**config_fields)
            old, self._driver = self._driver, new
            old.shutdown()
            self._start_history()
        self._notify("reset")

    def abort(self, request_id: str) -> None:
        """Abort a waiting or running request; its blocks are freed at once."""
        with self._action():
            controls = self._need_controls("abort")
            controls.abort_request(request_id)
            self._apply_actions(controls)
        self._notify("abort")

    def probe(self, request_id: str, layer: int = 0, head: int | None = None) -> AttentionProbeDict:
        """Attention weights of a running request (AttentionProbe.to_dict()).

        A query, not an action: a ValueError (say, the request just finished and its
        blocks are gone) goes to the caller only; `last_error` and observers are left
        alone, so a view probing after each step does not raise an error banner."""
        with self._lock:
            return self._need_controls("probe").attention_probe(request_id, layer=layer, head=head).to_dict()

    # -- following ------------------------------------------------------------------------
    def poll(self, max_steps: int = 10_000) -> list[StepRecord]:
        """Apply every step ready now (at most `max_steps`); observers hear each kind of event
        once, so a view redraws once per poll, however many steps came."""
        with self._poll_lock:
            self._held = []
            try:
                records = self.step(max(1, min(max_steps, self.source.pending() or 1)))
            finally:
                held, self._held = self._held, None
            for event in dict.fromkeys(held):
                self._notify(event)
        return records

    def follow(self, interval: float = 0.1) -> None:
        """Apply steps in a thread as they become ready, until `pause()` (the Dashboard's Follow)."""
        if self._follower.start(interval):
            self._notify("follow")

    def pause(self) -> None:
        """Stop following; steps wait in the source (a live feed's bounded queue) until the next poll."""
        if self._follower.stop():
            self._notify("pause")

    @property
    def following(self) -> bool:
        return self._follower.running

    def wait_for(self, predicate: Callable[[Session], bool], timeout: float = 30.0,
                 interval: float = 0.05) -> bool:
        """Apply steps as they come until `predicate(session)` holds or `timeout` passes."""
        def ready() -> bool:
            if not self.following:
                self.poll()
            return predicate(self)

        return wait_until(ready, timeout, interval)

    def feed_status(self) -> dict[str, Any]:
        """What the source did (a live feed's counters, the recorder's, notes: whatever its
        `status()` says) and whether this session follows it; an engine stepped here has only the
        latter."""
        status = getattr(self.source, "status", None)
        return {**(status() if callable(status) else {}), "following": self.following,
                "history": self.history_window}

    @property
    def notes(self) -> list[str]:
        """What the source had to say (a live feed's resynchronisations, missed steps)."""
        return list(getattr(self.source, "notes", ()))

    def save_recording(self, path: Any, *, notes: Any = ()) -> Any:
        """Write this session's history as a recording (explorer/core/recording.py): the
        settings, every request (arrival, prompt, outputs, how it ended) and each step's timings,
        for explorer.whatif to replay through vLLM's own scheduler. Returns the file's path."""
        from .recording import save_recording

        return save_recording(self, path, notes=notes)

    def close(self) -> None:
        """Stop following and let the engine go (a live feed's sockets; an engine's workers)."""
        self.pause()
        self._driver.shutdown()

    # -- observers ------------------------------------------------------------------------
    def subscribe(self, callback: Observer) -> Callable[[], None]:
        """Call `callback(event, session)` after every change; returns an unsubscribe function."""
        if not callable(callback):
            raise ValueError(f"callback must be callable, got {type(callback).__name__}")
        self._observers.append(callback)

        def unsubscribe() -> None:
            try:
                self._observers.remove(callback)
            except ValueError:
                pass  # already gone: unsubscribing twice is harmless

        return unsubscribe

    def _notify(self, event: str) -> None:
        held = self._held
        if held is not None:
            held.append(event)
            return
        for cb in list(self._observers):
            try:
                cb(event, self)
            except Exception:  # a broken view must not break the engine (logged, not raised)
                log.exception("session observer %r failed on %r", cb, event)

    # -- metrics --------------------------------------------------------------------------
    @property
    def metrics(self) -> SessionMetricsDict:
        """Per-request rows and a summary, on the engine clock (which advances only while
        a step executes, so manual stepping does not inflate latencies)."""
        return session_metrics(self.current.snapshot, self.records)

    # -- internals ------------------------------------------------------------------------
    def _need_controls(self, action: str) -> Controls:
        if self.controls is None:
            raise ValueError(f"{action}: {self._driver.watch_only}")
        return self.controls

    def _apply_actions(self, controls: Controls) -> None:
        """The latest entry shows what an action changed (its changes applied)."""
        snapshot = apply(self.current.snapshot, controls.take_changes())
        if self.check_changes:
            self._check_against_whole(snapshot, "after an action")
        self._history.replace_last(snapshot)

    def _check_against_whole(self, snapshot: EngineSnapshotDict, when: str) -> None:
        whole = self.source.snapshot().to_dict()
        if whole != snapshot:
            raise AssertionError(f"{when}: the snapshot built from the changes differs from the engine's whole "
                                 f"snapshot ({_first_difference(whole, snapshot)})")

    def _action(self) -> _Action:
        return _Action(self)

    def _fail(self, exc: Exception) -> None:
        self.last_error = str(exc)
        self._notify("error")
        raise exc

    def __repr__(self) -> str:
        cur = self.current.snapshot
        q = cur[SNAP.QUEUES]
        return (f"Session(step={cur[SNAP.STEP]}, waiting={len(q[QUEUE.WAITING])}, "
                f"running={len(q[QUEUE.RUNNING])}, finished={len(q[QUEUE.FINISHED])}, "
                f"history={len(self._history)})")


def _first_difference(a: Any, b: Any, path: str = "snapshot") -> str:
    """Where two JSON-like values first differ, as 'path: a != b'."""
    if type(a) is dict and type(b) is dict:
        for key in [*a, *(k for k in b if k not in a)]:
            if a.get(key, "<missing>") != b.get(key, "<missing>"):
                return _first_difference(a.get(key, "<missing>"), b.get(key, "<missing>"), f"{path}.{key}")
    if isinstance(a, (list, ListPrefix)) and isinstance(b, (list, ListPrefix)) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return _first_difference(x, y, f"{path}[{i}]")
    return f"{path}: {a!r:.200} != {b!r:.200}"


class _Action:
    """One public action: holds the lock, clears `last_error` on success; on failure
    stores the message, announces 'error' and lets the exception propagate."""

    def __init__(self, session: Session) -> None:
        self.s = session

    def __enter__(self) -> None:
        self.s._lock.acquire()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> Literal[False]:
        try:
            if exc is None:
                self.s.last_error = None
            elif isinstance(exc, Exception):
                # Bad input reads best as the bare message; anything else names its type.
                self.s.last_error = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
        finally:
            self.s._lock.release()
        if isinstance(exc, Exception):
            self.s._notify("error")
        return False  # never swallow
