"""Property-based workloads (hypothesis): random prompts, shared prefixes, arrivals, aborts,
tiny pools, any budget, both policies, chunking and prefix caching on and off. After every
step the engine's invariants hold; nobody starves; every block comes back; and every greedy
output equals the same request run alone with no constraint."""
from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import LLM

from .helpers import greedy

MAX_MODEL_LEN = 96
VOCAB = 151_000


@dataclass
class Workload:
    config: dict
    requests: list[dict]   # {prompt, max_tokens, arrival_step, abort_step}


# What the workloads exercised, over the whole module (printed at its end): workloads, steps,
# requests, rejected, aborted, preemptions.
TOTALS: Counter[str] = Counter()


@st.composite
def workloads(draw) -> Workload:
    block_size = draw(st.sampled_from([4, 8, 16]))
    chunked = draw(st.booleans())
    config = dict(
        block_size=block_size,
        num_kv_blocks=draw(st.integers(min_value=4, max_value=24)),
        max_num_batched_tokens=draw(st.integers(min_value=block_size, max_value=160)),
        max_num_seqs=draw(st.integers(min_value=1, max_value=8)),
        scheduling_policy=draw(st.sampled_from(["unified", "prefill_first"])),
        enable_chunked_prefill=chunked,
        enable_prefix_caching=draw(st.booleans()),
        scheduler_reserve_full_isl=draw(st.booleans()),
        max_model_len=MAX_MODEL_LEN,
    )
    shared = draw(st.lists(st.integers(0, VOCAB - 1), min_size=0, max_size=40))
    reqs = []
    for _ in range(draw(st.integers(min_value=2, max_value=8))):
        own = draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=60))
        prefix_len = draw(st.integers(0, len(shared)))
        reqs.append(dict(
            prompt=(shared[:prefix_len] + own)[:MAX_MODEL_LEN],
            max_tokens=draw(st.integers(1, 12)),
            arrival_step=draw(st.integers(0, 6)),
            abort_step=draw(st.one_of(st.none(), st.integers(0, 20))),
        ))
    return Workload(config, reqs)


@pytest.fixture(scope="module")
def reference(tiny_qwen3_path):
    """Greedy outputs of requests run alone on an unconstrained engine (memoised)."""
    llm = LLM(model=str(tiny_qwen3_path), max_model_len=MAX_MODEL_LEN, block_size=16, num_kv_blocks=64)
    memo: dict = {}

    def outputs(prompt: list[int], max_tokens: int) -> list[int]:
        key = (tuple(prompt), max_tokens)
        if key not in memo:
            memo[key] = llm.generate([prompt], greedy(max_tokens, ignore_eos=True), use_tqdm=False)[0].token_ids
        return memo[key]
    return outputs


@pytest.fixture(scope="module")
def model_path(tiny_qwen3_path):
    return str(tiny_qwen3_path)


def run_workload(model_path: str, wl: Workload, reference) -> None:
    llm = LLM(model=model_path, check_invariants=True, **wl.config)
    eng = llm.engine
    pending = sorted(enumerate(wl.requests), key=lambda x: x[1]["arrival_step"])
    live: dict[str, dict] = {}
    step, max_steps = 0, 200 + 40 * len(wl.requests) * (MAX_MODEL_LEN + 12)
    while pending or eng.has_unfinished_requests():
        while pending and pending[0][1]["arrival_step"] <= step:
            _, r = pending.pop(0)
            try:
                rid = eng.add_request(r["prompt"], greedy(r["max_tokens"], ignore_eos=True))
            except ValueError as e:  # must be one of the documented add-time limits
                msg = str(e)
                assert any(f in msg for f in ("num_kv_blocks", "max_num_batched_tokens")), msg
                TOTALS["rejected"] += 1
                continue
            live[rid] = {**r, "added_at": step}
        for rid, r in list(live.items()):
            if r["abort_step"] is not None and step - r["added_at"] == r["abort_step"] \
                    and not eng.requests[rid].is_finished:
                eng.abort_request(rid)
                TOTALS["aborted"] += 1
        eng.step()
        step += 1
        assert step < max_steps, f"requests starved: {eng.waiting} {eng.running}"
    pool = eng.kv.pool
    assert pool.num_free_blocks == pool.num_blocks - 1, "blocks leaked"
    assert all(b.ref_count == 0 for b in pool.blocks)
    for rid, r in live.items():
        req = eng.requests[rid]
        if req.finish_reason == "abort":
            continue
        assert req.output_token_ids == reference(r["prompt"], r["max_tokens"]), (rid, wl.config)
    TOTALS["workloads"] += 1
    TOTALS["steps"] += step
    TOTALS["requests"] += len(live)
    TOTALS["preemptions"] += eng.metrics["num_preemptions"]


COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                     HealthCheck.function_scoped_fixture])


# 10 derandomized examples in CI (about 40 s on 2 cores); the soak test below runs 1,000.
@settings(max_examples=int(os.environ.get("KVSCOPE_PROPERTY_EXAMPLES", "10")), derandomize=True, **COMMON)
@given(wl=workloads())
def test_random_workloads_keep_invariants_and_outputs(model_path, reference, wl):
    run_workload(model_path, wl, reference)


@pytest.mark.soak
@settings(max_examples=int(os.environ.get("KVSCOPE_SOAK_EXAMPLES", "1000")), **COMMON)
@given(wl=workloads())
def test_soak_random_workloads(model_path, reference, wl):
    run_workload(model_path, wl, reference)


def teardown_module(module) -> None:
    print(f"\n[properties] checked {TOTALS['workloads']} workloads, {TOTALS['steps']} steps, {TOTALS['requests']} "
          f"requests ({TOTALS['rejected']} rejected at add time, {TOTALS['aborted']} aborted, "
          f"{TOTALS['preemptions']} preemptions)")
