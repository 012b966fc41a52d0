"""Session through a real engine: history, live budgets, bad input, observers, metrics.

Most tests use the tiny random Qwen3 checkpoint (fast, real tokenizer); one checks the
default model end to end.
"""
from __future__ import annotations

import copy
import json
import logging
from itertools import pairwise

import pytest

from engine import LLM, EngineConfig, SamplingParams
from engine.report.list_prefix import as_json
from explorer import HistoryEntry, Session

GREEDY = {"temperature": 0.0}
LONG_PROMPT = list(range(1000, 1040))  # 40 token ids: two full blocks of 16 and a partial one


@pytest.fixture
def session(tiny_qwen3_path) -> Session:
    return Session(str(tiny_qwen3_path), num_kv_blocks=64)


@pytest.fixture
def events(session: Session) -> list[str]:
    seen: list[str] = []
    session.subscribe(lambda event, s: seen.append(event))
    return seen


def queue_ids(session: Session, name: str) -> list[str]:
    return [r["request_id"] for r in session.current.snapshot["queues"][name]]


# -- construction and the step-0 entry ------------------------------------------------------
def test_new_session_has_one_step0_entry_with_snapshot_and_no_record(session):
    assert len(session.history) == 1
    entry = session.current
    assert isinstance(entry, HistoryEntry)
    assert (entry.step, entry.record) == (0, None)
    assert entry.snapshot["queues"] == {"waiting": [], "running": [], "finished": []}
    assert entry.snapshot["block_pool"]["num_blocks"] == 64
    assert session.last_error is None


def test_session_accepts_llm_engineconfig_or_path(tiny_qwen3_path):
    llm = LLM(model=str(tiny_qwen3_path), num_kv_blocks=32)
    assert Session(llm).llm is llm
    from_config = Session(EngineConfig(model=str(tiny_qwen3_path), num_kv_blocks=20, block_size=8))
    assert (from_config.config.num_kv_blocks, from_config.config.block_size) == (20, 8)
    with pytest.raises(ValueError, match="cannot apply to an existing LLM"):
        Session(llm, block_size=8)
    with pytest.raises(ValueError, match="bogus_knob"):
        Session(str(tiny_qwen3_path), bogus_knob=1)


def test_debug_invariants_turns_on_the_engine_check(tiny_qwen3_path):
    s = Session(str(tiny_qwen3_path), debug_invariants=True, num_kv_blocks=16)
    assert s.config.check_invariants is True
    s.add_request(LONG_PROMPT, max_tokens=2, **GREEDY)
    assert len(s.run_until_idle()) >= 2


# -- add / step / history -------------------------------------------------------------------
def test_add_request_appears_waiting_in_the_current_snapshot_without_a_new_entry(session, events):
    rid = session.add_request("The capital of France is", max_tokens=3, **GREEDY)
    assert queue_ids(session, "waiting") == [rid]
    assert len(session.history) == 1  # history grows per step, not per action
    assert events == ["add"]
    req = session.current.snapshot["queues"]["waiting"][0]
    assert req["prompt_token_ids"] == [785, 6722, 315, 9625, 374]  # Qwen's real tokenizer
    assert req["max_tokens"] == 3


def test_add_request_uses_params_and_overrides_fields(session):
    rid = session.add_request([1, 2, 3], SamplingParams(temperature=0.0, max_tokens=5), max_tokens=2,
                              request_id="mine")
    assert rid == "mine"
    assert session.current.snapshot["queues"]["waiting"][0]["max_tokens"] == 2


def test_each_step_appends_one_entry_whose_record_and_snapshot_match(session, events):
    a = session.add_request(LONG_PROMPT, max_tokens=3, **GREEDY)
    b = session.add_request([7, 8, 9], max_tokens=2, **GREEDY)
    recs = session.step(2)
    assert [r.step for r in recs] == [1, 2]
    assert [e.step for e in session.history] == [0, 1, 2]
    for entry, rec in zip(session.history[1:], recs):
        assert entry.record == rec.to_dict()
        assert entry.snapshot["step"] == entry.step == entry.record["step"]
    first = session.history[1]
    assert {s["request_id"] for s in first.record["scheduled"]} == {a, b}
    assert first.record["batch"]["query_start_loc"] == [0, 40, 43]
    assert events == ["add", "add", "step", "step"]
    # What crosses into widgets and files is JSON-able (the tables' views as lists, as for snapshots).
    json.dumps([e.record for e in session.history[1:]], default=as_json)


def test_past_entries_are_frozen_while_the_latest_tracks_the_engine(session):
    session.add_request([5, 6, 7], max_tokens=4, **GREEDY)
    session.step()
    step1 = copy.deepcopy(session.history[1])
    session.add_request([9, 9, 9], max_tokens=2, request_id="late", **GREEDY)
    # Added after step 1 and before step 2: entry 1 (the latest) now shows it waiting.
    assert "late" in queue_ids(session, "waiting")
    session.step(2)
    assert session.history[1].record == step1.record
    assert session.entry(1).snapshot["queues"]["running"] == step1.snapshot["queues"]["running"]
    assert session.entry(2).record["new_requests"] == ["late"]


def test_the_history_keeps_each_record_as_the_engine_made_it_without_a_copy(tiny_qwen3_path):
    """The Session keeps the record's own parts (StepRecord.to_dict shares them: a copy of a large
    step's batch and top-k lists costs about what its changes do), so nothing may change them
    once the step is out: through chunked prefills, a preemption, an abort and finishes, every
    record the history holds equals a deep copy taken as its step returned."""
    s = Session(str(tiny_qwen3_path), num_kv_blocks=10, block_size=8, max_num_batched_tokens=24, max_num_seqs=3)
    for i in range(3):
        s.add_request(list(range(100 + 7 * i, 130 + 7 * i)), max_tokens=12, ignore_eos=True, **GREEDY)
    taken = {}
    for _ in range(60):
        if any(r["preempted"] for r in taken.values()) and "1" not in queue_ids(s, "finished"):
            s.abort("1")
        recs = s.step()
        if not recs:
            break
        entry = s.current
        assert entry.record["batch"] is recs[0].batch and entry.record["sampled"] is recs[0].sampled
        taken[entry.step] = copy.deepcopy(entry.record)
    assert sum(len(r["preempted"]) for r in taken.values()) >= 1, "the workload must preempt"
    assert sorted(r["finish_reason"] for r in s.current.snapshot["queues"]["finished"]) == ["abort", "length", "length"]
    assert len(taken) > 10 and all(s.entry(step).record == rec for step, rec in taken.items())


def test_history_is_a_copy(session):
    session.history.append("junk")
    assert len(session.history) == 1


def test_step_with_nothing_to_do_records_nothing(session, events):
    assert session.step() == []
    assert session.step(5) == []
    assert len(session.history) == 1
    assert events == []


def test_step_stops_early_when_every_request_has_finished(session):
    session.add_request([1, 2, 3], max_tokens=2, **GREEDY)
    recs = session.step(50)
    assert len(recs) == 2
    assert queue_ids(session, "finished") == ["0"]
    assert session.current.snapshot["queues"]["finished"][0]["finish_reason"] == "length"


def test_run_until_idle_finishes_every_request(session):
    ids = [session.add_request([i, i + 1, i + 2], max_tokens=3, **GREEDY) for i in (10, 20, 30)]
    session.run_until_idle()
    assert sorted(queue_ids(session, "finished")) == sorted(ids)
    assert not session.engine.has_unfinished_requests()
    with pytest.raises(ValueError, match="max_steps"):
        session.run_until_idle(max_steps=0)


def test_entry_scrubs_to_a_step_and_rejects_unknown_steps(session):
    session.add_request([1, 2, 3], max_tokens=3, **GREEDY)
    session.run_until_idle()
    assert session.entry(2).record["step"] == 2
    assert session.entry(0).record is None
    with pytest.raises(ValueError, match="step 99"):
        session.entry(99)


# -- live budgets ---------------------------------------------------------------------------
def test_set_budget_applies_from_the_next_step(session, events):
    rid = session.add_request(LONG_PROMPT, max_tokens=2, **GREEDY)
    assert session.set_budget(max_num_batched_tokens=8) == {"max_num_batched_tokens": 8}
    assert session.current.snapshot["config"]["max_num_batched_tokens"] == 8
    session.step()
    rec = session.current.record
    assert rec["token_budget"] == 8
    # The record keeps every scheduler knob the step ran under, for a view of that step later.
    assert rec["budgets"] == {"max_num_batched_tokens": 8, "max_num_seqs": 256, "enable_chunked_prefill": True,
                              "enable_prefix_caching": True, "scheduler_reserve_full_isl": True,
                              "scheduling_policy": "unified"}
    assert rec["scheduled"] == [{"request_id": rid, "num_tokens": 8, "num_computed_before": 0,
                                 "is_prefill": True, "num_cached_tokens": 0, "chunk_index": 0}]
    session.set_budget(max_num_batched_tokens=2048)
    session.step()
    rec = session.current.record
    assert rec["token_budget"] == rec["budgets"]["max_num_batched_tokens"] == 2048
    assert session.history[1].record["budgets"]["max_num_batched_tokens"] == 8
    assert rec["scheduled"][0]["num_tokens"] == 32  # the rest of the prompt in one chunk
    assert list(rec["sampled"]) == [rid]
    assert events == ["add", "budget", "step", "budget", "step"]


def test_set_budget_switches_scheduling_policy_and_prefix_caching(session):
    knobs = session.set_budget(scheduling_policy="prefill_first", enable_prefix_caching=False, max_num_seqs=2,
                               scheduler_reserve_full_isl=False)
    assert knobs == {"scheduling_policy": "prefill_first", "enable_prefix_caching": False, "max_num_seqs": 2,
                     "scheduler_reserve_full_isl": False}
    for i in range(3):
        session.add_request([40 + i, 50, 60], max_tokens=2, **GREEDY)
    session.step()
    assert len(session.current.record["scheduled"]) == 2  # max_num_seqs=2 in force


@pytest.mark.parametrize("knobs, field", [
    ({"max_num_batched_tokens": 0}, "max_num_batched_tokens"),
    ({"max_num_seqs": -1}, "max_num_seqs"),
    ({"scheduling_policy": "lottery"}, "scheduling_policy"),
    ({"enable_chunked_prefill": "yes"}, "enable_chunked_prefill"),
    ({"block_size": 8}, "block_size"),  # a pool knob: needs reset(), not a live change
    ({}, "at least one knob"),
])
def test_rejected_budget_raises_naming_the_field_and_changes_nothing(session, events, knobs, field):
    session.add_request([1, 2, 3], max_tokens=2, **GREEDY)
    before = session.config
    with pytest.raises(ValueError, match=field):
        session.set_budget(**knobs)
    assert field in session.last_error
    assert events[-1] == "error"
    assert session.config == before
    assert len(session.step()) == 1  # still works
    assert session.last_error is None  # a success clears it


def test_budget_below_a_waiting_prompt_is_rejected_when_chunking_is_off(session):
    session.add_request(LONG_PROMPT, max_tokens=2, **GREEDY)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        session.set_budget(enable_chunked_prefill=False, max_num_batched_tokens=16)
    assert session.config.enable_chunked_prefill is True


# -- bad input ------------------------------------------------------------------------------
@pytest.mark.parametrize("prompt, fields, needle", [
    ("", {"max_tokens": 2}, "prompt"),
    ([], {"max_tokens": 2}, "prompt"),
    ("Hello", {"max_tokens": 0}, "max_tokens"),
    ("Hello", {"temperature": -1.0}, "temperature"),
    ("Hello", {"top_p": 0.0}, "top_p"),
    ("Hello", {"colour": "red"}, "colour"),
    ([10**9], {"max_tokens": 2}, "token"),
    (list(range(5000)), {"max_tokens": 2}, "max_model_len"),
])
def test_bad_request_raises_naming_the_field_and_the_session_keeps_working(session, events, prompt, fields,
                                                                          needle):
    session.add_request([1, 2, 3], max_tokens=2, request_id="good", **GREEDY)
    before = copy.deepcopy(session.current)
    with pytest.raises(ValueError, match=needle):
        session.add_request(prompt, **fields)
    assert needle in session.last_error
    assert events == ["add", "error"]
    assert session.history == [before]  # nothing lost, nothing half-added
    session.step(5)
    assert queue_ids(session, "finished") == ["good"]


def test_request_that_can_never_fit_the_pool_names_num_kv_blocks(tiny_qwen3_path):
    s = Session(str(tiny_qwen3_path), num_kv_blocks=4)
    with pytest.raises(ValueError, match="num_kv_blocks"):
        s.add_request(LONG_PROMPT, max_tokens=64)


def test_duplicate_request_id_is_rejected(session):
    session.add_request([1, 2], request_id="x", max_tokens=2)
    with pytest.raises(ValueError, match="request_id"):
        session.add_request([3, 4], request_id="x", max_tokens=2)
    assert queue_ids(session, "waiting") == ["x"]


def test_step_count_must_be_positive(session, events):
    with pytest.raises(ValueError, match="n must be"):
        session.step(0)
    assert events == ["error"]


# -- abort ----------------------------------------------------------------------------------
def test_abort_moves_the_request_to_finished_and_frees_its_blocks(session, events):
    rid = session.add_request(LONG_PROMPT, max_tokens=8, **GREEDY)
    session.step()
    free_running = session.current.snapshot["block_pool"]["num_free_blocks"]
    session.abort(rid)
    snap = session.current.snapshot
    assert [r["finish_reason"] for r in snap["queues"]["finished"]] == ["abort"]
    assert snap["block_pool"]["num_free_blocks"] == free_running + 3
    assert events[-1] == "abort"


def test_abort_of_an_unknown_request_id_raises_and_keeps_the_session(session, events):
    session.add_request([1, 2, 3], max_tokens=2, **GREEDY)
    with pytest.raises(ValueError, match="request_id"):
        session.abort("nope")
    assert "nope" in session.last_error and events[-1] == "error"
    assert queue_ids(session, "waiting") == ["0"]
    session.abort("0")
    with pytest.raises(ValueError, match="already finished"):
        session.abort("0")


# -- reset ----------------------------------------------------------------------------------
def test_reset_builds_a_new_engine_with_the_pool_knobs_and_clears_history(session, events):
    session.add_request([1, 2, 3], max_tokens=2, **GREEDY)
    session.step()
    old_engine = session.engine
    session.reset(num_kv_blocks=10, block_size=8)
    assert session.engine is not old_engine
    assert (session.config.num_kv_blocks, session.config.block_size) == (10, 8)
    assert [e.step for e in session.history] == [0]
    assert session.current.snapshot["queues"]["waiting"] == []
    assert session.current.snapshot["block_pool"]["num_blocks"] == 10
    assert events[-1] == "reset"
    session.add_request([1, 2, 3], max_tokens=1, **GREEDY)
    session.step()
    assert session.current.record["batch"]["slot_mapping"] == [8, 9, 10]  # block 1 of size 8


def test_reset_keeps_live_budget_changes(session):
    session.set_budget(max_num_batched_tokens=100)
    session.reset(num_kv_blocks=12)
    assert session.config.max_num_batched_tokens == 100


def test_bad_reset_keeps_the_old_engine_and_history(session, events):
    session.add_request([1, 2, 3], max_tokens=3, **GREEDY)
    session.step()
    engine, history = session.engine, session.history
    with pytest.raises(ValueError, match="block_size"):
        session.reset(block_size=0)
    with pytest.raises(ValueError, match="num_kv_blocks"):
        session.reset(num_kv_blocks=1)
    with pytest.raises(ValueError, match="frobnicate"):
        session.reset(frobnicate=True)
    assert session.engine is engine and session.history == history
    assert events.count("error") == 3
    session.run_until_idle()
    assert queue_ids(session, "finished") == ["0"]


# -- observers ------------------------------------------------------------------------------
def test_observer_that_raises_is_logged_and_does_not_break_the_step(session, caplog):
    calls: list[str] = []

    def broken(event, s):
        raise RuntimeError("view exploded")

    session.subscribe(broken)
    session.subscribe(lambda event, s: calls.append(event))
    session.add_request([1, 2, 3], max_tokens=2, **GREEDY)
    with caplog.at_level(logging.ERROR, logger="explorer.core.session"):
        recs = session.step()
    assert len(recs) == 1 and len(session.history) == 2
    assert calls == ["add", "step"]
    assert "view exploded" in caplog.text


def test_unsubscribe_stops_the_calls_and_is_idempotent(session):
    calls: list[tuple[str, Session]] = []
    unsubscribe = session.subscribe(lambda event, s: calls.append((event, s)))
    session.add_request([1, 2, 3], max_tokens=2, **GREEDY)
    assert calls == [("add", session)]
    unsubscribe()
    unsubscribe()
    session.step()
    assert len(calls) == 1
    with pytest.raises(ValueError, match="callable"):
        session.subscribe("not a function")


def test_observer_sees_the_new_state_when_called(session):
    seen: list[tuple[str, int, int]] = []
    session.subscribe(lambda e, s: seen.append((e, s.current.step, len(s.current.snapshot["queues"]["waiting"]))))
    session.add_request([1, 2, 3], max_tokens=1, **GREEDY)
    session.step()
    assert seen == [("add", 0, 1), ("step", 1, 0)]


# -- metrics --------------------------------------------------------------------------------
def test_metrics_are_consistent_with_the_step_records(session):
    ids = [session.add_request(LONG_PROMPT, max_tokens=4, **GREEDY),
           session.add_request([3, 1, 4, 1, 5], max_tokens=3, **GREEDY)]
    session.set_budget(max_num_batched_tokens=24)  # chunk the long prompt: TTFTs differ
    session.run_until_idle()
    session.add_request([2, 7, 1, 8], max_tokens=2, request_id="late", **GREEDY)
    session.run_until_idle()
    records = session.records
    m = session.metrics
    rows = {r["request_id"]: r for r in m["requests"]}
    assert set(rows) == {*ids, "late"}
    for rid, row in rows.items():
        sampled_in = [r for r in records if rid in r["sampled"]]
        assert row["num_output_tokens"] == len(sampled_in) == len(row["token_times"])
        first = sampled_in[0]
        before = next((r["engine_time_s"] for r in reversed(records) if r["step"] < first["step"]), 0.0)
        # The first token is stamped while its step runs: after the previous step ended.
        assert before <= row["first_token_time"] <= first["engine_time_s"]
        assert row["time_to_first_token"] == pytest.approx(row["first_token_time"] - row["arrival_time"])
        assert row["inter_token_latency"] == pytest.approx([b - a for a, b in pairwise(row["token_times"])])
        assert len(row["inter_token_latency"]) == row["num_output_tokens"] - 1
        assert row["time_per_output_token"] == pytest.approx(row["mean_inter_token_latency"])
        assert row["e2e_request_latency"] >= row["time_to_first_token"] > 0
    # "late" arrived after two engine seconds' worth of steps: its arrival is on the engine clock.
    late_arrival = next(r for r in records if r["new_requests"] == ["late"])["step"]
    assert rows["late"]["arrival_time"] == pytest.approx(session.entry(late_arrival - 1).record["engine_time_s"])
    s = m["summary"]
    assert s["clock"] == "engine"
    assert s["num_steps"] == len(records)
    assert s["num_generated_tokens"] == sum(len(r["sampled"]) for r in records) == 4 + 3 + 2
    assert s["num_processed_tokens"] == sum(s_["num_tokens"] for r in records for s_ in r["scheduled"])
    assert s["engine_time_s"] == records[-1]["engine_time_s"]
    assert s["output_throughput_tok_s"] == pytest.approx(9 / records[-1]["engine_time_s"])
    assert s["num_finished"] == 3 and s["num_running"] == s["num_waiting"] == 0
    assert s["mean_ttft_s"] == pytest.approx(sum(r["time_to_first_token"] for r in rows.values()) / 3)
    all_itl = [x for r in rows.values() for x in r["inter_token_latency"]]
    assert s["mean_itl_s"] == pytest.approx(sum(all_itl) / len(all_itl))
    assert s["kv_cache_usage"] == 0.0  # everything finished
    json.dumps(m)


def test_prefix_cache_hits_show_in_rows_and_summary(session):
    session.add_request(LONG_PROMPT, max_tokens=1, **GREEDY)
    session.run_until_idle()
    session.add_request([*LONG_PROMPT, 7], max_tokens=1, request_id="again", **GREEDY)
    session.run_until_idle()
    m = session.metrics
    row = next(r for r in m["requests"] if r["request_id"] == "again")
    assert row["num_cached_tokens"] == 32  # the two full blocks
    s = m["summary"]
    assert s["prefix_cache_hits"] == 32
    assert s["prefix_cache_hit_rate"] == pytest.approx(s["prefix_cache_hits"] / s["prefix_cache_queries"])


def test_metrics_of_an_empty_session(session):
    m = session.metrics
    assert m["requests"] == []
    assert m["summary"]["num_steps"] == 0
    assert m["summary"]["output_throughput_tok_s"] is None
    assert m["summary"]["mean_ttft_s"] is None
    assert m["summary"]["prefix_cache_hit_rate"] is None


def test_waiting_request_row_has_no_latencies_yet(session):
    session.add_request([1, 2, 3], max_tokens=2)
    (row,) = session.metrics["requests"]
    assert row["status"] == "waiting"
    assert (row["time_to_first_token"], row["inter_token_latency"], row["e2e_request_latency"]) == (None, [], None)


# -- attention probe ------------------------------------------------------------------------
def test_probe_returns_weights_of_a_running_request(session):
    rid = session.add_request([11, 12, 13, 14, 15], max_tokens=4, **GREEDY)
    session.step()
    probe = session.probe(rid, layer=1, head=0)
    assert (probe["request_id"], probe["layer"], probe["heads"]) == (rid, 1, [0])
    assert probe["context_len"] == 5
    for row in probe["probs"][0]:
        assert sum(row) == pytest.approx(1.0, abs=1e-5)


def test_a_failed_probe_is_the_callers_business_only(session, events):
    rid = session.add_request([11, 12, 13], max_tokens=1, **GREEDY)
    with pytest.raises(ValueError, match="layer"):
        session.probe(rid, layer=99)
    session.step()  # finished: its blocks are gone
    with pytest.raises(ValueError, match="finished"):
        session.probe(rid, layer=0)
    assert session.last_error is None
    assert "error" not in events


# -- the default model ----------------------------------------------------------------------
@pytest.mark.slow
def test_default_model_session_answers_paris(default_model_path):
    s = Session(str(default_model_path))
    rid = s.add_request("The capital of France is", max_tokens=2, **GREEDY)
    s.run_until_idle()
    (req,) = s.current.snapshot["queues"]["finished"]
    assert req["request_id"] == rid
    assert req["output_text"].startswith(" Paris")
    first = s.entry(1).record
    assert first["batch"]["slot_mapping"] == [16, 17, 18, 19, 20]  # block 1, block 0 is the null block
    assert s.metrics["summary"]["num_generated_tokens"] == 2
