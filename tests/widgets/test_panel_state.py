"""Each panel's state is typed once, in widgets/<panel>.py (TypedDicts, one per part its
JavaScript redraws on its own): its fields are the panel's synced traits, explorer/ui/views.py
returns exactly those fields, and the browser's copy of the field lists (widgets/_panels.js,
which the panels' listeners read) is generated from them."""
from __future__ import annotations

from typing import Any, ClassVar

import pytest

import widgets
from explorer.ui import views
from widgets import STATEFUL_PANELS
from widgets._state import JS_PATH, fields, panels_js, trait_problems


def test_the_browsers_field_lists_are_generated_from_the_state_classes() -> None:
    assert JS_PATH.read_text() == panels_js(STATEFUL_PANELS), "widgets/_panels.js is stale: python -m widgets --write"
    common = (JS_PATH.parent / "_common.js").read_text()
    for name, cls in STATEFUL_PANELS.items():
        assert cls.PARTS, f"{name} has no typed state"
        assert str(cls._esm).count(JS_PATH.read_text()) == 1, name  # every panel's ESM carries it
        own = str(cls._esm).split(common)[1]  # the panel's own file
        assert "model.on(`change:${k}`" not in own and "KVS_PANELS." in own, f"{name} spells a field list"


@pytest.mark.parametrize("name", list(STATEFUL_PANELS))
def test_every_state_field_is_a_synced_trait_of_its_type(name: str) -> None:
    assert trait_problems(STATEFUL_PANELS[name]) == []


def test_a_field_without_a_trait_or_of_another_type_is_named() -> None:
    class Planted(widgets.queues.QueuesState):
        selected: int      # a Unicode trait
        missing: list      # no trait at all

    class PlantedPanel(widgets.QueuesPanel):
        PARTS: ClassVar[dict[str, type]] = {"draw": Planted}

    assert trait_problems(PlantedPanel) == ["PlantedPanel.draw.selected: Unicode trait, annotated <class 'int'>",
                                            "PlantedPanel.draw.missing: no synced trait"]
    assert panels_js({**STATEFUL_PANELS, "queues": PlantedPanel}) != JS_PATH.read_text()


def test_views_return_exactly_the_typed_fields(fresh_session: Any) -> None:
    s = fresh_session
    s.add_request("The capital of France is", max_tokens=4, temperature=0.0)
    s.step(2)
    e = s.current
    text = views.token_texts(s.engine.tokenizer)
    from widgets.block_pool import BlockPoolState
    from widgets.latency import LatencyState
    from widgets.queues import QueuesState
    from widgets.sampler import SamplerState
    from widgets.slot_mapping import SlotMappingState
    from widgets.timeline import TimelineState

    expected: list[tuple[dict, type]] = [
        (views.queues_state(e.record, e.snapshot), QueuesState),
        (views.block_pool_state(e.record, e.snapshot), BlockPoolState),
        (views.shown_slot_mapping(e.record, e.snapshot, text), SlotMappingState),
        (views.sampler_state(s.history, e.snapshot, "", text), SamplerState),
        (views.timeline_state(s.history), TimelineState),
        (views.latency_state(e.snapshot), LatencyState),
    ]
    for state, typed in expected:
        assert set(state) == set(fields(typed)), typed.__name__
