"""kvscope's native CPU kernels (engine/cpu_kernels) against torch: the panel linear at every
row count the engine sends it, the paged decode attention over random block tables, and the
engine that picks them (its greedy tokens against the torch backend's: test_native_decode.py)."""
from itertools import pairwise

import pytest
import torch
import torch.nn.functional as F

from engine import SamplingParams
from engine.attention import get_attention_backend
from engine.attention.reference_ops import write_kv
from engine.cpu_kernels import (
    DISABLE_ENV_VAR,
    ROUND_INPUT,
    ROUND_OUTPUT,
    cache_clear,
    load_variant,
    native,
    unavailable_reason,
    variants,
)
from engine.model import cpu_linear
from engine.model.cpu_linear import UNMEASURED_MAX_ROWS, PackedLinear
from engine.model.layers import RMSNorm, RotaryEmbedding, SwiGLU

from .test_torch_decode import _decode_batch, assert_attention_close

kernels = native()
pytestmark = pytest.mark.skipif(kernels is None, reason="native CPU kernels need gcc and an AVX2 CPU")
# Each build of the kernels this CPU runs (the linears differ between them; the rest is shared).
RUNNABLE = [name for name, reason in variants().items() if reason is None] if kernels is not None else []


@pytest.fixture(params=RUNNABLE)
def each(request):
    """The kernels of one variant this machine runs."""
    return load_variant(request.param)


@pytest.mark.parametrize("rows", [1, 2, 5, 6, 7, 16, 63, 130])
# 50: a partial last panel; at one row, 184 and 576 read several panels side by side per
# thread (micro_streams), 184's partial last panel among them, 96 one panel at a time; 1000's
# last eighth (7 panels) goes to free threads as six side by side and one alone.
@pytest.mark.parametrize("n,k", [(96, 40), (50, 33), (184, 40), (576, 1536), (1000, 40)])
def test_panel_linear_matches_f_linear(rows, n, k, each):
    g = torch.Generator().manual_seed(rows * n)
    # Weights scaled as a trained layer's are (outputs of order 1), so fp32 rounding stays small.
    w, b, x = torch.randn(n, k, generator=g) / k ** 0.5, torch.randn(n, generator=g), torch.randn(rows, k, generator=g)
    panels = each.pack_panels(w)
    want = F.linear(x.double(), w.double(), b.double()).float()
    torch.testing.assert_close(each.linear(x, panels, n, b), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(each.linear(x, panels, n, None), want - b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 6, 7, 63])
# 120, 600: side-by-side panels at one row (600's last eighth, 4 panels, side by side to a free thread)
@pytest.mark.parametrize("n,k", [(96, 40), (50, 33), (120, 33), (600, 64)])
def test_bf16_panels_hold_the_rounded_weights_and_sum_in_fp32(rows, n, k, each):
    """bf16 panels (a bf16 engine's) hold each weight rounded to nearest even, as torch rounds
    it, at half the bytes; the products and sums stay fp32, so the result is fp32's over the
    rounded weights."""
    g = torch.Generator().manual_seed(rows * n + 1)
    w, b, x = torch.randn(n, k, generator=g) / k ** 0.5, torch.randn(n, generator=g), torch.randn(rows, k, generator=g)
    panels = each.pack_panels(w, torch.bfloat16)
    depth = k + k % 2 if each.variant == "avx512_bf16" else k  # pair panels hold k steps in pairs
    assert panels.dtype == torch.bfloat16 and panels.numel() == -(-n // 16) * 16 * depth
    rounded = w.to(torch.bfloat16).double()
    want = F.linear(x.double(), rounded, b.double()).float()
    torch.testing.assert_close(each.linear(x, panels, n, b), want, rtol=1e-5, atol=1e-5)
    # Far from fp32's own result over the unrounded weights: the panels really are bf16.
    assert (each.linear(x, panels, n, None) - F.linear(x, w)).abs().max() > 1e-4
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        each.pack_panels(w, torch.float16)


@pytest.mark.parametrize("rows", [1, 7, 30])
@pytest.mark.parametrize("n,k", [(96, 40), (50, 33), (600, 64)])
def test_linear_rounds_rows_and_outputs_to_bf16_values_where_asked(rows, n, k, each):
    """A bf16 engine's rounding (ROUND_INPUT / ROUND_OUTPUT): the rows are multiplied as bf16
    values, rounded to nearest even as torch rounds them (the caller's x untouched), and the
    outputs are rounded after the bias; each flag alone does only its own part."""
    g = torch.Generator().manual_seed(rows * n + 7)
    w, b, x = torch.randn(n, k, generator=g) / k ** 0.5, torch.randn(n, generator=g), torch.randn(rows, k, generator=g)
    x_before = x.clone()
    panels = each.pack_panels(w, torch.bfloat16)
    w16 = w.to(torch.bfloat16).double()
    exact_in = F.linear(x.to(torch.bfloat16).double(), w16, b.double())  # bf16 products: exact in fp32
    torch.testing.assert_close(each.linear(x, panels, n, b, ROUND_INPUT), exact_in.float(), rtol=1e-5, atol=1e-5)
    both = each.linear(x, panels, n, b, ROUND_INPUT | ROUND_OUTPUT)
    assert torch.equal(both, both.to(torch.bfloat16).float())  # bf16 values in fp32 storage
    # Within one bf16 rounding of the exact sum (fp32 sums may land either side of a tie).
    torch.testing.assert_close(both, exact_in.float(), rtol=2 ** -8, atol=1e-6)
    out_only = each.linear(x, panels, n, b, ROUND_OUTPUT)
    assert torch.equal(out_only, each.linear(x, panels, n, b).to(torch.bfloat16).float())
    assert torch.equal(x, x_before)
    # The rows really are rounded: far from the fp32 rows' product over the same weights.
    assert (each.linear(x, panels, n, b, ROUND_INPUT) - each.linear(x, panels, n, b)).abs().max() > 1e-4


@pytest.mark.skipif(len(RUNNABLE) < 2, reason=f"this CPU runs one kernel variant only: {variants()}")
@pytest.mark.parametrize("rows", [1, 13])
@pytest.mark.parametrize("n,k", [(96, 40), (50, 33), (600, 64)])
def test_kernel_variants_agree(rows, n, k):
    """Every variant this CPU runs: fp32 rows give the same bits on every build (one FMA per k
    step, in k order, whatever the vector width); rows rounded to bf16, which the avx512_bf16
    build multiplies with vdpbf16ps (its own order of the same exact products), give outputs
    within one bf16 rounding of each other."""
    g = torch.Generator().manual_seed(rows + n)
    w, b, x = torch.randn(n, k, generator=g) / k ** 0.5, torch.randn(n, generator=g), torch.randn(rows, k, generator=g)
    builds = {name: load_variant(name) for name in RUNNABLE}
    for dtype in (torch.float32, torch.bfloat16):
        outs = [kern.linear(x, kern.pack_panels(w, dtype), n, b) for kern in builds.values()]
        assert all(torch.equal(outs[0], out) for out in outs), dtype
    rounded = [kern.linear(x, kern.pack_panels(w, torch.bfloat16), n, b, ROUND_INPUT | ROUND_OUTPUT)
               for kern in builds.values()]
    for out in rounded[1:]:
        torch.testing.assert_close(out, rounded[0], rtol=2 ** -7, atol=1e-6)


@pytest.mark.parametrize("rows", ["one", "limit", "limit+1", "300"])
def test_packed_linear_takes_the_panels_for_few_rows_and_onednn_for_many(rows, monkeypatch):
    limit = UNMEASURED_MAX_ROWS
    n = {"one": 1, "limit": limit, "limit+1": limit + 1, "300": 300}[rows]
    g = torch.Generator().manual_seed(n)
    w, b, x = torch.randn(64, 48, generator=g), torch.randn(64, generator=g), torch.randn(n, 48, generator=g)
    layer = PackedLinear(w, b)
    assert layer.native_max_rows == limit
    calls = []
    monkeypatch.setattr(type(kernels), "linear", lambda self, *a: calls.append(a) or F.linear(a[0], w, b))
    torch.testing.assert_close(layer(x), F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    assert bool(calls) == (n <= limit)


def test_a_layer_packed_here_starts_with_the_unmeasured_row_limit(monkeypatch):
    """A PackedLinear starts with UNMEASURED_MAX_ROWS, for either panel dtype, until a runner
    gives it this machine's measured limit (tests/engine/test_crossover.py)."""
    w = torch.randn(32, 16)
    assert PackedLinear(w, None).native_max_rows == UNMEASURED_MAX_ROWS == 64
    monkeypatch.setattr(cpu_linear, "UNMEASURED_MAX_ROWS", 5)
    assert PackedLinear(w, None, panel_dtype=torch.bfloat16).native_max_rows == 5
    assert cpu_linear.native_max_rows(torch.float32) == 5


# [1] and [250]: fewer decodes than threads, so each decode's tokens are split between the
# threads (one of them empty for [1]) and the parts combined.
@pytest.mark.parametrize("lengths", [[1], [250], [5, 16, 17, 40], [33, 2, 100, 64, 7, 9, 128, 250]])
@pytest.mark.parametrize("score_scale", [1.0, 30.0])  # 30: most weights underflow (denormals flushed)
def test_paged_decode_attention_matches_whole_context_attention(lengths, score_scale):
    q, k_cache, v_cache, meta = _decode_batch(lengths, seed=len(lengths))
    q = q * score_scale
    # Query rows spread through a larger batch, as decodes sit among prefill rows.
    rows = torch.arange(len(lengths)) * 2 + 1
    q_big = torch.randn(2 * len(lengths) + 1, *q.shape[1:])
    q_big[rows] = q
    # q as the model passes it: a view into packed q|k|v rows (rows apart, each row contiguous).
    q_big = torch.cat([q_big.flatten(1), torch.randn(q_big.shape[0], 40)], dim=1)[:, :q.shape[1] * q.shape[2]]
    q_big = q_big.view(-1, *q.shape[1:])
    out = torch.zeros(q_big.shape)
    kernels.paged_decode_attention(q_big, k_cache, v_cache, rows, torch.tensor(lengths), meta.block_tables, out)
    assert_attention_close(out[rows], q, k_cache, v_cache, meta)
    assert not out[rows - 1].any()  # other rows untouched


@pytest.mark.parametrize("score_scale", [1.0, 30.0])
def test_the_attention_check_catches_a_decode_that_reads_one_token_too_few(score_scale):
    """The tolerance above is the output's fp32 error scale, not a fixed atol: a kernel that
    drops each context's last token (an off-by-one in seq_lens) still fails it."""
    lengths = [33, 2, 100, 64, 7, 9, 128, 250]
    q, k_cache, v_cache, meta = _decode_batch(lengths, seed=len(lengths))
    q, out = q * score_scale, torch.zeros(q.shape)
    kernels.paged_decode_attention(q, k_cache, v_cache, torch.arange(len(lengths)), torch.tensor(lengths) - 1,
                                   meta.block_tables, out)
    with pytest.raises(AssertionError, match="fp32 error scale"):
        assert_attention_close(out, q, k_cache, v_cache, meta)


def test_reshape_and_cache_stores_strided_rows_at_their_slots_and_skips_minus_one():
    g = torch.Generator().manual_seed(0)
    blocks, bs, kvh, d, tokens = 6, 4, 2, 8, 7
    qkv = torch.randn(tokens, (3 + 2 * kvh) * d, generator=g)  # 3 q heads, then k, then v
    k = qkv[:, 3 * d:(3 + kvh) * d].view(tokens, kvh, d)
    v = qkv[:, (3 + kvh) * d:].view(tokens, kvh, d)
    slots = torch.tensor([5, 0, -1, 23, 9, -1, 12])
    k_cache, v_cache = torch.zeros(blocks, bs, kvh, d), torch.zeros(blocks, bs, kvh, d)
    want_k, want_v = k_cache.clone(), v_cache.clone()
    write_kv(k, v, want_k, want_v, slots)
    kernels.reshape_and_cache(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)
    # A bf16 cache: each value rounded to nearest even, exactly as torch's .to(torch.bfloat16).
    k16 = torch.zeros(blocks, bs, kvh, d, dtype=torch.bfloat16)
    v16 = torch.zeros(blocks, bs, kvh, d, dtype=torch.bfloat16)
    kernels.reshape_and_cache(k * 1.001, v, k16, v16, slots)
    assert torch.equal(k16, (want_k * 1.001).to(torch.bfloat16)) and torch.equal(v16, want_v.to(torch.bfloat16))


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_decode_attention_splits_few_decodes_between_the_threads(threads, dtype):
    """Two decodes on two threads take one thread each; on three, each decode's context is split
    in three parts (FlashDecoding's split-KV) whose unnormalized sums combine into the whole
    context's attention."""
    lengths = [2, 130]
    q, k_cache, v_cache, meta = _decode_batch(lengths, seed=11)
    k_cache, v_cache = k_cache.to(dtype), v_cache.to(dtype)
    out, before = torch.zeros(q.shape), torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        kernels.paged_decode_attention(q, k_cache, v_cache, torch.arange(2), torch.tensor(lengths),
                                       meta.block_tables, out)
    finally:
        torch.set_num_threads(before)
    assert_attention_close(out, q, k_cache, v_cache, meta)


def test_paged_decode_attention_reads_a_bf16_cache_in_fp32():
    """A bf16 cache: each key and value widened exactly, every product and sum in fp32, so the
    result is fp32 attention over the cache's (rounded) values."""
    lengths = [5, 16, 17, 40, 3]
    q, k_cache, v_cache, meta = _decode_batch(lengths, seed=7)
    k16, v16 = k_cache.to(torch.bfloat16), v_cache.to(torch.bfloat16)
    rows = torch.arange(len(lengths))
    out = torch.zeros(q.shape)
    kernels.paged_decode_attention(q, k16, v16, rows, torch.tensor(lengths), meta.block_tables, out)
    assert_attention_close(out, q, k16, v16, meta)


# (9, 3, 64): the default model's heads (two groups of four query heads and one alone, 64 values
# of V per pass); (8, 8, 80): a head_dim past 64, whose last 16 values go 8 at a time.
@pytest.mark.parametrize("h,kvh,d", [(9, 3, 64), (8, 8, 80)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_decode_attention_at_real_head_shapes(h, kvh, d, dtype):
    g = torch.Generator().manual_seed(h + d)
    bs, lengths = 16, [1, 37, 300]
    blocks = torch.randperm(60, generator=g).tolist()
    tables, at = [], 0
    for n in lengths:
        tables.append(blocks[at:at + -(-n // bs)] + [0] * (19 - -(-n // bs)))
        at += -(-n // bs)
    k_cache = torch.randn(60, bs, kvh, d, generator=g).to(dtype)
    v_cache = torch.randn(60, bs, kvh, d, generator=g).to(dtype)
    q = torch.randn(len(lengths), h, d, generator=g)
    out = torch.zeros(q.shape)
    for decodes in (range(len(lengths)), [2]):  # as many decodes as threads and more; one (split)
        rows = torch.tensor(list(decodes))
        kernels.paged_decode_attention(q, k_cache, v_cache, rows, torch.tensor([lengths[i] for i in decodes]),
                                       torch.tensor([tables[i] for i in decodes]), out)
        for i in decodes:
            slots = torch.tensor([tables[i][t // bs] * bs + t % bs for t in range(lengths[i])])
            keys = k_cache.flatten(0, 1)[slots].float().repeat_interleave(h // kvh, dim=1)  # [n, h, d]
            values = v_cache.flatten(0, 1)[slots].float().repeat_interleave(h // kvh, dim=1)
            probs = (torch.einsum("hd,nhd->hn", q[i], keys) * d ** -0.5).softmax(-1)
            torch.testing.assert_close(out[i], torch.einsum("hn,nhd->hd", probs, values), rtol=1e-5, atol=1e-5)


def _prompts_in_cache(lengths, h, kvh, d, dtype, seed, bs=16):
    """Random K/V for sequences of `lengths` tokens on shuffled blocks of a paged cache: the
    caches, each sequence's block table row (padded with block 0) and the slots of its tokens."""
    g = torch.Generator().manual_seed(seed)
    counts = [-(-n // bs) for n in lengths]
    blocks = torch.randperm(sum(counts) + 2, generator=g).tolist()
    tables, slots, at = [], [], 0
    for n, c in zip(lengths, counts):
        row = blocks[at:at + c]
        tables.append(row + [0] * (max(counts) - c))
        slots.append(torch.tensor([row[t // bs] * bs + t % bs for t in range(n)]))
        at += c
    shape = (len(blocks), bs, kvh, d)
    k_cache, v_cache = torch.randn(shape, generator=g).to(dtype), torch.randn(shape, generator=g).to(dtype)
    return k_cache, v_cache, torch.tensor(tables), slots


def _prefill(kern, q, k_cache, v_cache, tables, q_lens, ctx_lens, threads=None):
    """The prefill kernel over sequences whose query rows follow each other in q."""
    starts = [0]
    for n in q_lens[:-1]:
        starts.append(starts[-1] + n)
    out, before = torch.full(q.shape, float("nan")), torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        kern.paged_prefill_attention(q, k_cache, v_cache, torch.tensor(starts), torch.tensor(q_lens),
                                     torch.tensor(ctx_lens), tables, out)
    finally:
        torch.set_num_threads(before)
    return out


# (9, 3, 64): the default model (8 queries x 3 heads per tile); (8, 8, 80): no grouping and a
# head_dim past 64; (12, 2, 32): six heads a group, a tile's lanes straddling queries unevenly.
@pytest.mark.parametrize("h,kvh,d", [(9, 3, 64), (8, 8, 80), (12, 2, 32)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_prefill_attention_matches_causal_attention_over_the_context(h, kvh, d, dtype, each):
    """Fresh prompts (context 0), a chunk after 37 cached tokens, a 1-row tail and a prompt of
    300: each query row attends to its own position and everything before it, through the block
    table, in fp32 over the cache's values."""
    q_lens, ctx_lens = [5, 40, 1, 300], [0, 37, 16, 0]
    lengths = [c + n for c, n in zip(ctx_lens, q_lens)]
    k_cache, v_cache, tables, slots = _prompts_in_cache(lengths, h, kvh, d, dtype, seed=h + d)
    q = torch.randn(sum(q_lens), h, d, generator=torch.Generator().manual_seed(d))
    out = _prefill(each, q, k_cache, v_cache, tables, q_lens, ctx_lens)
    at = 0
    for n, ctx, sl in zip(q_lens, ctx_lens, slots):
        keys = k_cache.flatten(0, 1)[sl].double().repeat_interleave(h // kvh, dim=1)
        values = v_cache.flatten(0, 1)[sl].double().repeat_interleave(h // kvh, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q[at:at + n].double(), keys) * d ** -0.5
        seen = torch.arange(ctx + n)[None, :] <= torch.arange(ctx, ctx + n)[:, None]
        want = torch.einsum("hqk,khd->qhd", scores.masked_fill(~seen, float("-inf")).softmax(-1), values)
        torch.testing.assert_close(out[at:at + n], want.float(), rtol=1e-5, atol=1e-5)
        at += n


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_prefill_attention_gives_a_row_the_same_bits_in_any_chunk_or_batch(dtype, each):
    """The engine's promise that chunking and prefix hits compute the same thing, kept to the
    bit: a 200-token prompt whole, in chunks cut anywhere (tiles then hold other queries), next
    to another prompt, and on 1 or 3 threads, gives every row the same output."""
    h, kvh, d = 9, 3, 64
    k_cache, v_cache, tables, _ = _prompts_in_cache([200, 90], h, kvh, d, dtype, seed=5)
    q = torch.randn(290, h, d, generator=torch.Generator().manual_seed(6))
    whole = _prefill(each, q[:200], k_cache, v_cache, tables[:1], [200], [0])
    for cuts in ([0, 24, 77, 200], [0, 1, 17, 199, 200], [0, 160, 200]):
        chunks = [_prefill(each, q[a:b], k_cache, v_cache, tables[:1], [b - a], [a], threads=3)
                  for a, b in pairwise(cuts)]
        assert torch.equal(torch.cat(chunks), whole), cuts
    both = _prefill(each, torch.cat([q[200:], q[:200]]), k_cache, v_cache, tables.flip(0), [90, 200], [0, 0], threads=1)
    assert torch.equal(both[90:], whole)


def test_cpu_backend_is_auto_in_fp32_and_bf16_and_names_why_not():
    cpu = torch.device("cpu")
    assert get_attention_backend("auto", cpu, 16, torch.float32).name == "cpu"
    assert get_attention_backend("auto", cpu, 16, torch.bfloat16).name == "cpu"  # fp32 arithmetic, bf16 KV
    assert get_attention_backend("auto", cpu, 16, torch.float16).name == "torch"
    with pytest.raises(ValueError, match=r"attention_backend 'cpu'.*float32 or bfloat16, got cpu and float16"):
        get_attention_backend("cpu", cpu, 16, torch.float16)


def test_disabling_native_kernels_falls_back_to_torch(monkeypatch):
    monkeypatch.setenv(DISABLE_ENV_VAR, "0")
    cache_clear()
    try:
        assert native() is None and DISABLE_ENV_VAR in unavailable_reason()
        assert get_attention_backend("auto", torch.device("cpu"), 16, torch.float32).name == "torch"
        with pytest.raises(ValueError, match=r"attention_backend 'cpu'.*KVSCOPE_NATIVE_CPU=0"):
            get_attention_backend("cpu", torch.device("cpu"), 16, torch.float32)
    finally:
        monkeypatch.delenv(DISABLE_ENV_VAR)
        cache_clear()
    assert native() is not None and unavailable_reason() is None


@pytest.mark.parametrize("rows", [1, 3, 40])
def test_native_small_ops_match_the_torch_layers(rows):
    """RMSNorm, RoPE (in place on the packed q|k|v rows) and SiLU-and-mul against the torch code
    of engine/model/layers.py that they replace."""
    g = torch.Generator().manual_seed(rows)
    norm = RMSNorm(72, 1e-5)
    norm.weight.data = torch.rand(72, generator=g) + 0.5
    x, residual = torch.randn(rows, 72, generator=g) * 3, torch.randn(rows, 72, generator=g)
    want, (want_fused, want_sum) = norm(x), norm(x, residual)
    norm.native = kernels
    torch.testing.assert_close(norm(x), want, rtol=1e-6, atol=1e-6)
    fused, total = norm(x, residual.clone())                    # residual + x, then the norm of the sum
    assert torch.equal(total, want_sum)                         # the same additions as torch
    torch.testing.assert_close(fused, want_fused, rtol=1e-6, atol=1e-6)
    head_norm = RMSNorm(18, 1e-5)  # a per-head norm (Qwen3's q/k norm) on a non-contiguous view
    heads_view = x.view(rows, 4, 18)[:, 1:3]
    want = head_norm(heads_view)
    head_norm.native = kernels
    torch.testing.assert_close(head_norm(heads_view), want, rtol=1e-6, atol=1e-6)

    heads, kv_heads, d = 4, 2, 16
    rope = RotaryEmbedding(d, 512, 10000.0)
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * d, generator=g)
    positions = torch.randint(0, 512, (rows,), generator=g)
    q, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    want_q, want_k = rope(positions, q.reshape(rows, heads, d), k.reshape(rows, kv_heads, d))
    want_v = v.clone()
    rope.native = kernels
    rope.rotate_packed_(positions, qkv, heads + kv_heads)
    q, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    torch.testing.assert_close(q.reshape(rows, heads, d), want_q, rtol=0, atol=0)   # the same roundings
    torch.testing.assert_close(k.reshape(rows, kv_heads, d), want_k, rtol=0, atol=0)
    assert torch.equal(v, want_v)                                                   # v untouched

    mlp = SwiGLU(24, 36)
    x = torch.randn(rows, 24, generator=g)
    want = mlp(x)
    mlp.native = kernels
    torch.testing.assert_close(mlp(x), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("rows,vocab,k", [(1, 49152, 10), (5, 1001, 3), (9, 37, 37), (2, 8, 1)])
def test_greedy_top_matches_torch_argmax_topk_and_softmax(rows, vocab, k):
    """One pass per row (partial vectors at the end, k up to the whole vocabulary) against
    torch; a tied maximum goes to the lower index, as torch.argmax picks it."""
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(vocab)) * 4
    logits[0, 7] = logits[0, 2] = logits[0].max() + 1
    ids, probs = kernels.greedy_top(logits, k)
    ids, probs = torch.tensor(ids), torch.tensor(probs)
    assert torch.equal(ids[:, 0], logits.argmax(-1)) and ids[0, 0] == 2
    ref_probs, ref_ids = logits.softmax(-1).topk(k)
    tied = {2, 7}  # either may come first in torch.topk
    assert torch.equal(ids[1:], ref_ids[1:]) and set(ids[0].tolist()) - tied == set(ref_ids[0].tolist()) - tied
    torch.testing.assert_close(probs, ref_probs, rtol=1e-5, atol=1e-7)


def test_sampler_gives_torchs_tokens_and_candidates_with_the_native_pass():
    """The engine's sampler both ways on the same logits: greedy rows with 0, 3 and 10
    candidates shown, and a random row between them (drawn with the same seed)."""
    from engine.request import Request
    from engine.runner.sampler import Sampler

    logits = torch.randn(4, 5000, generator=torch.Generator().manual_seed(0)) * 3
    params = [SamplingParams(temperature=0.0, logprobs_top=10), SamplingParams(temperature=0.0, logprobs_top=0),
              SamplingParams(temperature=0.8, seed=3, logprobs_top=5), SamplingParams(temperature=0.0, logprobs_top=3)]
    results = {}
    for way in ("native", "torch"):
        sampler = Sampler(seed=0)
        assert sampler.native is not None
        if way == "torch":
            sampler.native = None
        requests = [Request(str(i), [1, 2], p, None) for i, p in enumerate(params)]
        results[way] = sampler(logits, requests)
    for a, b in zip(results["native"], results["torch"]):
        assert a.token_id == b.token_id and [t for t, _ in a.top] == [t for t, _ in b.top]
        assert [p for _, p in a.top] == pytest.approx([p for _, p in b.top], rel=1e-5)
    assert [len(r.top) for r in results["native"]] == [10, 0, 5, 3]


@pytest.mark.parametrize("n", [1, 7, 8, 1001, 6 * 8 * 2 * 37 + 13])
def test_read_streams_reads_every_float_once(n):
    """The bench's bandwidth reader (several runs side by side per thread) adds every float once,
    the tail past the last whole vector and past the last whole set of runs included."""
    x = torch.arange(n, dtype=torch.float32) % 97
    assert kernels.read_streams(x) == pytest.approx(float(x.double().sum()), rel=1e-6)
