"""kvscope panels: anywidget views over plain dicts, lists and bytes.

Nothing here imports torch or the engine; ``explorer.ui.dashboard`` feeds the panels
from a Session. Each panel is usable alone (see ``explorer.ui.dashboard``).

The panels and their registries load on first use (module ``__getattr__``): a pure module of
this package (``widgets.hover``, what a panel shows on hover) imports without anywidget, so
the export's view code runs where only Python does (a docs page's Pyodide).
"""
from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._base import PANELS, STATEFUL_PANELS, Panel
    from .attention import AttentionPanel
    from .block_pool import BlockPoolPanel
    from .controls import ControlsPanel
    from .follow import FollowPanel
    from .latency import LatencyPanel
    from .prefix_tree import PrefixTreePanel
    from .queues import QueuesPanel
    from .sampler import SamplerPanel
    from .slot_mapping import SlotMappingPanel
    from .tensor_parallel import TensorParallelPanel
    from .timeline import TimelinePanel
    from .why import WhyPanel

_WHERE = {"PANELS": "_base", "STATEFUL_PANELS": "_base", "Panel": "_base", "AttentionPanel": "attention",
          "BlockPoolPanel": "block_pool", "ControlsPanel": "controls", "FollowPanel": "follow",
          "LatencyPanel": "latency", "PrefixTreePanel": "prefix_tree", "QueuesPanel": "queues",
          "SamplerPanel": "sampler", "SlotMappingPanel": "slot_mapping", "TensorParallelPanel": "tensor_parallel",
          "TimelinePanel": "timeline", "WhyPanel": "why"}

__all__ = [
    "PANELS",
    "STATEFUL_PANELS",
    "AttentionPanel",
    "BlockPoolPanel",
    "ControlsPanel",
    "FollowPanel",
    "LatencyPanel",
    "Panel",
    "PrefixTreePanel",
    "QueuesPanel",
    "SamplerPanel",
    "SlotMappingPanel",
    "TensorParallelPanel",
    "TimelinePanel",
    "WhyPanel",
]


def _load_panels() -> None:
    """A panel registers itself when its module loads (Panel.NAME): load every panel module, so a
    new one in widgets/ reaches PANELS (the Dashboard's and the export's) without a line here.
    The registries then list the panels in one order, whichever module some caller imported
    first: the modules above in their order, then the others by name (what _panels.js lists)."""
    from . import _base

    order = [m for m in dict.fromkeys(_WHERE.values()) if m != "_base"]
    order += [m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_") and m.name not in order]
    rank = {importlib.import_module(f"{__name__}.{name}").__name__: i for i, name in enumerate(order)}
    for registry in (_base.PANELS, _base.STATEFUL_PANELS):
        ranked = sorted(registry.items(), key=lambda item: rank.get(item[1].__module__, len(rank)))
        registry.clear()
        registry.update(ranked)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'widgets' has no attribute {name!r}")
    _load_panels()
    for key, module in _WHERE.items():   # all at once: the registries are complete from here on
        globals()[key] = getattr(importlib.import_module(f".{module}", __name__), key)
    return globals()[name]
