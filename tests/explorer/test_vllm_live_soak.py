"""A follower's memory stays flat once its history is full. A Session follows a recorder for
thousands of steps of a steady stream of requests; the Python memory it holds (tracemalloc),
sampled as it goes, stops growing once the history reaches its bound (steps, MiB, finished
requests), and grows all along for a Session without bounds (the same run: the measure sees
growth where there is some). In CI: vLLM's scheduler without a model, with kvscope's recorder
(tests/oracle/vllm_side.py); `-m soak`: a real vLLM server and four OpenAI clients."""
from __future__ import annotations

import statistics
import time
import tracemalloc

import pytest

from tests.oracle.vllm_available import require_vllm

STEPS = 2400
SAMPLE_EVERY = 100


def _follow(session, step, steps: int) -> list[int]:
    """Run `steps` steps (`step()` makes one), applying them as they come; the traced memory
    every SAMPLE_EVERY steps."""
    samples = []
    for k in range(1, steps + 1):
        step()
        if k % 10 == 0:
            session.poll()
        if k % SAMPLE_EVERY == 0:
            samples.append(tracemalloc.get_traced_memory()[0])
    return samples


def _flat(samples: list[int]) -> tuple[float, float]:
    """Growth from the middle third of the samples to the last third, in MiB and as a ratio."""
    third = len(samples) // 3
    middle, last = statistics.mean(samples[third:2 * third]), statistics.mean(samples[2 * third:])
    return (last - middle) / 2**20, last / middle


@pytest.mark.soak
def test_a_bounded_follower_holds_flat_memory_over_thousands_of_steps(monkeypatch):
    require_vllm()
    from explorer import Session
    from explorer.drivers.vllm.bare import bare_request, bare_scheduler, sampled_output
    from explorer.drivers.vllm_live import protocol
    from explorer.drivers.vllm_live.recorder import RecordingScheduler
    from explorer.drivers.vllm_live.server import free_port_run
    from vllm.sampling_params import SamplingParams

    results = {}
    for bounded in (True, False):
        base = free_port_run(2)
        monkeypatch.setenv(protocol.ENV_FEED, f"tcp://127.0.0.1:{base}")
        monkeypatch.delenv(protocol.ENV_SNAPSHOT, raising=False)
        sched = bare_scheduler(block_size=16, num_blocks=400, max_model_len=512, max_num_batched_tokens=512,
                               max_num_seqs=8, scheduler_cls=RecordingScheduler)
        bounds = {"max_history": 300, "max_history_mib": 8, "max_finished": 50} if bounded else \
            {"max_history": None, "max_history_mib": None, "max_finished": None}
        session = Session.attach(f"tcp://127.0.0.1:{base}", **bounds)
        pub = sched._rec.publisher
        while not pub.subscribers:
            pub.wake.set()
            time.sleep(0.005)
        params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
        n = [0]

        def step() -> None:
            while len(sched.running) + len(sched.waiting) < 8:   # a steady stream: 8 requests in flight
                n[0] += 1
                prompt = [1 + (n[0] * 31 + j) % 500 for j in range(40 + n[0] % 60)]
                sched.add_request(bare_request(f"r{n[0]}", prompt, params, 16))
            out = sched.schedule()
            sched.update_from_output(out, sampled_output(sched, out, lambda rid, i: 1 + i % 400)[0])

        tracemalloc.start()
        try:
            samples = _follow(session, step, STEPS)
            pub.flush()
            session.wait_for(lambda s: s.current.step >= pub.counters["steps"], timeout=30)
        finally:
            tracemalloc.stop()
        results[bounded] = (_flat(samples), session.history_window, n[0], session.feed_status())
        session.close()
        sched.shutdown()
    (mib, ratio), window, requests, status = results[True]
    print(f"bounded: {mib:+.2f} MiB ({ratio:.3f}x) over the last third of {STEPS} steps, {requests} requests, window "
          f"{window}; unbounded: {results[False][0][0]:+.2f} MiB ({results[False][0][1]:.3f}x)")
    assert requests > 500 and status["missed"] == 0 and status["rebased"] == 0
    assert window["dropped"] > 0 and window["entries"] <= 301 and window["mib"] <= 8, window
    assert mib < 2 and ratio < 1.05, f"a bounded follower grew {mib:.1f} MiB ({ratio:.3f}x) over the last third"
    (mib_free, _), window_free, _, _ = results[False]
    assert window_free["dropped"] == 0 and mib_free > 4 * max(mib, 0.5), (
        f"without bounds the same run grew only {mib_free:.1f} MiB: the measure would not see growth")


@pytest.mark.soak
def test_a_bounded_follower_of_a_real_server_holds_flat_memory(default_model_path):
    """Four clients keep a real server busy for thousands of steps (the issue's case: 1,739
    requests and 8,608 steps grew a notebook from 530 to 748 MiB)."""
    require_vllm()
    pytest.importorskip("openai")
    import concurrent.futures
    import threading

    from explorer import Session
    from explorer.drivers.vllm_live.server import VllmServer

    srv = VllmServer(default_model_path, num_gpu_blocks=128, max_num_batched_tokens=256, max_num_seqs=8,
                     kv_events=False, env={"OMP_NUM_THREADS": "2"})
    try:
        srv.start().wait_ready(600)
        session = Session.attach(srv.feed, snapshot_address=srv.snapshots, max_history=500, max_history_mib=16,
                                 max_finished=100)
        client = srv.client(timeout=300)
        stop = threading.Event()

        def user(u: int) -> None:
            k = 0
            while not stop.is_set():
                k += 1
                client.completions.create(model=srv.model, prompt=f"User {u} asks question {k} about ships:",
                                          max_tokens=12 + k % 20, temperature=0.0, extra_body={"ignore_eos": True})

        tracemalloc.start()
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            for u in range(4):
                pool.submit(user, u)
            samples = []
            while session.current.step < STEPS:
                session.poll()
                samples.append(tracemalloc.get_traced_memory()[0])
                time.sleep(1.0)
            stop.set()
        tracemalloc.stop()
        mib, ratio = _flat(samples)
        window = session.history_window
        assert window["dropped"] > 0 and session.feed_status()["missed"] == 0
        assert mib < 4 and ratio < 1.05, f"{mib:.1f} MiB ({ratio:.3f}x) over the last third of {STEPS} steps"
        session.close()
    finally:
        srv.stop()
