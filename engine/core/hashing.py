"""Chained block hashes for the prefix cache: xxhash64 over the parent block's hash and the block's
token ids (docs/architecture.md)."""
from __future__ import annotations

import struct

try:
    from xxhash import xxh64_intdigest
except ImportError:  # a Python without the C extension (a browser's): the same hash, in Python
    from .xxh64 import xxh64_intdigest  # type: ignore[assignment]


def hash_block(parent_hash: int | None, token_ids: list[int]) -> int:
    """xxh64 of the parent's hash (8 LE bytes; nothing for the first block) then the
    block's token ids as little-endian int64. Chaining makes a hit imply the whole prefix matches."""
    tokens = struct.pack(f"<{len(token_ids)}q", *token_ids)
    return xxh64_intdigest(tokens if parent_hash is None else struct.pack("<Q", parent_hash) + tokens)


def hash_hex(value: int | None) -> str | None:
    return None if value is None else f"{value:016x}"


def extend_block_hashes(hashes: list[int], token_ids: list[int], block_size: int) -> None:
    """Append the hashes of full blocks of `token_ids` not hashed yet (in place)."""
    num_full = len(token_ids) // block_size
    for i in range(len(hashes), num_full):
        parent = hashes[i - 1] if i else None
        hashes.append(hash_block(parent, token_ids[i * block_size:(i + 1) * block_size]))
