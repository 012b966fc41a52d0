"""The live feed sends each step's changes, not the whole state: rebuilt on the client from
them (engine.report.changes.apply), the state must equal a whole snapshot built from vLLM's
objects by the full builders (explorer.drivers.vllm.records.RecordBuilder's pool_dict /
queues), at every step of random workloads with prefix hits, chunked prefills and
preemptions; every record the feed carries fits the record schema. vLLM's own Scheduler runs
them without a model (tests/oracle/vllm_side.py), with kvscope's recorder as its scheduler class."""
from __future__ import annotations

import os
import random

import pytest

from tests.oracle.vllm_available import require_vllm

SEEDS = range(24)


@pytest.fixture(scope="module")
def vllm_side():
    require_vllm()
    from tests.oracle import vllm_side

    return vllm_side


def whole_state(view, finished: list) -> dict:
    """What the recorder's snapshot held before the feed sent changes: every block and request
    dict built from scratch (its token memo copied, so building this changes nothing)."""
    records = view.records
    s, kv = records.scheduler, records.scheduler.kv_cache_manager
    memo, records._block_tokens = records._block_tokens, dict(records._block_tokens)
    try:
        running = list(s.running)
        tables = {r.request_id: list(kv.get_block_ids(r.request_id)[0]) for r in running}
        pool = records.pool_dict(running, tables)
    finally:
        records._block_tokens = memo
    return {"block_pool": pool, "queues": records.queues(running, tables, finished), "metrics": records.metrics}


def first_difference(a, b, path="") -> str | None:
    if type(a) is not type(b):
        return f"{path}: {a!r} != {b!r}"
    if isinstance(a, dict):
        for k in a.keys() | b.keys():
            d = first_difference(a.get(k), b.get(k), f"{path}.{k}")
            if d:
                return d
        return None
    if isinstance(a, list) and len(a) == len(b):
        return next((d for i, (x, y) in enumerate(zip(a, b)) if (d := first_difference(x, y, f"{path}[{i}]"))), None)
    return None if a == b else f"{path}: {a!r} != {b!r}"


def run(vllm_side, seed: int) -> dict:
    import zmq

    from engine.report import schema
    from engine.report.changes import apply
    from explorer.drivers.vllm_live import protocol
    from explorer.drivers.vllm_live.recorder import RecordingScheduler
    from explorer.drivers.vllm_live.server import free_ports
    from tests.oracle.workloads import random_workload

    w = random_workload(seed)
    feed_port, snapshot_port = free_ports(2)  # distinct: chosen together
    os.environ[protocol.ENV_FEED] = feed = f"tcp://127.0.0.1:{feed_port}"
    os.environ[protocol.ENV_SNAPSHOT] = f"tcp://127.0.0.1:{snapshot_port}"
    side = vllm_side.VllmScheduler(w, RecordingScheduler)
    sched = side.scheduler
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, protocol.TOPIC)
    sub.connect(feed)
    counts = {"steps": 0, "preempted": 0, "hits": 0, "chunks": 0}
    try:
        while not sched._feed.subscribers:  # XPUB hears the subscription on its next look
            sched._feed.count_subscribers()
            sub.poll(10)
        state = protocol.decode([sched._feed._latest], "snapshot")["snapshot"]
        last_arrival = max(r.arrival_step for r in w.requests)
        for step in range(1, 5000):
            for r in w.requests:
                if r.arrival_step == step - 1:
                    side.add(r)
            published = sched._feed.counters["published"]
            side.step()
            for _ in range(sched._feed.counters["published"] - published):  # every message, in order
                assert sub.poll(5000), f"seed {seed}: a published step did not arrive"
                msg = protocol.decode(sub.recv_multipart())
                assert schema.record_problems(msg["record"]) == [], f"seed {seed}"
                state = apply(state, msg["record"]["changes"])
                truth = whole_state(sched._kv, list(sched._kv.finished))
                for key in truth:
                    diff = first_difference(truth[key], state[key], key)
                    assert diff is None, f"seed {seed}, step {msg['record']['step']}: {diff}"
                rec = msg["record"]
                counts["steps"] += 1
                counts["preempted"] += len(rec["preempted"])
                counts["hits"] += len(rec["blocks"]["hits"])
                counts["chunks"] += sum(s["is_prefill"] and s["chunk_index"] > 0 for s in rec["scheduled"])
            if step > last_arrival and not sched.running and not sched.waiting:
                return counts
        raise AssertionError(f"seed {seed} did not finish")
    finally:
        sub.close(0)
        ctx.term()
        sched.shutdown()


def test_each_steps_changes_rebuild_the_whole_state(vllm_side):
    total = {"steps": 0, "preempted": 0, "hits": 0, "chunks": 0}
    for seed in SEEDS:
        for k, v in run(vllm_side, seed).items():
            total[k] += v
    # The workloads exercised what the changes must carry.
    assert total["preempted"] > 0 and total["hits"] > 0 and total["chunks"] > 0, total


@pytest.mark.soak
def test_each_steps_changes_rebuild_the_whole_state_soak(vllm_side):
    for seed in random.Random(7).sample(range(10_000), 300):
        run(vllm_side, seed)
