"""Triton kernels for the paged KV cache: store K/V, paged decode, paged varlen prefill.

Layouts (as everywhere in the engine):
  q        [T, H, D]                       (rows of the packed batch)
  k, v     [T, KVH, D]                     (this step's new keys / values)
  caches   [num_blocks, block_size, KVH, D] (one pool per layer for K and one for V)
  slot     block_table[pos // block_size] * block_size + pos % block_size

All kernels read the KV cache token by token through the block table (a gathered load of
the block id for every key position in the tile), so any block size works (1, 8, 16, 32,
...), not only multiples of the tile. Softmax is the online (flash) one, accumulated in
fp32. Head dims that are not powers of two are padded to the next one and masked.

On CPU these run under Triton's interpreter (TRITON_INTERPRET=1 set before triton is
imported); on a GPU they compile. Only stable `tl` APIs are used (Triton 3.x; compiled with
3.6 on the GPU). The interpreter needs triton >= 3.7 when numpy >= 2.4: older interpreters
cannot use a loaded scalar as a range() bound there (triton-lang/triton#9171).
"""
from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

LOG2E = 1.4426950408889634  # the kernels use exp2: exp(x) == exp2(x * log2(e)), and exp2 is cheaper


# --------------------------------------------------------------------------------------
# store K/V
# --------------------------------------------------------------------------------------
@triton.jit
def _store_kvcache_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cb, stride_cs, stride_ch,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_KVH: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):
    # One program per token: copy its [KVH, D] keys and values to its slot.
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t)  # int64; -1 means "do not write" (padding, probe rows)
    offs_h = tl.arange(0, BLOCK_KVH)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_h[:, None] < NUM_KV_HEADS) & (offs_d[None, :] < HEAD_DIM) & (slot >= 0)
    k = tl.load(k_ptr + t * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :], mask=mask)
    v = tl.load(v_ptr + t * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask)
    # A -1 slot gives a negative address here, but every lane is masked off, so nothing is
    # written; the address is never dereferenced.
    base = (slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_cs
    dst = base + offs_h[:, None] * stride_ch + offs_d[None, :]
    tl.store(k_cache_ptr + dst, k, mask=mask)
    tl.store(v_cache_ptr + dst, v, mask=mask)


def store_kvcache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  slot_mapping: torch.Tensor) -> None:
    """Write each token's K/V [T, KVH, D] into the paged caches at slot_mapping[t]; slot -1 is skipped."""
    t, kvh, d = k.shape
    if t == 0:
        return
    _check_runnable(k)
    _check_last_dim_contiguous(k, v, k_cache, v_cache)
    assert k_cache.stride() == v_cache.stride(), "the K and V pools must share one layout"
    _store_kvcache_kernel[(t,)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        NUM_KV_HEADS=kvh, HEAD_DIM=d,
        BLOCK_KVH=triton.next_power_of_2(kvh), BLOCK_D=triton.next_power_of_2(d),
        BLOCK_SIZE=k_cache.shape[1],
    )


# --------------------------------------------------------------------------------------
# shared by the attention kernels
# --------------------------------------------------------------------------------------
@triton.jit
def _load_kv_tile(k_cache_ptr, v_cache_ptr, table_ptr, pos, n_mask, offs_d, d_mask, kvh,
                  stride_cb, stride_cs, stride_ch, BLOCK_SIZE: tl.constexpr, DOT_DTYPE: tl.constexpr):
    # The K and V rows [BLOCK_N, BLOCK_D] of key positions `pos` of one sequence (its block
    # table row at table_ptr) and one KV head: each position's physical block is looked up,
    # so any block size works (masked positions read the null block 0 and are zeroed).
    blk = tl.load(table_ptr + pos // BLOCK_SIZE, mask=n_mask, other=0)
    kv_off = blk * stride_cb + (pos % BLOCK_SIZE) * stride_cs + kvh * stride_ch
    kv_mask = n_mask[:, None] & d_mask[None, :]
    k = tl.load(k_cache_ptr + kv_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0).to(DOT_DTYPE)
    v = tl.load(v_cache_ptr + kv_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0).to(DOT_DTYPE)
    return k, v


@triton.jit
def _online_softmax_step(m_i, l_i, acc, s, v, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    # Fold one tile of masked scores s (log2 domain) and its values v into the running max
    # m_i, denominator l_i and numerator acc, rescaling what was accumulated to the new max.
    # A row that has seen no key yet (a sliding window starting past this tile) keeps -inf
    # and zeros: its rescale is taken against 0 instead of -inf - -inf (NaN).
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_ref)
    p = tl.exp2(s - m_ref[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v, input_precision=DOT_PRECISION)
    return m_new, l_i, acc


# --------------------------------------------------------------------------------------
# paged decode: one query token per sequence
# --------------------------------------------------------------------------------------
@triton.jit
def _paged_decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, out_ptr,
    qk_scale,  # softmax scale * log2(e)
    window,    # a sliding window: the last `window` positions only (0: every position)
    stride_qb, stride_qh, stride_ob, stride_oh,
    stride_cb, stride_cs, stride_ch, stride_bt,
    GROUP: tl.constexpr,       # query heads per KV head (GQA)
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,     # GROUP padded to a power of two >= 16 (tl.dot needs M >= 16)
    BLOCK_D: tl.constexpr,     # HEAD_DIM padded to a power of two >= 16
    BLOCK_N: tl.constexpr,     # keys per loop iteration
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    DOT_DTYPE: tl.constexpr,   # operand type of tl.dot: the cache's (fp32 for bf16 interpreted)
    DOT_PRECISION: tl.constexpr,
):
    # One program per (sequence, KV head): it serves all GROUP query heads that share this KV
    # head, so every cached key/value is read from memory once per sequence, not once per
    # query head. Decode is memory bound; that read is what counts.
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + b).to(tl.int32)

    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    h_mask = offs_h < GROUP
    d_mask = offs_d < HEAD_DIM
    heads = kvh * GROUP + offs_h
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=h_mask[:, None] & d_mask[None, :], other=0.0).to(DOT_DTYPE)

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)  # running max (log2 domain)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)                 # running softmax denominator
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)        # running numerator @ V
    # A sliding window's blocks before it are the null block: the walk starts at the window.
    first = tl.where(window > 0, tl.maximum(seq_len - window, 0), 0)
    for start in range(first, seq_len, BLOCK_N):
        pos = start + offs_n
        n_mask = pos < seq_len
        k, v = _load_kv_tile(k_cache_ptr, v_cache_ptr, block_tables_ptr + b * stride_bt, pos, n_mask,
                             offs_d, d_mask, kvh, stride_cb, stride_cs, stride_ch, BLOCK_SIZE, DOT_DTYPE)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale   # [BLOCK_H, BLOCK_N]
        s = tl.where(n_mask[None, :], s, float("-inf"))
        m_i, l_i, acc = _online_softmax_step(m_i, l_i, acc, s, v, DOT_DTYPE, DOT_PRECISION)

    l_i = tl.where(l_i == 0.0, 1.0, l_i)  # an empty sequence gives zeros, not NaN
    out = acc / l_i[:, None]
    tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=h_mask[:, None] & d_mask[None, :])


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                           out: torch.Tensor | None = None, window: int | None = None) -> torch.Tensor:
    """One query per sequence: q [B, H, D] attends to the first seq_lens[b] cached tokens of
    sequence b (the last `window` of them with a sliding window), read through block_tables
    [B, max_blocks]. Returns [B, H, D] (in `out` if given)."""
    bsz, h, d = q.shape
    kvh = k_cache.shape[2]
    if h % kvh:
        raise ValueError(f"num_heads {h} is not a multiple of num_kv_heads {kvh}")
    if out is None:
        out = torch.empty_like(q)
    if bsz == 0:
        return out
    _check_runnable(q)
    _check_last_dim_contiguous(q, k_cache, v_cache, out)
    assert k_cache.stride() == v_cache.stride(), "the K and V pools must share one layout"
    group = h // kvh
    _paged_decode_kernel[(bsz, kvh)](
        q, k_cache, v_cache, block_tables, seq_lens, out,
        scale * LOG2E, window or 0,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        GROUP=group, HEAD_DIM=d,
        BLOCK_H=max(16, triton.next_power_of_2(group)),
        BLOCK_D=max(16, triton.next_power_of_2(d)),
        BLOCK_N=64 if d <= 128 else 32,
        BLOCK_SIZE=k_cache.shape[1],
        **_dot_operands(q.dtype),
        num_warps=4,
    )
    return out


# --------------------------------------------------------------------------------------
# paged varlen prefill: many queries per sequence, causal over the cached context
# --------------------------------------------------------------------------------------
@triton.jit
def _paged_prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr,
    query_start_ptr, seq_lens_ptr, context_lens_ptr, out_ptr,
    qk_scale,  # softmax scale * log2(e)
    window,    # a sliding window: each row sees its last `window` positions only (0: all before it)
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_cb, stride_cs, stride_ch, stride_bt,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,     # query rows per program
    BLOCK_N: tl.constexpr,     # keys per loop iteration
    BLOCK_D: tl.constexpr,     # HEAD_DIM padded to a power of two >= 16
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    DOT_DTYPE: tl.constexpr,   # operand type of tl.dot: the cache's (fp32 for bf16 interpreted)
    DOT_PRECISION: tl.constexpr,
):
    # Grid: (sequence, query head, tile of BLOCK_M query rows). Sequence i owns rows
    # query_start[i] .. query_start[i] + (seq_len - context_len) - 1, at positions
    # context_len .. seq_len - 1; each attends causally to the cached positions 0 .. its own.
    # Everything, this step's chunk included, is read from the paged cache (store_kvcache
    # ran first), so prefix-cache hits and chunked prefill need no special case.
    seq = tl.program_id(0)
    head = tl.program_id(1)
    tile = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
    ctx_len = tl.load(context_lens_ptr + seq).to(tl.int32)
    q_len = seq_len - ctx_len
    if tile * BLOCK_M >= q_len:  # the grid is sized for the longest sequence of the batch
        return
    q_start = tl.load(query_start_ptr + seq).to(tl.int32)
    kvh = head // GROUP

    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    m_mask = offs_m < q_len
    d_mask = offs_d < HEAD_DIM
    q_pos = ctx_len + offs_m  # absolute position of each query row
    rows = q_start + offs_m
    q = tl.load(q_ptr + rows[:, None] * stride_qt + head * stride_qh + offs_d[None, :],
                mask=m_mask[:, None] & d_mask[None, :], other=0.0).to(DOT_DTYPE)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    # Causality: no row of this tile sees past its last query position.
    kv_end = tl.minimum(seq_len, ctx_len + (tile + 1) * BLOCK_M)
    # A sliding window: nothing before the window of the tile's first row is read (those
    # blocks are the null block), and each row masks the keys before its own window.
    kv_start = tl.where(window > 0, tl.maximum(ctx_len + tile * BLOCK_M - window + 1, 0), 0)
    for start in range(kv_start, kv_end, BLOCK_N):
        pos = start + offs_n
        n_mask = pos < kv_end
        k, v = _load_kv_tile(k_cache_ptr, v_cache_ptr, block_tables_ptr + seq * stride_bt, pos, n_mask,
                             offs_d, d_mask, kvh, stride_cb, stride_cs, stride_ch, BLOCK_SIZE, DOT_DTYPE)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale   # [BLOCK_M, BLOCK_N]
        visible = n_mask[None, :] & (pos[None, :] <= q_pos[:, None])
        visible = visible & ((window <= 0) | (pos[None, :] > q_pos[:, None] - window))
        s = tl.where(visible, s, float("-inf"))
        # A fully masked tile contributes exp2(-inf) = 0 (_online_softmax_step keeps a row
        # that has seen nothing yet at -inf without a NaN).
        m_i, l_i, acc = _online_softmax_step(m_i, l_i, acc, s, v, DOT_DTYPE, DOT_PRECISION)

    out = acc / l_i[:, None]
    tl.store(out_ptr + rows[:, None] * stride_ot + head * stride_oh + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])


def paged_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                            context_lens: torch.Tensor, block_tables: torch.Tensor, scale: float,
                            out: torch.Tensor | None = None,
                            max_query_len: int | None = None, window: int | None = None) -> torch.Tensor:
    """Varlen causal attention over the paged cache. Sequence i owns the query rows
    query_start_loc[i] .. query_start_loc[i] + seq_lens[i] - context_lens[i] - 1 of q [T, H, D]
    (positions context_lens[i] .. seq_lens[i] - 1) and attends to its first seq_lens[i] cached
    tokens through block_tables[i] (each row its last `window` positions with a sliding window).
    The K/V of these rows must already be in the cache.

    query_start_loc may carry the usual trailing total (num_seqs + 1 entries) or not; only
    its first num_seqs entries are read, so a subset of a batch's sequences can be run, with
    rows it does not own left untouched in `out`. Index tensors are int32 or int64 on q's
    device. Returns [T, H, D] (in `out` if given)."""
    t, h, d = q.shape
    kvh = k_cache.shape[2]
    if h % kvh:
        raise ValueError(f"num_heads {h} is not a multiple of num_kv_heads {kvh}")
    if out is None:
        out = torch.empty_like(q)
    num_seqs = seq_lens.shape[0]
    if t == 0 or num_seqs == 0:
        return out
    if max_query_len is None:  # a device -> host sync; the backend passes it from the host lists
        max_query_len = int((seq_lens - context_lens).max())
    if max_query_len <= 0:
        return out
    _check_runnable(q)
    _check_last_dim_contiguous(q, k_cache, v_cache, out)
    assert k_cache.stride() == v_cache.stride(), "the K and V pools must share one layout"
    block_d = max(16, triton.next_power_of_2(d))
    block_m, block_n, num_warps = _prefill_tiles(block_d, q.dtype)
    grid = (num_seqs, h, triton.cdiv(max_query_len, block_m))
    _paged_prefill_kernel[grid](
        q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, context_lens, out,
        scale * LOG2E, window or 0,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        GROUP=h // kvh, HEAD_DIM=d,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
        BLOCK_SIZE=k_cache.shape[1],
        **_dot_operands(q.dtype),
        num_warps=num_warps,
    )
    return out


def _prefill_tiles(block_d: int, dtype: torch.dtype) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) of the prefill kernel: the largest tiles that ptxas fits
    in registers without spilling, for sm_90 (python -m benchmarks.triton_aot prints the
    registers and spills of each). fp32 operands take twice the registers of bf16 ones (and
    its exact 'ieee' dot runs on the FMA units, not tensor cores): at 4 warps, 64 x 64 tiles
    spilled 1.2 KB per thread at head dim 64 and 64 x 32 tiles 7 KB at 128; 8 warps spread
    them over twice the threads and spill nothing."""
    if dtype == torch.float32:
        return 64, 32, 8
    block_m = 64 if block_d <= 128 else 32
    block_n = 64 if block_d <= 64 else 32  # at D=128, 64 x 64 tiles need 192 registers a thread
    return block_m, block_n, 4


# --------------------------------------------------------------------------------------
# True when the kernels above were built for Triton's CPU interpreter (TRITON_INTERPRET=1
# when triton.jit decorated them); otherwise they compile for the GPU at first launch.
INTERPRETED = not isinstance(_store_kvcache_kernel, JITFunction)


def _dot_operands(dtype: torch.dtype) -> dict[str, Any]:
    """What tl.dot multiplies. fp32 inputs get exact fp32 products ('ieee'), not TF32: the
    fp32 engine must match the torch reference token for token; for fp16/bf16 'tf32' is the
    default and changes nothing. Triton's CPU interpreter multiplies bf16 wrongly (it holds
    bf16 as raw 16-bit integers), so interpreted bf16 is upcast to fp32 inside the kernel."""
    dot_dtype = _TL_DTYPES[dtype]
    if INTERPRETED and dtype == torch.bfloat16:
        dot_dtype = tl.float32
    return {"DOT_DTYPE": dot_dtype, "DOT_PRECISION": "ieee" if dot_dtype == tl.float32 else "tf32"}


_TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def _check_runnable(x: torch.Tensor) -> None:
    """A clear error instead of triton's "0 active drivers" when there is nothing to run on."""
    if x.device.type != "cuda" and not INTERPRETED:
        raise RuntimeError(
            f"the Triton kernels need a CUDA GPU (got tensors on {x.device}); on a CPU they run only under "
            "Triton's interpreter, with TRITON_INTERPRET=1 set before triton is first imported (slow: for tests)")


def _check_last_dim_contiguous(*tensors: torch.Tensor) -> None:
    # The kernels step over the head dim with unit stride; other dims may be strided (q, k
    # and v are column slices of one fused projection).
    for x in tensors:
        if x.stride(-1) != 1:
            raise ValueError(f"the last dim must be contiguous, got strides {tuple(x.stride())}")
