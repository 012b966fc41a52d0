"""`python -m explorer` (also installed as `kvscope`): lab, app, export, trace, attach, whatif and doctor.

Each subcommand's work lives in its own module (lab.py, app.py, export.py, trace.py, doctor.py); this
file only parses arguments, and imports those modules lazily so `--help` stays fast. The
benchmarks are a checkout's, not the wheel's: `python -m benchmarks` (benchmarks/__main__.py).
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..ui.panel_views import PoolConfigDict


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _add_server_options(parser: argparse.ArgumentParser, port: int) -> None:
    """A local web server's options: the port it tries first, and whether to open a browser."""
    parser.add_argument("--port", type=positive_int, default=port, help=f"port to try first (default {port})")
    parser.add_argument("--no-browser", action="store_true", help="do not open a web browser")


def _add_engine_knobs(parser: argparse.ArgumentParser, max_num_seqs: bool = False) -> None:
    """The engine's pool and budget options (default: the engine's own defaults)."""
    parser.add_argument("--num-kv-blocks", type=positive_int, default=None, help="KV pool size in blocks")
    parser.add_argument("--block-size", type=positive_int, default=None, help="KV block size")
    parser.add_argument("--max-num-batched-tokens", type=positive_int, default=None, help="token budget per step")
    if max_num_seqs:
        parser.add_argument("--max-num-seqs", type=positive_int, default=None, help="requests per step")


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
    trace.add_argument("--max-tokens", type=positive_int, default=8, help="tokens to generate (default 8)")
    trace.add_argument("--model", default=None, help="local HF model folder (default: SmolLM2-135M-Instruct)")
    trace.add_argument("--block-size", type=positive_int, default=None, help="KV block size (default 16)")
    trace.add_argument("--max-num-batched-tokens", type=positive_int, default=None,
                       help="token budget per step (small values show chunked prefill)")
    trace.add_argument("--max-num-seqs", type=positive_int, default=None, help="requests per step")
    trace.add_argument("--num-kv-blocks", type=positive_int, default=None,
                       help="KV pool size in blocks, the null block included")
    trace.add_argument("--policy", dest="scheduling_policy", choices=("unified", "prefill_first"), default=None,
                       help="scheduling policy (default unified)")
    trace.add_argument("--no-prefix-caching", dest="enable_prefix_caching", action="store_false", default=None)
    trace.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    trace.add_argument("--chat", action="store_true", help="wrap each prompt in the model's chat template")
    trace.add_argument("--full", action="store_true", help="print long lists in full")
    trace.add_argument("--json", action="store_true", help="print each StepRecord as a JSON line instead")

    export = sub.add_parser("export", help="record a workload and write it as one self-contained HTML file",
                            description="Record a workload with a real engine and write the recording as one HTML "
                                        "file: the panels, their history, no kernel and no network needed. Open it "
                                        "in a browser to scrub the steps, hover blocks, and read the charts.")
    export.add_argument("output", metavar="OUT.html", help="the HTML file to write")
    export.add_argument("--workload", default="walkthrough",
                        help="a JSON workload file, a Python file defining run(session, caption), or 'walkthrough' "
                             "(default: the walkthrough notebook's story)")
    export.add_argument("--model", default=None, help="local HF model folder (default: SmolLM2-135M-Instruct)")
    export.add_argument("--max-steps", type=positive_int, default=400,
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

