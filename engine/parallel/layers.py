"""The layers whose forward needs a collective when the model is split across ranks.

Column-parallel projections need none: they are plain `nn.Linear`s with fewer output
rows (the loader fills each rank's rows). These two are used only at size > 1; the
single-process model keeps `nn.Embedding` / `nn.Linear`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .parallel_state import TensorParallel
from .sharding import shard_bounds


class VocabParallelEmbedding(nn.Module):
    """Each rank holds vocab_size / size rows; a token outside a rank's rows looks up zeros
    there, and the all-reduce leaves exactly the one owner's row (x + 0.0 is exact)."""

    def __init__(self, vocab_size: int, hidden_size: int, tp: TensorParallel) -> None:
        super().__init__()
        self.tp = tp
        self.lo, self.hi = shard_bounds(vocab_size, tp.rank, tp.size)
        self.weight = nn.Parameter(torch.empty(self.hi - self.lo, hidden_size))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        outside = (input_ids < self.lo) | (input_ids >= self.hi)
        local = (input_ids - self.lo).masked_fill(outside, 0)
        x = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return self.tp.all_reduce(x)


class RowParallelLinear(nn.Linear):
    """Holds in_features / size input columns; partial products are summed by an all-reduce.
    A bias (none of Llama / Qwen2 / Qwen3 has one here) is added by rank 0 only, so it
    counts once in the sum."""

    def __init__(self, in_features: int, out_features: int, bias: bool, tp: TensorParallel) -> None:
        super().__init__(in_features // tp.size, out_features, bias=bias)
        self.tp = tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.bias if self.tp.rank == 0 else None
        return self.tp.all_reduce(F.linear(x, self.weight, bias))
