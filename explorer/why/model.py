"""What the why-view says about a run: each admission's prompt tokens in classes, the evictions
and preemptions behind them, and (after `prove`) the replay that confirms each cause.

Every admission's classes partition the tokens its prefix-cache lookup covered (the prompt at a
request's first admission; prompt and generated tokens at a re-admission after a preemption):
`sum(classes.values()) == tokens`, checked by `RequestWhy.check()`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict

from .chains import Domain
from .mamba import NearestCheckpoint

if TYPE_CHECKING:   # the why panel's types (widgets.why, which needs anywidget): names only
    from widgets.why import PreemptionProofDict, ProofDict

# The classes, in the order the panels and the summary list them: (key, label, what it means).
CLASSES = (
    ("hit", "hit", "found in the prefix cache: a cached block of the same prefix"),
    ("below_block", "below one block",
     "an earlier request had these tokens, but they do not fill a block of this prompt (a shared prefix that "
     "ends inside a block, the prompt's last partial block, or the last block of a prompt vLLM had whole: it "
     "always computes the last prompt token)"),
    ("never_seen", "never seen", "no earlier request had computed this prefix"),
    ("evicted", "evicted", "this prefix was cached, and its block was evicted (reused for another request) "
                           "before this request came"),
    ("other_domain", "another hash domain",
     "the same tokens were cached under another cache_salt or LoRA adapter: their block hashes differ"),
    ("recomputed", "recomputed after preemption",
     "tokens this request had computed before it was preempted, computed again at its re-admission"),
    ("caching_off", "prefix caching off", "an earlier request had this prefix, but prefix caching was off"),
    ("left_window", "dropped from a sliding window",
     "the full-attention layers had this prefix cached, but a sliding-window group kept none of the blocks its hit "
     "needs here: as the earlier request computed past these tokens they left that group's window, and vLLM frees "
     "a block that leaves the window (or never gives it one); a hit must hold in every group, so the request's hit "
     "is that group's shorter one"),
    ("no_mamba_checkpoint", "without a Mamba checkpoint",
     "the full-attention layers had this prefix cached, but a Mamba group resumes only from a state cached at a "
     "block boundary, and vLLM's align mode caches one only where a prompt's chunk ended there (by default the "
     "prompt's last whole block): no cached state lay within these tokens, so the Mamba group hit less, and a hit "
     "must hold in every group (vLLM issue 45238)"),
    ("group_cut", "cut by another KV cache group",
     "the full-attention layers had this prefix cached, but another KV cache group hit a shorter one, and a hit "
     "must hold in every group: the request's hit is the shortest of the groups'"),
)
CLASS_KEYS = tuple(c[0] for c in CLASSES)
LABELS = {c[0]: c[1] for c in CLASSES}
MEANINGS = {c[0]: c[2] for c in CLASSES}
MISS_KEYS = tuple(k for k in CLASS_KEYS if k != "hit")


class EvictionDict(TypedDict):
    """`Eviction.to_dict()`."""
    step: int
    block: int
    hash: str | None
    by: str | None
    free_step: int | None
    lru_age_steps: int | None
    lru_age_s: float | None


class DivergenceDict(TypedDict):
    """`Divergence.to_dict()`."""
    position: int
    token: int
    other_request: str | None
    other_token: int | None
    shared: int


class AdmissionDict(TypedDict):
    """`Admission.to_dict()`."""
    step: int
    tokens: int
    hit: int
    resumed: bool
    classes: dict[str, int]            # class key (CLASS_KEYS) -> tokens
    spans: list[list[int | str]]       # Span.to_list(): [start, end, class, detail]
    evictions: list[EvictionDict]
    divergence: DivergenceDict | None
    seen: int
    seen_by: str | None
    lost: int
    notes: list[str]


class PreemptionWhyDict(TypedDict):
    """`PreemptionWhy.to_dict()`."""
    step: int
    victim: str
    lost_tokens: int
    for_request: str | None
    for_work: str | None
    needed_blocks: int
    free_blocks_before: int
    num_blocks: int
    running_before: int
    freed_blocks: list[int]
    recomputed_tokens: int | None
    readmitted_step: int | None
    proof: PreemptionProofDict | None


class RequestWhyDict(TypedDict):
    """`RequestWhy.to_dict()`."""
    request_id: str
    prompt_len: int
    domain: list[str | None]           # [cache_salt, lora_name]
    why: str
    admissions: list[AdmissionDict]
    preemptions: list[PreemptionWhyDict]
    proofs: dict[str, ProofDict]       # class key -> its proof


@dataclass
class Eviction:
    """A cached block evicted: reused by `by`'s allocation in `step`, `lru_age_steps` steps (and
    `lru_age_s` seconds of the wall clock) after it joined the free queue, at `free_step`."""

    step: int
    block: int
    hash: str | None
    by: str | None
    free_step: int | None = None
    lru_age_steps: int | None = None
    lru_age_s: float | None = None

    def to_dict(self) -> EvictionDict:
        return {"step": self.step, "block": self.block, "hash": self.hash, "by": self.by, "free_step": self.free_step,
                "lru_age_steps": self.lru_age_steps, "lru_age_s": self.lru_age_s}

    def text(self) -> str:
        who = f"#{self.by}'s allocation" if self.by is not None else "an allocation"
        age = ""
        if self.lru_age_steps is not None:
            secs = f", {self.lru_age_s:.2f} s" if self.lru_age_s is not None else ""
            age = f" after {self.lru_age_steps} steps in the free queue{secs}"
        return f"block {self.block} ({self.hash or 'no hash'}) evicted at step {self.step} by {who}{age}"


@dataclass
class Divergence:
    """Where a prompt leaves the longest prefix an earlier request had computed: `position`, this
    prompt's token there and the other's (None where the other's tokens ended there)."""

    position: int
    token: int
    other_request: str | None
    other_token: int | None
    shared: int                   # tokens shared before it (== position)

    def to_dict(self) -> DivergenceDict:
        return {"position": self.position, "token": self.token, "other_request": self.other_request,
                "other_token": self.other_token, "shared": self.shared}


@dataclass
class Span:
    """Positions [start, end) of one class; `detail` says which block event or request it comes from."""

    start: int
    end: int
    cls: str
    detail: str = ""

    def to_list(self) -> list[int | str]:
        return [self.start, self.end, self.cls, self.detail]


@dataclass
class Admission:
    """One prefix-cache lookup of a request: when the scheduler admitted it (first, or again
    after a preemption) and why each of the tokens it looked up hit or missed."""

    step: int
    tokens: int                   # what the lookup covered (vLLM's request.num_tokens then)
    hit: int
    resumed: bool                 # a re-admission after a preemption
    classes: dict[str, int]
    spans: list[Span]
    evictions: list[Eviction] = field(default_factory=list)   # the evicted blocks behind 'evicted' tokens
    divergence: Divergence | None = None
    seen: int = 0                 # the longest prefix an earlier request had computed
    seen_by: str | None = None    # who had it
    lost: int = 0                 # a re-admission: the tokens its preemption freed
    notes: list[str] = field(default_factory=list)
    checkpoint: NearestCheckpoint | None = None   # cut by a Mamba group: the cached state it came closest to

    def positions(self, cls: str) -> list[tuple[int, int]]:
        return [(s.start, s.end) for s in self.spans if s.cls == cls]

    def to_dict(self) -> AdmissionDict:
        return {"step": self.step, "tokens": self.tokens, "hit": self.hit, "resumed": self.resumed,
                "classes": dict(self.classes), "spans": [s.to_list() for s in self.spans],
                "evictions": [e.to_dict() for e in self.evictions],
                "divergence": self.divergence.to_dict() if self.divergence else None, "seen": self.seen,
                "seen_by": self.seen_by, "lost": self.lost, "notes": list(self.notes)}


@dataclass
class PreemptionWhy:
    """vLLM (or kvscope's engine) preempted `victim` in `step`: it lost `lost_tokens` computed
    tokens, because the running request `for_request` found no free block for its next tokens
    (`for_work`: 'decode' or 'prompt chunk'; both schedulers preempt only for running requests:
    a waiting one that does not fit just waits), with the pool as it was before the step."""

    step: int
    victim: str
    lost_tokens: int
    for_request: str | None
    for_work: str | None
    needed_blocks: int
    free_blocks_before: int
    num_blocks: int
    running_before: int
    freed_blocks: list[int]
    recomputed_tokens: int | None = None   # filled when the victim is re-admitted
    readmitted_step: int | None = None
    proof: PreemptionProofDict | None = None

    def to_dict(self) -> PreemptionWhyDict:
        return {"step": self.step, "victim": self.victim, "lost_tokens": self.lost_tokens,
                "for_request": self.for_request, "for_work": self.for_work, "needed_blocks": self.needed_blocks,
                "free_blocks_before": self.free_blocks_before, "num_blocks": self.num_blocks,
                "running_before": self.running_before, "freed_blocks": self.freed_blocks,
                "recomputed_tokens": self.recomputed_tokens, "readmitted_step": self.readmitted_step,
                "proof": self.proof}

    def text(self, at: int | None = None) -> str:
        """In words; `at`: as known at that step (a re-admission after it is not said)."""
        need = f"{self.needed_blocks} block{'s' if self.needed_blocks != 1 else ''}"
        if self.for_request is None:
            cause = "the pool ran out of free blocks"
        elif self.for_request == self.victim:
            cause = f"#{self.victim} itself needed {need} for its {self.for_work or 'next tokens'} and it was the " \
                "newest running request"
        else:
            cause = f"#{self.for_request}'s {self.for_work or 'next tokens'} needed {need}"
        pool = (f"{self.free_blocks_before} of {self.num_blocks - 1} blocks free, {self.running_before} running "
                "before the step")
        text = (f"step {self.step}: #{self.victim} preempted, losing {self.lost_tokens} computed tokens: {cause} "
                f"({pool}); it freed {len(self.freed_blocks)} blocks")
        if self.recomputed_tokens is not None and (at is None or (self.readmitted_step or 0) <= at):
            text += f"; re-admitted at step {self.readmitted_step}, it computed {self.recomputed_tokens} tokens again"
        return text


@dataclass
class RequestWhy:
    """One request's why: its admissions (each prompt token's class), its preemptions, proofs."""

    request_id: str
    prompt_len: int
    domain: Domain = (None, None)   # (cache_salt, lora_name)
    admissions: list[Admission] = field(default_factory=list)
    preemptions: list[PreemptionWhy] = field(default_factory=list)
    proofs: dict[str, ProofDict] = field(default_factory=dict)   # class -> proof (explorer.why.proof)

    @property
    def first(self) -> Admission | None:
        return self.admissions[0] if self.admissions else None

    def check(self) -> None:
        """Every admission's classes sum to the tokens it looked up; the first's to the prompt."""
        for a in self.admissions:
            total = sum(a.classes.values())
            if total != a.tokens:
                raise AssertionError(f"request {self.request_id}, admission at step {a.step}: classes {a.classes} "
                                     f"sum to {total}, not its {a.tokens} tokens")
            covered = sum(s.end - s.start for s in a.spans)
            if covered != a.tokens or any(x.end != y.start for x, y in zip(a.spans, a.spans[1:])):
                raise AssertionError(f"request {self.request_id}, step {a.step}: spans do not tile 0..{a.tokens}")
        if self.admissions and self.admissions[0].tokens != self.prompt_len:
            raise AssertionError(f"request {self.request_id}: its first admission looked up "
                                 f"{self.admissions[0].tokens} tokens, its prompt has {self.prompt_len}")

    def why(self) -> str:
        """The why column in a few words: the biggest miss class of the first admission."""
        a = self.first
        if a is None:
            return "not admitted yet"
        misses = [(n, k) for k, n in a.classes.items() if k != "hit" and n]
        if not misses:
            return "all hit"
        n, k = max(misses)
        head = f"{a.hit} hit" if a.hit else "0 hit"
        return f"{head}; {n} {LABELS[k]}" + (" +" if len(misses) > 1 else "")

    def to_dict(self) -> RequestWhyDict:
        return {"request_id": self.request_id, "prompt_len": self.prompt_len, "domain": list(self.domain),
                "why": self.why(), "admissions": [a.to_dict() for a in self.admissions],
                "preemptions": [p.to_dict() for p in self.preemptions], "proofs": dict(self.proofs)}


def fraction_text(counts: dict[str, int]) -> str:
    """"62% of missed prompt tokens were evicted; 30% were below one block" from class counts."""
    missed = sum(n for k, n in counts.items() if k != "hit")
    if not missed:
        return "no prompt token missed the prefix cache"
    parts = [(n, k) for k, n in counts.items() if k != "hit" and n]
    parts.sort(reverse=True)
    said = [f"{100 * n / missed:.0f}% {'of missed prompt tokens ' if i == 0 else ''}were {LABELS[k]}"
            for i, (n, k) in enumerate(parts)]
    return "; ".join(said)


@dataclass
class Node:
    """One cached prefix (a block's content key): the prefix tree's node. `hash` is the engine's
    own id for it (the pool's 16 hex digits); `stored` the steps it was cached in (again after an
    eviction), `evictions` each time its block was reused, `hits` each admission that hit it."""

    key: bytes
    parent: bytes | None
    depth: int                     # its block index in the prompt
    tokens: tuple[int, ...]
    domain: Domain
    first_by: str
    hash: str | None = None
    stored: list[int] = field(default_factory=list)
    evictions: list[Eviction] = field(default_factory=list)
    hits: list[tuple[int, str]] = field(default_factory=list)
    present: int = 0               # blocks holding it after the latest step the ledger read

    def present_at(self, step: int) -> bool:
        stored = sum(1 for s in self.stored if s <= step)
        return stored > sum(1 for e in self.evictions if e.step <= step)

    def hits_until(self, step: int) -> int:
        return sum(1 for s, _ in self.hits if s <= step)
