"""Sampler panel: a request's top candidates, their probabilities, and the token chosen."""
from __future__ import annotations

from typing import ClassVar, Required, TypedDict

from ._base import Panel, bundle_css, bundle_esm

#: One candidate token: [token id, its text, its probability], the highest first.
SamplerCandidate = tuple[int, str, float]


class SamplerParams(TypedDict, total=False):
    """The request's sampling parameters the sampler shows (those its SamplingParams has)."""
    temperature: float
    top_k: int
    top_p: float
    max_tokens: int
    ignore_eos: bool
    seed: int | None


class SamplerSample(TypedDict, total=False):
    """The request's latest sample: the token chosen and the top candidates; before its first token, only `note`
    and `params`."""
    request_id: str
    step: int                      # the step that sampled it
    token_id: int | None           # None where a live feed leaves token ids out
    text: str | None
    top: list[SamplerCandidate]
    params: Required[SamplerParams]
    note: str                      # why there are no candidates, or no sample yet


class SamplerState(TypedDict):
    """What explorer.ui.views.sampler_state returns."""
    requests: list[str]
    request_id: str
    sample: SamplerSample


class SamplerPanel(Panel):
    """What the sampler saw for one request.

    `sample` is ``{request_id, step, token_id, text, top: [[token_id, text, prob]],
    params: {temperature, top_k, top_p, seed, ...}}`` (built by
    ``explorer.ui.views.sampler_state``); `step` is the displayed step, `sample["step"]`
    the step that sampled it (the latest at or before the displayed one).
    `requests` lists the ids sampled in the displayed step.
    Browser action: ``select {request_id}``.
    """

    NAME = "sampler"
    PARTS: ClassVar[dict[str, type]] = {"draw": SamplerState}
    _esm = bundle_esm("sampler.js")
    _css = bundle_css("sampler.css")


    def handle_action(self, content: dict) -> bool:
        if content.get("action") == "select":
            self.request_id = str(content.get("request_id") or "")
        return False  # the Dashboard fills `sample` for the new request
