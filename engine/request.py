"""A request's life in the engine: its tokens, its KV progress and its timed events."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from .sampling_params import SamplingParams

if TYPE_CHECKING:  # no torch at run time: engine/core, which imports this module, stays torch-free
    from collections.abc import Callable, Sequence

    import torch

    from .config import EngineConfig
    from .report.schema import ClockDict, ClockLatenciesDict, RequestMetricsDict


class RequestStatus(str, enum.Enum):
    """Where a request is in its life (vLLM's RequestStatus, folded to four states)."""
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # back in the waiting queue, its KV freed (recompute)
    FINISHED = "finished"


@dataclass
class ClockEvents:
    """Event times of one request on one clock (seconds)."""

    arrival_time: float | None = None
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    preempted_times: list[float] = field(default_factory=list)
    finished_time: float | None = None

    def derived(self) -> ClockLatenciesDict:
        """vLLM's per-request metrics, None where not yet known."""
        return latencies(self.arrival_time, self.first_scheduled_time, self.first_token_time, self.finished_time,
                         self.token_times)

    def to_dict(self) -> ClockDict:
        return clock_dict(self.arrival_time, self.first_scheduled_time, self.first_token_time, list(self.token_times),
                          list(self.preempted_times), self.finished_time)


def clock_dict(arrival_time: float | None, first_scheduled_time: float | None, first_token_time: float | None,
               token_times: Sequence[float], preempted_times: list[float], finished_time: float | None,
               itl: Sequence[float] | None = None) -> ClockDict:
    """One clock's metrics dict (ClockEvents.to_dict) around these lists, not copies; `itl`: the
    inter-token latencies where the caller has them already (None: derived here)."""
    return {"arrival_time": arrival_time, "first_scheduled_time": first_scheduled_time,
            "first_token_time": first_token_time, "token_times": token_times, "preempted_times": preempted_times,
            "finished_time": finished_time,
            **latencies(arrival_time, first_scheduled_time, first_token_time, finished_time, token_times, itl)}


def latencies(arrival_time: float | None, first_scheduled_time: float | None, first_token_time: float | None,
              finished_time: float | None, token_times: Sequence[float],
              itl: Sequence[float] | None = None) -> ClockLatenciesDict:
    """vLLM's per-request metrics from one clock's times, None where not yet known. `itl` (the
    gaps between token times) may come from the caller: a history's request grows by a token a
    step, and deriving every gap again at every step made following a long run O(tokens) a
    request a step. The mean gap is the span over the count, as the gaps add up to the span."""
    if itl is None:
        itl = [b - a for a, b in pairwise(token_times)]
    return {
        "time_to_first_token": _diff(first_token_time, arrival_time),
        "inter_token_latency": itl,
        "time_per_output_token": time_per_output_token(token_times, itl),
        "e2e_request_latency": _diff(finished_time, arrival_time),
        "request_queue_time": _diff(first_scheduled_time, arrival_time),
    }


def time_per_output_token(token_times: Sequence[float], itl: Sequence[float]) -> float | None:
    """The mean gap between token times: their span over the count of gaps (which add up to it)."""
    return (token_times[-1] - token_times[0]) / len(itl) if itl else None


def _diff(b: float | None, a: float | None) -> float | None:
    return None if a is None or b is None else b - a


@dataclass
class RequestMetrics:
    """Events on two clocks: wall (time.time(), epoch seconds) and engine
    (advances only while a step executes, so it is meaningful under manual stepping)."""

    wall: ClockEvents = field(default_factory=ClockEvents)
    engine: ClockEvents = field(default_factory=ClockEvents)

    def record(self, event: str, wall_t: float, engine_t: float) -> None:
        if event == "token_times":
            return self.token(wall_t, engine_t)
        for clock, t in ((self.wall, wall_t), (self.engine, engine_t)):
            if event == "preempted_times":
                clock.preempted_times.append(t)
            elif getattr(clock, event) is None:
                setattr(clock, event, t)

    def token(self, wall_t: float, engine_t: float) -> None:
        """A new token's time on both clocks (every running request's, every step: kept short)."""
        wall, engine = self.wall, self.engine
        wall.token_times.append(wall_t)
        engine.token_times.append(engine_t)
        if wall.first_token_time is None:
            wall.first_token_time = wall_t
        if engine.first_token_time is None:
            engine.first_token_time = engine_t

    # vLLM-named accessors on the engine clock for convenience.
    @property
    def time_to_first_token(self) -> float | None:
        return self.engine.derived()["time_to_first_token"]

    @property
    def e2e_request_latency(self) -> float | None:
        return self.engine.derived()["e2e_request_latency"]

    def to_dict(self) -> RequestMetricsDict:
        return {"engine": self.engine.to_dict(), "wall": self.wall.to_dict()}


class Request:
    """One generation request. `num_computed_tokens` counts tokens whose KV exists in the
    paged cache (prefix-cache hits included); `block_table` lists its physical blocks."""

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 eos_token_id: int | None, prompt_text: str | None = None) -> None:
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.all_token_ids: list[int] = list(prompt_token_ids)
        self.params = params
        self.eos_token_id = eos_token_id
        self.prompt_text = prompt_text
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0       # prefix-cache hits at the latest admission
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []  # hashes of full blocks of all_token_ids, in order
        self.num_cached_blocks = 0         # leading blocks of block_table registered in the prefix cache
        # With several KV cache groups (engine/core/hybrid_kv_cache.py), `block_table` is the
        # full-attention group's and these are the others' (a sliding window's), one table each.
        self.extra_block_tables: list[list[int]] = []
        self.group_hit_tokens: list[int] = []   # each KV cache group's own prefix hit at admission (several groups)
        self.shared_prefix_boundary = 0    # a sliding group's prefix worth caching (see find_longest_cache_hit)
        self.num_in_flight_tokens = 0      # scheduled in steps not updated yet (AsyncScheduler)
        self.num_preemptions = 0
        self.num_prefill_chunks = 0        # prefill chunks since the latest admission
        # Async scheduling (engine/core/async_scheduler.py): tokens already scheduled as the input
        # of a step but not sampled yet, because the step that samples them is still in flight.
        self.num_output_placeholders = 0
        self.finish_reason: str | None = None
        self.metrics = RequestMetrics()
        self.last_scheduled: tuple[int, int] | None = None  # [start, end) positions of its last step
        self.generator: torch.Generator | None = None  # when params.seed is set
        self._text_cache: dict[str, tuple[int, str]] = {}
        self._output_text: Callable[[Sequence[int]], str] | None = None   # set by the first cached_text("output")

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_tokens_with_placeholders(self) -> int:
        """The tokens the scheduler plans with: the known ones plus those still being sampled
        (num_tokens under synchronous scheduling, where nothing is left in flight)."""
        return self.num_tokens + self.num_output_placeholders

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status == RequestStatus.FINISHED

    def cached_text(self, which: str, decode) -> str:
        """Decoded prompt or output text, re-decoded only when the tokens changed (snapshots ask
        for every request's text after every step). The output reads as vLLM returns it, without
        special tokens (a finished chat answer does not end in `<|im_end|>`), where `decode`
        offers that (engine.tokenizer.fast_decoder's `without_special`)."""
        if which != "prompt" and hasattr(decode, "output_text"):
            # Decoded as the tokens arrive, not whole again (engine.tokenizer.OutputText).
            if self._output_text is None:
                self._output_text = decode.output_text()
            return self._output_text(self.output_token_ids)
        ids = self.prompt_token_ids if which == "prompt" else self.output_token_ids
        if which != "prompt":
            decode = getattr(decode, "without_special", decode)
        key, text = self._text_cache.get(which, (None, ""))
        if key != len(ids):
            text = decode(ids)
            self._text_cache[which] = (len(ids), text)
        return text

    def append_output(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    def check_stop(self, max_model_len: int) -> str | None:
        """The finish reason after the latest sampled token, or None to continue."""
        last = self.output_token_ids[-1]
        if not self.params.ignore_eos and self.eos_token_id is not None and last == self.eos_token_id:
            return "stop"
        if last in self.params.stop_token_ids:
            return "stop"
        if len(self.output_token_ids) >= self.params.max_tokens or self.num_tokens >= max_model_len:
            return "length"
        return None

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, {self.status.value}, prompt={self.num_prompt_tokens}, "
                f"out={len(self.output_token_ids)}, computed={self.num_computed_tokens}, blocks={self.block_table})")


def checked_request_args(params: SamplingParams | None, request_id: str | None, taken: Any) -> SamplingParams:
    """The sampling params to use (default: SamplingParams()), after the checks every engine
    makes the same way: params of the right type, and an id that is a new non-empty str."""
    params = params if params is not None else SamplingParams()
    if not isinstance(params, SamplingParams):
        raise ValueError(f"sampling_params must be a SamplingParams, got {type(params).__name__}")
    if request_id is not None:
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty str, got {request_id!r}")
        if request_id in taken:
            raise ValueError(f"request_id {request_id!r} already exists")
    return params


def abortable(requests: Any, request_id: str) -> Any:
    """The request `request_id` of `requests` (id -> anything with a `finish_reason`), after the
    checks every engine makes the same way before an abort: it exists and has not finished."""
    entry = requests.get(request_id)
    if entry is None:
        raise ValueError(f"request_id {request_id!r} does not exist")
    if entry.finish_reason is not None:
        raise ValueError(f"request_id {request_id!r} already finished ({entry.finish_reason})")
    return entry


def token_id_list(prompt: Any) -> list[int]:
    """A prompt given as token ids, as a non-empty list of ints (ValueError otherwise)."""
    try:
        token_ids = [int(t) for t in prompt]
    except (TypeError, ValueError):
        raise ValueError("prompt must be a str or a list of token ids (ints)") from None
    if not token_ids:
        raise ValueError("prompt must not be empty (got no token ids)")
    return token_ids


def check_fits(token_ids: list[int], params: SamplingParams, cfg: EngineConfig, num_blocks: int) -> None:
    """The request can run to its end alone in this engine (else a ValueError naming the limit)."""
    n, max_model_len = len(token_ids), cfg.resolved_max_model_len()
    if n > max_model_len:
        raise ValueError(f"prompt has {n} tokens, more than max_model_len={max_model_len}")
    if not cfg.enable_chunked_prefill and n > cfg.max_num_batched_tokens:
        raise ValueError(f"prompt has {n} tokens, more than max_num_batched_tokens="
                         f"{cfg.max_num_batched_tokens} (chunked prefill is off)")
    longest = min(n + params.max_tokens, max_model_len)
    need = -(-longest // cfg.block_size)
    if need > num_blocks - 1:
        raise ValueError(f"a request of {longest} tokens (prompt + max_tokens, capped at max_model_len) "
                         f"needs {need} KV blocks of {cfg.block_size} tokens; num_kv_blocks={num_blocks} leaves only "
                         f"{num_blocks - 1} usable (block 0 is the null block): lower max_tokens, shorten the "
                         f"prompt, or use num_kv_blocks >= {need + 1} (a new engine)")
