"""Each panel's state as typed classes, and the browser's copy of their fields and types.

A panel declares what it shows as TypedDicts, one per part its JavaScript redraws on its own
(`Panel.PARTS`: {part name: TypedDict}); the panel's whole state is their union, and
explorer/ui/views.py returns those types. The browser gets, generated from them by
`python -m widgets --write` (checked by tests/widgets/test_panel_state.py):
- widgets/_panels.js: each part's field list, so a panel's JavaScript listens to exactly the
  fields Python sends and never spells the lists again;
- widgets/_panel_states.d.ts: each part as a TypeScript interface (`Kvs` + its class name, with every
  TypedDict it holds) and `KvsPanelStates` (panel name -> its state), so tsc checks a panel's
  `model.get(field)` against the field's type (widgets/kvs_types.d.ts: `KvsModelOf`).
The panel's synced traits are made from the same types (`derived_traits`, when the class is
defined), so a state field is declared once.
"""
from __future__ import annotations

import collections.abc
import json
import types
import typing
from pathlib import Path
from typing import Any

import traitlets as t

JS_PATH = Path(__file__).parent / "_panels.js"
DTS_PATH = Path(__file__).parent / "_panel_states.d.ts"
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


_TS_PLAIN = {int: "number", float: "number", str: "string", bool: "boolean", type(None): "null",
             bytes: "KvsBytes", object: "unknown"}


def ts_type(hint: Any, named: dict[str, type]) -> str:
    """A Python annotation as TypeScript; each TypedDict it holds is added to `named` (by the
    interface name it gets: "Kvs" + its class name)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return "any"
    if hint in _TS_PLAIN:
        return _TS_PLAIN[hint]
    if typing.is_typeddict(hint):
        name = "Kvs" + hint.__name__
        if named.setdefault(name, hint) is not hint:
            raise TypeError(f"two panel state types are named {hint.__name__}: rename one")
        return name
    if origin is typing.Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(ts_type(a, named) for a in args)
    if origin in (list, collections.abc.Sequence) or hint is list:
        return f"Array<{ts_type(args[0], named) if args else 'unknown'}>"
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"Array<{ts_type(args[0], named)}>"
        return "[" + ", ".join(ts_type(a, named) for a in args) + "]"
    if origin in (dict, collections.abc.Mapping) or hint is dict:
        value = ts_type(args[1], named) if args else "unknown"
        return f"{{[key: string]: {value}}}"
    raise TypeError(f"no TypeScript for the panel state annotation {hint!r}")


def _interface(name: str, state: type, named: dict[str, type]) -> str:
    # NotRequired / Required read from the hints: a module's postponed annotations hide them from
    # __optional_keys__ (Python 3.11), which then says only what `total` said.
    optional = set(getattr(state, "__optional_keys__", ()))
    hints = {}
    for key, hint in typing.get_type_hints(state, include_extras=True).items():
        if typing.get_origin(hint) in (typing.NotRequired, typing.Required):
            (optional.add if typing.get_origin(hint) is typing.NotRequired else optional.discard)(key)
            hint = typing.get_args(hint)[0]
        hints[key] = hint
    doc = " ".join((state.__doc__ or "").split())
    lines = [f"/** {doc} */"] if doc else []
    lines.append(f"interface {name} {{")
    lines += [f"  {key}{'?' if key in optional else ''}: {ts_type(hint, named)};" for key, hint in hints.items()]
    return "\n".join([*lines, "}"])


def panels_dts(panels: dict[str, type]) -> str:
    """widgets/_panel_states.d.ts: every part's TypedDict (and each one they hold) as an interface, and
    KvsPanelStates: each panel's name -> its whole state (the intersection of its parts)."""
    named: dict[str, type] = {}
    states = []
    for panel, cls in panels.items():
        parts = [ts_type(state, named) for state in getattr(cls, "PARTS", {}).values()]
        if parts:
            states.append(f"  {json.dumps(panel)}: {' & '.join(parts)};")
    out: list[str] = []
    done: set[str] = set()
    while len(done) < len(named):   # interfaces met while writing others are written too
        for name, state in list(named.items()):
            if name not in done:
                done.add(name)
                out.append(_interface(name, state, named))
    return ("// Generated from the panels' state classes (widgets/<panel>.py PARTS) by `python -m widgets --write`:\n"
            "// do not edit. Each part of a panel's state as tsc sees it (widgets/kvs_types.d.ts: KvsModelOf).\n\n"
            + "\n\n".join(out) + "\n\n/** Each panel's state by the panel's name. */\ninterface KvsPanelStates {\n"
            + "\n".join(states) + "\n}\n")


GENERATED = {JS_PATH: panels_js, DTS_PATH: panels_dts}


def _base_type(hint: Any) -> tuple[Any, bool]:
    """(the annotation's base class, whether it allows None): `list[int] | None` -> (list, True)."""
    if typing.get_origin(hint) in (typing.NotRequired, typing.Required):
        hint = typing.get_args(hint)[0]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        base, _ = _base_type(rest[0]) if len(rest) == 1 else (object, False)
        return base, len(rest) < len(args)
    if origin is typing.Literal:
        return type(args[0]), False
    if typing.is_typeddict(hint):
        return dict, False
    base = origin or hint
    return {collections.abc.Sequence: list, collections.abc.Mapping: dict, tuple: list}.get(base, base), False


def derived_traits(panel: type) -> dict[str, t.TraitType]:
    """A synced trait for each field of the panel's PARTS that the class does not declare itself,
    of the field's type, at that type's empty value (0, "", False, [], {}, b""; None where the
    field allows None): a panel declares a trait only for another default or a trait option."""
    declared = {name for c in panel.__mro__ for name, v in vars(c).items() if isinstance(v, t.TraitType)}
    out: dict[str, t.TraitType] = {}
    for state in getattr(panel, "PARTS", {}).values():
        for name, hint in typing.get_type_hints(state, include_extras=True).items():
            if name in declared or name in out:
                continue
            base, none_ok = _base_type(hint)
            trait_cls = _TRAITS.get(base)
            if trait_cls is None:
                raise TypeError(f"{panel.__name__}: no trait for the state field {name!r} ({hint!r}): declare one")
            trait = trait_cls(None, allow_none=True) if none_ok else trait_cls()
            out[name] = trait.tag(sync=True)
    return out


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
        for path, make in GENERATED.items():
            path.write_text(make(panels))
            print(f"wrote {path}")
        return 0
    if argv == ["--check"]:
        stale = [path.name for path, make in GENERATED.items() if not path.exists() or path.read_text() != make(panels)]
        print(f"widgets/{', '.join(stale)} stale: python -m widgets --write" if stale
              else "widgets/_panels.js and widgets/_panel_states.d.ts are current")
        return 1 if stale else 0
    print("usage: python -m widgets --write | --check")
    return 2
