"""Preemption under a pool too small for everyone: the newest goes, later resumes, and no
request's greedy output changes."""
import pytest

from engine import LLM

from .helpers import greedy, run_all

PROMPTS = [list(range(10 + 40 * i, 10 + 40 * i + 20 + 7 * i)) for i in range(5)]


@pytest.mark.parametrize("policy", ["unified", "prefill_first"])
def test_newest_is_preempted_and_outputs_are_unchanged(tiny_qwen3_path, policy):
    free = run_all(LLM(model=str(tiny_qwen3_path), block_size=8), PROMPTS, greedy(24, ignore_eos=True))
    llm = LLM(model=str(tiny_qwen3_path), block_size=8, num_kv_blocks=16, scheduling_policy=policy,
              check_invariants=True)
    eng = llm.engine
    ids = [eng.add_request(p, greedy(24, ignore_eos=True)) for p in PROMPTS]
    preempted_at = []
    while eng.has_unfinished_requests():
        running_before = [r.request_id for r in eng.scheduler.running]
        rec = eng.step()
        for victim in rec.preempted:
            preempted_at.append(victim)
            # The victim is the most recently admitted request that was running.
            assert victim == [r for r in running_before if r not in rec.preempted[:rec.preempted.index(victim)]][-1]
    assert preempted_at, "the pool was meant to force preemption"
    assert [eng.requests[i].output_token_ids for i in ids] == free
    assert eng.metrics["num_preemptions"] == len(preempted_at)
    assert eng.kv.pool.num_free_blocks == 15
    assert all(eng.requests[i].finish_reason == "length" for i in ids)
