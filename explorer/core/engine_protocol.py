"""What a Session needs from an engine, spelled once, in two parts:

- `Source`: what every engine gives, including one the Session only watches (a live vLLM
  server's feed): its model facts, the next step's record (with the step's `changes`, which
  the Session applies to its history: engine/report/changes.py), a whole snapshot, and how
  many steps are ready.
- `Controls`: what only an engine the Session drives gives: add and abort requests, change
  the scheduler's budgets between steps, probe attention, and the changes those actions made.

kvscope's `LLMEngine` and vLLM in process (explorer.drivers.vllm.engine.VllmEngine) are both;
a live server's feed (explorer.drivers.vllm_live.client.LiveSource) is a Source only, and the
Session of it has no controls (`session.controls is None`): the Dashboard then hides Step,
the add-request form and the pool, and shows the budgets read-only.

`EngineDriver` is the construction side: it owns an engine, builds the next one for
`Session.reset` (validated before the old one is let go) and stops it. Drivers are looked up
by name in `ENGINES` (explorer/drivers/), imported only when asked for (vLLM is optional and
slow to import).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from engine import SamplingParams
from engine.report.probe import AttentionProbe
from engine.report.records import EngineSnapshot, StepRecord
from engine.report.schema import ChangesDict, ModelInfoDict


@runtime_checkable
class Source(Protocol):
    """An engine a Session can show. `config` has at least block_size and the scheduler knobs
    (engine.config.SCHEDULER_KNOBS: an EngineConfig, a VllmConfig, a live feed's namespace);
    `tokenizer` spells token ids (None: ids only)."""

    @property
    def config(self) -> Any: ...

    @property
    def tokenizer(self) -> Any: ...

    @property
    def model_info(self) -> ModelInfoDict: ...

    def step(self) -> StepRecord: ...  # with the step's `changes`

    def snapshot(self) -> EngineSnapshot: ...

    def pending(self) -> int: ...  # steps ready to take now (0: step() would have nothing to do)


@runtime_checkable
class Controls(Protocol):
    """What a Session can do to an engine it drives, between steps."""

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None) -> str: ...

    def abort_request(self, request_id: str) -> None: ...

    def update_scheduler_config(self, **knobs: Any) -> Any: ...  # the config now in force

    def attention_probe(self, request_id: str, layer: int = 0, head: int | None = None) -> AttentionProbe: ...

    def take_changes(self) -> ChangesDict: ...  # what the actions changed since the last step


class EngineDriver(Protocol):
    """Owns one engine for a Session. `name` is what the panels call it ("kvscope",
    "vLLM 0.32.0"); `llm` is the object a user would hold (kvscope's LLM, vLLM's LLM, None
    for a server); `source` and `controls` are the engine seen through the two protocols
    (`controls` None: the Session only watches, and `watch_only` says why, in words). The
    Session reads them and never sets them: read-only properties, which a driver's plain
    attributes (of its own engine's class) satisfy."""

    @property
    def name(self) -> str: ...

    @property
    def engine(self) -> Any: ...

    @property
    def llm(self) -> Any: ...

    @property
    def source(self) -> Source: ...

    @property
    def controls(self) -> Controls | None: ...

    @property
    def watch_only(self) -> str: ...

    @property
    def config_fields(self) -> frozenset[str]: ...

    def rebuild(self, **config_fields: Any) -> EngineDriver:
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
