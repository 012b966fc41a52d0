"""Where a Mamba group in vLLM's "align" mode keeps its states, and the one a missed prompt came
closest to (vLLM issue 45238).

A Mamba layer carries one state per request. Align mode caches it only at a block boundary
where a prefill chunk ended, and (prefix_cache_retention_interval 0, vLLM's default) only the
one at the prompt's last whole block: a request can resume from such a state only if its own
prompt holds every token before it. So a sibling sharing a long prefix with an earlier request
hits nothing when that request's state lies a few tokens past the shared part, though full
attention has most of its blocks cached; and a hybrid model's hit is the shortest of its
groups'. The ledger reads each step's Mamba tables to know which states were cached after how
many tokens of which request, and names, for a request the Mamba group cut, the cached state
it shared the most of: a prompt sharing that request's tokens up to the state would resume there.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from engine.report.schema import EngineSnapshotDict, StepRecordDict

from .chains import Sequence


@dataclass(frozen=True)
class Checkpoint:
    """A Mamba state cached in block `block` (engine hash `hash`): request `request_id`'s state
    after its first `tokens` tokens."""

    request_id: str
    tokens: int
    block: int
    hash: str


@dataclass(frozen=True)
class NearestCheckpoint:
    """The cached state a missed prompt came closest to: it shares `shared` tokens with the
    checkpoint's request, `checkpoint.tokens - shared` short of resuming from it."""

    checkpoint: Checkpoint
    shared: int

    def text(self) -> str:
        c = self.checkpoint
        return (f"#{c.request_id}'s state after {c.tokens} tokens is cached, {c.tokens - self.shared} tokens past the "
                f"{self.shared} this prompt shares with it: a prompt sharing its first {c.tokens} tokens would "
                f"resume there and hit {c.tokens}")


class MambaCheckpoints:
    """Every Mamba state cached so far ((request id, tokens) -> Checkpoint), read from each
    step's tables; whether one is still cached is read from the pool when asked."""

    def __init__(self) -> None:
        self.states: dict[tuple[str, int], Checkpoint] = {}

    def read(self, group: int, rec: StepRecordDict, snap: EngineSnapshotDict, block_size: int) -> None:
        """Note every cached state in group `group`'s tables after a step: the running requests'
        (the snapshot) and those of the step's batch (a request that finished in the step)."""
        blocks = snap["block_pool"]["blocks"]
        tables: list[tuple[str, list[int]]] = []
        batch = rec.get("batch") or {}
        rows = (batch.get("group_block_tables") or [])[group - 1:group]
        if rows and len(rows[0]) == len(rec["scheduled"]):
            tables += [(x["request_id"], list(t)) for x, t in zip(rec["scheduled"], rows[0])]
        for r in snap["queues"]["running"]:
            groups = r.get("group_block_tables") or []
            if len(groups) >= group:
                tables.append((r["request_id"], list(groups[group - 1])))
        for rid, table in tables:
            for j, b in enumerate(table):
                h = blocks[b]["hash"] if 0 < b < len(blocks) else None
                if h is not None:
                    self.states[(rid, (j + 1) * block_size)] = Checkpoint(rid, (j + 1) * block_size, b, h)

    def blocks(self, pool: EngineSnapshotDict | None) -> set[int]:
        """The blocks of `pool` that hold a Mamba state."""
        return {c.block for c in self.states.values() if _cached(c, pool, set())}

    def evicted_within(self, seq: Sequence, seqs: dict[str, Sequence], pool_before: EngineSnapshotDict | None,
                       evicted_now: set[int], start: int, end: int) -> Checkpoint | None:
        """The furthest state after `start` and at most `end` tokens of `seq`'s own prefix that
        was cached and is gone (its block evicted before this step, or in it by a request the
        scheduler took first: `evicted_now`): with it the Mamba group would have hit that far."""
        gone = [c for c in self._on_prefix(seq, seqs, start, end) if not _cached(c, pool_before, evicted_now)]
        return max(gone, key=lambda c: c.tokens, default=None)

    def nearest(self, seq: Sequence, seqs: dict[str, Sequence], pool_before: EngineSnapshotDict | None,
                evicted_now: set[int], hit: int,
                cached_through: Callable[[Sequence, int], bool]) -> NearestCheckpoint | None:
        """The state past `hit` tokens and before the prompt's last (a hit leaves one token to
        compute), still cached (`evicted_within`) with full attention's blocks of every token before it
        (`cached_through(its request, tokens)`), that `seq`'s prompt came closest to resuming
        from (the fewest tokens short of it, then the earliest state), among those it does not
        hold whole; None: no such state."""
        candidates = []
        for c in self.states.values():
            other = seqs.get(c.request_id)
            if other is None or other is seq or other.domain != seq.domain or not hit < c.tokens < seq.prompt_len \
                    or not _cached(c, pool_before, evicted_now):
                continue
            shared = shared_prefix(seq, other, c.tokens, seq.prompt_len)
            if shared < c.tokens:   # holding the state's tokens whole, it misses for another cause
                candidates.append(NearestCheckpoint(c, shared))
        candidates.sort(key=lambda n: (n.checkpoint.tokens - n.shared, n.checkpoint.tokens))
        return next((n for n in candidates if cached_through(seqs[n.checkpoint.request_id], n.checkpoint.tokens)),
                    None)

    def _on_prefix(self, seq: Sequence, seqs: dict[str, Sequence], start: int, end: int) -> list[Checkpoint]:
        out = []
        for c in self.states.values():
            other = seqs.get(c.request_id)
            if other is not None and start < c.tokens <= end and other.domain == seq.domain \
                    and shared_prefix(seq, other, c.tokens, seq.prompt_len) >= c.tokens:
                out.append(c)
        return out


def _cached(c: Checkpoint, pool: EngineSnapshotDict | None, evicted_now: set[int]) -> bool:
    blocks = pool["block_pool"]["blocks"] if pool is not None else []
    return c.block < len(blocks) and blocks[c.block]["hash"] == c.hash and c.block not in evicted_now


def shared_prefix(a: Sequence, b: Sequence, limit: int, a_len: int | None = None) -> int:
    """How many leading tokens `a` (its first `a_len`) and `b` share, up to `limit`: whole
    blocks by their chained content keys (a binary search), then token by token."""
    n = min(len(a.tokens) if a_len is None else a_len, len(b.tokens), limit)
    bs = a.block_size
    lo, hi = 0, n // bs   # the most leading whole blocks with equal keys
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a.key(mid - 1) == b.key(mid - 1):
            lo = mid
        else:
            hi = mid - 1
    i = lo * bs
    while i < n and a.tokens[i] == b.tokens[i]:
        i += 1
    return i
