"""kvscope's inference engine: a paged-KV LLM engine you can advance one step at a time."""
from .config import EngineConfig
from .llm import LLM, RequestOutput
from .llm_engine import LLMEngine
from .report.probe import AttentionProbe
from .report.records import EngineSnapshot, StepRecord
from .request import Request, RequestMetrics, RequestStatus
from .sampling_params import SamplingParams

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
