"""The fix that goes with an engine error the Dashboard shows: its messages name the field and
the limit; the person at the panels also needs what to do about it, in the panels' own words."""
from __future__ import annotations

import re
from typing import Any

# engine.input_processor.check_fits: "... needs {need} KV blocks; num_kv_blocks={n} leaves only {n-1} usable"
_POOL_TOO_SMALL = re.compile(r"needs (\d+) KV blocks; num_kv_blocks=(\d+)")


def with_fix(message: str, config: Any = None) -> str:
    """`message`, followed by how to get past it where the Dashboard knows a way."""
    m = _POOL_TOO_SMALL.search(message)
    if m:
        need = int(m.group(1))
        block = getattr(config, "block_size", None)
        fewer = f" (a block holds {block} tokens)" if block else ""
        return (f"{message}. To run it: lower max_tokens or shorten the prompt{fewer}, or open "
                f"'requests & knobs' and Apply a pool of at least {need + 1} KV blocks (block 0 is the "
                f"null block; a new engine)")
    return message
