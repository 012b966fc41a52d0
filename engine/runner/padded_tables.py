"""The step's block tables as one zero-padded [rows, width] int64 host tensor, written into
memory kept across steps, and only where they changed.

The attention backends read every sequence's block table from one rectangular tensor. Built
from nested Python lists each step (`torch.tensor([t + [0] * pad for t in tables])`), it was
~1.9 ms of a 256-request decode step's 3 ms prepare on a 2-core CPU (docs/performance.md, "The
host path"); written row by row through numpy into a buffer that stays allocated, ~0.5 ms. A
decode step's tables are last step's, a block longer now and then (a full-attention table only
grows while its request holds it): a row that holds the same table as the step before writes
only the blocks appended since, as vLLM's persistent block table does."""
from __future__ import annotations

import numpy as np
import torch


class PaddedTables:
    """Writes tables into a reused buffer. The tensor returned shares that buffer: it is valid
    until the next call (a step's attention metadata lives for that step only).

    `grows_only`: each table handed in is a list that only grows (a request's own full-attention
    table), so a row holding the same list as the call before writes only its new blocks; else
    (a sliding window's tables, whose blocks turn null in place) every row is written whole."""

    def __init__(self, grows_only: bool = False) -> None:
        self._flat = np.zeros(0, dtype=np.int64)
        self._width = 0
        self._grows_only = grows_only
        # Per row: the table list written there and how many of its blocks. A table is known by
        # the list itself (held, so its id cannot pass to another list).
        self._written: list[tuple[list[int], int]] = []

    def __call__(self, tables: list[list[int]], width: int) -> torch.Tensor:
        rows = len(tables)
        if self._flat.size < rows * width:
            self._flat = np.zeros(rows * width, dtype=np.int64)
            self._written = []
        if width != self._width:   # a new row stride: every row moves
            self._width, self._written = width, []
        padded = self._flat[:rows * width].reshape(rows, width)   # contiguous: the buffer's first rows*width
        written = self._written
        for i, table in enumerate(tables):
            n = len(table)
            if self._grows_only and i < len(written) and written[i][0] is table and written[i][1] <= n:
                start = written[i][1]
                if start < n:
                    padded[i, start:n] = table[start:]
                written[i] = (table, n)
                continue
            padded[i, :n] = table
            padded[i, n:] = 0
            if not self._grows_only:
                continue
            if i < len(written):
                written[i] = (table, n)
            else:
                written.append((table, n))
        return torch.from_numpy(padded)
