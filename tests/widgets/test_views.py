"""explorer.ui.views: history entries of a real Session -> panel states."""
from __future__ import annotations

from array import array
from itertools import pairwise

from explorer.ui import views

PREFIX = "You are a concise assistant for a geography quiz. Answer with the city only, nothing else."


def _columns(state: dict) -> tuple[list, list, list, list]:
    return (list(array("B", state["status"])), list(array("H", state["ref_count"])),
            list(array("h", state["owner"])), list(array("B", state["events"])))


def test_block_pool_columns_match_the_snapshot_block_by_block(fresh_session) -> None:
    s = fresh_session
    s.add_request(PREFIX + " France?", max_tokens=3, temperature=0.0)
    s.step(1)
    e = s.current
    state = views.block_pool_state(e.record, e.snapshot)
    blocks = e.snapshot["block_pool"]["blocks"]
    status, ref, owner, events = _columns(state)
    assert state["num_blocks"] == len(blocks) == 48
    assert status[0] == 0  # the null block
    for b in blocks[1:]:
        i = b["block_id"]
        expected = (2 if b["hash"] else 1) if b["is_free"] else (4 if b["hash"] else 3)
        assert status[i] == expected
        assert ref[i] == b["ref_count"]
        assert (owner[i] >= 0) == bool(b["owners"])
        if b["owners"]:
            assert state["owners"][owner[i]] == b["owners"][0]
    for bid in e.record["blocks"]["allocated"]:
        assert events[bid] & 1
    assert state["counts"]["allocated"] == len(e.record["blocks"]["allocated"]) > 0
    assert state["block_tables"] == [{"request_id": r["request_id"], "block_table": r["block_table"],
                                      "num_computed_tokens": r["num_computed_tokens"], "hits": [],
                                      "same_step_hits": [], "cached": []}
                                     for r in e.snapshot["queues"]["running"]]
    assert state["shared"] == []  # one request: no block has two owners
    assert state["counts"]["same_step_hits"] == state["counts"]["hits"] == 0


def test_prefix_hits_are_marked_in_the_pool_events(fresh_session) -> None:
    s = fresh_session
    s.add_request(PREFIX + " France?", max_tokens=2, temperature=0.0)
    s.step(1)  # the first request's full blocks are computed and hashed
    s.add_request(PREFIX + " Italy?", max_tokens=2, temperature=0.0)
    s.step(1)
    e = s.current
    hits = e.record["blocks"]["hits"]
    assert hits, "the second request should reuse the first one's prefix blocks"
    events = list(array("B", views.block_pool_state(e.record, e.snapshot)["events"]))
    assert all(events[b] & 2 for b in hits)
    row = next(r for r in views.queues_state(e.record, e.snapshot)["queues"]["running"] if r["request_id"] == "1")
    assert row["num_cached_tokens"] == 16 * len(hits)
    assert row["scheduled"]["is_prefill"] and row["scheduled"]["num_cached_tokens"] == row["num_cached_tokens"]


# Two full blocks (block_size 16) that every request below starts with, as token ids.
SHARED_IDS = list(range(1000, 1032))


def test_a_same_step_hit_has_its_own_event_bit_and_table_mark(fresh_session) -> None:
    # Both requests arrive before the step: A's two shared blocks are hashed when they are
    # allocated, so B, admitted after A in the same step, hits blocks whose KV this very
    # step computes (vLLM 0.32's allocate_slots caches at allocation).
    s = fresh_session
    a = s.add_request([*SHARED_IDS, 7, 8, 9], max_tokens=2, temperature=0.0, ignore_eos=True)
    b = s.add_request([*SHARED_IDS, 10, 11], max_tokens=2, temperature=0.0, ignore_eos=True)
    s.step(1)
    e = s.current
    rec, running = e.record, {r["request_id"]: r for r in e.snapshot["queues"]["running"]}
    shared = running[a]["block_table"][:2]
    assert running[b]["block_table"][:2] == shared
    assert rec["blocks"]["same_step_hits"] == rec["blocks"]["hits"] == shared
    state = views.block_pool_state(rec, e.snapshot)
    events = list(array("B", state["events"]))
    same_step = views.EVENT_BITS["same_step_hits"]
    assert same_step == 32 and same_step not in {v for k, v in views.EVENT_BITS.items() if k != "same_step_hits"}
    for bid in shared:  # allocated to A, hashed, and hit by B, all in this step
        assert events[bid] == sum(views.EVENT_BITS[k] for k in ("allocated", "hits", "cached", "same_step_hits"))
    assert [i for i, ev in enumerate(events) if ev & same_step] == sorted(shared)
    assert state["counts"]["same_step_hits"] == state["counts"]["hits"] == 2
    tables = {t["request_id"]: t for t in state["block_tables"]}
    assert (tables[a]["hits"], tables[a]["same_step_hits"]) == ([], [])
    assert (tables[b]["hits"], tables[b]["same_step_hits"]) == ([0, 1], [0, 1])

    # A hit in a later step is an ordinary prefix hit: the hit bit, not the same-step one.
    c = s.add_request([*SHARED_IDS, 12, 13], max_tokens=2, temperature=0.0, ignore_eos=True)
    s.step(1)
    e = s.current
    assert e.record["blocks"]["hits"] == shared and e.record["blocks"]["same_step_hits"] == []
    state = views.block_pool_state(e.record, e.snapshot)
    events = list(array("B", state["events"]))
    assert all(events[bid] & views.EVENT_BITS["hits"] and not events[bid] & same_step for bid in shared)
    assert state["counts"]["same_step_hits"] == 0 and state["counts"]["hits"] == 2
    tables = {t["request_id"]: t for t in state["block_tables"]}
    assert (tables[c]["hits"], tables[c]["same_step_hits"]) == ([0, 1], [])


def test_the_block_pool_codes_are_the_record_schemas(fresh_session) -> None:
    from engine.report import schema

    s = fresh_session
    s.add_request("Hello", max_tokens=1, temperature=0.0)
    s.step(1)
    assert views.EVENT_BITS is schema.EVENT_BITS  # imported, never spelled again (nor parsed back from _schema.js)
    assert (views.NULL, views.FREE, views.FREE_CACHED, views.IN_USE, views.IN_USE_HASHED) == (0, 1, 2, 3, 4)
    # Every list of a real StepRecord's blocks has a bit, and the bits are distinct powers of two.
    assert set(schema.EVENT_BITS) == set(s.current.record["blocks"])
    bits = list(schema.EVENT_BITS.values())
    assert len(set(bits)) == len(bits) and all(b & (b - 1) == 0 for b in bits) and max(bits) < 256


def test_slot_mapping_segments_follow_query_start_loc(fresh_session) -> None:
    s = fresh_session
    s.add_request("The capital of France is", max_tokens=4, temperature=0.0)
    s.step(1)
    s.add_request("Hello there, how are you today?", max_tokens=4, temperature=0.0)
    s.step(1)  # a mixed batch: one decode, one prefill
    rec = s.current.record
    texts = views.token_texts(s.engine.tokenizer)
    state = views.slot_mapping_state(rec, texts)
    qsl = rec["batch"]["query_start_loc"]
    assert [(g["start"], g["end"]) for g in state["segments"]] == list(pairwise(qsl))
    assert [g["is_prefill"] for g in state["segments"]] == [False, True]
    assert state["slot_mapping"] == rec["batch"]["slot_mapping"]
    assert state["tokens"] == [s.engine.tokenizer.decode([i]) for i in rec["batch"]["input_ids"]]
    assert state["logits_indices"] == rec["batch"]["logits_indices"] == [0, qsl[-1] - 1]
    for g in state["segments"]:  # slot = block_table[pos // 16] * 16 + pos % 16
        for row in range(g["start"], g["end"]):
            pos = state["positions"][row]
            assert state["slot_mapping"][row] == g["block_table"][pos // 16] * 16 + pos % 16


def test_slot_mapping_cuts_big_batches_but_keeps_the_segments(fresh_session) -> None:
    s = fresh_session
    s.add_request(list(range(1000, 1060)), max_tokens=2, temperature=0.0)
    s.step(1)
    state = views.slot_mapping_state(s.current.record, views.token_texts(s.engine.tokenizer), max_rows=10)
    assert len(state["input_ids"]) == len(state["tokens"]) == 10
    assert state["num_rows"] == 60 and state["truncated"] == 50
    assert state["segments"][0]["end"] == 60


def test_timeline_has_one_column_per_step_and_chunked_prefill_segments(fresh_session) -> None:
    s = fresh_session
    s.set_budget(max_num_batched_tokens=32)
    s.add_request(list(range(2000, 2080)), max_tokens=3, temperature=0.0)  # 80 tokens: 3 chunks
    s.add_request("Hi", max_tokens=2, temperature=0.0)
    s.run_until_idle()
    state = views.timeline_state(s.history)
    cols = state["steps"]
    records = [e.record for e in s.history[1:]]
    assert cols["step"] == [r["step"] for r in records]
    assert cols["budget"] == [32] * len(records)
    for k, r in enumerate(records):
        assert cols["prefill"][k] + cols["decode"][k] == sum(x["num_tokens"] for x in r["scheduled"])
        assert cols["forward"][k] == r["timings_ms"]["forward"]
    assert cols["backend"] == [s.engine.model_info["attention_backend"]] * len(records)  # how each forward ran:
    assert cols["backend"][0] in ("cpu", "torch")
    assert cols["graph_bucket"] == [None] * len(records)          # no CUDA graphs on CPU
    # Prefills layer by layer; a pure decode step as one native call where the kernels run and this
    # machine's measured limit takes its rows (model_info's native_decode: None where it is off).
    assert cols["forward_path"] == [r["timings_ms"]["forward_path"] for r in records]
    limit = s.engine.model_info.get("native_decode")
    native = [limit is not None and all(not x["is_prefill"] for x in r["scheduled"]) and len(r["scheduled"]) <= limit
              for r in records]
    assert [p == "native_decode" for p in cols["forward_path"]] == native
    assert limit is None or any(native)   # where it is on, a decode step of this run took it
    g = state["gantt"]
    r0 = g["requests"].index("0")
    prefills = [seg for seg in g["segments"] if seg[0] == r0 and seg[3] == "prefill"]
    assert [seg[4].split(":")[0] for seg in prefills] == ["prefill chunk 1", "prefill chunk 2", "prefill chunk 3"]
    decodes = [seg for seg in g["segments"] if seg[0] == r0 and seg[3] == "decode"]
    assert len(decodes) == 1 and decodes[0][2] - decodes[0][1] + 1 == 2  # merged run of decode steps
    r1 = g["requests"].index("1")
    assert any(seg[0] == r1 and seg[3] == "queued" for seg in g["segments"])  # waited behind the budget


def test_timeline_shows_preemption(fresh_session) -> None:
    s = fresh_session
    s.reset(num_kv_blocks=12)
    for i in range(4):
        s.add_request(f"Write a story about topic {i}.", max_tokens=40, ignore_eos=True, temperature=0.0)
    s.run_until_idle()
    preempted = [r for e in s.history[1:] for r in e.record["preempted"]]
    assert preempted, "a pool of 11 usable blocks must run dry with 4 x ~48 tokens"
    state = views.timeline_state(s.history)
    assert sum(state["steps"]["preempted"]) == len(preempted)
    kinds = {(state["gantt"]["requests"][seg[0]], seg[3]) for seg in state["gantt"]["segments"]}
    assert all((rid, "preempted") in kinds for rid in preempted)
    rows = views.queues_state(None, s.current.snapshot)["queues"]["finished"]
    assert sum(r["num_preemptions"] for r in rows) == len(preempted)


def test_queues_state_rows_and_finished_truncation(fresh_session) -> None:
    s = fresh_session
    for i in range(3):
        s.add_request(f"Prompt number {i}", max_tokens=1, temperature=0.0)
    s.add_request("x " * 300, max_tokens=2, temperature=0.0)
    s.step(1)
    e = s.current
    state = views.queues_state(e.record, e.snapshot, max_finished=2, max_text=100)
    assert state["finished_total"] == 3
    assert [r["request_id"] for r in state["queues"]["finished"]] == ["2", "1"]  # newest first
    waiting_or_running = state["queues"]["running"] + state["queues"]["waiting"]
    long_row = next(r for r in waiting_or_running if r["request_id"] == "3")
    assert len(long_row["prompt_text"]) <= 104 and "\u2026" in long_row["prompt_text"]
    done = state["queues"]["finished"][0]
    assert done["finish_reason"] == "length" and done["num_output_tokens"] == 1
    assert done["scheduled"] == {"num_tokens": done["num_prompt_tokens"], "num_computed_before": 0,
                                 "is_prefill": True, "num_cached_tokens": 0, "chunk_index": 0}


def test_sampler_state_finds_the_latest_sample_and_params(fresh_session) -> None:
    s = fresh_session
    s.add_request("The capital of France is", max_tokens=8, temperature=0.7, top_k=5, seed=3)
    s.step(2)
    texts = views.token_texts(s.engine.tokenizer)
    state = views.sampler_state(s.history, s.current.snapshot, "", texts)
    rec = s.current.record
    assert state["requests"] == ["0"] and state["request_id"] == "0"
    sample = state["sample"]
    assert sample["step"] == rec["step"] and sample["token_id"] == rec["sampled"]["0"]["token_id"]
    assert [t[0] for t in sample["top"]] == [t[0] for t in rec["sampled"]["0"]["top"]]
    assert [t[1] for t in sample["top"]] == texts([t[0] for t in rec["sampled"]["0"]["top"]])
    assert sample["params"]["temperature"] == 0.7 and sample["params"]["top_k"] == 5 and sample["params"]["seed"] == 3
    # Scrubbed back to step 0 (nothing sampled yet): a note instead of candidates.
    early = views.sampler_state(s.history[:1], s.history[0].snapshot, "0", texts)
    assert "top" not in early["sample"] and "not been sampled" in early["sample"]["note"]
    # A record with the chosen token only (a live server's feed), or without token ids at all
    # (KVSCOPE_FEED_TOKENS=0): the panel is told why there are no candidates.
    bare = {"record": {**rec, "sampled": {"0": {**rec["sampled"]["0"], "top": []}}}, "snapshot": s.current.snapshot}
    no_top = views.sampler_state([bare], s.current.snapshot, "0", texts)["sample"]
    assert no_top["token_id"] == rec["sampled"]["0"]["token_id"] and no_top["top"] == []
    assert "only the chosen token" in no_top["note"]
    bare["record"]["sampled"]["0"]["token_id"] = None
    assert "KVSCOPE_FEED_TOKENS=0" in views.sampler_state([bare], s.current.snapshot, "0", texts)["sample"]["note"]


def test_latency_rows_are_on_the_engine_clock(fresh_session) -> None:
    s = fresh_session
    s.add_request("The capital of France is", max_tokens=4, temperature=0.0)
    s.run_until_idle()
    (row,) = views.latency_rows(s.current.snapshot)
    m = s.current.snapshot["queues"]["finished"][0]["metrics"]["engine"]
    assert row["time_to_first_token"] == m["time_to_first_token"] > 0
    assert row["inter_token_latency"] == m["inter_token_latency"] and len(row["inter_token_latency"]) == 3


def test_a_shared_block_lists_every_owner_and_hits_stay_marked_in_the_table(fresh_session) -> None:
    # A computes two full shared blocks; B, admitted a step later, hits them. The pool state
    # names both owners of each shared block (drawn in both colours), and B's table marks the
    # two entries as from the cache in the step of the hit and in every step after it.
    s = fresh_session
    a = s.add_request([*SHARED_IDS, 7, 8, 9], max_tokens=4, temperature=0.0, ignore_eos=True)
    s.step(1)
    b = s.add_request([*SHARED_IDS, 10, 11], max_tokens=4, temperature=0.0, ignore_eos=True)
    s.step(1)
    e = s.current
    state = views.block_pool_state(e.record, e.snapshot)
    shared_ids = e.record["blocks"]["hits"]
    assert len(shared_ids) == 2
    assert sorted(bid for bid, _ in state["shared"]) == sorted(shared_ids)
    for bid, idx in state["shared"]:
        assert [state["owners"][k] for k in idx] == e.snapshot["block_pool"]["blocks"][bid]["owners"]
        assert sorted(state["owners"][k] for k in idx) == sorted([a, b])
    tables = {t["request_id"]: t for t in state["block_tables"]}
    assert tables[b]["hits"] == tables[b]["cached"] == [0, 1] and tables[a]["cached"] == []
    s.step(1)  # a decode step for both: no hit now, but B's first two blocks came from the cache
    e = s.current
    tables = {t["request_id"]: t for t in views.block_pool_state(e.record, e.snapshot)["block_tables"]}
    assert (tables[b]["hits"], tables[b]["cached"]) == ([], [0, 1])


def test_slot_mapping_shows_a_prefix_hit_as_cached_blocks_with_their_text(fresh_session) -> None:
    s = fresh_session
    s.add_request(PREFIX + " France?", max_tokens=3, temperature=0.0)
    s.step(1)
    rid = s.add_request(PREFIX + " Italy?", max_tokens=3, temperature=0.0)
    s.step(1)
    e = s.current
    texts = views.token_texts(s.engine.tokenizer)
    state = views.slot_mapping_state(e.record, texts, block_size=16, snapshot=e.snapshot)
    seg = {g["request_id"]: g for g in state["segments"]}
    hit = seg[rid]
    prompt = next(r for r in e.snapshot["queues"]["running"] if r["request_id"] == rid)["prompt_token_ids"]
    hits = e.record["blocks"]["hits"]
    assert hit["num_cached_tokens"] == 16 * len(hits) > 0
    assert [c["block"] for c in hit["cached_blocks"]] == hit["block_table"][:len(hits)] == hits
    for k, c in enumerate(hit["cached_blocks"]):
        assert (c["start"], c["end"]) == (16 * k, 16 * (k + 1))
        assert c["text"] == "".join(texts(prompt[16 * k:16 * (k + 1)]))
    # The computed rows start right after the cached positions.
    assert state["positions"][hit["start"]] == hit["num_cached_tokens"] == hit["num_computed_before"]
    assert seg["0"]["cached_blocks"] == []  # the decode of the first request
    # Without a snapshot the blocks are still there, their text unknown; a step later, none.
    bare = views.slot_mapping_state(e.record, texts, block_size=16)
    assert [c["text"] for c in bare["segments"][1]["cached_blocks"]] == [""] * len(hits)
    s.step(1)
    later = views.slot_mapping_state(s.current.record, texts, snapshot=s.current.snapshot)
    assert all(g["cached_blocks"] == [] for g in later["segments"])


def test_attention_note_says_why_nothing_can_be_probed(fresh_session) -> None:
    s = fresh_session
    assert views.attention_note(s.current.snapshot) == "no request yet: add one and step"
    s.add_request("Hello", max_tokens=1, temperature=0.0)
    assert views.attention_note(s.current.snapshot).startswith("no running request has KV in the cache yet (1 waiting)")
    s.step(1)  # one token: the request finishes in its prefill step
    assert views.probe_targets(s.current.snapshot) == []
    note = views.attention_note(s.current.snapshot)
    assert note.startswith("the request has finished: the KV blocks were freed") and "no running request" not in note


def test_timeline_carries_each_steps_caption_and_the_budget_it_ran_under(fresh_session) -> None:
    from explorer.ui.captions import history_captions

    s = fresh_session
    s.add_request(list(range(2000, 2040)), max_tokens=2, temperature=0.0)
    s.set_budget(max_num_batched_tokens=16)
    s.step(1)
    s.set_budget(max_num_batched_tokens=32)
    s.run_until_idle()
    cols = views.timeline_state(s.history)["steps"]
    assert cols["budget"] == [16, 32, 32] == [e.record["budgets"]["max_num_batched_tokens"] for e in s.history[1:]]
    assert cols["caption"] == history_captions(s.history)[1:]
    assert cols["caption"][0] == "#0 prefill 16 of 40 prompt tokens (chunked: token budget 16); allocated block 1 to #0"
