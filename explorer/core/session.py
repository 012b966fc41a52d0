"""Session: drives one engine step by step, keeps every step's record and snapshot, and
tells its views what changed.

The engine knows nothing of Jupyter; the Session is what a notebook (or the Dashboard)
holds. Everything it hands out is plain JSON-able data: `StepRecord.to_dict()`,
`EngineSnapshot.to_dict()` and the metrics dict below.
"""
from __future__ import annotations

import dataclasses
import logging
import statistics
import threading
from typing import Any, Callable, Iterable

from engine import LLM, EngineConfig, SamplingParams, StepRecord

from .engine_protocol import Engine, EngineDriver, make_driver
from .history import HistoryEntry, share_unchanged, snapshot_after_step

log = logging.getLogger(__name__)

EVENTS = ("step", "add", "reset", "budget", "abort", "error")
Observer = Callable[[str, "Session"], None]

_SAMPLING_FIELDS = frozenset(f.name for f in dataclasses.fields(SamplingParams))


class Session:
    """Drives an engine one step at a time and keeps its history for scrubbing back.

    `Session(llm_or_config=None, *, engine="kvscope", debug_invariants=False, **config_fields)`
    accepts an `LLM`, an `EngineConfig`, a model folder (str / path) or None (the default
    model, with `config_fields` as EngineConfig overrides). `engine="vllm"` steps vLLM itself
    (explorer.drivers.vllm.engine: `config_fields` are VllmConfig fields or vLLM engine arguments);
    any engine of explorer.core.engine_protocol.ENGINES, or a ready EngineDriver, works the same.
    `engine_name` says which engine the panels show.

    History holds one `HistoryEntry` per engine step plus the step-0 entry. Entries
    are frozen once the next step runs; the latest entry's snapshot is refreshed after
    `add_request`, `abort` and `set_budget`, so it always shows the engine as it is now
    (requests added before step k+1 appear in entry k, in the waiting queue).

    Observers (`subscribe`) are called with (event, session) after each change, one
    'step' event per engine step. An observer that raises is logged and skipped: a
    broken view must not break the engine. Bad input raises ValueError to the caller,
    and is also kept in `last_error` and announced as 'error'; the session and its
    history are unchanged by a failed call. `last_error` is cleared by the next action
    that succeeds. Queries (`probe`, `entry`, `metrics`) neither set nor clear it.
    """

    def __init__(self, llm_or_config: LLM | EngineConfig | str | Any | None = None, *,
                 engine: str | EngineDriver = "kvscope", debug_invariants: bool = False,
                 **config_fields: Any) -> None:
        self._lock = threading.RLock()  # a Play loop in a thread and a click must not interleave
        self._observers: list[Observer] = []
        self.last_error: str | None = None
        if debug_invariants:
            config_fields["check_invariants"] = True
        self._driver: EngineDriver = make_driver(engine, llm_or_config, config_fields)
        self._history: list[HistoryEntry] = []
        self._start_history()

    def _start_history(self) -> None:
        snap = self.engine.snapshot().to_dict()
        self._history = [HistoryEntry(step=snap["step"], record=None, snapshot=snap)]

    @classmethod
    def attach(cls, address: str, model: str | None = None, **options: Any) -> "Session":
        """Follow a running vLLM server whose scheduler is kvscope's recorder
        (`--scheduler-cls explorer.drivers.vllm_live.RecordingScheduler`, feed at `address`, e.g.
        "tcp://127.0.0.1:5590"): a read-only Session that applies the server's steps
        (explorer.drivers.vllm_live.client.LiveSession: `follow()`, `pause()`, `feed_status()`)."""
        # LiveSession subclasses Session, so it is imported here (tests/unit/test_import_layers.py
        # names this one cycle).
        from ..drivers.vllm_live.client import LiveSession

        return LiveSession(address, model, **options)

    # -- read-only views ------------------------------------------------------------------
    @property
    def llm(self) -> Any:
        """The LLM object behind the engine (kvscope's `LLM`, or vLLM's `LLM`)."""
        return self._driver.llm

    @property
    def engine(self) -> Engine:
        """The engine being driven (kvscope's LLMEngine, or explorer.drivers.vllm.engine.VllmEngine)."""
        return self._driver.engine

    @property
    def engine_name(self) -> str:
        """Which engine this session steps, as the panels name it ("kvscope", "vLLM 0.32.0")."""
        return self._driver.name

    @property
    def config(self) -> EngineConfig | Any:
        return self.engine.config

    @property
    def history(self) -> list[HistoryEntry]:
        """Every step so far, oldest first (a copy: appending to it changes nothing)."""
        return list(self._history)

    @property
    def current(self) -> HistoryEntry | None:
        """The latest entry (the step-0 entry before any step)."""
        return self._history[-1] if self._history else None

    def entry(self, step: int) -> HistoryEntry:
        """The history entry of engine step `step` (for scrubbing)."""
        for e in reversed(self._history):
            if e.step == step:
                return e
        raise ValueError(f"step {step!r} is not in the history "
                         f"(it holds steps {self._history[0].step}..{self._history[-1].step})")

    @property
    def records(self) -> list[dict]:
        """The StepRecord dicts of the history, oldest first."""
        return [e.record for e in self._history if e.record is not None]

    # -- actions --------------------------------------------------------------------------
    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None, *,
                    request_id: str | None = None, **sampling_fields: Any) -> str:
        """Queue a request; returns its id. `sampling_fields` build SamplingParams (or
        override fields of `params`). Bad input raises ValueError naming the field."""
        with self._action():
            unknown = set(sampling_fields) - _SAMPLING_FIELDS
            if unknown:
                raise ValueError(f"unknown sampling field(s) {sorted(unknown)}; known: {sorted(_SAMPLING_FIELDS)}")
            if params is None:
                params = SamplingParams(**sampling_fields)
            elif sampling_fields:
                params = dataclasses.replace(params, **sampling_fields)
            rid = self.engine.add_request(prompt, params, request_id=request_id)
            self._refresh_current()
        self._notify("add")
        return rid

    def step(self, n: int = 1) -> list[StepRecord]:
        """Advance up to `n` engine steps, stopping early once no request is left.
        With nothing to do it steps nothing and returns []."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            self._fail(ValueError(f"n must be an integer >= 1, got {n!r}"))
        records: list[StepRecord] = []
        for _ in range(n):
            with self._action():
                if not self.engine.has_unfinished_requests():
                    break
                rec = self.engine.step()
                record = rec.to_dict()
                # Built from what the step changed: unchanged blocks and requests point at the
                # previous step's objects, so a history costs a fraction of full copies, and
                # watching little more than not watching (explorer/core/history.py).
                snapshot = snapshot_after_step(self.engine, self._history[-1].snapshot, record)
                self._history.append(HistoryEntry(step=rec.step, record=record, snapshot=snapshot))
            records.append(rec)
            self._notify("step")
        return records

    def run_until_idle(self, max_steps: int = 10_000) -> list[StepRecord]:
        """Step until every request has finished (at most `max_steps` steps)."""
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
            self._fail(ValueError(f"max_steps must be an integer >= 1, got {max_steps!r}"))
        return self.step(max_steps)

    def set_budget(self, **knobs: Any) -> dict[str, Any]:
        """Change scheduler knobs (max_num_batched_tokens, max_num_seqs,
        enable_chunked_prefill, enable_prefix_caching, scheduler_reserve_full_isl, scheduling_policy)
        between steps.
        Validated by the engine; returns the knobs now in force."""
        with self._action():
            if not knobs:
                raise ValueError("set_budget needs at least one knob, e.g. max_num_batched_tokens=64")
            config = self.engine.update_scheduler_config(**knobs)
            self._refresh_current()
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
            self.engine.abort_request(request_id)
            self._refresh_current()
        self._notify("abort")

    def probe(self, request_id: str, layer: int = 0, head: int | None = None) -> dict:
        """Attention weights of a running request (AttentionProbe.to_dict()).

        A query, not an action: a ValueError (say, the request just finished and its
        blocks are gone) goes to the caller only; `last_error` and observers are left
        alone, so a view probing after each step does not raise an error banner."""
        with self._lock:
            return self.engine.attention_probe(request_id, layer=layer, head=head).to_dict()

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
        for cb in list(self._observers):
            try:
                cb(event, self)
            except Exception:  # noqa: BLE001 - a broken view must not break the engine
                log.exception("session observer %r failed on %r", cb, event)

    # -- metrics --------------------------------------------------------------------------
    @property
    def metrics(self) -> dict:
        """Per-request rows and a summary, on the engine clock (which advances only while
        a step executes, so manual stepping does not inflate latencies)."""
        return session_metrics(self.current.snapshot, self.records)

    def export_html(self, path, **options) -> Any:
        """One self-contained HTML file of this session's history, to open offline
        (explorer/export/page.py: scrubbing, hovering and the charts work; no engine actions)."""
        from ..export.page import export_html
        return export_html(self, path, **options)

    # -- internals ------------------------------------------------------------------------
    def _refresh_current(self) -> None:
        cur = self._history[-1]
        self._history[-1] = dataclasses.replace(
            cur, snapshot=share_unchanged(self.engine.snapshot().to_dict(), cur.snapshot))

    def _action(self) -> "_Action":
        return _Action(self)

    def _fail(self, exc: Exception) -> None:
        self.last_error = str(exc)
        self._notify("error")
        raise exc

    def __repr__(self) -> str:
        cur = self.current.snapshot if self.current else {}
        q = cur.get("queues", {})
        return (f"Session(step={cur.get('step')}, waiting={len(q.get('waiting', []))}, "
                f"running={len(q.get('running', []))}, finished={len(q.get('finished', []))}, "
                f"history={len(self._history)})")


class _Action:
    """One public action: holds the lock, clears `last_error` on success; on failure
    stores the message, announces 'error' and lets the exception propagate."""

    def __init__(self, session: Session) -> None:
        self.s = session

    def __enter__(self) -> None:
        self.s._lock.acquire()

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            if exc is None:
                self.s.last_error = None
            elif isinstance(exc, Exception):
                # Bad input reads best as the bare message; anything else names its type.
                self.s.last_error = str(exc) if isinstance(exc, ValueError) else f"{exc_type.__name__}: {exc}"
        finally:
            self.s._lock.release()
        if isinstance(exc, Exception):
            self.s._notify("error")
        return False  # never swallow


# -- helpers ------------------------------------------------------------------------------
def _mean(xs: Iterable[float]) -> float | None:
    xs = list(xs)
    return statistics.fmean(xs) if xs else None


def _median(xs: Iterable[float]) -> float | None:
    xs = list(xs)
    return statistics.median(xs) if xs else None


def request_row(req: dict) -> dict:
    """One request's metrics on the engine clock (seconds; None where not known yet)."""
    m = req["metrics"]["engine"]
    itl = list(m.get("inter_token_latency") or [])
    return {
        "request_id": req["request_id"],
        "status": req["status"],
        "finish_reason": req.get("finish_reason"),
        "num_prompt_tokens": len(req["prompt_token_ids"]),
        "num_output_tokens": len(req["output_token_ids"]),
        "num_cached_tokens": req.get("num_cached_tokens", 0),
        "num_preemptions": req.get("num_preemptions", 0),
        "arrival_time": m.get("arrival_time"),
        "first_token_time": m.get("first_token_time"),
        "token_times": list(m.get("token_times") or []),
        # vLLM's per-request metric names (RequestMetrics / its Prometheus histograms).
        "time_to_first_token": m.get("time_to_first_token"),
        "inter_token_latency": itl,
        "mean_inter_token_latency": _mean(itl),
        "time_per_output_token": m.get("time_per_output_token"),
        "e2e_request_latency": m.get("e2e_request_latency"),
        "request_queue_time": m.get("request_queue_time"),
    }


def session_metrics(snapshot: dict, records: list[dict]) -> dict:
    """Per-request rows and a summary from the latest snapshot and the step records."""
    queues = snapshot["queues"]
    reqs = [*queues["finished"], *queues["running"], *queues["waiting"]]
    rows = sorted((request_row(r) for r in reqs), key=lambda r: (r["arrival_time"] is None, r["arrival_time"] or 0))
    em = snapshot.get("metrics", {})
    engine_time = records[-1]["engine_time_s"] if records else em.get("engine_time_s", 0.0)
    generated = sum(len(r["sampled"]) for r in records)
    processed = sum(s["num_tokens"] for r in records for s in r["scheduled"])
    ttfts = [r["time_to_first_token"] for r in rows if r["time_to_first_token"] is not None]
    itls = [x for r in rows for x in r["inter_token_latency"]]
    e2es = [r["e2e_request_latency"] for r in rows if r["e2e_request_latency"] is not None]
    hits, queries = em.get("prefix_cache_hits", 0), em.get("prefix_cache_queries", 0)
    summary = {
        "clock": "engine",
        "num_steps": len(records),
        "engine_time_s": engine_time,
        "num_requests": len(rows),
        "num_waiting": len(queues["waiting"]),
        "num_running": len(queues["running"]),
        "num_finished": len(queues["finished"]),
        "num_generated_tokens": generated,
        "num_processed_tokens": processed,
        "output_throughput_tok_s": generated / engine_time if engine_time > 0 else None,
        "total_throughput_tok_s": processed / engine_time if engine_time > 0 else None,
        "mean_ttft_s": _mean(ttfts), "median_ttft_s": _median(ttfts),
        "mean_itl_s": _mean(itls), "median_itl_s": _median(itls),
        "mean_e2e_s": _mean(e2es),
        "kv_cache_usage": em.get("kv_cache_usage"),
        "prefix_cache_hits": hits, "prefix_cache_queries": queries,
        "prefix_cache_hit_rate": hits / queries if queries else None,
        "num_preemptions": em.get("num_preemptions", 0),
    }
    return {"requests": rows, "summary": summary}
