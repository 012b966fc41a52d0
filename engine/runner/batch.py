"""The packed inputs of one step (vLLM v1's names): what the runner builds from the scheduler's
decision, the StepRecord shows, and a tensor-parallel worker rebuilds from what rank 0 sent."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..report.schema import BatchDict


@dataclass
class Batch:
    """The packed inputs of one step, as plain lists (for the StepRecord) and tensors."""

    input_ids: list[int]
    positions: list[int]
    query_start_loc: list[int]
    seq_lens: list[int]
    slot_mapping: list[int]
    block_tables: list[list[int]]
    logits_indices: list[int]
    # KV cache groups past the first (a model's sliding-window layers): each group's slot
    # mapping and block tables over the same rows, in group order.
    group_slot_mappings: list[list[int]] = field(default_factory=list)
    group_block_tables: list[list[list[int]]] = field(default_factory=list)

    def to_dict(self) -> BatchDict:
        """The StepRecord's `batch` (the lists themselves: the record copies them)."""
        batch: BatchDict = {
            "input_ids": self.input_ids, "positions": self.positions, "query_start_loc": self.query_start_loc,
            "seq_lens": self.seq_lens, "slot_mapping": self.slot_mapping, "block_tables": self.block_tables,
            "logits_indices": self.logits_indices}
        if self.group_block_tables:
            batch["group_slot_mappings"] = self.group_slot_mappings
            batch["group_block_tables"] = self.group_block_tables
        return batch
