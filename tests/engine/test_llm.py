"""LLM.generate conveniences and weight sharing between engines."""
import pytest

from engine import LLM

from .helpers import greedy


def test_pool_only_reset_shares_weights_and_gives_the_same_tokens(tiny_qwen3_path):
    first = LLM(model=str(tiny_qwen3_path), num_kv_blocks=32)
    second = LLM(model=str(tiny_qwen3_path), num_kv_blocks=12, block_size=8, share_model_with=first)
    assert second.engine.runner.model is first.engine.runner.model
    assert second.engine.tokenizer is first.engine.tokenizer
    assert second.engine.kv.pool.num_blocks == 12
    a = first.generate([[1, 2, 3]], greedy(5, ignore_eos=True), use_tqdm=False)[0].token_ids
    b = second.generate([[1, 2, 3]], greedy(5, ignore_eos=True), use_tqdm=False)[0].token_ids
    assert a == b
    other_len = LLM(model=str(tiny_qwen3_path), max_model_len=64, share_model_with=first)
    assert other_len.engine.runner.model is not first.engine.runner.model   # RoPE table differs


def test_generate_accepts_one_prompt_and_checks_params_length(tiny_qwen3_path):
    llm = LLM(model=str(tiny_qwen3_path))
    (out,) = llm.generate("The capital of France is", greedy(2, ignore_eos=True), use_tqdm=False)
    assert out.prompt_token_ids == [785, 6722, 315, 9625, 374] and len(out.token_ids) == 2
    with pytest.raises(ValueError, match="sampling_params"):
        llm.generate(["a", "b"], [greedy(1)], use_tqdm=False)
    # A bad prompt in a batch leaves nothing half-added behind.
    with pytest.raises(ValueError, match="prompt"):
        llm.generate(["fine", ""], greedy(1), use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()


def test_a_lean_engine_gives_the_same_tokens_without_observation_and_a_session_refuses_it(tiny_qwen3_path):
    """record_steps=False (the benchmarks'): the same tokens, records without batch, text or
    changes, and nothing kept for changes nobody takes (the pool's touched blocks)."""
    from explorer import Session

    prompts = [[1, 2, 3] * 9, [7] * 40, [1, 2, 3] * 9 + [5]]   # a shared prefix: hits and shared blocks
    full = LLM(model=str(tiny_qwen3_path), num_kv_blocks=24, block_size=8)
    lean = LLM(model=str(tiny_qwen3_path), num_kv_blocks=24, block_size=8, record_steps=False)
    tokens = {}
    for name, llm in (("full", full), ("lean", lean)):
        eng = llm.engine
        for p in prompts:
            eng.add_request(p, greedy(6, ignore_eos=True))
        records = []
        while eng.has_unfinished_requests():
            records.append(eng.step())
        tokens[name] = [eng.requests[r].output_token_ids for r in sorted(eng.requests)]
        assert all(bool(rec.changes) == (name == "full") for rec in records)
        if name == "lean":
            assert all(s["text"] is None for rec in records for s in rec.sampled.values())
            assert eng.kv.pool.take_touched() == set() and eng.notes.requests == set()
            assert eng.notes._finished_sent == len(eng.scheduler.finished) == len(prompts)
    assert tokens["lean"] == tokens["full"]
    with pytest.raises(ValueError, match="record_steps"):
        Session(lean)
