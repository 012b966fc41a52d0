"""The Session's history: one `HistoryEntry(step, record, snapshot)` per step, kept in a
`History` window.

Each snapshot is the previous one with the step's changes applied (engine/report/changes.py:
`apply`), so consecutive snapshots share every part a step left alone: a history costs what
the steps changed, not a whole snapshot per step. History snapshots are read-only: a part of
one entry may be the same object as the same part of its neighbours, and a request's growing
lists are views of one list its entries share, each read to the entry's own length
(engine/report/list_prefix.py; `json.dumps(entry.snapshot, default=as_json)`).

A `History` may be bounded (`max_steps`): a Session following a live server for an afternoon
keeps the latest steps, and says where its window starts (`first_step`, `dropped`).
`history_bytes(entries)` measures what a history holds (each object counted once, however
many entries point at it).
"""
from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from engine.report.list_prefix import ListPrefix
from engine.report.schema import EngineSnapshotDict, StepRecordDict


@dataclass(frozen=True)
class HistoryEntry:
    """The engine after one step: `record` is that step's StepRecord.to_dict() (None for
    the first entry, made before any step the history holds), `snapshot` its state."""

    step: int
    record: StepRecordDict | None
    snapshot: EngineSnapshotDict


class HistoryEntryDict(TypedDict, total=False):
    """A history entry as JSON carries it (a recording's or an export's entries, a test's): HistoryEntry's fields."""
    step: int
    record: StepRecordDict | None
    snapshot: EngineSnapshotDict


#: A history entry as the readers (explorer/ui/views.py) take it: a Session's HistoryEntry, or its dict form.
Entry = HistoryEntry | HistoryEntryDict


def entry_fields(entry: Entry) -> tuple[int | None, StepRecordDict | None, EngineSnapshotDict | None]:
    """(step, record, snapshot) of an entry of either form, as it holds them (a dict may lack any)."""
    if isinstance(entry, dict):
        return entry.get("step"), entry.get("record"), entry.get("snapshot")
    return entry.step, entry.record, entry.snapshot


class HistoryWindowDict(TypedDict):
    """Where a kept history starts (Session.history_window)."""
    first_step: int       # the step of its first entry
    dropped: int          # entries dropped before it (a bounded history)
    max_steps: int | None  # the bound (None: every step is kept)
    max_mib: float | None  # the bound on what the kept steps added
    entries: int
    mib: float | None     # what the kept steps added, under a MiB bound


class History:
    """The entries of a Session, oldest first: at most `max_steps` + 1 of them, and at most
    about `max_mib` MiB of what the steps added (`step_bytes`); None: no such bound.

    When a bound is reached the oldest entries go: `on_drop(entries)` hears each of them first
    (to write them out), `dropped` counts them. The first entry kept then stands for the state
    the window starts from."""

    def __init__(self, first: HistoryEntry, max_steps: int | None = None,
                 on_drop: Callable[[list[HistoryEntry]], None] | None = None, max_mib: float | None = None) -> None:
        if max_steps is not None and (isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1):
            raise ValueError(f"max_history must be an integer >= 1 (steps kept) or None, got {max_steps!r}")
        if max_mib is not None and (isinstance(max_mib, bool) or not isinstance(max_mib, (int, float)) or max_mib <= 0):
            raise ValueError(f"max_history_mib must be a number > 0 (MiB kept) or None, got {max_mib!r}")
        self.entries: list[HistoryEntry] = [first]
        self.max_steps = max_steps
        self.max_mib = max_mib
        self.on_drop = on_drop
        self.dropped = 0
        self.sizes: list[int] = [0]   # bytes each entry added to the one before it (measured under a MiB bound)
        self.bytes = 0

    def append(self, entry: HistoryEntry) -> None:
        if self.max_mib is not None:
            last = self.entries[-1]
            size = step_bytes(entry.record, entry.snapshot, last.snapshot, last.record)
            self.sizes.append(size)
            self.bytes += size
        self.entries.append(entry)
        n = 0
        if self.max_steps is not None and len(self.entries) > self.max_steps + 1:
            n = len(self.entries) - self.max_steps - 1
        if self.max_mib is not None and self.bytes > self.max_mib * 2**20:
            total, limit = self.bytes - sum(self.sizes[1:n + 1]), self.max_mib * 2**20
            while total > limit and n < len(self.entries) - 2:
                n += 1
                total -= self.sizes[n]
        if n:
            # Drop in batches of a tenth of the window: a list's front costs O(window) to cut.
            n = min(len(self.entries) - 2, n + max(0, (len(self.entries) - 1) // 10))
            self._drop(max(1, n))

    def _drop(self, n: int) -> None:
        gone, self.entries = self.entries[:n], self.entries[n:]
        if self.max_mib is not None:
            # The new first entry stands for the state: what its step added is no longer "added".
            self.bytes -= sum(self.sizes[1:n + 1])
            self.sizes = [0, *self.sizes[n + 1:]]
        self.dropped += n
        if self.on_drop is not None:
            self.on_drop(gone)

    def replace_last(self, snapshot: EngineSnapshotDict) -> None:
        last = self.entries[-1]
        self.entries[-1] = HistoryEntry(step=last.step, record=last.record, snapshot=snapshot)

    @property
    def window(self) -> HistoryWindowDict:
        """Where the kept history starts: its first step, the steps dropped before it, the
        bounds, and (under a MiB bound) the MiB the kept steps added."""
        return {"first_step": self.first_step, "dropped": self.dropped, "max_steps": self.max_steps,
                "max_mib": self.max_mib, "entries": len(self.entries),
                "mib": round(self.bytes / 2**20, 3) if self.max_mib is not None else None}

    @property
    def first_step(self) -> int:
        return self.entries[0].step

    def __len__(self) -> int:
        return len(self.entries)


# -- measuring ------------------------------------------------------------------------------------
def step_bytes(record: Mapping[str, Any] | None, snapshot: Mapping[str, Any], before: Mapping[str, Any],
               before_record: Mapping[str, Any] | None = None) -> int:
    """About how many bytes an entry adds to a history whose last entry is `before` (its
    snapshot) and `before_record`: its record (the step's changes in it; a batch's block table
    that reads the list a row of `before_record` read, by its new items), and the containers
    `apply` built anew for the snapshot (engine/report/changes.py keeps every part a step left
    alone as the same object): the queues and requests that changed, with their lists' new
    items (a growing list is a view of a list its snapshots share: engine/report/list_prefix.py),
    and the pool's list and changed blocks. It walks what changed, never the whole state:
    O(the step), as a history bound must be."""
    size = _deep(record, _batch_tables(before_record)) if record is not None else 0
    if snapshot is before:
        return size
    size += sys.getsizeof(snapshot)
    q, q0 = snapshot.get("queues") or {}, before.get("queues") or {}
    if q is not q0:
        size += sys.getsizeof(q)
        old = {id(r): r for name in ("waiting", "running") for r in q0.get(name, ())}
        by_rid = {r.get("request_id"): r for r in old.values()}
        for name in ("waiting", "running", "finished"):
            lst = q.get(name, [])
            if lst is q0.get(name):
                continue
            size += sys.getsizeof(lst)
            if name == "finished":
                done = q0.get(name, [])
                size += sum(_shallow(r, None) for r in lst[len(done):])
                continue
            size += sum(_shallow(r, by_rid.get(r.get("request_id"))) for r in lst if id(r) not in old)
    pool, pool0 = snapshot.get("block_pool") or {}, before.get("block_pool") or {}
    if pool is not pool0:
        size += sys.getsizeof(pool)
        blocks, blocks0 = pool.get("blocks", []), pool0.get("blocks", [])
        if blocks is not blocks0:
            size += sys.getsizeof(blocks)
            changes = (record or {}).get("changes") or {}
            for b in changes.get("blocks", ()):
                i = b.get("block_id")
                if isinstance(i, int) and 0 <= i < len(blocks):
                    size += _shallow(blocks[i], None)
    return size


def _shallow(d: Mapping[str, Any], old: Mapping[str, Any] | None) -> int:
    """A dict built anew by apply: itself and each of its values that is not `old`'s (its
    lists' pointers, and the floats of lists computed anew, such as inter-token latencies)."""
    size = sys.getsizeof(d)
    for k, v in d.items():
        if old is not None and old.get(k) is v:
            continue
        t = type(v)
        if t is dict:
            size += _shallow(v, old.get(k) if old is not None and type(old.get(k)) is dict else None)
        elif t is ListPrefix:
            before = old.get(k) if old is not None else None
            # A view continuing the one before adds its new items to their shared list.
            if isinstance(before, ListPrefix) and v.shares_with(before):
                new = len(v) - len(before)
                size += sys.getsizeof(v) + new * 8
            else:
                new = len(v)
                size += sys.getsizeof(v) + sys.getsizeof(v.shared)
            if new > 0 and type(v[-1]) is float and (old is None or k == "inter_token_latency"):
                size += new * 24   # floats made for this list
        elif t is list:
            size += sys.getsizeof(v)
            if v and type(v[0]) is float and (old is None or k == "inter_token_latency"):
                size += len(v) * 24   # floats made for this list
        elif t is str:
            size += sys.getsizeof(v)
    return size


def _batch_tables(record: Mapping[str, Any] | None) -> dict[int, int]:
    """The lists a record's batch tables are views of (kvscope's engine: records.batch_dict): id -> the length read."""
    tables = ((record or {}).get("batch") or {}).get("block_tables") or ()
    return {id(t.shared): len(t) for t in tables if type(t) is ListPrefix}


def _deep(obj: Any, held: Mapping[int, int]) -> int:
    return history_bytes([{"record": obj}], held)


def history_bytes(entries: Iterable[HistoryEntry | Mapping[str, Any]], held: Mapping[int, int] | None = None) -> int:
    """Bytes held by the entries' records and snapshots, each object counted once
    (sys.getsizeof of every dict, list, str, int, float reachable from them). `held`: lists
    already counted (id -> how many of their items): a view of one adds its items past those."""
    seen: set[int] = set()
    total = 0
    stack: list[Any] = []
    for entry in entries:  # HistoryEntry objects, or {"step", "record", "snapshot"} dicts
        parts = entry if isinstance(entry, dict) else vars(entry)
        stack.append(parts.get("record"))
        stack.append(parts.get("snapshot"))
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
        elif t is ListPrefix:
            known = held.get(id(obj.shared)) if held else None
            if known is None:
                stack.append(obj.shared)  # the list its entries share, counted once
            else:
                total += 8 * max(0, len(obj) - known)  # its new items' pointers
    return total
