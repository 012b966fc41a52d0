"""Each cause proven by a counterfactual replay: the same recorded run through vLLM's own
scheduler (explorer.whatif.replay), twice, differing only in what would remove the cause.

| cause | control replay | counterfactual replay | proven where the tokens ... |
|---|---|---|---|
| evicted | the recorded settings (it misses, as recorded) | a pool that evicts nothing | hit |
| below one block | a pool that evicts nothing | the same at block size 16 (8 when the run had 16) | hit |
| another hash domain | a pool that evicts nothing | the same with every cache_salt and LoRA removed | hit |
| dropped from a sliding window, cut by another group | a pool that evicts nothing | the same, one group | hit |
| without a Mamba checkpoint | the recorded settings and a pool that evicts nothing | the first, one group | hit |
| never seen | (none) | a pool that evicts nothing | still miss (confirmed, not removable) |
| a preemption | the recorded settings (the same victim and step) | a pool that evicts nothing | never preempted |

A token counts as proven only where the control misses it and the counterfactual hits it; the
rest of a class stays `unproven`, with the reason (a block of 16 still does not fill, the
admission moved, the replay at the recorded settings does not reproduce the run). Block size 16
is a size the scheduler takes; vLLM's CPU attention backend runs only multiples of 32, so for a
CPU server that replay answers what the scheduler would do, not what that server could run.
A request a Mamba group cut also has the cached state it came closest to resuming from
(explorer.why.mamba) replayed: with its prompt sharing that state's tokens it must hit them.

    from explorer.why.proof import prove
    report = prove(ledger, recording)         # fills ledger.requests[...].proofs and each preemption's proof
    print(report.text())
"""
from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ..core.history import HistoryEntry
from ..core.recording import Recording, save_recording
from ..whatif.replay import ReplayResult, replay
from ..whatif.settings import Variant
from .ledger import WhyLedger
from .mamba import NearestCheckpoint

if TYPE_CHECKING:   # the why panel's types (widgets.why, which needs anywidget): names only
    from widgets.why import ProofDict, ProofReportDict, ReplayLabelsDict


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def pool_that_evicts_nothing(rec: Recording, block_size: int) -> int:
    """Blocks enough to hold every token of every request at once (and the null block): no
    allocation ever needs to evict, and no request is ever preempted for blocks."""
    return 2 + sum(_cdiv(len(r.prompt_token_ids) + len(r.output_token_ids) + 1, block_size) for r in rec.requests)


ReplayName = Literal["recorded", "big", "small", "plain", "full", "one_group"]   # the replays a proof may compare


def _no_labels() -> ReplayLabelsDict:
    """Replays.labels of no replay: {} (ReplayLabelsDict is widgets.why's, a name only here)."""
    return {}


def tail_block_size(block_size: int) -> int:
    """The block size a below-one-block tail is tried at: 16, or half the run's where it was 16 or less."""
    return 16 if block_size > 16 else max(1, block_size // 2)


@dataclass
class Replays:
    """The replays a proof compares, each with what it changed."""

    recorded: ReplayResult
    big: ReplayResult
    small: ReplayResult | None
    plain: ReplayResult | None
    reproduces: bool                  # the replay at the recorded settings made every recorded decision
    first_difference: int | None
    labels: ReplayLabelsDict = field(default_factory=_no_labels)
    full: ReplayResult | None = None  # a sliding-window model's run with every layer full attention
    one_group: ReplayResult | None = None   # a Mamba model's at the recorded settings, every layer full attention


@dataclass
class ProofReport:
    """The counterfactual replays run for a ledger and the tokens of each cause they confirmed."""

    replays: Replays | None
    proven: dict[str, int] = field(default_factory=dict)      # class -> tokens proven
    unproven: dict[str, int] = field(default_factory=dict)
    preemptions_removed: int = 0
    preemptions: int = 0
    notes: list[str] = field(default_factory=list)

    def text(self) -> str:
        lines = []
        for k in sorted(set(self.proven) | set(self.unproven)):
            p, u = self.proven.get(k, 0), self.unproven.get(k, 0)
            lines.append(f"{k}: {p} of {p + u} tokens proven by replay" + (f", {u} unproven" if u else ""))
        if self.preemptions:
            lines.append(f"preemptions: {self.preemptions_removed} of {self.preemptions} removed by a pool that evicts "
                         "nothing")
        return "\n".join(lines + [f"note: {n}" for n in self.notes]) or "nothing to prove"

    def to_dict(self) -> ProofReportDict:
        return {"proven": dict(self.proven), "unproven": dict(self.unproven), "preemptions": self.preemptions,
                "preemptions_removed": self.preemptions_removed, "notes": list(self.notes),
                "replays": self.replays.labels.copy() if self.replays else {}}


def recording_of(entries: Iterable[HistoryEntry]) -> Recording:
    """A Session's history entries (the step-0 entry first) as a Recording, through a file."""
    with tempfile.TemporaryDirectory() as tmp:
        return Recording.load(save_recording(entries, Path(tmp) / "run.kvrec"))


def run_replays(rec: Recording) -> Replays:
    """The recorded settings, a pool that evicts nothing, that pool at a smaller block size,
    (where a request had a hash domain) that pool with every domain removed, and (a model with
    sliding-window layers) that pool with every layer full attention."""
    s = rec.settings
    recorded = replay(rec, digests=True, keep_steps=True)
    want = dict(zip(rec.steps.step, rec.steps.digest))
    bad = [st for st, d in zip(recorded.steps, recorded.digests) if st in want and want[st] != d]
    big_n = pool_that_evicts_nothing(rec, s.block_size)
    big_v = Variant(s.replace(num_blocks=big_n), (("num_blocks", big_n),), "a pool that evicts nothing")
    big = replay(rec, big_v)
    labels: ReplayLabelsDict = {"recorded": "the recorded settings",
                                "big": f"num_blocks={big_n} (a pool that evicts nothing)"}
    small = None
    bs = tail_block_size(s.block_size)
    if bs < s.block_size:
        n = pool_that_evicts_nothing(rec, bs)
        small = replay(rec, Variant(s.replace(block_size=bs, num_blocks=n), (("block_size", bs), ("num_blocks", n)),
                                    "a pool that evicts nothing"))
        labels["small"] = f"block_size={bs}, num_blocks={n} (the same pool, in blocks of {bs})"
    plain = None
    if any(r.cache_salt or r.lora_name for r in rec.requests):
        bare = dataclasses.replace(rec, requests=[dataclasses.replace(r, cache_salt=None, lora_name=None)
                                                  for r in rec.requests])
        plain = replay(bare, big_v)
        labels["plain"] = f"num_blocks={big_n}, every cache_salt and LoRA removed"
    full = None
    if s.sliding_window is not None:
        # The same model with one full-attention group: what a cut by a sliding group costs.
        every_layer_full = big_v.settings.replace(sliding_window=None, kv_cache_groups=None)
        full = replay(rec, Variant(every_layer_full, (*big_v.changed, ("sliding_window", None),
                                                      ("kv_cache_groups", None)),
                                   "a pool that evicts nothing, every layer full attention"))
        labels["full"] = f"num_blocks={big_n}, one KV cache group (every layer full attention)"
    one_group = None
    if s.kv_cache_groups is not None and "mamba" in s.kv_cache_groups:
        # The recorded pool, only the Mamba group taken away: a larger pool would also change which
        # chunks run when, and with them where the Mamba states are.
        one_group = replay(rec, Variant(s.replace(kv_cache_groups=None), (("kv_cache_groups", None),),
                                        "every layer full attention"))
        labels["one_group"] = "one KV cache group at the recorded settings (every layer full attention)"
    return Replays(recorded, big, small, plain, reproduces=not bad, first_difference=bad[0] if bad else None,
                   labels=labels, full=full, one_group=one_group)


def prove(ledger: WhyLedger, rec: Recording, replays: Replays | None = None) -> ProofReport:
    """Replay `rec` (the same run the ledger read) and prove or leave unproven each request's
    causes; writes each RequestWhy's `proofs` and each PreemptionWhy's `proof`."""
    report = ProofReport(replays=None)
    if not rec.source.pristine:
        report.notes.append("the recording began after the engine had run (its pool held cached blocks): a replay "
                            "starts from an empty pool, so no cause is proven")
        _all_unproven(ledger, report, "the recording began mid-run")
        return report
    replays = replays or run_replays(rec)
    report.replays = replays
    if not replays.reproduces:
        report.notes.append(f"the replay at the recorded settings differs from the recording from step "
                            f"{replays.first_difference}: causes are proven against the replay's own misses")
    bs_small = tail_block_size(rec.settings.block_size)
    checkpoints_left, skipped = MAX_CHECKPOINT_REPLAYS, 0
    for rid, why in ledger.requests.items():
        a = why.first
        if a is None or rid not in replays.recorded.requests:
            continue
        hits = {name: _hits(r, rid) for name, r in (("recorded", replays.recorded), ("big", replays.big),
                                                    ("small", replays.small), ("plain", replays.plain),
                                                    ("full", replays.full), ("one_group", replays.one_group))}
        why.proofs = {}
        causes: tuple[tuple[str, ReplayName, ReplayName, str], ...] = (
            ("evicted", "recorded", "big", "hit with a pool that evicts nothing"),
            ("below_block", "big", "small", f"hit at block size {bs_small}, where they fill a block"),
            ("other_domain", "big", "plain", "hit with every cache_salt and LoRA removed"),
            ("left_window", "big", "full", "hit with every layer attending to everything (no sliding-window group)"),
            ("no_mamba_checkpoint", "big", "one_group", "miss in a pool that evicts nothing and hit with every layer "
                                                        "full attention at the recorded settings (no Mamba group)"),
            ("group_cut", "big", "full", "hit with every layer full attention (one KV cache group)"))
        for cls, control, treatment, words in causes:
            spans = a.positions(cls)
            if not spans:
                continue
            control_hit = hits[control]
            if cls == "no_mamba_checkpoint" and control_hit is not None and hits["recorded"] is not None:
                # Missed at the recorded settings too: the one-group replay keeps the recorded pool,
                # and a larger one would also move the chunks, and with them the states.
                control_hit = max(control_hit, hits["recorded"])
            why.proofs[cls] = _prove_spans(spans, control_hit, hits[treatment], replays, control, treatment, words)
        if a.checkpoint is not None and "no_mamba_checkpoint" in why.proofs:
            if checkpoints_left:
                checkpoints_left -= 1
                _prove_checkpoint(rec, rid, a.checkpoint, a.step, why.proofs["no_mamba_checkpoint"])
            else:
                skipped += 1
        never = a.positions("never_seen")
        if never:
            still = sum(max(0, e - max(s, hits["big"] or 0)) for s, e in never) if hits["big"] is not None else 0
            why.proofs["never_seen"] = {"verdict": "confirmed" if still == sum(e - s for s, e in never) else "unproven",
                                        "tokens": sum(e - s for s, e in never), "proven": still,
                                        "replay": replays.labels["big"],
                                        "says": "still missed with a pool that evicts nothing: no setting removes it"}
        for cls, proof in why.proofs.items():
            if cls == "never_seen":
                continue
            report.proven[cls] = report.proven.get(cls, 0) + proof["proven"]
            report.unproven[cls] = report.unproven.get(cls, 0) + proof["tokens"] - proof["proven"]
    if skipped:
        report.notes.append(f"the Mamba checkpoint that {skipped} more requests came closest to was not replayed "
                            f"(one replay each, {MAX_CHECKPOINT_REPLAYS} at most)")
    _prove_preemptions(ledger, replays, report)
    return report


def _prove_checkpoint(rec: Recording, rid: str, near: NearestCheckpoint, admitted: int, proof: ProofDict) -> None:
    """Replay `rec` with request `rid`'s prompt sharing the first `near.checkpoint.tokens` tokens
    of the checkpoint's request: admitted at the recorded step (`admitted`), it must hit at least
    that many (it resumes from that state). What the replay said goes into `proof` (`resumed`:
    its hit); a request the longer shared prefix lets in at another step meets another pool: short
    of the state there, the replay says so without a verdict on it."""
    c = near.checkpoint
    src, req = rec.request(c.request_id), rec.request(rid)
    # The same length (a state before the prompt's last token was chosen): the same blocks to find.
    prompt = (src.prompt_token_ids + src.output_token_ids)[:c.tokens] + req.prompt_token_ids[c.tokens:]
    moved = replay(dataclasses.replace(rec, requests=[dataclasses.replace(r, prompt_token_ids=prompt)
                                                      if r.request_id == rid else r for r in rec.requests]))
    got, step = _hits(moved, rid), moved.requests[rid].first_scheduled_step if rid in moved.requests else None
    proof["resumed"] = got
    said = f"; with its prompt sharing #{c.request_id}'s first {c.tokens} tokens, the replay at the recorded settings"
    if got is not None and got >= c.tokens:
        proof["says"] += f"{said} hit {got}: it resumed from that state"
    elif step != admitted:
        proof["says"] += (f"{said} admitted it at step {step}, not {admitted}, and hit {got}: another pool, so it "
                          "shows nothing of this one")
    else:
        proof["says"] += f"{said} hit {got}, not the {c.tokens} expected"
        proof["verdict"], proof["proven"] = "unproven", 0


# A Mamba group's nearest checkpoint costs one replay per request it cut: at most this many.
MAX_CHECKPOINT_REPLAYS = 16


def _hits(res: ReplayResult | None, rid: str) -> int | None:
    if res is None or rid not in res.requests or res.requests[rid].first_scheduled_step is None:
        return None
    return res.requests[rid].num_cached_tokens


def _prove_spans(spans: list[tuple[int, int]], control: int | None, treatment: int | None, replays: Replays,
                 control_name: ReplayName, treatment_name: ReplayName, words: str) -> ProofDict:
    tokens = sum(e - s for s, e in spans)
    proof: ProofDict = {"tokens": tokens, "control": replays.labels.get(control_name),
                        "replay": replays.labels.get(treatment_name), "control_hit": control, "replay_hit": treatment,
                        "verdict": "unproven", "proven": 0, "says": ""}
    if control is None or treatment is None:
        proof["says"] = ("not replayed" if treatment_name not in replays.labels else
                         "the replay never admitted this request")
        return proof
    proven = sum(max(0, min(e, treatment) - max(s, control)) for s, e in spans)
    says = f"{proven} of {tokens} tokens {words} ({treatment} hit there, {control} in the control)"
    if proven < tokens:
        says += "; the rest " + ("miss in both" if treatment <= min(s for s, _ in spans) else "do not fill a block "
                                 "there or miss for another cause")
    proof["verdict"] = "proven" if proven == tokens else "partly proven" if proven else "unproven"
    proof["proven"], proof["says"] = proven, says
    return proof


def _prove_preemptions(ledger: WhyLedger, replays: Replays, report: ProofReport) -> None:
    by_step = {d.step: d for d in replays.recorded.details}
    for p in ledger.preemptions:
        report.preemptions += 1
        detail = by_step.get(p.step)
        same = [x for x in (detail.preemptions if detail else []) if x.victim == p.victim]
        big = replays.big.requests.get(p.victim)
        removed = big is not None and big.num_preemptions == 0
        p.proof = {"replayed": bool(same), "for_request": same[0].for_request if same else None,
                   "removed": removed, "replay": replays.labels["big"],
                   "verdict": "proven" if same and removed else "unproven",
                   "says": (f"vLLM's scheduler preempts #{p.victim} at step {p.step} again at the recorded settings"
                            + (f" (for #{same[0].for_request})" if same and same[0].for_request else "")
                            if same else f"the replay at the recorded settings does not preempt #{p.victim} at step "
                            f"{p.step}") + ("; with a pool that evicts nothing it is never preempted" if removed else
                                            "; a larger pool does not remove it")}
        if same and same[0].for_request and p.for_request is None:
            p.for_request = same[0].for_request
        report.preemptions_removed += int(p.proof["verdict"] == "proven")


def _all_unproven(ledger: WhyLedger, report: ProofReport, why_not: str) -> None:
    for why in ledger.requests.values():
        a = why.first
        if a is None:
            continue
        why.proofs = {cls: {"verdict": "unproven", "tokens": n, "proven": 0, "says": why_not}
                      for cls, n in a.classes.items() if cls != "hit" and n}
        for cls, n in a.classes.items():
            if cls not in ("hit", "never_seen") and n:
                report.unproven[cls] = report.unproven.get(cls, 0) + n
