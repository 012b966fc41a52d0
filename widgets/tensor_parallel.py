"""Tensor-parallel panel: which rows / columns of each weight live on which rank, where
the all-reduces and the logits gather happen, and what the collectives cost."""
from __future__ import annotations

from typing import Any, ClassVar, TypedDict

import traitlets as t

from ._base import Panel, bundle_css, bundle_esm


class TensorParallelState(TypedDict):
    """What explorer.ui.tp_view.tensor_parallel_state returns."""
    info: dict
    ranks: list[dict]
    weights: list[dict]
    last_step: dict
    recent: list[list]
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

    info = t.Dict({}).tag(sync=True)
    ranks: t.List[Any] = t.List([]).tag(sync=True)
    weights: t.List[Any] = t.List([]).tag(sync=True)
    last_step = t.Dict({}).tag(sync=True)
    recent: t.List[Any] = t.List([]).tag(sync=True)
    note = t.Unicode("").tag(sync=True)
