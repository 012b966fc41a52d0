"""What the readers (ui/, export/, apps/) may ask of a Session, spelled as Protocols so they
depend on core/'s contract rather than on `Any`.

- `SessionView`: one engine's Session as the panels see it: its history (one HistoryEntry per
  step), the engine it shows (`source`, and `controls` where the Session drives it), the
  actions a panel's buttons take, and `subscribe` for the events that redraw them.
  explorer.core.session.Session satisfies it; mypy checks that wherever one is passed.
- `FleetView`: several such Sessions followed together (the ranks of a data-parallel server,
  or replicas): explorer.core.fleet.Fleet. The Dashboard tells the two apart by this protocol
  (`isinstance(x, FleetView)`), not by probing attributes.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, runtime_checkable

if TYPE_CHECKING:   # types only: a reader importing this stays free of torch (the docs' re-run runs in Pyodide)
    from engine import SamplingParams, StepRecord
    from engine.report.probe import AttentionProbeDict
    from engine.report.schema import RequestDict
    from widgets.fleet import RoutingRowDict, RoutingSummaryDict

    from .engine_protocol import Controls, Source
    from .history import HistoryEntry, HistoryWindowDict
    from .metrics import SessionMetricsDict

#: A setting's value as a reader passes it on: an EngineConfig field's (a Session's **config_fields),
#: or a what-if knob's (Settings' field types; a memory knob's number).
SettingValue: TypeAlias = int | float | str | bool | None


class SessionView(Protocol):
    """One engine's Session, as its panels read and drive it."""

    @property
    def history(self) -> list[HistoryEntry]: ...   # oldest first; the last is `current`

    @property
    def history_window(self) -> HistoryWindowDict: ...

    @property
    def current(self) -> HistoryEntry: ...

    @property
    def source(self) -> Source: ...

    @property
    def controls(self) -> Controls | None: ...   # None: the Session only watches

    @property
    def watch_only(self) -> str: ...   # why it only watches, in words ("" when it drives)

    @property
    def engine_name(self) -> str: ...

    @property
    def engine(self) -> Any: ...   # the engine object itself (kvscope's LLMEngine, vLLM's, a feed)

    @property
    def config(self) -> Any: ...   # block_size and the scheduler knobs (engine_protocol.Source)

    @property
    def following(self) -> bool: ...

    @property
    def metrics(self) -> SessionMetricsDict: ...

    def subscribe(self, callback: Callable[[str, Any], None]) -> Callable[[], None]: ...

    def step(self, n: int = 1) -> list[StepRecord]: ...

    def run_until_idle(self, max_steps: int = 10_000) -> list[StepRecord]: ...

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None, *,
                    request_id: str | None = None, **sampling_fields: Any) -> str: ...

    def abort(self, request_id: str) -> None: ...

    def set_budget(self, **knobs: Any) -> dict[str, Any]: ...

    def reset(self, **config_fields: Any) -> None: ...   # a new engine with this config changed

    def probe(self, request_id: str, layer: int = 0, head: int | None = None) -> AttentionProbeDict: ...

    def poll(self, max_steps: int = 10_000) -> list[StepRecord]: ...   # apply the steps ready now

    def follow(self, interval: float = 0.1) -> None: ...

    def pause(self) -> None: ...

    def feed_status(self) -> dict[str, Any]: ...

    def close(self) -> None: ...

    def save_recording(self, path: Any, *, notes: Any = ()) -> Any: ...


@runtime_checkable
class FleetView(Protocol):
    """Several Sessions followed side by side: `sessions[k]` is the engine core `labels[k]` names."""

    sessions: list[SessionView]
    labels: list[str]

    def subscribe(self, callback: Callable[[str, Any], None]) -> Callable[[], None]: ...

    def follow(self, interval: float = 0.1) -> None: ...

    def pause(self) -> None: ...

    @property
    def following(self) -> bool: ...

    def feed_status(self) -> list[dict]: ...

    def requests(self) -> list[tuple[int, RequestDict]]: ...

    def routing(self) -> list[RoutingRowDict]: ...

    def routing_summary(self, rows: list[RoutingRowDict] | None = None) -> RoutingSummaryDict: ...
