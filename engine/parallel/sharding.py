"""Which slice of each checkpoint weight lives on which rank (Megatron-style tensor parallel).

Column-parallel (split along the output rows): q/k/v, gate/up, the embedding and the LM
head (vocab rows). Row-parallel (split along the input columns): o_proj and down_proj,
whose partial outputs are summed by an all-reduce. Norms are replicated. The loader reads
this table to take only its slice from the safetensors file; `sharding_layout` reports it.
"""
from __future__ import annotations

from typing import Any, Protocol


class ShardedShape(Protocol):
    """The sizes tensor parallelism splits across ranks, and the facts the layout shows
    (engine.model.ModelSpec, a frozen dataclass, has them: the model imports this package,
    never the reverse). Read-only properties, so a frozen dataclass fits."""

    @property
    def num_heads(self) -> int: ...
    @property
    def num_kv_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def hidden_size(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def intermediate_size(self) -> int: ...
    @property
    def attention_bias(self) -> bool: ...
    @property
    def qk_norm(self) -> bool: ...
    @property
    def tie_word_embeddings(self) -> bool: ...


# HF module name -> the dimension of its weight split across ranks (0: rows, 1: columns).
SPLIT_DIM = {"embed_tokens": 0, "lm_head": 0, "q_proj": 0, "k_proj": 0, "v_proj": 0,
             "gate_proj": 0, "up_proj": 0, "o_proj": 1, "down_proj": 1}


def split_dim(name: str) -> int | None:
    """The split dimension of checkpoint tensor `name` (None: every rank holds all of it)."""
    parts = name.split(".")
    module, leaf = (parts[-2] if len(parts) > 1 else ""), parts[-1]
    dim = SPLIT_DIM.get(module)
    if dim == 1 and leaf == "bias":
        return None  # a row-parallel bias is whole on every rank and added once (by rank 0)
    return dim


def shard_bounds(length: int, rank: int, size: int) -> tuple[int, int]:
    """[lo, hi) of rank's even share of `length` (divisibility is checked at engine start)."""
    part = length // size
    return rank * part, (rank + 1) * part


def rank_ranges(spec: ShardedShape, size: int) -> list[dict[str, Any]]:
    """Per rank: its [lo, hi) of query heads, KV heads, vocabulary rows and MLP rows."""
    return [{"rank": r, "heads": list(shard_bounds(spec.num_heads, r, size)),
             "kv_heads": list(shard_bounds(spec.num_kv_heads, r, size)),
             "vocab": list(shard_bounds(spec.vocab_size, r, size)),
             "intermediate": list(shard_bounds(spec.intermediate_size, r, size))}
            for r in range(size)]


def sharding_layout(spec: ShardedShape, size: int) -> list[dict[str, Any]]:
    """One entry per weight of a decoder layer (plus embedding, final norm, LM head), in
    forward order: HF name, full [out, in] shape, how it is split, what it is packed into,
    and the collective that follows it."""
    s = spec
    q, kv = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
    h, i, v = s.hidden_size, s.intermediate_size, s.vocab_size

    def w(name, shape, unit=None, packed=None, after=None, bias=False):
        dim = split_dim(name + ".weight")
        return {"name": name, "shape": list(shape), "split": None if dim is None else ("rows", "columns")[dim],
                "unit": unit,
                "per_rank": [list(shard_bounds(shape[dim], r, size)) for r in range(size)] if dim is not None else None,
                "packed_into": packed, "after": after if size > 1 else None, "bias": bias}

    layout = [w("embed_tokens", (v, h), "vocab", after="all_reduce"), w("input_layernorm", (h,))]
    layout += [w("q_proj", (q, h), "heads", "qkv_proj", bias=s.attention_bias),
               w("k_proj", (kv, h), "kv_heads", "qkv_proj", bias=s.attention_bias),
               w("v_proj", (kv, h), "kv_heads", "qkv_proj", bias=s.attention_bias)]
    if s.qk_norm:
        layout += [w("q_norm", (s.head_dim,)), w("k_norm", (s.head_dim,))]
    layout += [w("o_proj", (h, q), "heads", after="all_reduce"), w("post_attention_layernorm", (h,)),
               w("gate_proj", (i, h), "intermediate", "gate_up_proj"),
               w("up_proj", (i, h), "intermediate", "gate_up_proj"),
               w("down_proj", (h, i), "intermediate", after="all_reduce"),
               w("norm", (h,))]
    head = w("lm_head", (v, h), "vocab", after="gather")
    head["tied_to"] = "embed_tokens" if s.tie_word_embeddings else None
    return [*layout, head]
