"""`python -m benchmarks bench-ui`: how quickly the explorer follows one engine step at scale.

Issue: responsiveness, measured by a benchmark (never by a timed test), at 64 running
requests and 4,096 KV blocks. Two parts:

1. Python side. A Session with every request decoding and a Dashboard bound to it; for
   each of N steps, the time goes into
     engine step     the StepRecord's own timings_ms["total"] (and engine.step()'s wall time)
     history         the Session's bookkeeping: snapshot + to_dict of record and snapshot
     view update     SessionBinder.render(): explorer.ui.views, the attention probe, and the
                     widgets' traitlet sync (get_state, buffers, the JSON a kernel would pack)
   and the bytes every widget message would carry to the browser.
2. Browser side (benchmarks/ui_page.py, needs playwright and Debian's
   chromium): JupyterLab runs a scratch notebook with the same Session and a Dashboard;
   Step is clicked N times and the page itself times click -> queues, block pool and slot
   mapping showing the new step, next to the kernel's own split of the same step.

The machine is shared and noisy: only medians and spreads are printed, nothing is judged.
Timing hooks are instance attributes on the objects measured (the engine, the binder, the
session) plus ipywidgets' `Widget._send` while the profiler is open; all are put back.
"""
from __future__ import annotations

import json
import math
import random
import statistics
from collections.abc import Callable, Iterable
from pathlib import Path
from time import perf_counter
from typing import Any

from explorer.core import session as session_module

from .ui_common import WATCHED_PANELS, BenchUnavailable  # noqa: F401 (BenchUnavailable: raised by both parts)

DEFAULT_REQUESTS = 64
DEFAULT_BLOCKS = 4096
DEFAULT_STEPS = 10
PROMPT_LEN = (64, 448)   # prompt lengths drawn uniformly from this range (mean 256 tokens)

# The panels whose new step the browser waits for (their root's data-testid).

# explorer.ui.views functions SessionBinder.render calls (looked up on the module at call time).
VIEW_FUNCS = ("summary_line", "queues_state", "block_pool_state", "slot_mapping_state", "sampler_state",
              "timeline_state", "latency_rows", "probe_targets")


# -- the workload -----------------------------------------------------------------------------
def make_prompts(n: int, vocab_size: int, prompt_len: tuple[int, int] = PROMPT_LEN, seed: int = 0) -> list[list[int]]:
    """`n` deterministic token-id prompts of ordinary vocabulary ids (no special tokens)."""
    rng = random.Random(seed)
    hi = max(101, min(vocab_size, 40_000))
    return [[rng.randrange(100, hi) for _ in range(rng.randint(*prompt_len))] for _ in range(n)]


def all_decoding(snapshot: dict, num_requests: int) -> bool:
    """True when `num_requests` requests run and every one has its prompt computed."""
    running = (snapshot.get("queues") or {}).get("running", [])
    return len(running) == num_requests and all(
        r["num_computed_tokens"] >= len(r["prompt_token_ids"]) for r in running)


def prepare_session(model: str | None = None, *, num_requests: int = DEFAULT_REQUESTS,
                    num_kv_blocks: int = DEFAULT_BLOCKS, block_size: int = 16, steps: int = DEFAULT_STEPS,
                    prompt_len: tuple[int, int] = PROMPT_LEN, seed: int = 0,
                    progress: Callable[[str], None] | None = None, **config: Any):
    """A Session with `num_requests` greedy requests, stepped until all of them decode.

    Each request may generate enough tokens (ignore_eos) that none finishes within the
    warm-up, `steps` measured steps and some spare, so every measured step is a pure
    decode of `num_requests` sequences. ValueError if the pool cannot hold them all.
    `progress` gets one line per warm-up step (the default model's prefill takes minutes).
    """
    from explorer.core.session import Session

    config.setdefault("max_num_seqs", max(256, num_requests))
    session = Session(model, num_kv_blocks=num_kv_blocks, block_size=block_size, **config)
    cfg = session.config
    prompts = make_prompts(num_requests, int(session.engine.model_info["vocab_size"]), prompt_len, seed)
    warmup = math.ceil(sum(map(len, prompts)) / cfg.max_num_batched_tokens) + 2
    max_tokens = warmup + steps + 16
    longest = max(map(len, prompts)) + max_tokens
    if longest > cfg.max_model_len:
        raise ValueError(f"a prompt of {longest - max_tokens} tokens + {max_tokens} new ones exceeds "
                         f"max_model_len {cfg.max_model_len}: use fewer steps or shorter prompts")
    need = sum(math.ceil((len(p) + max_tokens) / block_size) for p in prompts)
    if need > num_kv_blocks - 1:
        raise ValueError(f"num_kv_blocks: {num_requests} requests need up to {need} blocks of {block_size} "
                         f"tokens, the pool has {num_kv_blocks - 1} usable; raise --blocks or lower --requests")
    for p in prompts:
        session.add_request(p, temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for _ in range(4 * warmup):
        if all_decoding(session.current.snapshot, num_requests):
            return session
        session.step(1)
        if progress is not None:
            q = session.current.snapshot["queues"]
            left = sum(max(0, len(r["prompt_token_ids"]) - r["num_computed_tokens"])
                       for r in q["waiting"] + q["running"])
            progress(f"  warm-up step {session.current.step}: {len(q['running'])}/{num_requests} running, "
                     f"{left} prompt tokens still to prefill")
    raise RuntimeError(f"not all {num_requests} requests were decoding after {4 * warmup} warm-up steps "
                       f"({session!r})")


# -- timing hooks -----------------------------------------------------------------------------
class _Patches:
    """Attributes replaced for the measurement, put back by `restore()` (last first)."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []

    def instance(self, obj: Any, name: str, wrap: Callable[[Callable], Callable]) -> None:
        had = name in vars(obj)
        old = vars(obj).get(name)
        setattr(obj, name, wrap(getattr(obj, name)))
        self._undo.append(lambda: setattr(obj, name, old) if had else delattr(obj, name))

    def attribute(self, owner: Any, name: str, wrap: Callable[[Callable], Callable]) -> None:
        old = getattr(owner, name)
        setattr(owner, name, wrap(old))
        self._undo.append(lambda: setattr(owner, name, old))

    def restore(self) -> None:
        while self._undo:
            self._undo.pop()()


def _timing(f: Callable, record_ms: Callable[[float], None]) -> Callable:
    """`f`, handing how long each call took (ms) to `record_ms`, a call that raised too."""
    def timed(*args, **kwargs):
        t0 = perf_counter()
        try:
            return f(*args, **kwargs)
        finally:
            record_ms((perf_counter() - t0) * 1e3)
    return timed


class StepTimer:
    """Splits each Session step into engine, history and view phases (milliseconds).

    `StepTimer(session)` wraps the engine's `step` and `snapshot`; `watch(binder)` wraps a
    SessionBinder's `render`. One dict per step lands in `steps`:
      engine_ms       the StepRecord's timings_ms["total"] (the engine's own figure)
      engine_wall_ms  engine.step() as the Session called it
      history_ms      engine.step() returning -> the view starting: the Session's
                      to_dict() of record and snapshot and its HistoryEntry
      snapshot_ms     of which the snapshot after the step (explorer.core.session's
                      apply of the record's changes: only what the step changed)
      view_ms         SessionBinder.render() after the step, every panel
    `before_view` / `after_view` hooks get the step's dict; `log_path` appends it as a
    JSON line (the browser benchmark reads the kernel's file).
    """

    def __init__(self, session: Any, *, log_path: str | Path | None = None) -> None:
        self.session = session
        self.steps: list[dict] = []
        self.before_view: list[Callable[[dict], None]] = []
        self.after_view: list[Callable[[dict], None]] = []
        self.log_path = Path(log_path) if log_path else None
        self._cur: dict | None = None
        self._patches = _Patches()
        self._patches.instance(session.engine, "step", self._wrap_step)
        # The Session builds each step's snapshot from the step's changes, not with engine.snapshot().
        self._patches.attribute(session_module, "apply", self._wrap_snapshot)

    def watch(self, binder: Any) -> StepTimer:
        """Time `binder.render` after each step (the Dashboard's view update)."""
        self._patches.instance(binder, "render", self._wrap_render)
        return self

    def close(self) -> None:
        self._flush()
        self._patches.restore()

    def _wrap_step(self, step: Callable) -> Callable:
        def timed_step():
            self._flush()
            t0 = perf_counter()
            rec = step()
            t1 = perf_counter()
            sched = rec.scheduled
            self._cur = {"step": rec.step, "engine_ms": float(rec.timings_ms.get("total") or 0.0),
                         "engine_wall_ms": (t1 - t0) * 1e3, "snapshot_ms": 0.0,
                         "num_scheduled": len(sched), "num_decode": sum(not s["is_prefill"] for s in sched),
                         "num_batched_tokens": sum(s["num_tokens"] for s in sched),
                         "num_preempted": len(rec.preempted), "_engine_end": t1}
            return rec
        return timed_step

    def _wrap_snapshot(self, snapshot: Callable) -> Callable:
        def add_to_step(ms: float) -> None:
            cur = self._cur
            if cur is not None and "_engine_end" in cur:  # the Session's bookkeeping of a step
                cur["snapshot_ms"] += ms
        return _timing(snapshot, add_to_step)

    def _wrap_render(self, render: Callable) -> Callable:
        def timed_render(*args, **kwargs):
            cur = self._cur
            if cur is None or "_engine_end" not in cur:  # not right after a step: an add, a scrub, ...
                return render(*args, **kwargs)
            t0 = perf_counter()
            cur["history_ms"] = (t0 - cur.pop("_engine_end")) * 1e3
            for hook in self.before_view:
                hook(cur)
            try:
                return render(*args, **kwargs)
            finally:
                cur["view_ms"] = (perf_counter() - t0) * 1e3
                for hook in self.after_view:
                    hook(cur)
                self._flush()
        return timed_render

    def _flush(self) -> None:
        cur, self._cur = self._cur, None
        if cur is None:
            return
        if "_engine_end" in cur:  # no view followed (nothing watched): history ran to now
            cur["history_ms"] = (perf_counter() - cur.pop("_engine_end")) * 1e3
        self.steps.append(cur)
        if self.log_path is not None:
            with open(self.log_path, "a") as f:
                f.write(json.dumps(cur) + "\n")


def _packer() -> Callable[[Any], bytes]:
    """How a kernel turns a comm message into bytes (jupyter_client's json_packer)."""
    try:
        from jupyter_client.session import json_packer
        return json_packer
    except ImportError:  # pragma: no cover - jupyter_client comes with ipykernel
        return lambda obj: json.dumps(obj, ensure_ascii=False, allow_nan=False).encode()


class ViewProfiler:
    """Splits a view update into explorer.ui.views computations, the attention probe and the
    widget sync (the rest: traitlets, get_state, buffers, plotly's figure update), and
    records every widget message: its JSON bytes as a kernel packs them (`pack_ms` is that
    packing, done here because no kernel does it outside Jupyter) and its binary buffers.

    A context manager; `begin()` opens a bucket, `end()` returns it.
    """

    def __init__(self, session: Any) -> None:
        self.session = session
        self._patches = _Patches()
        self._bucket: dict | None = None
        self._pack = _packer()

    def __enter__(self) -> ViewProfiler:
        import ipywidgets

        from explorer.ui import views
        for name in VIEW_FUNCS:
            self._patches.attribute(views, name, lambda f, name=name: self._timed(f, "views", name))
        self._patches.instance(self.session, "probe", lambda f: self._timed(f, "probe", "probe"))
        self._patches.attribute(ipywidgets.Widget, "_send", self._wrap_send)
        return self

    def __exit__(self, *exc: object) -> None:
        self._patches.restore()

    def begin(self) -> None:
        self._bucket = {"views_ms": 0.0, "probe_ms": 0.0, "pack_ms": 0.0, "views": {}, "messages": 0,
                        "json_bytes": 0, "buffer_bytes": 0, "widgets": {}}

    def end(self) -> dict:
        bucket, self._bucket = self._bucket or {}, None
        return bucket

    def _timed(self, f: Callable, kind: str, name: str) -> Callable:
        def add_to_bucket(ms: float) -> None:
            b = self._bucket
            if b is not None:
                b[f"{kind}_ms"] += ms
                b["views"][name] = b["views"].get(name, 0.0) + ms
        return _timing(f, add_to_bucket)

    def _wrap_send(self, send: Callable) -> Callable:
        profiler = self

        def recorded_send(widget, msg, buffers=None):
            b = profiler._bucket
            if b is not None:
                t0 = perf_counter()
                size = len(profiler._pack(msg))
                b["pack_ms"] += (perf_counter() - t0) * 1e3
                nbuf = sum(memoryview(x).nbytes for x in (buffers or []))
                w = b["widgets"].setdefault(type(widget).__name__, {"messages": 0, "json_bytes": 0,
                                                                     "buffer_bytes": 0})
                for d in (b, w):
                    d["messages"] += 1
                    d["json_bytes"] += size
                    d["buffer_bytes"] += nbuf
            return send(widget, msg, buffers)
        return recorded_send


# -- figures ----------------------------------------------------------------------------------
def stats(xs: Iterable[float]) -> dict:
    """median / min / max / n of the finite values (None where there are none)."""
    xs = [float(x) for x in xs if x is not None and math.isfinite(x)]
    if not xs:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def _fmt(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def stats_row(label: str, s: dict, digits: int = 1, width: int = 58) -> str:
    return (f"  {label:<{width}} {_fmt(s['median'], digits):>10} {_fmt(s['min'], digits):>10} "
            f"{_fmt(s['max'], digits):>10}")


def table_head(width: int = 58) -> str:
    return f"  {'':<{width}} {'median':>10} {'min':>10} {'max':>10}"


# -- part 1: Python ---------------------------------------------------------------------------
def bench_python(model: str | None = None, *, num_requests: int = DEFAULT_REQUESTS,
                 num_kv_blocks: int = DEFAULT_BLOCKS, steps: int = DEFAULT_STEPS, block_size: int = 16,
                 prompt_len: tuple[int, int] = PROMPT_LEN, session: Any = None,
                 out: Callable[[str], None] = print) -> dict:
    """Time `steps` Session steps with a Dashboard bound (see the module docstring).

    `session`: one made by `prepare_session` (with at least `steps` steps of room) instead
    of a new one; its `num_requests` running requests are the ones measured."""
    import torch

    from explorer.ui.dashboard import Dashboard

    pack = _packer()
    built = session is None
    if built:
        out(f"bench-ui: {num_requests} requests over {num_kv_blocks} KV blocks; stepping until all decode")
        session = prepare_session(model, num_requests=num_requests, num_kv_blocks=num_kv_blocks,
                                  block_size=block_size, steps=steps, prompt_len=prompt_len, progress=out)
    else:
        num_requests = len(session.current.snapshot["queues"]["running"])
        num_kv_blocks = session.config.num_kv_blocks
    timer = StepTimer(session)
    dash = Dashboard(session)
    timer.watch(dash.binder)
    try:
        with ViewProfiler(session) as prof:
            timer.before_view.append(lambda cur: prof.begin())
            timer.after_view.append(lambda cur: cur.update(prof.end()))
            for _ in range(steps):
                t0 = perf_counter()
                recs = session.step(1)
                total_ms = (perf_counter() - t0) * 1e3
                if not recs:
                    break
                row = timer.steps[-1]
                row["session_step_ms"] = total_ms
                entry = session.current
                row["record_bytes"] = len(pack(entry.record))
                row["snapshot_bytes"] = len(pack(entry.snapshot))
    finally:
        timer.close()
        dash.close_binding()
    info = session.engine.model_info
    cfg = session.config
    rows = timer.steps
    for r in rows:
        r["to_dict_ms"] = r["history_ms"] - r["snapshot_ms"]
        r["sync_ms"] = r["view_ms"] - r["views_ms"] - r["probe_ms"]
    result = {
        "setup": {"model": info.get("name"), "dtype": str(info.get("dtype")), "num_requests": num_requests,
                  "num_kv_blocks": num_kv_blocks, "block_size": cfg.block_size, "steps": len(rows),
                  "threads": torch.get_num_threads(), "prompt_len": list(prompt_len) if built else None,
                  "num_blocks_in_use": num_kv_blocks - 1 - session.current.snapshot["block_pool"]["num_free_blocks"],
                  "all_decode": all(r["num_decode"] == num_requests == r["num_scheduled"] for r in rows)},
        "steps": rows,
        "summary": {k: stats(r.get(k) for r in rows) for k in (
            "engine_ms", "engine_wall_ms", "history_ms", "snapshot_ms", "to_dict_ms", "view_ms", "views_ms",
            "probe_ms", "sync_ms", "pack_ms", "session_step_ms", "messages", "json_bytes", "buffer_bytes",
            "record_bytes", "snapshot_bytes")},
        "views": {name: stats(r["views"].get(name, 0.0) for r in rows)
                  for name in sorted({n for r in rows for n in r["views"]})},
        "widgets": {name: {k: stats(r["widgets"].get(name, {}).get(k, 0) for r in rows)
                           for k in ("messages", "json_bytes", "buffer_bytes")}
                    for name in sorted({n for r in rows for n in r["widgets"]})},
    }
    for line in format_python(result):
        out(line)
    return result


def format_python(res: dict) -> list[str]:
    s, su = res["setup"], res["summary"]
    kib = lambda st: {k: (v / 1024 if isinstance(v, (int, float)) and k != "n" else v) for k, v in st.items()}  # noqa: E731
    lines = [f"bench-ui, Python side: {s['model']} ({s['dtype']}), {s['num_requests']} running requests "
             f"(all decoding: {'yes' if s['all_decode'] else 'NO'}), {s['num_kv_blocks']} KV blocks x "
             f"{s['block_size']} ({s['num_blocks_in_use']} in use), {s['steps']} steps, {s['threads']} threads",
             table_head(),
             stats_row("engine step: StepRecord timings_ms total (ms)", su["engine_ms"]),
             stats_row("engine step: engine.step() wall (ms)", su["engine_wall_ms"]),
             stats_row("history: snapshot + to_dict + HistoryEntry (ms)", su["history_ms"]),
             stats_row("  of which the snapshot after the step (ms)", su["snapshot_ms"]),
             stats_row("  of which to_dict of record + snapshot (ms)", su["to_dict_ms"]),
             stats_row("view update: SessionBinder.render, all panels (ms)", su["view_ms"]),
             stats_row("  explorer.ui.views computations (ms)", su["views_ms"]),
             stats_row("  attention probe (Session.probe) (ms)", su["probe_ms"]),
             stats_row("  widget sync: traitlets, get_state, plotly, send (ms)", su["sync_ms"]),
             stats_row("    of which JSON packing as a kernel does it (ms)", su["pack_ms"]),
             stats_row("Session.step(1) with the Dashboard bound, total (ms)", su["session_step_ms"]),
             stats_row("payload per step: widget messages", su["messages"], 0),
             stats_row("payload per step: JSON (KiB)", kib(su["json_bytes"])),
             stats_row("payload per step: binary buffers (KiB)", kib(su["buffer_bytes"])),
             stats_row("history growth per step: record JSON (KiB)", kib(su["record_bytes"])),
             stats_row("history growth per step: snapshot JSON (KiB)", kib(su["snapshot_bytes"])),
             "  explorer.ui.views functions and the attention probe, per step (ms):"]
    for name, st in res["views"].items():
        lines.append(stats_row(f"  {name}", st, 2))
    lines.append(f"  payload per widget per step (median):  {'messages':>8} {'JSON KiB':>10} {'binary KiB':>11}")
    for name, w in res["widgets"].items():
        lines.append(f"    {name:<36} {_fmt(w['messages']['median'], 0):>8} "
                     f"{_fmt(w['json_bytes']['median'] / 1024, 1):>10} "
                     f"{_fmt(w['buffer_bytes']['median'] / 1024, 1):>11}")
    return lines


# -- part 2: the browser ----------------------------------------------------------------------
def _browser_driver():
    """benchmarks/ui_page.py, imported only when the browser part runs (playwright)."""
    from . import ui_page
    return ui_page


def bench_browser(model: str | None = None, *, num_requests: int = DEFAULT_REQUESTS,
                  num_kv_blocks: int = DEFAULT_BLOCKS, steps: int = DEFAULT_STEPS, block_size: int = 16,
                  prompt_len: tuple[int, int] = PROMPT_LEN, out: Callable[[str], None] = print) -> dict:
    """Click Step `steps` times in JupyterLab and time click -> updated panels in the page."""
    driver = _browser_driver()
    res = driver.run_browser_bench(model=model, num_requests=num_requests, num_kv_blocks=num_kv_blocks,
                                   steps=steps, block_size=block_size, prompt_len=prompt_len, out=out)
    res["summary"] = summarize_clicks(res["clicks"][res["setup"]["warmup_clicks"]:])
    for line in format_browser(res):
        out(line)
    return res


def summarize_clicks(clicks: list[dict]) -> dict:
    """Medians / spreads of the browser's clicks joined with the kernel's own step split."""
    keys = ["step_attr_ms", "panels_ms", "painted_ms", "ack_ms", "quiet_ms", "long_task_ms", "long_tasks",
            "engine_ms", "engine_wall_ms", "history_ms", "view_ms", "kernel_ms", "rest_ms", "overhead_ms"]
    keys += [f"last_{p}_ms" for p in WATCHED_PANELS]
    for c in clicks:
        for p in WATCHED_PANELS:
            c[f"last_{p}_ms"] = (c.get("per_panel_last_ms") or {}).get(p)
        k = c.get("kernel") or {}
        for name in ("engine_ms", "engine_wall_ms", "history_ms", "view_ms"):
            c[name] = k.get(name)
        if k:
            c["kernel_ms"] = k["engine_wall_ms"] + k["history_ms"] + k.get("view_ms", 0.0)
            c["rest_ms"] = c["panels_ms"] - c["kernel_ms"]
            c["overhead_ms"] = c["panels_ms"] - k["engine_ms"]
    return {k: stats(c.get(k) for c in clicks) for k in keys}


def format_browser(res: dict) -> list[str]:
    s, su = res["setup"], res["summary"]
    w = 66

    def row(label: str, key: str, digits: int = 1) -> str:   # one figure of the summary, at this table's width
        return stats_row(label, su[key], digits, w)

    return [f"bench-ui, browser: JupyterLab {s.get('jupyterlab')} + chromium {s.get('browser_version')}, "
            f"{s['num_requests']} running requests, {s['num_kv_blocks']} KV blocks, {s['clicks']} Step clicks "
            f"(+{s['warmup_clicks']} unmeasured), all decoding: {'yes' if s.get('all_decode') else 'NO'}"
            + (f", {s['timeouts']} click(s) timed out" if s.get("timeouts") else ""),
            table_head(w),
            row("click -> queues, block pool, slot mapping show new data-step (ms)", "step_attr_ms"),
            row("click -> last DOM update in those three panels (ms)", "panels_ms"),
            row("click -> first frame after that update (ms)", "painted_ms"),
            row("click -> Python's ack reaches the page (ms)", "ack_ms"),
            row("click -> whole dashboard quiet (last DOM update anywhere) (ms)", "quiet_ms"),
            *[row(f"  last DOM update of {p} (ms)", f"last_{p}_ms") for p in WATCHED_PANELS],
            row("  browser long tasks (>50 ms) between click and quiet: total (ms)", "long_task_ms"),
            row("  ... their number", "long_tasks", 0),
            row("engine step: StepRecord timings_ms total, in the kernel (ms)", "engine_ms"),
            row("kernel: engine.step() wall (ms)", "engine_wall_ms"),
            row("kernel: history bookkeeping (ms)", "history_ms"),
            row("kernel: view update, SessionBinder.render + comm sends (ms)", "view_ms"),
            row("panels updated - engine timings total, per click (ms)", "overhead_ms"),
            row("panels updated - kernel's step+history+view, per click (ms)", "rest_ms"),
            "  (last two rows: paired differences per click; the first is everything that is not the engine's"
            " own step, the second transport, kernel message handling and browser rendering)"]


def bench_ui(steps: int = DEFAULT_STEPS, browser: bool = True, model: str | None = None,
             num_kv_blocks: int = DEFAULT_BLOCKS, num_requests: int = DEFAULT_REQUESTS,
             out: Callable[[str], None] = print) -> dict:
    """Both parts, printed as they finish; returns {"python": ..., "browser": ...}."""
    results: dict = {"python": bench_python(model, num_requests=num_requests, num_kv_blocks=num_kv_blocks,
                                            steps=steps, out=out)}
    if browser:
        import gc

        gc.collect()  # the Session's KV pool (GBs at 4,096 blocks) goes before the kernel builds its own
        out("")
        results["browser"] = bench_browser(model, num_requests=num_requests, num_kv_blocks=num_kv_blocks,
                                           steps=steps, out=out)
    return results
