"""One decoder for Llama, Qwen2 and Qwen3: they differ only in q/k/v bias (Qwen2) and the
per-head q/k RMSNorm (Qwen3). Inputs are a packed batch: no padding, positions per token."""
from __future__ import annotations

import torch
from torch import nn

from ..attention import AttentionBackend, AttentionMetadata
from .layers import RMSNorm, RotaryEmbedding, SwiGLU
from .spec import ModelSpec


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec, layer: int, rope: RotaryEmbedding) -> None:
        super().__init__()
        self.layer = layer
        self.num_heads, self.num_kv_heads, self.head_dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.q_size = spec.num_heads * spec.head_dim
        self.kv_size = spec.num_kv_heads * spec.head_dim
        # q, k and v packed in one matrix: one GEMM instead of three.
        self.qkv_proj = nn.Linear(spec.hidden_size, self.q_size + 2 * self.kv_size, bias=spec.attention_bias)
        self.o_proj = nn.Linear(self.q_size, spec.hidden_size, bias=False)
        self.q_norm = RMSNorm(spec.head_dim, spec.rms_norm_eps) if spec.qk_norm else None
        self.k_norm = RMSNorm(spec.head_dim, spec.rms_norm_eps) if spec.qk_norm else None
        self.rope = rope

    def forward(self, x: torch.Tensor, positions: torch.Tensor, kv_cache: tuple[torch.Tensor, torch.Tensor],
                backend: AttentionBackend, meta: AttentionMetadata) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(t, self.num_heads, self.head_dim)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rope(positions, q, k)
        o = backend.forward(self.layer, q, k, v, kv_cache[0], kv_cache[1], meta)
        return self.o_proj(o.reshape(t, self.q_size))


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, layer: int, rope: RotaryEmbedding) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.self_attn = Attention(spec, layer, rope)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.mlp = SwiGLU(spec.hidden_size, spec.intermediate_size)

    def forward(self, x, positions, kv_cache, backend, meta):
        x = x + self.self_attn(self.input_layernorm(x), positions, kv_cache, backend, meta)
        return x + self.mlp(self.post_attention_layernorm(x))


class CausalLM(nn.Module):
    """Embedding -> decoder layers -> final norm -> LM head (tied or not)."""

    def __init__(self, spec: ModelSpec, max_positions: int) -> None:
        super().__init__()
        self.spec = spec
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size)
        rope = RotaryEmbedding(spec.head_dim, max_positions, spec.rope_theta)
        self.layers = nn.ModuleList(DecoderLayer(spec, i, rope) for i in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.lm_head = None if spec.tie_word_embeddings else nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]], backend: AttentionBackend,
                meta: AttentionMetadata, num_layers: int | None = None) -> torch.Tensor:
        """Hidden states after the final norm, [T, hidden]. `num_layers` stops early (probe)."""
        x = self.embed_tokens(input_ids)
        for layer in self.layers[: num_layers or len(self.layers)]:
            x = layer(x, positions, kv_caches[layer.self_attn.layer], backend, meta)
        return self.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return hidden @ weight.t()
