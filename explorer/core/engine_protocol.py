"""What a Session needs from an engine, spelled once: kvscope's `LLMEngine` and the vLLM
adapter (`explorer.drivers.vllm.engine.VllmEngine`) are its two implementations.

`Engine` is the engine-facing side (add a request, step, snapshot, abort, probe, change the
scheduler's budget); every dict it hands out has the shapes of docs/architecture.md, so the
panels cannot tell the engines apart except by `model_info["engine"]`, which they show.

`EngineDriver` is the construction side: it owns an engine, builds the next one for
`Session.reset` (validated before the old one is let go) and stops it. Drivers are looked up
by name in `ENGINES` (explorer/drivers/), imported only when asked for (vLLM is optional and slow to import).
"""
from __future__ import annotations

from typing import Any, Callable, Protocol, runtime_checkable

from engine import SamplingParams


@runtime_checkable
class Record(Protocol):
    """A StepRecord or an EngineSnapshot: anything with a JSON-able `to_dict()`."""

    def to_dict(self) -> dict: ...


@runtime_checkable
class Engine(Protocol):
    """One steppable engine. `config` has at least the fields the Dashboard edits
    (engine.config.SCHEDULER_KNOBS, num_kv_blocks, block_size, tensor_parallel_size)."""

    config: Any
    tokenizer: Any

    @property
    def model_info(self) -> dict: ...

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None) -> str: ...

    def step(self) -> Any: ...  # a StepRecord: `.step` and `.to_dict()`

    def snapshot(self) -> Record: ...

    def abort_request(self, request_id: str) -> None: ...

    def attention_probe(self, request_id: str, layer: int = 0, head: int | None = None) -> Record: ...

    def update_scheduler_config(self, **knobs: Any) -> Any: ...

    def has_unfinished_requests(self) -> bool: ...


# An engine the Session only watches (a live server's feed) says why in a `read_only` string;
# the Dashboard then hides Step, the add-request form and the pool, and shows the budgets
# read-only. Engines the Session drives have none (or "").
def read_only_reason(engine: Any) -> str:
    """Why the Session cannot drive `engine` ("" when it can)."""
    return str(getattr(engine, "read_only", "") or "")


class EngineDriver(Protocol):
    """Owns one engine for a Session. `name` is what the panels call it ("kvscope",
    "vLLM 0.32.0"); `llm` is the object a user would hold (kvscope's LLM, vLLM's LLM)."""

    name: str
    engine: Engine
    llm: Any
    config_fields: frozenset[str]

    def rebuild(self, **config_fields: Any) -> "EngineDriver":
        """A new driver with this one's config changed; raises ValueError (and leaves this
        one working) when the new config is refused."""
        ...

    def shutdown(self) -> None: ...


def _kvscope_driver(llm_or_config: Any, config_fields: dict[str, Any]) -> EngineDriver:
    from ..drivers.kvscope import KvscopeDriver

    return KvscopeDriver.create(llm_or_config, config_fields)


def _vllm_driver(llm_or_config: Any, config_fields: dict[str, Any]) -> EngineDriver:
    from ..drivers.vllm.engine import VllmDriver  # imports vLLM: only when asked for

    return VllmDriver.create(llm_or_config, config_fields)


# Session(engine=name) -> the driver's factory (explorer/drivers/).
ENGINES: dict[str, Callable[[Any, dict[str, Any]], EngineDriver]] = {
    "kvscope": _kvscope_driver,
    "vllm": _vllm_driver,
}


def make_driver(engine: str | EngineDriver, llm_or_config: Any, config_fields: dict[str, Any]) -> EngineDriver:
    """The driver for `engine` (a name in ENGINES, or a ready driver)."""
    if not isinstance(engine, str):
        if llm_or_config is not None or config_fields:
            raise ValueError("a ready engine driver takes no model or config fields")
        return engine
    key = engine.lower()
    if key not in ENGINES:
        raise ValueError(f"engine must be one of {sorted(ENGINES)}, got {engine!r}")
    return ENGINES[key](llm_or_config, config_fields)
