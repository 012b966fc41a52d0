"""Why panel: why each prompt token of the selected request hit or missed the prefix cache, each
cause with the replay that proves it, its preemptions, and the run's summary."""
from __future__ import annotations

from typing import ClassVar, TypedDict

import traitlets as t

from ._base import Panel, bundle_css, bundle_esm


class WhySummaryState(TypedDict):
    """explorer.ui.why_view.summary_state: the run's classes and what the proofs found."""
    summary: dict


class WhyRequestState(TypedDict):
    """explorer.ui.why_view.request_state: the selected request's tokens, classes and causes."""
    request: dict


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

    summary = t.Dict({}).tag(sync=True)
    request = t.Dict({}).tag(sync=True)
    proving = t.Unicode("").tag(sync=True)
    prove_off = t.Unicode("").tag(sync=True)
    request_id = t.Unicode("").tag(sync=True)
