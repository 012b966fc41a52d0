"""kvscope panels: anywidget views over plain dicts, lists and bytes.

Nothing here imports torch or the engine; ``explorer.ui.dashboard`` feeds the panels
from a Session. Each panel is usable alone (see ``explorer.ui.dashboard``).
"""
from __future__ import annotations

from typing import Any

from ._base import Panel
from .attention import AttentionPanel
from .block_pool import BlockPoolPanel
from .controls import ControlsPanel
from .queues import QueuesPanel
from .sampler import SamplerPanel
from .slot_mapping import SlotMappingPanel
from .tensor_parallel import TensorParallelPanel
from .timeline import TimelinePanel

__all__ = ["Panel", "ControlsPanel", "QueuesPanel", "BlockPoolPanel", "SlotMappingPanel",
           "AttentionPanel", "SamplerPanel", "TimelinePanel", "TensorParallelPanel", "LatencyPanel"]


def __getattr__(name: str) -> Any:
    # plotly is imported only when the charts are wanted: it is the slowest import here.
    if name == "LatencyPanel":
        from .latency import LatencyPanel
        return LatencyPanel
    raise AttributeError(name)
