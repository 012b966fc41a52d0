"""kvscope's inference engine: a paged-KV LLM engine you can advance one step at a time.

The names below load on first use: `import engine.core.scheduler` (the scheduler, the KV cache
manager and the block pool, with engine/config.py, request.py and sampling_params.py) needs
neither torch nor the xxhash extension, so the decisions can run where only Python does (a
browser's Pyodide); `from engine import LLM` loads the model side as before.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .lazy_names import lazy_names

if TYPE_CHECKING:
    from .config import EngineConfig
    from .llm import LLM, RequestOutput
    from .llm_engine import LLMEngine
    from .report.probe import AttentionProbe
    from .report.records import EngineSnapshot, StepRecord
    from .request import Request, RequestMetrics, RequestStatus
    from .sampling_params import SamplingParams

_WHERE = {"EngineConfig": ".config", "LLM": ".llm", "RequestOutput": ".llm", "LLMEngine": ".llm_engine",
          "AttentionProbe": ".report.probe", "EngineSnapshot": ".report.records", "StepRecord": ".report.records",
          "Request": ".request", "RequestMetrics": ".request", "RequestStatus": ".request",
          "SamplingParams": ".sampling_params"}

__all__ = [
           "LLM",
           "AttentionProbe",
           "EngineConfig",
           "EngineSnapshot",
           "LLMEngine",
           "Request",
           "RequestMetrics",
           "RequestOutput",
           "RequestStatus",
           "SamplingParams",
           "StepRecord",
]


__getattr__ = lazy_names(__name__, _WHERE)
