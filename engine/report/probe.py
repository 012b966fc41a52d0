"""Attention probes: the weights a request's last step computed, re-read from the paged cache."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypedDict

import torch

from ..model import ModelSpec
from ..request import Request, RequestStatus
from ..runner.model_runner import ModelRunner


class _AttentionProbeFields(TypedDict):
    request_id: str
    layer: int
    heads: list[int]
    kv_head_of_head: list[int]
    query_positions: list[int]
    context_len: int
    block_size: int
    block_table: list[int]
    token_ids: list[int]
    tokens: list[str]
    probs: list[list[list[float]]]   # [head][query][context position]


class AttentionProbeDict(_AttentionProbeFields, total=False):
    """AttentionProbe.to_dict(): what the attention panel takes."""
    source: str   # where the numbers came from (vLLM's probe says)


@dataclass
class AttentionProbe:
    """Attention weights of a request's last computed query positions over its whole context,
    recomputed from the paged KV cache. probs: [len(heads), num_queries, context_len]."""

    request_id: str
    layer: int
    heads: list[int]
    kv_head_of_head: list[int]
    query_positions: list[int]
    context_len: int
    block_size: int
    block_table: list[int]
    token_ids: list[int]
    tokens: list[str]
    probs: torch.Tensor

    def to_dict(self) -> AttentionProbeDict:
        return {"request_id": self.request_id, "layer": self.layer, "heads": self.heads,
                "kv_head_of_head": self.kv_head_of_head, "query_positions": self.query_positions,
                "context_len": self.context_len, "block_size": self.block_size, "block_table": self.block_table,
                "token_ids": self.token_ids, "tokens": self.tokens, "probs": self.probs.tolist()}


def probe_attention(requests: dict[str, Request], request_id: str, layer: int, head: int | None, *,
                    spec: ModelSpec, runner: ModelRunner, decode: Callable[[list[int]], str]) -> AttentionProbe:
    """Checks the arguments (ValueError naming the field), then asks the runner to re-run
    layers 0..layer for the request's last scheduled positions, reading its context from the
    paged cache and writing nothing."""
    req = requests.get(request_id)
    if req is None:
        raise ValueError(f"request_id {request_id!r} does not exist")
    if not isinstance(layer, int) or not 0 <= layer < spec.num_layers:
        raise ValueError(f"layer must be in [0, {spec.num_layers}), got {layer!r}")
    if head is not None and (not isinstance(head, int) or not 0 <= head < spec.num_heads):
        raise ValueError(f"head must be in [0, {spec.num_heads}) or None, got {head!r}")
    if req.status != RequestStatus.RUNNING or req.last_scheduled is None:
        state = f"finished ({req.finish_reason}); its KV blocks were returned" if req.is_finished else \
            "not holding computed KV (waiting or preempted)"
        raise ValueError(f"request_id {request_id!r} is {state}: attention can only be probed while it runs")
    start, end = req.last_scheduled
    probs = runner.probe(req.all_token_ids, start, end, req.block_table, layer, req.extra_block_tables)
    if probs is None:  # the runner gathers every rank's heads on rank 0, this engine's
        raise RuntimeError("the runner returned no attention probabilities on rank 0")
    heads = list(range(spec.num_heads)) if head is None else [head]
    group = spec.num_heads // spec.num_kv_heads
    context = req.all_token_ids[:end]
    return AttentionProbe(
        request_id=request_id, layer=layer, heads=heads, kv_head_of_head=[h // group for h in heads],
        query_positions=list(range(start, end)), context_len=end, block_size=runner.block_size,
        block_table=list(req.extra_block_tables[0] if spec.is_sliding(layer) else req.block_table),  # the layer's group
        token_ids=context, tokens=[decode([t]) for t in context],
        probs=probs[heads].cpu())
