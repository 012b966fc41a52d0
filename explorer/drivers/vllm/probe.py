"""Attention weights from vLLM's own data: the queries one attention layer computed during
the latest step (captured by a hook on that layer's attention implementation only), and the
keys read back from vLLM's paged KV cache through the request's block table, in the layout
vLLM's attention backend writes them (learnt from the backend's own cache-write method).

vLLM's CPU kernel never materialises the weights, so the softmax itself is done here,
with vLLM's scale, over vLLM's queries and vLLM's cached keys. Nothing comes from kvscope.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch

from engine.report.probe import AttentionProbe, AttentionProbeDict


@dataclass
class VllmAttentionProbe(AttentionProbe):
    """AttentionProbe plus `source`: where its numbers came from (the panel shows it)."""

    source: str = ""

    def to_dict(self) -> AttentionProbeDict:
        return {**super().to_dict(), "source": self.source}


class QueryCapture:
    """Keeps the queries of one watched attention layer from the latest step."""

    def __init__(self, runner: Any, layer: int = 0) -> None:
        ctx = runner.compilation_config.static_forward_context
        self.layers: dict[int, Any] = {}
        for name, module in ctx.items():
            m = re.search(r"layers\.(\d+)\.", name)
            if m and hasattr(module, "impl") and hasattr(module, "kv_cache"):
                self.layers[int(m.group(1))] = module
        self.num_layers = len(self.layers)
        self.layer: int | None = None
        self.queries: torch.Tensor | None = None  # [num_tokens, num_heads, head_size] of the latest step
        self.step = -1
        self._current_step = 0
        self.readers: dict[int, KeyReader] = {}
        self.watch(layer)

    def reader(self, layer: int, num_blocks: int) -> KeyReader:
        if layer not in self.readers:
            self.readers[layer] = KeyReader(self.layers[layer], num_blocks)
        return self.readers[layer]

    def begin(self, step: int) -> None:
        """The next vLLM step will be `step`: queries captured from now on belong to it."""
        self._current_step = step
        self.queries = None

    def watch(self, layer: int) -> None:
        """Hook `layer` (and unhook the previous one): only one layer pays the copy."""
        if layer == self.layer:
            return
        if self.layer is not None:
            self.layers[self.layer].impl.__dict__.pop("forward", None)
        impl = self.layers[layer].impl
        original = impl.forward

        def forward(attn_layer, query, key, value, kv_cache, attn_metadata, *args: Any, **kwargs: Any):
            if attn_metadata is not None:  # None: vLLM's warm-up / dummy runs
                n = int(attn_metadata.num_actual_tokens)
                self.queries = query[:n].detach().to("cpu", copy=True)
                self.step = self._current_step
            return original(attn_layer, query, key, value, kv_cache, attn_metadata, *args, **kwargs)

        impl.forward = forward
        self.layer, self.queries, self.step = layer, None, -1

    def close(self) -> None:
        if self.layer is not None:
            self.layers[self.layer].impl.__dict__.pop("forward", None)
            self.layer = None


class KeyReader:
    """Reads keys out of one layer's paged cache in whatever layout vLLM's attention backend
    writes them (on CPU, the 'vec' kernels store each block's keys transposed, head dim
    first). The layout is learnt once, from the backend itself: its own cache-write method
    stores known values into a one-block scratch cache, and where each value lands is where
    that key element lives in every block."""

    def __init__(self, module: Any, num_blocks: int) -> None:
        kv = _cache_tensor(module)
        self.module = module
        self.block_dim = next(d for d, n in enumerate(kv.shape) if n == num_blocks)
        shape = list(kv.shape)
        shape[self.block_dim] = 1
        kvh, hs = int(module.num_kv_heads), int(module.head_size)
        bs = kv.numel() // (num_blocks * 2 * kvh * hs)  # K and V of every slot of a block
        n = bs * kvh * hs
        ids = torch.arange(n)

        def stored(place: int) -> torch.Tensor:
            """A one-block scratch cache, flat, after the backend stored each key element's
            base-256 digit at `place` (plus 1: a zero is an element not written)."""
            scratch = torch.zeros(shape, dtype=kv.dtype, device=kv.device)
            key = ((ids // place) % 256 + 1).to(kv.dtype).reshape(bs, kvh, hs).to(kv.device)
            module.impl.do_kv_cache_update(module, key, torch.zeros_like(key), scratch,
                                           torch.arange(bs, dtype=torch.long, device=kv.device))
            return scratch.flatten().float().cpu()

        flat = stored(1)
        found = (flat != 0).nonzero().flatten()  # where the key elements went
        digits = [flat[found].long() - 1]
        place = 256
        while place < n:  # base-256 digits: exact in fp32, bf16 and fp16 alike
            digits.append(stored(place)[found].long() - 1)
            place *= 256
        value = sum(d * 256 ** i for i, d in enumerate(digits))
        position = torch.empty(n, dtype=torch.long)
        position[value] = found
        # Coordinates in the cache tensor of key (slot t, KV head h, dim d), block left open.
        self.coords = [c.reshape(bs, kvh, hs) for c in torch.unravel_index(position, tuple(shape))]
        self.bs = bs

    def keys(self, block_table: list[int], context: int) -> torch.Tensor:
        """Keys of positions 0..context-1 through `block_table`: [context, kv_heads, head]."""
        kv = _cache_tensor(self.module)
        pos = torch.arange(context)
        slot = pos % self.bs
        index = [c[slot] for c in self.coords]
        index[self.block_dim] = torch.tensor(block_table, dtype=torch.long)[pos // self.bs][:, None, None].expand_as(
            index[0])
        return kv[tuple(i.to(kv.device) for i in index)].float().cpu()


def _cache_tensor(module: Any) -> torch.Tensor:
    kv = module.kv_cache
    return kv[0] if isinstance(kv, (list, tuple)) else kv  # older vLLMs: one per virtual engine


def attention_weights(queries: torch.Tensor, positions: list[int], reader: KeyReader, block_table: list[int],
                      scale: float) -> torch.Tensor:
    """softmax(q . k * scale) of each query over its causal context, K read from vLLM's cache.
    queries: [nq, heads, head]; returns [heads, nq, context]."""
    context = max(positions) + 1
    keys = reader.keys(block_table, context)                       # [context, kv_heads, head]
    q = queries.float()
    keys = keys.repeat_interleave(q.shape[1] // keys.shape[1], dim=1)  # GQA: each KV head serves a group
    scores = torch.einsum("qhd,khd->hqk", q, keys) * scale
    causal = torch.arange(context)[None, :] > torch.tensor(positions)[:, None]
    return torch.softmax(scores.masked_fill(causal[None], float("-inf")), dim=-1)
