"""The step's block tables as one zero-padded [rows, width] int64 host tensor, written into
memory kept across steps.

The attention backends read every sequence's block table from one rectangular tensor. Built
from nested Python lists each step (`torch.tensor([t + [0] * pad for t in tables])`), it was
~1.9 ms of a 256-request decode step's 3 ms prepare on a 2-core CPU (docs/performance.md, "The
host path"); written row by row through numpy into a buffer that stays allocated, ~0.5 ms."""
from __future__ import annotations

import numpy as np
import torch


class PaddedTables:
    """Writes tables into a reused buffer. The tensor returned shares that buffer: it is valid
    until the next call (a step's attention metadata lives for that step only)."""

    def __init__(self) -> None:
        self._flat = np.zeros(0, dtype=np.int64)

    def __call__(self, tables: list[list[int]], width: int) -> torch.Tensor:
        rows = len(tables)
        if self._flat.size < rows * width:
            self._flat = np.zeros(rows * width, dtype=np.int64)
        padded = self._flat[:rows * width].reshape(rows, width)   # contiguous: the buffer's first rows*width
        for i, table in enumerate(tables):
            n = len(table)
            padded[i, :n] = table
            padded[i, n:] = 0
        return torch.from_numpy(padded)
