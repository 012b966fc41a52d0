"""The Session's history is built from each record's changes (engine.report.changes.apply):
every entry must equal the engine's full snapshot at that step, through chunked prefills,
prefix hits (same-step ones too), preemption, aborts, budget changes and finished requests;
and every record and snapshot kvscope's engine emits must fit the record schema."""
from __future__ import annotations

import random
import sys
from itertools import pairwise

import pytest

from engine import LLM
from engine.report import schema
from explorer import Session
from explorer.core.history import history_bytes, step_bytes

GREEDY = {"temperature": 0.0, "ignore_eos": True}


def tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(200, 20000) for _ in range(n)]


def busy_workload(s: Session, check, tag: str = "") -> dict:
    """Chunks, shared prefixes, same-step hits, preemption, an abort and a budget change; `check`
    runs after every action. Returns what happened, so the test can say the workload covered it."""
    seen = {"chunks": 0, "hits": 0, "same_step_hits": 0, "preempted": 0, "evicted": 0, "finished": 0}
    common = tokens(1, 48)  # three full blocks of 16 shared by several prompts
    s.add_request(common + tokens(2, 40), request_id=tag + "a", max_tokens=40, **GREEDY)
    s.add_request(common + tokens(3, 30), request_id=tag + "b", max_tokens=60, **GREEDY)  # same step: same-step hits
    check()
    for i in range(400):
        if i == 2:
            s.add_request(common + tokens(4, 70), request_id=tag + "c", max_tokens=60, **GREEDY)
            s.add_request(tokens(5, 60), request_id=tag + "d", max_tokens=80, **GREEDY)
            check()
        if i == 5:
            s.add_request(tokens(6, 20), request_id=tag + "e", max_tokens=50, **GREEDY)
            s.abort(tag + "e")
            check()
        if i == 8:
            s.set_budget(max_num_batched_tokens=48)
            check()
        if i == 12:
            s.add_request(common + tokens(7, 10), request_id=tag + "f", max_tokens=6, **GREEDY)
            check()
        if not s.step():
            break
        rec = s.current.record
        seen["chunks"] += sum(1 for x in rec["scheduled"] if x["is_prefill"] and (x["chunk_index"] or 0) > 0)
        for key in ("hits", "same_step_hits", "evicted"):
            seen[key] += len(rec["blocks"][key])
        seen["preempted"] += len(rec["preempted"])
        seen["finished"] += len(rec["finished"])
        check()
    return seen


@pytest.fixture(scope="module")
def llm(default_model_path) -> LLM:
    # 20 usable blocks of 16 for up to ~350 tokens in flight: decodes run out and preempt.
    return LLM(model=str(default_model_path), num_kv_blocks=21, block_size=16, max_num_batched_tokens=96,
               max_num_seqs=4)


def test_each_history_entry_equals_the_engines_full_snapshot_at_its_step(llm):
    s = Session(llm)
    full = {}

    def check() -> None:
        full[s.current.step] = s.engine.snapshot().to_dict()
        assert s.current.snapshot == full[s.current.step], f"step {s.current.step}"

    seen = busy_workload(s, check)
    assert seen["chunks"] and seen["hits"] and seen["same_step_hits"] and seen["preempted"] and seen["evicted"]
    assert seen["finished"] == 5 and not s.engine.has_unfinished_requests()
    # Entries stay what they were when taken (frozen records of the past), not views of now.
    for entry in s.history:
        assert entry.snapshot == full[entry.step], f"step {entry.step} changed after it was taken"
    # And a step shares what it did not change with the step before: in a decode step, every
    # block but those of its events and the one each request wrote into; every finished request.
    decodes = 0
    for before, after in zip(s.history, s.history[1:]):
        rec, a, b = after.record, before.snapshot, after.snapshot
        assert all(x is y for x, y in zip(a["queues"]["finished"], b["queues"]["finished"]))
        if rec["finished"] or rec["preempted"] or any(x["is_prefill"] for x in rec["scheduled"]):
            continue
        decodes += 1
        touched = len(rec["scheduled"]) + sum(len(v) for v in rec["blocks"].values())
        assert sum(x is y for x, y in zip(a["block_pool"]["blocks"], b["block_pool"]["blocks"])) >= 21 - touched
        # A request's growing lists are views of one list its entries share: a step adds its
        # tail, not a copy of every token so far (a copying history is O(tokens²) a request).
        old = {r["request_id"]: r for r in a["queues"]["running"]}
        for r in b["queues"]["running"]:
            o = old[r["request_id"]]
            grew = [(r["output_token_ids"], o["output_token_ids"])] + [
                (r["metrics"][c][k], o["metrics"][c][k]) for c in ("engine", "wall")
                for k in ("token_times", "inter_token_latency")]
            assert all(new.shares_with(prev) for new, prev in grew), f"step {after.step}: {r['request_id']}"
            assert r["block_table"] is o["block_table"] or r["block_table"].shares_with(o["block_table"])
        # So are the batch's block tables: each row reads its request's own table, as the one
        # before it did (records.batch_dict), not a copy of the table each step.
        rows_before = dict(zip([x["request_id"] for x in before.record["scheduled"]],
                               before.record["batch"]["block_tables"])) if before.record else {}
        for x, table in zip(rec["scheduled"], rec["batch"]["block_tables"]):
            if x["request_id"] in rows_before:
                assert table.shares_with(rows_before[x["request_id"]]), f"step {after.step}: {x['request_id']}"
    assert decodes > 20
    # A step's plain decodes go as the decodes' columns, not as a request change each: every
    # request a decode step scheduled whose table did not grow.
    rows = 0
    for before, after in zip(s.history, s.history[1:]):
        rec = after.record
        if rec["finished"] or rec["preempted"] or any(x["is_prefill"] for x in rec["scheduled"]):
            continue
        old_tables = {r["request_id"]: len(r["block_table"]) for r in before.snapshot["queues"]["running"]}
        plain = sorted(r["request_id"] for r in after.snapshot["queues"]["running"]
                       if old_tables.get(r["request_id"]) == len(r["block_table"]))
        assert rec["changes"].get("decodes", {}).get("request_ids", []) == plain, f"step {after.step}"
        assert not set(plain) & set(rec["changes"]["requests"])
        rows += len(plain)
    assert rows > 40
    # And each row still reads what the runner read in its step, though later steps grew the lists.
    rows = 0
    for entry in s.history[1:]:
        running = {r["request_id"]: r for r in full[entry.step]["queues"]["running"]}
        for x, table in zip(entry.record["scheduled"], entry.record["batch"]["block_tables"]):
            if x["request_id"] in running:
                assert list(table) == list(running[x["request_id"]]["block_table"]), f"step {entry.step}"
                rows += 1
    assert rows > 100


def test_under_async_scheduling_each_entry_equals_the_full_snapshot_with_the_next_step_scheduled(llm):
    """Async scheduling (vLLM's on a GPU) on the same workload: each step is scheduled while the
    one before still runs, so the state after a step holds the next step's schedule too (its
    blocks, its computed counts). The history, built from the changes, is that state at every
    step; each step after the first says which step was in flight and what its placeholder
    inputs held; and the requests' outputs are the synchronous engine's."""
    budgets = {"num_kv_blocks": 21, "block_size": 16, "max_num_batched_tokens": 96, "max_num_seqs": 4}
    s = Session(llm.engine.config.model, async_scheduling=True, check_invariants=True, **budgets)
    assert s.engine.async_scheduling and s.engine.config.async_scheduling

    def check() -> None:
        assert s.current.snapshot == s.engine.snapshot().to_dict(), f"step {s.current.step}"

    seen = busy_workload(s, check, tag="async-")
    assert seen["chunks"] and seen["hits"] and seen["preempted"] and seen["finished"] == 5
    records = [e.record for e in s.history if e.record]
    assert [r["step"] for r in records] == list(range(1, len(records) + 1))
    ahead = [r for r in records if r["scheduled_ahead"]]
    assert records[0]["scheduled_ahead"] is None and len(ahead) > len(records) // 2
    for r in ahead:
        assert r["scheduled_ahead"]["in_flight_step"] == r["step"] - 1
        for rid, token in r["scheduled_ahead"]["placeholders"].items():   # the token it turned out to be
            row = [x["request_id"] for x in r["scheduled"]].index(rid)
            assert r["batch"]["input_ids"][r["batch"]["query_start_loc"][row + 1] - 1] == token
    assert sum(len(r["scheduled_ahead"]["placeholders"]) for r in ahead) > 40
    sync = Session(llm.engine.config.model, **budgets)   # a fresh pool, as the async one's
    busy_workload(sync, lambda: None, tag="async-")
    outputs = {r["request_id"]: list(r["output_token_ids"]) for r in s.current.snapshot["queues"]["finished"]}
    finished = sync.current.snapshot["queues"]["finished"]
    assert outputs == {r["request_id"]: list(r["output_token_ids"]) for r in finished}


def test_an_abort_with_its_step_in_flight_drops_that_output_and_the_history_stays_whole(llm):
    """Under async scheduling a step is in flight between two presses of Step: an abort then
    finishes the request at once, and the step in flight lands without its token (vLLM drops it
    too). Each built snapshot is compared with the engine's whole one (debug_invariants)."""
    s = Session(llm.engine.config.model, async_scheduling=True, debug_invariants=True, num_kv_blocks=21,
                max_num_seqs=4)
    s.add_request(tokens(11, 30), request_id="x", max_tokens=20, **GREEDY)
    s.add_request(tokens(12, 30), request_id="y", max_tokens=8, **GREEDY)
    s.step(3)
    in_flight = s.engine._in_flight
    assert in_flight is not None and {r.request_id for r in in_flight.rows} == {"x", "y"}
    s.abort("x")
    (x,) = [r for r in s.current.snapshot["queues"]["finished"] if r["request_id"] == "x"]
    assert x["finish_reason"] == "abort" and len(x["output_token_ids"]) == 3
    s.step(1)   # lands the step that sampled x's fourth token: dropped
    assert s.current.record["sampled"]["x"]["token_id"] not in (None, -1)
    (x,) = [r for r in s.current.snapshot["queues"]["finished"] if r["request_id"] == "x"]
    assert len(x["output_token_ids"]) == 3
    while s.engine.has_unfinished_requests():
        s.step(1)
    (y,) = [r for r in s.current.snapshot["queues"]["finished"] if r["request_id"] == "y"]
    assert len(y["output_token_ids"]) == 8 and s.engine._in_flight is None


def test_a_mib_bound_counts_what_the_steps_add_as_the_history_holds_it(llm):
    """The estimate a MiB bound keeps (history.step_bytes, a step at a time, O(the step)) against
    what the entries hold, each object once (history_bytes), within the 0.6-1.5x the follower's
    is held to (tests/explorer/test_vllm_live_soak.py). A batch table, a view of its request's
    own table as the row before it was, adds its new items, not the table again."""
    s = Session(llm, max_history_mib=10_000)
    busy_workload(s, lambda: None, tag="mib-")
    entries = s.history
    held = history_bytes(entries) - history_bytes(entries[:1])
    estimate = s.history_window["mib"] * 2**20
    assert 0.6 * held <= estimate <= 1.5 * held, (estimate, held)
    continued = 0
    for before, after in pairwise(entries[1:]):
        read = {id(t.shared): len(t) for t in before.record["batch"]["block_tables"]}
        tables = [t for t in after.record["batch"]["block_tables"] if id(t.shared) in read]
        again = sum(sys.getsizeof(t.shared) - 8 * (len(t) - read[id(t.shared)]) for t in tables)
        alone = step_bytes(after.record, after.snapshot, before.snapshot)
        assert step_bytes(after.record, after.snapshot, before.snapshot, before.record) <= alone - again
        continued += bool(tables)
    assert continued > 20


def test_debug_invariants_compares_each_built_snapshot_with_a_full_one(default_model_path):
    s = Session(str(default_model_path), debug_invariants=True, num_kv_blocks=21)
    common = tokens(1, 32)
    s.add_request(common + tokens(2, 8), max_tokens=3, **GREEDY)
    s.add_request(common + tokens(3, 8), max_tokens=3, **GREEDY)
    assert len(s.step(10)) == 3  # each step's built snapshot was compared with a full one
    # The comparison can fail: changes applied to a snapshot that was not the engine's state.
    s.add_request(tokens(4, 20), max_tokens=2, **GREEDY)
    before = s.current.snapshot
    blocks = before["block_pool"]["blocks"]
    s._history.replace_last({**before, "block_pool": {**before["block_pool"],
                                                       "blocks": [{**blocks[0], "ref_count": 99}, *blocks[1:]]}})
    with pytest.raises(AssertionError, match=r"differs from the engine's whole snapshot \(snapshot\.block_pool"):
        s.step()


def test_a_decode_row_for_a_step_that_did_more_is_caught(llm, monkeypatch):
    # A planted fault in the decodes: a request whose step also grew its block table goes as a
    # plain decode, so the consumer never hears of the new block. The history built from the
    # changes then parts from the engine at that step, and the check names where.
    from engine.report.changes import Sent

    plain = Sent.decoded

    def lenient(self, rid, state, output, table, metrics):
        return plain(self, rid, state, output, table[:self._held[rid].table] if rid in self._held else table, metrics)

    s = Session(llm)
    s.check_changes = True
    s.add_request(tokens(21, 40), max_tokens=20, **GREEDY)   # its table grows at its 48th token
    s.step(3)
    monkeypatch.setattr(Sent, "decoded", lenient)
    with pytest.raises(AssertionError, match=r"differs from the engine's whole snapshot \(snapshot\.queues\.running"):
        s.step(20)


def test_a_decode_row_for_a_request_the_consumer_never_held_is_out_of_step():
    from engine.report.changes import OutOfStep, apply

    snapshot = {"step": 0, "config": {}, "model_info": {}, "metrics": {},
                "queues": {"waiting": [], "running": [], "finished": []},
                "block_pool": {"num_free_blocks": 1, "blocks": []}}
    changes = {"step": 1, "requests": {}, "queues": {"waiting": [], "running": []}, "finished": [], "blocks": [],
               "num_free_blocks": 1, "metrics": {}, "decodes": {
                   "request_ids": ["x"], "num_computed_tokens": [9], "output_tokens": [5], "output_texts": ["a"],
                   "engine_token_times": [1.0], "wall_token_times": [2.0]}}
    with pytest.raises(OutOfStep, match="request x decoded, but the state held does not have it"):
        apply(snapshot, changes)


def test_a_producer_that_leaves_a_touched_block_out_is_caught(llm, monkeypatch):
    # A planted fault in kvscope's producer: the pool forgets the blocks it touched, so the
    # blocks a finished request let go are not resent. The history built from the changes then
    # parts from the engine at that step, and the check names where.
    from engine.core.block_pool import BlockPool

    s = Session(llm)
    s.check_changes = True
    s.add_request(tokens(20, 40), max_tokens=3, **GREEDY)
    monkeypatch.setattr(BlockPool, "take_touched", lambda pool: set())
    with pytest.raises(AssertionError, match=r"differs from the engine's whole snapshot \(snapshot\.block_pool"):
        s.step(10)


def test_kvscope_emits_only_keys_the_record_schema_defines(llm):
    s = Session(llm)
    emitted: list[tuple[dict, dict]] = []

    def check() -> None:
        emitted.append((s.current.record, s.engine.snapshot().to_dict()))

    busy_workload(s, check, tag="schema-")
    problems = [p for record, snapshot in emitted
                for p in (([] if record is None else schema.record_problems(record))
                          + schema.snapshot_problems(snapshot))]
    assert problems == []
    assert len(emitted) > 20 and all(r is not None for r, _ in emitted[-5:])


def test_the_schema_check_names_a_key_it_does_not_define_at_any_depth(llm):
    s = Session(llm)
    s.add_request(tokens(9, 20), max_tokens=2, **GREEDY)
    s.step()
    record, snapshot = s.current.record, s.current.snapshot
    assert schema.record_problems(record) == [] and schema.snapshot_problems(snapshot) == []
    bad = {**record, "scheduled": [{**record["scheduled"][0], "num_tokenz": 1}]}
    assert schema.record_problems(bad) == ["record.scheduled[0].num_tokenz: not a key of ScheduledDict"]
    pool = snapshot["block_pool"]
    bad = {**snapshot, "block_pool": {**pool, "blocks": [{**pool["blocks"][0], "extra": 0}]}}
    assert schema.snapshot_problems(bad) == ["snapshot.block_pool.blocks[0].extra: not a key of BlockDict"]
    short = {k: v for k, v in record.items() if k != "budgets"}
    assert schema.record_problems(short) == ["record: StepRecordDict lacks ['budgets']"]


def test_key_constants_are_the_schemas_keys():
    assert schema.SCHED.NUM_TOKENS == "num_tokens" and schema.REQ.BLOCK_TABLE == "block_table"
    assert schema.EV.ALL == ("allocated", "freed", "cached", "hits", "evicted", "same_step_hits")
    assert set(schema.EVENT_BITS) == set(schema.EV.ALL) == set(schema.EVENT_MEANINGS)
    assert sorted(schema.EVENT_BITS.values()) == [1, 2, 4, 8, 16, 32]
    with pytest.raises(AttributeError):
        _ = schema.SCHED.NUM_TOKENZ


def test_changes_made_on_the_engine_behind_the_sessions_back_still_show(llm):
    # An abort or a step done on the engine directly (not through the Session) is not in the
    # next record: the next entry must still equal the full snapshot.
    s = Session(llm)
    common = tokens(10, 32)
    s.add_request(common + tokens(11, 8), request_id="x1", max_tokens=8, **GREEDY)
    s.add_request(common + tokens(12, 8), request_id="x2", max_tokens=8, **GREEDY)
    s.step(2)
    shared = set(s.current.snapshot["queues"]["running"][0]["block_table"][:2])
    assert shared <= set(s.current.snapshot["queues"]["running"][1]["block_table"])  # x1 and x2 share blocks
    s.engine.abort_request("x2")  # shared blocks lose an owner without a freed event
    s.step()
    assert s.current.snapshot == s.engine.snapshot().to_dict()
    s.engine.step()  # a step the history never saw
    s.step()
    assert s.current.snapshot == s.engine.snapshot().to_dict()
