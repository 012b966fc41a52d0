"""The recorder's memory of what changed since the state the subscribers hold.

Every step notes what it touched (O(what it did), with or without subscribers): the blocks of
its events, every block that lost a reference, the requests it scheduled, preempted or that
arrived, and from which block of each request's table tokens may have been written. A
*refresh* turns those notes into the step's changes (explorer.drivers.vllm_live.changes) or into a
whole snapshot, and clears them: a step message and a snapshot are both refresh points, so a
client that joined with a snapshot and one that followed every message hold the same state.

The block dicts are kept between refreshes, so a whole snapshot rebuilds only the dirty ones:
O(pool) pointers and O(tokens in flight) for the queues, not a dict per block per step.
"""
from __future__ import annotations

from typing import Any, Callable

from engine.report.schema import BLOCK, POOL, REQ
from vllm.v1.core.kv_cache_utils import get_block_hash, maybe_convert_block_hash

from ..vllm.records import RecordBuilder, computed_before, status_name
from . import protocol
from .changes import CLOCKS, clock_change


class ChangeTracker:
    """Dirty blocks and requests of one server's scheduler since the last refresh."""

    def __init__(self, records: RecordBuilder, table: Callable[[str], list[int]]) -> None:
        self.records = records  # the recorder's: scheduler, pool, requests, block size, the dicts
        self.table = table      # a running request's block ids now
        self.blocks: list[dict] | None = None   # every block's dict as last refreshed (owners left empty)
        self.dirty_blocks: set[int] = set()
        self.dirty_from: dict[str, int] = {}    # request -> first table index whose block may hold new tokens
        self.dirty_requests: set[str] = set()
        self.sent: dict[str, int] = {}          # request -> output tokens the subscribers hold

    # -- every step ------------------------------------------------------------------------------
    def note_step(self, cap: Any) -> None:
        for ids in cap.blocks.values():
            self.dirty_blocks.update(ids)
        self.dirty_blocks.update(cap.ref_dropped)
        out = cap.out
        if out is None:
            return
        bs = self.records.block_size
        computed, admitted = computed_before(out)
        for rid, before in computed.items():
            # An admitted request's whole table is new to the subscribers; a running one's
            # blocks before the one its first scheduled token lands in are unchanged.
            first = 0 if rid in admitted else int(before) // bs
            self.dirty_from[rid] = min(first, self.dirty_from.get(rid, first))
        self.dirty_requests.update(out.num_scheduled_tokens)
        self.dirty_requests.update(out.preempted_req_ids or ())

    def note_arrival(self, rid: str) -> None:
        self.dirty_requests.add(rid)
        self.dirty_from[rid] = 0

    def forget_requests(self, rids: Any) -> None:
        """Finished requests leave the notes (a server with no subscriber for days keeps none)."""
        for rid in rids:
            self.dirty_requests.discard(rid)
            self.dirty_from.pop(rid, None)
            self.sent.pop(rid, None)

    # -- refresh points --------------------------------------------------------------------------
    def step_changes(self, finished: list[dict]) -> dict:
        """The changes since the last refresh (the step message's `changes`), then forget them."""
        view = self.records
        s = view.scheduler
        running = {r.request_id for r in s.running}
        held: dict[int, list[int]] = {}
        requests = {}
        for rid in self.dirty_requests:
            e = view.requests.get(rid)
            if e is None or e.finish_reason is not None:
                continue  # finished: its whole dict travels in `finished`
            table = self.table(rid) if rid in running else []
            first = self.dirty_from.get(rid, 0)
            self._hold(e.req, table, first, held)
            requests[rid] = self._request_change(e, table, first)
        blocks = self._refresh_blocks(held)
        self._forget()
        known = view.requests
        queues = {"waiting": [r.request_id for r in view.waiting() if r.request_id in known],
                  "running": [r.request_id for r in s.running if r.request_id in known]}
        return {"requests": requests, "queues": queues,
                "finished": finished, "blocks": blocks, "num_free_blocks": int(view.pool.get_num_free_blocks()),
                "metrics": view.metrics}

    def whole_pool(self, running: list, tables: dict[str, list[int]]) -> dict:
        """The whole pool (for a snapshot, a refresh point): the kept block dicts with the dirty
        ones rebuilt, owners from the running requests' tables."""
        view = self.records
        held: dict[int, list[int]] = {}
        owners: dict[int, list[str]] = {}
        for r in running:
            table = tables[r.request_id]
            self._hold(r, table, 0, held)
            for b in table:
                owners.setdefault(b, []).append(r.request_id)
        if self.blocks is None:
            self.blocks = [_block(view, blk, held.get(blk.block_id)) for blk in view.pool.blocks]
        else:
            self._refresh_blocks(held)
        blocks = [b if b[BLOCK.BLOCK_ID] not in owners else {**b, BLOCK.OWNERS: owners[b[BLOCK.BLOCK_ID]]}
                  for b in self.blocks]
        for e in view.requests.values():
            self.sent[e.request_id] = len(e.req.output_token_ids)
        self._forget()
        return {POOL.NUM_BLOCKS: int(view.pool.num_gpu_blocks), POOL.BLOCK_SIZE: view.block_size,
                POOL.NUM_FREE_BLOCKS: int(view.pool.get_num_free_blocks()), POOL.BLOCKS: blocks}

    # -- parts -----------------------------------------------------------------------------------
    def _hold(self, req: Any, table: list[int], first: int, held: dict[int, list[int]]) -> None:
        """The tokens `req` keeps in its blocks from table index `first` on (computed ones only)."""
        bs, ids, n = self.records.block_size, req.all_token_ids, req.num_computed_tokens
        for i in range(first, len(table)):
            if table[i] not in held:
                held[table[i]] = list(ids[i * bs:min((i + 1) * bs, n)])

    def _refresh_blocks(self, held: dict[int, list[int]]) -> list[dict]:
        """Rebuild the dirty blocks (and those `held` names) from the pool as it is now."""
        view = self.records
        dirty = self.dirty_blocks | held.keys()
        pool = view.pool.blocks
        fresh = [_block(view, pool[b], held.get(b)) for b in sorted(dirty)]
        if self.blocks is not None:
            for d in fresh:
                self.blocks[d[BLOCK.BLOCK_ID]] = d
        return fresh

    def _request_change(self, e: Any, table: list[int], table_from: int) -> dict:
        """A request's change: its small fields, and its growing lists from what subscribers hold."""
        r = e.req
        output = r.output_token_ids
        sent = self.sent.get(e.request_id)
        start = 0 if sent is None else min(sent, len(output))
        change = {REQ.REQUEST_ID: e.request_id, REQ.STATUS: status_name(r.status),
                  REQ.NUM_COMPUTED_TOKENS: int(r.num_computed_tokens), REQ.NUM_CACHED_TOKENS: e.num_cached_tokens,
                  REQ.NUM_PREEMPTIONS: int(r.num_preemptions), REQ.FINISH_REASON: e.finish_reason,
                  "output_from": start, "output_tail": list(output[start:]),
                  "table_from": table_from, "table_tail": table[table_from:],
                  "clocks": {c: clock_change(getattr(e.metrics, c), len(output) - start) for c in CLOCKS}}
        if sent is None:  # new to the subscribers: what never changes, once
            full = self.records.request_dict(e, [])
            for key in (REQ.PROMPT_TOKEN_IDS, REQ.PROMPT_TEXT, REQ.MAX_TOKENS, REQ.SAMPLING_PARAMS):
                change[key] = full[key]
        self.sent[e.request_id] = len(output)
        return change

    def _forget(self) -> None:
        self.dirty_blocks = set()
        self.dirty_from = {}
        self.dirty_requests = set()


def _block(records: RecordBuilder, blk: Any, held: list[int] | None) -> dict:
    """RecordBuilder.block_dict, with the hash as vLLM's KV events name it (the prefix tree's key)."""
    d = records.block_dict(blk, held, [])
    h = blk.block_hash
    d["event_key"] = None if h is None else protocol.event_key(maybe_convert_block_hash(get_block_hash(h)))
    return d

