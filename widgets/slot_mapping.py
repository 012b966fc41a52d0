"""Slot-mapping panel: this step's packed batch, token by token."""
from __future__ import annotations

from typing import ClassVar, TypedDict

import traitlets as t

from ._base import Panel, bundle_css, bundle_esm


class CachedBlockDict(TypedDict):
    """One block of a prefix hit in the slot-mapping panel: positions [start, end) and their text."""
    block: int
    start: int
    end: int
    text: str   # "": the tokens are not known


class SlotGroupTableDict(TypedDict):
    """A scheduled request's block table in another KV cache group (a sliding window's)."""
    label: str
    block_table: list[int]


class SlotSegmentDict(TypedDict):
    """One scheduled request's rows [start, end) of the packed batch (start, end: query_start_loc)."""
    request_id: str
    start: int
    end: int
    is_prefill: bool
    chunk_index: int | None   # which prefill chunk (from 0); None for a decode
    num_computed_before: int
    num_cached_tokens: int
    seq_len: int | None       # None: the batch has no seq_lens entry for it
    block_table: list[int]
    sampled_text: str | None  # the token sampled for it in this step (None: none)
    cached_blocks: list[CachedBlockDict]   # the blocks a prefix hit in this step took from the cache
    groups: list[SlotGroupTableDict]       # its tables in the other KV cache groups, in group order


class SlotMappingState(TypedDict):
    """What explorer.ui.views.slot_mapping_state returns (the traits below say each field)."""
    input_ids: list[int]
    tokens: list[str]
    positions: list[int]
    slot_mapping: list[int]
    group_slot_mappings: list[list[int]]   # per other KV cache group: its slots
    segments: list[SlotSegmentDict]
    query_start_loc: list[int]
    logits_indices: list[int]
    block_size: int
    num_rows: int   # rows in the real batch
    truncated: int   # rows not sent
    batch_source: str   # "", "scheduler" (derived) or "runner" (its buffers)
    batch_source_words: list[str]   # [badge, hover text] for batch_source


class SlotMappingPanel(Panel):
    """The flattened batch the model ran in this step (vLLM v1 names).

    Columns, one entry per batch row: `input_ids`, `tokens` (their texts),
    `positions`, `slot_mapping` (slot = block * block_size + offset); a model with more KV cache
    groups (sliding-window layers) adds each other group's slots in `group_slot_mappings`, and
    each segment its `groups` ({label, block_table}). `segments` has
    one entry per scheduled request: request_id, start/end rows (query_start_loc),
    is_prefill, chunk_index, num_computed_before, num_cached_tokens, seq_len,
    block_table, sampled_text, and cached_blocks (a prefix hit in this step: one
    ``{block, start, end, text}`` per block taken from the cache, drawn as "from cache"
    cells). `logits_indices` marks the rows that were sampled. Cells are grouped and
    tinted by the KV block they land in; hovering one lights its block, request and
    token in the other panels of the Dashboard.
    Large batches are cut to `max_rows` rows (`truncated` says how many were hidden).
    `batch_source` says where the batch came from when it is not the engine's own ("" then):
    "scheduler" (a live server's feed: derived from the scheduler's block tables) or "runner"
    (the model runner's own buffers); `batch_source_words` is its badge and hover text.
    """

    NAME = "slots"
    PARTS: ClassVar[dict[str, type]] = {"draw": SlotMappingState}
    _esm = bundle_esm("slot_mapping.js")
    _css = bundle_css("slot_mapping.css")

    block_size = t.Int(16).tag(sync=True)
