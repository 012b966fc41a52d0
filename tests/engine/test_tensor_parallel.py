"""Tensor parallelism: N ranks (rank 0 in this process, N-1 worker processes over gloo) give
exactly the greedy tokens and the schedule of the single-process engine; workers stop with
the engine, and a dead or failing worker is a clear error within seconds, never a hang.
(tests/engine/test_tp_script.py runs a plain script, with and without a __main__ guard.)"""
from __future__ import annotations

import dataclasses
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import LLM, SamplingParams
from engine.model import ModelSpec
from engine.parallel import TensorParallelError, check_tensor_parallel

# A small pool and budget: mixed batches chunk long prompts, hit the prefix cache and preempt.
POOL = dict(block_size=16, num_kv_blocks=12, max_num_batched_tokens=64, check_invariants=True)
VOCAB = 151_000  # ordinary Qwen tokens (below the special ids)


def _ids(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB) for _ in range(n)]


SHARED = _ids(99, 40)  # a prefix of 2.5 blocks that several prompts share
# Arrival step -> prompts: long ones are chunked (budget 64), SHARED ones hit the cache, and
# with 16 new tokens each they need more than the 11 usable blocks (preemption); the late
# short one is prefilled while others decode. (Admission needs the whole prompt to fit, as in
# vLLM 0.32, so the decodes' growth is what preempts.)
MIXED = {0: [_ids(1, 9), SHARED + _ids(2, 7)], 2: [_ids(3, 100), SHARED + _ids(4, 12)],
         5: [SHARED + _ids(5, 30), _ids(6, 5)], 7: [_ids(8, 5)]}


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def worker_pids(llm: LLM) -> list[int]:
    return [p.pid for p in llm.engine.runner.workers.procs]


def child_pids() -> set[int]:
    """This process's live children (the TP workers are plain subprocesses)."""
    children = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if int(fields[1]) == os.getpid() and fields[0] not in "ZX":
            children.add(int(stat.parent.name))
    return children


def is_gone(pid: int) -> bool:
    """The process has exited (a zombie nobody reaped yet counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in state or "\nState:\tX" in state


def run_lockstep(engines: list[LLM], script: dict[int, list[list[int]]], max_tokens: int) -> list[dict]:
    """Drive every engine through the same arrivals, step by step; returns, per engine, the
    comparable part of each StepRecord and the final outputs."""
    traces: list[dict] = [{"steps": [], "ids": []} for _ in engines]
    step = 0
    while step <= max(script) or any(e.engine.has_unfinished_requests() for e in engines):
        for llm, trace in zip(engines, traces):
            for prompt in script.get(step, []):
                trace["ids"].append(llm.engine.add_request(prompt, greedy(max_tokens)))
            rec = llm.engine.step()
            trace["steps"].append({"scheduled": rec.scheduled, "blocks": rec.blocks, "preempted": rec.preempted,
                                   "sampled": {r: s["token_id"] for r, s in rec.sampled.items()},
                                   "batch": rec.batch})
        step += 1
    for llm, trace in zip(engines, traces):
        trace["outputs"] = [llm.engine.requests[r].output_token_ids for r in trace["ids"]]
    return traces


def _reference_and_tp(path: Path) -> Iterator[tuple[LLM, LLM]]:
    """(TP=1 reference, TP=2 engine sharing its weights) on the model at `path`, both with the
    small pool; the TP engine's workers stop when the fixture ends."""
    ref = LLM(str(path), **POOL)
    tp = LLM(str(path), tensor_parallel_size=2, share_model_with=ref, **POOL)
    yield ref, tp
    tp.shutdown()


@pytest.fixture(scope="module")
def qwen3(tiny_qwen3_path):
    """The tiny Qwen3's pair."""
    yield from _reference_and_tp(tiny_qwen3_path)


@pytest.fixture(scope="module")
def qwen2(tiny_qwen2_path):
    """The same for the tiny Qwen2 (q/k/v biases, untied LM head)."""
    yield from _reference_and_tp(tiny_qwen2_path)


# -- same tokens, same schedule ----------------------------------------------------------
@pytest.mark.parametrize("pair", ["qwen3", "qwen2"])
def test_tp2_greedy_tokens_equal_tp1_alone(pair, request):
    ref, tp = request.getfixturevalue(pair)
    prompts = ["The capital of France is", "Hello", _ids(7, 70)]  # the last one is chunked
    expected = [ref.generate([p], greedy(10), use_tqdm=False)[0].token_ids for p in prompts]
    assert [tp.generate([p], greedy(10), use_tqdm=False)[0].token_ids for p in prompts] == expected


@pytest.mark.parametrize("pair", ["qwen3", "qwen2"])
def test_tp2_mixed_batches_match_tp1_step_by_step(pair, request):
    ref, tp = request.getfixturevalue(pair)
    ref_trace, tp_trace = run_lockstep([ref, tp], MIXED, max_tokens=16)
    # The block bookkeeping lives on rank 0 only; the schedule, block ids and slots are the same.
    assert tp_trace["steps"] == ref_trace["steps"]
    assert tp_trace["outputs"] == ref_trace["outputs"]
    steps = ref_trace["steps"]
    assert any(s["preempted"] for s in steps), "the workload was meant to preempt"
    assert any((x["chunk_index"] or 0) > 0 for s in steps for x in s["scheduled"]), "... and to chunk"
    assert any(s["blocks"]["hits"] for s in steps), "... and to hit the prefix cache"
    assert any(len(s["scheduled"]) > 1 and {x["is_prefill"] for x in s["scheduled"]} == {True, False}
               for s in steps), "... and to mix prefill and decode in one step"


def test_two_tp_engines_side_by_side(qwen3, qwen2):
    """Two live TP=2 engines in this process (two groups, two stores), steps interleaved."""
    script = {0: [_ids(11, 20)], 1: [_ids(12, 33)]}
    (ref3, tp3), (ref2, tp2) = qwen3, qwen2
    a, b, c, d = run_lockstep([tp3, tp2, ref3, ref2], script, max_tokens=6)
    assert (a["outputs"], b["outputs"]) == (c["outputs"], d["outputs"])


def test_attention_probe_gathers_every_head(qwen3):
    ref, tp = qwen3
    probes = []
    for llm in (ref, tp):
        rid = llm.engine.add_request(_ids(21, 20), greedy(3))
        llm.engine.step()
        llm.engine.step()
        probes.append(llm.engine.attention_probe(rid, layer=1))
        while llm.engine.has_unfinished_requests():
            llm.engine.step()
    assert probes[1].probs.shape == probes[0].probs.shape == (4, 1, 21)
    assert (probes[1].probs - probes[0].probs).abs().max() < 1e-5


def test_model_info_and_timings_report_per_rank_facts(qwen3):
    ref, tp = qwen3
    info = tp.engine.model_info
    assert (info["tensor_parallel_size"], info["tp_backend"]) == (2, "gloo")
    assert (info["num_heads_per_rank"], info["num_kv_heads_per_rank"]) == (2, 1)
    assert info["kv_bytes_per_block_per_rank"] * 2 == info["kv_bytes_per_block"]
    assert info["kv_bytes_per_rank"] == POOL["num_kv_blocks"] * info["kv_bytes_per_block_per_rank"]
    ranks = info["tensor_parallel"]["ranks"]
    assert [r["heads"] for r in ranks] == [[0, 2], [2, 4]] and [r["kv_heads"] for r in ranks] == [[0, 1], [1, 2]]
    assert [r["vocab"] for r in ranks] == [[0, 75968], [75968, 151936]]
    weights = {w["name"]: w for w in info["tensor_parallel"]["weights"]}
    assert (weights["o_proj"]["split"], weights["o_proj"]["after"]) == ("columns", "all_reduce")
    assert (weights["lm_head"]["split"], weights["lm_head"]["after"]) == ("rows", "gather")
    assert weights["q_proj"]["packed_into"] == "qkv_proj" and weights["q_norm"]["split"] is None
    tp.engine.add_request("Hello", greedy(2))
    rec = tp.engine.step()
    tp.engine.step()
    assert 0 < rec.timings_ms["collectives"] <= rec.timings_ms["forward"]
    ref.engine.add_request("Hello", greedy(2))
    rec1 = ref.engine.step()
    ref.engine.step()
    assert rec1.timings_ms["collectives"] == 0.0
    assert ref.engine.model_info["tensor_parallel_size"] == 1 and ref.engine.model_info["tp_backend"] is None
    assert tp.engine.snapshot().to_dict()["model_info"]["tensor_parallel"]["ranks"][1]["kv_bytes"] > 0


# -- life and death of the workers --------------------------------------------------------
def test_interrupt_mid_step_stops_the_workers_then_a_killed_worker_is_a_clear_error(tiny_qwen3_path, qwen3):
    """One engine after another in this process: the first is interrupted inside a step (its
    workers, stuck in a collective, are stopped); the second loses a worker to SIGKILL."""
    ref, _ = qwen3
    with LLM(str(tiny_qwen3_path), tensor_parallel_size=2, share_model_with=ref, **POOL) as first:
        pids = worker_pids(first)
        first.engine.add_request("Hello there", greedy(4))
        layer = first.engine.runner.model.layers[1]

        def interrupted(*args, **kwargs):
            raise KeyboardInterrupt  # rank 0 leaves after layer 0: the worker waits in layer 1
        layer.forward = interrupted
        with pytest.raises(KeyboardInterrupt):
            first.engine.step()
        assert all(is_gone(pid) for pid in pids)
        with pytest.raises(TensorParallelError, match="interrupted"):
            first.engine.step()

    second = LLM(str(tiny_qwen3_path), tensor_parallel_size=2, share_model_with=ref, **POOL)
    try:
        eng = second.engine
        eng.add_request("Hello there", greedy(8))
        eng.step()
        (pid,) = worker_pids(second)
        os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(TensorParallelError, match=r"rank 1 .*SIGKILL"):
            eng.step()
        assert time.monotonic() - t0 < 10
        with pytest.raises(TensorParallelError):  # and every later step, at once
            eng.step()
    finally:
        second.shutdown()
    assert not child_pids() & {*pids, pid}


def test_a_failing_worker_s_own_error_reaches_the_caller(tiny_qwen3_path, qwen3):
    """A worker that raises sends its traceback to rank 0: the caller's error quotes it."""
    ref, _ = qwen3
    with LLM(str(tiny_qwen3_path), tensor_parallel_size=2, share_model_with=ref, **POOL) as llm:
        (pid,) = worker_pids(llm)
        llm.engine.runner.workers.send("no such message", None)  # the worker raises ValueError
        llm.engine.add_request("Hello there", greedy(2))
        t0 = time.monotonic()
        with pytest.raises(TensorParallelError, match=r"worker rank 1 failed: rank 1 \(pid \d+\):\n"
                           r"Traceback(.|\n)*ValueError: unknown message 'no such message' from rank 0"):
            llm.engine.step()
        assert time.monotonic() - t0 < 10
    assert is_gone(pid)


def test_workers_exit_with_the_context_manager_and_at_interpreter_exit(tiny_qwen3_path, qwen3):
    ref, _ = qwen3
    with LLM(str(tiny_qwen3_path), tensor_parallel_size=2, share_model_with=ref, **POOL) as llm:
        (pid,) = worker_pids(llm)
        assert llm.generate(["Hi"], greedy(2), use_tqdm=False)[0].token_ids == \
            ref.generate(["Hi"], greedy(2), use_tqdm=False)[0].token_ids
    assert is_gone(pid)
    llm.shutdown()  # idempotent
    # A script that never calls shutdown(): its workers still stop when it exits. (It holds
    # the workers and the runner that drives them without an LLM: no tokenizer, a faster test.)
    code = textwrap.dedent(f"""
        from engine import EngineConfig
        from engine.executor.executor import WorkerGroup
        from engine.model import ModelSpec
        from engine.runner.model_runner import ModelRunner, resolve_device
        if __name__ == "__main__":
            path = {str(tiny_qwen3_path)!r}
            config = EngineConfig(model=path, tensor_parallel_size=2, num_kv_blocks=8)
            spec = ModelSpec.from_folder(path)
            workers = WorkerGroup(config, spec, 64, resolve_device(config.device))
            runner = ModelRunner(config, spec, 64, workers=workers)
            runner.wait_ready()
            print(runner.workers.procs[0].pid, flush=True)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    worker = int(out.stdout.split()[-1])
    deadline = time.monotonic() + 5
    while not is_gone(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert is_gone(worker)


# -- configuration errors -----------------------------------------------------------------
@pytest.mark.parametrize("field, change", [
    ("num_heads", {"num_heads": 6, "num_kv_heads": 2}),
    ("num_kv_heads", {"num_heads": 4, "num_kv_heads": 1}),
    ("vocab_size", {"vocab_size": 151937}),
    ("intermediate_size", {"intermediate_size": 129}),
])
def test_non_divisible_sizes_name_the_field(tiny_qwen3_path, field, change):
    spec = dataclasses.replace(ModelSpec.from_folder(tiny_qwen3_path), **change)
    n = 4 if field == "num_heads" else 2
    with pytest.raises(ValueError, match=rf"tensor_parallel_size={n} does not divide the model's {field} "):
        check_tensor_parallel(spec, n)


def test_engine_rejects_a_bad_size_before_starting_workers(tiny_qwen3_path):
    before = child_pids()
    with pytest.raises(ValueError, match="num_heads"):
        LLM(str(tiny_qwen3_path), tensor_parallel_size=3)
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        LLM(str(tiny_qwen3_path), tensor_parallel_size=0)
    assert child_pids() <= before


# -- the default model, and NCCL ----------------------------------------------------------
@pytest.mark.slow
def test_default_model_tp3_matches_tp1(default_model_path):
    """SmolLM2-135M has 9 heads and 3 KV heads: 3 ranks is its smallest split (2 is refused)."""
    with pytest.raises(ValueError, match="num_heads"):
        LLM(str(default_model_path), tensor_parallel_size=2)
    prompts = ["The capital of France is", "def fibonacci(n):"]
    ref = LLM(str(default_model_path), num_kv_blocks=32)
    expected = [o.token_ids for o in ref.generate(prompts, greedy(6), use_tqdm=False)]
    with LLM(str(default_model_path), num_kv_blocks=32, tensor_parallel_size=3, share_model_with=ref) as tp:
        outs = tp.generate(prompts, greedy(6), use_tqdm=False)
        assert [o.token_ids for o in outs] == expected
        assert outs[0].text.startswith(" Paris")
        info = tp.engine.model_info
        assert (info["num_heads_per_rank"], info["num_kv_heads_per_rank"]) == (3, 1)


@pytest.mark.gpu
def test_nccl_tp2_matches_tp1_on_gpus(tiny_qwen3_path):
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 or more CUDA GPUs")
    cfg = dict(POOL, device="cuda", dtype="float32")
    ref = LLM(str(tiny_qwen3_path), **cfg)
    with LLM(str(tiny_qwen3_path), tensor_parallel_size=2, share_model_with=ref, **cfg) as tp:
        assert tp.engine.model_info["tp_backend"] == "nccl"
        ref_trace, tp_trace = run_lockstep([ref, tp], MIXED, max_tokens=8)
        assert tp_trace["outputs"] == ref_trace["outputs"]
        assert tp_trace["steps"] == ref_trace["steps"]
