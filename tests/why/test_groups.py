"""The why-ledger on a model with two KV cache groups (full attention and a sliding window): tokens
the full-attention group had cached but the sliding group's shorter hit cut off are classed as
dropped from the sliding window (the blocks left its window; the hit is the shortest of the
groups'), not as evicted, and a replay without the window proves it."""
from __future__ import annotations

import random

import pytest

from explorer import Session
from explorer.why import WhyLedger
from explorer.why.proof import prove, recording_of

WINDOW = 20


@pytest.fixture(scope="module")
def mixed_model(tiny_checkpoint):
    return tiny_checkpoint("qwen3", num_layers=4, sliding_window=WINDOW,
                           layer_types=("full_attention", "sliding_attention", "sliding_attention", "full_attention"))


def _cut_run(model) -> Session:
    """A 100-token shared prefix: a request 60 tokens past it, then two siblings; the first sibling's
    hit is cut by the sliding group (it cached only the run ending at the first prompt's end)."""
    s = Session(str(model), attention_backend="torch", num_kv_blocks=64, block_size=16, max_model_len=512)
    rng = random.Random(9)
    shared = [rng.randrange(200, 20000) for _ in range(100)]
    for prompt in ([*shared, *(rng.randrange(200, 20000) for _ in range(60))], [*shared, 5, 6, 7], [*shared, 8, 9]):
        s.add_request(prompt, max_tokens=2, temperature=0.0, ignore_eos=True)
        s.run_until_idle()
    return s


def test_a_hit_cut_by_the_sliding_group_is_classed_as_such(mixed_model):
    s = _cut_run(mixed_model)
    ledger = WhyLedger().feed(s.history)
    cut = ledger.requests["1"].first
    assert cut.classes == {"left_window": 96, "below_block": 4, "never_seen": 3}
    span = next(sp for sp in cut.spans if sp.cls == "left_window")
    assert (span.start, span.end) == (0, 96) and f"sliding window {WINDOW} group's hit ended at 0" in span.detail
    assert f"within the last {WINDOW} the request computed" in span.detail
    assert ledger.requests["2"].first.classes["hit"] == 96   # the sibling after it hits in both groups
    assert "were dropped from a sliding window" in ledger.summary().text()


@pytest.mark.slow
def test_the_cut_is_proven_by_a_replay_without_the_sliding_group(mixed_model):
    """The recording carries the window; vLLM's scheduler, built with both groups, makes every
    recorded decision again, and with every layer full attention the cut tokens hit."""
    from tests.oracle.vllm_available import require_vllm

    require_vllm()
    s = _cut_run(mixed_model)
    ledger = WhyLedger().feed(s.history)
    rec = recording_of(s.history)
    assert rec.settings.sliding_window == WINDOW
    report = prove(ledger, rec)
    assert report.replays is not None and report.replays.reproduces, report.replays.first_difference
    assert ledger.requests["1"].proofs["left_window"]["verdict"] == "proven"
    assert report.proven["left_window"] == 96 and not report.unproven.get("left_window")
