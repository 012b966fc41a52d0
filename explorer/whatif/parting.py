"""Where two replays of one recording part, and why, in words:

    "step 41: with num_blocks=128, req 3 is preempted to make room for req 7's decode"

Both replays are kept step by step (`replay(..., keep_steps=True)`) and compared in order (the
n-th step of one against the n-th of the other): the first step whose schedule differs (tokens
per request, the computed count each started from, prefix hits, preemptions, finishes) is the
parting. Block ids alone do not count: another pool or block size renames every block. The
sentence names the first cause found, in this order: a preemption one side made, a prefix hit
one side found, a request one side admitted (and why the other did not: not arrived yet on its
clock, max_num_seqs, the token budget, no free blocks), a chunk of another size.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..core.labels import RequestLabels
from ..core.recording import Recording
from .replay import ReplayResult, StepDetail

if TYPE_CHECKING:   # the what-if panel's type (widgets.whatif, which needs anywidget): a name only
    from widgets.whatif import PartingDict


@dataclass
class Parting:
    """The first step where two runs decided differently, in one sentence naming the requests."""

    index: int           # the position in both runs' steps (0-based)
    step_a: int
    step_b: int
    text: str
    requests: list[str]  # the requests the sentence names

    def to_dict(self) -> PartingDict:
        return {"index": self.index, "step_a": self.step_a, "step_b": self.step_b, "text": self.text,
                "requests": self.requests}


def _schedule(d: StepDetail) -> dict[str, tuple[int, int, int]]:
    return {rid: (n, before, cached) for rid, n, before, cached in d.decisions["scheduled"]}


def _same(a: StepDetail, b: StepDetail) -> bool:
    da, db = a.decisions, b.decisions
    return all(da[k] == db[k] for k in ("scheduled", "preempted", "finished"))


def first_parting(rec: Recording, a: ReplayResult, b: ReplayResult) -> Parting | None:
    """The first step where `b` (a variant) parts from `a` (usually the recording's own
    settings), explained; None when they never part."""
    for i, (da, db) in enumerate(zip(a.details, b.details)):
        if not _same(da, db):
            text, names = explain(rec, a, b, i)
            return Parting(i, da.step, db.step, text, names)
    if len(a.details) != len(b.details):
        i = min(len(a.details), len(b.details))
        longer, label = (a, a.variant.label) if len(a.details) > i else (b, b.variant.label)
        d = longer.details[i]
        return Parting(i, d.step if longer is a else -1, d.step if longer is b else -1,
                       f"after step {i}: the same schedule so far, but {label} needs more steps", [])
    return None


def _kind(rec_req: dict[str, tuple[int, int, int]], rid: str | None, prompt_len: dict[str, int]) -> str:
    if rid is None or rid not in rec_req:  # None: a preemption recorded without the request it made room for
        return "next tokens"
    n, before, _ = rec_req[rid]
    return "decode" if n == 1 and before >= prompt_len[rid] else "prefill chunk"


def explain(rec: Recording, a: ReplayResult, b: ReplayResult, i: int) -> tuple[str, list[str]]:
    """The parting step `i` in one sentence, and the requests it names."""
    da, db = a.details[i], b.details[i]
    sa, sb = _schedule(da), _schedule(db)
    prompt = {r.request_id: len(r.prompt_token_ids) for r in rec.requests}
    labels = RequestLabels()
    labels.see(r.request_id for r in sorted(rec.requests, key=lambda r: r.arrival_seq))

    def req(rid: str | None) -> str:
        """"req 3", or "req #17" for a long vLLM id (its place in the recording's arrivals)."""
        name = labels.name(str(rid))
        return f"req {name[1:] if name == f'#{rid}' else name}"

    head = f"step {db.step}: with {b.variant.label}"
    pa = {p.victim: p for p in da.preemptions}
    for p in db.preemptions:
        if p.victim not in pa:
            if p.for_request == p.victim:  # vLLM preempts the request itself when it is the last one running
                return (f"{head}, {req(p.victim)} finds no free block for its {_kind(sb, p.victim, prompt)} "
                        f"and, the last request running, is preempted itself (as recorded it kept its blocks)",
                        [p.victim])
            why = f" for {req(p.for_request)}'s {_kind(sb, p.for_request, prompt)}" if p.for_request else ""
            return (f"{head}, {req(p.victim)} is preempted to make room{why} (as recorded it kept its blocks)",
                    [p.victim])
    pb = {p.victim: p for p in db.preemptions}
    for p in da.preemptions:
        if p.victim not in pb:
            return (f"{head}, {req(p.victim)} keeps its blocks: as recorded it was preempted for "
                    f"{req(p.for_request)}'s {_kind(sa, p.for_request, prompt)}; here {db.free_blocks} blocks are "
                    "still free after the step",
                    [p.victim])
    for rid in sorted(set(sa) & set(sb)):
        if sa[rid][2] != sb[rid][2]:
            return (f"{head}, {req(rid)} finds {sb[rid][2]} of its tokens in the prefix cache instead of {sa[rid][2]} "
                    f"({_hit_cause(a, b, rid)})", [rid])
    for rid in sorted(set(sa) - set(sb)):
        return f"{head}, {req(rid)} is not scheduled (as recorded it was): {_held_back(b, i, rid)}", [rid]
    for rid in sorted(set(sb) - set(sa)):
        return (f"{head}, {req(rid)} is scheduled ({sb[rid][0]} tokens), one step before the recorded run could: "
                f"{_held_back(a, i, rid)} there", [rid])
    for rid in sorted(set(sa) & set(sb)):
        if sa[rid][:2] != sb[rid][:2]:
            return (f"{head}, {req(rid)} computes {sb[rid][0]} tokens from position {sb[rid][1]} "
                    f"instead of {sa[rid][0]} from {sa[rid][1]} ({_budget_cause(b, db)})", [rid])
    fa, fb = set(da.decisions["finished"]), set(db.decisions["finished"])
    names = sorted(fa ^ fb)
    return f"{head}, requests {names} finish in a different step", names


def _hit_cause(a: ReplayResult, b: ReplayResult, rid: str) -> str:
    sa, sb = a.variant.settings, b.variant.settings
    if not sb.enable_prefix_caching:
        return "prefix caching is off"
    if sa.block_size != sb.block_size:
        return f"hits come in whole blocks of {sb.block_size} instead of {sa.block_size}"
    return "the blocks it shares were evicted to make room, or not yet computed"


def _budget_cause(r: ReplayResult, d: StepDetail) -> str:
    s = r.variant.settings
    if d.budget_left == 0:
        return f"the token budget of {s.max_num_batched_tokens} is used up"
    if s.long_prefill_token_threshold:
        return f"the long-prefill threshold of {s.long_prefill_token_threshold} caps a chunk"
    return "an earlier step of its differs"


def _held_back(r: ReplayResult, i: int, rid: str) -> str:
    """Why `r` did not schedule `rid` at its step `i`."""
    d = r.details[i]
    s = r.variant.settings
    req = r.requests[rid]
    started = r.details[i - 1].time if i > 0 and r.details[i - 1].time is not None else None
    if r.arrivals == "timed" and started is not None and req.arrival is not None and req.arrival > started:
        return (f"it has not arrived yet on this run's clock (it arrives at {req.arrival:.3f} s, the step began at "
                f"{started:.3f} s)")
    if r.arrivals == "step" and req.arrival is not None and req.arrival > d.step:
        return f"it arrives at step {int(req.arrival)}"
    if d.preemptions:
        return "the step preempted a request, and vLLM admits none in such a step"
    if rid in d.waiting and len(d.decisions["tables"]) >= s.max_num_seqs:
        return f"max_num_seqs={s.max_num_seqs} requests are running"
    if d.budget_left == 0:
        return f"the token budget of {s.max_num_batched_tokens} is used up by the requests ahead of it"
    if rid in d.waiting:
        return f"no room in the pool for its prompt ({d.free_blocks} free blocks after the step)"
    return "it is not waiting here (finished or not yet arrived)"
