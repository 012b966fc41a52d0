"""The torch backend's decode planning: length groups and cascade attention over a shared
prefix give the same outputs as attending each sequence's whole context directly."""
import pytest
import torch

from engine.attention import AttentionMetadata
from engine.attention.reference_ops import gather_context
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
    """Each decode's attention over its whole context, in float64, and its error scale: the
    rows' fp32 rounding bound (below). Returns (reference [B, H, D] float64, scale [B, 1, 1])."""
    out = torch.empty(q.shape, dtype=torch.float64)
    scale = torch.empty(len(meta.seq_lens), 1, 1, dtype=torch.float64)
    for i, n in enumerate(meta.seq_lens):
        ks, vs = (gather_context(c, meta.block_tables[i], n).double().repeat_interleave(H // KVH, dim=1)
                  for c in (k_cache, v_cache))
        scores = torch.einsum("hd,khd->hk", q[i].double(), ks) * q.shape[-1] ** -0.5
        out[i] = torch.einsum("hk,khd->hd", scores.softmax(-1), vs)
        # An fp32 score s carries an error of about |s| * eps, which moves its weight by that
        # factor and the output by that much of a value: the output's error scale is
        # (1 + max|s|) * max|v| * eps, however peaked the weights (at 30x scores most of them
        # underflow and the scores' own rounding dominates).
        scale[i] = (1 + scores.abs().max()) * vs.abs().max() * torch.finfo(torch.float32).eps
    return out, scale


def assert_attention_close(out, q, k_cache, v_cache, meta):
    """`out` (fp32 attention of each decode) within 4x its error scale of the float64 reference:
    the kernels measured so far stay under a quarter of the scale, as torch's own fp32 attention
    does, while a decode that reads one token too few misses by thousands of it."""
    want, scale = _reference(q, k_cache.float(), v_cache.float(), meta)
    worst = ((out.double() - want).abs() / scale).max().item()
    assert worst <= 4, f"attention off by {worst:.1f}x its fp32 error scale"


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
    assert_attention_close(out, q, k_cache, v_cache, meta)
    assert decode_plan(meta) is plan          # built once per step, reused by every layer


def test_sequence_wholly_inside_the_shared_blocks_keeps_a_key_of_its_own():
    # 80 tokens = exactly the 10 shared blocks: the shared part stops one block short for it.
    q, k_cache, v_cache, meta = _decode_batch([80, 90, 100, 110, 120], 10)
    plan = decode_plan(meta)
    assert plan.shared_tokens == 9 * BS
    out = torch.zeros_like(q)
    decode_attention(q, k_cache, v_cache, plan, out)
    assert_attention_close(out, q, k_cache, v_cache, meta)
