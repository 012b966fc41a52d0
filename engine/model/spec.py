"""The model shape, read from a Hugging Face config.json (no transformers import needed)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")
LAYER_TYPES = ("full_attention", "sliding_attention")  # transformers' names for config.layer_types


@dataclass(frozen=True)
class ModelSpec:
    """Everything the decoder needs to know about a checkpoint's architecture."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool   # Qwen2: bias on q/k/v projections
    qk_norm: bool          # Qwen3: RMSNorm on each head of q and k
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    torch_dtype: str
    # One per layer, transformers' names: 'sliding_attention' layers attend to their last
    # `sliding_window` positions (their own included), 'full_attention' ones to all.
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None

    @classmethod
    def from_folder(cls, folder: str | Path) -> ModelSpec:
        cfg = json.loads((Path(folder) / "config.json").read_text())
        model_type = cfg.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"model_type {model_type!r} in {folder}/config.json is not supported; "
                             f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", None):
            raise ValueError(f"rope_type {rope_type!r} in {folder}/config.json is not supported (only 'default')")
        rope_theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
        num_heads = cfg["num_attention_heads"]
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // num_heads
        eos = cfg.get("eos_token_id")
        gen_path = Path(folder) / "generation_config.json"
        if gen_path.exists():
            eos = json.loads(gen_path.read_text()).get("eos_token_id", eos)
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        layer_types, window = _attention_layers(cfg, folder)
        return cls(
            model_type=model_type,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=cfg.get("num_key_value_heads", num_heads),
            head_dim=head_dim,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta),
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", model_type == "qwen2")),
            qk_norm=model_type == "qwen3",
            eos_token_ids=eos_ids,
            bos_token_id=cfg.get("bos_token_id"),
            torch_dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32"),
            layer_types=layer_types,
            sliding_window=window,
        )

    def is_sliding(self, layer: int) -> bool:
        return self.sliding_window is not None and self.layer_types[layer] == "sliding_attention"

    def kv_cache_group_layers(self) -> list[list[int]]:
        """The layers of each KV cache group (vLLM's kv_cache_groups): the full-attention
        layers, then the sliding-window ones where the model has any. Each group has its own
        block table per request; a group's layers share it."""
        full = [i for i in range(self.num_layers) if not self.is_sliding(i)]
        sliding = [i for i in range(self.num_layers) if self.is_sliding(i)]
        return [full, sliding] if sliding else [full]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _attention_layers(cfg: dict[str, Any], folder: str | Path) -> tuple[tuple[str, ...], int | None]:
    """(layer types, sliding window) as transformers reads them for Qwen2/Qwen3: the window
    counts only with `use_sliding_window`, and without `layer_types` the layers from
    `max_window_layers` on slide. Llama's layers are all full."""
    n = cfg["num_hidden_layers"]
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window", False) else None
    types = cfg.get("layer_types")
    if types is None:
        first_sliding = cfg.get("max_window_layers", n)
        types = ["sliding_attention" if window is not None and i >= first_sliding else "full_attention"
                 for i in range(n)]
    if len(types) != n or any(t not in LAYER_TYPES for t in types):
        raise ValueError(f"layer_types in {folder}/config.json must name {n} layers, each one of "
                         f"{', '.join(LAYER_TYPES)}; got {types!r}")
    if window is not None and (not isinstance(window, int) or window < 1):
        raise ValueError(f"sliding_window in {folder}/config.json must be a positive number of tokens, got {window!r}")
    if window is not None and all(t == "sliding_attention" for t in types):
        raise ValueError(f"every layer of {folder}/config.json is sliding_attention: kvscope needs at least one "
                         "full_attention layer (its first KV cache group is full attention)")
    return tuple(types), window if "sliding_attention" in types else None
