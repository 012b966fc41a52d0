"""Why panel: why each prompt token of the selected request hit or missed the prefix cache, each
cause with the replay that proves it, its preemptions, and the run's summary."""
from __future__ import annotations

from typing import ClassVar, Literal, NotRequired, TypeAlias, TypedDict

import traitlets as t

from ._base import Panel, bundle_css, bundle_esm


# -- the run's summary ------------------------------------------------------------------------------
class ClassLookDict(TypedDict):
    """One miss class as the why panel's legend shows it (explorer.why.CLASSES)."""
    key: str
    label: str
    tip: str


# One row of RunSummary.rows(), a class's tokens ("class" is a keyword: the functional form).
SummaryRowDict = TypedDict("SummaryRowDict", {
    "class": str,      # the class key (CLASS_KEYS)
    "label": str,
    "tokens": int,
    "share": float,    # of the first admissions' prompt tokens
})
SummaryRowDict.__doc__ = "One row of RunSummary.rows(): a class's tokens and their share of the prompt tokens."


class RunSummaryDict(TypedDict):
    """`RunSummary.to_dict()` (explorer.why.summary): the run's classes, first admissions and re-admissions."""
    requests: int
    prompt_tokens: int
    classes: dict[str, int]              # class key -> tokens, first admissions
    readmissions: int
    readmission_tokens: int
    readmission_classes: dict[str, int]
    preemptions: int
    hittable_tokens: int
    hit_rate: float | None
    text: str
    engine: str | None
    notes: list[str]


class ReplayLabelsDict(TypedDict, total=False):
    """What each replay changed, by its name: 'recorded' and 'big' always, the others where they ran."""
    recorded: str     # the recorded settings
    big: str          # a pool that evicts nothing
    small: str        # that pool at a smaller block size
    plain: str        # that pool with every cache_salt and LoRA removed
    full: str         # that pool with every layer full attention
    one_group: str    # the recorded settings with every layer full attention (a model with a Mamba group)


class ProofReportDict(TypedDict):
    """`ProofReport.to_dict()` (explorer.why.proof): the tokens of each class the replays proved."""
    proven: dict[str, int]        # class key -> tokens
    unproven: dict[str, int]
    preemptions: int
    preemptions_removed: int
    notes: list[str]
    replays: ReplayLabelsDict     # Replays.labels ({}: no replay ran)


class WhySummaryDict(RunSummaryDict):
    """`summary_state`: the why panel's `summary`, RunSummary.to_dict() and what the panel adds."""
    rows: list[SummaryRowDict]
    classes_known: list[ClassLookDict]
    engine_note: str                  # a class this engine never produces, and why ("" for none)
    proof: ProofReportDict | None     # what the proofs found (None: not proved yet)


# -- the selected request ---------------------------------------------------------------------------
class ProofDict(TypedDict):
    """One class's proof for one request (RequestWhy.proofs[class])."""
    verdict: str                        # 'proven', 'partly proven', 'unproven' or (never seen) 'confirmed'
    tokens: int                         # the request's tokens of the class
    proven: int                         # those the replays confirmed
    says: str                           # the proof in words
    replay: NotRequired[str | None]     # the counterfactual replay's label (Replays.labels)
    control: NotRequired[str | None]    # the control replay's label
    control_hit: NotRequired[int | None]   # the request's prefix hit in the control (None: not admitted there)
    replay_hit: NotRequired[int | None]    # ... and in the counterfactual
    resumed: NotRequired[int | None]       # without a Mamba checkpoint: its hit with the named state's tokens shared


class PreemptionProofDict(TypedDict):
    """A preemption's proof (PreemptionWhy.proof)."""
    replayed: bool                # the replay at the recorded settings preempts the same victim at the same step
    for_request: str | None       # the request that replay preempted it for
    removed: bool                 # a pool that evicts nothing never preempts it
    replay: str
    verdict: str                  # 'proven' or 'unproven'
    says: str


class WhyDivergenceDict(TypedDict):
    """Where an admission leaves the longest prefix it shares with an earlier request, in words."""
    position: int
    text: str                   # the token it has there
    other_request: str | None
    other_text: str | None      # the other request's token there
    before: str                 # up to 12 tokens before it
    other_known: bool           # the other request is in the ledger


class WhyAdmissionDict(TypedDict):
    """One admission of the why panel's request (Admission, its evictions and divergence in words)."""
    step: int
    tokens: int
    hit: int
    resumed: bool
    classes: dict[str, int]             # class key -> tokens
    spans: list[list[int | str]]        # Span.to_list(): [start, end, class, detail]
    divergence: WhyDivergenceDict | None
    evictions: list[str]                # Eviction.text()
    lost: int
    notes: list[str]
    seen: int
    seen_by: str | None


class WhyPreemptionDict(TypedDict):
    """One preemption of the why panel's request, in words, with its proof."""
    text: str
    proof: PreemptionProofDict | None


class WhyRequestKnownDict(TypedDict):
    """`request_state` of a request admitted by the shown step: its prompt, admissions, preemptions, proofs."""
    request_id: str
    known: Literal[True]
    prompt_len: int
    why: str
    domain: str
    tokens: list[str]      # the prompt token by token, up to MAX_PROMPT_TOKENS
    tokens_cut: int        # prompt tokens past those
    admissions: list[WhyAdmissionDict]
    preemptions: list[WhyPreemptionDict]
    proofs: dict[str, ProofDict]   # class key -> its proof


class WhyRequestUnknownDict(TypedDict):
    """`request_state` of a request not admitted by the shown step: only its id."""
    request_id: str
    known: Literal[False]


class WhyNoRequestDict(TypedDict):
    """The why panel's `request` while no request is chosen: {}."""


#: `request_state`: the why panel's `request`, as the request stood after the shown step.
WhyRequestDict: TypeAlias = WhyRequestKnownDict | WhyRequestUnknownDict


class WhySummaryState(TypedDict):
    """explorer.ui.why_view.summary_state: the run's classes and what the proofs found."""
    summary: WhySummaryDict


class WhyRequestState(TypedDict):
    """explorer.ui.why_view.request_state: the selected request's tokens, classes and causes (or {}: none)."""
    request: WhyRequestKnownDict | WhyRequestUnknownDict | WhyNoRequestDict


class WhyPanel(Panel):
    """`summary` is ``{requests, prompt_tokens, classes, rows, text, readmissions, preemptions,
    classes_known: [{key, label, tip}], engine_note, proof}``; `request` is ``{request_id,
    known, prompt_len, why, domain, tokens ([text]), admissions ([{step, tokens, hit, resumed,
    classes, spans ([[start, end, class, detail]]), divergence, evictions, lost, notes}]),
    preemptions ([{text, proof}]), proofs ({class: {verdict, says, replay, ...}})}`` or {}.
    `proving` says a proof is running (or why it failed); `prove_off`, when set, why this page
    cannot prove (an export: a recording): the button is off and says so. Browser actions:
    ``prove`` (replay the run and prove each cause) and ``select {request_id}``."""

    NAME = "why"
    PARTS: ClassVar[dict[str, type]] = {"summary": WhySummaryState, "request": WhyRequestState}
    _esm = bundle_esm("why.js")
    _css = bundle_css("why.css")

    request = t.Dict({}).tag(sync=True)
    proving = t.Unicode("").tag(sync=True)
    prove_off = t.Unicode("").tag(sync=True)
    request_id = t.Unicode("").tag(sync=True)
