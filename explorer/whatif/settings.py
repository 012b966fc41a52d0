"""The settings a what-if replays a recording at: the recording's own, with some changed.

    variant(rec, block_size=64)                 # the same KV memory in blocks of 64
    variant(rec, num_blocks=256, max_num_batched_tokens=512)
    variant(rec, kv_memory_fraction=0.5)        # half the recorded pool's memory
    variant(rec, kv_cache_memory_bytes=2 << 30) # through the model's KV bytes per block

Each variant is checked the way vLLM would check it when the server starts, and refused with one
line naming the setting and the limit (`SettingRejected`): a block size the server's attention
backend cannot use, a pool that cannot hold one request of max_model_len tokens, a budget vLLM's
SchedulerConfig refuses; for a trace of hashed blocks, a block size that does not divide its
hash unit. vLLM 0.32's v1 scheduler has no partial-prefill knobs (`max_num_partial_prefills`
was a v0 setting): its long-prefill threshold is the knob that caps a long prompt's chunks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypedDict, get_args

from ..core.recording import SETTINGS_FIELDS, Recording, Settings, SettingsDict
from ..core.session_view import SettingValue

if TYPE_CHECKING:  # vLLM is imported only where a server's block sizes are checked
    from vllm.v1.attention.backend import MultipleOf

# What a what-if may change (vLLM's names), and the two memory knobs that become num_blocks.
Knob = Literal["block_size", "num_blocks", "max_num_batched_tokens", "max_num_seqs", "enable_prefix_caching",
               "enable_chunked_prefill", "long_prefill_token_threshold", "long_prefill_token_threshold_adaptive",
               "policy", "scheduler_reserve_full_isl", "watermark"]
MemoryKnob = Literal["kv_memory_fraction", "kv_cache_memory_bytes"]
KNOBS: tuple[Knob, ...] = get_args(Knob)
MEMORY_KNOBS: tuple[MemoryKnob, ...] = get_args(MemoryKnob)
POLICIES = ("fcfs", "priority")
VLLM_TITLE = "vLLM's scheduler for the replays"   # the line vLLM's first import folds into


assert set(KNOBS) <= SETTINGS_FIELDS


class VariantDict(TypedDict):
    """`Variant.to_dict()`."""
    label: str
    changed: dict[str, SettingValue]   # setting -> its value here, where it differs from the recording
    settings: SettingsDict
    note: str


class SettingRejected(ValueError):
    """A setting vLLM would refuse (or a trace cannot be replayed at), in one line."""


@dataclass(frozen=True)
class Variant:
    """One what-if: the settings to replay at, what changed against the recording, and why
    num_blocks is what it is when the variant did not name it."""

    settings: Settings
    changed: tuple[tuple[str, SettingValue], ...]
    note: str = ""

    @property
    def label(self) -> str:
        return label_of(dict(self.changed)) + (f" ({self.note})" if self.note else "")

    def to_dict(self) -> VariantDict:
        return {"label": self.label, "changed": dict(self.changed), "settings": self.settings.to_dict(),
                "note": self.note}


_SHORT = {"max_num_batched_tokens": "budget", "max_num_seqs": "max_seqs", "enable_prefix_caching": "prefix_caching",
          "long_prefill_token_threshold": "long_prefill", "kv_memory_fraction": "kv_memory",
          "kv_cache_memory_bytes": "kv_bytes"}


def label_of(changes: dict[str, SettingValue]) -> str:
    """A what-if's settings in a few words ("as recorded" when none)."""
    said = ", ".join(f"{_SHORT.get(k, k)}={value_text(v)}" for k, v in changes.items() if v is not None)
    return said or "as recorded"


def value_text(v: SettingValue) -> str:
    """A setting's value in words: "on" / "off" for a switch."""
    if isinstance(v, bool):
        return "on" if v else "off"
    return str(v)


def kv_bytes_per_token(rec: Recording) -> float | None:
    """The model's KV bytes per token (all layers, K and V), from the recording's bytes per block."""
    b = rec.source.kv_bytes_per_block
    return None if not b else b / rec.settings.block_size


def variant(rec: Recording, **changes: SettingValue) -> Variant:
    """The recording's settings with `changes` (KNOBS, or one of MEMORY_KNOBS), checked as vLLM
    would check them. A new block size without num_blocks keeps the recorded KV memory."""
    unknown = set(changes) - set(KNOBS) - set(MEMORY_KNOBS)
    if unknown:
        raise SettingRejected(f"unknown what-if setting(s) {sorted(unknown)}; known: {list(KNOBS + MEMORY_KNOBS)}")
    memory = [k for k in MEMORY_KNOBS if changes.get(k) is not None]
    if len(memory) > 1 or (memory and changes.get("num_blocks") is not None):
        raise SettingRejected("give the pool once: num_blocks, kv_memory_fraction or kv_cache_memory_bytes")
    base = rec.settings
    block_size = _check_int("block_size", changes.get("block_size", base.block_size))
    note = ""
    fields = {k: v for k, v in changes.items() if k in KNOBS and v is not None}
    if memory:
        fields["num_blocks"] = _blocks_from_memory(rec, memory[0], changes[memory[0]], block_size)
        note = f"{fields['num_blocks']} blocks"
    elif "num_blocks" not in fields and block_size != base.block_size:
        # A server sizes its pool from memory: the same bytes hold blocks of another size.
        fields["num_blocks"] = max(2, (base.num_blocks * base.block_size) // block_size)
        note = f"{fields['num_blocks']} blocks, the same memory"
    settings = base.replace(**fields)
    check(rec, settings)
    changed = tuple((k, v) for k, v in changes.items() if v is not None and
                    (k in MEMORY_KNOBS or getattr(base, k) != v))
    return Variant(settings, changed, note if changed else "")


def _blocks_from_memory(rec: Recording, knob: str, value: SettingValue, block_size: int) -> int:
    per_token = kv_bytes_per_token(rec)
    if knob == "kv_memory_fraction":
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
            raise SettingRejected(f"kv_memory_fraction must be a number > 0 (a share of the recorded pool's memory), "
                                  f"got {value!r}")
        tokens = rec.settings.num_blocks * rec.settings.block_size * float(value)
        return max(2, int(tokens // block_size))
    value = _check_int(knob, value)
    if per_token is None:
        raise SettingRejected("kv_cache_memory_bytes needs the model's KV bytes per block, which this recording does "
                              f"not hold ({rec.source.engine}); give num_blocks or kv_memory_fraction instead")
    return max(2, int(value // (per_token * block_size)))


def _check_int(name: str, value: SettingValue, minimum: int = 1) -> int:
    """`value`, refused unless an integer >= `minimum`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SettingRejected(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def check(rec: Recording, s: Settings) -> None:
    """Refuse what vLLM refuses at start-up (one line naming the setting and the limit)."""
    for name in ("block_size", "max_num_batched_tokens", "max_num_seqs"):
        _check_int(name, getattr(s, name))
    _check_int("num_blocks", s.num_blocks, minimum=2)
    _check_int("long_prefill_token_threshold", s.long_prefill_token_threshold, minimum=0)
    if s.policy not in POLICIES:
        raise SettingRejected(f"policy must be one of {POLICIES} (vLLM's scheduling policies), got {s.policy!r}")
    unit = rec.source.hash_unit
    if unit is not None and unit % s.block_size:
        divisors = [d for d in range(1, unit + 1) if unit % d == 0 and d >= 8]
        raise SettingRejected(
            f"block_size {s.block_size} does not divide the trace's hash unit of {unit} tokens: a block would straddle "
            f"two hashed units, and whether it hits depends on tokens the trace does not give; use one of {divisors}")
    # A vLLM server's attention backend limits its block sizes; kvscope's engine takes any.
    kernel = _kernel_block_sizes(rec.source.device) if rec.source.engine.startswith("vLLM") else None
    if kernel is not None and not any(_fits(s.block_size, a) for a in kernel[2]):
        raise SettingRejected(f"block_size {s.block_size} is not one vLLM's {kernel[1]} attention backend can use "
                              f"on {rec.source.device} (block sizes: {kernel[0]})")
    need = -(-s.max_model_len // s.block_size)
    if s.num_blocks - 1 < need:
        raise SettingRejected(
            f"num_blocks {s.num_blocks} is too small: {s.num_blocks - 1} usable blocks of {s.block_size} hold "
            f"{(s.num_blocks - 1) * s.block_size} tokens, less than one request of max_model_len {s.max_model_len} "
            f"tokens ({need} blocks and the null block): vLLM refuses to start")
    if s.max_num_seqs > s.max_num_batched_tokens:
        raise SettingRejected(f"max_num_seqs {s.max_num_seqs} must not exceed max_num_batched_tokens "
                              f"{s.max_num_batched_tokens}: vLLM's SchedulerConfig refuses it")
    if not s.enable_chunked_prefill and s.max_num_batched_tokens < s.max_model_len:
        raise SettingRejected(f"max_num_batched_tokens {s.max_num_batched_tokens} is below max_model_len "
                              f"{s.max_model_len} with chunked prefill off: vLLM refuses it "
                              "(a prompt must fit one step)")
    if s.long_prefill_token_threshold > s.max_model_len:
        raise SettingRejected(f"long_prefill_token_threshold {s.long_prefill_token_threshold} is above max_model_len "
                              f"{s.max_model_len}: vLLM refuses it")


def _fits(block_size: int, allowed: int | MultipleOf) -> bool:
    base = getattr(allowed, "base", None)
    return block_size % base == 0 if base is not None else block_size == allowed


def _kernel_block_sizes(device: str | None) -> tuple[str, str, list[int | MultipleOf]] | None:
    """(shown, backend, sizes) of the attention backend a server on `device` uses, from vLLM's
    own backend class (None: unknown device, no check)."""
    from ..drivers.vllm.startup import first_vllm_import

    if device not in ("cpu", "cuda"):
        return None
    try:
        with first_vllm_import(VLLM_TITLE):   # often vLLM's first import in a process
            if device == "cpu":
                from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend as backend
            else:
                from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend as backend
        sizes = list(backend.get_supported_kernel_block_sizes())
    except Exception:  # noqa: BLE001 - a backend that does not import here: vLLM's CacheConfig checks remain
        return None
    shown = ", ".join(f"multiples of {a.base}" if hasattr(a, "base") else str(a) for a in sizes)
    return shown, backend.get_name(), sizes

