"""kvscope's whole engine against vLLM 0.32's LLM on the default model, stepped together
(tests/oracle/engine_differential.py): the same per-step schedule, block ids and tokens on
workloads with chunked prefills, prefix hits, same-step hits and preemption; and on a model with
sliding-window layers against vLLM's scheduler with the same two KV cache groups
(tests/oracle/engine_groups_differential.py). Each in its own process, as vLLM's import changes
process-wide state."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ORACLE_COUNTS
from .vllm_available import require_vllm

ROOT = Path(__file__).resolve().parents[2]


# 8 workloads in CI (35 s after vLLM's 25 s load: 2 preemptions, 6 same-step hit blocks, 16
# unsampled prefill chunks); the soak suite runs 200.
@pytest.mark.slow
@pytest.mark.parametrize("workloads", [8, pytest.param(200, marks=pytest.mark.soak)])
def test_engine_steps_like_vllm_on_the_default_model(default_model_path, workloads):
    require_vllm()
    # vLLM drops torch to one thread unless OMP_NUM_THREADS is set.
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(os.cpu_count() or 1))}
    proc = subprocess.run([sys.executable, "-m", "tests.oracle.engine_differential", "--workloads", str(workloads),
                           "--model", str(default_model_path)], cwd=ROOT, text=True, capture_output=True,
                          timeout=1800, env=env)
    lines = proc.stdout.strip().splitlines()
    counts = json.loads(lines[-1]) if lines else {}
    ORACLE_COUNTS.append(f"engine differential (default model): {lines[-2] if len(lines) > 1 else ''} "
                         f"{json.dumps(counts)}")
    assert proc.returncode == 0, f"kvscope's engine and vLLM's differ:\n{proc.stderr[-6000:]}"
    assert counts["workloads"] == workloads and counts["differences"] == 0
    for seen in ("preemptions", "hit_tokens", "same_step_hit_blocks", "prefill_chunks_not_sampled"):
        assert counts[seen] > 0, f"the workloads never exercised {seen}: {counts}"


def _groups_differential(*args: str) -> tuple[subprocess.CompletedProcess, dict]:
    proc = subprocess.run([sys.executable, "-m", "tests.oracle.engine_groups_differential", *args], cwd=ROOT,
                          text=True, capture_output=True, timeout=1800)
    lines = proc.stdout.strip().splitlines()
    return proc, json.loads(lines[-1]) if lines else {}


# 6 workloads in CI (~20 s: chunked prompts, hits, blocks leaving three windows, a preemption);
# the soak suite runs 200.
@pytest.mark.slow
@pytest.mark.parametrize("workloads", [6, pytest.param(200, marks=pytest.mark.soak)])
def test_engine_with_sliding_window_layers_steps_like_vllms_scheduler(workloads):
    require_vllm()
    proc, counts = _groups_differential("--workloads", str(workloads))
    ORACLE_COUNTS.append(f"engine differential (sliding-window groups): {json.dumps(counts)}")
    assert proc.returncode == 0, f"kvscope's engine and vLLM's scheduler differ:\n{proc.stderr[-6000:]}"
    assert counts["workloads"] == workloads and counts["differences"] == 0
    for seen in ("preemptions", "hit_tokens", "chunks", "window_nulls"):
        assert counts[seen] > 0, f"the workloads never exercised {seen}: {counts}"


@pytest.mark.slow
def test_a_planted_fault_in_the_engines_sliding_group_is_caught():
    """Blocks that left the window kept: the first workload's replay differs."""
    require_vllm()
    proc, found = _groups_differential("--workloads", "5", "--plant", "sliding-blocks-kept")
    assert proc.returncode == 0 and found == {"plant": "sliding-blocks-kept", "first_seed": 0}, proc.stderr[-3000:]
