"""A real engine's run (the default model: a shared prefix, a chunked prompt, a preempting burst,
an abort between steps) replayed through kvscope's own core with its recorded tokens
(explorer.whatif.core_replay, explorer.export.rerun: what a docs page runs in the reader's
browser). At the recorded settings every step is the engine's own: decisions, packed batch,
block events, pool and queues. At other settings it decides anew and says where it parts.
Under Node and Pyodide (the npm package scripts/setup.sh installs) the same Python files, zipped
as a docs page gets them, give byte-identical steps."""
from __future__ import annotations

import dataclasses
import json
import os
import random
import tempfile
import time
from pathlib import Path

import pytest

from engine.report.schema import QUEUE, REC, REQ, SNAP
from explorer.core.recording import RecordedRequest, Recording, Settings, Source, step_decisions
from explorer.export.rerun import chapter_workload, recorded_identity, rerun, rerun_page_json
from explorer.whatif.settings import SettingRejected
from tests.docs.pyodide import run_in_pyodide
from tests.whatif.rerun_compare import compare_runs, without_clocks

REPO = Path(__file__).resolve().parents[2]
SYSTEM = "You are a careful assistant for a ship's crew. Answer in one short sentence, plainly. " * 2


@pytest.fixture(scope="module")
def engine_run():
    """(the Session's history, its workload) of one real run with every kind of decision."""
    from explorer import Session
    from explorer.ui import views
    from explorer.ui.dashboard import dashboard_panels

    s = Session(block_size=16, num_kv_blocks=16, max_num_batched_tokens=48, max_num_seqs=4)
    for q in ("Where is the captain?", "What time is dinner?"):
        s.add_request(SYSTEM + q, max_tokens=6, temperature=0.0)
    s.step(2)
    s.add_request(SYSTEM + "Who cooks tonight?", max_tokens=6, temperature=0.0)   # a prefix hit
    s.add_request("Count the waves on the sea, one by one, slowly. " * 8, max_tokens=3, temperature=0.0)  # chunked
    s.run_until_idle()
    s.set_budget(max_num_batched_tokens=32)   # a knob changed between steps: the replay changes it there too
    burst = [s.add_request(f"Story {i}: the sea and the ships at night. ", max_tokens=80, temperature=0.0,
                           ignore_eos=True) for i in range(4)]   # 3-4 x 6 blocks from 15: preemptions
    s.step(3)
    s.abort(burst[3])   # an abort between steps
    s.run_until_idle()
    s.set_budget(max_num_batched_tokens=48)   # after the last step: no re-run meets it
    history = list(s.history)
    workload = chapter_workload(history, first_step=4, title="the test run",
                                token_text=views.token_texts(s.engine.tokenizer), panels=dashboard_panels())
    return history, workload


def test_at_the_recorded_settings_every_step_is_the_engines_own(engine_run):
    history, workload = engine_run
    rec, base, run = rerun(workload, {})
    assert run is base and base.stopped == "" and len(base.entries) == len(history)
    aborted = rec.aborted_before()
    assert base.result.preemptions >= 1 and base.result.hit_tokens >= 16 and aborted
    assert any(s["chunk_index"] >= 1 for e in history[1:] for s in e.record[REC.SCHEDULED])
    for real, ours in zip(history[1:], base.entries[1:]):
        a, b = real.record, ours.record
        assert real.step == ours.step
        assert step_decisions(a, real.snapshot[SNAP.QUEUES][QUEUE.RUNNING], aborted.get(real.step + 1, ())) == \
            step_decisions(b, ours.snapshot[SNAP.QUEUES][QUEUE.RUNNING], aborted.get(ours.step + 1, ()))
        for key in (REC.BATCH, REC.BLOCKS, "num_free_blocks", REC.PREEMPTED, REC.FINISHED, REC.NEW_REQUESTS):
            assert a[key] == b[key], (real.step, key)
        assert {r: v["token_id"] for r, v in a[REC.SAMPLED].items()} == \
            {r: v["token_id"] for r, v in b[REC.SAMPLED].items()}
        assert without_clocks(real.snapshot[SNAP.BLOCK_POOL]) == without_clocks(ours.snapshot[SNAP.BLOCK_POOL])
        for q in (QUEUE.WAITING, QUEUE.RUNNING, QUEUE.FINISHED):
            fields = (REQ.REQUEST_ID, REQ.NUM_COMPUTED_TOKENS, REQ.BLOCK_TABLE, REQ.OUTPUT_TOKEN_IDS,
                      REQ.NUM_PREEMPTIONS, REQ.FINISH_REASON)
            assert [[r[f] for f in fields] for r in real.snapshot[SNAP.QUEUES][q]] == \
                [[r[f] for f in fields] for r in ours.snapshot[SNAP.QUEUES][q]], (real.step, q)
    assert recorded_identity(workload) is None
    # What the panels say of a replay: its batch is the runner's packing, its samples have no candidates.
    from explorer.ui import views

    sampled = next(e for e in base.entries if e.record and e.record[REC.SAMPLED])
    assert sampled.record["batch_source"] == "replay" and "packed as the model runner packs it" in \
        views.batch_source_state(sampled.record)["batch_source_words"][0]
    note = views.sampler_state([sampled], sampled.snapshot, "", views.token_texts(None))["sample"]["note"]
    assert note.startswith("no candidates: a replay of recorded tokens runs no model")


def test_a_planted_fault_in_the_recording_is_caught(engine_run):
    _, workload = engine_run
    rec, _, _ = rerun(workload, {})
    late = min(rec.requests, key=lambda r: r.arrival_seq)   # the first request, one step late: step 1 differs
    moved = dataclasses.replace(rec, requests=[dataclasses.replace(r, arrival_step=(r.arrival_step or 0) + 1)
                                               if r is late else r for r in rec.requests])
    with tempfile.TemporaryDirectory() as d:
        import base64

        moved.save(Path(d) / "moved.kvrec.gz")
        faulty = dict(workload, recording=base64.b64encode((Path(d) / "moved.kvrec.gz").read_bytes()).decode())
    said = recorded_identity(faulty)
    assert said is not None and f"step {late.arrival_step}" in said


@pytest.mark.parametrize("change, expect", [
    ({"num_blocks": 11}, "with num_blocks=11"),
    ({"max_num_batched_tokens": 16}, "budget"),
    ({"enable_prefix_caching": False}, "prefix caching is off"),
])
def test_other_settings_decide_anew_and_say_where_they_part(engine_run, change, expect):
    _, workload = engine_run
    _, base, run = rerun(workload, change)
    out = json.loads(rerun_page_json(json.dumps(workload), json.dumps(change),
                                     json.dumps({"sources": {}, "defaults": {}})))
    assert expect in out["parting"] and out["label"] == run.result.variant.label
    assert run.result.digests != base.result.digests
    if "num_blocks" in change:
        assert run.result.preemptions > base.result.preemptions
    if change.get("enable_prefix_caching") is False:
        assert run.result.hit_tokens == 0 < base.result.hit_tokens
    # the page starts from the chapter's first step: its first entry is the state before step 5
    assert '"first_step":4' in out["html"].replace(" ", "")


def test_a_knob_the_run_changed_changes_at_its_step_unless_the_variant_sets_it(engine_run):
    history, workload = engine_run
    budget = [e.snapshot[SNAP.CONFIG]["max_num_batched_tokens"] for e in history]
    changed_at = next(history[i].step + 1 for i in range(1, len(history)) if budget[i] != budget[i - 1])
    assert workload["knob_changes"] == {str(changed_at): {"max_num_batched_tokens": 32}}
    _, base, run = rerun(workload, {"max_num_batched_tokens": 64})   # a budget set here holds throughout
    budgets = {e.step: e.record["token_budget"] for e in base.entries if e.record}
    assert budgets[changed_at - 1] == 48 and budgets[changed_at] == 32
    # (an entry without a record: the engine idled, finished sooner, until the recorded next arrival)
    assert {e.record["token_budget"] for e in run.entries if e.record} == {64}
    assert run.result.variant.label == "budget=64"
    page = json.loads(rerun_page_json(json.dumps(workload), "{}", json.dumps({"sources": {}, "defaults": {}})))
    assert page["notes"] == [f"The recorded run changed settings between steps (before step {changed_at}: "
                             "max_num_batched_tokens=32). A setting changed here holds for the whole re-run; the "
                             "others change where the recorded run changed them."]


def test_a_block_size_alone_keeps_the_pools_memory(engine_run):
    _, workload = engine_run
    run = rerun(workload, {"block_size": 32})[2]
    assert run.result.variant.settings.num_blocks == 16 * 16 // 32 and "the same memory" in run.result.variant.label


@pytest.mark.parametrize("change, said", [
    ({"num_blocks": 1}, "num_blocks must be an integer >= 2, got 1"),
    ({"block_size": 0}, "block_size must be an integer >= 1, got 0"),
    ({"max_num_seqs": "4"}, "max_num_seqs must be an integer >= 1, got '4'"),
    ({"num_blocks": 3}, "KV blocks of 16 tokens; num_blocks=3 leaves only 2 usable"),
    ({"watermark": 0.1}, "unknown setting(s) ['watermark']"),
])
def test_a_refused_setting_names_itself_and_the_next_run_works(engine_run, change, said):
    _, workload = engine_run
    with pytest.raises(SettingRejected) as exc:
        rerun(workload, change)
    assert said in str(exc.value)
    no_assets = json.dumps({"sources": {}, "defaults": {}})
    assert json.loads(rerun_page_json(json.dumps(workload), json.dumps(change), no_assets)) == {"error": str(exc.value)}
    assert json.loads(rerun_page_json(json.dumps(workload), "{}", no_assets))["html"]


def test_a_request_the_recording_left_running_ends_the_replay_there(engine_run):
    from explorer.ui import views

    history = engine_run[0]
    cut = next(e.step for e in history if e.snapshot[SNAP.QUEUES][QUEUE.RUNNING] and e.step > 6)
    part = chapter_workload(history[:cut + 1], first_step=0, title="cut", token_text=views.token_texts(None),
                            panels=[])
    base = rerun(part, {})[1]
    running = {r[REQ.REQUEST_ID] for r in history[cut].snapshot[SNAP.QUEUES][QUEUE.RUNNING]}
    assert base.entries[-1].step >= cut and base.stopped.startswith("stopped before step ")
    assert any(f"request '{rid}' was still running" in base.stopped for rid in running)
    assert recorded_identity(part) is None


# -- the same Python under Node and Pyodide, as a docs page runs it --------------------------------
def synthetic_workload(num_requests: int, seed: int = 0) -> dict:
    """A recording of `num_requests` requests arriving together with random prompts and outputs
    (the tokens need no model: the replay takes them as given), in a docs workload."""
    rng = random.Random(seed)
    settings = Settings(block_size=16, num_blocks=400, max_num_batched_tokens=512, max_num_seqs=num_requests,
                        max_model_len=2048)
    shared = [rng.randrange(1, 49152) for _ in range(48)]
    requests = [RecordedRequest(request_id=f"r{i}", prompt_token_ids=shared + [rng.randrange(1, 49152)
                                                                               for _ in range(rng.randrange(8, 80))],
                                output_token_ids=[rng.randrange(1, 49152) for _ in range(rng.randrange(16, 64))],
                                arrival_step=1 + i // 8, arrival_time=0.0, arrival_seq=i, max_tokens=64,
                                ignore_eos=True, finish_reason="length") for i in range(num_requests)]
    requests = [dataclasses.replace(r, max_tokens=len(r.output_token_ids)) for r in requests]
    rec = Recording(settings=settings, source=Source(engine="kvscope"), requests=requests)
    import base64

    with tempfile.TemporaryDirectory() as d:
        rec.save(Path(d) / "w.kvrec.gz")
        data = (Path(d) / "w.kvrec.gz").read_bytes()
    return {"title": "synthetic", "first_step": 0, "recording": base64.b64encode(data).decode(), "model_info": {},
            "token_texts": {}, "panels": [], "settings": {}}


VARIANTS = [{}, {"num_blocks": 11}, {"max_num_batched_tokens": 16, "enable_chunked_prefill": True},
            {"block_size": 32, "enable_prefix_caching": False}, {"num_blocks": 1}]


def test_pyodide_reruns_byte_identical_to_cpython(engine_run, tmp_path):
    _, workload = engine_run
    payload = json.dumps({"workloads": [workload, synthetic_workload(12, seed=3)], "settings": VARIANTS})
    script = (REPO / "tests" / "whatif" / "rerun_compare.py").read_text() + "\ncompare_runs(INPUT)\n"
    theirs = run_in_pyodide(script, payload, tmp_path)
    ours = compare_runs(payload)
    assert json.loads(ours)[-1] == {"refused": "num_blocks must be an integer >= 2, got 1"}
    assert theirs == ours


TIMING = r'''
import json, time
from explorer.export.rerun import rerun, rerun_page_json
w = json.loads(INPUT)
t0 = time.perf_counter(); rec, base, _ = rerun(w, {}); t1 = time.perf_counter()
page = rerun_page_json(json.dumps(w), "{}", json.dumps({"sources": {}, "defaults": {}})); t2 = time.perf_counter()
json.dumps({"steps": base.result.num_steps, "replay_s": t1 - t0, "page_s": t2 - t1, "html": len(page)})
'''


def test_a_step_at_32_requests_in_pyodide_against_cpython(tmp_path):
    """A benchmark, printed (no timed assertion): per step at 32 running requests, the replay
    (both runs: the recorded settings and the asked ones) and the page's panel states."""
    payload = json.dumps(synthetic_workload(32, seed=1))
    theirs = json.loads(run_in_pyodide(TIMING + "\n", payload, tmp_path))
    env: dict = {"INPUT": payload}
    exec(TIMING.replace('json.dumps({"steps"', 'RESULT = json.dumps({"steps"'), env)
    ours = json.loads(env["RESULT"])
    assert theirs["steps"] == ours["steps"] > 20 and theirs["html"] > 0
    per = {k: (theirs[k] / theirs["steps"] * 1e3, ours[k] / ours["steps"] * 1e3) for k in ("replay_s", "page_s")}
    print(f"\n32 requests, {ours['steps']} steps, per step: replay (twice) Pyodide {per['replay_s'][0]:.2f} ms vs "
          f"CPython {per['replay_s'][1]:.2f} ms ({per['replay_s'][0] / per['replay_s'][1]:.1f}x); page states "
          f"Pyodide {per['page_s'][0]:.2f} ms vs CPython {per['page_s'][1]:.2f} ms "
          f"({per['page_s'][0] / per['page_s'][1]:.1f}x) [{os.uname().machine}, {time.strftime('%Y-%m-%d')}]")


def test_a_replay_across_an_idle_gap_records_its_own_arrival_steps_and_no_missing_step(tmp_path):
    """The core replay jumps an idle gap to the next arrival's step, as the recording's numbering
    did; its history written again holds the same arrival steps, no step marked missing, and
    replays to the same decisions (the writer takes a step-less entry numbered past the last step,
    with the engine clock still, as that jump, not as steps a feed dropped)."""
    from explorer.core.recording import save_recording
    from explorer.whatif.core_replay import core_replay

    settings = Settings(block_size=16, num_blocks=40, max_num_batched_tokens=64, max_num_seqs=4, max_model_len=256)
    requests = [RecordedRequest(rid, [3 + i] * 40, [7, 8], step, float(step), i, 2, ignore_eos=True,
                                finish_reason="length") for i, (rid, step) in enumerate((("a", 1), ("b", 9)))]
    first = core_replay(Recording(settings, Source(engine="kvscope's core (a hand-made trace)"), requests))
    again = Recording.load(save_recording(first.entries, tmp_path / "again.kvrec"))
    assert [(r.request_id, r.arrival_step) for r in again.requests] == [("a", 1), ("b", 9)]
    assert not any("missing" in note for note in again.source.notes), again.source.notes
    assert again.steps.step == [e.step for e in first.entries if e.record is not None] == [1, 2, 9, 10]
    assert again.steps.digest == core_replay(again).result.digests == first.result.digests
