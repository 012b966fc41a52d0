"""Linear layers on a CPU (fp32 arithmetic) with each weight packed once at load time: kvscope's
native kernel for the few rows of a decode step, oneDNN for prefill-sized inputs.

A decode step multiplies a few rows by every weight matrix of the model, so it is bound by
how fast the weights stream from memory. MKL's sgemm, behind F.linear, re-blocks the weight on
every call and streams it at a fraction of the memory bandwidth for such skinny inputs. Two
packed layouts do better, each where it is best: the native kernel (engine/cpu_kernels) reads
each weight panel once per step at the machine's full read bandwidth, and oneDNN's blocked GEMM
catches up once there are enough rows to be bound by arithmetic. A CPU that does more
arithmetic per cycle in oneDNN (AVX-512, AMX for a bf16 copy) moves that crossover, so the
engine measures it on the machine at first use (engine/runner/crossover.py; `python -m explorer
bench-linears` prints the full tables, and docs/performance.md keeps them per kind, dated). A
PackedLinear keeps both copies (twice the weight memory of the packed layers) and picks by row
count.

A bf16 engine's panels are bf16 (engine/dtypes.py): the same values in half the bytes, widened
to fp32 in registers, so a decode streams half the bytes.

A bf16 engine's linears take and give bf16 values, as vLLM's bf16 GEMMs do: the rows are
rounded to bf16 on the way in and the outputs on the way out (after the bias); the LM head
rounds its input only, so the sampler reads fp32 logits (bf16 logits would tie). Every path
rounds at the same places: the panels, the native decode, and oneDNN, whose copy of a layer
linear is bf16 where the CPU multiplies bf16 in hardware (AMX or AVX512_BF16:
`onednn_runs_bf16`; bf16 rows in, bf16 out) and elsewhere fp32 with the rounding done around
it. The products of bf16 values are exact in fp32, so two paths differ only in the order of
their fp32 sums (as in an fp32 engine); but a rounding can turn a difference in the last fp32
bit into one in the last bf16 bit, and over 30 layers that grows (docs/performance.md has the
measured gap). So in bf16 the same kernels on the same rows give the same bits (the native
decode and the layer-by-layer path; a prefix hit and a fresh prompt), and paths that order their
sums differently (a chunk against a whole prompt, oneDNN against the panels) give the same
tokens except at near-ties (tests/engine/test_cpu_bf16.py measures the gap where they part).
fp32 engines keep the same tokens on every path.

Packing replaces the weight: a PackedLinear keeps only its packed copies (the tied LM head
also keeps the embedding table it shares).

Once a model is packed, `place_panels_on_huge_pages` moves every panel into one buffer backed
by 2 MiB pages: streaming the weights then takes a TLB miss every 2 MiB instead of every 4 KiB."""
from __future__ import annotations

import ctypes
import mmap

import torch
from torch import nn

from ..cpu_kernels import ROUND_INPUT, ROUND_OUTPUT, native
from ..dtypes import dtype_name

# A PackedLinear takes the panels up to this many rows until the runner gives it this machine's
# measured crossover (engine/runner/crossover.py: measured once per CPU, model and dtype, and
# kept). 64 is where the AMD EPYC kinds cross (docs/performance.md); an Intel Xeon with AMX
# crosses far lower in bf16, which is why the engine measures instead of keeping one number.
UNMEASURED_MAX_ROWS = 64


def native_max_rows(panel_dtype: torch.dtype) -> int:
    """The row limit a PackedLinear starts with (UNMEASURED_MAX_ROWS, for either panel dtype);
    0 where the native kernels do not run."""
    return 0 if native() is None else UNMEASURED_MAX_ROWS


def cpu_packing_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def onednn_runs_bf16() -> bool:
    """oneDNN multiplies bf16 in hardware on this CPU: AMX tiles or AVX512_BF16 dot products.
    (AVX-512 without either still packs bf16, but converts element by element: not faster than
    fp32, so kvscope keeps fp32 there.)"""
    return (cpu_packing_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
            and (torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported()))


def gemm_dtype_for(panel_dtype: torch.dtype) -> torch.dtype:
    """The dtype oneDNN multiplies a layer's prefill-sized inputs in: bf16 for a bf16 engine
    where the hardware does it, else fp32."""
    return torch.bfloat16 if panel_dtype == torch.bfloat16 and onednn_runs_bf16() else torch.float32


def rounding_for(panel_dtype: torch.dtype, lm_head: bool = False) -> int:
    """Where a linear rounds to bf16 values (ROUND_INPUT / ROUND_OUTPUT, module doc): a bf16
    engine's layer linears in and out, its LM head in only; nothing in fp32."""
    if panel_dtype != torch.bfloat16:
        return 0
    return ROUND_INPUT if lm_head else ROUND_INPUT | ROUND_OUTPUT


class PackedLinear(nn.Module):
    """y = x W^T + b with W held in oneDNN's blocked layout and, where kvscope's native CPU
    kernels run, in 16-column panels for inputs of at most `native_max_rows` rows (this
    machine's crossover, which the runner sets: runner/crossover.py; inference only).
    The panels are fp32, or bf16 for a bf16 engine (its weights are bf16 values: nothing is
    lost, and a decode streams half the bytes); the panels' sums are fp32 either way.
    oneDNN's copy is in `gemm_dtype` (gemm_dtype_for): fp32, or bf16 where the CPU multiplies
    bf16 in hardware (only with `rounding` in and out: its output is bf16). Inputs and outputs
    are fp32 tensors either way; `rounding` (rounding_for) says where both paths round their
    values to bf16."""

    # Buffers (register_buffer: nn.Module's stubs cannot say their types).
    packed_weight: torch.Tensor | None   # None: no oneDNN copy (LogitsHead multiplies many rows its own way)
    panels: torch.Tensor | None     # None where the native kernels do not build
    gemm_bias: torch.Tensor | None

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None,
                 panel_dtype: torch.dtype = torch.float32, gemm_dtype: torch.dtype | None = torch.float32,
                 rounding: int = 0) -> None:
        super().__init__()
        if gemm_dtype == torch.bfloat16 and rounding != ROUND_INPUT | ROUND_OUTPUT:
            raise ValueError("a bf16 oneDNN copy rounds its rows and its outputs to bf16: rounding must say both")
        self.out_features, self.in_features = weight.shape
        weight = weight.detach()
        self.gemm_dtype, self.rounding = gemm_dtype, rounding
        self.register_buffer("packed_weight", None if gemm_dtype is None else
                             torch.ops.mkldnn._reorder_linear_weight(weight.to(gemm_dtype)), persistent=False)
        kernels = native()
        self.native = kernels
        self.register_buffer("panels", None if kernels is None else kernels.pack_panels(weight, panel_dtype),
                             persistent=False)
        self.native_max_rows = native_max_rows(panel_dtype)
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)
        # oneDNN takes the bias in the weight's dtype.
        self.register_buffer("gemm_bias", None if self.bias is None or gemm_dtype is None else self.bias.to(gemm_dtype),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        if self.panels is not None and x.dim() == 2 and x.shape[0] <= self.native_max_rows:
            return self.panels_linear(x)
        return self.onednn_linear(x)

    def panels_linear(self, x: torch.Tensor) -> torch.Tensor:
        """The native panels' product (x: contiguous fp32 rows), rounded as `rounding` says."""
        if self.native is None or self.panels is None:
            raise RuntimeError("no native panels: the native kernels did not build here (onednn_linear runs instead)")
        return self.native.linear(x, self.panels, self.out_features, self.bias, self.rounding)

    def onednn_linear(self, x: torch.Tensor) -> torch.Tensor:
        """oneDNN's product over its packed copy (x: contiguous fp32), rounded where the panels
        round: a bf16 copy takes the rows in bf16 and gives bf16; an fp32 copy gets the rounding
        done around it."""
        if self.packed_weight is None:
            raise RuntimeError("this PackedLinear keeps no oneDNN copy (gemm_dtype None)")
        if self.rounding & ROUND_INPUT:
            x_in = x.to(torch.bfloat16).to(self.gemm_dtype)  # the second .to: a no-op for a bf16 copy
        else:
            x_in = x
        y = torch.ops.mkldnn._linear_pointwise(x_in, self.packed_weight, self.gemm_bias, "none", [], "")
        if self.rounding & ROUND_OUTPUT:
            y = y.to(torch.bfloat16)
        return y.to(torch.float32)

    def extra_repr(self) -> str:
        native_note = "" if self.panels is None else \
            f", native {dtype_name(self.panels.dtype)} panels up to {self.native_max_rows} rows"
        rounds = " and ".join(name for flag, name in ((ROUND_INPUT, "input"), (ROUND_OUTPUT, "output"))
                              if self.rounding & flag)
        gemm = "no oneDNN copy" if self.gemm_dtype is None else f"packed for oneDNN in {dtype_name(self.gemm_dtype)}"
        return (f"in_features={self.in_features}, out_features={self.out_features}, {gemm}{native_note}"
                + (f", {rounds} rounded to bf16" if rounds else ""))


def place_panels_on_huge_pages(linears: list[PackedLinear]) -> None:
    """Moves the native panels of `linears` into one buffer, back to back in the order given
    (the order a forward reads them), backed by 2 MiB pages where Linux grants them."""
    held = [(lin, lin.panels) for lin in linears if lin.panels is not None]
    if not held:  # the native kernels are off: oneDNN's packed weights only
        return
    sizes = [_aligned(panels.nbytes) for _, panels in held]
    arena = huge_page_bytes(sum(sizes))
    offset = 0
    for (lin, panels), size in zip(held, sizes):
        placed = arena[offset: offset + panels.nbytes].view(panels.dtype)
        placed.copy_(panels)
        lin.panels = placed
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


def pack_linear_layers(model: nn.Module, panel_dtype: torch.dtype = torch.float32,
                       gemm_dtype: torch.dtype = torch.float32) -> int:
    """Swap every plain nn.Linear of `model` (not the tensor-parallel row layers, whose
    forward adds an all-reduce) for a PackedLinear that rounds as a layer linear of a
    `panel_dtype` engine does; returns how many were packed."""
    count, rounding = 0, rounding_for(panel_dtype)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, PackedLinear(child.weight, child.bias, panel_dtype, gemm_dtype, rounding))
                count += 1
    return count
