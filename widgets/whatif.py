"""What-if panel: a recorded run and a variant of it side by side, step by step, on one slider,
with the first step where they part marked and explained in words."""
from __future__ import annotations

from typing import Any

import traitlets as t

from ._base import Panel, bundle_css, bundle_esm


class WhatIfPanel(Panel):
    """Two replays of one recording (built by ``explorer.ui.whatif_view.whatif_state``).

    `runs` is ``{"a": {label, note}, "b": {label, note}}`` ("a": the recorded settings, "b": the
    variant). `steps` holds, per run, columnar lists with one entry per step: ``step``, ``time``
    (seconds on the replay's clock, or None), ``kv_usage`` (0..1), ``free_blocks``,
    ``num_waiting``, ``num_running``, ``scheduled`` ([[request, tokens, computed before,
    prefix hits, kind]], kind 'prefill' | 'decode'), ``preempted`` ([[victim, for request]]),
    ``waiting`` ([request]) and ``finished`` ([request]). `parting` is ``{index, step_a, step_b,
    text, requests}`` (the n-th step of both where they first differ, in words) or {} when they
    never part. `index` is the slider's position (0-based, both runs' n-th step); the slider,
    the step buttons, the jump to the parting and a click on the strip move it in the browser,
    with no round trip."""

    _esm = bundle_esm("whatif.js")
    _css = bundle_css("whatif.css")

    runs = t.Dict({}).tag(sync=True)
    steps = t.Dict({}).tag(sync=True)
    parting = t.Dict({}).tag(sync=True)
    index = t.Int(0).tag(sync=True)
    notes: t.List[Any] = t.List([]).tag(sync=True)
