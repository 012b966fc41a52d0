"""The LM head on a CPU: fp32 logits written into one workspace that every step reuses.

A step's logits are the largest tensor it makes: 256 rows of a 151,936-token vocabulary are
155 MB. glibc maps any allocation over 32 MB fresh from the kernel, so a new logits tensor each
step was faulted in page by page while the GEMM wrote it and unmapped when the step let it go:
about 12 ms a step each way on a 2-core CPU at that size (docs/performance.md, "The host path").
The workspace grows to the most rows a step has sampled and stays mapped.

Few rows take the native panels (a PackedLinear's, this machine's crossover); more take one
fp32 GEMM over the weight's transpose, which can write into the workspace (oneDNN's packed
product cannot). Either way the input is rounded as a bf16 engine's head rounds it (input only:
the sampler reads fp32 logits)."""
from __future__ import annotations

import torch

from ..cpu_kernels import ROUND_INPUT
from .cpu_linear import PackedLinear, rounding_for


class LogitsHead(PackedLinear):
    """The packed LM head (`weight`: [vocab, hidden]). Its output is a view of the workspace:
    valid until the next call, which is the step's sampler's whole need."""

    weight_t: torch.Tensor

    def __init__(self, weight: torch.Tensor, panel_dtype: torch.dtype = torch.float32) -> None:
        super().__init__(weight, None, panel_dtype, gemm_dtype=None, rounding=rounding_for(panel_dtype, lm_head=True))
        # [hidden, vocab], contiguous: the GEMM streams it row by row (a transposed view ran ~15% slower).
        self.register_buffer("weight_t", weight.detach().to(torch.float32).t().contiguous(), persistent=False)
        self._workspace = torch.empty((0, self.out_features), dtype=torch.float32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = self._rows(x.shape[0])
        if self.native is not None and self.panels is not None and x.shape[0] <= self.native_max_rows:
            return self.native.linear(x, self.panels, self.out_features, None, self.rounding, out=out)
        rows = x.to(torch.bfloat16).to(torch.float32) if self.rounding & ROUND_INPUT else x
        return torch.mm(rows, self.weight_t, out=out)

    def _rows(self, rows: int) -> torch.Tensor:
        if self._workspace.shape[0] < rows:
            self._workspace = torch.empty((rows, self.out_features), dtype=torch.float32)
        return self._workspace[:rows]
