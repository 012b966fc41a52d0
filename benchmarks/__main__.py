"""`python -m benchmarks COMMAND` in a kvscope checkout: the benches that compare kvscope with
other engines and time the explorer, as a user runs them (docs/performance.md has their
figures). They are not in the wheel: they need a checkout (its tests' checkpoints, a browser,
vLLM), so the shipped `python -m explorer` does not reach them.

    python -m benchmarks bench --reps 2 --scale 0.5    # kvscope vs vLLM CPU vs HF generate
    python -m benchmarks bench-linears                 # native panels vs oneDNN, by row count
    python -m benchmarks bench-ui --steps 10           # click -> updated panels

The other benchmarks run as their own modules (`python -m benchmarks.recorder_scale`, ...).
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from explorer.apps.cli import positive_int


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    bench = sub.add_parser("bench", help="engine vs HF generate and vLLM's CPU build on the same model, side by side",
                           description="Run the offline-batch, one-stream and shared-prefix workloads on the "
                                       "engine, on transformers' generate and on vLLM's CPU build (its own "
                                       "process), alternating them, and print tokens/s, requests/s, TTFT, ITL "
                                       "and the ratios engine/HF and engine/vLLM (medians of the repetitions, "
                                       "with the spread), the one stream's share of the memory-bandwidth "
                                       "floor, then the cost of observation (StepRecords off/on, history).")
    bench.add_argument("--reps", type=positive_int, default=3, help="repetitions per workload (default 3)")
    bench.add_argument("--scale", type=float, default=1.0,
                       help="shrink the workloads (e.g. 0.25 for a quick look; 1.0 is the issue's size)")
    bench.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    bench.add_argument("--model", default=None, help="local HF model folder (default: SmolLM2-135M-Instruct)")
    bench.add_argument("--vllm", action=argparse.BooleanOptionalAction, default=True,
                       help="also run vLLM's CPU build (default: on when vllm is installed)")
    bench.add_argument("--vllm-eager", action="store_true",
                       help="vLLM with enforce_eager (starts in ~30 s instead of its torch.compile's 70-100 s)")
    bench.add_argument("--no-observation", dest="observation", action="store_false",
                       help="skip the observation-overhead runs")
    bench.add_argument("--json", default=None, metavar="FILE", help="also write the results as JSON")

    bench_linears = sub.add_parser(
        "bench-linears", help="native panels vs oneDNN for the model's linears at each row count, on this CPU",
        description="Time the model's layer linears (weights from DRAM, as a step reads them) through kvscope's "
                    "native panels and through oneDNN's GEMM at 1 to 1024 rows, then whole decode steps of 16 to "
                    "128 requests as one native call and layer by layer on oneDNN, and print where oneDNN becomes "
                    "the faster one, beside the limits the engine measured here at first use and kept "
                    "(KVSCOPE_NATIVE_MAX_ROWS sets them; delete ~/.cache/kvscope/crossover.json to measure again).")
    bench_linears.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    bench_linears.add_argument("--model", default=None, help="local HF model folder (default: SmolLM2-135M-Instruct)")
    bench_linears.add_argument("--reps", type=positive_int, default=5, help="timed passes per row count (default 5)")
    bench_linears.add_argument("--json", default=None, metavar="FILE", help="also write the results as JSON")

    bench_ui = sub.add_parser("bench-ui", help="explorer responsiveness: step -> updated panels, Python and browser",
                              description="Build a Session with every request decoding over a large KV pool and a "
                                          "Dashboard bound to it, then time N steps: the engine step, the Session's "
                                          "history bookkeeping, the Dashboard's view update and the bytes sent to "
                                          "the browser per step; then (with --browser) click Step N times in "
                                          "JupyterLab + headless chromium and time click -> updated panels in the "
                                          "page. Prints medians and spreads (min-max).")
    bench_ui.add_argument("--steps", type=positive_int, default=10, help="measured steps / clicks (default 10)")
    bench_ui.add_argument("--browser", action=argparse.BooleanOptionalAction, default=True,
                          help="also run the JupyterLab + chromium part (default on; needs the checkout, "
                               "playwright and Debian chromium)")
    bench_ui.add_argument("--model", default=None,
                          help="local HF model folder (default: SmolLM2-135M-Instruct; a tiny checkpoint "
                               "gives a quick look)")
    bench_ui.add_argument("--blocks", type=positive_int, default=4096, help="KV blocks in the pool (default 4096)")
    bench_ui.add_argument("--requests", type=positive_int, default=64,
                          help="requests, all decoding while measured (default 64)")
    bench_ui.add_argument("--json", default=None, metavar="FILE", help="also write the results as JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "bench":
        from .offline import bench

        if not 0 < args.scale <= 1:
            print(f"error: --scale must be in (0, 1], got {args.scale}", file=sys.stderr)
            return 2
        results = bench(reps=args.reps, scale=args.scale, dtype=args.dtype, model=args.model,
                        observation=args.observation, vllm=args.vllm, vllm_eager=args.vllm_eager)
        _write_json(args.json, results)
        return 0
    if args.command == "bench-linears":
        from .linears import bench_linears

        try:
            _write_json(args.json, bench_linears(dtype=args.dtype, model=args.model, reps=args.reps))
        except RuntimeError as exc:  # no native kernels here: one line
            print(f"error: {exc}", file=sys.stderr)
            return 1
        return 0
    if args.command == "bench-ui":
        from .ui import bench_ui
        from .ui_common import BenchUnavailable

        try:
            results = bench_ui(steps=args.steps, browser=args.browser, model=args.model,
                               num_kv_blocks=args.blocks, num_requests=args.requests)
        except (ValueError, BenchUnavailable) as exc:  # a pool too small, no chromium, ...: one line
            print(f"error: {exc}", file=sys.stderr)
            return 2 if isinstance(exc, ValueError) else 1
        _write_json(args.json, results)
        return 0
    parser.print_help(sys.stderr)
    return 2


def _write_json(path: str | None, results: Any) -> None:
    """--json FILE: the bench's results as JSON too (nothing without the option)."""
    if path:
        with open(path, "w") as f:
            json.dump(results, f, indent=2)



if __name__ == "__main__":
    sys.exit(main())
