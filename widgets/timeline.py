"""Timeline panel: per-step batch composition and timings, and a per-request Gantt chart."""
from __future__ import annotations

from typing import Any, ClassVar, Literal, TypedDict

import traitlets as t

from ._base import Panel, bundle_css, bundle_esm


class TimelineSteps(TypedDict):
    """The steps as columns: entry i of each list is the i-th step's."""
    step: list[int]
    prefill: list[int]              # prefill tokens in the batch
    decode: list[int]               # decode tokens in the batch
    budget: list[int]               # the token budget (max_num_batched_tokens)
    preempted: list[int]            # requests preempted
    schedule: list[float]           # ms per phase
    prepare: list[float]
    forward: list[float]
    sample: list[float]
    update: list[float]
    backend: list[str | None]       # the attention backend's name
    graph_bucket: list[int | None]  # the CUDA graph batch size a decode step replayed (None: it ran eager)
    forward_path: list[str]         # 'eager', 'cuda_graph' or 'native_decode'
    scheduled_ahead: list[int | None]   # async scheduling: the step still running when it was scheduled
    caption: list[str]              # the step in words (explorer.ui.captions)


#: What a request did over a run of steps (a Gantt segment's kind).
GanttKind = Literal["queued", "prefill", "decode", "preempted", "stalled"]
#: One Gantt segment: [index into `requests`, first step, last step, kind, label].
GanttSegment = tuple[int, int, int, GanttKind, str]


class TimelineGantt(TypedDict):
    """The Gantt chart: one row per request, run-length segments of what it did per step."""
    requests: list[str]
    segments: list[GanttSegment]


class TimelineState(TypedDict):
    """What explorer.ui.views.timeline_state returns: per-step columns and the Gantt."""
    steps: TimelineSteps
    gantt: TimelineGantt


class TimelinePanel(Panel):
    """Steps along x, drawn as SVG.

    `steps` is columnar (one entry per step, built by ``explorer.ui.views.timeline_state``):
    step, prefill, decode (batch tokens), budget (max_num_batched_tokens), schedule,
    prepare, forward, sample (ms), preempted (count), backend (attention backend name) and
    graph_bucket (the CUDA graph batch size a decode step replayed; None when it ran eager),
    forward_path ('eager', 'cuda_graph' or 'native_decode': how the forward ran),
    scheduled_ahead (async scheduling: the step still running when this one was scheduled, its
    decode inputs placeholders for that step's tokens; None: nothing was) and caption
    (the step in words, explorer.ui.captions; shown in the bar's tooltip). The token
    chart's y axis is a square-root scale that fits the largest batch in view (a decode-only
    bar is never under 6 px); a budget far above it is marked at the top edge. The ms chart is
    cut at the 95th percentile when a step is far slower than the rest (that step is marked
    with its real time). The chart is as wide as the panel and redraws when that changes.
    `gantt` is ``{"requests": [id],
    "segments": [[request_index, first_step, last_step, kind, label]]}`` with kind in
    queued / prefill / decode / preempted / stalled. The whole run is drawn (the
    latest `window` steps, or a window around an older displayed `step`), with a cursor on
    the displayed step: scrubbing moves the cursor, not the chart. Browser action: ``scrub_step {step}``
    (click a bar to show that step everywhere).
    """

    NAME = "timeline"
    PARTS: ClassVar[dict[str, type]] = {"draw": TimelineState}
    _esm = bundle_esm("timeline.js")
    _css = bundle_css("timeline.css")

    gantt: t.Dict[str, Any] = t.Dict({"requests": [], "segments": []}).tag(sync=True)
    window = t.Int(120).tag(sync=True)
