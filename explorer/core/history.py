"""The Session's history: one `HistoryEntry(step, record, snapshot)` per step, kept in a
`History` window.

Each snapshot is the previous one with the step's changes applied (engine/report/changes.py:
`apply`), so consecutive snapshots share every part a step left alone: a history costs what
the steps changed, not a whole snapshot per step. History snapshots are read-only: a part of
one entry may be the same object as the same part of its neighbours.

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

from engine.report.schema import EngineSnapshotDict, StepRecordDict


@dataclass(frozen=True)
class HistoryEntry:
    """The engine after one step: `record` is that step's StepRecord.to_dict() (None for
    the first entry, made before any step the history holds), `snapshot` its state."""

    step: int
    record: StepRecordDict | None
    snapshot: EngineSnapshotDict


class HistoryWindowDict(TypedDict):
    """Where a kept history starts (Session.history_window)."""
    first_step: int       # the step of its first entry
    dropped: int          # entries dropped before it (a bounded history)
    max_steps: int | None  # the bound (None: every step is kept)
    entries: int


class History:
    """The entries of a Session, oldest first, at most `max_steps` + 1 of them (None: no bound).

    When the bound is reached the oldest entries go: `on_drop(entries)` hears each of them first
    (to write them out), `dropped` counts them. The first entry kept then stands for the state
    the window starts from."""

    def __init__(self, first: HistoryEntry, max_steps: int | None = None,
                 on_drop: Callable[[list[HistoryEntry]], None] | None = None) -> None:
        if max_steps is not None and (isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1):
            raise ValueError(f"max_history must be an integer >= 1 (steps kept) or None, got {max_steps!r}")
        self.entries: list[HistoryEntry] = [first]
        self.max_steps = max_steps
        self.on_drop = on_drop
        self.dropped = 0

    def append(self, entry: HistoryEntry) -> None:
        self.entries.append(entry)
        if self.max_steps is not None and len(self.entries) > self.max_steps + 1:
            # Drop in batches of a tenth of the window: a list's front costs O(window) to cut.
            n = len(self.entries) - self.max_steps - 1 + max(0, self.max_steps // 10)
            n = min(n, len(self.entries) - 1)
            gone, self.entries = self.entries[:n], self.entries[n:]
            self.dropped += n
            if self.on_drop is not None:
                self.on_drop(gone)

    def replace_last(self, snapshot: EngineSnapshotDict) -> None:
        last = self.entries[-1]
        self.entries[-1] = HistoryEntry(step=last.step, record=last.record, snapshot=snapshot)

    @property
    def first_step(self) -> int:
        return self.entries[0].step

    def window(self) -> HistoryWindowDict:
        return {"first_step": self.first_step, "dropped": self.dropped, "max_steps": self.max_steps,
                "entries": len(self.entries)}

    def __len__(self) -> int:
        return len(self.entries)


# -- measuring ------------------------------------------------------------------------------------
def history_bytes(entries: Iterable[HistoryEntry | Mapping[str, Any]]) -> int:
    """Bytes held by the entries' records and snapshots, each object counted once
    (sys.getsizeof of every dict, list, str, int, float reachable from them)."""
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
    return total
