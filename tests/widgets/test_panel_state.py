"""Each panel's state is typed once, in widgets/<panel>.py (TypedDicts, one per part its
JavaScript redraws on its own): its fields are the panel's synced traits, explorer/ui/views.py
returns exactly those fields, and the browser's copy of the field lists (widgets/_panels.js,
which the panels' listeners read) and of their types (widgets/_panel_states.d.ts, which tsc
checks the panels' reads against) are generated from them."""
from __future__ import annotations

from typing import Any, ClassVar, Literal, NotRequired, TypedDict

import pytest

import widgets
from explorer.ui import views
from widgets import STATEFUL_PANELS
from widgets._state import (
    DTS_PATH,
    JS_PATH,
    _interface,
    fields,
    panels_dts,
    panels_js,
    trait_problems,
    ts_type,
)


def test_the_browsers_field_lists_are_generated_from_the_state_classes() -> None:
    assert JS_PATH.read_text() == panels_js(STATEFUL_PANELS), "widgets/_panels.js is stale: python -m widgets --write"
    common = (JS_PATH.parent / "_common.js").read_text()
    for name, cls in STATEFUL_PANELS.items():
        assert cls.PARTS, f"{name} has no typed state"
        assert str(cls._esm).count(JS_PATH.read_text()) == 1, name  # every panel's ESM carries it
        own = str(cls._esm).split(common)[1]  # the panel's own file
        assert "model.on(`change:${k}`" not in own and "KVS_PANELS." in own, f"{name} spells a field list"


def test_the_browsers_types_are_generated_from_the_state_classes() -> None:
    dts = DTS_PATH.read_text()
    assert dts == panels_dts(STATEFUL_PANELS), "widgets/_panel_states.d.ts is stale: python -m widgets --write"
    for name, cls in STATEFUL_PANELS.items():
        assert f'"{name}": ' + " & ".join(f"Kvs{state.__name__}" for state in cls.PARTS.values()) + ";" in dts
        for state in cls.PARTS.values():
            assert f"interface Kvs{state.__name__} {{" in dts


class Row(TypedDict):
    """A row."""
    rid: str
    hit: int | None
    kind: Literal["a", "b"]
    table: list[int]
    groups: dict[str, list[float]]
    pair: tuple[int, str]
    cells: bytes
    later: NotRequired[bool]


def test_a_state_annotation_becomes_its_typescript_type() -> None:
    named: dict[str, type] = {}
    assert ts_type(list[Row], named) == "Array<KvsRow>" and named == {"KvsRow": Row}
    assert _interface("KvsRow", Row, named).splitlines() == [
        "/** A row. */", "interface KvsRow {", "  rid: string;", "  hit: number | null;", '  kind: "a" | "b";',
        "  table: Array<number>;", "  groups: {[key: string]: Array<number>};", "  pair: [number, string];",
        "  cells: KvsBytes;", "  later?: boolean;", "}"]
    with pytest.raises(TypeError, match="no TypeScript"):
        ts_type(set[int], named)


@pytest.mark.parametrize("name", list(STATEFUL_PANELS))
def test_every_state_field_is_a_synced_trait_of_its_type(name: str) -> None:
    assert trait_problems(STATEFUL_PANELS[name]) == []


def test_a_field_not_synced_or_of_another_type_is_named() -> None:
    import traitlets as t

    class Planted(widgets.queues.QueuesState):
        selected: int      # a Unicode trait
        missing: list      # a trait the browser never hears of

    class PlantedPanel(widgets.QueuesPanel):
        PARTS: ClassVar[dict[str, type]] = {"draw": Planted}
        missing = t.List([])   # declared, and not synced

    assert trait_problems(PlantedPanel) == ["PlantedPanel.draw.selected: Unicode trait, annotated <class 'int'>",
                                            "PlantedPanel.draw.missing: no synced trait"]
    assert panels_js({**STATEFUL_PANELS, "queues": PlantedPanel}) != JS_PATH.read_text()
    assert panels_dts({**STATEFUL_PANELS, "queues": PlantedPanel}) != DTS_PATH.read_text()


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


def test_the_controls_budget_names_the_schemas_knobs() -> None:
    # widgets/ may not import the engine, so the Controls panel spells the budget's keys itself:
    # they must stay the record schema's (engine.report.schema.BudgetsDict).
    from engine.report.schema import BudgetsDict
    from widgets.controls import ControlsBudget

    assert fields(ControlsBudget) == fields(BudgetsDict)


class _Counts(TypedDict):
    """A planted panel's state: one field of each kind."""
    n: int
    label: str
    on: bool
    ids: list[str]
    table: dict[str, int]
    cells: bytes
    parked_at: int | None
    rows: list[Row]
    start: int


def test_a_panels_traits_come_from_its_state() -> None:
    # Each field becomes a synced trait of its type at its empty value (None where it may be
    # None); a trait the class declares itself (another default) is kept as declared.
    import traitlets as t

    class CountsPanel(widgets.QueuesPanel):
        PARTS: ClassVar[dict[str, type]] = {"draw": _Counts}
        start = t.Int(7).tag(sync=True)

    traits = CountsPanel.class_traits(sync=True)
    kinds = {name: (type(traits[name]).__name__, traits[name].default(), traits[name].allow_none)
             for name in fields(_Counts)}
    assert kinds == {"n": ("Int", 0, False), "label": ("Unicode", "", False), "on": ("Bool", False, False),
                     "ids": ("List", [], False), "table": ("Dict", {}, False), "cells": ("Bytes", b"", False),
                     "parked_at": ("Int", None, True), "rows": ("List", [], False), "start": ("Int", 7, False)}
    assert trait_problems(CountsPanel) == []
    panel = CountsPanel()
    panel.show({"n": 3, "parked_at": None, "rows": [{"rid": "a"}]})
    assert (panel.n, panel.parked_at, panel.get_state()["rows"]) == (3, None, [{"rid": "a"}])
