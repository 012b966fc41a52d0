"""The explorer on vLLM in process with several KV cache groups: a random 4-layer Gemma 3 (three
32-token sliding-window layers, one full), which vLLM 0.32's CPU build runs with four groups,
the three sliding ones first. Every group is read, shown in kvscope's order (full attention
first), rebuilt from changes, recorded, and replayed through vLLM's scheduler with the same
groups in vLLM's order. One vLLM engine serves the module (eager: ~15 s to start); the last test
follows a real server running the same model.
"""
from __future__ import annotations

import concurrent.futures
import time

import pytest

from tests.oracle.vllm_available import require_vllm
from tests.vllm_traffic import settled_history

CONFIG = dict(block_size=32, num_kv_blocks=48, max_num_batched_tokens=96, max_num_seqs=4, max_model_len=512)
GREEDY = {"temperature": 0.0, "ignore_eos": True}
WINDOW = 32


@pytest.fixture(scope="module")
def session(tiny_checkpoint):
    require_vllm()
    from explorer import Session

    s = Session(engine="vllm", model=str(tiny_checkpoint("gemma3", sliding_window=WINDOW)), **CONFIG)
    yield s
    s._driver.shutdown()


def prompt(seed: int, n: int) -> list[int]:
    return [300 + (seed * 7919 + i * 104729) % 50000 for i in range(n)]


def group_slots_checked(batch: dict, groups: int) -> int:
    """Check that each group's slots in a batch are its block tables' blocks, offset; the number of
    other groups' slots."""
    assert len(batch["group_slot_mappings"]) == len(batch["group_block_tables"]) == groups - 1
    bs, q = CONFIG["block_size"], batch["query_start_loc"]
    for slots, tables in zip([batch["slot_mapping"], *batch["group_slot_mappings"]],
                             [batch["block_tables"], *batch["group_block_tables"]]):
        assert len(slots) == q[-1] and len(tables) == len(q) - 1
        for row, table in enumerate(tables):  # each token's slot is its group's block, offset
            for t in range(q[row], q[row + 1]):
                pos = batch["positions"][t]
                assert slots[t] == table[pos // bs] * bs + pos % bs
    return sum(map(len, batch["group_slot_mappings"]))


def vllm_tables(engine, internal_id: str) -> list[list[int]]:
    """vLLM's own block ids of a request in each group, in kvscope's order."""
    ids = engine.scheduler.kv_cache_manager.get_block_ids(internal_id)
    return [list(ids[g]) for g in engine.groups.order]


def test_model_info_lists_every_group_full_attention_first_with_vllms_order(session):
    groups = session.current.snapshot["model_info"]["kv_cache_groups"]
    assert [g["kind"] for g in groups] == ["full_attention"] + ["sliding_window"] * 3
    assert groups[0]["layers"] == [3] and sorted(layer for g in groups[1:] for layer in g["layers"]) == [0, 1, 2]
    assert all(g["sliding_window"] == WINDOW for g in groups[1:]) and groups[0]["sliding_window"] is None
    assert [g["vllm_group"] for g in groups] == [3, 0, 1, 2]  # vLLM put the sliding layers' groups first


def test_every_groups_tables_slots_and_hits_are_vllms_and_changes_rebuild_them(session, tmp_path):
    # Long prompts leave the 32-token window (the sliding groups free those blocks to the null
    # block), siblings share 128 and 100 of its tokens, and every step's history entry,
    # built from the changes, must equal a whole snapshot (check_changes).
    from explorer.core.recording import Recording, save_recording
    from explorer.whatif.identity import identity

    s, eng = session, session._driver.engine
    s.check_changes = True
    shared = prompt(1, 160)
    try:
        s.add_request(shared, request_id="a", max_tokens=6, **GREEDY)
        seen = {"nulls": 0, "sliding_slots": 0}
        admitted: dict[str, tuple[int, list[int]]] = {}
        for step in range(40):
            if step == 4:
                s.add_request(shared[:128] + prompt(2, 40), request_id="b", max_tokens=4, **GREEDY)
                s.add_request(prompt(3, 70), request_id="c", max_tokens=5, **GREEDY)
            if step == 6:
                s.add_request(shared[:100] + prompt(4, 30), request_id="d", max_tokens=3, **GREEDY)
                s.add_request(prompt(3, 70)[:64] + prompt(5, 50), request_id="e", max_tokens=3, **GREEDY)
            if not s.step():
                break
            rec, snap = s.current.record, s.current.snapshot
            for r in snap["queues"]["running"]:
                iid = eng.requests[r["request_id"]].internal_id
                want = vllm_tables(eng, iid)
                assert [r["block_table"], *r["group_block_tables"]] == want, (step, r["request_id"])
                seen["nulls"] += sum(t.count(0) for t in want[1:])
            seen["sliding_slots"] += group_slots_checked(rec["batch"], 4)
            admitted.update({r["request_id"]: (r["num_cached_tokens"], r["group_hit_tokens"])
                             for r in snap["queues"]["running"] if r["request_id"] in rec["new_requests"]})
        # b arrived while a ran: 128 tokens in every group. d came after a's sliding blocks before
        # token 96 had left the window and gone: the full group alone hits 96, the sliding groups
        # 0, and vLLM's intersection is 0 (issue 45238's kind of cut, on vLLM itself).
        assert admitted["b"] == (128, [128] * 4) and admitted["d"] == (0, [96, 0, 0, 0]), admitted
        assert seen["nulls"] > 0 and seen["sliding_slots"] > 0, seen
        path = save_recording(s, tmp_path / "gemma.kvrec.gz")
    finally:
        s.check_changes = False
    rec = Recording.load(path)
    # The export draws every panel of every step with the four groups (block tables, slots, pool).
    from explorer.export.page import export_html

    page = export_html(s, tmp_path / "gemma.html")
    assert page.steps_included == len(s.history) and "sliding window 32" in page.path.read_text()
    assert rec.settings.kv_cache_groups == "sliding,sliding,sliding,full" and rec.settings.sliding_window == WINDOW
    report = identity(rec, s.history)
    assert report.ok, report.text()
    # The same replay with kvscope's default two groups (full, then one sliding) allocates fewer
    # blocks per token: its block ids part from vLLM's run, so the groups carried are what made it equal.
    from explorer.whatif.settings import Variant

    two = rec.settings.replace(kv_cache_groups=None)
    assert not identity(rec, s.history, at=Variant(two, (("kv_cache_groups", None),))).ok
    # The why-ledger reads every group's hit: d's 96 tokens were cut by the sliding groups, and a
    # replay of the recording with every layer full attention proves it (they hit there).
    from explorer.why import WhyLedger
    from explorer.why.proof import prove

    ledger = WhyLedger().feed(s.history)
    assert ledger.requests["d"].first.classes.get("left_window") == 96, ledger.requests["d"].first.classes
    proof = prove(ledger, rec)
    assert proof.replays is not None and proof.replays.reproduces, proof.replays.first_difference
    assert ledger.requests["d"].proofs["left_window"]["verdict"] == "proven"
    # What fixes it on vLLM: caching a sliding block every 32 tokens (prefix_cache_retention_interval)
    # keeps the window before token 96, and the same arrivals replayed through vLLM's scheduler with
    # the four groups give d its 96 tokens (and b keeps its 128).
    from explorer.whatif.replay import replay

    fixed = replay(rec, Variant(rec.settings.replace(prefix_cache_retention_interval=32),
                                (("prefix_cache_retention_interval", 32),)))
    assert fixed.requests["d"].num_cached_tokens == 96 and fixed.requests["b"].num_cached_tokens == 128


@pytest.mark.slow
def test_a_live_gemma3_server_is_followed_in_every_group_and_replays_decision_for_decision(tiny_checkpoint, tmp_path):
    """A real vLLM server with kvscope's recorder (single-worker executor: its model runner owns the
    block-id lists it is handed) running the same Gemma 3: the attached Session reads the groups in
    vLLM's order, each request's tables in every group (null blocks where tokens left the window)
    and each group's hit, one of them cut to 0 by the sliding groups; its recording, replayed
    through vLLM's scheduler with the four groups, reproduces every step."""
    require_vllm()
    pytest.importorskip("openai")
    from explorer import Session
    from explorer.core.recording import Recording, RecordingWriter
    from explorer.drivers.vllm_live.server import VllmServer
    from explorer.whatif import identity

    srv = VllmServer(str(tiny_checkpoint("gemma3", sliding_window=WINDOW)), num_gpu_blocks=60, block_size=32,
                     max_model_len=1024, max_num_batched_tokens=128, max_num_seqs=6, kv_events=False,
                     log=tmp_path / "server.log", env={"OMP_NUM_THREADS": "2", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    path = tmp_path / "gemma-live.kvrec.gz"
    try:
        srv.start().wait_ready(600)
        live = Session.attach(srv.feed, snapshot_address=srv.snapshots)
        writer = RecordingWriter(path)
        writer.follow(live)
        client = srv.client(timeout=300)

        def complete(prompt: str, n: int) -> None:
            client.completions.create(model=srv.model, prompt=prompt, max_tokens=n, temperature=0.0,
                                      extra_body={"ignore_eos": True})

        base = "The harbour master counted every ship that sailed past the old lighthouse. " * 8
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            done = [pool.submit(complete, base + f" Ship {i} carries cargo.", 12) for i in range(3)]
            time.sleep(1.5)  # these share the first block of a prefix whose sliding blocks have gone
            done += [pool.submit(complete, base[:300] + " And then?", 6),
                     pool.submit(complete, "Tell a story about the sea. " * 30, 20)]
            [f.result() for f in done]
        history = settled_history(live, writer)
        assert live.feed_status()["missed"] == 0
        live.close()
    finally:
        srv.stop()
    groups = history[-1].snapshot["model_info"]["kv_cache_groups"]
    assert [(g["kind"], g["vllm_group"]) for g in groups] == [("full_attention", 3)] + [
        ("sliding_window", g) for g in range(3)]
    nulls, hits, sliding_slots = 0, [], 0
    for e in history:
        if e.record is not None and e.record["scheduled"]:   # every group's slots, as the model runner read them
            sliding_slots += group_slots_checked(e.record["batch"], 4)
        for r in e.snapshot["queues"]["running"]:
            nulls += sum(t.count(0) for t in r["group_block_tables"])
            if e.record is not None and r["request_id"] in e.record["new_requests"]:
                hits.append((r["num_cached_tokens"], r["group_hit_tokens"]))
    assert nulls > 0 and len(hits) == 5 and sliding_slots > 0, (nulls, hits, sliding_slots)
    assert any(n == min(h) < max(h) for n, h in hits), hits          # a hit the sliding groups cut
    assert any(n == min(h) > 0 for n, h in hits), hits               # and one every group shares
    rec = Recording.load(path)
    assert rec.settings.kv_cache_groups == "sliding,sliding,sliding,full"
    report = identity(rec, history)
    assert report.ok, report.text()
