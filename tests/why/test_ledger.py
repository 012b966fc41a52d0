"""The why-ledger on kvscope's engine, random traffic: every request's classes tile its prompt,
a brute force over the raw history agrees with every token's class and every named eviction,
and a planted mislabel (an evicted block counted as never seen) is caught."""
from __future__ import annotations

import pytest

from explorer.why import WhyLedger
from tests.why import oracle


def test_every_prompt_token_is_in_exactly_one_class(kvscope_runs):
    seen: set[str] = set()
    for seed, s in kvscope_runs:
        ledger = WhyLedger().feed(s.history)
        ledger.check()
        admitted = {rid for e in s.history if e.record for rid in e.record["new_requests"]}
        assert set(r for r, w in ledger.requests.items() if w.admissions) == admitted, seed
        for why in ledger.requests.values():
            for a in why.admissions:
                seen.update(k for k, n in a.classes.items() if n)
                assert sum(a.classes.values()) == a.tokens
            if why.first:
                assert why.first.tokens == why.prompt_len
                assert why.first.hit == next(x["num_cached_tokens"] for e in s.history if e.record
                                             for x in e.record["scheduled"] if x["request_id"] == why.request_id
                                             and why.request_id in e.record["new_requests"])
    # The traffic makes every cause kvscope's engine can have (no hash domains there).
    assert {"hit", "below_block", "never_seen", "evicted", "recomputed"} <= seen, seen


def test_a_brute_force_over_the_history_agrees(kvscope_runs):
    for seed, s in kvscope_runs:
        ledger = WhyLedger().feed(s.history)
        assert oracle.check(ledger, s.history) == [], f"seed {seed}"


def test_the_pool_at_each_lookup_agrees(kvscope_runs):
    """Read from the pool, not from who computed what: every block called evicted had been
    cached and its chain was broken at the lookup, and no block called never seen had been."""
    from engine.core.hashing import hash_block

    checked = 0
    for seed, s in kvscope_runs:
        ledger = WhyLedger().feed(s.history)
        assert oracle.pool_problems(ledger, s.history, hash_block) == [], f"seed {seed}"
        checked += sum(w.first.classes.get("evicted", 0) for w in ledger.requests.values() if w.first)
    assert checked > 0


@pytest.mark.parametrize("swap", [("evicted", "never_seen"), ("never_seen", "evicted")])
def test_a_planted_mislabel_is_caught_by_the_pool(kvscope_runs, plant_mislabel, swap):
    from engine.core.hashing import hash_block

    true_cls, planted = swap
    plant_mislabel(true_cls, planted)
    caught = [p for seed, s in kvscope_runs for p in oracle.pool_problems(WhyLedger().feed(s.history), s.history,
                                                                          hash_block)]
    assert any(f"called {planted.replace('_', ' ')}" in p for p in caught), caught


def test_a_planted_mislabel_is_caught(kvscope_runs, plant_mislabel):
    plant_mislabel("evicted", "never_seen")
    caught = [p for seed, s in kvscope_runs for p in oracle.check(WhyLedger().feed(s.history), s.history)]
    assert any("oracle evicted, ledger never_seen" in p for p in caught), caught


def test_preemptions_name_the_victim_its_lost_tokens_and_who_needed_the_blocks(kvscope_runs):
    n = 0
    for _, s in kvscope_runs:
        ledger = WhyLedger().feed(s.history)
        by_step = {e.step: e for e in s.history}
        for p in ledger.preemptions:
            n += 1
            before = by_step[p.step - 1].snapshot
            victim = next(r for r in before["queues"]["running"] if r["request_id"] == p.victim)
            assert p.lost_tokens == victim["num_computed_tokens"] > 0
            assert p.victim in by_step[p.step].record["preempted"]
            assert p.for_request in {r["request_id"] for r in before["queues"]["running"]}
            assert p.free_blocks_before == before["block_pool"]["num_free_blocks"]
            assert p.readmitted_step is None or p.recomputed_tokens <= p.lost_tokens
            assert "preempted, losing" in p.text()
    assert n >= 2


def test_the_summary_says_where_missed_tokens_went(kvscope_runs):
    _, s = kvscope_runs[0]
    summary = WhyLedger().feed(s.history).summary()
    assert summary.prompt_tokens == sum(w.first.tokens for w in WhyLedger().feed(s.history).requests.values()
                                        if w.first)
    assert sum(summary.classes.values()) == summary.prompt_tokens
    text = summary.text()
    assert "% of missed prompt tokens were" in text and "prompt tokens" in text


def test_reading_the_history_step_by_step_equals_reading_it_whole(kvscope_runs):
    _, s = kvscope_runs[1]
    whole = WhyLedger().feed(s.history)
    parts = WhyLedger()
    for i in range(0, len(s.history), 7):
        parts.feed(s.history[:i + 7])    # a follower re-reads the history it has: entries it read are skipped
    assert {r: w.to_dict() for r, w in parts.requests.items()} == {r: w.to_dict() for r, w in whole.requests.items()}


@pytest.mark.parametrize("bad", [0, 3])
def test_a_history_with_missing_steps_says_so(kvscope_runs, bad):
    _, s = kvscope_runs[0]
    entries = [e for i, e in enumerate(s.history) if i not in (5, 6)] if bad else list(s.history)
    ledger = WhyLedger().feed(entries)
    assert any("were not in the history" in n for n in ledger.notes) == bool(bad)


def test_the_why_panel_at_a_scrubbed_step_is_the_ledger_of_the_run_up_to_it(kvscope_runs):
    """The why panel at step k (summary, each request, the default request) from the whole run's
    ledger equals what a ledger that read only the history up to k says: nothing of later steps."""
    from explorer.ui import why_view

    def texts(ids):
        return [str(t) for t in ids]

    for _, s in kvscope_runs:
        whole = WhyLedger().feed(s.history)
        assert whole.preemptions   # the steps checked include preemptions and re-admissions
        for i in sorted({1, len(s.history) // 3, len(s.history) // 2, *(
                j for j, e in enumerate(s.history) if e.record and e.record["preempted"])}):
            step = s.history[i].step
            upto = WhyLedger().feed(s.history[:i + 1])
            want, got = upto.summary().to_dict(), whole.summary(step).to_dict()
            assert {**got, "notes": []} == {**want, "notes": []}, step
            assert why_view.latest_admitted(whole, step) == why_view.latest_admitted(upto)
            for rid in whole.requests:
                assert why_view.request_state(whole, rid, {}, texts, step) == why_view.request_state(
                    upto, rid, {}, texts), (step, rid)
