"""Identity: a recording replayed through vLLM's own scheduler at its own settings reproduces
every recorded step; planted faults (an arrival one step late, a wrong block size) break it."""
from __future__ import annotations

import dataclasses

import pytest

from explorer.core.recording import Recording, save_recording
from explorer.whatif import identity

from .conftest import drive

pytestmark = pytest.mark.slow


def test_kvscope_engine_recording_replays_with_0_differences(kvscope_run):
    s, rec, _ = kvscope_run
    report = identity(rec, s.history)           # field by field against the Session's history
    assert report.ok and report.num_steps == len(s.history) - 1, report.text()
    assert identity(rec).ok                     # and against the file's own digests
    res = report.replay
    assert res.preemptions == s.metrics["summary"]["num_preemptions"] > 0
    # kvscope's counter takes every admission's hits: first admissions and re-admissions together
    assert res.hit_tokens + res.resumed_hit_tokens == s.metrics["summary"]["prefix_cache_hits"] > 0


def _late(rec: Recording, rid: str) -> Recording:
    reqs = [dataclasses.replace(r, arrival_step=r.arrival_step + 1) if r.request_id == rid else r for r in rec.requests]
    return dataclasses.replace(rec, requests=reqs)


def test_planted_fault_an_arrival_one_step_late(kvscope_run):
    s, rec, _ = kvscope_run
    late = _late(rec, "3")                      # recorded: seen by step 4's schedule()
    for report in (identity(late, s.history), identity(late)):
        assert not report.ok and report.first_step == 4, report.text()


def test_planted_fault_a_wrong_block_size(kvscope_run):
    s, rec, _ = kvscope_run
    wrong = dataclasses.replace(rec, settings=rec.settings.replace(block_size=32, num_blocks=10))
    report = identity(wrong, s.history)
    assert not report.ok and {d.what for d in report.differences} >= {"tables"}, report.text()
    assert not identity(wrong).ok


@pytest.fixture(scope="module")
def vllm_run(default_model_path, tmp_path_factory):
    """The same workload on vLLM 0.32 in this process (the default model; block size 32, as
    vLLM's CPU backend needs)."""
    from tests.oracle.vllm_available import require_vllm

    require_vllm()
    from explorer import Session

    s = Session(engine="vllm", model=str(default_model_path), block_size=32, num_kv_blocks=10,
                max_num_batched_tokens=48, max_num_seqs=4, max_model_len=256)
    try:
        drive(s)
        path = save_recording(s, tmp_path_factory.mktemp("rec") / "vllm.kvrec.gz")
        yield s, Recording.load(path)
    finally:
        s._driver.shutdown()


def test_vllm_in_process_recording_replays_with_0_differences(vllm_run):
    s, rec = vllm_run
    assert rec.source.engine.startswith("vLLM") and rec.source.kv_bytes_per_block
    summary = s.metrics["summary"]
    assert summary["num_preemptions"] > 0 and summary["prefix_cache_hits"] > 0
    report = identity(rec, s.history)
    assert report.ok and report.num_steps == len(s.history) - 1, report.text()
    assert identity(rec).ok
    late = _late(rec, "3")
    assert identity(late).first_step == 4



def test_a_what_if_held_to_the_recorded_arrival_steps_equals_a_real_run_there(vllm_run, default_model_path):
    """vLLM in process at another setting (a larger pool, a larger budget), the same workload with
    each request added (and the victim aborted) before the same step as in the recorded run: the
    what-if replay of the recording at that setting makes every decision of the real run, step
    by step; and the replay at a setting the run did not have (the budget one token off) does not."""
    from explorer import Session
    from explorer.whatif import variant

    s, rec = vllm_run
    b = Session(engine="vllm", model=str(default_model_path), block_size=32, num_kv_blocks=16,
                max_num_batched_tokens=64, max_num_seqs=4, max_model_len=256)
    try:
        drive(b)
        report = identity(rec, b.history, at=variant(rec, num_blocks=16, max_num_batched_tokens=64))
        off = identity(rec, b.history, at=variant(rec, num_blocks=16, max_num_batched_tokens=63))
    finally:
        b._driver.shutdown()
    assert b.metrics["summary"]["num_preemptions"] < s.metrics["summary"]["num_preemptions"]  # it really differs
    assert len(b.history) != len(s.history) or b.records != s.records
    assert report.ok and report.num_steps == len(rec.steps), report.text()
    assert not off.ok
    with pytest.raises(ValueError, match="give its history entries"):
        identity(rec, at=variant(rec, num_blocks=16))
