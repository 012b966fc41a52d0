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
    assert first.blocks["cached"] == [1, 2, 3]       # registered only after their KV was computed
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
    run_all(llm, [SHARED + [1]], greedy(1, ignore_eos=True))      # blocks 1-4 used, 1-3 cached, all freed
    snap = eng.snapshot().to_dict()["block_pool"]
    assert snap["num_free_blocks"] == 5
    assert [b["hash"] is not None for b in snap["blocks"][1:4]] == [True, True, True]
    eng.add_request(SHARED + [2], greedy(1, ignore_eos=True))
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
    ids = [eng.add_request(p, greedy(4, ignore_eos=True)) for p in (A, B, SHARED + [300, 301])]
    records = []
    while eng.has_unfinished_requests():
        records.append(eng.step())
    return eng, ids, records


def test_prefix_aware_admission_waits_one_step_then_hits(tiny_qwen3_path):
    plain, ids, plain_recs = _admitted_together(tiny_qwen3_path)
    # vLLM's admission: all three start in step 1 and each computes the shared blocks.
    assert sorted(plain_recs[0].new_requests) == sorted(ids)
    assert plain.num_computed_prompt_tokens == len(A) + len(B) + len(SHARED) + 2

    aware, ids2, recs = _admitted_together(tiny_qwen3_path, prefix_aware_admission=True)
    assert recs[0].new_requests == [ids2[0]]             # the others wait for the shared blocks...
    assert sorted(recs[1].new_requests) == sorted(ids2[1:])
    assert all(s["num_cached_tokens"] == 48 for s in recs[1].scheduled if s["is_prefill"])  # ...and hit them
    assert aware.num_computed_prompt_tokens == len(A) + (len(B) - 48) + 2
    assert [aware.requests[i].output_token_ids for i in ids2] == [plain.requests[i].output_token_ids for i in ids]


def test_prefix_aware_admission_is_a_live_knob_and_needs_the_cache(tiny_qwen3_path):
    eng, _, recs = _admitted_together(tiny_qwen3_path, prefix_aware_admission=True, enable_prefix_caching=False)
    assert len(recs[0].new_requests) == 3                 # nothing to wait for without a cache
    llm = LLM(model=str(tiny_qwen3_path), block_size=16)
    assert llm.engine.update_scheduler_config(prefix_aware_admission=True).prefix_aware_admission is True


def test_decodes_sharing_a_cached_prefix_use_cascade_attention_and_keep_their_tokens(tiny_qwen3_path):
    from engine.attention.torch_decode import decode_plan

    system = list(range(8000, 8080))                   # 5 blocks of 16, hit by every request
    prompts = [system + list(range(100 * i, 100 * i + 3 + i)) for i in range(1, 6)]
    plain = run_all(LLM(model=str(tiny_qwen3_path), block_size=16, enable_prefix_caching=False),
                    prompts, greedy(5, ignore_eos=True))
    llm = LLM(model=str(tiny_qwen3_path), block_size=16, prefix_aware_admission=True, check_invariants=True)
    shared_tokens = []
    backend_forward = llm.engine.runner.backend.forward

    def spy(layer, q, k, v, k_cache, v_cache, meta):
        out = backend_forward(layer, q, k, v, k_cache, v_cache, meta)
        if layer == 0 and meta.decode_seq_ids:
            shared_tokens.append(decode_plan(meta, 16).shared_tokens)
        return out

    llm.engine.runner.backend.forward = spy
    assert run_all(llm, prompts, greedy(5, ignore_eos=True)) == plain
    assert 80 in shared_tokens                          # the decode steps attended the prefix once
