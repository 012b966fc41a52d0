"""A compact Session history: snapshots that share what did not change, and a delta codec.

Two tools, both over the documented dict shapes (docs/architecture.md):

1. In memory: `share_unchanged(new, old)` returns `new` with every part that equals the
   same part of `old` (the previous step's snapshot) replaced by `old`'s object. The
   history stays a list of plain `HistoryEntry(step, record, snapshot)` dicts that
   callers read as before, but step k+1 no longer holds its own copy of every request's
   prompt token ids, every finished request, every unchanged KV block, the config and
   model_info: it points at step k's. What a step adds is what the step changed (the
   requests it ran, the blocks it touched) plus one list of pointers per queue and one
   per block pool. For kvscope's engine the Session does not even build the unchanged
   parts: `snapshot_after_step` builds only what the step's record says changed (the
   requests it touched, the blocks of its events and of the requests it ran or let go);
   for any other engine it shares a full snapshot with `share_unchanged`.

   Snapshots are read-only: a part of one entry may be the same object as the same part
   of its neighbours, so changing it in place changes them too (it was wrong before as
   well: history entries are frozen records of the past).

2. On the wire: `pack_history(entries)` -> JSON-able steps: the first snapshot
   whole, then per step its StepRecord plus the delta of its snapshot against the
   previous one (`diff`), with requests keyed by id and token lists sent as their new
   tail. `unpack_history(packed)` gives the entries back (equal to the originals after a
   JSON round trip). explorer/export/host.js applies the same deltas in the browser
   (explorer/export/states.py packs an export's panel states with `diff`).

`history_bytes(entries)` measures what a history holds (each object counted once,
however many entries point at it); `python -m explorer.core.history` compares a plain and a
shared history at 64 requests / 4,096 blocks.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from engine.llm_engine import LLMEngine
from engine.report import records
from engine.report.schema import BLOCK, REC, REQ, SNAP

FORMAT = "kvscope-history"
VERSION = 1

_MISSING = object()
# The keys that identify an element of a list of dicts, so a reordered or grown list
# (the waiting queue, the finished queue) still shares each element with its old self.
_ID_KEYS = (REQ.REQUEST_ID, BLOCK.BLOCK_ID)


# -- 1. in memory: structural sharing --------------------------------------------------------------
@dataclass(frozen=True)
class HistoryEntry:
    """The engine after one step: `record` is that step's StepRecord.to_dict() (None for
    the step-0 entry made before any step), `snapshot` its EngineSnapshot.to_dict()."""

    step: int
    record: dict | None
    snapshot: dict


def share_unchanged(new: Any, old: Any) -> Any:
    """`new`, with each part equal to the matching part of `old` replaced by `old`'s object.

    Equal containers (Python's ==, in C: the common case, most blocks and requests do
    not change in a step) are shared whole; unequal ones are matched part by part: dicts
    by key, lists of dicts by `request_id` / `block_id` when their elements carry one
    (else by position), scalars by type and equality. Returns `old` itself when all is
    equal. (Inside an equal container 1 and True count as equal; the engine's fields keep
    their types from step to step, so that never mixes them.) `new`'s own dicts and lists
    may be updated in place (the Session hands it a fresh `to_dict()`), so pass nothing
    you still change; only ever an equal value replaces a part.
    """
    if new is old:
        return new
    tn = type(new)
    if tn is not type(old):
        return new
    if (tn is dict or tn is list) and new == old:
        return old
    if tn is dict:
        same = len(new) == len(old)
        # A dict of lists of requests (the queues): a request that moved from one list to
        # another (waiting -> running -> finished) still shares its parts with its old self.
        pool = _id_pool(old)
        for key, value in new.items():
            prev = old.get(key, _MISSING)
            if prev is _MISSING:
                same = False
                if pool is not None and type(value) is list:
                    new[key] = _share_dict_list(value, [], pool)
                continue
            if pool is not None and type(value) is list and type(prev) is list:
                shared = _share_dict_list(value, prev, pool)
            else:
                shared = share_unchanged(value, prev)
            if shared is not value:
                new[key] = shared
            same = same and shared is prev
        return old if same else new
    if tn is list:
        if not new or not old:
            return old if (not new and not old) else new
        if type(new[0]) is dict and type(old[0]) is dict:
            return _share_dict_list(new, old)
        if type(new[0]) is list:
            same = len(new) == len(old)
            for i, value in enumerate(new):
                if i < len(old):
                    shared = share_unchanged(value, old[i])
                    if shared is not value:
                        new[i] = shared
                    same = same and shared is old[i]
            return old if same else new
        return new  # unequal scalars: nothing to share (equal ones returned above)
    return old if new == old or (tn is float and math.isnan(new) and math.isnan(old)) else new


def _id_pool(old: dict) -> dict | None:
    """{id: element} over every list of `old` when its values are lists of id-keyed dicts."""
    pool: dict = {}
    for value in old.values():
        if type(value) is not list:
            return None
        for item in value:
            if type(item) is not dict or REQ.REQUEST_ID not in item:
                return None
            pool[item[REQ.REQUEST_ID]] = item
    return pool or None


def _share_dict_list(new: list, old: list, pool: dict | None = None) -> list:
    if pool is not None:
        same = len(new) == len(old)
        for i, value in enumerate(new):
            prev = pool.get(value.get(REQ.REQUEST_ID)) if type(value) is dict else None
            if prev is None:
                same = False
                continue
            shared = share_unchanged(value, prev)
            new[i] = shared
            same = same and i < len(old) and shared is old[i]
        return old if same else new
    key = next((k for k in _ID_KEYS if k in new[0] and k in old[0]), None)
    same = len(new) == len(old)
    n_old = len(old)
    by_id: dict | None = None
    for i, value in enumerate(new):
        prev = old[i] if i < n_old else _MISSING
        if key is not None and type(value) is dict and (
                type(prev) is not dict or prev.get(key, _MISSING) != value.get(key)):
            # Not at the same position (a queue that moved on): look it up by id.
            if by_id is None:
                by_id = {item.get(key): item for item in old if type(item) is dict}
            prev = by_id.get(value.get(key), _MISSING)
        if prev is _MISSING:
            same = False
            continue
        shared = share_unchanged(value, prev)
        if shared is not value:
            new[i] = shared
        same = same and i < n_old and shared is old[i]
    return old if same else new


def snapshot_after_step(engine: Any, before: dict, record: dict) -> dict:
    """The snapshot dict of `engine` after the step whose StepRecord dict is `record`,
    sharing with `before` (the previous entry's snapshot) every part the step left alone.

    kvscope's engine builds only what the record says changed (requests the step touched,
    blocks of its events and of the requests it ran or let go: engine.report.records.
    snapshot_after_step); any other engine's full snapshot is shared part by part with
    `share_unchanged`. With `check_invariants` on, the built snapshot is compared with a
    full one, and a difference raises."""
    if not isinstance(engine, LLMEngine):
        return share_unchanged(engine.snapshot().to_dict(), before)
    snapshot = records.snapshot_after_step(before, record, engine.step_count, engine.config, engine.model_info,
                                           engine.metrics, engine.scheduler, engine.decode)
    if engine.config.check_invariants:
        full = engine.snapshot().to_dict()
        if full != snapshot:
            raise AssertionError(f"step {record[REC.STEP]}: the snapshot built from the step's changes differs "
                                 f"from the engine's full snapshot: {diff(full, snapshot)}")
    return snapshot


# -- 2. on the wire: deltas ------------------------------------------------------------------------
# A delta is one of
#   {"=": value}                       the new value, whole
#   {"+": [items] | "text"}            a list (or string) that grew: this was appended
#   {"i": {"index": delta, ...}}       a list of the same length: these elements changed
#   {"d": {key: delta, ...}, "x": [k]} a dict: these keys changed (or are new), these left
# and "no change" is the absence of a delta (diff returns None).

def diff(old: Any, new: Any) -> dict | None:
    """The delta that turns `old` into `new` (None when they are equal)."""
    if old is new and type(new) in (dict, list, str, int):  # shared by `share_unchanged`: nothing to compare
        return None
    to, tn = type(old), type(new)
    if to is dict and tn is dict:
        changed: dict = {}
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
        out: dict = {"d": changed}
        if gone:
            out["x"] = gone
        return out
    if to is list and tn is list:
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
    if to is tn and (old == new or (tn is float and math.isnan(old) and math.isnan(new))):
        return None
    if to is str and tn is str and len(old) >= 8 and len(new) > len(old) and new.startswith(old):
        return {"+": new[len(old):]}  # an output text that grew by this step's token
    return {"=": new}


def _same(a: list, b: list) -> bool:
    """Equal lists whose elements also have the same types (1 == True == 1.0 in Python,
    but a shared or delta'd value must keep its type), at every depth: [[False]] == [[0]]
    too. The comparisons run in C; only lists that hold lists or dicts are walked."""
    if a != b or list(map(type, a)) != list(map(type, b)):
        return False
    if not {list, dict} & set(map(type, a)):
        return True  # flat (token ids, numbers): the element types above are all there is
    return all(_same_value(x, y) for x, y in zip(a, b) if type(x) is list or type(x) is dict)


def _same_value(a: Any, b: Any) -> bool:
    """`_same` for a nested list, or for a dict's values (equal keys and values already known)."""
    if type(a) is list:
        return _same(a, b)
    return _same(list(a.values()), [b[k] for k in a])


def patch(old: Any, delta: dict | None) -> Any:
    """Apply a delta from `diff`; `old` is not changed (unchanged parts are shared)."""
    if delta is None:
        return old
    if "=" in delta:
        return delta["="]
    if "+" in delta:
        return old + delta["+"] if isinstance(old, str) else list(old) + list(delta["+"])
    if "i" in delta:
        out = list(old)
        for index, sub in delta["i"].items():
            out[int(index)] = patch(out[int(index)], sub)
        return out
    out = dict(old)
    for key in delta.get("x", ()):
        out.pop(key, None)
    for key, sub in delta.get("d", {}).items():
        out[key] = patch(out.get(key), sub)
    return out


def keyed(snapshot: dict) -> dict:
    """A snapshot with its queues as request-id lists plus one `_requests` map by id, so a
    request moving from waiting to running is one small delta, not two whole copies."""
    out = dict(snapshot)
    queues = out.pop(SNAP.QUEUES, None)
    if isinstance(queues, dict):
        order, requests = {}, {}
        for name, items in queues.items():
            order[name] = [r[REQ.REQUEST_ID] for r in items]
            for r in items:
                requests[r[REQ.REQUEST_ID]] = r
        out[SNAP.QUEUES] = order
        out["_requests"] = requests
    return out


def unkeyed(snapshot: dict) -> dict:
    """The inverse of `keyed`."""
    out = dict(snapshot)
    requests = out.pop("_requests", None)
    if requests is not None:
        out[SNAP.QUEUES] = {name: [requests[rid] for rid in ids] for name, ids in out[SNAP.QUEUES].items()}
    return out


def _entry_parts(entry: Any) -> tuple[int, dict | None, dict]:
    if isinstance(entry, dict):
        return int(entry["step"]), entry.get("record"), entry["snapshot"]
    return int(entry.step), entry.record, entry.snapshot


def pack_history(entries: Sequence[Any]) -> list[dict]:
    """Entries -> JSON-able steps: the first whole, each later one as record + snapshot delta.

    `[{"step", "record", "snapshot"}, {"step", "record", "delta"}, ...]`; the snapshots
    are keyed (see `keyed`). Any two entries may follow each other (a sampled history
    packs as well as a whole one)."""
    out: list[dict] = []
    prev = None
    for entry in entries:
        step, record, snapshot = _entry_parts(entry)
        cur = keyed(snapshot)
        if prev is None:
            out.append({"step": step, "record": record, "snapshot": cur})
        else:
            out.append({"step": step, "record": record, "delta": diff(prev, cur)})
        prev = cur
    return out


def unpack_history(steps: Iterable[dict]) -> list:
    """Packed steps -> `HistoryEntry` list (consecutive snapshots share unchanged parts)."""
    entries = []
    cur = None
    for item in steps:
        cur = item["snapshot"] if cur is None or "snapshot" in item else patch(cur, item.get("delta"))
        entries.append(HistoryEntry(step=int(item["step"]), record=item.get("record"), snapshot=unkeyed(cur)))
    return entries


# -- measuring ------------------------------------------------------------------------------------
def history_bytes(entries: Iterable[Any]) -> int:
    """Bytes held by the entries' records and snapshots, each object counted once
    (sys.getsizeof of every dict, list, str, int, float reachable from them)."""
    seen: set[int] = set()
    total = 0
    stack: list = []
    for entry in entries:
        _, record, snapshot = _entry_parts(entry)
        stack.append(record)
        stack.append(snapshot)
    while stack:
        obj = stack.pop()
        if obj is None or obj is True or obj is False:
            continue
        oid = id(obj)
        if oid in seen:
            continue
        seen.add(oid)
        total += sys.getsizeof(obj)
        t = type(obj)
        if t is dict:
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif t is list or t is tuple:
            stack.extend(obj)
    return total
