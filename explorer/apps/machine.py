"""Which CPU a measurement ran on: its model name and the vector extensions that decide how
fast the fp32/bf16 matmuls and attention run (AVX2, AVX-512, AVX512_BF16, AMX). CPU figures
from two machines compare only with these named, so the benchmarks print them in their header.

Read from /proc/cpuinfo (Linux); elsewhere the model falls back to platform.processor() and
the extensions are unknown. Standard library only.
"""
from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field

# (flag in /proc/cpuinfo, name printed), in the order printed. x86 first, then aarch64's
# "Features" names.
VECTOR_EXTENSIONS = (
    ("avx2", "AVX2"),
    ("avx512f", "AVX-512"),
    ("avx512_bf16", "AVX512_BF16"),
    ("amx_tile", "AMX"),
    ("asimd", "NEON"),
    ("sve", "SVE"),
)


@dataclass(frozen=True)
class CpuInfo:
    """The CPU named in every benchmark header: model, flags, logical CPUs."""
    model: str                  # e.g. "AMD EPYC", "Intel(R) Xeon(R) Platinum 8480+"
    flags: frozenset[str] = field(repr=False)   # the first processor's flags (empty when unknown)
    logical_cpus: int | None = None             # processors listed (None when unknown)

    @property
    def vector_extensions(self) -> list[str]:
        return vector_extensions(self.flags)

    def summary(self) -> str:
        """One line for a benchmark header, e.g. "AMD EPYC, 2 logical CPUs, AVX2"."""
        parts = [self.model]
        if self.logical_cpus:
            parts.append(f"{self.logical_cpus} logical CPU{'s' if self.logical_cpus != 1 else ''}")
        if self.flags:
            ext = self.vector_extensions
            parts.append(" ".join(ext) if ext else "no AVX2/AVX-512/AMX")
        else:
            parts.append("vector extensions unknown")
        return ", ".join(parts)


def vector_extensions(flags) -> list[str]:
    """The extensions among `flags` (CPU flag names, as /proc/cpuinfo spells them) that matter here."""
    flags = set(flags)
    out = [name for flag, name in VECTOR_EXTENSIONS if flag in flags]
    if "AMX" not in out and flags & {"amx_bf16", "amx_int8", "amx_fp16"}:
        out.append("AMX")
    return out


def parse_cpuinfo(text: str) -> CpuInfo:
    """Parse /proc/cpuinfo's text: the first processor's model name and flags, and how many
    processors it lists. x86 names them "model name" / "flags", aarch64 "Features" (and often
    no model name at all, then "CPU implementer"/"CPU part" say what it is)."""
    model = None
    flags: frozenset[str] | None = None
    processors = 0
    arm_id: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip().lower(), value.strip()
        if key == "processor":
            processors += 1
        elif key in ("model name", "hardware") and model is None and value:
            model = value
        elif key in ("flags", "features") and flags is None:
            flags = frozenset(value.split())
        elif key in ("cpu implementer", "cpu part") and key not in arm_id:
            arm_id[key] = value
    if model is None and arm_id:
        model = "Arm CPU " + " ".join(f"{k.split()[1]} {v}" for k, v in sorted(arm_id.items()))
    return CpuInfo(model=model or _fallback_model(), flags=flags or frozenset(),
                   logical_cpus=processors or None)


def _fallback_model() -> str:
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_info(path: str = "/proc/cpuinfo") -> CpuInfo:
    """This machine's CPU; without a readable /proc/cpuinfo, platform.processor() and no flags."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return parse_cpuinfo(f.read())
    except OSError:
        return CpuInfo(model=_fallback_model(), flags=frozenset(), logical_cpus=os.cpu_count())


def cpu_summary() -> str:
    return cpu_info().summary()
