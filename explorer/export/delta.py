"""A JSON delta codec: `diff(old, new)` -> the delta that turns `old` into `new`, `patch(old,
delta)` -> `new`. The export packs each step's panel states as the delta from the step before
(explorer/export/states.py), and its page (host.js) patches them back in the browser with the
same rules, so a long run costs what changed per step, not every state again.
"""
from __future__ import annotations

import math
from typing import TypeAlias, TypedDict

#: A JSON value: what the codec compares, and what the page embeds.
JSONValue: TypeAlias = str | int | float | bool | list["JSONValue"] | dict[str, "JSONValue"] | None

# A delta is one of
#   {"=": value}                       the new value, whole
#   {"+": [items] | "text"}            a list (or string) that grew: this was appended
#   {"i": {"index": delta, ...}}       a list of the same length: these elements changed
#   {"d": {key: delta, ...}, "x": [k]} a dict: these keys changed (or are new), these left
# and "no change" is the absence of a delta (diff returns None).
#: One delta (its keys are not names, hence the functional form).
DeltaDict = TypedDict("DeltaDict", {
    "=": JSONValue,
    "+": "list[JSONValue] | str",
    "i": "dict[str, DeltaDict]",   # by the element's index, as a string (a JSON object's key)
    "d": "dict[str, DeltaDict]",
    "x": list[str],
}, total=False)


def diff(old: JSONValue, new: JSONValue) -> DeltaDict | None:
    """The delta that turns `old` into `new` (None when they are equal)."""
    if old is new and type(new) in (dict, list, str, int):  # the same object: nothing to compare
        return None
    to, tn = type(old), type(new)
    if type(old) is dict and type(new) is dict:
        changed: dict[str, DeltaDict] = {}
        for key, value in new.items():
            if key in old:
                d = diff(old[key], value)
                if d is not None:
                    changed[key] = d
            else:
                changed[key] = {"=": value}
        gone = [k for k in old if k not in new]
        if not changed and not gone:
            return None
        out: DeltaDict = {"d": changed}
        if gone:
            out["x"] = gone
        return out
    if type(old) is list and type(new) is list:
        if _same(old, new):
            return None
        n = len(old)
        if len(new) > n and _same(new[:n], old):
            return {"+": new[n:]}
        if len(new) == n and n:
            changes = {}
            for i, (a, b) in enumerate(zip(old, new)):
                d = diff(a, b)
                if d is not None:
                    changes[str(i)] = d
            # A list of dicts (requests, rows) whose every element changed a little (each
            # running request advanced) still costs least as each element's own delta.
            if len(changes) <= n // 2 or type(new[0]) is dict:
                return {"i": changes}
        return {"=": new}
    if to is tn and (old == new or (type(old) is float and type(new) is float and math.isnan(old) and math.isnan(new))):
        return None
    if type(old) is str and type(new) is str and len(old) >= 8 and len(new) > len(old) and new.startswith(old):
        return {"+": new[len(old):]}  # an output text that grew by this step's token
    return {"=": new}


def _same(a: list[JSONValue], b: list[JSONValue]) -> bool:
    """Equal lists whose elements also have the same types (1 == True == 1.0 in Python,
    but a shared or delta'd value must keep its type), at every depth: [[False]] == [[0]]
    too. The comparisons run in C; only lists that hold lists or dicts are walked."""
    if a != b or list(map(type, a)) != list(map(type, b)):
        return False
    if not {list, dict} & set(map(type, a)):
        return True  # flat (token ids, numbers): the element types above are all there is
    return all(_same_value(x, y) for x, y in zip(a, b) if type(x) is list or type(x) is dict)


def _same_value(a: JSONValue, b: JSONValue) -> bool:
    """`_same` for a nested list, or for a dict's values (equal keys and values already known; `b`
    has `a`'s type)."""
    if type(a) is list and type(b) is list:
        return _same(a, b)
    if type(a) is dict and type(b) is dict:
        return _same(list(a.values()), [b[k] for k in a])
    return a == b  # not reached: _same passes two lists or two dicts


def patch(old: JSONValue, delta: DeltaDict | None) -> JSONValue:
    """Apply a delta from `diff`; `old` is not changed (unchanged parts are shared)."""
    if delta is None:
        return old
    if "=" in delta:
        return delta["="]
    if "+" in delta:
        grown = delta["+"]
        if isinstance(old, str):
            if not isinstance(grown, str):
                raise TypeError(f"a string grows by a string, not by a {type(grown).__name__}")
            return old + grown
        if old is None or isinstance(old, (int, float)):
            raise TypeError(f"a '+' delta grows a list or a string, not a {type(old).__name__}")
        return list(old) + list(grown)
    if "i" in delta:
        if old is None or isinstance(old, (int, float)):
            raise TypeError(f"an 'i' delta changes a list's elements, not a {type(old).__name__}'s")
        out: list[JSONValue] = list(old)
        for index, sub in delta["i"].items():
            out[int(index)] = patch(out[int(index)], sub)
        return out
    if not isinstance(old, dict):
        raise TypeError(f"a 'd' delta changes a dict's keys, not a {type(old).__name__}'s")
    fields = dict(old)
    for key in delta.get("x", ()):
        fields.pop(key, None)
    for key, sub in delta.get("d", {}).items():
        fields[key] = patch(fields.get(key), sub)
    return fields
