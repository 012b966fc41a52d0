"""How the recorder's cost grows with a server's size (`python -m benchmarks.recorder_scale`).

A GPU server holds tens of thousands of KV blocks and hundreds of running requests; this CPU
cannot run such a model, but vLLM's scheduler runs without one (explorer.drivers.vllm.bare). For each
size, the same decode steps run on vLLM's own Scheduler and on kvscope's RecordingScheduler
with a subscriber draining its feed (and checking its sequence numbers), alternated over
rounds. Between a step's schedule and its update the scheduler thread sleeps `--forward-ms`,
as vLLM's engine core waits for the model (the GIL is free then, as it is while a GPU runs);
`--forward-ms 0` is the worst case, the recorder's thread and vLLM's competing for the GIL.
Printed per step: vLLM's scheduler step (schedule + update, the wait left out), what the
recorder added to it (its pool hooks included: the scheduler thread's whole difference), and
that difference split by the scheduler thread's CPU clock into the time it stood still (its
wall less its CPU, a mean over the steps: waiting for the GIL the recorder's thread held) and
the time it ran (a difference of medians); the recorder's
CPU on the scheduler thread by its own count and on its own thread (the GIL time it takes
there), libzmq's I/O thread of the recorder's context (by that thread's CPU clock), the CPU of
all of it together, the bytes a step message carries, and the gaps the subscriber saw.

Decode-only steps with nothing arriving are where the recorder's mirror defers work: the best
case. `--churn N` makes every timed step one of change: N running requests end (a stop token)
and N new ones arrive and are prefilled, and halfway through the window a second client joins
(subscribes and asks for a snapshot, which the recorder's thread builds). `--async` drives
vLLM's AsyncScheduler as a GPU server's engine core does (step N+1 scheduled before step N's
update), with kvscope's recorder subclassing it. `--hooks-only` measures the part of the
recorder that runs inside vLLM's block-pool calls alone: the same steps on vLLM's Scheduler
with and without the recorder's pool hooks (explorer/drivers/vllm/pool_notes.py), no thread, no feed.
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import threading
import time

from explorer.apps.machine import cpu_summary
from explorer.drivers.vllm.bare import bare_request, bare_scheduler, sampled_output

SIZES = ((2_000, 16, 512), (20_000, 128, 1024), (60_000, 256, 2048))  # blocks, running requests, prompt tokens
BLOCK_SIZE = 16


class Drain:
    """A subscriber that reads every message as it comes (its size, its sequence number)."""

    def __init__(self, feed: str) -> None:
        import zmq

        from explorer.drivers.vllm_live import protocol

        self.protocol = protocol
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, protocol.TOPIC)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.connect(feed)
        self.sizes: list[int] = []
        self.seqs: list[int] = []
        self.running = True
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while self.running:
            if self.sock.poll(50):
                frames = self.sock.recv_multipart()
                self.sizes.append(len(frames[1]))
                self.seqs.append(self.protocol.decode_feed(frames).seq)

    def gaps(self) -> int:
        return sum(b - a - 1 for a, b in zip(self.seqs, self.seqs[1:]))

    def close(self) -> None:
        self.running = False
        self.thread.join(timeout=2)
        self.sock.close(0)
        self.ctx.term()


STOP = 2  # the stop token a churned request ends with (decoded tokens are 3 and up)


def _zmq_threads() -> set[int]:
    """The ids of this process's libzmq background threads (ZMQbg/IO/..., ZMQbg/Reaper)."""
    out = set()
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                if f.read().startswith("ZMQbg"):
                    out.add(int(task))
        except OSError:
            pass
    return out


def _thread_cpu_s(tids: set[int]) -> float:
    """CPU seconds of the threads `tids` of this process (Linux's per-thread CPU clocks)."""
    total = 0.0
    for tid in tids:
        try:
            total += time.clock_gettime(((~tid) << 3) | 6)  # CPUCLOCK_SCHED | CPUCLOCK_PERTHREAD
        except OSError:
            pass  # the thread ended
    return total


def _join(snapshot: str, feed: str) -> Drain:
    """A second client: it subscribes, then asks for a snapshot (the recorder's thread builds it)."""
    import zmq

    from explorer.drivers.vllm_live import protocol

    late = Drain(feed)
    req = late.ctx.socket(zmq.REQ)
    req.connect(snapshot)
    req.send(protocol.encode({"schema": protocol.SCHEMA_VERSION, "want": "snapshot"}))
    req.recv()
    req.close(0)
    return late


def _steps(num_blocks: int, num_running: int, prompt_len: int, steps: int, record: bool, forward_s: float,
           churn: int = 0, async_: bool = False, hooks: bool = False) -> dict:
    """Median ms per scheduler step once every request decodes (and the recorder's counters);
    `hooks`: vLLM's Scheduler with the recorder's pool hooks alone."""
    from vllm.sampling_params import SamplingParams

    from explorer.drivers.vllm_live import protocol
    from explorer.drivers.vllm_live.recorder import AsyncRecordingScheduler, RecordingScheduler
    from explorer.drivers.vllm_live.server import free_ports

    feed_port, snapshot_port = free_ports(2)  # distinct
    os.environ[protocol.ENV_FEED] = feed = f"tcp://127.0.0.1:{feed_port}"
    os.environ[protocol.ENV_SNAPSHOT] = snapshot = f"tcp://127.0.0.1:{snapshot_port}"
    before_zmq = _zmq_threads()
    recorder_cls = AsyncRecordingScheduler if async_ else RecordingScheduler
    sched = bare_scheduler(block_size=BLOCK_SIZE, num_blocks=num_blocks, max_model_len=prompt_len + 1024,
                           max_num_batched_tokens=8192, max_num_seqs=num_running,
                           scheduler_cls=recorder_cls if record else None, async_scheduling=async_)
    if hooks:
        from explorer.drivers.vllm.pool_notes import PoolNotes

        PoolNotes(sched.kv_cache_manager.block_pool)
    recorder_zmq = _zmq_threads() - before_zmq   # the recorder's context (the subscribers' come later)
    # vLLM's engine core freezes its start-up heap once its scheduler is built (freeze_gc_heap):
    # the pool's blocks are then out of the collector's reach. Without it, whichever thread
    # happens to trigger a full collection pays for walking every block.
    gc.collect()
    gc.freeze()
    drain = None
    if record:
        drain = Drain(feed)
        pub = sched._rec.publisher
        while not pub.subscribers:
            pub.wake.set()
            time.sleep(0.01)
    params = SamplingParams(temperature=0.0, max_tokens=1000, ignore_eos=True, stop_token_ids=[STOP])
    made = [0]

    def arrive() -> None:  # distinct prompts: no prefix sharing, every block its own
        i = made[0]
        made[0] += 1
        sched.add_request(bare_request(str(i), [3 + (i * 7919 + j) % 1000 for j in range(prompt_len)], params,
                                       BLOCK_SIZE))

    for _ in range(num_running):
        arrive()
    ending: set[str] = set()

    def token(rid: str, index: int) -> int:
        return STOP if rid in ending else 3 + index % 1000

    pending: list = []  # async: the step scheduled ahead of the one being updated

    def step(churning: bool = False) -> tuple[float, float]:
        """The scheduler thread's wall in schedule + update, and how much of it it ran (its CPU clock)."""
        if churning:   # N decoding requests end in this step, N new ones arrive before it
            decoding = [r.request_id for r in sched.running if r.num_computed_tokens >= r.num_prompt_tokens]
            ending.clear()
            ending.update(decoding[:churn])
            for _ in range(churn):
                arrive()
        t0, c0 = time.perf_counter(), time.thread_time()
        out = sched.schedule()
        t1, c1 = time.perf_counter(), time.thread_time()
        pending.append(out)
        if async_ and len(pending) < 2:
            return t1 - t0, c1 - c0   # vLLM's engine core schedules the next step before it waits for this one
        out = pending.pop(0)
        runner_out = sampled_output(sched, out, token)[0]
        if forward_s:
            time.sleep(forward_s)   # the model runs; vLLM's scheduler thread waits, the GIL is free
        t2, c2 = time.perf_counter(), time.thread_time()
        sched.update_from_output(out, runner_out)
        return (t1 - t0) + (time.perf_counter() - t2), (c1 - c0) + (time.thread_time() - c2)

    while sched.waiting or any(r.num_computed_tokens < r.num_prompt_tokens for r in sched.running):
        step()
    result: dict = {}
    late = None
    if record:
        pub.flush(60)
        before = dict(pub.counters)
        zmq_before = _thread_cpu_s(recorder_zmq)
        first = len(drain.sizes)
    times, cpus = [], []
    for k in range(steps):
        if churn and record and k == steps // 2:
            late = _join(snapshot, feed)   # a client joins mid-run (its own wait is not a step's)
        wall, cpu = step(churning=churn > 0)
        times.append(wall)
        cpus.append(cpu)
    result["step_ms"] = statistics.median(times) * 1e3
    result["cpu_ms"] = statistics.median(cpus) * 1e3
    # The scheduler thread's wall that it did not run: waiting for the GIL (or for a core). A
    # mean, not a median: a rare long hold of the GIL (the recorder applying a run of bodies)
    # stalls the server as much as a short one at every step.
    result["wait_ms"] = statistics.fmean(w - c for w, c in zip(times, cpus)) * 1e3
    if record:
        pub.flush(60)
        end = time.monotonic() + 30
        while len(drain.seqs) < pub.counters["published"] and time.monotonic() < end:
            time.sleep(0.01)
        c = pub.counters
        n = max(1, c["steps"] - before["steps"])
        result["sched_cpu_ms"] = (c["recorder_cpu_ms"] - before["recorder_cpu_ms"]) / n
        result["thread_cpu_ms"] = (c["publisher_cpu_ms"] - before["publisher_cpu_ms"]) / n
        result["zmq_cpu_ms"] = (_thread_cpu_s(recorder_zmq) - zmq_before) * 1e3 / n
        result["bytes"] = statistics.median(drain.sizes[first:]) if drain.sizes[first:] else 0
        result["gaps"] = drain.gaps() + (c["published"] - len(drain.seqs))
        sched.shutdown()
        drain.close()
        if late is not None:
            late.close()
    gc.unfreeze()  # the next size's start-up heap is frozen on its own
    return result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # 256: the recorder's mirror holds up to 256 decode steps before it settles them (mirror.py,
    # _DEFER_AT_MOST); a window that long pays for one settle, as a server does every 256 steps.
    ap.add_argument("--steps", type=int, default=256, help="decode steps timed per round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per size, plain and recorder alternated")
    ap.add_argument("--forward-ms", type=float, default=10.0,
                    help="the model's step the scheduler thread waits for between schedule and update (0: none)")
    ap.add_argument("--churn", type=int, default=0,
                    help="requests that end and arrive in every timed step, and a client joining midway (0: none)")
    ap.add_argument("--async", dest="async_", action="store_true", help="vLLM's AsyncScheduler (a GPU server's)")
    ap.add_argument("--sizes", default=None, help="only these sizes, by blocks: e.g. 60000")
    ap.add_argument("--hooks-only", action="store_true",
                    help="only the recorder's block-pool hooks on vLLM's Scheduler (no thread, no feed)")
    args = ap.parse_args(argv)
    if args.hooks_only:
        _hooks_only(args)
        return
    sizes = [s for s in SIZES if args.sizes is None or str(s[0]) in args.sizes.split(",")]
    what = (f"{args.churn} requests ending and {args.churn} arriving every step, a client joining midway"
            if args.churn else "every request decoding")
    print(f"recorder cost vs server size ({cpu_summary()}); vLLM's {'Async' if args.async_ else ''}Scheduler "
          f"without a model, block size {BLOCK_SIZE}, {what}, {args.forward_ms:g} ms forward wait; medians of "
          f"{args.rounds} rounds x {args.steps} steps", flush=True)
    print(f"{'blocks':>7} {'running':>7} {'context':>7}  {'vLLM step ms':>12} {'+ recorder ms':>13} "
          f"{'+ sched wait ms':>15} {'+ sched CPU ms':>14} {'its own count ms':>16} {'recorder thread CPU ms':>22} "
          f"{'zmq I/O CPU ms':>14} {'all CPU ms':>10} {'message KB':>10} {'gaps':>5}")
    for blocks, running, prompt in sizes:
        plain, rec, sched_cpu, thread_cpu, zmq_cpu, size, gaps = [], [], [], [], [], [], 0
        plain_cpu, rec_cpu, plain_wait, rec_wait = [], [], [], []
        for _ in range(args.rounds):
            p = _steps(blocks, running, prompt, args.steps, False, args.forward_ms / 1e3, args.churn, args.async_)
            plain.append(p["step_ms"])
            plain_cpu.append(p["cpu_ms"])
            plain_wait.append(p["wait_ms"])
            r = _steps(blocks, running, prompt, args.steps, True, args.forward_ms / 1e3, args.churn, args.async_)
            rec.append(r["step_ms"])
            rec_cpu.append(r["cpu_ms"])
            rec_wait.append(r["wait_ms"])
            sched_cpu.append(r["sched_cpu_ms"])
            thread_cpu.append(r["thread_cpu_ms"])
            zmq_cpu.append(r["zmq_cpu_ms"])
            size.append(r["bytes"])
            gaps += r["gaps"]
        base, added = statistics.median(plain), statistics.median(rec) - statistics.median(plain)
        waited = statistics.median(rec_wait) - statistics.median(plain_wait)
        ran = statistics.median(rec_cpu) - statistics.median(plain_cpu)
        # All the recorder's CPU: the scheduler thread's CPU difference (its hooks and its own
        # count alike), its thread's, libzmq's; the scheduler thread's wait is no CPU, but the
        # time it stood still while the recorder's thread held the GIL.
        together = max(ran, 0.0) + statistics.median(thread_cpu) + statistics.median(zmq_cpu)
        print(f"{blocks:>7} {running:>7} {prompt:>7}  {base:>12.2f} {added:>13.2f} {waited:>15.2f} {ran:>14.2f} "
              f"{statistics.median(sched_cpu):>16.3f} {statistics.median(thread_cpu):>22.3f} "
              f"{statistics.median(zmq_cpu):>14.3f} {together:>10.3f} "
              f"{statistics.median(size) / 1024:>10.1f} {gaps:>5}", flush=True)


def _hooks_only(args: argparse.Namespace) -> None:
    sizes = [s for s in SIZES if args.sizes is None or str(s[0]) in args.sizes.split(",")]
    print(f"the recorder's block-pool hooks alone ({cpu_summary()}); vLLM's Scheduler without a model, block size "
          f"{BLOCK_SIZE}, {args.churn} requests ending and arriving every step, medians of {args.rounds} rounds x "
          f"{args.steps} steps, plain and hooked alternated", flush=True)
    print(f"{'blocks':>7} {'running':>7} {'context':>7}  {'vLLM step ms':>12} {'+ hooks ms':>10}")
    for blocks, running, prompt in sizes:
        plain, hooked = [], []
        for k in range(args.rounds):
            for with_hooks in ((False, True) if k % 2 == 0 else (True, False)):
                ms = _steps(blocks, running, prompt, args.steps, False, args.forward_ms / 1e3, args.churn,
                            args.async_, hooks=with_hooks)["step_ms"]
                (hooked if with_hooks else plain).append(ms)
        base = statistics.median(plain)
        print(f"{blocks:>7} {running:>7} {prompt:>7}  {base:>12.2f} {statistics.median(hooked) - base:>10.2f}",
              flush=True)


if __name__ == "__main__":
    main()
