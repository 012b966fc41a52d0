"""`ListPrefix`: the first n items of a list that only grows, shared by a history's snapshots.

A request's growing lists (its output token ids, its block table, each clock's token times
and the gaps between them) grow by a tail each step. A history that copied each of them at
every step held O(tokens²) per request: 1.4 GiB after 300 decode steps of 256 requests
(docs/performance.md, "The Session's own work"). Instead, consecutive snapshots of a request
read one list, each to its own length: `continued` appends a step's tail to that list in
place when the view it continues is the list's latest (its length is the list's), so a step
costs its tail and a history costs every token once. Any other continuation (a list that went
back, such as a block table after a preemption, or a second snapshot built from an older
one) copies, so no view ever sees an item change.

A view is read-only and behaves as the list it reads for every reader: len, indexing and
slices (lists), iteration, `==` with lists, `+`, repr, pickling and copying (as a list of its
items). JSON takes it through `as_json` (json.dumps's `default`).
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import islice
from typing import Any, TypeVar, overload

T = TypeVar("T")


class ListPrefix(Sequence[T]):
    """The first `n` items of `items`, a list that is only ever appended to, through views
    (the view owns the list with every other view `continued` made from it)."""

    __slots__ = ("_items", "_n")

    def __init__(self, items: list[T], n: int) -> None:
        self._items = items
        self._n = n

    @classmethod
    def continued(cls, before: Sequence[T], start: int, tail: Sequence[T]) -> ListPrefix[T]:
        """`before[:start]` and then `tail`; `before`'s own list grows in place when `before`
        is its latest view and the tail starts where it ends (the caller checks `start <= len(before)`)."""
        if isinstance(before, ListPrefix) and start == before._n == len(before._items):
            before._items.extend(tail)
            return cls(before._items, len(before._items))
        items = list(before[:start])
        items.extend(tail)
        return cls(items, len(items))

    def shares_with(self, other: object) -> bool:
        """Whether `other` is a view of the same list (so this one's new items are all it adds)."""
        return isinstance(other, ListPrefix) and other._items is self._items

    @property
    def shared(self) -> list[T]:
        """The list this view reads (for measuring what a history holds; never to modify)."""
        return self._items

    def tolist(self) -> list[T]:
        return self._items[:self._n]

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> list[T]: ...

    def __getitem__(self, index: int | slice) -> T | list[T]:
        if isinstance(index, slice):
            start, stop, step = index.indices(self._n)
            # A forward slice stays inside [0, n]; a backward one may end at -1 (before the
            # first item), which the list would read as its last: go through a copy.
            return self._items[start:stop:step] if step > 0 else self.tolist()[index]
        i = index + self._n if index < 0 else index
        if not 0 <= i < self._n:
            raise IndexError(f"index {index} is outside a list of {self._n}")
        return self._items[i]

    def __iter__(self) -> Iterator[T]:
        return islice(self._items, self._n)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ListPrefix):
            return self._n == other._n and (self._items is other._items or self.tolist() == other.tolist())
        if isinstance(other, list):
            return self._n == len(other) and self.tolist() == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to lists, which have no hash

    def __add__(self, other: Sequence[T]) -> list[T]:
        return [*self, *other]

    def __radd__(self, other: Sequence[T]) -> list[T]:
        return [*other, *self]

    def __repr__(self) -> str:
        return repr(self.tolist())

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled and deep-copied as its own items: a copy shares nothing with the history.
        return (_from_items, (self.tolist(),))


def _from_items(items: list[T]) -> ListPrefix[T]:
    return ListPrefix(items, len(items))


def as_json(obj: object) -> list[Any]:
    """json.dumps's `default` for snapshots that hold views: each as the list it reads."""
    if isinstance(obj, ListPrefix):
        return obj.tolist()
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")
