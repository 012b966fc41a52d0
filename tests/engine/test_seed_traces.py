"""The seeds' token-level traces, replayed exactly (Qwen tokenizer + random tiny Qwen3)."""
import pytest

from engine import LLM

from .helpers import greedy


@pytest.fixture(scope="module")
def qwen_llm_factory(tiny_qwen3_path):
    def make(**kw):
        return LLM(model=str(tiny_qwen3_path), check_invariants=True, **kw)
    return make


def test_capital_of_france_trace_block_size_128(qwen_llm_factory):
    llm = qwen_llm_factory(block_size=128, enable_prefix_caching=False, num_kv_blocks=8)
    eng = llm.engine
    total = eng.kv.pool.num_free_blocks
    assert total == 8 - 1  # block 0 is the null block
    rid = eng.add_request("The capital of France is", greedy(3, ignore_eos=True))
    assert eng.requests[rid].prompt_token_ids == [785, 6722, 315, 9625, 374]

    prefill = eng.step()
    b = prefill.batch
    assert b["input_ids"] == [785, 6722, 315, 9625, 374]
    assert b["positions"] == [0, 1, 2, 3, 4]
    assert b["query_start_loc"] == [0, 5]
    assert b["seq_lens"] == [5]
    assert b["logits_indices"] == [4]
    assert b["block_tables"] == [[1]]
    assert b["slot_mapping"] == [128, 129, 130, 131, 132]
    assert prefill.num_free_blocks == total - 1
    assert rid in prefill.sampled

    d1, d2 = eng.step(), eng.step()
    assert d1.batch["slot_mapping"] == [133] and d1.batch["positions"] == [5]
    assert d2.batch["slot_mapping"] == [134] and d2.batch["seq_lens"] == [7]
    assert d2.finished == [rid]
    assert d2.num_free_blocks == total          # everything returned
    assert len(eng.requests[rid].output_token_ids) == 3


def test_127_token_prompt_crosses_into_second_block(qwen_llm_factory):
    llm = qwen_llm_factory(block_size=128, enable_prefix_caching=False, num_kv_blocks=8)
    eng = llm.engine
    rid = eng.add_request(list(range(1000, 1127)), greedy(3, ignore_eos=True))
    first = eng.step()
    assert first.batch["slot_mapping"] == list(range(128, 255)) and first.batch["block_tables"] == [[1]]
    d1 = eng.step()
    assert d1.batch["positions"] == [127] and d1.batch["slot_mapping"] == [255]
    d2 = eng.step()
    assert d2.batch["positions"] == [128]
    assert d2.batch["block_tables"] == [[1, 2]]
    assert d2.batch["slot_mapping"] == [256]
    assert d2.blocks["allocated"] == [2]
    assert d2.finished == [rid] and d2.num_free_blocks == 7


def test_chunked_prefill_700_and_32_under_budget_512(qwen_llm_factory):
    llm = qwen_llm_factory(block_size=256, max_num_batched_tokens=512, enable_prefix_caching=False, num_kv_blocks=8)
    eng = llm.engine
    a = eng.add_request(list(range(2000, 2700)), greedy(2, ignore_eos=True))
    b = eng.add_request(list(range(3000, 3032)), greedy(2, ignore_eos=True))
    s1 = eng.step()
    assert [(s["request_id"], s["num_tokens"]) for s in s1.scheduled] == [(a, 512)]
    assert s1.batch["logits_indices"] == [] and s1.sampled == {}     # a chunk is not sampled
    assert s1.scheduled[0]["chunk_index"] == 0
    s2 = eng.step()
    assert [(s["request_id"], s["num_tokens"]) for s in s2.scheduled] == [(a, 188), (b, 32)]
    assert s2.batch["query_start_loc"] == [0, 188, 220]
    assert s2.batch["seq_lens"] == [700, 32]
    assert s2.batch["logits_indices"] == [187, 219]
    assert s2.scheduled[0]["chunk_index"] == 1
    s3 = eng.step()
    assert [s["num_tokens"] for s in s3.scheduled] == [1, 1] and s3.batch["query_start_loc"] == [0, 1, 2]
    assert all(not s["is_prefill"] for s in s3.scheduled)


def test_free_order_gives_the_last_block_first(qwen_llm_factory):
    """Seed 000: a request that held [1, 2] is followed by one that gets [2] then [2, 1]."""
    llm = qwen_llm_factory(block_size=16, enable_prefix_caching=False, num_kv_blocks=8)
    eng = llm.engine
    eng.add_request(list(range(100, 120)), greedy(1, ignore_eos=True))   # 20 tokens: blocks [1, 2]
    rec = eng.step()
    assert rec.batch["block_tables"] == [[1, 2]] and rec.blocks["freed"] == [2, 1]
    eng.add_request(list(range(500, 510)), greedy(8, ignore_eos=True))   # 10 tokens, grows past 16
    assert eng.step().batch["block_tables"] == [[2]]
    tables = [eng.step().batch["block_tables"] for _ in range(7)]
    assert tables[-1] == [[2, 1]]
