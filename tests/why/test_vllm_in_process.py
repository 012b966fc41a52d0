"""The why-ledger on vLLM 0.32 in this process (the default model, block size 32 as vLLM's CPU
backend needs, a pool small enough to evict and preempt), random traffic: every request's
classes tile its prompt, a brute force over the raw history agrees, and a planted mislabel (an
evicted block counted as never seen) is caught."""
from __future__ import annotations

import pytest

from explorer.why import WhyLedger
from tests.why import oracle
from tests.why.workloads import drive, random_workload

pytestmark = pytest.mark.slow

BLOCK = 32
# 8 usable blocks of 32: a request of max_model_len fits, four running ones do not (evictions, preemptions).
VLLM = dict(block_size=BLOCK, num_kv_blocks=9, max_num_batched_tokens=96, max_num_seqs=4, max_model_len=256)


@pytest.fixture(scope="module")
def vllm_history(default_model_path):
    from tests.oracle.vllm_available import require_vllm

    require_vllm()
    from explorer import Session

    s = Session(engine="vllm", model=str(default_model_path), **VLLM)
    try:
        drive(s, random_workload(1, block_size=BLOCK, num_requests=20, max_prompt=120))
        yield list(s.history)
    finally:
        s._driver.shutdown()


def test_every_prompt_token_is_in_exactly_one_class_and_a_brute_force_agrees(vllm_history):
    ledger = WhyLedger().feed(vllm_history)
    ledger.check()
    assert not ledger.notes and ledger.unmapped == 0
    seen = set()
    for why in ledger.requests.values():
        for a in why.admissions:
            assert sum(a.classes.values()) == a.tokens, why.request_id
            seen.update(k for k, n in a.classes.items() if n)
    assert {"hit", "below_block", "never_seen", "evicted", "recomputed"} <= seen, seen
    assert oracle.check(ledger, vllm_history) == []


def test_a_planted_mislabel_is_caught_on_vllms_history(vllm_history, plant_mislabel):
    plant_mislabel("evicted", "never_seen")
    caught = oracle.check(WhyLedger().feed(vllm_history), vllm_history)
    assert any("oracle evicted, ledger never_seen" in p for p in caught), caught
