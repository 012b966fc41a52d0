"""Sampler panel: a request's top candidates, their probabilities, and the token chosen."""
from __future__ import annotations

from typing import Any, ClassVar, TypedDict

import traitlets as t

from ._base import Panel, bundle_css, bundle_esm


class SamplerState(TypedDict):
    """What explorer.ui.views.sampler_state returns."""
    requests: list[str]
    request_id: str
    sample: dict


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

    requests: t.List[Any] = t.List([]).tag(sync=True)
    request_id = t.Unicode("").tag(sync=True)
    sample = t.Dict({}).tag(sync=True)

    def handle_action(self, content: dict) -> bool:
        if content.get("action") == "select":
            self.request_id = str(content.get("request_id") or "")
        return False  # the Dashboard fills `sample` for the new request
