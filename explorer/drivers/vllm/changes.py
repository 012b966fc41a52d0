"""vLLM in process (engine.py) as a producer of changes (engine/report/changes.py explains the
contract). A live server's recorder has its own producer, explorer/drivers/vllm_live/mirror.py.

`ChangeTracker`: every step notes what it touched, O(what it did), with or without anyone
listening: the blocks of its events and every block that lost a reference, the requests it
scheduled, preempted or that arrived or were aborted, and from which block of each request's
table tokens may have been written. `changes()` turns the notes into the step's changes and
makes now the refresh point.
"""
from __future__ import annotations

from typing import Any

from engine.report.changes import DecodeRow, Sent, decodes_dict, hold_tokens, request_fields
from engine.report.schema import (
    CHANGES,
    QUEUE,
    REQ,
    BlockDict,
    ChangesDict,
    QueueOrderDict,
    RequestChangeDict,
    RequestFieldsDict,
)

from .groups import only_full_attention
from .records import RecordBuilder, RequestState, computed_before, status_name


class BlockTables:
    """Each running request's block ids in kvscope's KV cache group 0 (vLLM's group `group`),
    extended as vLLM appends blocks: vLLM's get_block_ids rebuilds the whole list each call
    (O(context) per request per step). Only where every KV cache group is full attention, whose
    tables only grow while a request runs; elsewhere each call asks vLLM."""

    def __init__(self, scheduler: Any, group: int = 0) -> None:
        self.manager = scheduler.kv_cache_manager
        self.group = group
        self._tables: dict[str, list[int]] | None = {} if only_full_attention(scheduler.kv_cache_config) else None

    def __call__(self, iid: str) -> list[int]:
        """`iid`'s block ids now. The list is kept for the next step: copy it to keep it."""
        blocks = self.manager.coordinator.get_blocks(iid)[self.group]
        if self._tables is None:
            return [b.block_id for b in blocks]
        ids = self._tables.get(iid)
        if ids is None or len(ids) > len(blocks):
            ids = self._tables[iid] = [b.block_id for b in blocks]
        elif len(ids) < len(blocks):
            ids.extend(b.block_id for b in blocks[len(ids):])
        return ids

    def forget(self, iids: Any) -> None:
        """Preempted or finished: their blocks went back, a new table starts from scratch."""
        if self._tables is not None:
            for iid in iids:
                self._tables.pop(iid, None)


class ChangeTracker:
    """Dirty blocks and requests of one vLLM scheduler since the last refresh point."""

    def __init__(self, records: RecordBuilder, tables: BlockTables) -> None:
        self.records = records    # the owner's: scheduler, pool, requests, block size, block dicts
        self.tables = tables
        self.sent = Sent()        # what the consumer holds of each request (by the id shown)
        self.dirty_blocks: set[int] = set()
        self.dirty_from: dict[str, int] = {}    # vLLM id -> first table index whose block may hold new tokens
        self.dirty_requests: set[str] = set()   # vLLM ids

    # -- every step, and between steps -----------------------------------------------------------
    def note_step(self, cap: Any) -> None:
        self.dirty_blocks.update(cap.dirty_blocks)  # every block of its events among them
        out = cap.out
        if out is None:
            return
        bs = self.records.block_size
        computed, admitted = computed_before(out)
        for iid, before in computed.items():
            # An admitted request's whole table is new to the consumer; a running one's blocks
            # before the one its first scheduled token lands in are unchanged.
            first = 0 if iid in admitted else int(before) // bs
            self.dirty_from[iid] = min(first, self.dirty_from.get(iid, first))
        self.dirty_requests.update(out.num_scheduled_tokens)
        for iid in out.preempted_req_ids or ():
            self.dirty_requests.add(iid)
            self.sent.table_went_back(self.records.external[iid])
        self.tables.forget(out.preempted_req_ids or ())

    def note_request(self, iid: str) -> None:
        """A request arrived (or was aborted) outside a step."""
        self.dirty_requests.add(iid)
        self.dirty_from[iid] = 0

    def note_blocks(self, cap: Any) -> None:
        """Block events outside a step (an abort's frees)."""
        self.dirty_blocks.update(cap.dirty_blocks)

    # -- refresh points --------------------------------------------------------------------------
    def changes(self, step: int, finished: list[RequestState]) -> ChangesDict:
        """The changes since the last refresh point, `finished` being the requests that finished
        since (each given once); then forget the notes."""
        view = self.records
        s = view.scheduler
        running = {r.request_id for r in s.running}
        held: dict[int, list[int]] = {}
        requests: dict[str, RequestChangeDict] = {}
        decoded: list[DecodeRow] = []
        for iid in self.dirty_requests:
            e = view.requests.get(view.external[iid])
            if e is None or e.finish_reason is not None:
                continue  # finished: its whole dict travels in `finished`
            table = self.tables(iid) if iid in running else []
            first = self.dirty_from.get(iid, 0)
            group_fields = view.group_fields(e, bool(table))
            for t in (table, *group_fields.get(REQ.GROUP_BLOCK_TABLES, ())):  # every group's blocks
                self._hold(e.req, t, first, held)
            r = e.req
            # A plain decode goes as a row of the decodes (one KV cache group, and texts to send).
            if not group_fields and view.tokenizer is not None and self.sent.decoded(
                    e.request_id, (status_name(r.status), e.num_cached_tokens, int(r.num_preemptions)),
                    r.output_token_ids, table, e.metrics):
                decoded.append((e.request_id, int(r.num_computed_tokens), view.output_text(e), r.output_token_ids,
                                e.metrics))
            else:
                requests[e.request_id] = self._request_change(e, table, group_fields)
        blocks = self._refresh_blocks(held)
        self._forget_notes()
        self.forget(finished)
        ext, known = view.external, view.requests
        queues: QueueOrderDict = {
            QUEUE.WAITING: [ext[r.request_id] for r in view.waiting() if ext[r.request_id] in known],
            QUEUE.RUNNING: [ext[r.request_id] for r in s.running if ext[r.request_id] in known]}
        changes: ChangesDict = {
            CHANGES.STEP: step, CHANGES.REQUESTS: requests, CHANGES.QUEUES: queues,
            CHANGES.FINISHED: [view.finished_dict(e) for e in finished], CHANGES.BLOCKS: blocks,
            CHANGES.NUM_FREE_BLOCKS: int(view.pool.get_num_free_blocks()), CHANGES.METRICS: view.metrics}
        if decoded:
            changes[CHANGES.DECODES] = decodes_dict(decoded)
        return changes

    def forget(self, finished: list[RequestState]) -> None:
        """Finished requests leave the notes (a server with no subscriber for days keeps none)."""
        for e in finished:
            self.dirty_requests.discard(e.internal_id)
            self.dirty_from.pop(e.internal_id, None)
        self.sent.forget(e.request_id for e in finished)
        self.tables.forget(e.internal_id for e in finished)

    # -- parts -----------------------------------------------------------------------------------
    def _hold(self, req: Any, table: list[int], first: int, held: dict[int, list[int]]) -> None:
        """The tokens `req` keeps in its blocks from table index `first` on (computed ones only)."""
        bs, n = self.records.block_size, req.num_computed_tokens
        hold_tokens(held, table, first, bs, req.all_token_ids[first * bs:n], n, self.records.pool.null_block.block_id)

    def _refresh_blocks(self, held: dict[int, list[int]]) -> list[BlockDict]:
        """Rebuild the dirty blocks (and those `held` names) from the pool as it is now."""
        view = self.records
        pool = view.pool.blocks
        return [view.block_dict(pool[b], held.get(b), []) for b in sorted(self.dirty_blocks | held.keys())]

    def _request_change(self, e: RequestState, table: list[int], group_fields: RequestFieldsDict) -> RequestChangeDict:
        """A request's change: its small fields, its growing lists from what the consumer holds
        (the other KV cache groups' tables whole: a sliding one is not append-only)."""
        r, view = e.req, self.records
        fields = request_fields(e.request_id, status_name(r.status), int(r.num_computed_tokens), e.num_cached_tokens,
                                int(r.num_preemptions), e.finish_reason)
        fields.update(group_fields)
        if view.tokenizer is not None:
            fields[REQ.OUTPUT_TEXT] = view.output_text(e)
        # first_seen's open dict: the prompt and its hash domain, once
        return self.sent.change(e.request_id, fields, r.output_token_ids, table, e.metrics,
                                lambda: view.first_seen(e))

    def _forget_notes(self) -> None:
        self.dirty_blocks = set()
        self.dirty_from = {}
        self.dirty_requests = set()
