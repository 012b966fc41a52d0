"""What a panel shows on hover, computed in Python: for the live panel (BlockPoolPanel answers
the browser's look-up) and for the export, which computes every answer ahead. No anywidget or
traitlets here, so the export's view code imports this where only Python runs."""
from __future__ import annotations

from collections.abc import Callable, Sequence

TokenText = Callable[[Sequence[int]], list[str]]


def block_detail(blocks: Sequence[dict], block_id: int, step: int, token_text: TokenText | None = None) -> dict:
    """The `detail` trait for block `block_id` of a snapshot's `blocks`, shown at `step`
    ({} when there is no such block). Also what an exported page shows on hover."""
    if not 0 <= block_id < len(blocks):
        return {}
    b = blocks[block_id]
    ids = list(b.get("token_ids") or [])
    texts = token_text(ids) if (token_text and ids) else []
    return {"block_id": block_id, "ref_count": b.get("ref_count", 0), "hash": b.get("hash"),
            "owners": list(b.get("owners") or []), "token_ids": ids, "tokens": texts,
            "is_null": bool(b.get("is_null", block_id == 0)), "is_free": bool(b.get("is_free", False)),
            "step": step}
