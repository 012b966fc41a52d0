"""vLLM's KV cache groups in kvscope's order. A model whose layers keep KV differently (Gemma 3's
sliding-window layers beside full ones) runs with several groups in vLLM 0.32, each with its own
block table and slot mapping over the one block pool. kvscope's records put a full-attention
group first (engine/report/schema.py: the batch's and a request's plain table are group 0's,
the others follow in `group_*` fields); vLLM orders its groups as its layer grouping made them
(sliding first for Gemma 3). `KVGroups` maps one order to the other, describes each group as
model_info does, reads a request's table in every group, and keeps each group's own prefix hit
at a request's admission (vLLM keeps only their intersection)."""
from __future__ import annotations

import re
from typing import Any

from engine.report.schema import KVCacheGroupDict

_LAYER_INDEX = re.compile(r"layers\.(\d+)\.")


class KVGroups:
    """One vLLM scheduler's KV cache groups (see the module doc). `order[g]` is the vLLM group
    shown as kvscope's group g."""

    def __init__(self, scheduler: Any) -> None:
        self.manager = scheduler.kv_cache_manager
        groups = list(scheduler.kv_cache_config.kv_cache_groups)
        self.specs = [g.kv_cache_spec for g in groups]
        self.order = kvscope_order(scheduler.kv_cache_config)
        self.layers = [[int(m.group(1)) for name in groups[g].layer_names if (m := _LAYER_INDEX.search(name))]
                       for g in self.order]
        self.hits: dict[str, list[int]] = {}  # vLLM id -> each group's own hit at its latest lookup
        self._original = None
        if len(groups) > 1:
            self._hook_lookups()

    @property
    def several(self) -> bool:
        return len(self.order) > 1

    def describe(self) -> list[KVCacheGroupDict]:
        """model_info's kv_cache_groups: each group's kind, window and layers, in kvscope's order,
        with its index in vLLM's kv_cache_groups (the order a replay allocates them in)."""
        return [{"kind": _kind(self.specs[g]), "sliding_window": getattr(self.specs[g], "sliding_window", None),
                 "layers": layers, "vllm_group": g} for g, layers in zip(self.order, self.layers)]

    def group_of_layer(self, layer: int) -> int:
        """The vLLM group whose table holds `layer`'s KV (group 0 where a layer is unnamed)."""
        for g, layers in zip(self.order, self.layers):
            if layer in layers:
                return g
        return self.order[0]

    def tables(self, iid: str) -> list[list[int]]:
        """A request's block ids in every group, kvscope's order (the null block 0 where tokens
        left a sliding window)."""
        blocks = self.manager.coordinator.get_blocks(iid)
        return [[b.block_id for b in blocks[g]] for g in self.order]

    def close(self) -> None:
        if self._original is not None:
            self.manager.__dict__.pop("get_computed_blocks", None)
            self._original = None

    def _hook_lookups(self) -> None:
        """After vLLM's lookup of a waiting request's prefix hit (their intersection), each
        group's own hit, by vLLM's per-group lookup over the same hashes and bound."""
        manager = self.manager
        original = self._original = manager.get_computed_blocks
        per_group = getattr(manager.coordinator, "find_longest_cache_hit_per_group", None)

        def get_computed_blocks(request: Any) -> Any:
            result = original(request)
            if per_group is not None and manager.prefix_cache_lookup_enabled(request):
                _, lengths = per_group(request.block_hashes, request.num_tokens - 1)
                self.hits[request.request_id] = [int(lengths[g]) for g in self.order]
            else:
                self.hits[request.request_id] = [0] * len(self.order)
            return result

        manager.get_computed_blocks = get_computed_blocks


def kvscope_order(kv_cache_config: Any) -> list[int]:
    """vLLM's KV cache group indices in kvscope's order: full attention first (stable: vLLM's
    order within a kind), as kvscope's engine has them, so `order[0]` is the group whose table
    a record's plain `block_table` holds and a replay reads."""
    specs = [g.kv_cache_spec for g in kv_cache_config.kv_cache_groups]
    return sorted(range(len(specs)), key=lambda g: _kind(specs[g]) != "full_attention")


def only_full_attention(kv_cache_config: Any) -> bool:
    """Every group keeps all of a running request's blocks (its table only grows): plain full
    attention, not a subclass that drops or recycles blocks."""
    return all(type(g.kv_cache_spec).__name__ == "FullAttentionSpec" for g in kv_cache_config.kv_cache_groups)


def _kind(spec: Any) -> str:
    """A vLLM KVCacheSpec's kind as model_info names it."""
    name = type(spec).__name__
    if "SlidingWindow" in name:
        return "sliding_window"
    if "Mamba" in name:
        return "mamba"
    return "full_attention"
