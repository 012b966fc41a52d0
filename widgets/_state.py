"""Each panel's state as typed classes, and the browser's copy of their fields.

A panel declares what it shows as TypedDicts, one per part its JavaScript redraws on its own
(`Panel.PARTS`: {part name: TypedDict}); the panel's whole state is their union, and
explorer/ui/views.py returns those types. The browser gets the field lists from
widgets/_panels.js, generated from them (`python -m widgets --write`, checked by
tests/widgets/test_panel_state.py), so a panel's JavaScript listens to exactly the fields
Python sends and never spells the lists again.
"""
from __future__ import annotations

import json
import typing
from pathlib import Path
from typing import Any

import traitlets as t

JS_PATH = Path(__file__).parent / "_panels.js"
# The trait class each annotation's base type syncs as.
_TRAITS = {int: t.Int, str: t.Unicode, bool: t.Bool, float: t.Float, list: t.List, dict: t.Dict, bytes: t.Bytes}


def fields(state: type) -> list[str]:
    """A TypedDict's keys, in the order it declares them (its bases' first)."""
    return list(typing.get_type_hints(state))


def parts_fields(panel: type) -> dict[str, list[str]]:
    """{part: its fields} of a panel class (empty for a panel without parts)."""
    return {name: fields(state) for name, state in getattr(panel, "PARTS", {}).items()}


def panels_schema(panels: dict[str, type]) -> dict[str, dict[str, list[str]]]:
    """What _panels.js holds: for each panel by its name, each part's fields."""
    return {name: parts_fields(cls) for name, cls in panels.items() if getattr(cls, "PARTS", None)}


def panels_js(panels: dict[str, type]) -> str:
    """widgets/_panels.js: `const KVS_PANELS = {...};`, prepended to every panel's ESM."""
    return ("// Generated from the panels' state classes (widgets/<panel>.py PARTS) by `python -m widgets --write`:\n"
            "// do not edit. Each panel's parts and the fields each redraws on (_common.js kvsOnChange).\n"
            f"const KVS_PANELS = {json.dumps(panels_schema(panels), indent=1)};\n")


def trait_problems(panel: type[t.HasTraits]) -> list[str]:
    """Where a panel's parts and its synced traits disagree: a field that is not a synced
    trait, or one whose trait is of another type than its annotation says."""
    problems = []
    traits = panel.class_traits(sync=True)
    for part, state in getattr(panel, "PARTS", {}).items():
        for name, hint in typing.get_type_hints(state).items():
            trait = traits.get(name)
            base = typing.get_origin(hint) or hint
            if base is typing.Union:  # Optional[X]: X
                base = next(typing.get_origin(a) or a for a in typing.get_args(hint) if a is not type(None))
            if trait is None:
                problems.append(f"{panel.__name__}.{part}.{name}: no synced trait")
            elif base in _TRAITS and not isinstance(trait, _TRAITS[base]):
                problems.append(f"{panel.__name__}.{part}.{name}: {type(trait).__name__} trait, annotated {hint}")
    return problems


def main(panels: dict[str, Any], argv: list[str]) -> int:
    if argv == ["--write"]:
        JS_PATH.write_text(panels_js(panels))
        print(f"wrote {JS_PATH}")
        return 0
    if argv == ["--check"]:
        ok = JS_PATH.exists() and JS_PATH.read_text() == panels_js(panels)
        print("widgets/_panels.js is current" if ok else "widgets/_panels.js is stale: python -m widgets --write")
        return 0 if ok else 1
    print("usage: python -m widgets --write | --check")
    return 2
