"""Engine configuration: every knob the scheduler, the KV pool and the model runner read."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

SCHEDULING_POLICIES = ("unified", "prefill_first")
ATTENTION_BACKENDS = ("auto", "torch", "cpu", "triton", "flash_attn")
DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")

# Knobs the scheduler reads at every step; they may change between steps.
SCHEDULER_KNOBS = (
    "max_num_batched_tokens",
    "max_num_seqs",
    "enable_chunked_prefill",
    "enable_prefix_caching",
    "scheduler_reserve_full_isl",
    "scheduling_policy",
)


def with_live_knobs(config: Any, knobs: dict[str, Any], live: tuple[str, ...] = SCHEDULER_KNOBS,
                    engine: str = "engine") -> Any:
    """`config` (any config with `replace`) with scheduler `knobs` changed, after the checks every
    engine makes the same way on a running engine: only SCHEDULER_KNOBS may change, and of those
    only the ones this engine reads at every step (`live`); the others need a new engine."""
    bad = set(knobs) - set(SCHEDULER_KNOBS)
    if bad:
        raise ValueError(f"{sorted(bad)} cannot change on a live engine; live knobs: {list(live)}")
    new = config.replace(**knobs)
    fixed = [k for k in knobs if k not in live and getattr(new, k) != getattr(config, k)]
    if fixed:
        raise ValueError(f"{fixed} cannot change on a live {engine} (it reads it only at start-up): "
                         f"Session.reset({fixed[0]}=...) builds a new one; live knobs: {list(live)}")
    return new


def _positive_int(name: str, value: Any, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


@dataclass
class EngineConfig:
    """All engine settings, validated on construction (ValueError names the field).

    `model` is the resolved local folder. `num_kv_blocks=None` sizes the pool from
    `kv_cache_memory_bytes` (CPU) or `gpu_memory_utilization` (GPU). `max_model_len=None`
    means min(4096, the model's max_position_embeddings).
    """

    model: str | None = None
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    max_model_len: int | None = None
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory_bytes: int = 256 * 1024 * 1024
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    # vLLM 0.32's name and default: admit a waiting request only when blocks for its whole
    # known sequence fit the pool. False is the older rule (its first chunk must fit), which
    # over-admits under chunked prefill and then preempts; kept to show the difference.
    scheduler_reserve_full_isl: bool = True
    # vLLM 0.32's name and default, for a model with sliding-window layers: which of their blocks
    # the prefix cache keeps. 0: only where a hit can end (a prompt's end, a shared prefix's);
    # n > 0 (a multiple of block_size): also every n tokens; None: every block.
    prefix_cache_retention_interval: int | None = 0
    scheduling_policy: str = "unified"
    # vLLM's name and default: schedule step N+1 while step N runs (engine/core/async_scheduler.py),
    # None: on for a GPU, off on a CPU (as vLLM, where the host work cannot hide behind the forward).
    async_scheduling: bool | None = None
    tensor_parallel_size: int = 1
    enforce_eager: bool = False
    dtype: Any = "auto"
    device: str = "auto"
    attention_backend: str = "auto"
    seed: int = 0
    check_invariants: bool = False
    # False: step() returns a lean StepRecord (schedule, finished, timings; no packed batch,
    # no candidate lists, no token text, no changes). Used to measure what observation costs;
    # a Session cannot follow such an engine.
    record_steps: bool = True

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        _positive_int("max_num_batched_tokens", self.max_num_batched_tokens)
        _positive_int("max_num_seqs", self.max_num_seqs)
        _positive_int("block_size", self.block_size)
        _positive_int("tensor_parallel_size", self.tensor_parallel_size)
        if self.max_model_len is not None:
            _positive_int("max_model_len", self.max_model_len)
        if self.num_kv_blocks is not None:
            # Block 0 is the reserved null block: a usable pool needs at least one more.
            _positive_int("num_kv_blocks", self.num_kv_blocks, minimum=2)
        _positive_int("kv_cache_memory_bytes", self.kv_cache_memory_bytes)
        if not isinstance(self.gpu_memory_utilization, (int, float)) or not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization!r}")
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling_policy must be one of {SCHEDULING_POLICIES}, got {self.scheduling_policy!r}")
        if self.async_scheduling is not None and not isinstance(self.async_scheduling, bool):
            raise ValueError(f"async_scheduling must be a bool or None (on for a GPU), got {self.async_scheduling!r}")
        if self.async_scheduling and self.scheduling_policy != "unified":
            raise ValueError(f"async_scheduling runs vLLM's 'unified' scheduling_policy only, "
                             f"got scheduling_policy={self.scheduling_policy!r}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention_backend must be one of {ATTENTION_BACKENDS}, got {self.attention_backend!r}")
        if self.attention_backend == "flash_attn" and self.block_size % 256:
            # flash-attn reads a paged KV cache only in pages of a multiple of 256 tokens.
            raise ValueError(f"attention_backend 'flash_attn' needs block_size to be a multiple of 256, "
                             f"got block_size={self.block_size}; use attention_backend='triton' for smaller blocks")
        if self.attention_backend == "flash_attn" and str(self.dtype).replace("torch.", "") == "float32":
            raise ValueError("attention_backend 'flash_attn' computes in float16 or bfloat16, got dtype=float32; "
                             "use dtype='bfloat16' (or attention_backend='triton' for fp32)")
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, got {self.device!r}")
        if isinstance(self.dtype, str) and self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES} or a torch.dtype, got {self.dtype!r}")
        for name in ("enable_prefix_caching", "enable_chunked_prefill", "scheduler_reserve_full_isl", "enforce_eager",
                     "check_invariants", "record_steps"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        _positive_int("seed", self.seed, minimum=0)
        interval = self.prefix_cache_retention_interval
        if interval is not None:
            _positive_int("prefix_cache_retention_interval", interval, minimum=0)
            if interval % self.block_size:
                raise ValueError(f"prefix_cache_retention_interval must be 0, None or a multiple of block_size "
                                 f"{self.block_size}, got {interval}")

    def resolved_max_model_len(self) -> int:
        """max_model_len of an engine's own config, where LLMEngine always sets it (None is
        only ever a request for the model's own limit, before the engine resolves it)."""
        if self.max_model_len is None:
            raise ValueError("max_model_len is not resolved: only a running engine's config (LLMEngine.config) has it")
        return self.max_model_len

    def replace(self, **changes: Any) -> EngineConfig:
        """A validated copy with `changes` applied (unknown names raise)."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"unknown EngineConfig field(s): {sorted(unknown)}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["dtype"] = str(self.dtype).replace("torch.", "")
        return d
