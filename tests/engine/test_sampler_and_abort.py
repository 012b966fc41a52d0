"""Sampling determinism, abort at any point, metrics on both clocks, the attention probe."""
import pytest
import torch

from engine import LLM, SamplingParams

from .helpers import greedy, run_all


@pytest.fixture(scope="module")
def llm(tiny_qwen3_path):
    return LLM(model=str(tiny_qwen3_path), block_size=16, check_invariants=True)


def test_same_seed_same_tokens_whatever_shares_the_batch(llm):
    sp = SamplingParams(temperature=0.9, top_k=50, top_p=0.9, max_tokens=12, seed=1234, ignore_eos=True)
    alone = run_all(llm, [[1, 2, 3, 4]], sp)[0]
    noise = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)
    crowd = run_all(llm, [[9, 9, 9], [1, 2, 3, 4], list(range(40, 90))], [noise, sp, noise])
    assert crowd[1] == alone
    llm.engine.update_scheduler_config(max_num_batched_tokens=3)
    try:
        assert run_all(llm, [[1, 2, 3, 4]], sp)[0] == alone
    finally:
        llm.engine.update_scheduler_config(max_num_batched_tokens=2048)


def test_top_k_one_is_greedy(llm):
    g = run_all(llm, [[5, 6, 7]], greedy(6, ignore_eos=True))[0]
    k1 = run_all(llm, [[5, 6, 7]], SamplingParams(temperature=1.3, top_k=1, max_tokens=6, ignore_eos=True))[0]
    assert g == k1


def test_sampled_candidates_respect_top_k_and_sum_to_at_most_one(llm):
    eng = llm.engine
    rid = eng.add_request([5, 6, 7], SamplingParams(temperature=0.7, top_k=3, max_tokens=1, seed=1))
    rec = eng.step()
    top = rec.sampled[rid]["top"]
    assert len([p for _, p in top if p > 0]) <= 3
    assert abs(sum(p for _, p in top) - 1.0) < 1e-5
    assert rec.sampled[rid]["token_id"] in [t for t, p in top if p > 0]


@pytest.mark.parametrize("when", ["waiting", "mid_chunk", "decoding"])
def test_abort_frees_blocks_and_leaves_others(llm, when):
    eng = llm.engine
    eng.update_scheduler_config(max_num_batched_tokens=32)
    try:
        keep = eng.add_request(list(range(10, 30)), greedy(5, ignore_eos=True))
        victim = eng.add_request(list(range(300, 400)), greedy(5, ignore_eos=True))
        if when == "mid_chunk":
            eng.step()
        if when == "decoding":
            while eng.requests[victim].num_computed_tokens < 100:
                eng.step()
        eng.abort_request(victim)
        assert eng.requests[victim].finish_reason == "abort" and eng.requests[victim].block_table == []
        while eng.has_unfinished_requests():
            eng.step()
        assert len(eng.requests[keep].output_token_ids) == 5
        assert eng.kv.pool.num_free_blocks == eng.kv.pool.num_blocks - 1
    finally:
        eng.update_scheduler_config(max_num_batched_tokens=2048)


def test_metrics_on_engine_and_wall_clocks(llm):
    eng = llm.engine
    rid = eng.add_request([1, 2, 3], greedy(4, ignore_eos=True))
    while eng.has_unfinished_requests():
        eng.step()
    m = eng.requests[rid].metrics.to_dict()
    for clock in ("engine", "wall"):
        c = m[clock]
        assert c["time_to_first_token"] > 0 and len(c["token_times"]) == 4
        assert len(c["inter_token_latency"]) == 3 and c["e2e_request_latency"] >= c["time_to_first_token"]
        assert c["request_queue_time"] >= 0


def test_empty_step_is_an_empty_record(llm):
    rec = llm.engine.step()
    assert rec.scheduled == [] and rec.sampled == {} and rec.batch["input_ids"] == []


def test_attention_probe_matches_transformers_eager_attentions(tiny_qwen3_path, llm):
    from transformers import AutoModelForCausalLM

    prompt = list(range(50, 70))
    eng = llm.engine
    rid = eng.add_request(prompt, greedy(3, ignore_eos=True))
    eng.step()
    probe = eng.attention_probe(rid, layer=1)
    assert probe.probs.shape == (4, 20, 20) and probe.query_positions == list(range(20))
    assert probe.kv_head_of_head == [0, 0, 1, 1]
    hf = AutoModelForCausalLM.from_pretrained(str(tiny_qwen3_path), dtype=torch.float32,
                                              attn_implementation="eager").eval()
    with torch.inference_mode():
        att = hf(torch.tensor([prompt]), output_attentions=True).attentions[1][0]
    assert torch.allclose(probe.probs, att, atol=1e-5)
    eng.step()                                        # a decode: one query over 21 positions
    d = eng.attention_probe(rid, layer=0, head=3)
    assert d.probs.shape == (1, 1, 21) and abs(float(d.probs.sum()) - 1) < 1e-5
    while eng.has_unfinished_requests():
        eng.step()
    with pytest.raises(ValueError, match="finished"):
        eng.attention_probe(rid, layer=0)
    with pytest.raises(ValueError, match="layer"):
        eng.attention_probe(rid, layer=99)


def test_abort_of_a_preempted_request_frees_nothing_twice_and_others_finish(tiny_qwen3_path):
    llm = LLM(model=str(tiny_qwen3_path), block_size=8, num_kv_blocks=10, check_invariants=True)
    eng = llm.engine
    ids = [eng.add_request(list(range(100 * i, 100 * i + 20)), greedy(20, ignore_eos=True)) for i in range(1, 4)]
    victim = None
    while victim is None and eng.has_unfinished_requests():
        rec = eng.step()
        victim = rec.preempted[0] if rec.preempted else None
    assert victim is not None and eng.requests[victim].status.value == "preempted"
    eng.abort_request(victim)
    assert eng.requests[victim].finish_reason == "abort"
    while eng.has_unfinished_requests():
        eng.step()
    assert all(len(eng.requests[i].output_token_ids) == 20 for i in ids if i != victim)
    assert eng.kv.pool.num_free_blocks == 9
