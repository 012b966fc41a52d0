"""The Triton kernels compile for an H100/H200 (sm_90), here, without a GPU.

The interpreter tests next door check what the kernels compute; these check what only the
compiler sees (lowering errors, shared memory over the device's limit, spilled registers),
through benchmarks.triton_aot. It needs triton imported without TRITON_INTERPRET,
which tests/conftest.py sets for this process, so each check runs in a subprocess.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="the triton package is not installed (pip install -e '.[dev]')")

from benchmarks.triton_aot import DEFAULT_SHAPES, CompiledKernelReport, KernelShape, problems

ROOT = Path(__file__).resolve().parents[2]
KERNELS = {"_store_kvcache_kernel", "_paged_decode_kernel", "_paged_prefill_kernel"}


def _compiling_python(args: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_every_kernel_compiles_for_sm90_without_spills_or_shared_memory_overflow(tmp_path):
    out = tmp_path / "reports.json"
    run = _compiling_python(["-m", "benchmarks.triton_aot", "--arch", "90", "--json", str(out)])
    assert run.returncode == 0, run.stdout + run.stderr
    reports = json.loads(out.read_text())
    assert len(reports) == 3 * len(DEFAULT_SHAPES)
    assert {r["kernel"] for r in reports} == KERNELS
    for r in reports:
        assert r["registers"] > 0 and r["spill_bytes"] == 0, r
    # The decode and prefill kernels keep K/V tiles in shared memory (software pipelining).
    assert all(r["shared_bytes"] > 0 for r in reports if r["kernel"] != "_store_kvcache_kernel")
    assert "problem:" not in run.stdout


def test_the_check_reports_a_tiling_that_spills():
    # 64 x 64 fp32 tiles at 4 warps, the prefill kernel's tiling before this check existed:
    # ptxas spills there, and the check must say so.
    script = textwrap.dedent("""
        import torch
        from engine.attention import triton_kernels
        from benchmarks import triton_aot
        triton_kernels._prefill_tiles = lambda block_d, dtype: (64, 64, 4)
        shape = triton_aot.KernelShape("SmolLM2-135M", 9, 3, 64, "float32")
        for line in triton_aot.problems(triton_aot.compile_matrix(90, [shape]), 90):
            print(line)
    """)
    run = _compiling_python(["-c", script])
    assert run.returncode == 0, run.stderr
    assert "_paged_prefill_kernel for SmolLM2-135M (float32, block_size 16)" in run.stdout
    assert "spilled" in run.stdout


def test_problems_names_the_kernel_the_shape_and_the_limit():
    shape = KernelShape("Qwen3-0.6B", 16, 8, 128, "bfloat16")
    fine = CompiledKernelReport("_paged_decode_kernel", shape, registers=128, shared_bytes=39424,
                                spill_bytes=0, compile_s=1.0)
    too_much = CompiledKernelReport("_paged_prefill_kernel", shape, registers=255, shared_bytes=240000,
                                    spill_bytes=0, compile_s=1.0)
    assert problems([fine], 90) == []
    assert problems([too_much], 90) == [
        "_paged_prefill_kernel for Qwen3-0.6B (bfloat16, block_size 16): "
        "240000 bytes of shared memory > sm_90's 232448"]
    # A100s have less shared memory than H100s.
    assert problems([fine], 80) == [] and len(problems([too_much], 80)) == 1


def test_refuses_to_run_interpreted():
    run = subprocess.run([sys.executable, "-m", "benchmarks.triton_aot"], cwd=ROOT, capture_output=True,
                         text=True, env={**os.environ, "TRITON_INTERPRET": "1"}, timeout=120)
    assert run.returncode == 2
    assert "TRITON_INTERPRET is set" in run.stderr
