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
    """The Mamba states cached so far (block id -> Checkpoint), read from each step's tables."""

    def __init__(self) -> None:
        self.by_block: dict[int, Checkpoint] = {}

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
                    self.by_block[b] = Checkpoint(rid, (j + 1) * block_size, b, h)

    def nearest(self, seq: Sequence, seqs: dict[str, Sequence], pool_before: EngineSnapshotDict | None,
                hit: int) -> NearestCheckpoint | None:
        """The state past `hit` tokens, still cached before this step, that `seq`'s prompt came
        closest to resuming from (the fewest tokens short of it, then the earliest state), among
        those it does not hold whole; None: no such state."""
        blocks = pool_before["block_pool"]["blocks"] if pool_before is not None else []
        best: NearestCheckpoint | None = None
        for c in self.by_block.values():
            other = seqs.get(c.request_id)
            if other is None or other is seq or other.domain != seq.domain or c.tokens <= hit \
                    or c.block >= len(blocks) or blocks[c.block]["hash"] != c.hash:
                continue
            shared = _common_prefix(seq.tokens[:seq.prompt_len], other.tokens, c.tokens)
            if shared >= c.tokens:
                continue   # it holds the state's tokens: not resuming from it has another cause
            if best is None or (c.tokens - shared, c.tokens) < (best.checkpoint.tokens - best.shared,
                                                                 best.checkpoint.tokens):
                best = NearestCheckpoint(c, shared)
        return best


def _common_prefix(a: list[int], b: list[int], limit: int) -> int:
    n = min(len(a), len(b), limit)
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
