"""How the recorder's cost grows with a server's size (`python -m benchmarks.recorder_scale`).

A GPU server holds tens of thousands of KV blocks and hundreds of running requests; this CPU
cannot run such a model, but vLLM's scheduler runs without one (explorer.drivers.vllm.bare). For each
size, the same decode steps run on vLLM's own Scheduler and on kvscope's RecordingScheduler
with a subscriber draining its feed, alternated over rounds; printed: vLLM's scheduler step
(schedule + update, no forward), the recorder's extra wall time and CPU time per step, and the
bytes a step message carries. Compare the extra milliseconds with your server's step time
(a decode step of a real model on a GPU is tens of milliseconds).
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

from explorer.apps.machine import cpu_summary
from explorer.drivers.vllm.bare import bare_request, bare_scheduler, sampled_output

SIZES = ((2_000, 16, 512), (20_000, 128, 1024), (60_000, 256, 2048))  # blocks, running requests, prompt tokens
BLOCK_SIZE = 16


def _steps(num_blocks: int, num_running: int, prompt_len: int, steps: int, record: bool) -> dict:
    """Median ms per scheduler step once every request decodes (and the recorder's counters)."""
    import zmq
    from vllm.sampling_params import SamplingParams

    from explorer.drivers.vllm_live import protocol
    from explorer.drivers.vllm_live.recorder import RecordingScheduler
    from explorer.drivers.vllm_live.server import free_ports

    feed_port, snapshot_port = free_ports(2)  # distinct
    os.environ[protocol.ENV_FEED] = feed = f"tcp://127.0.0.1:{feed_port}"
    os.environ[protocol.ENV_SNAPSHOT] = f"tcp://127.0.0.1:{snapshot_port}"
    sched = bare_scheduler(block_size=BLOCK_SIZE, num_blocks=num_blocks, max_model_len=prompt_len + 1024,
                           max_num_batched_tokens=8192, max_num_seqs=num_running,
                           scheduler_cls=RecordingScheduler if record else None)
    sub = None
    if record:
        ctx = zmq.Context.instance()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, protocol.TOPIC)
        sub.connect(feed)
        while not sched._feed.subscribers:
            sched._feed._count_subscribers()
            time.sleep(0.01)
    params = SamplingParams(temperature=0.0, max_tokens=1000, ignore_eos=True)
    for i in range(num_running):  # distinct prompts: no prefix sharing, every block its own
        sched.add_request(bare_request(str(i), [1 + (i * 7919 + j) % 1000 for j in range(prompt_len)], params,
                                       BLOCK_SIZE))

    def token(rid: str, index: int) -> int:
        return 1 + index % 1000

    def step() -> float:
        t0 = time.perf_counter()
        out = sched.schedule()
        sched.update_from_output(out, sampled_output(sched, out, token)[0])
        t = time.perf_counter() - t0
        while sub is not None and sub.poll(0):
            sizes.append(len(sub.recv_multipart()[1]))
        return t

    sizes: list[int] = []
    while sched.waiting or any(r.num_computed_tokens < r.num_prompt_tokens for r in sched.running):
        step()
    sizes.clear()
    before = dict(sched._feed.counters) if record else {}
    times = [step() for _ in range(steps)]
    result = {"step_ms": statistics.median(times) * 1e3}
    if record:
        c = sched._feed.counters
        n = c["steps"] - before["steps"]
        result["recorder_cpu_ms"] = (c["recorder_cpu_ms"] - before["recorder_cpu_ms"]) / max(1, n)
        result["bytes"] = statistics.median(sizes) if sizes else 0
        sched.shutdown()
        sub.close(0)
    return result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30, help="decode steps timed per round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per size, plain and recorder alternated")
    args = ap.parse_args(argv)
    print(f"recorder cost vs server size ({cpu_summary()}); vLLM's scheduler without a model, block size "
          f"{BLOCK_SIZE}, every request decoding; medians of {args.rounds} rounds x {args.steps} steps", flush=True)
    print(f"{'blocks':>7} {'running':>7} {'context':>7}  {'vLLM step ms':>12} {'+ recorder ms':>13} "
          f"{'recorder CPU ms':>15} {'message KB':>10}")
    for blocks, running, prompt in SIZES:
        plain, rec, cpu, size = [], [], [], []
        for _ in range(args.rounds):
            plain.append(_steps(blocks, running, prompt, args.steps, False)["step_ms"])
            r = _steps(blocks, running, prompt, args.steps, True)
            rec.append(r["step_ms"])
            cpu.append(r["recorder_cpu_ms"])
            size.append(r["bytes"])
        base = statistics.median(plain)
        print(f"{blocks:>7} {running:>7} {prompt:>7}  {base:>12.2f} {statistics.median(rec) - base:>13.2f} "
              f"{statistics.median(cpu):>15.2f} {statistics.median(size) / 1024:>10.1f}", flush=True)


if __name__ == "__main__":
    main()
