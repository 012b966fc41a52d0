"""prove() (explorer/why/proof.py) has the power to refuse a wrong explanation: on kvscope's
engine (random traffic, a small pool), a span of each class relabelled as another goes through
the counterfactual replays and comes back unproven, while the same spans under their true labels
are proven or confirmed. The replays are vLLM 0.32's own scheduler, fed the recorded run."""
from __future__ import annotations

import pytest

from explorer.why import WhyLedger
from explorer.why.proof import prove, recording_of, run_replays
from tests.oracle.vllm_available import require_vllm

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def proved(kvscope_runs):
    """(ledger, recording, replays) of the first seed's run whose replay reproduces it."""
    require_vllm()
    for _, s in kvscope_runs:
        rec = recording_of(s.history)
        replays = run_replays(rec)
        if replays.reproduces:
            return WhyLedger().feed(s.history), rec, replays
    pytest.fail("no run's replay at its recorded settings reproduced it")


def _spans(ledger, cls):
    """(request id, span) of every first admission's span of `cls`."""
    return [(rid, s) for rid, why in ledger.requests.items() if why.first for s in why.first.spans if s.cls == cls]


# true class -> the label planted on it, and the proof that must then refuse it
@pytest.mark.parametrize("true_cls, planted", [
    ("never_seen", "evicted"),       # a prefix no one computed: a pool that evicts nothing still misses it
    ("never_seen", "below_block"),   # ... and so does a smaller block
    ("never_seen", "other_domain"),  # no salt or LoRA to remove: nothing to replay, never proven
    ("evicted", "never_seen"),       # a pool that evicts nothing hits it: not 'no setting removes it'
])
def test_a_planted_mislabel_comes_back_unproven(proved, true_cls, planted):
    ledger, rec, replays = proved
    truth = prove(ledger, rec, replays)
    spans = [(rid, s) for rid, s in _spans(ledger, true_cls)
             if ledger.requests[rid].proofs.get(true_cls, {}).get("verdict") in ("proven", "confirmed")]
    assert spans, f"no {true_cls} span that its own proof confirms in this run ({truth.text()})"
    rid, span = spans[0]
    span.cls = planted                 # the mislabel, in the ledger prove() reads
    why = ledger.requests[rid]
    why.first.classes[true_cls] -= span.end - span.start
    why.first.classes[planted] = why.first.classes.get(planted, 0) + span.end - span.start
    prove(ledger, rec, replays)
    proof = why.proofs[planted]
    # (never_seen's `proven` counts the tokens the big pool still misses: some of a truly evicted
    # span can, where it ends in a block the lookup leaves out; the verdict needs all of them.)
    assert proof["verdict"] == "unproven" and (planted == "never_seen" or proof["proven"] == 0), proof
