"""The run's one-line summary counts its preemptions and re-admissions in words that agree in
number: "1 preemption: 1 re-admission", "2 preemptions: 2 re-admissions" (it said "1 preemptions:
1 re-admissions" before)."""
from __future__ import annotations

import pytest

from explorer.why.summary import RunSummary


def _summary(preemptions: int, readmissions: int) -> RunSummary:
    return RunSummary(requests=3, prompt_tokens=120, classes={"hit": 32, "evicted": 48, "never_seen": 40},
                      readmissions=readmissions, readmission_tokens=50 * readmissions,
                      readmission_classes={"hit": 16, "recomputed": 34}, preemptions=preemptions)


def test_one_preemption_and_one_readmission_are_said_in_the_singular():
    text = _summary(1, 1).text()
    assert ". 1 preemption: 1 re-admission looked up 50 tokens again, found 16 still cached and computed 34 again" in (
        text), text
    assert "preemptions" not in text and "re-admissions" not in text


@pytest.mark.parametrize(("preemptions", "readmissions", "said"), [
    (2, 2, "2 preemptions: 2 re-admissions looked up 100 tokens again"),
    (2, 1, "2 preemptions: 1 re-admission looked up 50 tokens again"),   # one request still waits to come back
])
def test_more_than_one_are_said_in_the_plural(preemptions, readmissions, said):
    text = _summary(preemptions, readmissions).text()
    assert said in text, text


def test_no_readmission_says_nothing_of_preemptions():
    assert "preempt" not in _summary(1, 0).text()
