"""Tensor-parallel panel: which rows / columns of each weight live on which rank, where
the all-reduces and the logits gather happen, and what the collectives cost."""
from __future__ import annotations

from typing import ClassVar, Literal, NotRequired, TypedDict

import traitlets as t

from ._base import Panel, bundle_css, bundle_esm


class TpInfoDict(TypedDict):
    """The group and the model (the snapshot's model_info and pool size; None where the engine did not say)."""
    name: str | None
    num_layers: int | None
    hidden_size: int | None
    num_heads: int | None
    num_kv_heads: int | None
    head_dim: int | None
    vocab_size: int | None
    intermediate_size: int | None
    dtype: str | None
    kv_bytes_per_rank: int | None
    kv_bytes_per_block_per_rank: int | None
    size: int                   # tensor_parallel_size
    backend: str | None         # 'gloo' or 'nccl' (None: one rank)
    num_blocks: int | None      # the KV pool's blocks, the same on every rank


class TpRankDict(TypedDict):
    """One rank's share: [lo, hi) of query heads, KV heads, vocabulary rows and MLP rows, and its KV pool."""
    rank: int
    device: str
    heads: list[int]
    kv_heads: list[int]
    vocab: NotRequired[list[int]]          # (vLLM: where its embedding says)
    intermediate: NotRequired[list[int]]   # (vLLM: where its MLP says)
    kv_bytes: int
    kv_bytes_per_block: NotRequired[int]   # (vLLM's workers)


class TpWeightDict(TypedDict):
    """One weight, in forward order (engine/parallel/sharding.py sharding_layout): how it is split and what follows."""
    name: str
    shape: list[int]                              # the full [out, in]
    split: Literal["rows", "columns"] | None      # None: every rank holds all of it
    unit: str | None                              # what a split's rows count: 'vocab', 'heads', ...
    per_rank: list[list[int]] | None              # each rank's [lo, hi) of the split dimension
    packed_into: str | None                       # the fused weight it lives in ('qkv_proj', 'gate_up_proj')
    after: Literal["all_reduce", "gather"] | None   # the collective after it (None: none, or one rank)
    bias: bool
    tied_to: NotRequired[str | None]              # (the LM head only) the weight it shares


class TpLastStepDict(TypedDict):
    """The displayed step's times in ms: rank 0's collectives, the forward and the whole step."""
    step: int
    collectives_ms: float
    forward_ms: float
    total_ms: float


class TpNoStepDict(TypedDict):
    """`last_step` before any step ran: {}."""


class TensorParallelState(TypedDict):
    """What explorer.ui.tp_view.tensor_parallel_state returns."""
    info: TpInfoDict
    ranks: list[TpRankDict]
    weights: list[TpWeightDict]
    last_step: TpLastStepDict | TpNoStepDict
    recent: list[list[float]]   # [step, collectives_ms, forward_ms] per step, up to the displayed one
    note: str


class TensorParallelPanel(Panel):
    """How the running engine is split across ranks (built by
    ``explorer.ui.tp_view.tensor_parallel_state``).

    `info`: ``{size, backend, name, num_layers, hidden_size, num_heads, num_kv_heads,
    head_dim, vocab_size, intermediate_size, dtype, num_blocks, kv_bytes_per_rank,
    kv_bytes_per_block_per_rank}``. `ranks`: one ``{rank, device, heads, kv_heads, vocab,
    intermediate, kv_bytes}`` per rank ([lo, hi) ranges). `weights`: one entry per weight
    in forward order: ``{name, shape, split ('rows'|'columns'|None), unit, per_rank,
    packed_into, after ('all_reduce'|'gather'|None), bias, tied_to?}``. `last_step`:
    ``{step, collectives_ms, forward_ms, total_ms}`` of the displayed step; `recent`:
    ``[[step, collectives_ms, forward_ms], ...]`` up to it. `note` says what the timings
    mean on this machine. No browser actions.
    """

    NAME = "tensor_parallel"
    PARTS: ClassVar[dict[str, type]] = {"draw": TensorParallelState}
    _esm = bundle_esm("tensor_parallel.js")
    _css = bundle_css("tensor_parallel.css")

    last_step = t.Dict({}).tag(sync=True)
