"""fp32 linear layers on a CPU through oneDNN, with each weight packed once at load time.

A decode step multiplies a few rows by every weight matrix of the model, so it is bound by
how fast the weights stream from memory. MKL's sgemm, behind F.linear, re-blocks the weight
on every call and streams it at a fraction of the memory bandwidth for such skinny inputs;
oneDNN's linear over a weight reordered once into its blocked layout does not (on this
project's 2-core AMD EPYC machine, 30 layers of the default model's gate/up projection at 16
rows: 81 ms with F.linear, 40 ms packed; the 49152-row LM head: 49 ms vs 17 ms; prefill-sized
inputs are no slower). `python -m explorer bench` measures the whole engine.

Packing replaces the weight: a PackedLinear keeps only the packed copy (the tied LM head
also keeps the embedding table it shares)."""
from __future__ import annotations

import torch
from torch import nn


def cpu_packing_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class PackedLinear(nn.Module):
    """y = x W^T + b with W held in oneDNN's blocked layout (inference only)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.register_buffer("packed_weight", torch.ops.mkldnn._reorder_linear_weight(weight.detach()),
                             persistent=False)
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed_weight, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed for oneDNN"


def pack_linear_layers(model: nn.Module) -> int:
    """Swap every plain nn.Linear of `model` (not the tensor-parallel row layers, whose
    forward adds an all-reduce) for a PackedLinear; returns how many were packed."""
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, PackedLinear(child.weight, child.bias))
                count += 1
    return count
