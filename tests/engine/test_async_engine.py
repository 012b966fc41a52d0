"""The engine's step loop under async scheduling (EngineConfig.async_scheduling, vLLM's default on
a GPU): each call schedules the next step before the step in flight lands, then lands it, fills
the next step's placeholder inputs with its tokens and launches the next. Its decisions are
AsyncScheduler's (checked against vLLM by `tests.oracle.differential --async`); here the real
model runs on a CPU: the same tokens as the synchronous loop, every bookkeeping invariant after
every landing, and each placeholder holding the token its step in flight sampled."""
from __future__ import annotations

import random
from itertools import pairwise

import pytest

from engine import LLM, SamplingParams

WINDOW = 20


def workload(llm: LLM, seed: int = 0) -> dict[str, list[int]]:
    """Greedy and seeded random requests, sharing a prefix, longer than the budget (chunks), in a
    pool that runs dry (preemption), with one aborted while its step is in flight; the outputs."""
    eng, rng = llm.engine, random.Random(seed)
    common = [rng.randrange(300, 20_000) for _ in range(40)]
    ids = []
    for i in range(7):
        prompt = (common if i % 2 else []) + [rng.randrange(300, 20_000) for _ in range(15 + 23 * i)]
        params = SamplingParams(temperature=0.0 if i % 3 else 0.8, seed=None if i % 3 else 100 + i,
                                max_tokens=10 + 4 * i, ignore_eos=True, logprobs_top=3)
        ids.append(eng.add_request(prompt, params, request_id=f"r{i}"))
    for n in range(1000):
        if n == 4:
            eng.abort_request("r5")
        if not eng.has_unfinished_requests():
            break
        eng.step()
    return {rid: list(eng.requests[rid].output_token_ids) for rid in ids if rid != "r5"}


def engines(model, **knobs) -> tuple[LLM, LLM]:
    knobs = {"num_kv_blocks": 28, "block_size": 16, "max_num_batched_tokens": 64, "max_num_seqs": 5,
             "check_invariants": True, **knobs}
    return LLM(model=str(model), async_scheduling=False, **knobs), LLM(model=str(model), async_scheduling=True, **knobs)


def placeholders_checked(llm: LLM, records) -> int:
    """Each step scheduled ahead names the step in flight, and each placeholder input in its
    batch is the token that step sampled for the request; returns how many were checked."""
    checked = 0
    for before, rec in pairwise(records):
        ahead = rec.scheduled_ahead
        assert ahead is not None and ahead["in_flight_step"] == before.step == rec.step - 1
        for rid, token in ahead["placeholders"].items():
            assert before.sampled[rid]["token_id"] == token
            row = [s["request_id"] for s in rec.scheduled].index(rid)
            assert rec.batch["input_ids"][rec.batch["query_start_loc"][row + 1] - 1] == token
            checked += 1
    return checked


def test_async_scheduling_gives_the_synchronous_tokens_through_chunks_hits_preemption_and_an_abort(tiny_qwen3_path):
    sync, ahead = engines(tiny_qwen3_path)
    assert not sync.engine.async_scheduling and ahead.engine.async_scheduling
    records = []
    step = ahead.engine.step
    ahead.engine.step = lambda: records.append(step()) or records[-1]   # type: ignore[method-assign]
    assert workload(ahead) == workload(sync)
    assert ahead.engine.scheduler.num_preemptions and ahead.engine.kv.prefix_cache_hits
    assert any(s["chunk_index"] for r in records for s in r.scheduled if s["is_prefill"])
    assert records[0].scheduled_ahead is None
    assert placeholders_checked(ahead, records[:1] + [r for r in records[1:] if r.scheduled]) > 50
    assert ahead.engine.requests["r5"].finish_reason == "abort"
    assert not ahead.engine.has_unfinished_requests() and ahead.engine._in_flight is None


def test_the_torch_sampler_leaves_its_tokens_on_the_device_until_the_step_lands(tiny_qwen3_path):
    """Without the native kernels the greedy rows are torch's argmax and top-k: the tokens and
    candidates cross to the host only when the landing asks (a GPU's copy waits for its forward
    there, not at launch). The same tokens either way."""
    sync, ahead = engines(tiny_qwen3_path)
    for llm in (sync, ahead):
        llm.engine.sampler.native = None
    asked = []
    launch = ahead.engine.sampler.launch

    def noting(*args, **kwargs):
        results = launch(*args, **kwargs)
        asked.append(False)

        def landing():
            asked[-1] = True
            return results()
        return landing
    ahead.engine.sampler.launch = noting   # type: ignore[method-assign]
    ahead.engine.add_request([5, 6, 7] * 10, SamplingParams(temperature=0.0, max_tokens=6, logprobs_top=2))
    ahead.engine.step()   # the first step landed; the second launched, its results not asked for
    assert asked == [True, False]
    assert workload(ahead) == workload(sync)


def test_sliding_window_layers_under_async_scheduling(tiny_checkpoint):
    """A model with sliding-window layers (two KV cache groups): the window frees no block a step
    in flight still reads, and the tokens are the synchronous loop's."""
    model = tiny_checkpoint("qwen3", num_layers=4, sliding_window=WINDOW,
                            layer_types=("full_attention", "sliding_attention", "sliding_attention", "full_attention"))
    sync, ahead = engines(model, num_kv_blocks=60)
    assert workload(ahead, seed=1) == workload(sync, seed=1)


def test_async_scheduling_is_a_bool_and_runs_the_unified_policy_only(tiny_qwen3_path):
    with pytest.raises(ValueError, match=r"async_scheduling must be a bool or None"):
        LLM(model=str(tiny_qwen3_path), async_scheduling="yes")
    with pytest.raises(ValueError, match=r"async_scheduling runs vLLM's 'unified' scheduling_policy only"):
        LLM(model=str(tiny_qwen3_path), async_scheduling=True, scheduling_policy="prefill_first")
    llm = LLM(model=str(tiny_qwen3_path), async_scheduling=True)
    with pytest.raises(ValueError, match=r"scheduling_policy"):
        llm.engine.update_scheduler_config(scheduling_policy="prefill_first")
    assert llm.engine.config.scheduling_policy == "unified"   # the engine keeps working
    assert LLM(model=str(tiny_qwen3_path)).engine.config.async_scheduling is False   # a CPU's default
