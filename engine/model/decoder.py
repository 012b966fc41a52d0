"""One decoder for Llama, Qwen2 and Qwen3: they differ only in q/k/v bias (Qwen2) and the
per-head q/k RMSNorm (Qwen3). Inputs are a packed batch: no padding, positions per token.

With tensor parallelism (`tp.size > 1`) each rank builds the same model with its share of
heads, KV heads, MLP rows and vocabulary rows; `tp` is a no-op at size 1."""
from __future__ import annotations

import torch
from torch import nn

from ..attention import AttentionBackend, AttentionMetadata
from ..cpu_kernels import native
from ..parallel.layers import RowParallelLinear, VocabParallelEmbedding
from ..parallel.parallel_state import SINGLE, TensorParallel
from .cpu_linear import PackedLinear, gemm_dtype_for, pack_linear_layers, place_panels_on_huge_pages
from .layers import RMSNorm, RotaryEmbedding, SwiGLU
from .logits_head import LogitsHead
from .spec import ModelSpec


class Attention(nn.Module):
    """Grouped-query self-attention with RoPE over the paged cache, through an attention backend."""
    def __init__(self, spec: ModelSpec, layer: int, rope: RotaryEmbedding, tp: TensorParallel = SINGLE) -> None:
        super().__init__()
        self.layer = layer
        # This rank's heads: the KV cache it owns holds only its KV heads.
        self.num_heads, self.num_kv_heads = spec.num_heads // tp.size, spec.num_kv_heads // tp.size
        self.head_dim = spec.head_dim
        self.q_size = self.num_heads * spec.head_dim
        self.kv_size = self.num_kv_heads * spec.head_dim
        # q, k and v packed in one matrix: one GEMM instead of three (column-parallel: this
        # rank's q rows, then its k rows, then its v rows).
        self.qkv_proj = nn.Linear(spec.hidden_size, self.q_size + 2 * self.kv_size, bias=spec.attention_bias)
        self.o_proj = nn.Linear(self.q_size, spec.hidden_size, bias=False) if tp.size == 1 else \
            RowParallelLinear(spec.num_heads * spec.head_dim, spec.hidden_size, False, tp)
        self.q_norm = RMSNorm(spec.head_dim, spec.rms_norm_eps) if spec.qk_norm else None
        self.k_norm = RMSNorm(spec.head_dim, spec.rms_norm_eps) if spec.qk_norm else None
        self.rope = rope
        # Its KV cache group: 0 for full attention, 1 for a sliding window (the step's
        # metadata for that group carries the group's block tables, slots and window).
        self.kv_group = 1 if spec.is_sliding(layer) else 0

    def forward(self, x: torch.Tensor, positions: torch.Tensor, kv_cache: tuple[torch.Tensor, torch.Tensor],
                backend: AttentionBackend, meta: AttentionMetadata) -> torch.Tensor:
        t = x.shape[0]
        qkv = self.qkv_proj(x)
        rotated = self.q_norm is None and self.rope.native is not None
        if rotated:  # native kernels: q's and k's heads rotated in place, side by side in each row
            self.rope.rotate_packed_(positions, qkv, self.num_heads + self.num_kv_heads)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(t, self.num_heads, self.head_dim)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        if not rotated:
            if self.q_norm is not None and self.k_norm is not None:  # both or neither (spec.qk_norm)
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = self.rope(positions, q, k)
        o = backend.forward(self.layer, q, k, v, kv_cache[0], kv_cache[1], meta.group(self.kv_group))
        return self.o_proj(o.reshape(t, self.q_size))


class DecoderLayer(nn.Module):
    """Pre-norm decoder layer: RMSNorm, attention, RMSNorm, SwiGLU MLP, with residuals."""
    def __init__(self, spec: ModelSpec, layer: int, rope: RotaryEmbedding, tp: TensorParallel = SINGLE) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.self_attn = Attention(spec, layer, rope, tp)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.mlp = SwiGLU(spec.hidden_size, spec.intermediate_size, tp)

    def forward(self, x, residual, positions, kv_cache, backend, meta):
        """(hidden, residual) in, (hidden, residual) out, as in vLLM: each norm first adds the
        pending residual (one fused call with the native kernels), then normalizes the sum."""
        if residual is None:
            residual, x = x, self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(x, positions, kv_cache, backend, meta)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class CausalLM(nn.Module):
    """Embedding -> decoder layers -> final norm -> LM head (tied or not).

    Split over `tp.size` ranks: a vocab-parallel embedding and LM head (logits gathered on
    rank 0), column-parallel q/k/v and gate/up, row-parallel o_proj and down_proj."""

    def __init__(self, spec: ModelSpec, max_positions: int, tp: TensorParallel = SINGLE) -> None:
        super().__init__()
        self.spec = spec
        self.tp = tp
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size) if tp.size == 1 else \
            VocabParallelEmbedding(spec.vocab_size, spec.hidden_size, tp)
        rope = RotaryEmbedding(spec.head_dim, max_positions, spec.rope_theta)
        self.layers = nn.ModuleList(DecoderLayer(spec, i, rope, tp) for i in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.lm_head = None if spec.tie_word_embeddings else \
            nn.Linear(spec.hidden_size, spec.vocab_size // tp.size, bias=False)
        self.packed_lm_head: LogitsHead | None = None  # set by pack_for_cpu()
        self.gemm_dtype: torch.dtype | None = None  # oneDNN's dtype for prefill-sized linears, set by pack_for_cpu()

    def decoder_layers(self) -> list[DecoderLayer]:
        """The layers, in order, as what they are (nn.ModuleList's items are plain Modules to a
        type checker)."""
        return [layer for layer in self.layers if isinstance(layer, DecoderLayer)]

    def pack_for_cpu(self, panel_dtype: torch.dtype = torch.float32) -> None:
        """fp32 activations on a CPU: every plain linear and the LM head with packed weights
        (cpu_linear.py says why; the native panels, in `panel_dtype`, together on huge pages;
        oneDNN's copy in bf16 for a bf16 engine where the CPU multiplies bf16 in hardware),
        and the norms, RoPE and SiLU-and-mul through kvscope's native kernels where they build.
        Call once, after the weights are loaded."""
        self.gemm_dtype = gemm_dtype_for(panel_dtype)
        pack_linear_layers(self.layers, panel_dtype, self.gemm_dtype)
        kernels = native()
        for module in self.modules():
            if isinstance(module, (RMSNorm, RotaryEmbedding, SwiGLU)):
                module.native = kernels
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        # The head rounds its input only (fp32 logits); prefill multiplies only the sampled rows
        # by it, mostly on the panels (logits_head.py: where its many-row product goes).
        self.packed_lm_head = LogitsHead(weight, panel_dtype)
        self.lm_head = None  # the packed copy replaces an untied head (a tied one stays the embedding)
        # A decode step streams every panel: in one huge-page buffer, in the order it reads them.
        place_panels_on_huge_pages([m for m in self.modules() if isinstance(m, PackedLinear)])

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]], backend: AttentionBackend,
                meta: AttentionMetadata, num_layers: int | None = None) -> torch.Tensor:
        """Hidden states after the final norm, [T, hidden]. `num_layers` stops early (probe)."""
        x, residual = self.embed_tokens(input_ids), None
        for i, layer in enumerate(self.layers[: num_layers or len(self.layers)]):  # layer i is self.layers[i]
            x, residual = layer(x, residual, positions, kv_caches[i], backend, meta)
        return self.norm(x, residual)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """Logits [rows, vocab]; with tensor parallelism the vocab shards are gathered on
        rank 0 (the sampler's rank) and other ranks get None."""
        if self.packed_lm_head is not None:
            logits = self.packed_lm_head(hidden)
        else:
            weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
            logits = hidden @ weight.t()
        return logits if self.tp.size == 1 else self.tp.gather_to_first(logits, dim=-1)
