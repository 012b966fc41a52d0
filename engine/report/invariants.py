"""Bookkeeping invariants checked after a step (EngineConfig(check_invariants=True)).

An explorer that shows wrong block tables teaches wrong things: these checks make every
test step prove the pool, the tables, the prefix cache and the packed batch agree."""
from __future__ import annotations

from collections import Counter

from ..core.block_pool import NULL_BLOCK_ID
from ..core.kv_cache_manager import cdiv
from ..request import Request, RequestStatus


class InvariantError(AssertionError):
    """The engine's state contradicts itself; the message says which rule broke."""


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise InvariantError(message)


def _tables(req: Request) -> list[list[int]]:
    """The request's block table in every KV cache group (a sliding-window group's holds the
    null block where blocks left its window)."""
    return [req.block_table, *req.extra_block_tables]


def check_invariants(engine, out=None, batch=None) -> None:
    """Raise InvariantError if any rule is broken; `out`/`batch` are the step's schedule and batch."""
    pool, bs = engine.kv.pool, engine.config.block_size
    running = list(engine.scheduler.running)
    refs = Counter(b for r in running for t in _tables(r) for b in t if b != NULL_BLOCK_ID)
    for blk in pool.blocks:
        b = blk.block_id
        _require(blk.ref_count == refs.get(b, 0),
                 f"block {b}: ref_count {blk.ref_count} but held by {refs.get(b, 0)} live block tables")
        _require(not (pool.is_free(b) and blk.ref_count > 0), f"block {b} is both free and in use")
    _require(0 not in pool.free_queue and pool.blocks[0].ref_count == 0, "the null block 0 was allocated or freed")
    used = sum(1 for blk in pool.blocks if blk.ref_count > 0)
    _require(pool.num_free_blocks + used + 1 == pool.num_blocks,
             f"free {pool.num_free_blocks} + used {used} + null 1 != total {pool.num_blocks}")
    for key, block_ids in pool.cached_blocks_of_hash.items():
        group, h = key if isinstance(key, tuple) else (0, key)  # another KV cache group's key: (group, hash)
        _require(bool(block_ids), f"hash {h:016x} maps to no block")
        for b in block_ids:
            blk = pool.blocks[b]
            _require(blk.block_hash == h and blk.kv_cache_group_id == group,
                     f"hash {h:016x} of group {group} maps to block {b} which holds {blk.block_hash} "
                     f"of group {blk.kv_cache_group_id}")
            _require(len(blk.token_ids) == bs, f"cached block {b} stores {len(blk.token_ids)} token ids, not {bs}")
    registered = sum(len(ids) for ids in pool.cached_blocks_of_hash.values())
    _require(registered == sum(blk.block_hash is not None for blk in pool.blocks),
             "a block holds a hash that the prefix cache does not list")
    for req in [*engine.scheduler.waiting, *engine.scheduler.finished]:
        _require(not any(_tables(req)),
                 f"request {req.request_id} ({req.status.value}) still holds blocks {_tables(req)}")
    for req in running:
        _require(req.status == RequestStatus.RUNNING, f"request {req.request_id} in running has status {req.status}")
        need = cdiv(req.num_computed_tokens, bs)
        for table in _tables(req):
            _require(need <= len(table) <= need + 1, f"request {req.request_id}: {len(table)} "
                     f"blocks for {req.num_computed_tokens} computed tokens")
            held = [b for b in table if b != NULL_BLOCK_ID]
            _require(len(set(held)) == len(held), f"request {req.request_id} lists a block twice")
        # Blocks are registered when allocated; after the step their KV must exist.
        _require(req.num_cached_blocks <= req.num_computed_tokens // bs,
                 f"request {req.request_id}: {req.num_cached_blocks} blocks registered but only "
                 f"{req.num_computed_tokens} tokens computed")
        for i, b in enumerate(req.block_table):
            blk = pool.blocks[b]
            if blk.block_hash is not None:
                _require(i < len(req.block_hashes) and req.block_hashes[i] == blk.block_hash,
                         f"request {req.request_id}: block {b} at index {i} holds another prefix's hash")
                _require(list(blk.token_ids) == req.all_token_ids[i * bs:(i + 1) * bs],
                         f"block {b}: stored token ids differ from request {req.request_id}'s tokens")
    if out is not None and batch is not None:
        _check_batch(out, batch, bs)


def _check_batch(out, batch, bs: int) -> None:
    qsl = batch.query_start_loc
    _require(qsl[0] == 0 and len(qsl) == len(out.scheduled) + 1, "query_start_loc has the wrong length")
    logits = []
    for i, s in enumerate(out.scheduled):
        lo, hi = qsl[i], qsl[i + 1]
        _require(hi - lo == s.num_tokens, f"query_start_loc gives {hi - lo} tokens to {s.request.request_id}, "
                                          f"scheduled {s.num_tokens}")
        positions = list(range(s.num_computed_before, s.num_computed_before + s.num_tokens))
        _require(batch.positions[lo:hi] == positions, f"positions of {s.request.request_id} are not {positions[:3]}...")
        _require(batch.seq_lens[i] == positions[-1] + 1, f"seq_lens[{i}] != last position + 1")
        for slots, tables in [(batch.slot_mapping, batch.block_tables),
                              *zip(batch.group_slot_mappings, batch.group_block_tables)]:
            want = [tables[i][p // bs] * bs + p % bs for p in positions]
            _require(slots[lo:hi] == want and NULL_BLOCK_ID * bs not in want[:1],
                     f"slot_mapping of {s.request.request_id} breaks the slot formula")
        _require(batch.input_ids[lo:hi] == s.request.all_token_ids[positions[0]:positions[-1] + 1],
                 f"input_ids of {s.request.request_id} are not its tokens")
        if s.sample:
            logits.append(hi - 1)
    _require(batch.logits_indices == logits, f"logits_indices {batch.logits_indices} != sampled rows {logits}")
