"""Linear layers on a CPU (fp32 arithmetic) with each weight packed once at load time: kvscope's
native kernel for the few rows of a decode step, oneDNN for prefill-sized inputs.

A decode step multiplies a few rows by every weight matrix of the model, so it is bound by
how fast the weights stream from memory. MKL's sgemm, behind F.linear, re-blocks the weight on
every call and streams it at a fraction of the memory bandwidth for such skinny inputs. Two
packed layouts do better, each where it is best (2-core AMD EPYC, 30 layers of the default
model's four linears, weights read from DRAM):

    rows            1      4      16     64     256    1024
    oneDNN packed   40 ms  48 ms  75 ms  157 ms 449 ms 1715 ms
    native panels   26 ms  28 ms  54 ms  151 ms 627 ms 1941 ms

The native kernel (engine/cpu_kernels) reads each weight panel once per step at the machine's
full read bandwidth (at one row, several panel runs side by side per thread: faster than
torch's own sum of the same bytes); oneDNN's blocked
GEMM wins once there are enough rows to be bound by arithmetic. So a PackedLinear keeps both
copies (twice the weight memory of the packed layers: 0.5 GB more for the default model) and
picks by row count. `python -m explorer bench` measures the whole engine.

A bf16 engine's panels are bf16 (engine/dtypes.py): the same values in half the bytes, widened
to fp32 in registers. One stream's whole decode step (30 layers and the LM head at one row,
panels on 2 MiB pages; medians of one process per dtype, 2-core AMD EPYC): 14.7 ms with bf16
panels, 18.9 ms with fp32 ones.

Packing replaces the weight: a PackedLinear keeps only its packed copies (the tied LM head
also keeps the embedding table it shares).

Once a model is packed, `place_panels_on_huge_pages` moves every panel into one buffer backed
by 2 MiB pages: streaming the weights then takes a TLB miss every 2 MiB instead of every 4 KiB,
and reads faster (2-core AMD EPYC, 425 MB in the default model's layer shapes, alternated in one
process: 19.6 GB/s best, 16.6 median, on 2 MiB pages; 17.1 and 13.4 on 4 KiB pages)."""
from __future__ import annotations

import ctypes
import mmap

import torch
from torch import nn

from ..cpu_kernels import native
from ..dtypes import dtype_name

# Up to this many rows the native panels are faster (table above); above it, oneDNN.
NATIVE_MAX_ROWS = 64


def cpu_packing_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class PackedLinear(nn.Module):
    """y = x W^T + b with W held in oneDNN's blocked layout and, where kvscope's native CPU
    kernels run, in 16-column panels for inputs of at most NATIVE_MAX_ROWS rows (inference only).
    The panels are fp32, or bf16 for a bf16 engine (its weights are bf16 values: nothing is
    lost, and a decode streams half the bytes); the arithmetic is fp32 either way."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None,
                 panel_dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        weight = weight.detach()
        self.register_buffer("packed_weight", torch.ops.mkldnn._reorder_linear_weight(weight), persistent=False)
        kernels = native()
        self.native = kernels
        self.register_buffer("panels", None if kernels is None else kernels.pack_panels(weight, panel_dtype),
                             persistent=False)
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        if self.panels is not None and x.dim() == 2 and x.shape[0] <= NATIVE_MAX_ROWS:
            return self.native.linear(x, self.panels, self.out_features, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        native_note = "" if self.panels is None else \
            f", native {dtype_name(self.panels.dtype)} panels up to {NATIVE_MAX_ROWS} rows"
        return f"in_features={self.in_features}, out_features={self.out_features}, packed for oneDNN{native_note}"


def place_panels_on_huge_pages(linears: list[PackedLinear]) -> None:
    """Moves the native panels of `linears` into one buffer, back to back in the order given
    (the order a forward reads them), backed by 2 MiB pages where Linux grants them."""
    linears = [lin for lin in linears if lin.panels is not None]
    if not linears:  # the native kernels are off: oneDNN's packed weights only
        return
    sizes = [_aligned(lin.panels.nbytes) for lin in linears]
    arena = huge_page_bytes(sum(sizes))
    offset = 0
    for lin, size in zip(linears, sizes):
        panels = arena[offset: offset + lin.panels.nbytes].view(lin.panels.dtype)
        panels.copy_(lin.panels)
        lin.panels = panels
        offset += size


HUGE_PAGE = 2 * 2**20
CACHE_LINE = 64


def _aligned(nbytes: int) -> int:
    return -(-nbytes // CACHE_LINE) * CACHE_LINE


def huge_page_bytes(nbytes: int) -> torch.Tensor:
    """A uint8 tensor of nbytes in an anonymous mapping aligned to 2 MiB that the kernel is
    asked to back with transparent huge pages (madvise MADV_HUGEPAGE: Linux's THP in 'madvise'
    or 'always' mode grants them; elsewhere the advice is skipped and the pages stay 4 KiB)."""
    region = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # private: anonymous THP
    probe = (ctypes.c_char * 1).from_buffer(region)
    offset = -ctypes.addressof(probe) % HUGE_PAGE
    del probe  # an exported ctypes view would pin the mapping's buffer
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            region.madvise(mmap.MADV_HUGEPAGE, offset, nbytes)
        except OSError:
            pass  # THP off in this kernel: 4 KiB pages, the same contents
    # The tensor holds the mapping alive (frombuffer keeps a reference to it).
    return torch.frombuffer(region, dtype=torch.uint8, count=nbytes, offset=offset)


def pack_linear_layers(model: nn.Module, panel_dtype: torch.dtype = torch.float32) -> int:
    """Swap every plain nn.Linear of `model` (not the tensor-parallel row layers, whose
    forward adds an all-reduce) for a PackedLinear; returns how many were packed."""
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, PackedLinear(child.weight, child.bias, panel_dtype))
                count += 1
    return count
