"""explorer.apps.machine: the CPU model and vector extensions printed in the benchmarks' headers,
parsed from /proc/cpuinfo."""
from __future__ import annotations

import os

import pytest

from explorer.apps import machine
from explorer.apps.machine import CpuInfo, cpu_info, parse_cpuinfo, vector_extensions


def _amd_epyc_processor(cpu: int) -> str:
    """Logical CPU `cpu`'s entry in AMD_EPYC_CPUINFO: both entries are alike but for its number.
    A backslash ends each wrapped part of a flags line, so the entry still holds it as one line."""
    return f"""\
processor\t: {cpu}
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC
stepping\t: 1
microcode\t: 0x1000065
cpu MHz\t\t: 2445.406
cache size\t: 512 KB
physical id\t: 0
siblings\t: 2
core id\t\t: {cpu}
cpu cores\t: 2
apicid\t\t: {cpu}
initial apicid\t: {cpu}
fpu\t\t: yes
fpu_exception\t: yes
cpuid level\t: 16
wp\t\t: yes
flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx \
fxsr sse sse2 ht syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology \
nonstop_tsc cpuid extd_apicid tsc_known_freq pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 \
x2apic movbe popcnt tsc_deadline_timer aes xsave avx f16c rdrand hypervisor lahf_lm cmp_legacy \
cr8_legacy abm sse4a misalignsse 3dnowprefetch osvw topoext ssbd ibrs ibpb stibp vmmcall fsgsbase \
tsc_adjust bmi1 avx2 smep bmi2 erms invpcid rdseed adx smap clflushopt clwb sha_ni xsaveopt xsavec \
xgetbv1 xsaves clzero xsaveerptr wbnoinvd arat umip pku ospke vaes vpclmulqdq rdpid fsrm
bugs\t\t: sysret_ss_attrs spectre_v1 spectre_v2 spec_store_bypass srso ibpb_no_ret spectre_v2_user
bogomips\t: 4890.81
TLB size\t: 2560 4K pages
clflush size\t: 64
cache_alignment\t: 64
address sizes\t: 48 bits physical, 48 bits virtual
power management:
"""


# /proc/cpuinfo verbatim from the project's CPU machine (2-core AMD EPYC VM, AVX2, no
# AVX-512), where the README's CPU figures were measured.
AMD_EPYC_CPUINFO = "\n".join(_amd_epyc_processor(cpu) for cpu in range(2))

# The flags that matter on the Intel Xeon (Sapphire Rapids) machine of issue 13, as Linux
# spells them; the rest of its line is left out.
XEON_AMX_CPUINFO = """\
processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse sse2 avx avx2 fma avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni \
avx512_bf16 amx_bf16 avx512_fp16 amx_tile amx_int8
"""


def test_the_amd_epyc_machine_has_avx2_only():
    info = parse_cpuinfo(AMD_EPYC_CPUINFO)
    assert info.model == "AMD EPYC"
    assert info.logical_cpus == 2
    assert {"avx", "avx2", "fma", "sse4_2"} <= info.flags and "avx512f" not in info.flags
    assert info.vector_extensions == ["AVX2"]
    assert info.summary() == "AMD EPYC, 2 logical CPUs, AVX2"


def test_a_xeon_with_amx_lists_every_extension_in_order():
    info = parse_cpuinfo(XEON_AMX_CPUINFO)
    assert info.model == "Intel(R) Xeon(R) Platinum 8480+"
    assert info.vector_extensions == ["AVX2", "AVX-512", "AVX512_BF16", "AMX"]
    assert info.summary() == "Intel(R) Xeon(R) Platinum 8480+, 1 logical CPU, AVX2 AVX-512 AVX512_BF16 AMX"


def test_amx_without_amx_tile_and_no_extensions():
    assert vector_extensions({"avx2", "amx_bf16"}) == ["AVX2", "AMX"]
    assert vector_extensions({"sse2", "avx"}) == []
    assert CpuInfo("Old", frozenset({"sse2"}), 4).summary() == "Old, 4 logical CPUs, no AVX2/AVX-512/AMX"


def test_aarch64_features_and_no_model_name():
    text = ("processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd evtstrm aes crc32 sve bf16\n"
            "CPU implementer\t: 0x41\nCPU part\t: 0xd40\n\nprocessor\t: 1\n")
    info = parse_cpuinfo(text)
    assert info.model == "Arm CPU implementer 0x41 part 0xd40"
    assert info.vector_extensions == ["NEON", "SVE"] and info.logical_cpus == 2


def test_without_proc_cpuinfo_falls_back_to_platform(monkeypatch, tmp_path):
    monkeypatch.setattr(machine.platform, "processor", lambda: "x86_64 Family 25")
    info = cpu_info(str(tmp_path / "missing"))
    assert info.model == "x86_64 Family 25" and info.flags == frozenset()
    assert info.logical_cpus == os.cpu_count()
    assert info.summary().endswith("vector extensions unknown")


@pytest.mark.skipif(not os.path.exists("/proc/cpuinfo"), reason="no /proc/cpuinfo (not Linux)")
def test_this_machine():
    info = cpu_info()
    with open("/proc/cpuinfo") as f:
        text = f.read()
    assert info.model and info.model in text
    assert set(info.vector_extensions) <= {"AVX2", "AVX-512", "AVX512_BF16", "AMX", "NEON", "SVE"}
    assert ("avx2" in info.flags) == ("AVX2" in info.vector_extensions)
