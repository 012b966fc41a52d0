"""kvscope's scheduling and KV-cache decisions against vLLM 0.32's real v1 Scheduler and
KVCacheManager (tests/oracle/differential.py), on 500 seeded random workloads per CI run
(about 40 s on 2 cores) and 20,000 under `pytest -m soak`; the same for kvscope's AsyncScheduler
against vLLM's, step N+1 scheduled before step N's update; and the same with a sliding-window KV
cache group beside the full-attention one (`--groups full+sliding`), or a Mamba group in vLLM's
align cache mode (`--groups full+mamba`). Each runs in its own process: vLLM's
import changes process-wide state (logging, threads) that the other tests should not inherit."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ORACLE_COUNTS
from .vllm_available import require_vllm

ROOT = Path(__file__).resolve().parents[2]


def _differential(*args: str, timeout: int) -> tuple[subprocess.CompletedProcess, dict]:
    require_vllm()
    proc = subprocess.run([sys.executable, "-m", "tests.oracle.differential", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=timeout)
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "{}"
    return proc, json.loads(last)


def _assert_identical(workloads: int, timeout: int, *args: str, same_step_hits: bool = True) -> dict:
    proc, counts = _differential("--workloads", str(workloads), *args, timeout=timeout)
    ORACLE_COUNTS.append(f"scheduler differential{' ' if args else ''}{' '.join(args)}: {json.dumps(counts)}")
    assert proc.returncode == 0, f"kvscope decided differently from vLLM:\n{proc.stderr[-6000:]}"
    assert counts["workloads"] == workloads and counts["differences"] == 0
    # The workloads really exercise what is compared (`same_step_hits` False: they cannot happen).
    assert counts["preemptions"] > 0 and counts["hit_tokens"] > 0
    assert (counts["same_step_hit_blocks"] > 0) == same_step_hits
    return counts


@pytest.mark.slow
def test_scheduler_and_kv_cache_decide_exactly_as_vllm_on_500_workloads():
    _assert_identical(500, timeout=1200)


@pytest.mark.soak
def test_scheduler_and_kv_cache_decide_exactly_as_vllm_on_20000_workloads():
    _assert_identical(20_000, timeout=6 * 3600)


@pytest.mark.slow
def test_the_harness_catches_each_difference_kvscope_used_to_have():
    # Caching after the forward, de-duplicated full blocks, admission on the first chunk only.
    proc, first_seed = _differential("--check-planted", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert set(first_seed) == {"cache-after-forward", "dedup-full-blocks", "admit-on-first-chunk"}
    assert all(seed is not None for seed in first_seed.values()), first_seed


@pytest.mark.slow
def test_async_scheduler_decides_exactly_as_vllm_on_500_workloads():
    counts = _assert_identical(500, 1200, "--async")
    assert counts["scheduled_ahead"] > 0  # steps scheduled while the one before was in flight


@pytest.mark.soak
def test_async_scheduler_decides_exactly_as_vllm_on_20000_workloads():
    counts = _assert_identical(20_000, 6 * 3600, "--async")
    assert counts["scheduled_ahead"] > 0


@pytest.mark.slow
def test_async_scheduler_with_three_steps_in_flight_decides_as_vllm():
    # Only a queue deeper than vLLM's two leaves a preempted request waiting for stale outputs.
    counts = _assert_identical(200, 900, "--async", "--queue-depth", "3")
    assert counts["scheduled_ahead"] > 0 and counts["waiting_for_stale"] > 0


@pytest.mark.slow
def test_the_harness_catches_each_async_fault():
    # Caching past the placeholders, placeholders kept on preemption, a step past max_tokens,
    # stale outputs dropped, a request readmitted before its stale outputs land.
    proc, first_seed = _differential("--check-planted", "--async", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert set(first_seed) == {"cache-past-placeholders", "placeholders-kept-on-preempt", "schedule-past-max-tokens",
                               "stale-output-dropped", "readmitted-before-stale-outputs"}
    assert all(seed is not None for seed in first_seed.values()), first_seed


def _assert_identical_with_sliding_window(workloads: int, timeout: int, *args: str) -> dict:
    counts = _assert_identical(workloads, timeout, "--groups", "full+sliding", *args)
    assert counts["window_freed_blocks"] > 0  # blocks really left the window and were freed
    return counts


@pytest.mark.slow
def test_sliding_window_groups_decide_exactly_as_vllm_on_500_workloads():
    _assert_identical_with_sliding_window(500, 1200)


@pytest.mark.slow
def test_sliding_window_groups_under_async_scheduling_decide_as_vllm():
    counts = _assert_identical_with_sliding_window(200, 900, "--async")
    assert counts["scheduled_ahead"] > 0


@pytest.mark.soak
def test_sliding_window_groups_decide_exactly_as_vllm_on_20000_workloads():
    _assert_identical_with_sliding_window(20_000, 6 * 3600)


# The faults planted per kind of group. Sliding: the groups' hits not intersected, blocks kept
# after they left the window, admission reserving a sliding group's whole sequence. Mamba:
# replaced states kept, a Mamba hit taken as a run from the left, prefill chunks not ending on
# block boundaries, a hit on a state this very step writes, every state cached whatever the
# retention interval.
@pytest.mark.slow
@pytest.mark.parametrize("groups,faults", [
    ("full+sliding", {"no-hit-intersection", "sliding-blocks-kept", "no-admission-cap"}),
    ("full+mamba", {"mamba-states-kept", "mamba-hit-from-the-left", "chunks-not-aligned", "same-step-mamba-hit",
                    "mamba-states-cached-densely"})])
def test_the_harness_catches_each_kv_cache_group_fault(groups, faults):
    proc, first_seed = _differential("--check-planted", "--groups", groups, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert set(first_seed) == faults
    assert all(seed is not None for seed in first_seed.values()), first_seed


def _assert_identical_with_mamba(workloads: int, timeout: int, *args: str) -> dict:
    # A hit on a state the same step writes waits a step (and a hit needs a Mamba state).
    counts = _assert_identical(workloads, timeout, "--groups", "full+mamba", *args, same_step_hits=False)
    # States really were replaced and freed, and hits both taken and cut short by the Mamba group.
    assert counts["mamba_states_freed"] > 0 and counts["hits_cut_by_mamba"] > 0
    return counts


@pytest.mark.slow
def test_mamba_align_groups_decide_exactly_as_vllm_on_500_workloads():
    _assert_identical_with_mamba(500, 1200)


@pytest.mark.soak
def test_mamba_align_groups_decide_exactly_as_vllm_on_20000_workloads():
    _assert_identical_with_mamba(20_000, 6 * 3600)
