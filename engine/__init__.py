"""kvscope's inference engine: a paged-KV LLM engine you can advance one step at a time."""
from .config import EngineConfig
from .llm import LLM, RequestOutput
from .llm_engine import LLMEngine
from .report.records import EngineSnapshot, StepRecord
from .report.probe import AttentionProbe
from .request import Request, RequestMetrics, RequestStatus
from .sampling_params import SamplingParams

__all__ = ["LLM", "LLMEngine", "EngineConfig", "SamplingParams", "StepRecord", "EngineSnapshot",
           "AttentionProbe", "Request", "RequestMetrics", "RequestStatus", "RequestOutput"]
