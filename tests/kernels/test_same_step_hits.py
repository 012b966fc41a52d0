"""Same-step prefix hits, on every attention backend.

vLLM (and kvscope) registers a full block in the prefix cache when it is allocated, so a
request admitted later in the same step may hit blocks that an earlier request of that step
is computing right now. That is only correct because each layer writes the whole step's K/V
into the paged cache before its attention reads the cache. Here request A computes a fresh
prompt into blocks 1-3 while request B's block table starts with A's blocks 1 and 2 (its
prefix hit); the cache starts full of noise, so a backend that read before writing, or read
B's context from anywhere but the cache, would give B the wrong output."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from engine.attention.torch_backend import TorchAttentionBackend

from .paged_cases import DEVICE, caches, metadata


def _dense_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context_len: int) -> torch.Tensor:
    """Causal attention written out in fp32: queries sit at positions context_len.. of k/v."""
    n, h, d = q.shape
    group = h // k.shape[1]
    kf, vf = k.float().repeat_interleave(group, dim=1), v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), kf) * d ** -0.5
    visible = torch.arange(k.shape[0])[None, :] <= torch.arange(context_len, context_len + n)[:, None]
    probs = scores.masked_fill(~visible.to(q.device)[None], float("-inf")).softmax(-1)
    return torch.einsum("hqk,khd->qhd", probs, vf)


def _check_same_step_hit(backend, block_size: int, dtype: torch.dtype, tol: float, h=6, kvh=2, d=16) -> None:
    gen = torch.Generator().manual_seed(0)
    hit = 2 * block_size
    a_len, b_new = hit + 3, 5
    seqs = [(0, a_len), (hit, b_new)]                     # (context_len, num_queries) per request
    tables = torch.tensor([[1, 2, 3], [1, 2, 4]], device=DEVICE)  # B's first two blocks are A's
    k_cache, v_cache = caches(gen, 5, block_size, kvh, d, dtype)  # noise where A is about to write
    t = a_len + b_new
    q, k, v = (torch.randn(t, n, d, generator=gen).to(DEVICE, dtype) for n in (h, kvh, kvh))
    out = backend.forward(0, q, k, v, k_cache, v_cache, metadata(seqs, tables, block_size))
    want_a = _dense_reference(q[:a_len], k[:a_len], v[:a_len], 0)
    b_keys = torch.cat([k[:hit], k[a_len:]]), torch.cat([v[:hit], v[a_len:]])
    want_b = _dense_reference(q[a_len:], *b_keys, hit)
    torch.testing.assert_close(out[:a_len].float(), want_a, atol=tol, rtol=tol)
    torch.testing.assert_close(out[a_len:].float(), want_b, atol=tol, rtol=tol)


def test_torch_backend_reads_blocks_written_earlier_in_the_same_step():
    _check_same_step_hit(TorchAttentionBackend(), block_size=8, dtype=torch.float32, tol=1e-4)


def test_triton_backend_reads_blocks_written_earlier_in_the_same_step():
    pytest.importorskip("triton", reason="the triton package is not installed (pip install -e '.[dev]')")
    from engine.attention.triton_backend import TritonAttentionBackend

    _check_same_step_hit(TritonAttentionBackend(), block_size=8, dtype=torch.float32, tol=1e-4)


def test_flash_attn_backend_reads_blocks_written_earlier_in_the_same_step(flash_attn_transcription):
    from engine.attention.flash_attn_backend import FlashAttentionBackend

    _check_same_step_hit(FlashAttentionBackend(), block_size=256, dtype=torch.bfloat16, tol=2e-2)


def test_the_check_fails_when_a_backend_reads_the_cache_before_writing_it():
    class ReadsFirst(TorchAttentionBackend):
        def forward(self, layer, q, k, v, k_cache, v_cache, meta):
            no_writes = dataclasses.replace(meta, slot_mapping=torch.full_like(meta.slot_mapping, -1))
            out = super().forward(layer, q, k, v, k_cache, v_cache, no_writes)  # attention over the old cache
            super().forward(layer, q, k, v, k_cache, v_cache, meta)            # the writes land only afterwards
            return out

    # Only B, whose context comes from the cache, is wrong.
    with pytest.raises(AssertionError):
        _check_same_step_hit(ReadsFirst(), block_size=8, dtype=torch.float32, tol=1e-4)
