"""Pointing at one block of the block pool panel's canvas, as a person does."""
from __future__ import annotations

from typing import Any

CELL_PX = 26  # widgets/block_pool.js: cells of 26 px up to 256 blocks


def hover_block(page: Any, scope: Any, block_id: int) -> tuple[Any, tuple[float, float]]:
    """Move the mouse onto block `block_id` of the pool canvas in `scope` (the page itself, or the
    frame of a replay embedded in it) and wait for the block's tooltip. The pool must have at
    most 256 blocks. Returns (the tooltip's locator, the point hovered)."""
    canvas = scope.locator('[data-testid="kvs-pool-canvas"]')
    canvas.scroll_into_view_if_needed()
    box = canvas.bounding_box()
    ncols = round(box["width"] / CELL_PX)
    x = box["x"] + (block_id % ncols) * CELL_PX + CELL_PX / 2
    y = box["y"] + (block_id // ncols) * CELL_PX + CELL_PX / 2
    page.mouse.move(x - 3, y - 3)  # from beside the cell into it: a move, as a person's pointer makes
    page.mouse.move(x, y)
    tip = scope.locator('[data-testid="kvs-block-tooltip"]')
    tip.wait_for(state="visible", timeout=10_000)
    return tip, (x, y)
