"""A Mamba group in vLLM's "align" cache mode beside full attention, without vLLM: MambaSpec's and
MambaStates' rules on hand-made cases, the aligned prefill chunks, and vLLM issue 45238 on
kvscope's scheduler; then the same issue on vLLM 0.32's own scheduler (in a subprocess: vLLM's
import changes process-wide state), which must give the same numbers.
tests/oracle/differential.py `--groups full+mamba` holds the whole of it to vLLM."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine.core.block_pool import NULL_BLOCK_ID, BlockPool
from engine.core.kv_cache_groups import FullAttentionSpec, MambaSpec
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.mamba_group import aligned_chunk_tokens
from engine.request import Request
from engine.sampling_params import SamplingParams
from tests.oracle.issue_45238 import sibling_hit
from tests.oracle.kvscope_side import KvscopeScheduler
from tests.oracle.vllm_available import require_vllm
from tests.oracle.workloads import OracleRequest, Workload

BS = 4
ROOT = Path(__file__).resolve().parents[2]


def _pool_with(cached: dict[int, int], group: int = 1) -> BlockPool:
    """A pool where block `b` is registered under hash `h` in `group`, for each h -> b."""
    pool = BlockPool(16)
    for h, b in cached.items():
        pool.register(b, h, [0] * BS, group)
    return pool


def test_a_mamba_hit_is_the_cached_state_furthest_right():
    pool = _pool_with({101: 5, 103: 7})  # states after blocks 0 and 2; block 1's is not cached
    hashes = [101, 102, 103, 104]
    assert MambaSpec().find_longest_cache_hit(pool, hashes, 4 * BS, 1, BS) == [NULL_BLOCK_ID, NULL_BLOCK_ID, 7]
    # Bounded by full attention's hit (2 blocks): the state after block 0, not a run from the left.
    assert MambaSpec().find_longest_cache_hit(pool, hashes, 2 * BS, 1, BS) == [5]
    assert MambaSpec().find_longest_cache_hit(pool, [201, 202], 2 * BS, 1, BS) == []
    # Full attention, over the same cache, stops at the first miss.
    assert FullAttentionSpec().find_longest_cache_hit(_pool_with({101: 5, 103: 7}, 0), hashes, 4 * BS, 0, BS) == [5]


def test_which_states_are_cached_follows_the_retention_interval():
    spec, prompt_end = MambaSpec(), [9]  # the prompt's last token is 9: its last whole block is block 1
    assert spec.cacheable_mask(0, 6, BS, None, prompt_end) is None  # dense: every state
    assert spec.cacheable_mask(0, 6, BS, 0, prompt_end) == [False, True, False, False, False, False]
    assert spec.cacheable_mask(0, 6, BS, 0, [9, 20]) == [False, True, False, False, True, False]  # + a junction
    # One state per 3 blocks (blocks 2 and 5), and the prompt's; blocks before `start` are done.
    assert spec.cacheable_mask(2, 6, BS, 3 * BS, prompt_end) == [True, False, False, True]
    assert spec.cacheable_mask(0, 6, BS, BS, prompt_end) is None  # one per block is all of them


def _req(tokens: int, computed: int = 0, shared_prefix_boundary: int = 0) -> SimpleNamespace:
    return SimpleNamespace(num_prompt_tokens=tokens, num_tokens=tokens, num_computed_tokens=computed,
                           shared_prefix_boundary=shared_prefix_boundary)


def test_prefill_chunks_end_where_a_state_can_be_cached():
    def chunk(req: SimpleNamespace, start: int, num_new: int, max_prefill: int = 64) -> int:
        return aligned_chunk_tokens(start, num_new, req, BS, max_prefill)  # type: ignore[arg-type]

    assert chunk(_req(10), 0, 10) == 8  # stops at the last block boundary before the last token
    assert chunk(_req(10), 8, 2) == 2  # the prompt's tail: the decode steps advance its state
    assert chunk(_req(10), 0, 7) == 4  # a budget cut ends on a block boundary
    assert chunk(_req(10), 4, 3) == 0  # no whole block fits: the request waits for a fuller budget
    assert chunk(_req(10), 4, 3, max_prefill=2) == 3  # unless a block is wider than any step
    assert chunk(_req(10), 5, 5, max_prefill=2) == 3  # then back onto a boundary
    assert chunk(_req(30, shared_prefix_boundary=14), 0, 30) == 12  # a shared prefix's end, floored
    assert chunk(_req(10), 10, 1) == 1  # decode


def _manager() -> KVCacheManager:
    return KVCacheManager(32, BS, True, 64, kv_cache_groups=[FullAttentionSpec(), MambaSpec()])


def test_a_request_holds_only_the_states_it_still_reads():
    kv = _manager()
    req = Request("a", list(range(1, 11)), SamplingParams(max_tokens=4), eos_token_id=None)
    assert kv.allocate_slots(req, 8) is not None  # the chunk up to the last block boundary
    assert kv.hybrid is not None
    full, mamba = kv.hybrid.tables(req)
    assert len(full) == 2 and mamba[0] == NULL_BLOCK_ID and mamba[1] != NULL_BLOCK_ID  # one state, at 8
    state_at_8 = mamba[1]
    assert kv.pool.lookup(req.block_hashes[1], 1) == state_at_8  # the prompt's checkpoint is cached
    assert kv.pool.lookup(req.block_hashes[0], 1) is None
    req.num_computed_tokens = 8
    assert kv.allocate_slots(req, 2) is not None  # the tail: a new state block, copied from the one at 8
    assert len(mamba) == 3 and mamba[1] == state_at_8
    req.num_computed_tokens = 10
    req.append_output(7)
    assert kv.allocate_slots(req, 1) is not None  # decode: the state at 8 is read no more
    assert mamba[:2] == [NULL_BLOCK_ID, NULL_BLOCK_ID] and mamba[2] != NULL_BLOCK_ID
    assert kv.pool.is_free(state_at_8) and kv.pool.lookup(req.block_hashes[1], 1) == state_at_8  # cached
    assert kv.hybrid.mamba.num_freed == 1
    kv.free(req)
    assert kv.pool.num_free_blocks == 31


def _two_requests(second_arrival: int) -> list[dict]:
    """A request of 10 tokens, and one resending it with 4 more: both schedulers' steps."""
    prompt = tuple(range(1, 11))
    w = Workload(block_size=BS, num_blocks=40, max_num_batched_tokens=64, max_num_seqs=4, max_model_len=64,
                 enable_prefix_caching=True, enable_chunked_prefill=True, scheduler_reserve_full_isl=True,
                 mamba_align=True, requests=(OracleRequest("a", prompt, 2, 0),
                                             OracleRequest("b", (*prompt, 9, 9, 9, 9), 2, second_arrival)))
    side, records = KvscopeScheduler(w), []
    for step in range(1, 9):
        for r in w.requests:
            if r.arrival_step == step - 1:
                side.add(r)
        records.append(side.step())
    return records


def test_a_hit_on_a_state_a_step_writes_waits_while_its_writer_holds_it():
    steps = _two_requests(second_arrival=0)
    # Step 1 computes a's first 8 tokens and caches its state at 8, which b would hit: b waits.
    # Step 2 (a's tail) re-keys that state, as vLLM does while a holds it: b waits again.
    assert [s["scheduled"] for s in steps[:2]] == [{"a": 8}, {"a": 2}]
    # Step 3: a decodes and lets the state at 8 go (still cached); b hits it.
    assert steps[2]["scheduled"] == {"a": 1, "b": 4} and steps[2]["computed_before"]["b"] == 8


def test_issue_45238_on_kvscopes_scheduler():
    # The first request's state at its prompt's last block boundary (832) is inside the prefix.
    assert sibling_hit("kvscope", 832) == {"hit_blocks": 52, "prompt_blocks": 64, "first_chunk": 176}
    # 100 tokens less of shared prefix: that state (736) holds 4 tokens of the first request's
    # own, nothing earlier was cached, so the sibling hits nothing. Its first chunk stops at the
    # end of what full attention had (45 blocks, 720 tokens), where its own state gets cached.
    assert sibling_hit("kvscope", 732) == {"hit_blocks": 0, "prompt_blocks": 64, "first_chunk": 720}


@pytest.mark.slow  # about 20 s on 2 cores, most of it vLLM's import
def test_issue_45238_on_vllms_scheduler_gives_the_same_numbers():
    require_vllm()
    proc = subprocess.run([sys.executable, "-m", "tests.oracle.issue_45238", "--engine", "vllm"], cwd=ROOT,
                          text=True, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    vllm = json.loads(proc.stdout.strip().splitlines()[-1])
    assert vllm["832"] == {"hit_blocks": 52, "prompt_blocks": 64, "first_chunk": 176}
    assert vllm["732"] == {"hit_blocks": 0, "prompt_blocks": 64, "first_chunk": 720}
    assert vllm == {str(n): sibling_hit("kvscope", n) for n in (832, 732)}
