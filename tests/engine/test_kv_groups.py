"""KV cache groups without vLLM, on a hand-made case: a full-attention group and a sliding-window
group over one pool (block size 4, window 5: a token sees the 4 before it, so one cached block is
a sliding hit). tests/oracle/differential.py `--groups full+sliding` holds the same code to vLLM."""
from __future__ import annotations

from engine.core.block_pool import NULL_BLOCK_ID
from engine.core.hybrid_kv_cache import GroupedHits
from engine.core.kv_cache_groups import FullAttentionSpec, SlidingWindowSpec
from engine.core.kv_cache_manager import KVCacheManager
from engine.request import Request
from engine.sampling_params import SamplingParams

BS = 4
PROMPT = list(range(1, 17))  # 16 tokens: 4 full blocks


def _manager(retention: int | None = 0) -> KVCacheManager:
    return KVCacheManager(32, BS, True, 64, kv_cache_groups=[FullAttentionSpec(), SlidingWindowSpec(5)],
                          max_in_flight_tokens=16, prefix_cache_retention_interval=retention)


def _admit(kv: KVCacheManager, request_id: str, prompt: list[int]) -> tuple[Request, GroupedHits, int]:
    req = Request(request_id, prompt, SamplingParams(max_tokens=8), eos_token_id=None)
    hits, num_cached = kv.get_computed_blocks(req)
    assert isinstance(hits, GroupedHits)
    assert kv.allocate_slots(req, req.num_tokens - num_cached, hits) is not None
    req.num_computed_tokens = req.num_tokens
    return req, hits, num_cached


def test_a_sliding_group_frees_the_blocks_that_left_its_window():
    kv = _manager()
    req, _, _ = _admit(kv, "a", PROMPT)
    assert kv.hybrid is not None
    full, sliding = (list(t) for t in kv.hybrid.tables(req))
    assert len(full) == len(sliding) == 4 and not set(full) & set(sliding)  # each group its own blocks
    left = sliding[:3]
    req.append_output(99)
    assert kv.allocate_slots(req, 1) is not None  # token 16 sees tokens 12-16: blocks 0-2 left
    assert req.block_table[:4] == full  # full attention keeps every block
    assert req.extra_block_tables[0][:3] == [NULL_BLOCK_ID] * 3 and req.extra_block_tables[0][3] == sliding[3]
    # Freed last first: the uncached ones go to the head of the free queue, so this very
    # allocation reuses them (block 1's for the full group's new block, block 0's for the sliding
    # group's); block 2, cached at the prompt's end, waits at the tail for a hit.
    assert (req.block_table[4], req.extra_block_tables[0][4]) == (left[1], left[0])
    assert kv.pool.is_free(left[2]) and list(kv.pool.free_queue)[-1] == left[2]
    assert kv.hybrid.num_blocks_left_window == 3
    kv.free(req)
    assert req.block_table == [] and req.extra_block_tables == [] and kv.pool.num_free_blocks == 31


def test_the_hit_is_the_one_every_group_has():
    kv = _manager()  # retention 0 (vLLM's default): the sliding group caches the run before the prompt's end
    a, _, _ = _admit(kv, "a", PROMPT)
    assert kv.pool.lookup(a.block_hashes[3]) is not None  # full attention alone would hit 16 tokens
    assert kv.pool.lookup(a.block_hashes[3], group=1) is None
    b, hits, num_cached = _admit(kv, "b", [*PROMPT, 7, 7, 7, 7])
    assert num_cached == 12  # the sliding group's hit ends after block 2 and bounds the full group's
    assert hits.by_group == [a.block_table[:3], [NULL_BLOCK_ID, NULL_BLOCK_ID, a.extra_block_tables[0][2]]]
    assert b.shared_prefix_boundary == 16  # where the full group's longer hit ended
    # b's window at token 12 reads block 2 only: blocks 0-1 are the null block in its sliding table.
    assert b.extra_block_tables[0][:3] == [NULL_BLOCK_ID, NULL_BLOCK_ID, a.extra_block_tables[0][2]]
    assert b.block_table[:3] == a.block_table[:3] and b.block_table[3] != a.block_table[3]


def test_equal_hashes_of_two_groups_are_two_entries():
    kv = _manager(retention=None)  # dense: every sliding block is cached too
    a, _, _ = _admit(kv, "a", PROMPT)
    for i, h in enumerate(a.block_hashes):
        assert kv.pool.lookup(h, 0) == a.block_table[i] and kv.pool.lookup(h, 1) == a.extra_block_tables[0][i]
