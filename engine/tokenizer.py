"""Loads a model folder's tokenizer (transformers, tokenizer files only; no weights)."""
from __future__ import annotations

import os
from pathlib import Path


def load_tokenizer(folder: str | Path):
    """AutoTokenizer from the folder, offline; falls back to a bare tokenizer.json."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    folder = Path(folder)
    try:
        return AutoTokenizer.from_pretrained(str(folder))
    except Exception:  # noqa: BLE001 - a folder with only tokenizer.json is still usable
        if (folder / "tokenizer.json").exists():
            return PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
        raise ValueError(f"model folder {folder} has no usable tokenizer (tokenizer.json)") from None


def fast_decoder(tokenizer):
    """A decode(ids) -> str that skips transformers' per-call input checks (they cost more than
    the decoding itself for the snapshot's many small calls); the same text as tokenizer.decode.

    It spells special tokens (a panel shows each token, `<|im_end|>` included); its
    `without_special` attribute is the same decoder without them, for a request's output text
    as vLLM returns it (skip_special_tokens=True, vLLM's default, and `LLM.generate`'s)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        decode = lambda ids: tokenizer.decode(ids)  # noqa: E731
        decode.without_special = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)
        return decode
    decode = lambda ids: backend.decode(list(ids), skip_special_tokens=False)  # noqa: E731
    decode.without_special = lambda ids: backend.decode(list(ids), skip_special_tokens=True)
    return decode
