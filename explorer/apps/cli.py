"""`python -m explorer` (also installed as `kvscope`): lab, app, export, trace, the benches and doctor.

Each subcommand's work lives in its own module (lab.py, app.py, export.py, trace.py, doctor.py); this
file only parses arguments, and imports those modules lazily so `--help` stays fast.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..export.delta import JSONValue
    from ..export.states import PoolConfigDict


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _add_server_options(parser: argparse.ArgumentParser, port: int) -> None:
    """A local web server's options: the port it tries first, and whether to open a browser."""
    parser.add_argument("--port", type=_positive_int, default=port, help=f"port to try first (default {port})")
    parser.add_argument("--no-browser", action="store_true", help="do not open a web browser")


def _add_engine_knobs(parser: argparse.ArgumentParser, max_num_seqs: bool = False) -> None:
    """The engine's pool and budget options (default: the engine's own defaults)."""
    parser.add_argument("--num-kv-blocks", type=_positive_int, default=None, help="KV pool size in blocks")
    parser.add_argument("--block-size", type=_positive_int, default=None, help="KV block size")
    parser.add_argument("--max-num-batched-tokens", type=_positive_int, default=None, help="token budget per step")
    if max_num_seqs:
        parser.add_argument("--max-num-seqs", type=_positive_int, default=None, help="requests per step")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m explorer",
        description="kvscope: watch a real paged-KV LLM inference engine work, one scheduler step at a time.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    lab = sub.add_parser("lab", help="start JupyterLab on the walkthrough notebook",
                         description="Start JupyterLab on 127.0.0.1 (token auth on) and open walkthrough.ipynb: "
                                     "in a checkout, the repository's notebooks/ folder in place; an installed "
                                     "kvscope copies its notebooks into ./kvscope-notebooks (a notebook already "
                                     "there is kept) and serves that folder. A busy port is replaced by a free one.")
    _add_server_options(lab, port=8888)
    lab.add_argument("--notebook-dir", default=None, help="serve this folder as it is instead")

    trace = sub.add_parser("trace", help="print each engine step's batch tables for a prompt",
                           description="Run prompts through the engine and print, step by step, input_ids, "
                                       "positions, query_start_loc, seq_lens, logits_indices, block_table, "
                                       "slot_mapping and the sampled token, from real StepRecords.")
    trace.add_argument("prompts", nargs="+", metavar="PROMPT", help="one or more prompts (batched together)")
    trace.add_argument("--max-tokens", type=_positive_int, default=8, help="tokens to generate (default 8)")
    trace.add_argument("--model", default=None, help="local HF model folder (default: SmolLM2-135M-Instruct)")
    trace.add_argument("--block-size", type=_positive_int, default=None, help="KV block size (default 16)")
    trace.add_argument("--max-num-batched-tokens", type=_positive_int, default=None,
                       help="token budget per step (small values show chunked prefill)")
    trace.add_argument("--max-num-seqs", type=_positive_int, default=None, help="requests per step")
    trace.add_argument("--num-kv-blocks", type=_positive_int, default=None,
                       help="KV pool size in blocks, the null block included")
    trace.add_argument("--policy", dest="scheduling_policy", choices=("unified", "prefill_first"), default=None,
                       help="scheduling policy (default unified)")
    trace.add_argument("--no-prefix-caching", dest="enable_prefix_caching", action="store_false", default=None)
    trace.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    trace.add_argument("--chat", action="store_true", help="wrap each prompt in the model's chat template")
    trace.add_argument("--full", action="store_true", help="print long lists in full")
    trace.add_argument("--json", action="store_true", help="print each StepRecord as a JSON line instead")

    bench = sub.add_parser("bench", help="engine vs HF generate and vLLM's CPU build on the same model, side by side",
                           description="Run the offline-batch, one-stream and shared-prefix workloads on the "
                                       "engine, on transformers' generate and on vLLM's CPU build (its own "
                                       "process), alternating them, and print tokens/s, requests/s, TTFT, ITL "
                                       "and the ratios engine/HF and engine/vLLM (medians of the repetitions, "
                                       "with the spread), the one stream's share of the memory-bandwidth "
                                       "floor, then the cost of observation (StepRecords off/on, history).")
    bench.add_argument("--reps", type=_positive_int, default=3, help="repetitions per workload (default 3)")
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
    bench_linears.add_argument("--reps", type=_positive_int, default=5, help="timed passes per row count (default 5)")
    bench_linears.add_argument("--json", default=None, metavar="FILE", help="also write the results as JSON")

    bench_ui = sub.add_parser("bench-ui", help="explorer responsiveness: step -> updated panels, Python and browser",
                              description="Build a Session with every request decoding over a large KV pool and a "
                                          "Dashboard bound to it, then time N steps: the engine step, the Session's "
                                          "history bookkeeping, the Dashboard's view update and the bytes sent to "
                                          "the browser per step; then (with --browser) click Step N times in "
                                          "JupyterLab + headless chromium and time click -> updated panels in the "
                                          "page. Prints medians and spreads (min-max).")
    bench_ui.add_argument("--steps", type=_positive_int, default=10, help="measured steps / clicks (default 10)")
    bench_ui.add_argument("--browser", action=argparse.BooleanOptionalAction, default=True,
                          help="also run the JupyterLab + chromium part (default on; needs the checkout, "
                               "playwright and Debian chromium)")
    bench_ui.add_argument("--model", default=None,
                          help="local HF model folder (default: SmolLM2-135M-Instruct; a tiny checkpoint "
                               "gives a quick look)")
    bench_ui.add_argument("--blocks", type=_positive_int, default=4096, help="KV blocks in the pool (default 4096)")
    bench_ui.add_argument("--requests", type=_positive_int, default=64,
                          help="requests, all decoding while measured (default 64)")
    bench_ui.add_argument("--json", default=None, metavar="FILE", help="also write the results as JSON")

    export = sub.add_parser("export", help="record a workload and write it as one self-contained HTML file",
                            description="Record a workload with a real engine and write the recording as one HTML "
                                        "file: the panels, their history, no kernel and no network needed. Open it "
                                        "in a browser to scrub the steps, hover blocks, and read the charts.")
    export.add_argument("output", metavar="OUT.html", help="the HTML file to write")
    export.add_argument("--workload", default="walkthrough",
                        help="a JSON workload file, a Python file defining run(session, caption), or 'walkthrough' "
                             "(default: the walkthrough notebook's story)")
    export.add_argument("--model", default=None, help="local HF model folder (default: SmolLM2-135M-Instruct)")
    export.add_argument("--max-steps", type=_positive_int, default=400,
                        help="at most this many steps go in the file (default 400); "
                             "the page says when some are left out")
    export.add_argument("--keep", choices=("last", "first", "even"), default="last",
                        help="which steps a long run keeps: the last ones (default), the first ones, or evenly spaced")
    export.add_argument("--max-mb", type=float, default=16.0,
                        help="keep fewer steps when the file would pass this size (default 16 MB)")
    export.add_argument("--start", choices=("last", "first"), default="last", help="the step shown on opening")
    export.add_argument("--title", default=None, help="the page's title")
    _add_engine_knobs(export)

    app = sub.add_parser("app", help="serve the Dashboard alone as a web app (Voila)",
                         description="Serve the Dashboard of one live Session on its own page, with Voila, on "
                                     "127.0.0.1 (token auth on). A busy port is replaced by a free one. The page "
                                     "shows progress while the model loads.")
    _add_server_options(app, port=8866)
    app.add_argument("--model", default=None, help="local HF model folder (default: SmolLM2-135M-Instruct)")
    _add_engine_knobs(app, max_num_seqs=True)

    attach = sub.add_parser("attach", help="follow a running vLLM server's steps (its kvscope recorder feed)",
                            description="Print each step of a vLLM server started with --scheduler-cls "
                                        "explorer.drivers.vllm_live.RecordingScheduler, as it runs (Ctrl-C stops).")
    attach.add_argument("address", help="the server's KVSCOPE_FEED, e.g. tcp://127.0.0.1:5590")
    attach.add_argument("--model", default=None, help="local model folder, for text (default: the server's, if here)")
    attach.add_argument("--kv-events", default=None,
                        help="the server's --kv-events-config endpoint, for the prefix tree")
    attach.add_argument("--seconds", type=float, default=None, help="stop after this many seconds")
    attach.add_argument("--export", default=None, help="write what was seen as one HTML file at the end")
    attach.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the recorder to answer")
    attach.add_argument("--snapshot", default=None, metavar="ADDRESS",
                        help="the recorder's snapshot endpoint when it is not the feed's default "
                             "(KVSCOPE_FEED_SNAPSHOT)")
    attach.add_argument("--record", default=None, metavar="FILE",
                        help="also write what is seen as a recording (FILE.kvrec.gz) for `python -m explorer whatif`")

    whatif = sub.add_parser("whatif", help="replay a recording through vLLM's own scheduler at other settings",
                            description="Replay a recording (session.save_recording, attach --record, or a Mooncake "
                                        "trace with --trace) through vLLM 0.32's own scheduler and KV cache manager, "
                                        "with no model, at every combination of the settings given (comma-separated "
                                        "lists), in parallel processes; print one row per setting: exact prefix hits, "
                                        "preemptions, steps, queue and KV usage, and TTFT / ITL / E2E predicted by a "
                                        "step-time model fitted on the recording (its held-out error printed).")
    whatif.add_argument("recording", help="the recording file (or a Mooncake trace with --trace)")
    from .whatif import add_whatif_arguments  # no heavy import: the replay's are inside run_whatif

    add_whatif_arguments(whatif)

    sub.add_parser("doctor", help="check the set-up and say how to fix what is missing",
                   description="Print Python, torch build and device, whether kvscope's native CPU kernels are "
                               "built, triton, flash-attn, the default model cache, chromium for browser tests, "
                               "the walkthrough lab opens, and the command that fixes each missing piece.")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "lab":
        from .lab import run_lab

        return run_lab(port=args.port, open_browser=not args.no_browser, notebooks_dir=args.notebook_dir)
    if args.command == "trace":
        from .trace import run_trace

        try:
            return run_trace(args.prompts, args.max_tokens, model=args.model, temperature=args.temperature,
                             chat=args.chat, limit=None if args.full else 64, as_json=args.json,
                             block_size=args.block_size, max_num_batched_tokens=args.max_num_batched_tokens,
                             max_num_seqs=args.max_num_seqs, num_kv_blocks=args.num_kv_blocks,
                             scheduling_policy=args.scheduling_policy,
                             enable_prefix_caching=args.enable_prefix_caching)
        except ValueError as exc:  # bad input: one line, not a traceback
            print(f"error: {exc}", file=sys.stderr)
            return 2
    if args.command == "bench":
        bench = _benchmark("offline", "bench")

        if not 0 < args.scale <= 1:
            print(f"error: --scale must be in (0, 1], got {args.scale}", file=sys.stderr)
            return 2
        results = bench(reps=args.reps, scale=args.scale, dtype=args.dtype, model=args.model,
                        observation=args.observation, vllm=args.vllm, vllm_eager=args.vllm_eager)
        _write_json(args.json, results)
        return 0
    if args.command == "bench-linears":
        bench_linears = _benchmark("linears", "bench_linears")

        try:
            _write_json(args.json, bench_linears(dtype=args.dtype, model=args.model, reps=args.reps))
        except RuntimeError as exc:  # no native kernels here: one line
            print(f"error: {exc}", file=sys.stderr)
            return 1
        return 0
    if args.command == "bench-ui":
        bench_ui = _benchmark("ui", "bench_ui")
        BenchUnavailable = _benchmark("ui_common", "BenchUnavailable")

        try:
            results = bench_ui(steps=args.steps, browser=args.browser, model=args.model,
                               num_kv_blocks=args.blocks, num_requests=args.requests)
        except (ValueError, BenchUnavailable) as exc:  # a pool too small, no chromium, ...: one line
            print(f"error: {exc}", file=sys.stderr)
            return 2 if isinstance(exc, ValueError) else 1
        _write_json(args.json, results)
        return 0
    if args.command == "export":
        from ..export.workloads import run_export

        if not args.max_mb > 0:
            print(f"error: --max-mb must be > 0, got {args.max_mb}", file=sys.stderr)
            return 2
        config: PoolConfigDict = {"num_kv_blocks": args.num_kv_blocks, "block_size": args.block_size,
                                   "max_num_batched_tokens": args.max_num_batched_tokens}
        try:
            run_export(args.output, args.workload, model=args.model, config=config, max_steps=args.max_steps,
                       keep=args.keep, title=args.title, start=args.start, max_bytes=int(args.max_mb * 1e6))
        except ValueError as exc:  # a bad workload or config: one line, not a traceback
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.command == "app":
        from .app import run_app

        options: PoolConfigDict = {"num_kv_blocks": args.num_kv_blocks, "block_size": args.block_size,
                                    "max_num_batched_tokens": args.max_num_batched_tokens,
                                    "max_num_seqs": args.max_num_seqs}
        return run_app(port=args.port, open_browser=not args.no_browser, model=args.model, config=options)
    if args.command == "attach":
        from .attach import run_attach

        return run_attach(args.address, model=args.model, kv_events=args.kv_events, seconds=args.seconds,
                          export=args.export, timeout=args.timeout, record=args.record,
                          snapshot_address=args.snapshot)
    if args.command == "whatif":
        from .whatif import run_whatif

        return run_whatif(args)
    if args.command == "doctor":
        from .doctor import run_doctor

        return run_doctor()
    parser.print_help(sys.stderr)
    return 2


def _benchmark(module: str, name: str) -> Any:
    """`name` from the checkout's benchmarks/`module`.py. The benchmarks are not shipped in the
    wheel (they need the checkout's tests' checkpoints, a browser, vLLM): `kvscope bench` works
    from a checkout, and says so elsewhere."""
    checkout = Path(__file__).resolve().parents[2]
    if not (checkout / "benchmarks" / "__init__.py").is_file():
        raise SystemExit("error: the benchmarks live in a kvscope checkout (benchmarks/), which this "
                         f"install ({checkout}) is not: clone the repository and run `make setup` there")
    if str(checkout) not in sys.path:
        sys.path.insert(0, str(checkout))
    return getattr(importlib.import_module(f"benchmarks.{module}"), name)


def _write_json(path: str | None, results: JSONValue) -> None:
    """--json FILE: the bench's results as JSON too (nothing without the option)."""
    if path:
        import json

        with open(path, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

