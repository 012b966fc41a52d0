"""Decoder-only transformer models (Llama / Qwen2 / Qwen3) with paged attention."""
from .decoder import CausalLM
from .loader import load_weights
from .spec import ModelSpec

__all__ = ["CausalLM", "ModelSpec", "load_weights"]
