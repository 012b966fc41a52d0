"""The packed inputs of one step (vLLM v1's names): what the runner builds from the scheduler's
decision, the StepRecord shows, and a tensor-parallel worker rebuilds from what rank 0 sent; and
what the sampler chose for each row. Plain lists: no torch here."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..core.scheduler import SchedulerOutput


@dataclass
class SampleResult:
    """The token chosen for one row, and the top candidates it was drawn from."""
    token_id: int
    top: list[tuple[int, float]]  # (token id, probability) after temperature / top-k / top-p


@dataclass
class Batch:
    """The packed inputs of one step, as plain lists (for the StepRecord) and tensors."""

    input_ids: list[int]
    positions: list[int]
    query_start_loc: list[int]
    seq_lens: list[int]
    slot_mapping: list[int]
    # Group 0's table of each row. build_batch puts the request's own list here, not a copy:
    # a full-attention table only grows while its request holds it (a freed or preempted
    # request gets a new list), and this step reads it before the next schedule extends it.
    # `block_table_lens` says how long each was (what a record keeps, engine/report/records.py).
    block_tables: list[list[int]]
    logits_indices: list[int]
    # KV cache groups past the first (a model's sliding-window layers): each group's slot
    # mapping and block tables over the same rows, in group order (copies: a sliding window's
    # table changes in place, its blocks that left the window turning null).
    group_slot_mappings: list[list[int]] = field(default_factory=list)
    group_block_tables: list[list[list[int]]] = field(default_factory=list)
    block_table_lens: list[int] | None = None   # None: each row of block_tables is this step's alone


# A built step: its Batch, each row's context length and the rows that decode one token.
BuiltBatch = tuple[Batch, list[int], list[int]]

# The input id a placeholder holds until the step in flight samples it (fill_placeholders).
PLACEHOLDER_ID = 0


def build_batch(out: SchedulerOutput, block_size: int, num_groups: int = 1) -> BuiltBatch:
    """The step's packed inputs as lists, from the scheduler's decision (no tensors: the model
    runner makes them, and a replay without a model needs none): the Batch, each row's context
    length (the tokens computed before this step) and the rows that decode one token. An input
    past the request's known tokens (async scheduling: the step in flight samples it) holds
    PLACEHOLDER_ID until `fill_placeholders`."""
    bs = block_size
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    qsl, seq_lens, ctx_lens, logits_idx, decode_ids = [0], [], [], [], []
    tables: list[list[int]] = []
    table_lens: list[int] = []
    others = num_groups - 1
    group_slots: list[list[int]] = [[] for _ in range(others)]
    group_tables: list[list[list[int]]] = [[] for _ in range(others)]
    for i, s in enumerate(out.scheduled):
        req, start, n = s.request, s.num_computed_before, s.num_tokens
        end = start + n
        input_ids.extend(req.all_token_ids[start:end])
        if s.num_placeholder_inputs:
            input_ids.extend([PLACEHOLDER_ID] * (start + n - max(start, len(req.all_token_ids))))
        positions.extend(range(start, end))
        table = req.block_table
        slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
        tables.append(table)   # the request's own list (see Batch.block_tables)
        table_lens.append(len(table))
        if others:  # a model of one KV cache group (most) skips this per-request loop
            for g, extra in enumerate(req.extra_block_tables[:others]):
                group_slots[g].extend(extra[p // bs] * bs + p % bs for p in range(start, end))
                group_tables[g].append(list(extra))
        qsl.append(qsl[-1] + n)
        seq_lens.append(end)
        ctx_lens.append(start)
        if s.sample:
            logits_idx.append(qsl[-1] - 1)
        if n == 1 and start > 0:
            decode_ids.append(i)
    batch = Batch(input_ids, positions, qsl, seq_lens, slots, tables, logits_idx, group_slots, group_tables,
                  table_lens)
    return batch, ctx_lens, decode_ids


def fill_placeholders(batch: Batch, out: SchedulerOutput) -> dict[str, int]:
    """Write into a step scheduled ahead (async scheduling) the tokens its placeholder inputs
    stood for, now that the step in flight has landed; returns request id -> the token its
    placeholder held. A request whose step in flight dropped its token (aborted since) keeps
    PLACEHOLDER_ID: its output will be dropped too."""
    held: dict[str, int] = {}
    for i, s in enumerate(out.scheduled):
        if not s.num_placeholder_inputs:
            continue
        req, end = s.request, s.num_computed_before + s.num_tokens
        for p in range(end - s.num_placeholder_inputs, min(end, len(req.all_token_ids))):
            batch.input_ids[batch.query_start_loc[i] + p - s.num_computed_before] = held[req.request_id] = \
                req.all_token_ids[p]
    return held
