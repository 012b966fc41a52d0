"""The EngineDriver of kvscope's own engine: builds an `LLM` from an LLM, an EngineConfig,
a model folder or None, and rebuilds it on `Session.reset` reusing the loaded weights."""
from __future__ import annotations

import dataclasses
import logging
from typing import Any

from engine import LLM, EngineConfig

log = logging.getLogger(__name__)

CONFIG_FIELDS = frozenset(f.name for f in dataclasses.fields(EngineConfig))


class KvscopeDriver:
    """kvscope's LLMEngine behind a Session (see explorer.core.engine_protocol.EngineDriver)."""

    name = "kvscope"
    config_fields = CONFIG_FIELDS
    watch_only = ""

    def __init__(self, llm: LLM) -> None:
        if not llm.engine.config.record_steps:
            raise ValueError("record_steps=False makes lean step records without the changes a Session "
                             "follows; leave record_steps at True for a Session")
        self.llm = llm
        self.engine = llm.engine
        self.source = self.controls = llm.engine  # LLMEngine is both a Source and its Controls

    @classmethod
    def create(cls, llm_or_config: Any, config_fields: dict[str, Any]) -> KvscopeDriver:
        if isinstance(llm_or_config, LLM):
            if config_fields:
                raise ValueError(f"config fields {sorted(config_fields)} cannot apply to an existing LLM; "
                                 "pass an EngineConfig or a model path instead")
            return cls(llm_or_config)
        check_config_fields(config_fields)
        if isinstance(llm_or_config, EngineConfig):
            fields = config_kwargs(llm_or_config)
            fields.update(config_fields)
            return cls(LLM(**fields))
        if llm_or_config is None or isinstance(llm_or_config, str) or hasattr(llm_or_config, "__fspath__"):
            if "model" in config_fields and llm_or_config is not None:
                raise ValueError("model given twice: as the first argument and as model=")
            model = config_fields.pop("model", llm_or_config)
            return cls(LLM(model=None if model is None else str(model), **config_fields))
        raise ValueError(f"llm_or_config must be an LLM, an EngineConfig, a model path or None, "
                         f"got {type(llm_or_config).__name__}")

    def rebuild(self, **config_fields: Any) -> KvscopeDriver:
        check_config_fields(config_fields)
        config = self.engine.config.replace(**config_fields)  # raises before anything is built
        if "num_kv_blocks" not in config_fields and _pool_shape_changed(config_fields):
            config = dataclasses.replace(config, num_kv_blocks=None)  # size the pool anew
        if "model" in config_fields and "max_model_len" not in config_fields:
            config = dataclasses.replace(config, max_model_len=None)  # the new model's own limit
        return KvscopeDriver(LLM(share_model_with=self.llm, **config_kwargs(config)))  # same weights: no reload

    def shutdown(self) -> None:
        try:
            self.llm.shutdown()
        except Exception:  # the old engine is gone either way (logged, not raised)
            log.exception("shutting down the previous engine failed")


def check_config_fields(fields: dict[str, Any]) -> None:
    unknown = set(fields) - CONFIG_FIELDS
    if unknown:
        raise ValueError(f"unknown EngineConfig field(s) {sorted(unknown)}; known: {sorted(CONFIG_FIELDS)}")


def config_kwargs(config: EngineConfig) -> dict[str, Any]:
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}


def _pool_shape_changed(fields: dict[str, Any]) -> bool:
    """Changes after which the previous engine's block count no longer fits the memory budget."""
    return bool({"block_size", "model", "dtype", "kv_cache_memory_bytes", "gpu_memory_utilization",
                 "tensor_parallel_size", "device"} & set(fields))
