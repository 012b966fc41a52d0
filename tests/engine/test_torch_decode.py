"""The torch backend's decode planning: length groups and cascade attention over a shared
prefix give the same outputs as attending each sequence's whole context directly."""
import pytest
import torch

from engine.attention import AttentionMetadata
from engine.attention.reference_ops import attention_probs, causal_mask, gather_context
from engine.attention.torch_decode import decode_attention, decode_plan

H, KVH, D, BS = 6, 2, 16, 8


def _decode_batch(lengths, shared_blocks=0, num_blocks=200, seed=0):
    """Random pools and one decode per length; the first `shared_blocks` blocks of every
    table are the same physical blocks (a prefix-cache hit)."""
    g = torch.Generator().manual_seed(seed)
    k_cache = torch.randn(num_blocks, BS, KVH, D, generator=g)
    v_cache = torch.randn(num_blocks, BS, KVH, D, generator=g)
    free = iter(torch.randperm(num_blocks - 1, generator=g).add(1).tolist())
    shared = [next(free) for _ in range(shared_blocks)]
    tables = [shared + [next(free) for _ in range(-(-n // BS) - shared_blocks)] for n in lengths]
    width = max(len(t) for t in tables)
    padded = torch.tensor([t + [0] * (width - len(t)) for t in tables])
    meta = AttentionMetadata(query_start_loc=list(range(len(lengths) + 1)), seq_lens=list(lengths),
                             context_lens=[n - 1 for n in lengths], slot_mapping=torch.full((len(lengths),), -1),
                             block_tables=padded, block_size=BS, decode_seq_ids=list(range(len(lengths))))
    q = torch.randn(len(lengths), H, D, generator=g)
    return q, k_cache, v_cache, meta


def _reference(q, k_cache, v_cache, meta):
    out = torch.empty_like(q)
    for i, n in enumerate(meta.seq_lens):
        ks, vs = gather_context(k_cache, meta.block_tables[i], n), gather_context(v_cache, meta.block_tables[i], n)
        probs = attention_probs(q[i:i + 1], ks, causal_mask(1, n - 1, n, q.device), KVH)  # [H, 1, n]
        out[i] = torch.einsum("hqk,khd->qhd", probs, vs.repeat_interleave(H // KVH, dim=1))[0]
    return out


@pytest.mark.parametrize("lengths,shared,cascade", [
    ([5, 17, 40, 41, 90, 200, 201, 9], 0, False),      # no sharing: length groups only
    ([70, 75, 90, 120, 300, 66], 8, True),             # 64 shared tokens, 6 decodes: cascade
    ([70, 75, 90], 8, False),                          # too few decodes to pay for it
    ([40, 45, 50, 60, 70], 4, False),                  # 32 shared tokens: too short
])
def test_decode_plan_matches_whole_context_attention(lengths, shared, cascade):
    q, k_cache, v_cache, meta = _decode_batch(lengths, shared)
    plan = decode_plan(meta)
    assert (plan.shared_blocks is not None) == cascade
    if cascade:
        assert plan.shared_tokens == shared * BS
    out = torch.zeros_like(q)
    decode_attention(q, k_cache, v_cache, plan, out)
    torch.testing.assert_close(out, _reference(q, k_cache, v_cache, meta), rtol=1e-5, atol=1e-5)
    assert decode_plan(meta) is plan          # built once per step, reused by every layer


def test_sequence_wholly_inside_the_shared_blocks_keeps_a_key_of_its_own():
    # 80 tokens = exactly the 10 shared blocks: the shared part stops one block short for it.
    q, k_cache, v_cache, meta = _decode_batch([80, 90, 100, 110, 120], 10)
    plan = decode_plan(meta)
    assert plan.shared_tokens == 9 * BS
    out = torch.zeros_like(q)
    decode_attention(q, k_cache, v_cache, plan, out)
    torch.testing.assert_close(out, _reference(q, k_cache, v_cache, meta), rtol=1e-5, atol=1e-5)
