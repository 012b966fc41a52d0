"""The engine's dtype: what `EngineConfig.dtype` names, and what the arithmetic runs in.

On a GPU the two are the same. On a CPU, bf16 means bf16 weights and KV cache, and linears
that take and give bf16 values (rows and outputs rounded, as vLLM's bf16 GEMMs round them),
while every sum, the residual stream, the norms, RoPE and attention stay in fp32. A decode
step streams every weight from memory, so storing half the bytes makes it up to twice as fast;
torch's bf16 ops would gain nothing more on most CPUs (AVX2 has no bf16 instructions: they
convert element by element; on the 2-core AMD EPYC they ran one stream at 14.7 tok/s against
fp32's 19.7 and a quarter-size offline batch at 6.1 against 29.5), and fp32 sums keep the
results closer to fp32's. Widening a bf16 value is exact (it is the top half of an fp32 one),
and the product of two bf16 values is exact in fp32. engine/model/cpu_linear.py says where the
linears round, and what that means for the tokens of two paths."""
from __future__ import annotations

import torch

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype, device: torch.device) -> torch.dtype:
    """EngineConfig.dtype as a torch dtype: the weights' and the KV cache's."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        # fp32 on CPU keeps token-exact parity with transformers; bf16 is the GPU default.
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return TORCH_DTYPES[dtype]


# The GPU's attention backends compute in the engine's dtype wherever they run (the tests run
# them on a CPU too: triton under its interpreter, flash-attn as a torch transcription).
GPU_BACKENDS = ("triton", "flash_attn")


def compute_dtype(dtype: torch.dtype, device: torch.device, attention_backend: str = "auto") -> torch.dtype:
    """The dtype activations are computed in: fp32 for bf16 on a CPU (see the module doc),
    else the engine's dtype itself."""
    cpu_bf16 = device.type == "cpu" and dtype == torch.bfloat16 and attention_backend not in GPU_BACKENDS
    return torch.float32 if cpu_bf16 else dtype


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")
