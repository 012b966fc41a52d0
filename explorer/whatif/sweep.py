"""A sweep: one recording replayed at every combination of some settings, in parallel processes.

    res = sweep(rec, block_size=[16, 32, 64], num_blocks=[256, 512, 1024], max_num_batched_tokens=[256, 2048])
    print(res.table())        # python -m explorer whatif RECORDING --block-size 16,32,64 ... prints this
    res.to_frame()            # a pandas DataFrame (in a notebook)
    res.charts()              # plotly figures: hit rate against pool size, TTFT p90 against budget, preemptions

Per setting, exactly (vLLM's own scheduler decided them, for these arrivals): prefix-hit tokens
and rate (of requests at their first admission, as vLLM's own prefix-cache metrics count them; a
request re-admitted after a preemption hits its own blocks again, counted apart), preemptions and
the tokens they made vLLM compute again, steps, queue depth and KV usage per step. Predicted
(from the step-time model fitted on the recording, whose held-out error the table prints): TTFT,
ITL and end-to-end latency per request, p50 and p90. The first row replays the recorded settings
with timed arrivals, so its predictions sit beside what the recording measured. A setting vLLM
would refuse gets its one-line reason and the others run.
"""
from __future__ import annotations

import itertools
import multiprocessing
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from ..core.recording import Recording
from .replay import ReplayError, ReplayResult, load_vllm, replay
from .settings import KNOBS, MEMORY_KNOBS, SettingRejected, Variant, label_of, variant
from .step_model import StepTimeModel, fit

SERIES_POINTS = 2000   # per-step series kept per setting (evenly thinned above this)
METRICS = ("steps", "hit_tokens", "hit_rate", "preemptions", "recomputed_tokens", "max_waiting", "mean_waiting",
           "max_kv_usage", "mean_kv_usage", "ttft_p50", "ttft_p90", "itl_p50", "itl_p90", "e2e_p50", "e2e_p90")


def grid(**lists: Any) -> list[dict]:
    """Every combination of the given settings (each a value or a list of values)."""
    names = [k for k, v in lists.items() if v is not None]
    values = [v if isinstance(v, (list, tuple)) else [v] for v in (lists[k] for k in names)]
    return [dict(zip(names, combo)) for combo in itertools.product(*values)]


def _percentiles(xs: list[float]) -> tuple[float | None, float | None]:
    if not xs:
        return None, None
    a = np.asarray(xs, dtype=float)
    return float(np.percentile(a, 50)), float(np.percentile(a, 90))


def latencies(arrival: dict[str, float], first: dict[str, float | None], tokens: dict[str, list[float]],
              finished: dict[str, float | None]) -> dict:
    """TTFT, ITL (every gap between a request's tokens) and end-to-end latency, p50 / p90."""
    ttft = [t - arrival[r] for r in arrival if (t := first.get(r)) is not None]
    itl = [b - a for r in arrival for a, b in zip(tokens.get(r, ()), tokens.get(r, ())[1:])]
    e2e = [t - arrival[r] for r in arrival if (t := finished.get(r)) is not None]
    out = {}
    for name, xs in (("ttft", ttft), ("itl", itl), ("e2e", e2e)):
        out[f"{name}_p50"], out[f"{name}_p90"] = _percentiles(xs)
    return out


def recorded_latencies(rec: Recording) -> dict:
    """What the recording measured (requests that ended by themselves), on its clock."""
    done = [r for r in rec.requests if r.ends_by_itself]
    return latencies({r.request_id: r.arrival_time for r in done},
                     {r.request_id: r.first_token_time for r in done},
                     {r.request_id: r.token_times for r in done},
                     {r.request_id: r.finished_time for r in done})


def summarize(res: ReplayResult, rec: Recording) -> dict:
    """One replay's figures (METRICS, the per-step series thinned, the replay's own speed)."""
    done = {r.request_id for r in rec.requests if r.ends_by_itself}
    reqs = res.requests
    out: dict[str, Any] = {
        "steps": res.num_steps, "hit_tokens": res.hit_tokens, "query_tokens": res.query_tokens,
        "resumed_hit_tokens": res.resumed_hit_tokens,
        "hit_rate": res.hit_rate, "preemptions": res.preemptions, "recomputed_tokens": res.recomputed_tokens,
        "max_waiting": max(res.num_waiting, default=0),
        "mean_waiting": float(np.mean(res.num_waiting)) if res.steps else 0,
        "max_kv_usage": max(res.kv_usage, default=0.0),
        "mean_kv_usage": float(np.mean(res.kv_usage)) if res.steps else 0,
        "replay_seconds": res.seconds, "scheduler_seconds": res.scheduler_seconds}
    if res.arrivals == "timed":
        arrival = {r: cast(float, reqs[r].arrival) for r in done}  # the replay sets every request's arrival
        out.update(latencies(arrival, {r: reqs[r].first_token_time for r in done},
                             {r: reqs[r].token_times for r in done}, {r: reqs[r].finished_time for r in done}))
        out["duration"] = res.times[-1] if res.times else 0.0
    else:
        out.update(dict.fromkeys(("ttft_p50", "ttft_p90", "itl_p50", "itl_p90", "e2e_p50", "e2e_p90")))
    stride = max(1, -(-res.num_steps // SERIES_POINTS))
    out["series"] = {"step": res.steps[::stride], "time": res.times[::stride], "num_waiting": res.num_waiting[::stride],
                     "num_running": res.num_running[::stride], "kv_usage": res.kv_usage[::stride],
                     "scheduled_tokens": res.scheduled_tokens[::stride]}
    return out


# -- one setting, in a worker ----------------------------------------------------------------------
_WORKER: dict[str, Any] = {}


def _init(rec: Recording, model: StepTimeModel | None, arrivals: str) -> None:
    _WORKER.update(rec=rec, model=model, arrivals=arrivals)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")


def run_one(job: tuple[int, Variant]) -> dict:
    """Replay the worker's recording at one checked setting."""
    index, v = job
    rec, model, arrivals = _WORKER["rec"], _WORKER["model"], _WORKER["arrivals"]
    row: dict[str, Any] = {"index": index, "changes": dict(v.changed), "label": v.label,
                           "settings": v.settings.to_dict()}
    try:
        res = replay(rec, v, arrivals=arrivals, step_model=model)
        row.update(status="ok", **summarize(res, rec))
    except (SettingRejected, ReplayError) as exc:
        row.update(status="rejected" if isinstance(exc, SettingRejected) else "failed", error=str(exc))
    return row


def plan(rec: Recording, jobs: list[dict]) -> tuple[list[tuple[int, Variant]], list[dict]]:
    """Each job checked as vLLM would check it: (the distinct variants to run, the refused
    ones' rows). A job that lands on settings already planned is run once."""
    runs: list[tuple[int, Variant]] = []
    refused: list[dict] = []
    seen: set = set()
    for index, changes in enumerate(jobs):
        try:
            v = variant(rec, **changes)
        except SettingRejected as exc:
            refused.append({"index": index, "changes": changes, "label": label_of(changes), "status": "rejected",
                            "error": str(exc)})
            continue
        if v.settings not in seen:
            seen.add(v.settings)
            runs.append((index, v))
    return runs, refused


# -- the sweep -------------------------------------------------------------------------------------
@dataclass
class SweepResult:
    """One row per variant of a what-if sweep (its metrics, or why it failed), with the recording's
    own figures to compare against."""

    rows: list[dict]
    recording: Recording
    step_model: StepTimeModel | None
    arrivals: str
    recorded: dict = field(default_factory=dict)
    seconds: float = 0.0
    processes: int = 1

    @property
    def ok_rows(self) -> list[dict]:
        return [r for r in self.rows if r.get("status") == "ok"]

    def scheduler_steps_per_s(self) -> tuple[float | None, float | None]:
        """(vLLM's scheduler alone, the whole replay) in steps per second of one process."""
        rows = self.ok_rows
        steps = sum(r["steps"] for r in rows)
        sched = sum(r["scheduler_seconds"] for r in rows)
        whole = sum(r["replay_seconds"] for r in rows)
        return (steps / sched if sched else None), (steps / whole if whole else None)

    def table(self) -> str:
        """The sweep as a plain-text table (what the CLI prints)."""
        timed = self.arrivals == "timed"
        head = ["setting", "steps", "hit tokens", "hit rate", "preempt", "recomputed", "max queue", "max KV"]
        if timed:
            head += ["TTFT p50", "TTFT p90", "ITL p50", "ITL p90", "E2E p50", "E2E p90"]
        rows = [head]
        if timed and self.recorded:
            rows.append(["measured in the recording"] + [""] * 7 + [_ms(self.recorded.get(k)) for k in
                        ("ttft_p50", "ttft_p90", "itl_p50", "itl_p90", "e2e_p50", "e2e_p90")])
        for r in self.rows:
            if r.get("status") != "ok":
                rows.append([r["label"], f"{r.get('status')}: {r.get('error')}"])
                continue
            line = [r["label"], str(r["steps"]), str(r["hit_tokens"]), _pct(r["hit_rate"]), str(r["preemptions"]),
                    str(r["recomputed_tokens"]), str(r["max_waiting"]), _pct(r["max_kv_usage"])]
            if timed:
                line += [_ms(r[k]) for k in ("ttft_p50", "ttft_p90", "itl_p50", "itl_p90", "e2e_p50", "e2e_p90")]
            rows.append(line)
        widths = [max(len(row[i]) for row in rows if len(row) > i and len(row) == len(head)) for i in range(len(head))]
        lines = []
        for row in rows:
            if len(row) != len(head):   # a refused setting: its reason on one line
                lines.append(f"{row[0]:<{widths[0]}}  {row[1]}")
            else:
                lines.append("  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(row)))
        notes = [self.recording.summary()]
        if self.step_model is not None and timed:
            notes.append("predicted TTFT / ITL / E2E (seconds): " + self.step_model.error_text())
        alone, whole = self.scheduler_steps_per_s()
        if alone:
            notes.append(f"vLLM's scheduler alone: {alone:,.0f} steps/s; the replay with kvscope's bookkeeping: "
                         f"{whole:,.0f} steps/s (one process); {len(self.rows)} settings in {self.seconds:.1f} s on "
                         f"{self.processes} process(es)")
        notes += [f"note: {n}" for n in self.recording.source.notes]
        return "\n".join([*lines, "", *notes])

    def to_frame(self) -> Any:
        """The rows as a pandas DataFrame (one row per setting, the settings that changed as columns)."""
        import pandas as pd

        flat = []
        for r in self.rows:
            flat.append({"setting": r["label"], **r.get("changes", {}), "status": r.get("status"),
                         "error": r.get("error"), **{k: r.get(k) for k in METRICS}})
        return pd.DataFrame(flat)

    def charts(self) -> dict[str, Any]:
        """plotly figures: prefix-hit rate against pool size, TTFT p90 against the token budget,
        and preemptions per setting."""
        from .charts import sweep_charts

        return sweep_charts(self)

    def _repr_html_(self) -> str:
        import html

        return f"<pre>{html.escape(self.table())}</pre>"


def _ms(x: float | None) -> str:
    return "-" if x is None else (f"{x * 1e3:.0f}ms" if x < 1 else f"{x:.2f}s")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def sweep(rec: Recording, *, arrivals: str = "timed", step_model: StepTimeModel | None = None,
          processes: int | None = None, progress: bool | Callable[[int, int, dict], None] = True,
          include_recorded: bool = True, **settings: Any) -> SweepResult:
    """Replay `rec` at every combination of `settings` (what-if knobs: explorer.whatif.settings
    KNOBS and MEMORY_KNOBS, each a value or a list), `processes` at a time (default: the CPUs)."""
    unknown = set(settings) - set(KNOBS) - set(MEMORY_KNOBS)
    if unknown:
        raise ValueError(f"unknown what-if setting(s) {sorted(unknown)}; known: {list(KNOBS + MEMORY_KNOBS)}")
    t0 = time.perf_counter()
    if arrivals == "timed" and step_model is None:
        step_model = fit(rec)
    jobs = grid(**settings)
    if include_recorded and {} not in jobs:
        jobs.insert(0, {})
    runs, rows = plan(rec, jobs)
    processes = max(1, min(processes or os.cpu_count() or 1, len(runs) or 1))
    report = _progress(progress, len(runs))
    done = 0
    if processes == 1:
        _init(rec, step_model, arrivals)
        for job in runs:
            rows.append(run_one(job))
            done += 1
            report(done, rows[-1])
    else:
        fork = sys.platform.startswith("linux")
        if fork:
            load_vllm()  # imported once here, shared by the forked workers
        ctx = multiprocessing.get_context("fork" if fork else "spawn")
        with ctx.Pool(processes, initializer=_init, initargs=(rec, step_model, arrivals)) as pool:
            for row in pool.imap_unordered(run_one, runs):
                rows.append(row)
                done += 1
                report(done, row)
    rows.sort(key=lambda r: r["index"])
    return SweepResult(rows=rows, recording=rec, step_model=step_model, arrivals=arrivals,
                       recorded=recorded_latencies(rec) if rec.requests and rec.requests[0].token_times else {},
                       seconds=time.perf_counter() - t0, processes=processes)


def _progress(progress: Any, total: int) -> Callable[[int, dict], None]:
    if callable(progress):
        return lambda done, row: progress(done, total, row)
    if not progress:
        return lambda done, row: None
    start = time.perf_counter()

    def say(done: int, row: dict) -> None:
        what = row.get("status", "?")
        print(f"[whatif] {done}/{total} {row['label']}: {what} ({time.perf_counter() - start:.1f} s)",
              file=sys.stderr, flush=True)

    return say
