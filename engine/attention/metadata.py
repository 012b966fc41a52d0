"""Per-step attention inputs, named as in vLLM v1 (query_start_loc, seq_lens, slot_mapping)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

T = TypeVar("T")


@dataclass
class AttentionMetadata:
    """Describes the packed batch: sequence i owns query rows
    query_start_loc[i]:query_start_loc[i+1]; its context is seq_lens[i] tokens, the first
    context_lens[i] of which were already in the cache before this step."""

    query_start_loc: list[int]
    seq_lens: list[int]
    context_lens: list[int]
    slot_mapping: torch.Tensor        # [num_tokens] int64; -1 = do not write
    block_tables: torch.Tensor        # [num_seqs, max_blocks] int64, padded with the null block 0
    block_size: int
    # "Decode" in the attention sense, as in vLLM's backends (query_len <= 1): a sequence with
    # exactly one query row and some context. A 1-token last prefill chunk is one too, so it
    # takes the decode kernel although the scheduler still calls it a prefill chunk.
    decode_seq_ids: list[int] = field(default_factory=list)
    decode_block_tables: torch.Tensor | None = None           # [num_decodes, max_blocks]
    decode_seq_lens: torch.Tensor | None = None               # [num_decodes]
    decode_rows: torch.Tensor | None = None                   # query rows of the decodes
    # Probe mode: read everything from the cache (write nothing) and keep layer `probe_layer`'s
    # attention probabilities in `probe_probs`.
    probe_layer: int | None = None
    probe_probs: torch.Tensor | None = None
    # KV cache groups (vLLM's kv_cache_groups): this metadata is group 0's (full attention);
    # `other_groups` holds the rest, each with its own slot mapping and block tables over the
    # same rows. A sliding-window group's queries read their last `sliding_window` positions.
    sliding_window: int | None = None
    other_groups: list[AttentionMetadata] = field(default_factory=list)
    # What kernel backends derive from the fields above (see `derived`); per step, never shared.
    _derived: dict[Callable[[AttentionMetadata], Any], Any] = field(default_factory=dict, init=False, repr=False,
                                                                    compare=False)

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)

    @property
    def probing(self) -> bool:
        return self.probe_layer is not None

    def group(self, index: int) -> AttentionMetadata:
        """The metadata of KV cache group `index` (0: this one)."""
        return self if index == 0 else self.other_groups[index - 1]

    def decode_inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(decode_block_tables, decode_seq_lens, decode_rows): the runner sets all three
        whenever `decode_seq_ids` lists a decode; a kernel asks for them only then."""
        tables, lens, rows = self.decode_block_tables, self.decode_seq_lens, self.decode_rows
        if tables is None or lens is None or rows is None:
            raise ValueError(f"decode sequences {self.decode_seq_ids} without their block tables, lengths and rows")
        return tables, lens, rows

    def derived(self, build: Callable[[AttentionMetadata], T]) -> T:
        """`build(self)`, computed on the first layer's call and reused by the step's other
        layers (index tensors, decode plans). Keyed by the builder function itself, so two
        backends' inputs never collide; it lives and dies with this step's metadata."""
        if build not in self._derived:
            self._derived[build] = build(self)
        return self._derived[build]
