"""Compile the engine's Triton kernels for an NVIDIA GPU on a machine that has none.

CI runs the kernels under Triton's interpreter, which executes their Python semantics with
numpy and never lowers them, so it cannot see what only the compiler sees: constructs the
code generator rejects, types that disagree at a constexpr boundary, shared memory beyond
the device's limit, registers spilled to local memory. This module drives the real launch
path instead: the same wrappers (store_kvcache, paged_decode_attention,
paged_prefill_attention), argument tensors with the engine's dtypes, Triton's own argument
specialisation, and a stand-in driver that names a target architecture instead of a device.
Each launch compiles down to a cubin (with the ptxas that ships inside the triton wheel) and
stops there; cuobjdump, also in the wheel, reads each cubin's registers, shared memory and
spill (stack and local memory) bytes.

    python -m benchmarks.triton_aot              # sm_90 (H100/H200), the default matrix
    python -m benchmarks.triton_aot --arch 80    # A100

It must run in a process where triton was imported without TRITON_INTERPRET (the tests
start it as a subprocess for that reason), and it compiles only: nothing is executed.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

# Shared memory a block may use, by compute capability (CUDA programming guide, "Features
# and Technical Specifications"): what a launch asking for more fails with.
MAX_SHARED_BYTES = {80: 166912, 86: 101376, 89: 101376, 90: 232448, 100: 232448, 120: 101376}


@dataclass(frozen=True)
class KernelShape:
    """One attention geometry and storage type the engine runs the kernels with."""
    label: str
    num_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: str          # "bfloat16", "float16", "float32"
    block_size: int = 16


# The models the engine runs on a GPU (SmolLM2-135M: the default; Qwen3-0.6B: the GPU
# benchmark's shape; Qwen2.5-0.5B: GQA group 7, not a power of two), in bf16, the GPU
# default; the fp32 engine (exact parity tests) and fp16; the block sizes at the edges of
# what the explorer offers (1) and what flash-attn needs (256); a head dim that is not a
# power of two (padded and masked inside the kernels).
DEFAULT_SHAPES = [
    KernelShape("SmolLM2-135M", 9, 3, 64, "bfloat16"),
    KernelShape("Qwen3-0.6B", 16, 8, 128, "bfloat16"),
    KernelShape("Qwen2.5-0.5B", 14, 2, 64, "bfloat16"),
    KernelShape("Qwen3-0.6B", 16, 8, 128, "float32"),
    KernelShape("Qwen3-0.6B", 16, 8, 128, "float16"),
    KernelShape("Qwen3-0.6B", 16, 8, 128, "bfloat16", block_size=1),
    KernelShape("Qwen3-0.6B", 16, 8, 128, "bfloat16", block_size=256),
    KernelShape("head dim 24", 4, 1, 24, "float32"),
]


@dataclass
class CompiledKernelReport:
    """What ptxas reported for one kernel at one shape: registers, shared memory, spills."""
    kernel: str
    shape: KernelShape
    registers: int
    shared_bytes: int
    spill_bytes: int     # stack frame + local memory per thread: registers ptxas spilled
    compile_s: float


class CompileOnlyDriver:
    """Stands in for Triton's CUDA driver: reports a target architecture and device 0, so a
    launch specialises and compiles its kernel for that target; nothing touches a GPU."""

    def __init__(self, arch: int) -> None:
        from triton.backends.compiler import GPUTarget
        self.target = GPUTarget("cuda", arch, 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int) -> int:
        return 0


@contextlib.contextmanager
def compile_only(arch: int):
    """Inside, every launch of the engine's kernels compiles for sm_{arch} and returns without
    running; yields the list that collects (kernel name, CompiledKernel, seconds)."""
    from triton.runtime.driver import driver

    from engine.attention import triton_kernels as tk
    if tk.INTERPRETED:
        raise RuntimeError("triton was imported with TRITON_INTERPRET=1 in this process: the kernels are "
                           "interpreted, not compiled; run this without TRITON_INTERPRET")
    kernels = [tk._store_kvcache_kernel, tk._paged_decode_kernel, tk._paged_prefill_kernel]
    compiled: list = []

    def compile_instead(kernel):
        launch = kernel.run

        def run(*args, grid, warmup, **kwargs):
            start = time.perf_counter()
            result = launch(*args, grid=grid, warmup=True, **kwargs)  # warmup: compile, don't launch
            compiled.append((kernel.__name__, result, time.perf_counter() - start))
        return run

    check_runnable, previous_driver = tk._check_runnable, driver._active
    driver.set_active(CompileOnlyDriver(arch))
    for kernel in kernels:
        kernel.run = compile_instead(kernel)  # the instance attribute shadows JITFunction.run
    tk._check_runnable = lambda x: None       # CPU tensors stand for CUDA ones here
    try:
        yield compiled
    finally:
        tk._check_runnable = check_runnable
        for kernel in kernels:
            del kernel.run
        driver.set_active(previous_driver)


def launch_all(shape: KernelShape) -> None:
    """Call the three wrappers as the engine's Triton backend does for one mixed step (a
    prefill with a cached prefix and two decodes), with the engine's index dtypes."""
    from engine.attention.triton_kernels import paged_decode_attention, paged_prefill_attention, store_kvcache
    dtype = getattr(torch, shape.dtype)
    h, kvh, d, bs = shape.num_heads, shape.num_kv_heads, shape.head_dim, shape.block_size
    # q/k/v are column slices of one fused qkv projection, as in the model.
    qkv = torch.zeros(5, (h + 2 * kvh) * d, dtype=dtype)
    q = qkv[:, :h * d].view(5, h, d)
    k = qkv[:, h * d:(h + kvh) * d].view(5, kvh, d)
    v = qkv[:, (h + kvh) * d:].view(5, kvh, d)
    k_cache = torch.zeros(4, bs, kvh, d, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.tensor([3, 4, 5, -1, 7], dtype=torch.long)         # ModelRunner: int64
    store_kvcache(k, v, k_cache, v_cache, slots)
    tables = torch.tensor([[1, 2], [3, 0]], dtype=torch.long)         # ModelRunner: int64
    paged_decode_attention(q[:2], k_cache, v_cache, tables, torch.tensor([5, 3]), d ** -0.5)

    def i32(values: list[int]) -> torch.Tensor:                       # TritonAttentionBackend: int32
        return torch.tensor(values, dtype=torch.int32)
    paged_prefill_attention(q, k_cache, v_cache, i32([0]), i32([9]), i32([4]), tables[:1], d ** -0.5,
                            out=torch.empty_like(q), max_query_len=5)


def resource_usage(cubin: bytes, kernel: str) -> dict[str, int]:
    """REG / SHARED / LOCAL of one cubin, as cuobjdump (shipped in the triton wheel) reads them."""
    import triton.backends.nvidia as nvidia
    cuobjdump = str(Path(nvidia.__file__).parent / "bin" / "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([cuobjdump, "--dump-resource-usage", f.name], check=True,
                              capture_output=True, text=True).stdout
    found = re.search(rf"Function {re.escape(kernel)}:\s*REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", text)
    if found is None:
        raise RuntimeError(f"cuobjdump printed no resource usage for {kernel}:\n{text}")
    regs, stack, shared, local = map(int, found.groups())
    # Triton kernels keep no arrays in local memory and make no calls that need a stack, so
    # a stack frame (or local memory) is registers ptxas spilled.
    return {"registers": regs, "shared_bytes": shared, "spill_bytes": stack + local}


def compile_matrix(arch: int = 90, shapes: list[KernelShape] = DEFAULT_SHAPES) -> list[CompiledKernelReport]:
    """Every kernel for every shape, compiled for sm_{arch}; raises what the compiler raises."""
    reports = []
    for shape in shapes:
        with compile_only(arch) as compiled:
            launch_all(shape)
        for name, kernel, seconds in compiled:
            usage = resource_usage(kernel.asm["cubin"], kernel.name)
            # Dynamic shared memory (the software-pipelined K/V tiles) is in the metadata; the
            # cubin's SHARED counts only static allocations.
            usage["shared_bytes"] = max(usage["shared_bytes"], kernel.metadata.shared)
            reports.append(CompiledKernelReport(name, shape, compile_s=seconds, **usage))
    return reports


def problems(reports: list[CompiledKernelReport], arch: int) -> list[str]:
    """What would fail or crawl on the device: shared memory over the limit, spilled registers."""
    limit = MAX_SHARED_BYTES.get(arch)
    out = []
    for r in reports:
        where = f"{r.kernel} for {r.shape.label} ({r.shape.dtype}, block_size {r.shape.block_size})"
        if limit is not None and r.shared_bytes > limit:
            out.append(f"{where}: {r.shared_bytes} bytes of shared memory > sm_{arch}'s {limit}")
        if r.spill_bytes:
            out.append(f"{where}: {r.spill_bytes} bytes of registers spilled to local memory")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.triton_aot", description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90: H100/H200)")
    parser.add_argument("--json", type=Path, help="also write the reports here")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        parser.error("TRITON_INTERPRET is set: unset it, the kernels must compile, not be interpreted")
    import triton
    reports = compile_matrix(args.arch)
    print(f"triton {triton.__version__}: the engine's kernels compiled for sm_{args.arch}")
    print(f"{'kernel':<24} {'shape':<14} {'dtype':<9} {'block':>5} {'regs':>5} {'shared':>7} {'spill':>5} {'s':>5}")
    for r in reports:
        print(f"{r.kernel:<24} {r.shape.label:<14} {r.shape.dtype:<9} {r.shape.block_size:>5} "
              f"{r.registers:>5} {r.shared_bytes:>7} {r.spill_bytes:>5} {r.compile_s:>5.1f}")
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in reports], indent=1))
    found = problems(reports, args.arch)
    for line in found:
        print("problem:", line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
