"""KV block pool panel: every physical block on one canvas, plus per-request block tables."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, NotRequired, TypedDict

import traitlets as t

from ._base import Panel, bundle_css, bundle_esm
from .hover import TokenText, block_detail


class BlockPoolCells(TypedDict):
    """The canvas: one cell per block, from the byte columns (explorer.ui.views.BLOCK_COLUMNS)."""
    num_blocks: int
    block_size: int
    status: bytes
    ref_count: bytes
    owner: bytes
    events: bytes
    group: bytes
    group_labels: list[str]   # each KV cache group's name, group 0 first
    owners: list[str]   # request ids indexed by the `owner` column
    shared: list[list[int | list[int]]]   # [block_id, [indices into owners]] of each block with several owners


class BlockPoolLegend(TypedDict):
    """The legend's counts: each event of this step, and the blocks by status."""
    counts: dict[str, int]   # each event key (KVS_SCHEMA.block_events), free, free_cached, in_use, num_free_blocks


class GroupRowDict(TypedDict):
    """A request's block table in one KV cache group, as a block-table row shows it (`group_rows`)."""
    label: str
    block_table: list[int]
    hit_tokens: int | None   # the group's own prefix hit when the request was admitted (None: not known)
    cut: bool                # this group's hit is the shortest, and cut the request's


class BlockTableRowDict(TypedDict):
    """One running request's block table: logical -> physical, and which logical indices came from the cache."""
    request_id: str
    block_table: list[int]
    num_computed_tokens: int
    hits: list[int]             # prefix hits when the request was admitted in this step
    same_step_hits: list[int]   # of those, the blocks cached earlier in this same step
    cached: list[int]           # KV from the prefix cache at its (last) admission, for as long as it runs
    groups: NotRequired[list[GroupRowDict]]   # each KV cache group's table (a model with several groups only)


class BlockPoolTables(TypedDict):
    """The per-request block tables."""
    block_tables: list[BlockTableRowDict]   # one per running request with blocks


class BlockPoolState(BlockPoolCells, BlockPoolLegend, BlockPoolTables):
    """What explorer.ui.views.block_pool_state returns (with `blocks`, kept Python-side)."""
    blocks: list[dict]


class BlockPoolPanel(Panel):
    """The whole physical KV pool, drawn on a canvas so 4,096 blocks stay fluid.

    Per-block data travels as compact byte columns, one entry per block id:
    `status` (uint8: 0 null, 1 free, 2 free and cached, 3 in use, 4 in use and
    hashed), `ref_count` (uint16), `owner` (int16 index into `owners`, -1 none) and
    `events` (uint8 bits, the record schema's block event bits: 1 allocated, 2 prefix hit, 4 freed, 8 evicted,
    16 newly cached, 32 same-step hit, all in this step), `group` (uint8: the KV cache group whose
    table holds it, 0 full attention; `group_labels` names each). `shared` lists the blocks with
    several owners as ``[block_id, [indices into owners]]`` (drawn in every owner's
    colour). A block's hash, owners and
    tokens are fetched on hover: the browser sends ``block_detail {block_id}`` and
    `detail` is filled in from the displayed snapshot. `block_tables` lists each
    request's logical -> physical map, with the logical indices that were prefix hits
    (and same-step hits) when the request was admitted in this step, and `cached`: the
    logical indices whose KV came from the prefix cache, for as long as the request runs.
    """

    NAME = "blocks"
    PARTS: ClassVar[dict[str, type]] = {"pool": BlockPoolCells, "legend": BlockPoolLegend, "tables": BlockPoolTables}
    _esm = bundle_esm("block_pool.js")
    _css = bundle_css("block_pool.css")

    block_size = t.Int(16).tag(sync=True)
    selected = t.Int(-1).tag(sync=True)
    detail = t.Dict({}).tag(sync=True)

    def __init__(self, token_text: TokenText | None = None, **kwargs: object) -> None:
        super().__init__(**kwargs)
        #: Turns token ids into their texts for hover details (None: ids only).
        self.token_text = token_text
        self._blocks: list[dict] = []  # the displayed snapshot's blocks, kept off the wire

    def show(self, state: Mapping[str, Any]) -> None:
        """Apply a state from ``explorer.ui.views.block_pool_state`` (its "blocks" stay here)."""
        state = dict(state)
        self._blocks = state.pop("blocks", [])
        with self.hold_sync():
            for key, value in state.items():
                setattr(self, key, value)
            if self.selected >= 0:
                self.detail = self.block_detail(self.selected)

    def block_detail(self, block_id: int) -> dict:
        """Everything about one block of the displayed snapshot, token texts included."""
        return block_detail(self._blocks, block_id, self.step, self.token_text)

    def handle_action(self, content: dict) -> bool:
        action = content.get("action")
        if action == "block_detail":
            self.detail = self.block_detail(int(content.get("block_id", -1)))
            return True
        if action == "select_block":
            self.selected = int(content.get("block_id", -1))
            self.detail = self.block_detail(self.selected)
            return True
        return False
