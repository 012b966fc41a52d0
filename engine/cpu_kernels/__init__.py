"""kvscope's native CPU kernels (kvscope_cpu.c): skinny linears over weights packed in panels,
and paged prefill and decode attention straight from the block tables. Arithmetic in fp32; weights and the
KV cache stored in fp32 or bf16.

The C file is compiled with the system's gcc the first time it is needed (about a second) into
kvscope's cache folder, keyed by its source and the compiler flags, and loaded with ctypes. It
builds once per CPU kind (VARIANTS): 'avx2' needs an x86-64 CPU with AVX2 and FMA (every CPU
kind this project runs on); 'avx512' also needs AVX-512 (F, BW, VL, DQ), whose 16-float
registers multiply a whole fp32 panel per FMA (kvscope_cpu.c's micro_wide); 'avx512_bf16' also
needs AVX512_BF16, whose dot product multiplies a bf16 engine's panels (micro_pairs). `native()`
loads the best variant this CPU runs (`KVSCOPE_CPU_VARIANT=avx2` picks another), `variants()`
says which run here and why not. AMX tiles are not used by any variant (UNBUILT; oneDNN uses
them where the CPU has them). Where the CPU, the compiler or the build is missing, `native()` is None and
the engine keeps torch's kernels (`KVSCOPE_NATIVE_CPU=0` chooses that too). Its OpenMP is the
libgomp torch already loaded, so both share one pool of threads."""
from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

import torch

from ..default_model import cache_dir

SOURCE = Path(__file__).with_name("kvscope_cpu.c")  # shipped as package data: each install compiles its own
SOURCE_MISSING = "their C source is not installed"
FLAGS = ["-O3", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC", "-std=gnu11"]
DISABLE_ENV_VAR = "KVSCOPE_NATIVE_CPU"
VARIANT_ENV_VAR = "KVSCOPE_CPU_VARIANT"
# Each build of kvscope_cpu.c: its instruction-set flags and the /proc/cpuinfo flags it needs,
# best last (native() takes the last one this CPU runs).
VARIANTS = {
    "avx2": (["-mavx2", "-mfma"], ("avx2", "fma")),
    "avx512": (["-mavx2", "-mfma", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq"],
               ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq")),
    "avx512_bf16": (["-mavx2", "-mfma", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512bf16"],
                    ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16")),
}

_i64, _f32, _ptr = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p


# kv_decode_forward's arguments, field for field as the C structs declare them.
class DecoderLayerPointers(ctypes.Structure):
    """One decoder layer's weights (norms, packed panels) and its K/V pools (C: kv_layer)."""
    _fields_ = [*((name, _ptr) for name in ("input_norm", "post_attention_norm", "qkv_panels", "qkv_bias", "q_norm",
                                            "k_norm", "o_panels", "gate_up_panels", "down_panels", "k_cache",
                                            "v_cache")),
                ("group", _i64), ("window", _i64)]   # its KV cache group (1: sliding window) and window (0: none)


class DecoderPointers(ctypes.Structure):
    """The model's shape and its shared weights (C: kv_decoder)."""
    _fields_ = [*((name, _i64) for name in ("num_layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate",
                                            "block_size", "vocab", "bf16", "round_bf16")),
                ("eps", _f32), ("attn_scale", _f32),
                *((name, _ptr) for name in ("embedding", "final_norm", "lm_head_panels", "cos_table", "sin_table")),
                ("layers", ctypes.POINTER(DecoderLayerPointers))]


class DecodeBatchPointers(ctypes.Structure):
    """One step's decodes: their inputs, block tables and the workspaces (C: kv_decode_batch)."""
    _fields_ = [("rows", _i64), ("table_stride", _i64),
                *((name, _ptr) for name in ("token_ids", "positions", "slots", "decode_rows", "seq_lens",
                                            "block_tables", "x", "residual", "normed", "qkv", "attn", "gate_up",
                                            "act", "logits")),
                # the sliding-window group's (a model with such layers)
                ("group_table_stride", _i64), ("group_slots", _ptr), ("group_block_tables", _ptr)]

_SIGNATURES = {
    "kv_variant": (ctypes.c_char_p, []),
    "kv_packed_values": (_i64, [_i64, _i64, _i64]),
    "kv_pack_panels": (None, [_ptr, _i64, _i64, _i64, _ptr]),
    "kv_linear": (None, [_ptr, _i64, _i64, _ptr, _i64, _i64, _ptr, _ptr, _i64]),
    "kv_rms_norm": (None, [_ptr, _ptr, _ptr, _i64, _i64, _f32, _ptr]),
    "kv_reshape_and_cache": (None, [_ptr, _i64, _ptr, _i64, _ptr, _ptr, _i64, _ptr, _i64, _i64]),
    "kv_rope_inplace": (None, [_ptr, _ptr, _ptr, _ptr, _i64, _i64, _i64, _i64]),
    "kv_silu_and_mul": (None, [_ptr, _i64, _i64, _ptr]),
    "kv_paged_decode_attention": (None, [_ptr, _i64, _ptr, _ptr, _i64, _ptr, _ptr, _ptr, _i64, _i64, _i64,
                                         _i64, _i64, _i64, _i64, _f32, _ptr]),
    "kv_paged_prefill_attention": (None, [_ptr, _i64, _ptr, _ptr, _i64, _ptr, _ptr, _ptr, _ptr, _i64, _i64, _i64,
                                          _i64, _i64, _i64, _i64, _f32, _ptr]),
    "kv_greedy_top": (None, [_ptr, _i64, _i64, _i64, _ptr, _ptr]),
    "kv_decode_forward": (None, [ctypes.POINTER(DecoderPointers), ctypes.POINTER(DecodeBatchPointers)]),
    "kv_read_streams": (ctypes.c_double, [_ptr, _i64]),
}


class NativeCpuKernels:
    """The loaded library, called on contiguous CPU tensors (the callers check): activations in
    fp32, weight panels and KV caches in fp32 or bf16 (STORAGE_DTYPES)."""

    def __init__(self, lib: ctypes.CDLL, path: Path) -> None:
        self.lib, self.path = lib, path
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = restype, argtypes
        self.variant: str = lib.kv_variant().decode()  # the build (VARIANTS) this library is

    def pack_panels(self, weight: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """[N, K] weight -> the flat panel layout kv_linear reads, in fp32 or bf16 (rounded to
        nearest even; the bf16 panels interleave each step's columns, see kv_pack_panels)."""
        w = weight.detach().float().contiguous()
        n, k = w.shape
        bf16 = int(_storage(dtype) == torch.bfloat16)
        out = torch.empty(self.lib.kv_packed_values(n, k, bf16), dtype=dtype)
        self.lib.kv_pack_panels(w.data_ptr(), n, k, bf16, out.data_ptr())
        return out

    def linear(self, x: torch.Tensor, panels: torch.Tensor, n: int, bias: torch.Tensor | None,
               rounding: int = 0, out: torch.Tensor | None = None) -> torch.Tensor:
        """x [M, K] @ W^T + bias -> [M, N], W given as pack_panels' output. `rounding` (ROUND_INPUT,
        ROUND_OUTPUT, or both): x's rows rounded to bf16 values before the products (x itself is
        left as it is), y rounded after the bias; the sums are fp32 either way. `out`: a
        contiguous fp32 [M, N] tensor to write y into (else a new one)."""
        m, k = x.shape
        y = torch.empty((m, n), dtype=torch.float32) if out is None else out
        assert y.shape == (m, n) and y.dtype == torch.float32 and y.is_contiguous(), "out: contiguous fp32 [M, N]"
        self.lib.kv_linear(x.data_ptr(), m, k, panels.data_ptr(), _is_bf16(panels), n,
                           None if bias is None else bias.data_ptr(), y.data_ptr(), rounding)
        return y

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float,
                 residual: torch.Tensor | None = None) -> torch.Tensor:
        """RMSNorm over the last dim of x [rows, n] (contiguous). With `residual` (same shape,
        contiguous), residual += x in place first and the sum is normalized."""
        out = torch.empty_like(x)
        self.lib.kv_rms_norm(x.data_ptr(), None if residual is None else residual.data_ptr(), weight.data_ptr(),
                             x.shape[0], x.shape[1], eps, out.data_ptr())
        return out

    def reshape_and_cache(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          slot_mapping: torch.Tensor) -> None:
        """Store fp32 K/V [T, kvh, d] (rows may be strided, each row contiguous) at their slots of
        the fp32 or bf16 caches (rounded to nearest even); -1 skipped."""
        self.lib.kv_reshape_and_cache(k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0), k_cache.data_ptr(),
                                      v_cache.data_ptr(), _is_bf16(k_cache), slot_mapping.data_ptr(), k.shape[0],
                                      k_cache.shape[2] * k_cache.shape[3])

    def rope_(self, x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              heads: int, head_dim: int) -> None:
        """Neox RoPE in place on the first `heads` heads of each row of x [tokens, >= heads * head_dim]."""
        self.lib.kv_rope_inplace(x.data_ptr(), positions.data_ptr(), cos.data_ptr(), sin.data_ptr(),
                                 x.shape[0], x.stride(0), heads, head_dim)

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up for gate_up [tokens, 2n] = [gate | up] -> [tokens, n]."""
        t, n = gate_up.shape[0], gate_up.shape[1] // 2
        out = torch.empty((t, n), dtype=torch.float32)
        self.lib.kv_silu_and_mul(gate_up.data_ptr(), t, n, out.data_ptr())
        return out

    def paged_decode_attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                               rows: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor,
                               out: torch.Tensor, window: int | None = None) -> None:
        """Writes out[rows[i]] = attention of q[rows[i]] over decode i's cached context (its last
        `window` positions with a sliding window); q's rows may be strided (each row
        contiguous), out is contiguous."""
        _, h, d = q.shape
        _, block_size, kvh, _ = k_cache.shape
        self.lib.kv_paged_decode_attention(
            q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(), _is_bf16(k_cache), rows.data_ptr(),
            seq_lens.data_ptr(),
            block_tables.data_ptr(), block_tables.stride(0), rows.shape[0], h, kvh, d, block_size,
            window or 0, d ** -0.5, out.data_ptr())

    def paged_prefill_attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                q_starts: torch.Tensor, q_lens: torch.Tensor, ctx_lens: torch.Tensor,
                                block_tables: torch.Tensor, out: torch.Tensor, window: int | None = None) -> None:
        """Writes the causal attention of sequence i's query rows q[q_starts[i] : + q_lens[i]]
        (positions ctx_lens[i] ..) over its context in the caches (each query's last `window`
        positions with a sliding window), read through row i of block_tables, into the same rows
        of out. The step's own K/V must be stored first. q's
        rows may be strided (each row contiguous), out is contiguous; int64 index tensors."""
        _, h, d = q.shape
        _, block_size, kvh, _ = k_cache.shape
        self.lib.kv_paged_prefill_attention(
            q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(), _is_bf16(k_cache), q_starts.data_ptr(),
            q_lens.data_ptr(), ctx_lens.data_ptr(), block_tables.data_ptr(), block_tables.stride(0), q_starts.shape[0],
            h, kvh, d, block_size, window or 0, d ** -0.5, out.data_ptr())

    def greedy_top(self, logits: torch.Tensor, k: int) -> tuple[list[list[int]], list[list[float]]]:
        """For each row of logits [rows, vocab] (contiguous fp32): the ids of its k largest
        logits, descending (ids[r][0] is the argmax, the first index on ties), and their
        probabilities under the row's softmax. k <= vocab. Lists, through ctypes buffers: no
        torch call after a decode step (each costs ~40 us then, with the caches just flushed by
        the weights' stream)."""
        rows, vocab = logits.shape
        ids, probs = (ctypes.c_int64 * (rows * k))(), (ctypes.c_float * (rows * k))()
        self.lib.kv_greedy_top(logits.data_ptr(), rows, vocab, k, ctypes.addressof(ids), ctypes.addressof(probs))
        return [ids[r * k:(r + 1) * k] for r in range(rows)], [probs[r * k:(r + 1) * k] for r in range(rows)]

    def decode_forward(self, decoder: DecoderPointers, batch: DecodeBatchPointers) -> None:
        """The whole forward of a batch of decodes, to the logits (engine/runner/native_decode.py fills both)."""
        self.lib.kv_decode_forward(ctypes.byref(decoder), ctypes.byref(batch))

    def read_streams(self, buf: torch.Tensor) -> float:
        """The sum of a contiguous fp32 tensor, read as a one-row linear reads its panels (several
        runs side by side per thread): the bench times it for the machine's read bandwidth."""
        assert buf.dtype == torch.float32 and buf.is_contiguous()
        return self.lib.kv_read_streams(buf.data_ptr(), buf.numel())


STORAGE_DTYPES = (torch.float32, torch.bfloat16)

# kv_linear's `rounding` flags (kvscope_cpu.c defines the same): where a bf16 engine's linears
# round to bf16 values, as vLLM's bf16 GEMMs do. engine/model/cpu_linear.py says which linear
# rounds where, and oneDNN's path rounds at the same places.
ROUND_INPUT, ROUND_OUTPUT = 1, 2


def _storage(dtype: torch.dtype) -> torch.dtype:
    if dtype not in STORAGE_DTYPES:
        raise ValueError(f"the native kernels store weights and KV in float32 or bfloat16, got {dtype}")
    return dtype


def _is_bf16(t: torch.Tensor) -> int:
    return int(_storage(t.dtype) == torch.bfloat16)


def native() -> NativeCpuKernels | None:
    """The kernels, built on first use; None where they cannot run here (see the module doc)."""
    return _load()[0]


def variants() -> dict[str, str | None]:
    """Every build of the kernels: None where this CPU runs it, else why not."""
    flags = cpu_flags()
    if not flags:  # no /proc/cpuinfo: torch's own check (cpu_supported) stands for AVX2 + FMA
        return {name: None if name == "avx2" else "the CPU's flags are unknown (no /proc/cpuinfo)" for name in VARIANTS}
    return {name: None if all(f in flags for f in needs) else
            "this CPU lacks " + ", ".join(f for f in needs if f not in flags)
            for name, (_, needs) in VARIANTS.items()}


# Instruction sets that no build of the kernels uses, and what runs on such a CPU instead.
UNBUILT = {"amx": "no build multiplies with AMX tiles: an AMX CPU runs the avx512_bf16 build for decodes, "
                  "and oneDNN's prefill GEMM uses the tiles"}


def variants_not_running() -> list[str]:
    """Every build this CPU cannot run, with why, and every instruction set no build uses: what
    doctor and the benches name next to the build that runs, so nothing is skipped silently."""
    return ([f"{name} not here ({reason})" for name, reason in variants().items() if reason]
            + [f"{name} not built ({why})" for name, why in UNBUILT.items()])


def load_variant(name: str) -> NativeCpuKernels:
    """One build of the kernels (VARIANTS), built on first use; ValueError where this CPU cannot
    run it. Tests load each variant the machine runs."""
    if name not in VARIANTS:
        raise ValueError(f"{VARIANT_ENV_VAR}: no kernel variant {name!r}; the variants are {', '.join(VARIANTS)}")
    reason = variants()[name]
    if reason:
        raise ValueError(f"kernel variant {name!r} cannot run here: {reason}")
    path = _build(name)
    return NativeCpuKernels(ctypes.CDLL(str(path)), path)


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as /proc/cpuinfo names them (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return frozenset(line.partition(":")[2].split())


def unavailable_reason() -> str | None:
    """Why native() is None, in words (None when the kernels run)."""
    return _load()[1]


def cache_clear() -> None:
    """Forget the loaded kernels (tests change the environment variable)."""
    _load.cache_clear()


@lru_cache(maxsize=1)
def _load() -> tuple[NativeCpuKernels | None, str | None]:
    if os.environ.get(DISABLE_ENV_VAR, "1") == "0":
        return None, f"turned off by {DISABLE_ENV_VAR}=0"
    if not cpu_supported():
        capability = torch.backends.cpu.get_cpu_capability()
        return None, f"they need an x86-64 CPU with AVX2 and FMA (torch reports {capability})"
    if not SOURCE.is_file():  # a kvscope installed from a package built without it (pyproject's package-data)
        return None, f"{SOURCE_MISSING}: {SOURCE}"
    runnable = [name for name, reason in variants().items() if reason is None]
    chosen = os.environ.get(VARIANT_ENV_VAR) or (runnable[-1] if runnable else "avx2")
    try:
        return load_variant(chosen), None
    except ValueError as exc:
        return None, str(exc)
    except FileNotFoundError:
        return None, "gcc was not found (install it: apt-get install gcc)"
    except subprocess.CalledProcessError as exc:
        return None, f"gcc failed: {exc.stderr.decode(errors='replace').strip()[-300:]}"
    except OSError as exc:
        return None, f"the built library did not load: {exc}"


def cpu_supported() -> bool:
    """x86-64 with AVX2 and FMA (torch reports AVX2 or AVX512 then)."""
    return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


def _build(variant: str) -> Path:
    source = SOURCE.read_bytes()
    flags = [*FLAGS, *VARIANTS[variant][0]]
    key = hashlib.sha256(source + " ".join(flags).encode()).hexdigest()[:16]
    folder = cache_dir() / "cpu_kernels"
    target = folder / f"kvscope_cpu-{variant}-{key}.so"
    if not target.exists():
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
        os.close(fd)
        try:
            subprocess.run(["gcc", *flags, str(SOURCE), "-o", tmp], check=True, capture_output=True)
            os.replace(tmp, target)  # atomic: a concurrent build never loads a half-written file
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return target
