"""Loads a model folder's tokenizer (transformers, tokenizer files only; no weights)."""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


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


class Decoder:
    """decode(ids) -> str spelling special tokens; `without_special(ids)` leaves them out;
    `output_text()` a new OutputText (one per request) where the tokenizer streams."""

    def __init__(self, spell: Callable[[Sequence[int]], str], without_special: Callable[[Sequence[int]], str],
                 backend: Any = None) -> None:
        self._spell = spell
        self.without_special = without_special
        self._backend = backend
        self._one: dict[int, str] = {}   # one token's text: each step's sampled tokens, spelled again and again

    def __call__(self, ids: Sequence[int]) -> str:
        if len(ids) != 1:
            return self._spell(ids)
        text = self._one.get(ids[0])
        if text is None:
            text = self._one[ids[0]] = self._spell(ids)
        return text

    def output_text(self) -> Callable[[Sequence[int]], str]:
        """ids -> their text without special tokens, for one growing list of output ids (decoded
        whole each time without a backend that streams: tokenizers before 0.21)."""
        if self._backend is None:
            return self.without_special
        return OutputText(self._backend, self.without_special)


def _streams() -> bool:
    try:
        from tokenizers.decoders import DecodeStream  # noqa: F401
    except ImportError:
        return False
    return True


class OutputText:
    """One request's output text, decoded as its tokens arrive (as vLLM's detokenizer does), not
    whole again at every step: tokenizers' DecodeStream gives a new token's text once its bytes
    complete whole characters. While it holds bytes back (a character split across tokens) the
    text is decoded whole, so it equals `without_special(ids)` at every length, the U+FFFD a
    split character ends in included (tests/engine/test_tokenizer.py)."""

    def __init__(self, backend: Any, whole: Callable[[Sequence[int]], str]) -> None:
        self._backend, self._whole = backend, whole
        self._start()

    def _start(self) -> None:
        from tokenizers.decoders import DecodeStream

        self._stream = DecodeStream(skip_special_tokens=True)
        self._fed, self._streamed, self._held = 0, "", False
        self._whole_at: tuple[int, str] = (-1, "")

    def __call__(self, ids: Sequence[int]) -> str:
        if len(ids) < self._fed:   # not the list it followed: start again
            self._start()
        for token in ids[self._fed:]:
            chunk = self._stream.step(self._backend, token)
            self._held = chunk is None
            if chunk:
                self._streamed += chunk
        self._fed = len(ids)
        if not self._held:
            return self._streamed
        if self._whole_at[0] != len(ids):
            self._whole_at = (len(ids), self._whole(ids))
        return self._whole_at[1]


def fast_decoder(tokenizer: Any) -> Decoder:
    """A decode(ids) -> str that skips transformers' per-call input checks (they cost more than
    the decoding itself for the snapshot's many small calls); the same text as tokenizer.decode.

    It spells special tokens (a panel shows each token, `<|im_end|>` included); its
    `without_special` attribute is the same decoder without them, for a request's output text
    as vLLM returns it (skip_special_tokens=True, vLLM's default, and `LLM.generate`'s)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return Decoder(lambda ids: tokenizer.decode(ids), lambda ids: tokenizer.decode(ids, skip_special_tokens=True))
    return Decoder(lambda ids: backend.decode(list(ids), skip_special_tokens=False),
                   lambda ids: backend.decode(list(ids), skip_special_tokens=True), backend if _streams() else None)
