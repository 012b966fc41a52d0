"""Content keys of KV blocks, the same for every engine, and what earlier requests had computed.

A block's key chains its parent's key and its own tokens (64 bits of blake2b), from a root that
is the request's hash domain (cache_salt, LoRA): so two blocks have one key exactly when an
engine's prefix cache would give them one hash. kvscope's engine hashes with xxhash, vLLM with
sha256 seeded per process; this key is neither, so one ledger reads every engine's history, and
the engine's own hash (the pool's 16 hex digits) is kept beside it for display and linking.

`SeenIndex` holds, per parent key, every block's tokens that some request had computed (full
blocks and the partial last one), sorted, so the longest prefix of a new prompt that any earlier
request had computed is found with two neighbour comparisons per block.
"""
from __future__ import annotations

import bisect
import collections.abc
import hashlib
from array import array

Domain = tuple[str | None, str | None]   # a request's hash domain: (cache_salt, lora_name)
PLAIN: Domain = (None, None)


def root_key(domain: Domain) -> bytes:
    """The chain's start for a hash domain: (cache_salt, lora_name); PLAIN for neither."""
    if domain == PLAIN:
        return b"\0" * 8
    return hashlib.blake2b(repr(domain).encode(), digest_size=8).digest()


def block_key(parent: bytes, tokens: list[int] | tuple[int, ...]) -> bytes:
    return hashlib.blake2b(parent + array("q", tokens).tobytes(), digest_size=8).digest()


class Sequence:
    """One request's tokens (prompt, then output as it grows) and their block keys, in its own
    domain (`keys`) and in none (`plain`, the same list when it has no domain)."""

    def __init__(self, request_id: str, prompt: list[int], domain: Domain, block_size: int) -> None:
        self.request_id = request_id
        self.tokens = list(prompt)
        self.prompt_len = len(prompt)
        self.domain = domain
        self.block_size = block_size
        self.root = root_key(domain)
        self.keys: list[bytes] = []
        self.plain: list[bytes] = self.keys if domain == PLAIN else []
        self.computed = 0          # the most tokens it ever had computed (the seen index holds them)
        self.lost = 0              # tokens its latest preemption freed (until re-admitted)
        self.tail: tuple[bytes, tuple[int, ...]] | None = None   # its partial last block in the seen index

    def grow(self, output: collections.abc.Sequence[int]) -> None:
        """Take the output tokens known now (they only grow; a re-read of the same list is free)."""
        have = len(self.tokens) - self.prompt_len
        if len(output) > have:
            self.tokens.extend(output[have:])

    def key(self, j: int) -> bytes:
        self._extend(j + 1)
        return self.keys[j]

    def plain_key(self, j: int) -> bytes:
        self._extend(j + 1)
        return self.plain[j]

    def parent(self, j: int) -> bytes:
        return self.key(j - 1) if j else self.root

    def block_tokens(self, j: int) -> tuple[int, ...]:
        bs = self.block_size
        return tuple(self.tokens[j * bs:(j + 1) * bs])

    def _extend(self, n: int) -> None:
        bs = self.block_size
        if n * bs > len(self.tokens):
            raise IndexError(f"request {self.request_id}: block {n - 1} is not full ({len(self.tokens)} tokens known)")
        while len(self.keys) < n:
            j = len(self.keys)
            tokens = self.tokens[j * bs:(j + 1) * bs]
            self.keys.append(block_key(self.keys[-1] if j else self.root, tokens))
            if self.plain is not self.keys:
                self.plain.append(block_key(self.plain[-1] if j else root_key(PLAIN), tokens))


class SeenIndex:
    """What requests had computed, by content: full blocks by key, and per parent key the sorted
    (tokens, request id) of every block and partial block computed under it."""

    def __init__(self) -> None:
        self.full: dict[bytes, str] = {}                      # key -> the first request that computed it
        self.under: dict[bytes, list[tuple[tuple[int, ...], str]]] = {}

    def computed(self, seq: Sequence, upto: int) -> None:
        """`seq` has computed its first `upto` tokens (recomputing after a preemption adds nothing)."""
        if upto <= seq.computed:
            return
        bs = seq.block_size
        for j in range(seq.computed // bs, upto // bs):
            self._drop_tail(seq)
            key = seq.key(j)
            if key not in self.full:
                self.full[key] = seq.request_id
                self._insert(seq.parent(j), seq.block_tokens(j), seq.request_id)
        if upto % bs:
            j = upto // bs
            self._drop_tail(seq)
            seq.tail = (seq.parent(j), tuple(seq.tokens[j * bs:upto]))
            self._insert(*seq.tail, seq.request_id)
        seq.computed = upto

    def longest(self, seq: Sequence, length: int) -> tuple[int, str | None]:
        """The longest prefix of seq's first `length` tokens that a request had computed, and
        that request (None where nothing was shared)."""
        bs = seq.block_size
        j, who = 0, None
        while (j + 1) * bs <= length and seq.key(j) in self.full:
            who = self.full[seq.key(j)]
            j += 1
        mine = tuple(seq.tokens[j * bs:min((j + 1) * bs, length)])
        entries = self.under.get(seq.parent(j), [])
        i = bisect.bisect_left(entries, (mine,))
        # In sorted order the longest common prefix with `mine` is one of its two neighbours'.
        best = 0
        for k in (i - 1, i):
            if 0 <= k < len(entries):
                n = _common(mine, entries[k][0])
                if n > best:
                    best, who = n, entries[k][1]
        return j * bs + best, who

    def _insert(self, parent: bytes, tokens: tuple[int, ...], rid: str) -> None:
        bisect.insort(self.under.setdefault(parent, []), (tokens, rid))

    def _drop_tail(self, seq: Sequence) -> None:
        if seq.tail is None:
            return
        parent, tokens = seq.tail
        entries = self.under.get(parent, [])
        i = bisect.bisect_left(entries, (tokens, seq.request_id))
        if i < len(entries) and entries[i] == (tokens, seq.request_id):
            del entries[i]
        seq.tail = None


def _common(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
