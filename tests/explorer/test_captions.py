"""Step captions (explorer/ui/captions.py) over real engine runs: each says what was scheduled
and why, and what happened to the blocks, in words a learner can check against the record."""
from __future__ import annotations

import pytest

from explorer import Session
from explorer.ui.captions import EMPTY_HINT, CaptionCache, history_captions, ids_text, step_caption

GREEDY = {"temperature": 0.0, "ignore_eos": True}


@pytest.fixture
def make_session(tiny_qwen3_path):
    def make(**config) -> Session:
        return Session(str(tiny_qwen3_path), **{"num_kv_blocks": 48, "max_num_batched_tokens": 64,
                                                 "block_size": 16, **config})
    return make


def captions_by_step(s: Session) -> dict[int, str]:
    return {e.step: c for e, c in zip(s.history, history_captions(s.history))}


def text_of(s: Session, step: int, rid: str) -> str:
    return s.entry(step).record["sampled"][rid]["text"]


def test_ids_of_consecutive_requests_read_as_a_range() -> None:
    assert ids_text(["0", "1", "2"]) == "#0-#2"
    assert ids_text(["0", "1"]) == "#0, #1"
    assert ids_text(["0", "2", "3"]) == "#0, #2, #3"
    assert ids_text(["a", "b", "c"]) == "#a, #b, #c"


def test_before_any_step_the_caption_says_what_to_do(make_session) -> None:
    s = make_session()
    assert step_caption(None, s.current.snapshot) == EMPTY_HINT == "no steps yet: add a request and press Step"
    s.add_request("Hello", max_tokens=2, **GREEDY)
    assert history_captions(s.history) == ["no steps yet: 1 request waiting; press Step to run the first step"]


def test_prefill_decode_and_finish(make_session) -> None:
    s = make_session()
    s.add_request("The capital of France is", max_tokens=3, **GREEDY)  # 5 prompt tokens
    s.step(1)
    s.add_request("Hello there", max_tokens=2, **GREEDY)  # 2 prompt tokens
    s.run_until_idle()
    c = captions_by_step(s)
    assert c[1] == f"#0 prefill all 5 prompt tokens \u2192 first token {text_of(s, 1, '0')!r}; allocated block 1 to #0"
    assert c[2] == (f"#0 decode 1 token; #1 prefill all 2 prompt tokens \u2192 first token {text_of(s, 2, '1')!r}; "
                    "allocated block 2 to #1")
    assert c[3] == ("#0, #1 decode 1 token each; #0 finished (max_tokens=3 reached), freed block 1; "
                    "#1 finished (max_tokens=2 reached), freed block 2")


def test_chunked_prefill_names_the_chunk_and_the_budget_that_cut_it(make_session) -> None:
    s = make_session(max_num_batched_tokens=16)
    s.add_request(list(range(2000, 2059)), max_tokens=2, **GREEDY)  # 59 prompt tokens: 4 chunks
    s.add_request("Hi", max_tokens=2, **GREEDY)
    s.run_until_idle()
    c = captions_by_step(s)
    assert c[1].startswith("#0 prefill 16 of 59 prompt tokens (chunked: token budget 16); allocated block 1 to #0")
    assert c[1].endswith("#1 waits: the 16-token budget is used up")
    assert c[2].startswith("#0 prefill tokens 17-32 of 59 (chunk 2; chunked: token budget 16)")
    assert c[4].startswith("#0 prefill tokens 49-59 of 59 (chunk 4; the last) \u2192 first token")
    assert "#1 prefill its 1 prompt token" in c[4]
    # A decode took one token of the budget: the chunk is cut by what was left.
    s = make_session(max_num_batched_tokens=16)
    s.add_request("Hello", max_tokens=4, **GREEDY)
    s.step(1)
    s.add_request(list(range(3000, 3040)), max_tokens=2, **GREEDY)
    s.step(1)
    assert captions_by_step(s)[2].startswith(
        "#0 decode 1 token; #1 prefill 15 of 40 prompt tokens (chunked: 15 of the 16-token budget left)")


def test_a_one_token_last_chunk_says_attention_runs_it_as_a_decode(make_session) -> None:
    """The scheduler still calls it a prefill chunk; attention sees one query row with context,
    which the runner (as vLLM's backends do) sends to the decode kernel: the caption says both."""
    s = make_session(max_num_batched_tokens=16)
    s.add_request(list(range(2000, 2017)), max_tokens=2, **GREEDY)  # 17 prompt tokens: 16 + 1
    s.step(2)
    rec = s.entry(2).record
    assert [(e["is_prefill"], e["num_tokens"], e["num_computed_before"]) for e in rec["scheduled"]] == [(True, 1, 16)]
    assert rec["batch"]["query_start_loc"] == [0, 1]  # one query row over 17 positions of context
    c = captions_by_step(s)
    assert c[2].startswith("#0 prefill tokens 17-17 of 17 (chunk 2; the last; one query row: attention runs it "
                           "as a decode)")
    assert "runs it as a decode" not in c[1]


def test_prefix_cache_hits_are_counted_in_blocks_and_tokens(make_session) -> None:
    s = make_session()
    shared = list(range(1000, 1032))  # two full blocks
    s.add_request([*shared, 7, 8, 9], max_tokens=2, **GREEDY)
    s.step(1)
    s.add_request([*shared, 10, 11], max_tokens=2, **GREEDY)
    s.step(1)
    c = captions_by_step(s)[2]
    assert "#1 reused 2 cached blocks (32 tokens) from the prefix cache, prefill the other 2 of 34 prompt tokens" in c
    assert "same-step" not in c
    assert s.current.record["blocks"]["hits"] == [1, 2]
    # Both arrive before one step: the second hits blocks this very step computes.
    s = make_session()
    s.add_request([*shared, 7, 8, 9], max_tokens=2, **GREEDY)
    s.add_request([*shared, 10, 11], max_tokens=2, **GREEDY)
    s.step(1)
    c = captions_by_step(s)[1]
    assert ("#1 reused 2 cached blocks (32 tokens) from the prefix cache (a same-step hit: computed by this very "
            "step, before any layer reads it), prefill the other 2 of 34 prompt tokens") in c
    assert "allocated blocks 1, 2, 3 to #0, block 4 to #1" in c


def _preempting_steps(s: Session) -> list:
    return [e for e in s.history if e.record and e.record["preempted"]]


def test_preemption_names_the_request_that_needed_a_block_the_victim_and_the_freed_blocks(make_session) -> None:
    # 6 usable blocks: A (15 tokens, 1 block), B (40, 3 blocks), C (30, 2 blocks) fill the pool.
    # When A computes its 17th token it needs a second block, none is free: C, the newest, goes.
    s = make_session(num_kv_blocks=7, max_num_batched_tokens=128)
    for k, n in enumerate((15, 40, 30)):
        s.add_request(list(range(4000 + 1000 * k, 4000 + 1000 * k + n)), max_tokens=30, **GREEDY)
    s.step(4)
    (entry,) = _preempting_steps(s)
    assert entry.step == 3 and entry.record["preempted"] == ["2"]
    before = s.entry(2).snapshot
    table_c = next(r["block_table"] for r in before["queues"]["running"] if r["request_id"] == "2")
    freed = ", ".join(str(b) for b in reversed(table_c))  # a request returns its blocks last first
    caption = captions_by_step(s)[3]
    assert caption == (f"#0, #1 decode 1 token each; #0 needed a new block and none was free \u2192 preempted #2 "
                       f"(newest running), freed blocks {freed}; it goes back to the front of the waiting queue, "
                       f"to be recomputed; allocated block {table_c[-1]} to #0")
    assert "#2 waits" not in caption  # the victim is not "waiting" in the sense of never admitted
    # Without the state before the step the reason is still given, less precisely.
    assert "the pool ran out of free KV blocks \u2192 preempted #2 (newest running)" in step_caption(
        entry.record, entry.snapshot)
    # C comes back later and recomputes its prompt and the two tokens it had generated.
    s.run_until_idle()
    resumed = next(c for step, c in captions_by_step(s).items() if step > 3 and "#2 resumed" in c)
    assert "#2 resumed after its preemption: recompute all 32 tokens (prompt 30 + 2 generated)" in resumed


def test_a_request_that_finds_no_block_and_is_the_newest_preempts_itself(make_session) -> None:
    s = make_session(num_kv_blocks=12)
    for i in range(4):
        s.add_request(f"Write a story about topic {i}.", max_tokens=40, **GREEDY)
    s.run_until_idle()
    first = _preempting_steps(s)[0]
    assert first.record["preempted"] == ["3"]
    caption = captions_by_step(s)[first.step]
    assert ("#3 needed a new block and none was free \u2192 preempted itself (it was the newest running request), "
            "freed blocks") in caption
    later = captions_by_step(s)[first.step + 1]
    assert "#3 waits: not enough free KV blocks for its whole sequence" in later


def test_a_step_that_preempts_admits_no_waiting_request(make_session) -> None:
    s = make_session(num_kv_blocks=7, max_num_batched_tokens=128)
    for k, n in enumerate((15, 40, 30)):
        s.add_request(list(range(4000 + 1000 * k, 4000 + 1000 * k + n)), max_tokens=30, **GREEDY)
    s.step(1)
    s.add_request([5, 6, 7], max_tokens=2, **GREEDY)  # waits for blocks, then for the preemption
    s.step(2)
    assert s.current.record["preempted"] == ["2"]
    assert captions_by_step(s)[3].endswith("#3 waits: a step that preempts admits no waiting request")


def test_finish_reasons_are_spelled_out(make_session) -> None:
    s = make_session(max_model_len=8)
    s.add_request([100, 101, 102, 103, 104, 105], max_tokens=50, **GREEDY)
    s.run_until_idle()
    assert "#0 finished (max_model_len reached), freed block 1" in captions_by_step(s)[s.current.step]
    s = make_session()
    rid = s.add_request("Hello", max_tokens=50, **GREEDY)
    s.step(1)
    s.abort(rid)
    s.add_request("Hi", max_tokens=1, **GREEDY)
    s.step(1)
    assert "#1 finished (max_tokens=1 reached)" in captions_by_step(s)[2]


def test_the_cache_gives_the_same_captions_and_follows_a_refreshed_snapshot(make_session) -> None:
    s = make_session(max_num_batched_tokens=16)
    s.add_request(list(range(2000, 2040)), max_tokens=2, **GREEDY)
    s.step(1)
    cache = CaptionCache()
    assert cache.captions(s.history) == history_captions(s.history)
    assert cache.caption(s.history, 1) == history_captions(s.history)[1]
    s.add_request("Hi", max_tokens=1, **GREEDY)  # the latest entry's snapshot is refreshed
    s.step(1)
    assert cache.captions(s.history) == history_captions(s.history)
    assert "#1 waits: the 16-token budget is used up" in cache.caption(s.history, 2)


def test_long_ids_are_numbered_in_first_seen_order_and_never_renumbered():
    from explorer.core.labels import RequestLabels

    labels = RequestLabels()
    long_ids = [f"cmpl-{k:02d}ae5d185520b8dfff-0-8d04f5d6" for k in range(4)]
    labels.see([long_ids[0], "7", long_ids[1]])
    assert [labels.name(r) for r in (long_ids[0], "7", long_ids[1])] == ["#1", "#7", "#3"]
    labels.see([long_ids[2], long_ids[0]])          # a known id keeps its number
    assert labels.name(long_ids[0]) == "#1" and labels.name(long_ids[2]) == "#4"
    labels.see(["5", long_ids[3]])                  # "#6" is free; the short id "5" is its own name
    assert labels.name(long_ids[3]) == "#6"
    clash = RequestLabels()
    clash.see(["2", "cmpl-aaaaaaaaaaaaaaaa-0-1234", "cmpl-bbbbbbbbbbbbbbbb-0-5678"])
    assert clash.name("cmpl-aaaaaaaaaaaaaaaa-0-1234") == "#2\u00b71234"   # "#2" is the short id's
    assert ids_text(long_ids[:3], labels.name) == "#1, #3, #4"
    assert ids_text(["4", "5", "6"]) == "#4-#6"
