"""The live feed against vLLM's own state, in this process: vLLM's Scheduler without a model
(tests/oracle/vllm_side.py) with kvscope's recorder as its scheduler class, followed by the
real client, whose records a Session would apply. tests/oracle/live_differential.py compares
every record and every state with vLLM's objects (and the feed with the schema); here it runs
24 synchronous workloads and 12 under vLLM's AsyncScheduler, 16 and 10 with a sliding-window
KV cache group beside the full one, shows that each planted fault is caught, then the two places
where the records used to part from vLLM's state, one by one."""
from __future__ import annotations

import random
import time

import pytest

from tests.oracle.live_differential import PLANT_GROUPS, PLANTED
from tests.oracle.vllm_available import require_vllm

SEEDS = range(24)


@pytest.fixture(scope="module")
def harness():
    require_vllm()
    from tests.oracle import live_differential

    return live_differential


def test_each_record_and_state_equal_vllms_on_random_workloads(harness):
    from tests.oracle.workloads import random_workload

    total = harness.Counts()
    for seed in SEEDS:
        counts, failure = harness.run_workload(random_workload(seed), seed, async_=False)
        assert failure is None, f"seed {seed}: {failure}"
        total.add(counts)
    # The workloads exercised what the feed must carry.
    assert total.preemptions and total.hits and total.chunks and total.joined, total.summary()
    assert total.aborts_in_flight and total.aborts_between, total.summary()


def test_under_async_scheduling_each_record_and_state_equal_vllms(harness):
    # A GPU server's engine core schedules step N+1 before it updates step N (AsyncScheduler).
    from tests.oracle.workloads import random_workload

    total = harness.Counts()
    for seed in range(12):
        counts, failure = harness.run_workload(random_workload(seed), seed, async_=True)
        assert failure is None, f"seed {seed} (async): {failure}"
        total.add(counts)
    assert total.preemptions and total.hits and total.chunks, total.summary()


@pytest.mark.parametrize(("groups", "async_"), [("full+sliding", False), ("full+sliding", True),
                                               ("sliding+full", False)])
def test_with_a_sliding_window_group_every_groups_tables_equal_vllms(harness, groups, async_):
    # A full-attention and a sliding-window KV cache group over one pool (as a Gemma 3 server has;
    # "sliding+full": in vLLM's order for it, the sliding group first): each running request's table
    # in the sliding group (null blocks where tokens left the window), its blocks' owners and
    # tokens, in every state the client holds; the plain tables stay the full group's.
    total = harness.Counts()
    # 182 under async: a request resumed, preempted again and aborted while its preemption's step
    # was in flight (the mirror forgot it before that step's record read it, and the record was lost).
    for seed in range(12) if not async_ else [*range(8), 182]:
        counts, failure = harness.run_workload(harness.live_workload(seed, groups), seed, async_=async_)
        assert failure is None, f"seed {seed} ({groups}, {'async' if async_ else 'sync'}): {failure}"
        total.add(counts)
    assert total.window_nulls and total.hits and total.chunks, total.summary()


# The seed a search from 0 first catches a fault at, where that takes long: an empty step that
# drops its events shows first in workload 30 (26 s of workloads before it). The search starts there.
FIRST_CATCH = {"empty-step-drops-events": 30}


@pytest.mark.parametrize("bug", PLANTED)
def test_a_planted_fault_in_the_recorder_is_caught(harness, bug):
    from tests.oracle.workloads import random_workload

    groups = PLANT_GROUPS.get(bug, "full")
    start = FIRST_CATCH.get(bug, 0)
    with harness.planted(bug):
        caught = next((seed for seed in range(start, start + 40)
                       if harness.run_workload(random_workload(seed, groups), seed, async_=True)[1]), None)
    assert caught is not None, f"{bug}: no workload of 40 from seed {start} told the recorder from vLLM"


@pytest.mark.soak
def test_each_record_and_state_equal_vllms_soak(harness):
    from tests.oracle.workloads import random_workload

    for seed in random.Random(7).sample(range(10_000), 300):
        _, failure = harness.run_workload(random_workload(seed), seed, async_=False)
        assert failure is None, f"seed {seed}: {failure}"


# -- the two partings, one at a time -----------------------------------------------------------------
def _scheduler(harness, async_: bool, block_size: int = 4):
    """Two requests sharing half a prompt, in blocks of `block_size` (a multiple of 32 where a
    recording is replayed as a CPU server's: vLLM's CPU attention takes no other)."""
    from tests.oracle.workloads import OracleRequest, Workload

    k = block_size // 4
    prompt = tuple(range(1, 40 * k + 1))
    w = Workload(block_size=block_size, num_blocks=40, max_num_batched_tokens=64 * k, max_num_seqs=4,
                 max_model_len=128 * k, enable_prefix_caching=True, enable_chunked_prefill=True,
                 scheduler_reserve_full_isl=True,
                 requests=(OracleRequest("a", prompt, 30, 0),
                           OracleRequest("b", prompt[:20 * k] + (7,) * 10 * k, 30, 0)))
    run = harness.Run(w, seed=0, async_=async_)
    for r in w.requests:
        run.side.add(r)
    return run


def _update(run, out) -> None:
    """vLLM's update of `out`, each request that completed its tokens sampling token 5."""
    from vllm.v1.outputs import ModelRunnerOutput

    ids = list(out.num_scheduled_tokens)
    run.s.update_from_output(out, ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                                    sampled_token_ids=[[5] for _ in ids]))


def _step(run) -> None:
    _update(run, run.s.schedule())


def _received(src, pub) -> list[dict]:
    """Every record the recorder published, once the client holds them, as dicts."""
    assert pub.flush()
    end = time.monotonic() + 10
    while src.counters["received"] < pub.counters["published"] and time.monotonic() < end:
        time.sleep(0.005)
    return [src.step().to_dict() for _ in range(src.pending())]


def _joined(run):
    """A client (LiveSource) joined to `run`'s recorder: (the source, the recorder's publisher,
    the state of the snapshot it joined with)."""
    from explorer.drivers.vllm_live.client import LiveSource

    src = LiveSource(run.feed, snapshot_address=run.snapshots, timeout=5)
    pub = run.s._rec.publisher
    while not pub.subscribers:
        pub.wake.set()
    return src, pub, src.snapshot().to_dict()


def test_the_last_step_before_the_server_goes_idle_is_published_without_another_schedule(harness):
    """The publisher is woken by the schedule after an update (its thread then stays out of the
    scheduler thread's way); a server that schedules nothing more still has its last step
    published, by the publisher's own periodic look."""
    run = _scheduler(harness, async_=False)
    src, pub, _ = _joined(run)
    try:
        _step(run)
        end = time.monotonic() + 5
        while src.counters["received"] < 1 and time.monotonic() < end:   # no flush, no schedule
            time.sleep(0.005)
        assert pub.counters["published"] == 1 and src.counters["received"] == 1
        assert src.step().to_dict()["step"] == 1
    finally:
        src.close()
        run.close()


@pytest.mark.parametrize("async_", [False, True], ids=["sync", "async"])
def test_the_first_step_after_a_client_joins_carries_its_batch(harness, async_):
    from explorer.drivers.vllm_live.client import LiveSource

    run = _scheduler(harness, async_)
    try:
        for _ in range(4):   # nobody listens: the steps are counted, not sent
            _step(run)
        pub = run.s._rec.publisher
        assert pub.flush() and pub.counters["unobserved"] >= 3 and pub.counters["published"] == 0
        src = LiveSource(run.feed, snapshot_address=run.snapshots, timeout=5)
        try:
            while not pub.subscribers:
                pub.wake.set()
            out = run.s.schedule()
            tables = {r: list(run.s.kv_cache_manager.get_block_ids(r)[0]) for r in out.num_scheduled_tokens}
            _update(run, out)
            (rec,) = _received(src, pub)
            batch = rec["batch"]
            assert rec["batch_source"] == "scheduler" and len(batch["block_tables"]) == len(rec["scheduled"]) == 2
            for row, s in enumerate(rec["scheduled"]):
                b, n = s["num_computed_before"], s["num_tokens"]
                lo, hi = batch["query_start_loc"][row:row + 2]
                assert batch["positions"][lo:hi] == list(range(b, b + n))
                table = tables[s["request_id"]]
                assert batch["slot_mapping"][lo:hi] == [table[p // 4] * 4 + p % 4 for p in range(b, b + n)]
        finally:
            src.close()
    finally:
        run.close()


@pytest.mark.parametrize("async_", [False, True], ids=["sync", "async"])
def test_an_abort_while_its_step_runs_frees_its_blocks_in_that_step(harness, async_):
    from vllm.v1.request import RequestStatus

    from engine.report.changes import apply

    run = _scheduler(harness, async_)
    src, pub, state = _joined(run)
    try:
        for _ in range(3):
            _step(run)
        for rec in _received(src, pub):
            state = apply(state, rec["changes"])
        out = run.s.schedule()                       # the step starts ...
        held = list(run.s.kv_cache_manager.get_block_ids("b")[0])
        run.s.finish_requests("b", RequestStatus.FINISHED_ABORTED)   # ... b is aborted while it runs ...
        _update(run, out)                            # ... and ends
        (rec,) = _received(src, pub)   # the abort is that step's: no record of its own
        state = apply(state, rec["changes"])
        assert "b" in rec["finished"]
        assert set(held) <= set(rec["blocks"]["freed"]) | set(run.s.kv_cache_manager.get_block_ids("a")[0])
        blocks = state["block_pool"]["blocks"]
        pool = run.s.kv_cache_manager.block_pool.blocks
        for b in held:   # freed in this very step: the refcount vLLM has, and b owns none
            assert blocks[b]["ref_count"] == pool[b].ref_cnt and "b" not in blocks[b]["owners"]
        assert [r["finish_reason"] for r in state["queues"]["finished"] if r["request_id"] == "b"] == ["abort"]
    finally:
        src.close()
        run.close()


@pytest.mark.parametrize("async_", [False, True], ids=["sync", "async"])
def test_without_token_ids_the_feed_carries_counts_and_block_ids_only(harness, monkeypatch, async_):
    from engine.report import schema
    from engine.report.changes import apply
    from explorer.drivers.vllm_live import protocol
    from explorer.ui.captions import step_caption

    monkeypatch.setenv(protocol.ENV_TOKENS, "0")
    run = _scheduler(harness, async_=async_)
    src, pub, state = _joined(run)
    try:
        if async_:   # as vLLM's engine core runs AsyncScheduler: the next step scheduled before this one's update
            out = run.s.schedule()
            for _ in range(6):
                ahead = run.s.schedule()
                _update(run, out)
                out = ahead
            _update(run, out)
        else:
            for _ in range(6):
                _step(run)
        records = _received(src, pub)
        for rec in records:
            assert schema.record_problems(rec) == []
            state = apply(state, rec["changes"])
            assert rec["batch"]["input_ids"] == [] and all(s["token_id"] is None for s in rec["sampled"].values())
            ahead = rec["scheduled_ahead"]
            if ahead and ahead["placeholders"]:   # each placeholder is there, its token unknown, and said so
                assert set(ahead["placeholders"].values()) == {schema.UNKNOWN_TOKEN}
                assert "filled once it landed (the feed carries no token ids)" in step_caption(rec, state)
        assert any(rec["scheduled_ahead"] and rec["scheduled_ahead"]["placeholders"] for rec in records) == async_
        assert schema.snapshot_problems(state) == [] and src.tokens_left_out
        assert src.snapshot().to_dict() == state
        vllm = {r.request_id: r for r in run.s.running}
        for r in state["queues"]["running"]:   # counts and block tables stay, token ids go
            assert (r["prompt_token_ids"], r["output_token_ids"]) == ([], [])
            assert (r["num_prompt_tokens"], r["num_output_tokens"]) == (vllm[r["request_id"]].num_prompt_tokens,
                                                                        vllm[r["request_id"]].num_output_tokens)
            assert r["block_table"] == list(run.s.kv_cache_manager.get_block_ids(r["request_id"])[0])
        assert all(b["token_ids"] == [] for b in state["block_pool"]["blocks"])
        assert any(rec["batch"]["slot_mapping"] for rec in records)
    finally:
        src.close()
        run.close()


def test_a_recorder_that_cannot_bind_logs_one_error_and_its_engine_core_schedules(harness, monkeypatch):
    """Its feed's port taken (a second server, a rank whose ports + 2r are in use): one error
    in vLLM's log, no feed, and vLLM schedules every request as it would without kvscope."""
    import logging
    import socket

    from explorer.drivers.vllm_live import protocol
    from explorer.drivers.vllm_live.recorder import RecordingScheduler
    from tests.oracle.vllm_side import VllmScheduler
    from tests.oracle.workloads import random_workload

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    monkeypatch.setenv(protocol.ENV_FEED, f"tcp://127.0.0.1:{port}")
    monkeypatch.delenv(protocol.ENV_SNAPSHOT, raising=False)
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # vLLM's logger does not propagate to pytest's handlers
    logger = logging.getLogger("vllm.kvscope_recorder")
    logger.addHandler(handler)
    try:
        w = random_workload(3)
        side = VllmScheduler(w, RecordingScheduler)
        assert [r.levelname for r in records] == ["ERROR"] and f"tcp://127.0.0.1:{port}" in records[0].getMessage()
        assert side.scheduler._rec is None
        for r in w.requests:
            side.add(r)
        steps = 0
        while side.scheduler.has_requests() and steps < 5000:
            side.step()
            steps += 1
        assert steps > 0 and not side.scheduler.running and not side.scheduler.waiting
        assert {r.request_id for r in w.requests} <= set(side.requests_seen)
    finally:
        logger.removeHandler(handler)
        taken.close()


def test_a_step_the_recorder_cannot_record_stops_it_out_loud_and_vllm_schedules_on(harness, monkeypatch):
    """A bug turning one hand-over into a body: the recorder never publishes a later step on a
    state that no longer matches the server's, nor answers a snapshot from it. Its subscribers
    get a 'stopped' message whose seq skips the lost step (counted as missed, its words in the
    notes), a client joining later gets the same words, and vLLM schedules every request."""
    from explorer.drivers.vllm_live.client import LiveSource

    run = _scheduler(harness, False)
    src, pub, _ = _joined(run)
    try:
        _step(run)
        assert len(_received(src, pub)) == 1
        real = type(pub)._body
        calls = []

        def broken(self, handover):
            calls.append(1)
            if len(calls) == 1:
                raise TypeError("planted: a field the recorder cannot read")
            return real(self, handover)

        monkeypatch.setattr(type(pub), "_body", broken)
        steps = 1
        while run.s.has_requests() and steps < 200:
            _step(run)
            steps += 1
        assert not run.s.running and not run.s.waiting            # vLLM went on as without kvscope
        assert pub.flush() and pub.stopped is not None and "TypeError: planted" in pub.stopped
        assert pub.counters["errors"] == 1 and pub.counters["unrecorded"] == steps - 2
        assert pub.counters["published"] == 1                     # nothing after the lost step
        end = time.monotonic() + 10
        while src.stopped is None and time.monotonic() < end:
            time.sleep(0.01)
        assert src.stopped == pub.stopped and src.status()["missed"] == 1 and src.notes[-1] == pub.stopped
        with pytest.raises(ValueError, match=r"could not record step seq 2 .*restart it to follow it again"):
            LiveSource(run.feed, snapshot_address=run.snapshots, timeout=5)
    finally:
        src.close()
        run.close()


@pytest.mark.parametrize("async_", [False, True], ids=["sync", "async"])
def test_an_abort_between_steps_goes_through_the_recording_and_identity(harness, async_, tmp_path):
    """A request aborted between two steps (a client gone while nothing ran) reaches a live
    Session as a feed step with no schedule; the Session's recording replays through vLLM's own
    scheduler with 0 differences, the abort taken before the same step."""
    from vllm.v1.request import RequestStatus

    from explorer import Session
    from explorer.core.recording import Recording, RecordingWriter, save_recording
    from explorer.whatif import identity

    run = _scheduler(harness, async_, block_size=32)
    live = Session.attach(run.feed, snapshot_address=run.snapshots, timeout=5)
    followed = RecordingWriter(tmp_path / "followed.kvrec")   # as `explorer attach --record` writes
    followed.follow(live)
    live.follow(0.01)
    pub = run.s._rec.publisher
    try:
        while not pub.subscribers:
            pub.wake.set()
        for _ in range(4):
            _step(run)
        run.s.finish_requests("b", RequestStatus.FINISHED_ABORTED)   # between steps: nothing in flight
        for _ in range(3):
            _step(run)
        assert pub.flush() and live.wait_for(lambda s: s.feed_status()["seq"] >= pub.seq, timeout=10)
        run.s.finish_requests("a", RequestStatus.FINISHED_ABORTED)   # ... and the last one, then no step
        assert pub.flush()
        assert live.wait_for(lambda s: s.feed_status()["seq"] >= pub.seq, timeout=10)
        assert live.current.step == pub.counters["steps"] - 2   # the aborts' bodies are no steps
        assert [r["request_id"] for r in live.current.snapshot["queues"]["finished"]] == ["b", "a"]
        live.pause()
        rec = Recording.load(save_recording(live, tmp_path / "abort.kvrec"))
        by_follower = Recording.load(followed.close())
    finally:
        live.close()
        run.close()
    for r in (rec, by_follower):
        assert {x.request_id: x.finish_reason for x in r.requests} == {"a": "abort", "b": "abort"}
        assert not any(x.aborted_during_step for x in r.requests)
        assert r.request("b").aborted_before_step == 5 and r.request("a").aborted_before_step == 8
    assert by_follower.steps.digest == rec.steps.digest
    report = identity(rec, live.history)
    assert report.ok, report.text()
    assert identity(rec).ok and identity(by_follower).ok
