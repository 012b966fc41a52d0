"""kvscope panels: anywidget views over plain dicts, lists and bytes.

Nothing here imports torch or the engine; ``explorer.ui.dashboard`` feeds the panels
from a Session. Each panel is usable alone (see ``explorer.ui.dashboard``).
"""
from __future__ import annotations

from ._base import Panel
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

#: Each panel by the name the Dashboard (explorer.ui.dashboard) and the export use for it.
PANELS: dict[str, type[Panel]] = {
    "controls": ControlsPanel, "queues": QueuesPanel, "sampler": SamplerPanel, "blocks": BlockPoolPanel,
    "slots": SlotMappingPanel, "attention": AttentionPanel, "timeline": TimelinePanel, "latency": LatencyPanel,
    "tensor_parallel": TensorParallelPanel, "why": WhyPanel, "tree": PrefixTreePanel,
}
#: Every panel whose state is typed (widgets/_state.py): the Dashboard's, and a live server's Follow panel.
STATEFUL_PANELS: dict[str, type[Panel]] = {**PANELS, "follow": FollowPanel}

