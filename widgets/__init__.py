"""kvscope panels: anywidget views over plain dicts, lists and bytes.

Nothing here imports torch or the engine; ``explorer.ui.dashboard`` feeds the panels
from a Session. Each panel is usable alone (see ``explorer.ui.dashboard``).
"""
from __future__ import annotations

import importlib
import pkgutil

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

# A panel registers itself when its module loads (Panel.NAME): load every panel module, so a new
# one in widgets/ reaches PANELS (the Dashboard's and the export's) without a line here.
for _module in pkgutil.iter_modules(__path__):
    if not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")
