"""The attention backend interface and its registry."""
from __future__ import annotations

import torch

from .metadata import AttentionMetadata


class AttentionBackend:
    """Computes attention for one layer of a packed batch over the paged KV cache."""

    name = "base"

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """q: [T, H, D]; k, v: [T, KVH, D]; caches: [num_blocks, block_size, KVH, D].
        Returns [T, H, D]."""
        raise NotImplementedError


def get_attention_backend(name: str, device: torch.device) -> AttentionBackend:
    """Resolve 'auto' and build the backend; a clear error when one cannot run here."""
    if name in ("auto", "torch"):
        if name == "auto" and device.type == "cuda":
            try:
                from .triton_backend import TritonAttentionBackend  # noqa: F401  (GPU path)
                return TritonAttentionBackend()
            except ImportError:
                pass
        from .torch_backend import TorchAttentionBackend
        return TorchAttentionBackend()
    if name == "triton":
        try:
            from .triton_backend import TritonAttentionBackend
        except ImportError as e:
            raise ValueError(f"attention_backend 'triton' is not available here: {e}") from None
        return TritonAttentionBackend()
    if name == "flash_attn":
        raise ValueError("attention_backend 'flash_attn' needs the flash-attn package and a CUDA GPU; "
                         "use attention_backend='torch' on this machine")
    raise ValueError(f"attention_backend must be one of auto, torch, triton, flash_attn; got {name!r}")
