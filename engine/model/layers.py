"""Small building blocks, written to match Hugging Face's numerics (fp32 parity).

On a CPU (fp32 arithmetic, in fp32 and bf16 engines alike), CausalLM.pack_for_cpu() gives each
of them kvscope's native kernels (`native`): one call instead of five to ten torch ops, the same arithmetic per element
(engine/cpu_kernels/kvscope_cpu.c)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..cpu_kernels import NativeCpuKernels
from ..parallel.layers import RowParallelLinear
from ..parallel.parallel_state import SINGLE, TensorParallel


class RMSNorm(nn.Module):
    """RMSNorm computed in fp32, then cast back (as transformers' Llama/Qwen do). Given a
    residual, it first adds it (vLLM's fused add + norm) and returns (normalized, the sum):
    the decoder's residual stream, added where transformers adds it, in the same order."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.native: NativeCpuKernels | None = None

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if self.native is not None:
            rows = x.reshape(-1, x.shape[-1]).contiguous()
            out = self.native.rms_norm(rows, self.weight, self.eps, residual).view(x.shape)  # residual += x
            return out if residual is None else (out, residual)
        if residual is not None:
            residual = residual + x
            x = residual
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        out = self.weight * h.to(dtype)
        return out if residual is None else (out, residual)


class RotaryEmbedding(nn.Module):
    """Neox-style rotary embedding with a cos/sin table indexed by absolute position."""

    cos: torch.Tensor  # [max_positions, head_dim] buffers (register_buffer: nn.Module's stubs cannot say)
    sin: torch.Tensor

    def __init__(self, head_dim: int, max_positions: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        freqs = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

        self._rows: tuple | None = None  # (positions, dtype, cos, sin) of the last lookup
        self.native: NativeCpuKernels | None = None

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # q: [T, H, D], k: [T, KVH, D]
        cos, sin = self._lookup(positions, q.dtype)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin

    def rotate_packed_(self, positions: torch.Tensor, qkv: torch.Tensor, heads: int) -> None:
        """Native kernels only: rotate the first `heads` heads of each row of the packed qkv
        projection [T, (H + 2 KVH) * D] in place (q's heads, then k's)."""
        if self.native is None:
            raise RuntimeError("rotate_packed_ runs on kvscope's native kernels, which this model was not given")
        self.native.rope_(qkv, positions, self.cos, self.sin, heads, self.cos.shape[1])

    def _lookup(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin rows of these positions. Every layer of a forward passes the same positions
        tensor (one table is shared by all layers), so the rows are looked up once per forward."""
        rows = self._rows
        if rows is None or rows[0] is not positions or rows[1] != dtype:
            cos = self.cos.index_select(0, positions).unsqueeze(1).to(dtype)
            sin = self.sin.index_select(0, positions).unsqueeze(1).to(dtype)
            self._rows = rows = (positions, dtype, cos, sin)
        return rows[2], rows[3]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class SwiGLU(nn.Module):
    """MLP with one packed gate/up projection: down(silu(gate) * up). Split over ranks,
    each holds its gate rows then its up rows, and down_proj's matching columns."""

    def __init__(self, hidden: int, intermediate: int, tp: TensorParallel = SINGLE) -> None:
        super().__init__()
        self.intermediate = intermediate // tp.size
        self.gate_up_proj = nn.Linear(hidden, 2 * self.intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False) if tp.size == 1 else \
            RowParallelLinear(intermediate, hidden, False, tp)
        self.native: NativeCpuKernels | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.native is not None:
            return self.down_proj(self.native.silu_and_mul(self.gate_up_proj(x)))
        gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)
        act = F.silu(gate)
        return self.down_proj(act.mul_(up))  # in place: one [T, intermediate] buffer, not two
