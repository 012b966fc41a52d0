"""The what-if sweep's speed: a synthetic 10,000-step recording replayed at 8 settings in 2
processes, beside the steps per second of vLLM's scheduler alone (the same replays' time inside
vLLM's schedule() and update_from_output()).

    .venv/bin/python -m benchmarks.whatif_sweep [--steps 10000] [--processes 2]

The recording is made, not measured: requests with Poisson arrivals (a few shared system
prompts, so prefix hits happen), replayed once through vLLM's scheduler with a fixed step-time
model; that replay's arrival steps, decisions and step times become the recording (so it also
passes the identity check, which this prints). The goal (issue 44): 8 settings in under 2
minutes on 2 cores. Prints, never asserts: the figures go in docs/whatif.md, dated, with the CPU.
"""
from __future__ import annotations

import argparse
import random
import time

from explorer.core.recording import RecordedRequest, RecordedSteps, Recording, Settings, Source
from explorer.whatif import identity, replay, sweep
from explorer.whatif.step_model import StepTimeModel

BASE = Settings(block_size=32, num_blocks=1024, max_num_batched_tokens=512, max_num_seqs=64, max_model_len=4096)
# A made-up server: 4 ms a step, 40 us a prefill token, 150 us a decode request, 0.5 us a context token.
MODEL = StepTimeModel(coefficients=(0.004, 40e-6, 150e-6, 0.5e-6), step_error=0.0, total_error=0.0, num_steps=0,
                      clock="wall", source="synthetic")
GOAL_S = 120.0


def synthetic(num_requests: int, rate: float, seed: int = 0) -> Recording:
    rng = random.Random(seed)
    systems = [[rng.randrange(1, 30000) for _ in range(rng.randrange(200, 900))] for _ in range(6)]
    t, reqs = 0.0, []
    for i in range(num_requests):
        t += rng.expovariate(rate)
        prompt = rng.choice(systems) + [rng.randrange(1, 30000) for _ in range(rng.randrange(20, 600))]
        out = [rng.randrange(1, 30000) for _ in range(rng.randrange(20, 400))]
        reqs.append(RecordedRequest(request_id=str(i), prompt_token_ids=prompt, output_token_ids=out, arrival_step=None,
                                    arrival_time=t, arrival_seq=i, max_tokens=len(out), ignore_eos=True,
                                    finish_reason="length"))
    trace = Recording(settings=BASE, source=Source(engine="synthetic", clock="wall"), requests=reqs)
    # Run once: its steps become the recording's (arrival steps, timings, digests).
    res = replay(trace, arrivals="timed", step_model=MODEL, digests=True)
    for r in reqs:
        r.arrival_step = res.requests[r.request_id].seen_step
        rr = res.requests[r.request_id]
        r.first_token_time, r.finished_time, r.token_times = rr.first_token_time, rr.finished_time, rr.token_times
        r.arrival_time = rr.arrival
    steps = RecordedSteps(step=list(res.steps), end=list(res.times), own_s=[
        MODEL.predict(p, d, c) for p, d, c in zip(res.prefill_tokens, res.decode_requests, res.context_tokens)],
        busy=[True] * res.num_steps, prefill_tokens=list(res.prefill_tokens), decode_requests=list(res.decode_requests),
        context_tokens=list(res.context_tokens), digest=list(res.digests))
    source = Source(engine="synthetic", clock="wall", notes=["made by benchmarks/whatif_sweep.py"])
    return Recording(settings=BASE, source=source, requests=reqs, steps=steps)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=10_000, help="steps the recording should have (about)")
    ap.add_argument("--processes", type=int, default=2)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    n = max(20, int(args.steps / 5.5))   # about 5.5 steps a request at these settings
    rec = synthetic(n, rate=6.0)
    made = time.perf_counter() - t0
    print(f"recording: {len(rec.requests)} requests, {len(rec.steps)} steps (made in {made:.1f} s)")
    t1 = time.perf_counter()
    report = identity(rec)
    print(f"{report.text().splitlines()[0]} ({time.perf_counter() - t1:.1f} s)")
    t2 = time.perf_counter()
    res = sweep(rec, step_model=MODEL, processes=args.processes, include_recorded=False, progress=True,
                block_size=[16, 32], num_blocks=[768, 1536], max_num_batched_tokens=[256, 512])
    wall = time.perf_counter() - t2
    print(res.table())
    alone, whole = res.scheduler_steps_per_s()
    steps = sum(r["steps"] for r in res.ok_rows)
    print(f"\nsweep: {len(res.rows)} settings, {steps:,} replayed steps in {wall:.1f} s on {args.processes} processes "
          f"({wall / GOAL_S:.2f} of the {GOAL_S:.0f} s goal)")
    print(f"vLLM's scheduler alone: {alone:,.0f} steps/s per process; the whole replay: {whole:,.0f} steps/s per "
          f"process (kvscope's share of a replay step: {1 - whole / alone:.0%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
