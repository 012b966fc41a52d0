"""What-if panel: a recorded run and a variant of it side by side, step by step, on one slider,
with the first step where they part marked and explained in words."""
from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, TypedDict

import traitlets as t

from ._base import Panel, bundle_css, bundle_esm


class WhatIfRunDict(TypedDict):
    """One run's columns, one entry per step (the panel's `steps` entry)."""
    step: list[int]
    time: list[float | None]            # seconds on the replay's clock (None: not timed)
    kv_usage: list[float]               # 0..1
    free_blocks: list[int]
    num_waiting: list[int]
    num_running: list[int]
    scheduled: list[list[list[str | int]]]   # per step: [request, tokens, computed before, prefix hits, kind]
    preempted: list[list[list[str | None]]]  # per step: [victim, for request]
    waiting: list[list[str]]
    finished: list[list[str]]


class WhatIfRunLabelDict(TypedDict):
    """What a run is (the panel's `runs` entry): its label, and its settings (explorer.core.recording.SettingsDict)."""
    label: str
    settings: Mapping[str, object]   # SettingsDict (core/recording.py's, which reads it at run time): never read here


class WhatIfRunsDict(TypedDict):
    """Both runs' labels: "a" at the recorded settings, "b" the variant."""
    a: WhatIfRunLabelDict
    b: WhatIfRunLabelDict


class WhatIfStepsDict(TypedDict):
    """Both runs' columns."""
    a: WhatIfRunDict
    b: WhatIfRunDict


class PartingDict(TypedDict):
    """Where the runs first part (explorer.whatif.parting.Parting.to_dict()): the n-th step of both, in words."""
    index: int
    step_a: int
    step_b: int
    text: str
    requests: list[str]


class NoPartingDict(TypedDict):
    """A `parting` of runs that never part (within the steps shown): {}."""


class WhatIfStateDict(TypedDict):
    """`whatif_state` (explorer.ui.whatif_view): the WhatIfPanel's traits."""
    runs: WhatIfRunsDict
    steps: WhatIfStepsDict
    parting: PartingDict | NoPartingDict   # where they first part ({} when they never do, within max_steps)
    index: int                                   # the slider's start: the parting's index (else 0)
    notes: list[str]


class WhatIfPanel(Panel):
    """Two replays of one recording (built by ``explorer.ui.whatif_view.whatif_state``).

    `runs` is ``{"a": {label, settings}, "b": {label, settings}}`` ("a": the recorded settings, "b": the
    variant). `steps` holds, per run, columnar lists with one entry per step: ``step``, ``time``
    (seconds on the replay's clock, or None), ``kv_usage`` (0..1), ``free_blocks``,
    ``num_waiting``, ``num_running``, ``scheduled`` ([[request, tokens, computed before,
    prefix hits, kind]], kind 'prefill' | 'decode'), ``preempted`` ([[victim, for request]]),
    ``waiting`` ([request]) and ``finished`` ([request]). `parting` is ``{index, step_a, step_b,
    text, requests}`` (the n-th step of both where they first differ, in words) or {} when they
    never part. `index` is the slider's position (0-based, both runs' n-th step); the slider,
    the step buttons, the jump to the parting and a click on the strip move it in the browser,
    with no round trip."""

    NAME = "whatif"
    IN_DASHBOARD = False  # a page or a cell of its own (explorer.ui.whatif_view), never in the Dashboard
    PARTS: ClassVar[dict[str, type]] = {"draw": WhatIfStateDict}
    _esm = bundle_esm("whatif.js")
    _css = bundle_css("whatif.css")

    parting = t.Dict({}).tag(sync=True)
