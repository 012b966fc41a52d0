"""TTFT / ITL panel: per-request time to first token and inter-token latency, and their
distributions, as SVG charts drawn by widgets/latency.js (the export draws them with it too)."""
from __future__ import annotations

from typing import ClassVar, TypedDict

import traitlets as t

from ._base import Panel, bundle_css, bundle_esm

EMPTY_HINT = "no steps yet: add a request and press Step"


class LatencyRowDict(TypedDict):
    """One request's row of the latency panel (explorer.ui.views.latency_rows), in seconds."""
    request_id: str
    time_to_first_token: float | None
    inter_token_latency: list[float]


class LatencyState(TypedDict):
    """What explorer.ui.views.latency_state returns."""
    rows: list[LatencyRowDict]
    clock: str
    clock_note: str


class LatencyPanel(Panel):
    """Per-request TTFT and ITL and their distributions, updating live.

    `rows`: ``[{"request_id", "time_to_first_token": seconds | None, "inter_token_latency":
    [seconds]}]`` (``explorer.ui.views.latency_state``). `clock` names the clock the times are
    on and `clock_note` says what it counts: kvscope's and in-process vLLM's engine clock
    advances only while a step executes (pauses and manual stepping do not count); a live
    server's times are its own request times. Every request is labelled on the per-request
    charts (an id over 24 characters, as vLLM names them, cut in the middle; whole in its hover
    text); with many requests the
    chart grows wider than its box, which then scrolls.
    """

    NAME = "latency"
    PARTS: ClassVar[dict[str, type]] = {"draw": LatencyState}
    _esm = bundle_esm("latency.js")
    _css = bundle_css("latency.css")

    clock = t.Unicode("engine clock").tag(sync=True)
    clock_note = t.Unicode("advances only while a step executes").tag(sync=True)
