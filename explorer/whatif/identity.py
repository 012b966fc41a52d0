"""Identity: a recording replayed at its own settings, each request arriving at its recorded
step, must make every recorded decision again (explorer.core.recording.step_decisions: tokens
scheduled per request, the computed count each started from, prefix hits, admissions,
preemptions, finishes, every running request's block ids).

    report = identity(rec)            # against the digests in the file
    report = identity(rec, entries)   # field by field against a Session's history
    assert report.ok, report.text()
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal, get_args

from ..core.history import HistoryEntry
from ..core.recording import Recording, step_decisions
from .replay import ReplayResult, StepDetail, replay
from .settings import Variant

Field = Literal["scheduled", "new", "preempted", "finished", "tables"]   # DecisionsDict's keys
FIELDS: tuple[Field, ...] = get_args(Field)
_SAY = {"scheduled": "scheduled [request, tokens, computed before, prefix hits]", "new": "admitted",
        "preempted": "preempted", "finished": "finished in the step", "tables": "running requests' block ids"}


@dataclass
class Difference:
    """One decision of a step where the replay parted from the recording."""

    step: int
    what: str                                        # a decision (FIELDS), "digest" or "step"
    recorded: str | list[str] | list[list[object]]      # its value (DecisionsDict's), the digest, or a phrase
    replayed: str | list[str] | list[list[object]]

    def text(self) -> str:
        return f"step {self.step}: {_SAY.get(self.what, self.what)}: recorded {self.recorded}, replayed {self.replayed}"


@dataclass
class IdentityReport:
    """An identity replay's verdict: the recorded steps compared and every difference found."""

    num_steps: int                      # recorded steps compared
    differences: list[Difference] = field(default_factory=list)
    replay: ReplayResult | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.differences

    @property
    def first_step(self) -> int | None:
        return self.differences[0].step if self.differences else None

    def text(self, limit: int = 5) -> str:
        if self.ok:
            head = f"identity: {self.num_steps} of {self.num_steps} recorded steps reproduced, 0 differences"
        else:
            steps = sorted({d.step for d in self.differences})
            head = (f"identity: {len(self.differences)} differences in {len(steps)} of {self.num_steps} steps, "
                    f"the first at step {steps[0]}")
            head += "".join(f"\n  {d.text()}" for d in self.differences[:limit])
        return head + "".join(f"\n  note: {n}" for n in self.notes)


def identity(rec: Recording, entries: Iterable[HistoryEntry] | None = None, *, limit: int = 1000,
             at: Variant | None = None) -> IdentityReport:
    """Replay `rec` at its own settings with its recorded arrival steps and compare every step:
    with the file's digests, or (given the history `entries` it was written from) field by field.
    Stops collecting at `limit` differences.

    `at`: replay at that variant instead and compare with `entries` of a real run at those
    settings whose requests arrived (and were aborted) before the same steps as in `rec`: a
    what-if held to the recorded arrival steps must equal such a run, step for step."""
    if at is not None and entries is None:
        raise ValueError("identity at another setting compares with a real run at it: give its history entries")
    res = replay(rec, at, arrivals="step", digests=True, keep_steps=entries is not None)
    report = IdentityReport(num_steps=len(rec.steps), replay=res, notes=list(rec.source.notes))
    got = dict(zip(res.steps, res.details))             # each replayed step's decisions (given the entries)
    got_digest = dict(zip(res.steps, res.digests))      # and its digest
    # Each recorded step's decisions (given the entries), else its digest in the file.
    want_digest = dict(zip(rec.steps.step, rec.steps.digest)) if entries is None else {}
    if entries is not None:
        gone = rec.aborted_before()
        want = {e.step: step_decisions(e.record, e.snapshot["queues"]["running"], gone.get(e.step + 1, ()))
                for e in entries if e.record is not None}
    else:
        want = {}
    wanted = set(want) if entries is not None else set(want_digest)
    diffs = report.differences
    last = max(want, default=rec.last_step) if entries is not None else rec.last_step  # the run compared with
    for step in sorted(wanted | set(got_digest)):
        if len(diffs) >= limit:
            break
        if step not in got_digest:
            diffs.append(Difference(step, "step", "a step", "no step (the replay ran out of work, or skipped it)"))
            continue
        if step not in wanted:
            if step > last:  # past the recording's end (requests still in flight then): not recorded
                continue
            diffs.append(Difference(step, "step", "no step",
                                    f"a step ({_brief(got[step] if entries is not None else got_digest[step])})"))
            continue
        if entries is None:
            if got_digest[step] != want_digest[step]:
                diffs.append(Difference(step, "digest", want_digest[step], got_digest[step]))
            continue
        replayed = got[step].decisions
        for name in FIELDS:
            if replayed[name] != want[step][name]:
                diffs.append(Difference(step, name, want[step][name], replayed[name]))
    return report


def _brief(x: StepDetail | str) -> str:
    if isinstance(x, str):
        return "digest " + x
    return ", ".join(f"{rid} {n}" for rid, n, *_ in x.decisions["scheduled"]) or "nothing scheduled"
