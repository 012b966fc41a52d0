"""`python -m explorer whatif RECORDING --block-size 16,32,64 --num-blocks 256,512,1024 ...`: a sweep
(explorer.whatif.sweep) printed as a table. Module-level imports stay light: `--help` loads no vLLM."""
from __future__ import annotations

import argparse
import sys

# (option, what-if knob, type of one value, help)
_LISTS = (
    ("--block-size", "block_size", int, "KV block sizes (a new size alone keeps the recorded KV memory)"),
    ("--num-blocks", "num_blocks", int, "KV pool sizes in blocks, the null block included"),
    ("--kv-memory-fraction", "kv_memory_fraction", float, "pool sizes as shares of the recorded pool's memory"),
    ("--kv-cache-memory-bytes", "kv_cache_memory_bytes", int, "pool sizes in bytes (the model's KV bytes per block)"),
    ("--max-num-batched-tokens", "max_num_batched_tokens", int, "token budgets per step"),
    ("--max-num-seqs", "max_num_seqs", int, "requests per step"),
    ("--long-prefill-token-threshold", "long_prefill_token_threshold", int, "caps on a long prompt's chunk (0: off)"),
    ("--policy", "policy", str, "scheduling policies (fcfs, priority)"),
)
_BOOLS = (("--prefix-caching", "enable_prefix_caching"), ("--chunked-prefill", "enable_chunked_prefill"))


def _values(kind: type):
    def parse(text: str) -> list:
        out = []
        for part in text.split(","):
            part = part.strip()
            if kind is bool:
                if part not in ("on", "off"):
                    raise argparse.ArgumentTypeError(f"expected on and/or off, got {part!r}")
                out.append(part == "on")
                continue
            try:
                out.append(kind(part))
            except ValueError:
                raise argparse.ArgumentTypeError(
                    f"expected a comma-separated list of {kind.__name__}, got {part!r}") from None
        return out

    return parse


def add_whatif_arguments(p: argparse.ArgumentParser) -> None:
    for flag, _, kind, text in _LISTS:
        p.add_argument(flag, type=_values(kind), default=None, metavar="A,B,...", help=text)
    for flag, _ in _BOOLS:
        p.add_argument(flag, type=_values(bool), default=None, metavar="on,off", help=f"{flag[2:]} on and/or off")
    p.add_argument("--arrivals", choices=("timed", "step"), default="timed",
                   help="timed (default): arrivals at their recorded times on a clock moved by predicted step times; "
                        "step: at their recorded steps (exact, no latency predictions)")
    p.add_argument("--target", default=None, metavar="'ttft_p90<=0.3,preemptions==0'",
                   help="search for the cheapest setting that meets these conditions on the sweep's figures "
                        "(latencies in seconds or with ms, rates as 0.2 or 20%%) and say it in one sentence")
    p.add_argument("--search", choices=("num_blocks", "max_num_batched_tokens"), default="num_blocks",
                   help="the knob --target searches along (default num_blocks), at every combination of the others")
    p.add_argument("--processes", type=int, default=None, help="parallel replays (default: the CPUs)")
    p.add_argument("--identity", action="store_true", help="only check that the recording replays with 0 differences")
    p.add_argument("--trace", action="store_true",
                   help="RECORDING is a Mooncake trace (timestamp, input_length, output_length, hash_ids)")
    p.add_argument("--trace-block-size", type=int, default=16, help="a trace's block size to start from (default 16)")
    p.add_argument("--trace-num-blocks", type=int, default=4096, help="a trace's pool to start from (default 4096)")
    p.add_argument("--trace-limit", type=int, default=None, help="read only a trace's first requests")
    p.add_argument("--step-times-from", default=None, metavar="FILE",
                   help="fit the step-time model on this recording instead (a trace has no timings)")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the rows as JSON")


def run_whatif(args: argparse.Namespace) -> int:
    from ..core.recording import Recording, RecordingError
    from ..whatif import NoStepTimings, identity, load_trace, sweep
    from ..whatif.step_model import fit

    try:
        if args.trace:
            rec = load_trace(args.recording, block_size=args.trace_block_size, num_blocks=args.trace_num_blocks,
                             limit=args.trace_limit)
        else:
            rec = Recording.load(args.recording)
        model = fit(Recording.load(args.step_times_from)) if args.step_times_from else None
        if args.identity:
            report = identity(rec)
            print(report.text())
            return 0 if report.ok else 1
        knobs = {knob: getattr(args, knob) for _, knob, _, _ in _LISTS}
        knobs.update({knob: getattr(args, flag[2:].replace("-", "_")) for flag, knob in _BOOLS})
        result = sweep(rec, arrivals=args.arrivals, step_model=model, processes=args.processes, target=args.target,
                       search=args.search, **{k: v for k, v in knobs.items() if v is not None})
    except (RecordingError, NoStepTimings, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(result.table())
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump({"rows": result.rows, "recorded": result.recorded,
                       "answer": result.answer.sentence if result.answer is not None else None,
                       "step_model": result.step_model.to_dict() if result.step_model else None}, f, indent=1)
    return 0
