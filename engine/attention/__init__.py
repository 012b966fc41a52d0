"""Attention backends behind one interface: write K/V into the paged cache by slot mapping,
then attend over each sequence's whole context read through its block table."""
from .backend import AttentionBackend
from .metadata import AttentionMetadata
from .selector import get_attention_backend

__all__ = ["AttentionBackend", "AttentionMetadata", "get_attention_backend"]
