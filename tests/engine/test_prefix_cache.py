"""Prefix caching: shared full blocks are hit, refcounted, and change no token."""
from engine import LLM

from .helpers import greedy, run_all

SHARED = list(range(7000, 7048))           # exactly 3 blocks of 16
A = SHARED + list(range(100, 110))
B = SHARED + list(range(200, 207))


def test_second_request_hits_three_shared_blocks(tiny_qwen3_path):
    llm = LLM(model=str(tiny_qwen3_path), block_size=16, check_invariants=True)
    eng = llm.engine
    a = eng.add_request(A, greedy(6, ignore_eos=True))
    first = eng.step()
    assert first.blocks["cached"] == [1, 2, 3]       # registered when allocated for the tokens that fill them
    b = eng.add_request(B, greedy(6, ignore_eos=True))
    rec = eng.step()
    sched_b = next(s for s in rec.scheduled if s["request_id"] == b)
    assert sched_b["num_cached_tokens"] == 48
    assert sched_b["num_computed_before"] == 48
    assert sched_b["num_tokens"] == len(B) - 48      # only the rest is computed
    assert rec.blocks["hits"] == [1, 2, 3]
    snap = eng.snapshot().to_dict()
    pool = {blk["block_id"]: blk for blk in snap["block_pool"]["blocks"]}
    for blk_id in (1, 2, 3):
        assert pool[blk_id]["ref_count"] == 2
        assert sorted(pool[blk_id]["owners"]) == sorted([a, b])
        assert pool[blk_id]["hash"] is not None and len(pool[blk_id]["hash"]) == 16
    while eng.has_unfinished_requests():
        eng.step()
    with_cache = [eng.requests[a].output_token_ids, eng.requests[b].output_token_ids]
    off = LLM(model=str(tiny_qwen3_path), block_size=16, enable_prefix_caching=False)
    assert run_all(off, [A, B], greedy(6, ignore_eos=True)) == with_cache
    m = eng.metrics
    assert m["prefix_cache_hits"] == 48 and m["prefix_cache_queries"] == len(A) + len(B)


def test_full_hit_recomputes_the_last_block(tiny_qwen3_path):
    llm = LLM(model=str(tiny_qwen3_path), block_size=16, check_invariants=True)
    eng = llm.engine
    eng.add_request(SHARED, greedy(1, ignore_eos=True))
    eng.step()
    eng.add_request(SHARED, greedy(1, ignore_eos=True))
    rec = eng.step()
    (s,) = rec.scheduled
    assert s["num_cached_tokens"] == 32 and s["num_tokens"] == 16   # at least one token is computed


def test_freed_cached_block_is_hit_from_the_free_queue_then_evicted_lazily(tiny_qwen3_path):
    llm = LLM(model=str(tiny_qwen3_path), block_size=16, num_kv_blocks=6, check_invariants=True)
    eng = llm.engine
    run_all(llm, [[*SHARED, 1]], greedy(1, ignore_eos=True))      # blocks 1-4 used, 1-3 cached, all freed
    snap = eng.snapshot().to_dict()["block_pool"]
    assert snap["num_free_blocks"] == 5
    assert [b["hash"] is not None for b in snap["blocks"][1:4]] == [True, True, True]
    eng.add_request([*SHARED, 2], greedy(1, ignore_eos=True))
    rec = eng.step()
    assert rec.blocks["hits"] == [1, 2, 3] and rec.blocks["evicted"] == []
    eng.step() if eng.has_unfinished_requests() else None
    # A different prompt needing every block must evict the cached ones, oldest position first.
    other = list(range(9000, 9000 + 16 * 4 + 1))
    eng.add_request(other, greedy(1, ignore_eos=True))
    rec = eng.step()
    assert sorted(rec.blocks["evicted"]) == [1, 2, 3]
    assert eng.kv.pool.lookup(eng.requests["0"].block_hashes[0]) is None


def _admitted_together(tiny_qwen3_path, **config):
    """Three requests sharing SHARED, added before the first step; budget for all at once."""
    llm = LLM(model=str(tiny_qwen3_path), block_size=16, check_invariants=True, **config)
    eng = llm.engine
    ids = [eng.add_request(p, greedy(4, ignore_eos=True)) for p in (A, B, [*SHARED, 300, 301])]
    records = []
    while eng.has_unfinished_requests():
        records.append(eng.step())
    return eng, ids, records


def test_request_admitted_later_in_the_same_step_hits_blocks_computed_in_that_step(tiny_qwen3_path):
    # vLLM hashes a full block when it is allocated for the tokens that fill it, so B and C,
    # admitted after A in step 1, hit A's three shared blocks before any of them holds KV:
    # A's forward writes them in each layer before that layer's attention reads them.
    eng, ids, recs = _admitted_together(tiny_qwen3_path)
    first = recs[0]
    assert sorted(first.new_requests) == sorted(ids)
    cached = {s["request_id"]: s["num_cached_tokens"] for s in first.scheduled}
    assert cached == {ids[0]: 0, ids[1]: 48, ids[2]: 48}
    assert first.blocks["cached"][:3] == [1, 2, 3] and first.blocks["hits"] == [1, 2, 3, 1, 2, 3]
    assert first.blocks["same_step_hits"] == [1, 2, 3, 1, 2, 3]
    assert recs[1].blocks["same_step_hits"] == []
    assert eng.num_computed_prompt_tokens == len(A) + (len(B) - 48) + 2
    off, ids_off, _ = _admitted_together(tiny_qwen3_path, enable_prefix_caching=False)
    assert [eng.requests[i].output_token_ids for i in ids] == [off.requests[i].output_token_ids for i in ids_off]


def test_a_recomputed_full_block_is_cached_twice_and_outlives_the_first(tiny_qwen3_path):
    # A full hit recomputes its last block into a fresh block; vLLM registers that duplicate
    # too (no de-duplication), so it goes to the free queue's tail and stays findable.
    llm = LLM(model=str(tiny_qwen3_path), block_size=16, max_num_seqs=1, check_invariants=True)
    eng = llm.engine
    run_all(llm, [SHARED, SHARED], greedy(1, ignore_eos=True))
    pool = eng.kv.pool
    h = eng.requests["0"].block_hashes[2]
    assert list(pool.cached_blocks_of_hash[h]) == [3, 4]   # the first registered is the one found
    assert pool.lookup(h) == 3
    assert list(pool.free_queue)[-4:] == [3, 4, 2, 1]      # both cached: at the tail, in the order freed
    eng.add_request([9], greedy(1, ignore_eos=True))
    assert eng.step().blocks["allocated"] == [5]           # not the duplicate (it would be 4 if unhashed)


def test_admission_waits_until_the_whole_sequence_fits(tiny_qwen3_path):
    # 20 usable blocks of 4 tokens, budget 64. A (40 tokens) takes 10 blocks in step 1 and
    # decodes 5 tokens. B (44 tokens) needs 11 blocks: under vLLM's full-sequence rule it
    # waits until A is done; under the older first-chunk rule its 24-token chunk (6 blocks)
    # starts in step 1 beside A.
    def admitted_step(**knobs):
        llm = LLM(model=str(tiny_qwen3_path), block_size=4, num_kv_blocks=21, max_num_batched_tokens=64,
                  check_invariants=True, **knobs)
        eng = llm.engine
        eng.add_request(list(range(1000, 1040)), greedy(5, ignore_eos=True))
        b = eng.add_request(list(range(2000, 2044)), greedy(1, ignore_eos=True))
        for step in range(1, 40):
            if b in eng.step().new_requests:
                return step
        raise AssertionError("B was never admitted")

    assert admitted_step() == 6                                   # A finished in step 5
    assert admitted_step(scheduler_reserve_full_isl=False) == 1


def test_decodes_sharing_a_cached_prefix_use_cascade_attention_and_keep_their_tokens(tiny_qwen3_path):
    from engine.attention.torch_decode import decode_plan

    system = list(range(8000, 8080))                   # 5 blocks of 16, hit by every request
    prompts = [system + list(range(100 * i, 100 * i + 3 + i)) for i in range(1, 6)]
    # The torch backend's cascade attention (the cpu backend's decodes run natively, most as one call).
    plain = run_all(LLM(model=str(tiny_qwen3_path), block_size=16, enable_prefix_caching=False,
                        attention_backend="torch"), prompts, greedy(5, ignore_eos=True))
    llm = LLM(model=str(tiny_qwen3_path), block_size=16, check_invariants=True, attention_backend="torch")
    shared_tokens = []
    backend_forward = llm.engine.runner.backend.forward

    def spy(layer, q, k, v, k_cache, v_cache, meta):
        out = backend_forward(layer, q, k, v, k_cache, v_cache, meta)
        if layer == 0 and meta.decode_seq_ids:
            shared_tokens.append(decode_plan(meta).shared_tokens)
        return out

    llm.engine.runner.backend.forward = spy
    assert run_all(llm, prompts, greedy(5, ignore_eos=True)) == plain
    assert 80 in shared_tokens                          # the decode steps attended the prefix once
