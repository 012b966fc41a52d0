"""Short, stable labels for long request ids.

A vLLM server names a request "cmpl-ae5d185520b8dfff-0-8d04f5d6": eight of those make a
caption three lines long. Every request gets "#N" instead, N its place in the order this view
first saw the requests (1, 2, ...), kept for the life of the view, so "#17" names the same
request at every step. A short id (kvscope's engine counts "0", "1", ...) is its own label. The
panels show the label and keep the full id on hover; the captions use the label alone.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

LONG_ID_CHARS = 12   # ids longer than this get a "#N" label


class RequestLabels:
    """rid -> "#N" for long ids, in first-seen order; `name(rid)` for any id. It keeps one short
    string per request the view has seen (a label must outlive the entries a bounded history drops)."""

    def __init__(self) -> None:
        self._labels: dict[str, str] = {}
        self._short: set[str] = set()
        self._count = 0

    def clear(self) -> None:
        """Forget every label (a new engine: its requests are new)."""
        self._labels.clear()
        self._short.clear()
        self._count = 0

    def see(self, rids: Iterable[str]) -> None:
        """Number the ids not seen before, in the order given."""
        for rid in rids:
            if rid in self._labels or rid in self._short:
                continue
            self._count += 1
            if len(rid) <= LONG_ID_CHARS:
                self._short.add(rid)
                continue
            n = str(self._count)
            # A short id of the same run already says "#N": the label keeps the id's tail too.
            self._labels[rid] = f"#{n}" if n not in self._short else f"#{n}\u00b7{rid[-4:]}"

    def see_snapshot(self, snapshot: dict) -> None:
        """Number a snapshot's requests: finished, running, then waiting (arrival order)."""
        q = snapshot.get("queues") or {}
        self.see(r["request_id"] for name in ("finished", "running", "waiting") for r in q.get(name, ()))

    def see_entries(self, entries: Sequence[Any]) -> RequestLabels:
        for entry in entries:
            self.see_snapshot(getattr(entry, "snapshot", None) or (entry.get("snapshot") if isinstance(entry, dict)
                                                                    else None) or {})
        return self

    def name(self, rid: str) -> str:
        """"#17" for a long id, "#3" for the short id "3"."""
        return self._labels.get(rid) or f"#{rid}"


def kv_cache_group_label(group: Mapping[str, Any]) -> str:
    """A KV cache group's short name (model_info's kv_cache_groups entry): "full attention",
    "sliding window 4096", "Mamba", as the panels and the why-ledger say it."""
    window = group.get("sliding_window")
    if group.get("kind") == "mamba":
        return "Mamba"
    return f"sliding window {window}" if window else "full attention"
