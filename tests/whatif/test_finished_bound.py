"""A Session that keeps only its latest N finished requests (`max_finished`, what bounds a live
follower's memory) still hands every request to a recording and to the why-ledger: each request
that finishes is in the finished queue of the entry of its step, whatever the bound, and the
readers find new finishes by id, never by the queue's length (which stops growing at the bound)."""
from __future__ import annotations

import pytest

from explorer import Session
from explorer.core.recording import Recording, RecordingWriter, save_recording
from explorer.whatif import identity
from explorer.why import WhyLedger

from .conftest import CONFIG, PREFIX

pytestmark = pytest.mark.slow  # the tiny model runs the workload (a few seconds)


def test_a_session_keeping_two_finished_requests_loses_none(tiny_qwen3_path, tmp_path):
    s = Session(str(tiny_qwen3_path), max_finished=2, **CONFIG)
    followed = RecordingWriter(tmp_path / "followed.kvrec")
    stop_writer = followed.follow(s)
    ledger = WhyLedger()
    stop_ledger = ledger.follow(s)
    ids = []
    for i in range(12):  # a third finish in their first step, three at a time; the rest a few steps later
        ids.append(s.add_request(PREFIX[:10 + i], max_tokens=1 if i % 3 == 0 else 2 + i % 4, ignore_eos=True))
        if i % 4 == 3:
            s.step(1)
    s.run_until_idle()
    # An abort between steps, then three requests that finish in the next step's prefill: the
    # bound of 2 keeps the last two of them, and the step's entry still shows all four.
    victim = s.add_request(PREFIX, max_tokens=50, ignore_eos=True)
    s.step(2)
    aborted_after = s.current.step
    s.abort(victim)
    ids += [victim] + [s.add_request(PREFIX[:5 + i], max_tokens=1, ignore_eos=True) for i in range(3)]
    s.step(1)
    assert {r["request_id"] for r in s.current.snapshot["queues"]["finished"]} >= {victim, *ids[-3:]}
    stop_writer()
    stop_ledger()
    for e in s.history:  # the bound holds, beside the requests that finished in the entry's step (or after it)
        finished = e.snapshot["queues"]["finished"]
        assert len(finished) <= 2 + len((e.record or {}).get("finished") or ()) + (e.step == aborted_after), e.step
    for path in (followed.close(), save_recording(s, tmp_path / "saved.kvrec")):
        rec = Recording.load(path)
        assert sorted(r.request_id for r in rec.requests) == sorted(ids), path
        assert {r.request_id: r.finish_reason for r in rec.requests} == {
            i: "abort" if i == victim else "length" for i in ids}, path
        assert identity(rec, s.history).ok and identity(rec).ok, path
    assert set(ledger.requests) == set(ids)
