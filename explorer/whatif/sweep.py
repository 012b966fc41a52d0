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

import html
import itertools
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeAlias, TypedDict, cast

import numpy as np

from ..core.recording import Recording, Settings
from .replay import ReplayError, ReplayResult, load_vllm, replay
from .rows import LATENCIES, LatenciesDict, ReplayFiguresDict, SweepRowDict
from .settings import (
    KNOBS,
    MEMORY_KNOBS,
    Knob,
    SettingRejected,
    SettingValue,
    Variant,
    kv_bytes_per_token,
    label_of,
    value_text,
    variant,
)
from .step_model import StepTimeModel, fit
from .target import SEARCH_KNOBS, Answer, Condition, parse_target
from .target import search as find_cheapest

if TYPE_CHECKING:
    from multiprocessing.pool import Pool

    import pandas as pd
    import plotly.graph_objects as go

_COLUMN_ORDER: tuple[Knob, ...] = ("block_size", "num_blocks", "max_num_batched_tokens", "max_num_seqs")
_COLUMN_NAMES = {"block_size": "block", "num_blocks": "blocks", "max_num_batched_tokens": "budget",
                 "max_num_seqs": "max seqs", "enable_prefix_caching": "prefix cache",
                 "enable_chunked_prefill": "chunked", "long_prefill_token_threshold": "long prefill"}
SERIES_POINTS = 2000   # per-step series kept per setting (evenly thinned above this)
METRICS = ("steps", "hit_tokens", "hit_rate", "preemptions", "recomputed_tokens", "max_waiting", "mean_waiting",
           "max_kv_usage", "mean_kv_usage", "ttft_p50", "ttft_p90", "itl_p50", "itl_p90", "e2e_p50", "e2e_p90")
KnobValues: TypeAlias = SettingValue | list[SettingValue] | tuple[SettingValue, ...]   # a value, or those to try


# What a sweep reports after each replay: (replays done, of how many in the grid, the replay's row).
Progress: TypeAlias = Callable[[int, int | None, SweepRowDict], None]


def grid(**lists: KnobValues) -> list[dict[str, SettingValue]]:
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
              finished: dict[str, float | None]) -> LatenciesDict:
    """TTFT, ITL (every gap between a request's tokens) and end-to-end latency, p50 / p90."""
    ttft = [t - arrival[r] for r in arrival if (t := first.get(r)) is not None]
    itl = [b - a for r in arrival for a, b in zip(tokens.get(r, ()), tokens.get(r, ())[1:])]
    e2e = [t - arrival[r] for r in arrival if (t := finished.get(r)) is not None]
    (ttft50, ttft90), (itl50, itl90), (e2e50, e2e90) = _percentiles(ttft), _percentiles(itl), _percentiles(e2e)
    return {"ttft_p50": ttft50, "ttft_p90": ttft90, "itl_p50": itl50, "itl_p90": itl90, "e2e_p50": e2e50,
            "e2e_p90": e2e90}


def recorded_latencies(rec: Recording) -> LatenciesDict:
    """What the recording measured (requests that ended by themselves), on its clock."""
    done = [r for r in rec.requests if r.ends_by_itself]
    return latencies({r.request_id: r.arrival_time for r in done},
                     {r.request_id: r.first_token_time for r in done},
                     {r.request_id: r.token_times for r in done},
                     {r.request_id: r.finished_time for r in done})


def summarize(res: ReplayResult, rec: Recording) -> ReplayFiguresDict:
    """One replay's figures (METRICS, the per-step series thinned, the replay's own speed)."""
    done = {r.request_id for r in rec.requests if r.ends_by_itself}
    reqs = res.requests
    out: ReplayFiguresDict = {
        "steps": res.num_steps, "hit_tokens": res.hit_tokens, "query_tokens": res.query_tokens,
        "resumed_hit_tokens": res.resumed_hit_tokens,
        "hit_rate": res.hit_rate, "preemptions": res.preemptions, "recomputed_tokens": res.recomputed_tokens,
        "max_waiting": max(res.num_waiting, default=0),
        "mean_waiting": float(np.mean(res.num_waiting)) if res.steps else 0,
        "max_kv_usage": max(res.kv_usage, default=0.0),
        "mean_kv_usage": float(np.mean(res.kv_usage)) if res.steps else 0,
        "replay_seconds": res.seconds, "scheduler_seconds": res.scheduler_seconds, "vllm_log": res.vllm_log}
    if res.arrivals == "timed":
        arrival = {r: cast(float, reqs[r].arrival) for r in done}  # the replay sets every request's arrival
        out.update(latencies(arrival, {r: reqs[r].first_token_time for r in done},
                             {r: reqs[r].token_times for r in done}, {r: reqs[r].finished_time for r in done}))
        out["duration"] = res.times[-1] if res.times else 0.0
    else:
        out.update({"ttft_p50": None, "ttft_p90": None, "itl_p50": None, "itl_p90": None, "e2e_p50": None,
                    "e2e_p90": None})
    stride = max(1, -(-res.num_steps // SERIES_POINTS))
    out["series"] = {"step": res.steps[::stride], "time": res.times[::stride], "num_waiting": res.num_waiting[::stride],
                     "num_running": res.num_running[::stride], "kv_usage": res.kv_usage[::stride],
                     "scheduled_tokens": res.scheduled_tokens[::stride]}
    return out


# -- one setting, in a worker ----------------------------------------------------------------------
class _WorkerDict(TypedDict, total=False):
    """What a worker replays every setting of (set by `_init`)."""
    rec: Recording
    model: StepTimeModel | None
    arrivals: str


_WORKER: _WorkerDict = {}


def _init(rec: Recording, model: StepTimeModel | None, arrivals: str) -> None:
    _WORKER.update({"rec": rec, "model": model, "arrivals": arrivals})


def run_one(job: tuple[int, Variant]) -> SweepRowDict:
    """Replay the worker's recording at one checked setting."""
    index, v = job
    rec, model, arrivals = _WORKER["rec"], _WORKER["model"], _WORKER["arrivals"]
    per_token = kv_bytes_per_token(rec)
    tokens = v.settings.num_blocks * v.settings.block_size
    row: SweepRowDict = {"index": index, "changes": dict(v.changed), "label": v.label,
                         "settings": v.settings.to_dict(), "kv_tokens": tokens,
                         "kv_bytes": None if per_token is None else int(tokens * per_token)}
    try:
        res = replay(rec, v, arrivals=arrivals, step_model=model)
        row.update({"status": "ok", **summarize(res, rec)})
    except (SettingRejected, ReplayError) as exc:
        row.update({"status": "rejected" if isinstance(exc, SettingRejected) else "failed", "error": str(exc)})
    return row


class _Replays:
    """The replays of one sweep: in this process, or in forked workers kept open across the
    search's rounds."""

    def __init__(self, rec: Recording, model: StepTimeModel | None, arrivals: str, processes: int,
                 report: Callable[[int, SweepRowDict], None]) -> None:
        self.report, self.done = report, 0
        self.pool: Pool | None = None
        if processes == 1:
            _init(rec, model, arrivals)
            return
        fork = sys.platform.startswith("linux")
        if fork:
            load_vllm()  # imported once here, shared by the forked workers
        ctx = multiprocessing.get_context("fork" if fork else "spawn")
        self.pool = ctx.Pool(processes, initializer=_init, initargs=(rec, model, arrivals))

    def run(self, runs: list[tuple[int, Variant]]) -> list[SweepRowDict]:
        rows = []
        for row in self.pool.imap_unordered(run_one, runs) if self.pool is not None else map(run_one, runs):
            rows.append(row)
            self.done += 1
            self.report(self.done, row)
        return rows

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool.join()


def plan(rec: Recording, jobs: list[dict[str, SettingValue]]) -> tuple[list[tuple[int, Variant]], list[SweepRowDict]]:
    """Each job checked as vLLM would check it: (the distinct variants to run, the refused
    ones' rows). A job that lands on settings already planned is run once."""
    runs: list[tuple[int, Variant]] = []
    refused: list[SweepRowDict] = []
    seen: set[Settings] = set()
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

    rows: list[SweepRowDict]
    recording: Recording
    step_model: StepTimeModel | None
    arrivals: str
    recorded: LatenciesDict = field(default_factory=LatenciesDict)   # what the recording measured
    seconds: float = 0.0
    processes: int = 1
    answer: Answer | None = None    # with a target: the cheapest setting that meets it

    @property
    def ok_rows(self) -> list[SweepRowDict]:
        return [r for r in self.rows if r.get("status") == "ok"]

    def scheduler_steps_per_s(self) -> tuple[float | None, float | None]:
        """(vLLM's scheduler alone, the whole replay) in steps per second of one process."""
        rows = self.ok_rows
        steps = sum(r["steps"] for r in rows)
        sched = sum(r["scheduler_seconds"] for r in rows)
        whole = sum(r["replay_seconds"] for r in rows)
        return (steps / sched if sched else None), (steps / whole if whole else None)

    def table(self) -> str:
        """The sweep as a plain-text table (what the CLI prints): every row's full settings (the
        four that size and pace a run, and any other the sweep varies) and its KV memory; the
        refused settings after it, one line per reason; the answer when a target was searched."""
        timed = self.arrivals == "timed"
        knobs = self.setting_columns()
        head = ["", *(_COLUMN_NAMES.get(k, k) for k in knobs), "KV memory", "steps", "hit tokens", "hit rate",
                "preempt", "recomputed", "max queue", "max KV"]
        latency = LATENCIES
        if timed:
            head += ["TTFT p50", "TTFT p90", "ITL p50", "ITL p90", "E2E p50", "E2E p90"]
        rows = [head]
        if timed and self.recorded:
            rows.append(["measured", *[""] * (len(knobs) + 8), *(_ms(self.recorded.get(k)) for k in latency)])
        per_token = kv_bytes_per_token(self.recording)
        best = self.answer.best if self.answer is not None else None
        for r in self.rows:
            if "steps" not in r:
                continue
            mark = ("answer" if best is not None and r is best.best else "as recorded" if not r["changes"]
                    else "searched" if r.get("searched") else "")
            line = [mark, *(value_text(r["settings"][k]) for k in knobs), _memory(r["kv_tokens"], per_token)]
            line += [str(r["steps"]), str(r["hit_tokens"]), _pct(r["hit_rate"]), str(r["preemptions"]),
                     str(r["recomputed_tokens"]), str(r["max_waiting"]), _pct(r["max_kv_usage"])]
            if timed:
                line += [_ms(r[k]) for k in latency]
            rows.append(line)
        widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
        lines = ["  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(row))
                 for row in rows]
        for (status, reason), labels in self.refusals().items():
            lines.append(f"{status} ({'; '.join(labels)}): {reason}")
        notes = [self.recording.summary()]
        if self.answer is not None:
            notes.insert(0, self.answer.sentence)
        if self.step_model is not None and timed:
            notes.append("predicted TTFT / ITL / E2E (seconds): " + self.step_model.error_text())
        alone, whole = self.scheduler_steps_per_s()
        if alone:
            notes.append(f"vLLM's scheduler alone: {alone:,.0f} steps/s; the replay with kvscope's bookkeeping: "
                         f"{whole:,.0f} steps/s (one process); {len(self.rows)} settings in {self.seconds:.1f} s on "
                         f"{self.processes} process(es)")
        said = self.vllm_log()
        if said:
            notes.append(f"vLLM's log as it built the replays' schedulers ({len(said)} distinct line"
                         f"{'s' if len(said) != 1 else ''}): " + " \u00b7 ".join(said))
        notes += [f"note: {n}" for n in self.recording.source.notes]
        return "\n".join([*lines, "", *notes])

    def vllm_log(self) -> list[str]:
        """The distinct lines vLLM logged while it built the replays' schedulers (kept, not printed
        once per replay)."""
        return list(dict.fromkeys(line for r in self.rows for line in r.get("vllm_log", ())))

    def setting_columns(self) -> list[Knob]:
        """The settings every row names: block size, pool, budget and max_num_seqs, and any other
        knob that differs between the rows."""
        varied = [k for k in KNOBS if k not in _COLUMN_ORDER and
                  len({str(r["settings"][k]) for r in self.rows if "settings" in r}) > 1]
        return [*_COLUMN_ORDER, *varied]

    def refusals(self) -> dict[tuple[str, str], list[str]]:
        """Each (status, reason) a setting did not run for ('rejected': vLLM would refuse it;
        'failed': the replay could not end), with the settings it turned away."""
        out: dict[tuple[str, str], list[str]] = {}
        for r in self.rows:
            if r.get("status") != "ok":
                out.setdefault((str(r.get("status")), str(r.get("error"))), []).append(r["label"])
        return out

    def to_frame(self) -> pd.DataFrame:
        """The rows as a pandas DataFrame (one row per setting: every setting, its KV memory,
        whether the target search replayed it, the metrics)."""
        import pandas as pd

        flat = []
        columns: list[str] = list(self.setting_columns())   # str keys: the frame's columns, beside the others
        for r in self.rows:
            s = r.get("settings")
            flat.append({"setting": r["label"],
                         **{k: r["changes"].get(k) if s is None else s.get(k, r["changes"].get(k)) for k in columns},
                         "kv_tokens": r.get("kv_tokens"), "kv_bytes": r.get("kv_bytes"),
                         "searched": bool(r.get("searched")), "status": r.get("status"), "error": r.get("error"),
                         **{k: r.get(k) for k in METRICS}})
        return pd.DataFrame(flat)

    def charts(self) -> dict[str, go.Figure]:
        """plotly figures: prefix-hit rate against pool size, TTFT p90 against the token budget,
        and preemptions per setting."""
        from .charts import sweep_charts

        return sweep_charts(self)

    def findings(self) -> list[str]:
        """What the figures show, in sentences read from the rows (explorer.whatif.charts.findings)."""
        from .charts import findings

        return findings(self)

    def _repr_html_(self) -> str:
        return f"<pre>{html.escape(self.table())}</pre>"


def _ms(x: float | None) -> str:
    return "-" if x is None else (f"{x * 1e3:.0f}ms" if x < 1 else f"{x:.2f}s")


def _memory(tokens: int, per_token: float | None) -> str:
    return f"{tokens:,} tok" if per_token is None else f"{tokens * per_token / 2**20:,.1f} MiB"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def sweep(rec: Recording, *, arrivals: str = "timed", step_model: StepTimeModel | None = None,
          processes: int | None = None, progress: bool | Progress = True, include_recorded: bool = True,
          target: str | Mapping[str, tuple[str, float]] | tuple[Condition, ...] | list[Condition] | None = None,
          search: str = "num_blocks", search_range: tuple[int, int] | None = None,
          **settings: KnobValues) -> SweepResult:
    """Replay `rec` at every combination of `settings` (what-if knobs: explorer.whatif.settings
    KNOBS and MEMORY_KNOBS, each a value or a list), `processes` at a time (default: the CPUs).

    With `target` ('ttft_p90<=0.3,preemptions==0', see explorer.whatif.target), it then searches
    along `search` (num_blocks or max_num_batched_tokens; over `search_range`, default from the
    least vLLM accepts to where more changes nothing) at every combination of the other knobs,
    and `result.answer` says the cheapest setting that meets the target."""
    unknown = set(settings) - set(KNOBS) - set(MEMORY_KNOBS)
    if unknown:
        raise ValueError(f"unknown what-if setting(s) {sorted(unknown)}; known: {list(KNOBS + MEMORY_KNOBS)}")
    conditions = parse_target(target) if target is not None else None
    if conditions is not None:
        if search not in SEARCH_KNOBS:
            raise ValueError(f"search must be one of {SEARCH_KNOBS}, got {search!r}")
        sizing = [k for k in MEMORY_KNOBS if settings.get(k) is not None]
        if search == "num_blocks" and sizing:
            raise ValueError(f"search=num_blocks sizes the pool itself: leave out {sizing[0]}")
    t0 = time.perf_counter()
    if arrivals == "timed" and step_model is None:
        step_model = fit(rec)
    jobs = grid(**settings)
    if include_recorded and {} not in jobs:
        jobs.insert(0, {})
    runs, rows = plan(rec, jobs)
    processes = max(1, min(processes or os.cpu_count() or 1, len(runs) or 1))
    replays = _Replays(rec, step_model, arrivals, processes, _progress(progress, len(runs)))
    answer = None
    try:
        rows += replays.run(runs)
        if conditions is not None:
            known = {Settings(**r["settings"]): r for r in rows if "settings" in r}
            combos = grid(**{k: v for k, v in settings.items() if k != search})
            answer = find_cheapest(rec, conditions, search, combos, replays.run, known, span=search_range,
                                   width=processes, first_index=len(jobs))
            rows += [r for r in known.values() if r.get("searched")]
    finally:
        replays.close()
    recorded_first = [r for r in rows if r["index"] == 0 and not r.get("changes")]
    rest = sorted((r for r in rows if r not in recorded_first), key=_order)
    return SweepResult(rows=recorded_first + rest, recording=rec, step_model=step_model, arrivals=arrivals,
                       recorded=recorded_latencies(rec) if rec.requests and rec.requests[0].token_times else {},
                       seconds=time.perf_counter() - t0, processes=processes, answer=answer)


def _order(row: SweepRowDict) -> tuple[SettingValue, ...]:
    """Rows by their settings (the pool last, so that one pool's series reads down the table);
    a refused one by where the grid listed it."""
    s = row.get("settings")
    if s is None:
        return (1, row["index"])
    return (0, *(str(s[k]) if isinstance(s[k], str) else s[k] for k in _COLUMN_ORDER))


def _progress(progress: bool | Progress, total: int) -> Callable[[int, SweepRowDict], None]:
    """What a replay's end reports; past the grid's `total` the search's replays count on."""
    if callable(progress):
        return lambda done, row: progress(done, total, row)
    if not progress:
        return lambda done, row: None
    from engine.progress import NotebookLine, in_notebook

    start = time.perf_counter()
    line = NotebookLine() if in_notebook() else None   # a notebook: one line, not a red stderr box per replay

    def say(done: int, row: SweepRowDict) -> None:
        what = row.get("status", "?")
        of = f"/{total}" if done <= total else " (searching)"
        text = f"[whatif] {done}{of} {row['label']}: {what} ({time.perf_counter() - start:.1f} s)"
        if line is not None:
            line.show(text)
        else:
            print(text, file=sys.stderr, flush=True)

    return say
