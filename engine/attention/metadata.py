"""Per-step attention inputs, named as in vLLM v1 (query_start_loc, seq_lens, slot_mapping)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


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
    decode_seq_ids: list[int] = field(default_factory=list)   # sequences with exactly one query
    decode_block_tables: torch.Tensor | None = None           # [num_decodes, max_blocks]
    decode_seq_lens: torch.Tensor | None = None               # [num_decodes]
    decode_rows: torch.Tensor | None = None                   # query rows of the decodes
    # Probe mode: read everything from the cache (write nothing) and keep layer `probe_layer`'s
    # attention probabilities in `probe_probs`.
    probe_layer: int | None = None
    probe_probs: torch.Tensor | None = None
    # Device tensors a kernel backend derives from the fields above, built on first use and
    # reused by every layer of the step; keyed by the backend.
    kernel_inputs: dict | None = None

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)
