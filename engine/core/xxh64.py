"""XXH64 in plain Python: the prefix cache's block hash where the xxhash C extension is absent.

A browser's Python (Pyodide) has no xxhash wheel; this is the same function (XXH64, as the C
library computes it; tests/engine/test_core_without_torch.py checks it against the extension), so a block's
hash, and so every prefix hit, is the same whichever one runs. It is far slower than the C
extension (docs/performance.md), so the engine uses the extension wherever it is installed
(engine/core/hashing.py).
"""
from __future__ import annotations

import struct

P1 = 0x9E3779B185EBCA87
P2 = 0xC2B2AE3D27D4EB4F
P3 = 0x165667B19E3779F9
P4 = 0x85EBCA77C2B2AE63
P5 = 0x27D4EB2F165667C5
M64 = (1 << 64) - 1
_STRIPE = struct.Struct("<4Q")


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & M64


def _round(acc: int, lane: int) -> int:
    acc = (acc + lane * P2) & M64
    return (_rotl(acc, 31) * P1) & M64


def _merge(acc: int, v: int) -> int:
    acc ^= _round(0, v)
    return (acc * P1 + P4) & M64


def xxh64_intdigest(data: bytes, seed: int = 0) -> int:
    """XXH64 of `data` with `seed`, as an unsigned 64-bit integer (xxhash.xxh64_intdigest's)."""
    n = len(data)
    p = 0
    if n >= 32:
        v1 = (seed + P1 + P2) & M64
        v2 = (seed + P2) & M64
        v3 = seed & M64
        v4 = (seed - P1) & M64
        while p + 32 <= n:   # 32-byte stripes, four lanes
            a, b, c, d = _STRIPE.unpack_from(data, p)
            v1, v2, v3, v4 = _round(v1, a), _round(v2, b), _round(v3, c), _round(v4, d)
            p += 32
        h = (_rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)) & M64
        for v in (v1, v2, v3, v4):
            h = _merge(h, v)
    else:
        h = (seed + P5) & M64
    h = (h + n) & M64
    while p + 8 <= n:
        (k,) = struct.unpack_from("<Q", data, p)
        h ^= _round(0, k)
        h = (_rotl(h, 27) * P1 + P4) & M64
        p += 8
    if p + 4 <= n:
        (k,) = struct.unpack_from("<I", data, p)
        h ^= (k * P1) & M64
        h = (_rotl(h, 23) * P2 + P3) & M64
        p += 4
    while p < n:
        h ^= (data[p] * P5) & M64
        h = (_rotl(h, 11) * P1) & M64
        p += 1
    h ^= h >> 33
    h = (h * P2) & M64
    h ^= h >> 29
    h = (h * P3) & M64
    return h ^ (h >> 32)
