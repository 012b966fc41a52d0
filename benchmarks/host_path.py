"""The host work around the forward, per step (`python -m benchmarks.host_path`).

A tiny random Qwen3 (2 layers, hidden 64, Qwen's 151,936-token vocabulary) makes the model's
own work small, so what is left of a step is the engine's Python and memory traffic: what a
GPU's forward would have to hide. For each size every request decodes, with 512-2,048 tokens of
context; the step loop is timed from the caller (what `step()` frees when it returns counts),
with records on (what a Session needs) and off. Printed per step, medians:

- schedule, prepare, update: the engine's own timings;
- record: `step_record` and the step's changes (records on only);
- other: the rest of the loop's wall that is neither forward nor sample nor the above
  (frees after the step returns, the engine's bookkeeping);
- host: the loop's wall less the forward and the sampler, the goal's figure;
- critical: the host work left on a GPU's critical path. Synchronous, that is all of `host`.
  Under async scheduling (the `async-off` and `async-on` rows: `async_scheduling=True`, vLLM's
  default on a GPU, records off and on) the next step is scheduled and built, and the step's
  record made, while the GPU runs a forward; what the GPU waits for is the landing (`update`)
  and the next step's tensors with its placeholders filled (`runner.tensors`). On a CPU the
  forward runs on the same cores, so nothing hides: the column is what a GPU would leave
  exposed, measured here (it hides the rest only where the forward is the longer);
- gc: the cyclic garbage collector's time per step, wherever it ran (inside the columns above);
- session: with `--session`, one more row per size steps the engine through a Session, which
  keeps the history a Dashboard shows: its own work per step (the Session's step less the
  engine's: the record as a dict, its changes applied to the previous snapshot, the entry),
  and the MiB its history holds after the timed steps (`history_bytes`);
- and, with `--vllm`, the vLLM recorder at the same size (benchmarks.recorder_scale): the
  scheduler thread's added time and the recorder thread's CPU, beside kvscope's record.
"""
from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from explorer.apps.machine import cpu_summary

SIZES = (16, 64, 256)
CONTEXT = (512, 2048)
BLOCK_SIZE = 16


class _Clock:
    """Adds up the time spent in wrapped calls."""

    def __init__(self) -> None:
        self.s = 0.0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.s += time.perf_counter() - t
        return timed


def _gc_clock() -> tuple[list[float], Callable[[str, dict], None]]:
    spent: list[float] = []
    started = [0.0]

    def callback(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            spent.append(time.perf_counter() - started[0])
    return spent, callback


def _pool_blocks(num_requests: int, steps: int) -> int:
    """A pool every request fits in at its longest context and all the steps timed (and the null block)."""
    return num_requests * -(-(CONTEXT[1] + steps + 64) // BLOCK_SIZE) + 1


def measure(model: Path, num_requests: int, record: bool, steps: int, session: bool = False,
            warm: int = 3, async_scheduling: bool = False) -> dict[str, float]:
    """Median ms per decode step at `num_requests` requests (and gc's mean), after `warm` decode
    steps (each request's output that long); `session`: stepped through a Session (records on),
    whose own work is the `session` column; `async_scheduling`: the engine's async step loop."""
    import engine.llm_engine as loop
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine
    from engine.sampling_params import SamplingParams
    from explorer.core.history import history_bytes
    from explorer.core.session import Session

    config = EngineConfig(model=str(model), block_size=BLOCK_SIZE,
                          num_kv_blocks=_pool_blocks(num_requests, steps + warm), max_num_seqs=num_requests,
                          max_num_batched_tokens=16_384, max_model_len=4096, record_steps=record or session,
                          async_scheduling=async_scheduling)
    s = Session(config) if session else None
    eng = s.engine if s is not None else LLMEngine(config)
    step = s.step if s is not None else eng.step
    rng = random.Random(0)
    params = SamplingParams(temperature=0.0, max_tokens=CONTEXT[1], ignore_eos=True)
    for i in range(num_requests):   # distinct prompts: no prefix sharing
        eng.add_request([3 + (i * 7919 + j) % 1000 for j in range(rng.randint(*CONTEXT))], params)
    while eng.scheduler.waiting or any(r.num_computed_tokens < r.num_prompt_tokens for r in eng.scheduler.running):
        step()
    for _ in range(warm):
        step()
    record_clock, engine_clock, tensors_clock = _Clock(), _Clock(), _Clock()
    plain_record, plain_changes, plain_step = loop.step_record, eng._step_changes, eng.step
    loop.step_record = record_clock.wrap(plain_record)
    eng._step_changes = record_clock.wrap(plain_changes)  # type: ignore[method-assign]
    eng.step = engine_clock.wrap(plain_step)  # type: ignore[method-assign]
    eng.runner.tensors = tensors_clock.wrap(eng.runner.tensors)  # type: ignore[method-assign]
    spent, callback = _gc_clock()
    gc.callbacks.append(callback)
    rows: dict[str, list[float]] = {}
    try:
        t = time.perf_counter()
        for _ in range(steps):
            record_clock.s = engine_clock.s = tensors_clock.s = 0.0
            rec = step()
            now = time.perf_counter()
            ms = (rec[0] if isinstance(rec, list) else rec).timings_ms
            row = {"schedule": ms["schedule"], "prepare": ms["prepare"], "forward": ms["forward"],
                   "sample": ms["sample"], "update": ms["update"], "record": record_clock.s * 1e3,
                   "wall": (now - t) * 1e3, "session": ((now - t) - engine_clock.s) * 1e3 if session else 0.0,
                   "exposed": ms["update"] + tensors_clock.s * 1e3}
            for k, v in row.items():
                rows.setdefault(k, []).append(v)
            t = now
        history_mib = history_bytes(s.history) / 2**20 if s is not None else 0.0
    finally:
        gc.callbacks.remove(callback)
        loop.step_record = plain_record
        if s is not None:
            s.close()
        else:
            eng.shutdown()
    med = {k: statistics.median(v) for k, v in rows.items()}
    med["gc"] = sum(spent) * 1e3 / steps
    med["host"] = med["wall"] - med["forward"] - med["sample"]
    med["other"] = med["host"] - med["schedule"] - med["prepare"] - med["update"] - med["record"] - med["session"]
    med["critical"] = med["exposed"] if async_scheduling else med["host"]
    med["history_mib"] = history_mib
    return med


def vllm_recorder(num_requests: int, steps: int) -> dict[str, float]:
    """The vLLM recorder at this size (benchmarks.recorder_scale: vLLM's Scheduler without a model)."""
    from . import recorder_scale

    blocks = _pool_blocks(num_requests, steps)
    prompt = sum(CONTEXT) // 2
    plain = recorder_scale._steps(blocks, num_requests, prompt, steps, False, 0.005)
    rec = recorder_scale._steps(blocks, num_requests, prompt, steps, True, 0.005)
    return {"added": rec["step_ms"] - plain["step_ms"], "thread": rec["thread_cpu_ms"]}


COLUMNS = ("schedule", "prepare", "update", "record", "session", "other", "host", "critical", "gc", "forward",
           "sample")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="decoding requests, comma-separated")
    ap.add_argument("--steps", type=int, default=20, help="decode steps timed per size")
    ap.add_argument("--vllm", action="store_true", help="also time the vLLM recorder at each size (imports vLLM)")
    ap.add_argument("--session", action="store_true", help="also step each size through a Session (its own work)")
    ap.add_argument("--warm", type=int, default=3, help="decode steps before the timed ones (the outputs' length)")
    args = ap.parse_args(argv)
    os.environ.setdefault("KVSCOPE_QUIET", "1")          # no weight-loading bar between the rows
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from benchmarks.checkpoints import write_tiny_qwen3

    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        model = write_tiny_qwen3(Path(tmp) / "tiny-qwen3")
        import torch

        gpu = f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
        print(f"host work per decode step ({cpu_summary()}{gpu}); tiny Qwen3, every request decoding with "
              f"{CONTEXT[0]}-{CONTEXT[1]} tokens of context, block size {BLOCK_SIZE}; medians of {args.steps} steps "
              f"after {args.warm} decode steps, ms", flush=True)
        print(f"{'requests':>8} {'records':>9} " + " ".join(f"{c:>8}" for c in COLUMNS)
              + ("  vLLM recorder: +sched ms, thread CPU ms" if args.vllm else ""))
        for n in sizes:
            for mode in ("off", "on", "async-off", "async-on", *(("session",) if args.session else ())):
                med = measure(model, n, mode in ("on", "async-on"), args.steps, session=mode == "session",
                              warm=args.warm, async_scheduling=mode.startswith("async"))
                line = f"{n:>8} {mode:>9} " + " ".join(f"{med[c]:>8.2f}" for c in COLUMNS)
                if mode == "session":
                    line += f"  history {med['history_mib']:.1f} MiB"
                if args.vllm and mode == "on":
                    v = vllm_recorder(n, max(args.steps, 64))
                    line += f"  {v['added']:>+6.2f} {v['thread']:>6.2f}"
                print(line, flush=True)


if __name__ == "__main__":
    main()
