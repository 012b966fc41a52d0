"""kvscope's AsyncScheduler on hand-made workloads, without vLLM or a model: step N+1 is
scheduled before step N's update, as vLLM's engine core batch queue does. What it must decide
exactly as vLLM does is checked against vLLM itself by `tests.oracle.differential --async`;
here: the placeholders it keeps, and that the same sampled tokens give the same outputs as
the synchronous Scheduler."""
from __future__ import annotations

from collections import deque
from typing import TypeVar

import pytest

from engine.config import EngineConfig
from engine.core.async_scheduler import AsyncScheduler
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.scheduler import Scheduler, SchedulerOutput
from engine.request import Request, RequestStatus
from engine.sampling_params import SamplingParams

EOS = 99
S = TypeVar("S", bound=Scheduler)


def make(cls: type[S], *, num_blocks: int = 64, block_size: int = 4, budget: int = 64,
         max_model_len: int = 256, **knobs) -> S:
    config = EngineConfig(block_size=block_size, num_kv_blocks=num_blocks, max_num_batched_tokens=budget,
                          max_model_len=max_model_len, **knobs)
    return cls(config, KVCacheManager(num_blocks, block_size, config.enable_prefix_caching, max_model_len),
               max_model_len)


def request(rid: str, prompt: list[int], max_tokens: int, ignore_eos: bool = True) -> Request:
    return Request(rid, prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=ignore_eos),
                   eos_token_id=EOS)


def token(rid: str, index: int) -> int:
    """The token every run samples as output `index` of `rid` (EOS for some, to stop early)."""
    if rid in ("b", "e") and index == 3:
        return EOS
    return 1 + (sum(map(ord, rid)) * 7 + index * 5) % 5


def tokens_for(out: SchedulerOutput) -> dict[str, int]:
    # As a model runner does: one token per sampling row, even for a request finished meanwhile.
    return {s.request.request_id: token(s.request.request_id, len(s.request.output_token_ids))
            for s in out.scheduled if s.sample}


def run_sync(sched: Scheduler) -> list[str]:
    finished = []
    while sched.has_unfinished():
        out = sched.schedule()
        finished += sched.update_from_output(out, tokens_for(out), 0.0, 0.0)
    return finished


def run_async(sched: AsyncScheduler, depth: int = 2, on_schedule=None) -> list[str]:
    """vLLM's engine core order: schedule while fewer than `depth` steps are in flight, else
    update the oldest. `on_schedule(out, in_flight)` sees each step as it is scheduled."""
    in_flight: deque[SchedulerOutput] = deque()
    finished: list[str] = []
    while sched.has_unfinished() or in_flight:
        if sched.has_unfinished() and len(in_flight) < depth:
            in_flight.append(out := sched.schedule())
            if on_schedule:
                on_schedule(out, in_flight)
            if len(in_flight) < depth:
                continue
        out = in_flight.popleft()
        finished += sched.update_from_output(out, tokens_for(out), 0.0, 0.0)
    return finished


def test_a_decode_scheduled_ahead_takes_a_placeholder_that_the_landing_token_replaces():
    sched = make(AsyncScheduler, block_size=2)
    r = request("a", [1, 2, 3], max_tokens=2)
    sched.add(r)

    first = sched.schedule()  # the whole prompt: its last row samples output 0
    (s,) = first.scheduled
    assert (s.num_tokens, s.is_prefill, s.sample, s.num_placeholder_inputs) == (3, True, True, 0)
    assert (r.num_computed_tokens, r.num_output_placeholders, r.num_tokens) == (3, 1, 3)  # counted when scheduled

    second = sched.schedule()  # before the first lands: a decode whose input is output 0, unknown yet
    (s,) = second.scheduled
    assert (s.num_tokens, s.num_computed_before, s.is_prefill, s.chunk_index, s.sample) == (1, 3, False, None, True)
    assert s.num_placeholder_inputs == 1
    assert (r.num_computed_tokens, r.num_output_placeholders) == (4, 2)
    assert sched.num_steps_in_flight == 2

    assert sched.update_from_output(first, tokens_for(first), 0.0, 0.0) == []
    assert (r.output_token_ids, r.num_output_placeholders) == ([token("a", 0)], 1)
    # Blocks are cached up to computed - placeholders: [1, 2], not [3, output 0] (its KV is the
    # second step's to compute, and that step is still in flight).
    assert r.num_cached_blocks == 1

    third = sched.schedule()  # output 1, its last, is already in flight: no step for it
    assert third.is_empty and r.num_computed_tokens == 4

    assert sched.update_from_output(second, tokens_for(second), 0.0, 0.0) == ["a"]
    assert r.output_token_ids == [token("a", 0), token("a", 1)] and r.finish_reason == "length"
    assert r.num_output_placeholders == 0
    # The landed token made [3, output 0] computed and known: cached before the request's
    # blocks went back to the pool, so the cache keeps it.
    assert sched.kv.pool.blocks[2].block_hash is not None and sched.kv.pool.num_free_blocks == 63
    assert sched.update_from_output(third, {}, 0.0, 0.0) == [] and sched.num_steps_in_flight == 0


def test_no_step_is_scheduled_past_max_model_len():
    sched = make(AsyncScheduler, max_model_len=5)
    r = request("a", [1, 2, 3], max_tokens=10)  # max_model_len cuts it at 2 outputs
    sched.add(r)
    first, second = sched.schedule(), sched.schedule()
    assert [s.num_tokens for s in second.scheduled] == [1]  # position 3; its output is position 4
    sched.update_from_output(first, tokens_for(first), 0.0, 0.0)
    assert sched.schedule().is_empty  # position 4 is the last: the step in flight samples it
    assert sched.update_from_output(second, tokens_for(second), 0.0, 0.0) == ["a"]
    assert r.num_tokens == 5 and r.finish_reason == "length"


def test_prefill_chunks_scheduled_ahead_keep_their_order_and_sample_only_at_the_end():
    sched = make(AsyncScheduler, budget=4)
    r = request("a", list(range(1, 11)), max_tokens=3)
    sched.add(r)
    rows: list[tuple] = []
    run_async(sched, on_schedule=lambda out, in_flight: rows.extend(
        (s.num_computed_before, s.num_tokens, s.chunk_index, s.sample, s.num_placeholder_inputs, len(in_flight))
        for s in out.scheduled))
    assert rows == [(0, 4, 0, False, 0, 1), (4, 4, 1, False, 0, 2), (8, 2, 2, True, 0, 2),
                    (10, 1, None, True, 1, 2), (11, 1, None, True, 1, 2)]
    assert r.output_token_ids == [token("a", i) for i in range(3)]


def test_the_same_sampled_tokens_give_the_same_outputs_as_the_synchronous_scheduler():
    # Shared prefixes (hits), chunked prefill, early EOS (a step ahead for a finished request),
    # and a pool small enough to preempt (stale outputs land on a waiting request).
    prompts = {"a": [1, 2, 3, 4, 5, 6, 7, 8, 9], "b": [1, 2, 3, 4, 5, 6, 10], "c": [3] * 13,
               "d": [1, 2, 3, 4, 11, 12], "e": [7, 7, 7, 7, 7], "f": [1, 2, 3, 4, 5, 6, 7, 8, 9, 20, 21]}
    max_tokens = {"a": 9, "b": 8, "c": 6, "d": 12, "e": 7, "f": 5}

    def run(sched: Scheduler) -> tuple[dict, list[str]]:
        reqs = {rid: request(rid, p, max_tokens[rid], ignore_eos=False) for rid, p in prompts.items()}
        for r in reqs.values():
            sched.add(r)
        wrong: list[tuple] = []

        def check(out, in_flight):
            # Each running request has one placeholder per step in flight that samples it; a
            # waiting one has none (preemption dropped them).
            for r in sched.running:
                samples = sum(s.request is r and s.sample for o in in_flight for s in o.scheduled)
                if r.num_output_placeholders != samples:
                    wrong.append((r.request_id, r.num_output_placeholders, samples))
            wrong.extend((r.request_id, r.num_output_placeholders, 0) for r in sched.waiting
                         if r.num_output_placeholders)

        finished = run_async(sched, on_schedule=check) if isinstance(sched, AsyncScheduler) else run_sync(sched)
        assert not wrong, wrong
        return {rid: (r.output_token_ids, r.finish_reason) for rid, r in reqs.items()}, finished

    sync_sched = make(Scheduler, num_blocks=12, block_size=4, budget=8)
    async_sched = make(AsyncScheduler, num_blocks=12, block_size=4, budget=8)
    sync_outputs, sync_finished = run(sync_sched)
    async_outputs, async_finished = run(async_sched)
    assert async_outputs == sync_outputs
    assert sorted(async_finished) == sorted(sync_finished) == sorted(prompts)  # each finished once
    assert sync_outputs["b"][1] == sync_outputs["e"][1] == "stop" and len(sync_outputs["b"][0]) == 4
    assert async_sched.num_preemptions > 0, "the pool was meant to force preemption"
    assert async_sched.num_generated_tokens == sync_sched.num_generated_tokens == sum(
        len(o) for o, _ in sync_outputs.values())
    assert async_sched.kv.pool.num_free_blocks == 11 and async_sched.num_steps_in_flight == 0
    assert all(r.num_output_placeholders == 0 for r in async_sched.finished)


def test_preemption_drops_the_placeholders_and_a_stale_output_still_lands():
    # A pool of 3 blocks of 2: "a" holds 2, "b" 1; "a"'s next decode needs a third, so "b" goes.
    sched = make(AsyncScheduler, num_blocks=4, block_size=2, budget=16)
    a, b = request("a", [1, 2, 3], max_tokens=5), request("b", [4], max_tokens=5)
    sched.add(a)
    sched.add(b)
    first = sched.schedule()  # both prefills
    second = sched.schedule()  # both decodes, ahead
    assert [s.request.request_id for s in second.scheduled] == ["a", "b"] and not second.preempted
    sched.update_from_output(first, tokens_for(first), 0.0, 0.0)
    assert (a.num_output_placeholders, b.num_output_placeholders) == (1, 1)
    third = sched.schedule()  # "a" needs a block for position 4: "b", newest, is preempted
    assert third.preempted == ["b"] and b.status == RequestStatus.PREEMPTED
    assert (b.num_output_placeholders, b.num_computed_tokens, b.block_table) == (0, 0, [])
    assert list(sched.waiting) == [b]

    sched.update_from_output(second, tokens_for(second), 0.0, 0.0)  # "b"'s output from the second step lands
    assert b.output_token_ids == [token("b", 0), token("b", 1)]  # kept: it is "b"'s next output all the same
    assert b.num_output_placeholders == 0 and b.block_table == []  # no placeholder, no block to cache
    assert a.num_output_placeholders == 1


def test_a_request_waits_until_its_stale_outputs_have_landed():
    # Three steps in flight (a deeper queue than vLLM's two): "b" is preempted while two of its
    # steps are in flight and is readmitted only once both have landed; "c" goes past it.
    sched = make(AsyncScheduler, num_blocks=5, block_size=2, budget=16, max_num_seqs=2)
    a, b, c = request("a", [1, 2, 3], max_tokens=4), request("b", [4], max_tokens=6), request("c", [5], max_tokens=2)
    for r in (a, b, c):
        sched.add(r)
    s1 = sched.schedule()
    s2 = sched.schedule()
    assert [s.request.request_id for s in s2.scheduled] == ["a", "b"]
    s3 = sched.schedule()  # "a" needs a third block and "b" a second: "b" is preempted
    assert s3.preempted == ["b"] and list(sched.waiting) == [b, c]
    sched.update_from_output(s1, tokens_for(s1), 0.0, 0.0)
    s4 = sched.schedule()  # "b"'s step 2 output is still in flight: "c" is admitted past it
    assert "c" in s4.new_requests and "b" not in s4.new_requests
    assert list(sched.waiting) == [b]
    sched.update_from_output(s2, tokens_for(s2), 0.0, 0.0)  # its second stale output lands
    assert b.output_token_ids == [token("b", 0), token("b", 1)] and b.status == RequestStatus.PREEMPTED
    sched.update_from_output(s3, tokens_for(s3), 0.0, 0.0)
    sched.update_from_output(s4, tokens_for(s4), 0.0, 0.0)  # "a" finishes: room for "b"
    s5 = sched.schedule()  # nothing of "b" in flight now: it resumes, its two outputs recomputed
    assert s5.new_requests == ["b"]
    row = next(s for s in s5.scheduled if s.request is b)
    assert (row.num_computed_before, row.num_tokens, row.sample) == (0, 3, True)
    assert b.num_output_placeholders == 1
    sched.update_from_output(s5, tokens_for(s5), 0.0, 0.0)
    run_async(sched)
    assert b.output_token_ids == [token("b", i) for i in range(6)] and b.finish_reason == "length"


def test_an_abort_while_its_step_is_in_flight_drops_that_output():
    sched = make(AsyncScheduler)
    r = request("a", [1, 2, 3, 4, 5], max_tokens=8)
    sched.add(r)
    first = sched.schedule()
    second = sched.schedule()
    sched.update_from_output(first, tokens_for(first), 0.0, 0.0)
    sched.finish(r, "abort")
    assert sched.update_from_output(second, tokens_for(second), 0.0, 0.0) == []
    assert r.output_token_ids == [token("a", 0)] and r.finish_reason == "abort"
    assert sched.kv.pool.num_free_blocks == 63 and not sched.has_unfinished()


def test_outputs_land_in_the_order_their_steps_were_scheduled():
    sched = make(AsyncScheduler)
    sched.add(request("a", [1, 2, 3], max_tokens=4))
    sched.schedule()
    second = sched.schedule()
    with pytest.raises(ValueError, match="order"):
        sched.update_from_output(second, tokens_for(second), 0.0, 0.0)


def test_async_scheduling_runs_the_unified_policy_only():
    sched = make(AsyncScheduler)
    sched.config = sched.config.replace(scheduling_policy="prefill_first")   # a live knob
    with pytest.raises(ValueError, match="'unified' policy only"):
        sched.schedule()
