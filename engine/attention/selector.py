"""Which attention backend runs: 'auto' resolved for the device and cache, and a clear
error when the one asked for cannot run here. Backends are imported only when chosen
(triton and flash-attn may be missing)."""
from __future__ import annotations

import torch

from ..cpu_kernels import native, unavailable_reason
from ..dtypes import compute_dtype, dtype_name
from .backend import AttentionBackend


def get_attention_backend(name: str, device: torch.device, block_size: int = 16,
                          dtype: torch.dtype = torch.float32, sliding_window: int | None = None) -> AttentionBackend:
    """Resolve 'auto' and build the backend; a clear error when one cannot run here.

    'auto' on a GPU: flash_attn where it is installed and the cache suits it (block_size a
    multiple of 256, fp16/bf16), else our triton kernels, else the torch reference. On a CPU
    in fp32 or bf16 (fp32 arithmetic over a bf16 cache, engine/dtypes.py): the cpu backend
    (native decode kernel) where kvscope's native kernels build; otherwise the torch reference.
    A model with sliding-window layers (`sliding_window`) runs on the cpu, torch or triton
    backend, which honour the window; 'auto' on a GPU passes flash_attn over for it."""
    if sliding_window is not None and name == "flash_attn":
        raise ValueError(f"attention_backend 'flash_attn' does not honour sliding windows yet, and this model has "
                         f"sliding-window layers ({sliding_window} tokens); use attention_backend='triton' "
                         "(or 'torch')")
    if name == "auto":
        if device.type == "cuda":
            if block_size % 256 == 0 and dtype in (torch.float16, torch.bfloat16) and sliding_window is None:
                try:
                    return _flash_attn()
                except ImportError:
                    pass
            try:
                return _triton()
            except ImportError:
                pass
        name = "cpu" if _cpu_fits(device, dtype) and native() is not None else "torch"
    if name == "torch":
        from .torch_backend import TorchAttentionBackend
        return TorchAttentionBackend()
    if name == "cpu":
        return _cpu(device, dtype)
    if name == "triton":
        try:
            return _triton()
        except ImportError as e:
            raise ValueError(f"attention_backend 'triton' is not available here: {e}") from None
    if name == "flash_attn":
        try:
            backend = _flash_attn()
        except ImportError as e:
            raise ValueError(f"attention_backend 'flash_attn' is not available here: {e}; "
                             "attention_backend='triton' runs our own kernels") from None
        if dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"attention_backend 'flash_attn' computes in float16 or bfloat16, got dtype "
                             f"{dtype_name(dtype)} (dtype='auto' is float32 on a CPU); use dtype='bfloat16'")
        return backend
    raise ValueError(f"attention_backend must be one of auto, torch, cpu, triton, flash_attn; got {name!r}")


def _cpu(device: torch.device, dtype: torch.dtype) -> AttentionBackend:
    from .cpu_backend import CpuAttentionBackend
    kernels = native()
    if not _cpu_fits(device, dtype) or kernels is None:
        why = f"the native CPU kernels are off here: {unavailable_reason()}" if kernels is None else \
            f"it runs on a CPU in float32 or bfloat16, got {device.type} and {dtype_name(dtype)}"
        raise ValueError(f"attention_backend 'cpu' is not available: {why}; attention_backend='torch' runs anywhere")
    return CpuAttentionBackend(kernels)


def _cpu_fits(device: torch.device, dtype: torch.dtype) -> bool:
    """A CPU computing in fp32: the cpu backend's kernels read an fp32 or bf16 cache."""
    return device.type == "cpu" and compute_dtype(dtype, device) == torch.float32


def _triton() -> AttentionBackend:
    from .triton_backend import TritonAttentionBackend
    return TritonAttentionBackend()


def _flash_attn() -> AttentionBackend:
    from .flash_attn_backend import FlashAttentionBackend
    return FlashAttentionBackend()
