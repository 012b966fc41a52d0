"""A run in one line: where the prompt tokens that missed the prefix cache went.

    "62% of missed prompt tokens were evicted; 30% were below one block; 8% were never seen"

Counted over first admissions (every request's prompt, as vLLM's own prefix-cache counters count
them); re-admissions after preemptions are counted apart (their hits and recomputed tokens).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from .model import CLASS_KEYS, LABELS, PreemptionWhy, RequestWhy, fraction_text

if TYPE_CHECKING:   # the why panel's types (widgets.why, which needs anywidget): names only
    from widgets.why import RunSummaryDict, SummaryRowDict


class LedgerView(Protocol):
    """What a summary reads of a run's why-ledger (explorer.why.ledger.WhyLedger, which builds summaries)."""
    requests: dict[str, RequestWhy]
    preemptions: list[PreemptionWhy]
    block_size: int | None
    notes: list[str]
    engine: str | None


@dataclass
class RunSummary:
    """A run's prompt tokens by class over first admissions, re-admissions counted apart."""

    requests: int = 0                 # admitted at least once
    prompt_tokens: int = 0            # their prompts (first admissions' lookups)
    classes: dict[str, int] = field(default_factory=dict)
    readmissions: int = 0
    readmission_tokens: int = 0       # what re-admissions looked up (prompt and generated tokens)
    readmission_classes: dict[str, int] = field(default_factory=dict)
    preemptions: int = 0
    hittable_tokens: int = 0          # prompt tokens in blocks a lookup may hit (the last token's block excluded)
    engine: str | None = None
    notes: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, ledger: LedgerView, step: int | None = None) -> RunSummary:
        """The run's summary, or as it stood after `step` (admissions and preemptions up to it)."""
        upto = (lambda s: True) if step is None else (lambda s: s <= step)
        s = cls(engine=ledger.engine, notes=list(ledger.notes),
                preemptions=sum(1 for p in ledger.preemptions if upto(p.step)))
        bs = ledger.block_size or 1
        for why in ledger.requests.values():
            for a in why.admissions:
                if not upto(a.step):
                    continue
                into = s.classes if not a.resumed else s.readmission_classes
                for k, n in a.classes.items():
                    into[k] = into.get(k, 0) + n
                if a.resumed:
                    s.readmissions += 1
                    s.readmission_tokens += a.tokens
                else:
                    s.requests += 1
                    s.prompt_tokens += a.tokens
                    s.hittable_tokens += (a.tokens - 1) // bs * bs
        return s

    @property
    def hit_tokens(self) -> int:
        return self.classes.get("hit", 0)

    @property
    def hit_rate(self) -> float | None:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else None

    def text(self) -> str:
        if not self.requests:
            return "no request was admitted yet"
        rate = self.hit_rate or 0.0
        head = (f"{self.requests} requests, {self.prompt_tokens} prompt tokens, {self.hit_tokens} hit "
                f"({100 * rate:.0f}%); {fraction_text(self.classes)}")
        if self.readmissions:
            again = self.readmission_classes
            head += (f". {self.preemptions} preemption{'s' if self.preemptions != 1 else ''}: {self.readmissions} "
                     f"re-admission{'s' if self.readmissions != 1 else ''} looked up "
                     f"{self.readmission_tokens} tokens again, found {again.get('hit', 0)} still cached and computed "
                     f"{again.get('recomputed', 0)} again")
        return head

    def rows(self) -> list[SummaryRowDict]:
        """One row per class: tokens and share of the prompt tokens (first admissions)."""
        return [{"class": k, "label": LABELS[k], "tokens": self.classes.get(k, 0),
                 "share": self.classes.get(k, 0) / self.prompt_tokens if self.prompt_tokens else 0.0}
                for k in CLASS_KEYS if self.classes.get(k)]

    def to_dict(self) -> RunSummaryDict:
        return {"requests": self.requests, "prompt_tokens": self.prompt_tokens, "classes": dict(self.classes),
                "readmissions": self.readmissions, "readmission_tokens": self.readmission_tokens,
                "readmission_classes": dict(self.readmission_classes), "preemptions": self.preemptions,
                "hittable_tokens": self.hittable_tokens, "hit_rate": self.hit_rate, "text": self.text(),
                "engine": self.engine, "notes": list(self.notes)}
