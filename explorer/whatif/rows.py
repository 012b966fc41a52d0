"""What a sweep reports for each setting it replays: the row types that explorer/whatif/sweep.py
builds and charts.py and target.py read (here, below all three, so none imports another for a type)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Protocol, TypedDict, get_args

from ..core.recording import SettingsDict
from .settings import SettingValue

if TYPE_CHECKING:
    from .step_model import StepTimeModel

Latency = Literal["ttft_p50", "ttft_p90", "itl_p50", "itl_p90", "e2e_p50", "e2e_p90"]
LATENCIES: tuple[Latency, ...] = get_args(Latency)


class LatenciesDict(TypedDict, total=False):
    """TTFT, ITL (every gap between a request's tokens) and end-to-end latency, p50 and p90, in seconds
    (None: no request to measure). `latencies` gives every key; SweepResult.recorded is {} for a recording
    without token times."""
    ttft_p50: float | None
    ttft_p90: float | None
    itl_p50: float | None
    itl_p90: float | None
    e2e_p50: float | None
    e2e_p90: float | None


class SeriesDict(TypedDict):
    """A replay's per-step series, evenly thinned to at most sweep.SERIES_POINTS steps."""
    step: list[int]
    time: list[float]             # the virtual clock after the step (timed arrivals; else empty)
    num_waiting: list[int]
    num_running: list[int]
    kv_usage: list[float]         # 0..1
    scheduled_tokens: list[int]


class ReplayFiguresDict(LatenciesDict, total=False):
    """`summarize`: one replay's figures (every key; `duration` with timed arrivals only; the latencies
    None with step arrivals)."""
    steps: int
    hit_tokens: int               # prefix hits of requests at their first admission
    query_tokens: int             # those requests' tokens (the hit rate's denominator)
    resumed_hit_tokens: int       # hits of requests re-admitted after a preemption
    hit_rate: float | None
    preemptions: int
    recomputed_tokens: int        # tokens preemptions made vLLM compute again
    max_waiting: int
    mean_waiting: float
    max_kv_usage: float           # 0..1
    mean_kv_usage: float
    replay_seconds: float         # the replay's own time here
    scheduler_seconds: float      # of which inside vLLM's schedule() and update_from_output()
    vllm_log: list[str]           # what vLLM logged while it built the scheduler
    duration: float               # the virtual clock after the last step (timed arrivals)
    series: SeriesDict


class SweepRowDict(ReplayFiguresDict, total=False):
    """One setting of a sweep (SweepResult.rows): what it ran at, and its figures or why it did not run.
    Every row has index, changes, label and status; one vLLM refused has no settings; only 'ok' has figures."""
    index: int                    # where the grid listed it (then the target search, counting on)
    changes: dict[str, SettingValue]   # the knobs it changes against the recording ({}: as recorded)
    label: str
    settings: SettingsDict        # every setting it ran at
    kv_tokens: int                # its pool's tokens (num_blocks * block_size)
    kv_bytes: int | None          # their KV memory (None: the recording does not hold the model's bytes per block)
    status: str                   # 'ok', 'rejected' (vLLM would refuse it) or 'failed' (the replay could not end)
    error: str                    # why it did not run
    searched: bool                # the target search replayed it


class SweepRows(Protocol):
    """What the charts read of a sweep's result (sweep.SweepResult)."""

    @property
    def ok_rows(self) -> list[SweepRowDict]: ...   # the settings that ran, in the grid's order

    step_model: StepTimeModel | None   # the model that placed timed arrivals (None: step arrivals)
