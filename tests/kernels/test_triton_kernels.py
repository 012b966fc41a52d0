"""Our Triton kernels and the `triton` attention backend against the torch reference.

On a machine without CUDA the kernels run under Triton's interpreter (tests/conftest.py sets
TRITON_INTERPRET=1 before triton is imported), so sizes here stay small. The @gpu variants
(bf16/fp16 at model-sized heads) run only with `pytest -m gpu` on a CUDA machine.
"""
from __future__ import annotations

import sys

import pytest
import torch

pytest.importorskip("triton", reason="the triton package is not installed (pip install -e '.[dev]')")

from engine.attention.reference_ops import attention_probs, causal_mask, gather_context, write_kv
from engine.attention.triton_backend import TritonAttentionBackend
from engine.attention.triton_kernels import paged_decode_attention, paged_prefill_attention, store_kvcache

from .paged_cases import DEVICE, caches, random_tables, run_backends

# (block_size, num_heads, num_kv_heads, head_dim): GQA groups 1, 2, 3 and 4, head dims 16,
# 64 and a non-power-of-two 24 (padded to 32 inside the kernels), block sizes 1 .. 32.
SHAPES = [
    (1, 4, 4, 16),
    (8, 6, 2, 64),
    (16, 4, 2, 16),
    (32, 6, 2, 64),
    (16, 4, 1, 24),
]
SHAPE_IDS = [f"bs{b}-h{h}-kvh{k}-d{d}" for b, h, k, d in SHAPES]


# ------------------------------------------------------------------------------------------
# helpers: a random paged cache and the reference attention
# ------------------------------------------------------------------------------------------
def _reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, table: torch.Tensor,
               ctx: int, seq_len: int) -> torch.Tensor:
    """Queries at positions ctx .. seq_len-1 of one sequence over its cached context, fp32: [Q, H, D]."""
    kvh = k_cache.shape[2]
    ks = gather_context(k_cache, table, seq_len)
    vs = gather_context(v_cache, table, seq_len).float()
    probs = attention_probs(q, ks, causal_mask(q.shape[0], ctx, seq_len, q.device), kvh)  # [H, Q, K]
    return torch.einsum("hqk,khd->qhd", probs, vs.repeat_interleave(q.shape[1] // kvh, dim=1))


def _tol(dtype: torch.dtype) -> dict:
    return {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}


# ------------------------------------------------------------------------------------------
# store_kvcache
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("block_size", [1, 8, 16, 32])
def test_store_kvcache_matches_write_kv_and_skips_minus_one(block_size):
    gen = torch.Generator().manual_seed(block_size)
    kvh, d, num_blocks = 2, 16, 6
    k_cache, v_cache = caches(gen, num_blocks, block_size, kvh, d)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    n_slots = num_blocks * block_size
    slots = torch.randperm(n_slots - block_size, generator=gen)[:5] + block_size  # not the null block
    slots = torch.cat([slots[:2], torch.tensor([-1]), slots[2:], torch.tensor([-1])]).to(DEVICE)
    # k and v as column slices of one fused projection, as the model hands them over.
    qkv = torch.randn(slots.shape[0], 3 * kvh * d, generator=gen).to(DEVICE)
    k = qkv[:, kvh * d:2 * kvh * d].view(-1, kvh, d)
    v = qkv[:, 2 * kvh * d:].view(-1, kvh, d)
    store_kvcache(k, v, k_cache, v_cache, slots)
    write_kv(k, v, ref_k, ref_v, slots)
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)


def test_store_kvcache_all_skipped_writes_nothing():
    gen = torch.Generator().manual_seed(0)
    k_cache, v_cache = caches(gen, 3, 4, 2, 16)
    before = k_cache.clone(), v_cache.clone()
    k = torch.randn(3, 2, 16, generator=gen).to(DEVICE)
    store_kvcache(k, k, k_cache, v_cache, torch.full((3,), -1, dtype=torch.long, device=DEVICE))
    assert torch.equal(k_cache, before[0]) and torch.equal(v_cache, before[1])


# ------------------------------------------------------------------------------------------
# paged_decode_attention
# ------------------------------------------------------------------------------------------
def _check_decode(block_size, h, kvh, d, lens, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    num_blocks = 1 + sum(-(-n // block_size) for n in lens) + 2
    k_cache, v_cache = caches(gen, num_blocks, block_size, kvh, d, dtype)
    tables = random_tables(gen, lens, block_size, num_blocks)
    q = torch.randn(len(lens), h, d, generator=gen).to(DEVICE, dtype)
    seq_lens = torch.tensor(lens, device=DEVICE)
    out = paged_decode_attention(q, k_cache, v_cache, tables, seq_lens, d ** -0.5)
    assert out.shape == q.shape and out.dtype == dtype
    for b, n in enumerate(lens):
        ref = _reference(q[b:b + 1], k_cache, v_cache, tables[b], n - 1, n)
        torch.testing.assert_close(out[b:b + 1].float(), ref, **_tol(dtype))


@pytest.mark.parametrize("block_size,h,kvh,d", SHAPES, ids=SHAPE_IDS)
def test_paged_decode_matches_reference(block_size, h, kvh, d):
    # Ragged: one token, a partial block, and more than one 64-key tile.
    _check_decode(block_size, h, kvh, d, [1, 7, 33, 70], seed=block_size)


def test_paged_decode_int32_seq_lens_and_strided_q():
    gen = torch.Generator().manual_seed(3)
    bs, h, kvh, d, lens = 8, 4, 2, 16, [5, 19]
    k_cache, v_cache = caches(gen, 8, bs, kvh, d)
    tables = random_tables(gen, lens, bs, 8)
    qkv = torch.randn(2, (h + 2 * kvh) * d, generator=gen).to(DEVICE)
    q = qkv[:, :h * d].view(2, h, d)  # not contiguous over tokens
    out = paged_decode_attention(q, k_cache, v_cache, tables,
                                 torch.tensor(lens, dtype=torch.int32, device=DEVICE), d ** -0.5)
    for b, n in enumerate(lens):
        torch.testing.assert_close(out[b:b + 1], _reference(q[b:b + 1], k_cache, v_cache, tables[b], n - 1, n),
                                   atol=1e-4, rtol=1e-4)


# ------------------------------------------------------------------------------------------
# paged_prefill_attention
# ------------------------------------------------------------------------------------------
# (context_len, num_queries): fresh prompts, a single query, a prefix hit / later chunk, and
# a sequence with more than one 64-row query tile.
PREFILL_SEQS = [(0, 5), (0, 1), (9, 7), (16, 70), (3, 1)]


def _prefill_case(seed, block_size, h, kvh, d, seqs, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [c + n for c, n in seqs]
    num_blocks = 1 + sum(-(-n // block_size) for n in seq_lens) + 2
    k_cache, v_cache = caches(gen, num_blocks, block_size, kvh, d, dtype)
    tables = random_tables(gen, seq_lens, block_size, num_blocks)
    qsl = [0]
    for _, n in seqs:
        qsl.append(qsl[-1] + n)
    q = torch.randn(qsl[-1], h, d, generator=gen).to(DEVICE, dtype)
    return q, k_cache, v_cache, tables, qsl, seq_lens


def _check_prefill(seed, block_size, h, kvh, d, seqs, dtype=torch.float32) -> torch.Tensor:
    """paged_prefill_attention over `seqs` ((context, new tokens) per sequence) against the
    reference, sequence by sequence; returns the kernel's output."""
    q, k_cache, v_cache, tables, qsl, seq_lens = _prefill_case(seed, block_size, h, kvh, d, seqs, dtype)
    i32 = lambda xs: torch.tensor(xs, dtype=torch.int32, device=DEVICE)  # noqa: E731
    ctx = [c for c, _ in seqs]
    out = paged_prefill_attention(q, k_cache, v_cache, i32(qsl), i32(seq_lens), i32(ctx), tables, d ** -0.5)
    for i, (c, _) in enumerate(seqs):
        s, e = qsl[i], qsl[i + 1]
        ref = _reference(q[s:e], k_cache, v_cache, tables[i], c, seq_lens[i])
        torch.testing.assert_close(out[s:e].float(), ref, **_tol(dtype))
    return out


@pytest.mark.parametrize("block_size,h,kvh,d", SHAPES, ids=SHAPE_IDS)
def test_paged_prefill_matches_reference(block_size, h, kvh, d):
    _check_prefill(block_size, block_size, h, kvh, d, PREFILL_SEQS)


def test_paged_prefill_on_a_subset_leaves_other_rows_alone():
    """The backend's mixed-step use: only the listed sequences (no trailing qsl entry, int64
    index tensors), written into a preallocated `out`."""
    seqs = [(0, 4), (5, 1), (6, 3)]
    q, k_cache, v_cache, tables, qsl, seq_lens = _prefill_case(7, 8, 4, 2, 16, seqs)
    out = torch.full_like(q, 123.0)
    pick = [0, 2]
    i64 = lambda xs: torch.tensor(xs, dtype=torch.long, device=DEVICE)  # noqa: E731
    paged_prefill_attention(q, k_cache, v_cache, i64([qsl[i] for i in pick]), i64([seq_lens[i] for i in pick]),
                            i64([seqs[i][0] for i in pick]), tables[pick], 16 ** -0.5, out=out)
    assert torch.all(out[4] == 123.0)
    for i in pick:
        s, e = qsl[i], qsl[i + 1]
        torch.testing.assert_close(out[s:e], _reference(q[s:e], k_cache, v_cache, tables[i], seqs[i][0],
                                                         seq_lens[i]), atol=1e-4, rtol=1e-4)


# ------------------------------------------------------------------------------------------
# the backend: same metadata, same answers as the torch reference
# ------------------------------------------------------------------------------------------
def test_backend_mixed_batch_matches_torch():
    # A fresh prompt, a decode, a later chunk, a decode, a prefix hit: decode rows in between.
    seqs = [(0, 5), (12, 1), (16, 9), (3, 1), (8, 4)]
    (ref, got), _ = run_backends(seqs, TritonAttentionBackend)
    torch.testing.assert_close(got[0], ref[0], atol=1e-4, rtol=1e-4)
    assert torch.equal(got[1], ref[1]) and torch.equal(got[2], ref[2])  # the same K/V written


@pytest.mark.parametrize("seqs", [[(4, 1), (17, 1), (1, 1)], [(0, 6), (0, 3)]], ids=["decode-only", "prefill-only"])
def test_backend_pure_steps_match_torch(seqs):
    (ref, got), _ = run_backends(seqs, TritonAttentionBackend, block_size=4, h=4, kvh=4)
    torch.testing.assert_close(got[0], ref[0], atol=1e-4, rtol=1e-4)
    assert torch.equal(got[1], ref[1]) and torch.equal(got[2], ref[2])


def test_backend_probe_mode_reads_the_cache_writes_nothing():
    seqs = [(5, 6)]
    (ref, got), (k0, v0) = run_backends(seqs, TritonAttentionBackend, probe_layer=1, layer=1)
    torch.testing.assert_close(got[0], ref[0], atol=1e-4, rtol=1e-4)
    assert torch.equal(got[1], k0) and torch.equal(got[2], v0)
    assert got[3] is not None and got[3].shape == (6, 6, 11)
    torch.testing.assert_close(got[3], ref[3])
    # Another layer than the probe's: outputs only.
    (_, other), _ = run_backends(seqs, TritonAttentionBackend, probe_layer=1, layer=0)
    assert other[3] is None


def test_backend_import_fails_cleanly_without_triton(monkeypatch):
    from engine.attention.selector import get_attention_backend

    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` now raises ImportError
    for name in ("engine.attention.triton_backend", "engine.attention.triton_kernels"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(ImportError, match="triton"):
        import engine.attention.triton_backend  # noqa: F401
    with pytest.raises(ValueError, match="attention_backend 'triton' is not available"):
        get_attention_backend("triton", torch.device("cpu"))
    from engine.cpu_kernels import native

    # 'auto' on a CPU never needs triton: the native cpu backend in fp32 and bf16 (where it
    # builds), else torch.
    assert get_attention_backend("auto", torch.device("cpu")).name == ("cpu" if native() else "torch")
    assert get_attention_backend("auto", torch.device("cpu"), dtype=torch.bfloat16).name == \
        ("cpu" if native() else "torch")


# ------------------------------------------------------------------------------------------
# the engine: same greedy tokens and probes as with the torch backend
# ------------------------------------------------------------------------------------------
def test_engine_triton_backend_matches_torch(tiny_qwen3_path):
    from engine import LLM, SamplingParams

    prompts = [
        list(range(1000, 1021)),               # 21 tokens: chunked at budget 16
        [*range(1000, 1016), 7, 8, 9],   # shares two full blocks with the first: a prefix hit
        [42, 43, 44],
    ]
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    runs = {}
    for backend in ("torch", "triton"):
        llm = LLM(model=str(tiny_qwen3_path), attention_backend=backend,
                  device="cpu" if DEVICE.type == "cpu" else "cuda", dtype="float32", block_size=8,
                  max_num_batched_tokens=16, num_kv_blocks=32, seed=0)
        assert llm.engine.runner.backend.name == backend
        eng = llm.engine
        ids = [eng.add_request(p, params) for p in prompts]
        probe = None
        while eng.has_unfinished_requests():
            eng.step()
            if probe is None and eng.requests[ids[0]].num_computed_tokens == len(prompts[0]):
                probe = eng.attention_probe(ids[0], layer=1).probs
        runs[backend] = ([list(eng.requests[r].output_token_ids) for r in ids], probe,
                         eng.metrics["prefix_cache_hits"])
    assert runs["triton"][0] == runs["torch"][0]
    assert runs["torch"][2] > 0  # the prefix cache really was hit
    torch.testing.assert_close(runs["triton"][1], runs["torch"][1])


# ------------------------------------------------------------------------------------------
# half precision: small here (bf16 is upcast for tl.dot under the interpreter), model-sized
# heads on a GPU only (pytest -m gpu)
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_kernels_small(dtype):
    _check_decode(8, 6, 2, 24, [1, 40, 70], dtype=dtype)
    assert _check_prefill(1, 8, 6, 2, 24, [(0, 20), (13, 7), (30, 1)], dtype).dtype == dtype


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("block_size,h,kvh,d", [(16, 32, 8, 128), (1, 16, 2, 64), (32, 12, 4, 80)])
def test_gpu_half_precision_kernels(dtype, block_size, h, kvh, d):
    _check_decode(block_size, h, kvh, d, [1, 100, 517, 2049], dtype=dtype)
    _check_prefill(1, block_size, h, kvh, d, [(0, 300), (130, 77), (1000, 1), (7, 64)], dtype)


@pytest.mark.gpu
def test_gpu_store_kvcache_bf16():
    gen = torch.Generator().manual_seed(0)
    k_cache, v_cache = caches(gen, 64, 16, 8, 128, torch.bfloat16)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    slots = torch.randperm(63 * 16, generator=gen)[:300].to(DEVICE) + 16
    slots[::7] = -1
    k = torch.randn(300, 8, 128, generator=gen).to(DEVICE, torch.bfloat16)
    v = torch.randn(300, 8, 128, generator=gen).to(DEVICE, torch.bfloat16)
    store_kvcache(k, v, k_cache, v_cache, slots)
    write_kv(k, v, ref_k, ref_v, slots)
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)
