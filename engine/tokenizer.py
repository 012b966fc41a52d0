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

    def output_text(self) -> OutputText:
        """ids -> their text without special tokens, for one growing list of output ids (decoded
        whole at each new length without a backend that streams: tokenizers before 0.21)."""
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
    held tokens are decoded with the chunk before them as context (their text is known, and a
    decoder may need it: a leading space a whole decode keeps), so the text equals
    `without_special(ids)` at every length, the U+FFFD a split character ends in included
    (tests/engine/test_tokenizer.py), at a cost that does not grow with the output."""

    def __init__(self, backend: Any, whole: Callable[[Sequence[int]], str]) -> None:
        self._backend, self._whole = backend, whole   # backend None: decoded whole at each length
        self._start()

    def _start(self) -> None:
        self._stream: Any = self._new_stream()   # None: decoded whole (__call__)
        self._fed, self._streamed, self._held = 0, "", False
        self._chunks_end: tuple[int, int] = (0, 0)   # how many ids the last two chunks streamed end at
        self._context: tuple[int, int, str] = (0, 0, "")   # ids[a:b] and their text, the held tail's context
        self._held_at: tuple[int, str] = (-1, "")

    def _new_stream(self) -> Any:
        if self._backend is None:
            return None
        from tokenizers.decoders import DecodeStream

        return DecodeStream(skip_special_tokens=True)

    def __call__(self, ids: Sequence[int]) -> str:
        n = len(ids)
        if n < self._fed:   # not the list it followed: start again
            self._start()
        if self._stream is not None:
            try:
                self._feed(ids)
            except Exception as e:   # tokenizers raises a bare Exception
                # Byte-fallback tokens whose bytes are no UTF-8 all decode to U+FFFD, a run of
                # them together: a later byte changes text the stream gave out already. vLLM starts
                # its stream again, its text no longer the whole decode's; this one is decoded
                # whole from now on (a random model's output, not a trained one's).
                if not str(e).startswith("Invalid prefix"):
                    raise
                self._stream = None
        if self._stream is None:
            return self._whole_text(ids)
        if not self._held:
            return self._streamed
        if self._held_at[0] != n:
            self._held_at = (n, self._held_text(ids))
        return self._held_at[1]

    def _feed(self, ids: Sequence[int]) -> None:
        step, backend = self._stream.step, self._backend
        for i in range(self._fed, len(ids)):
            chunk = step(backend, ids[i])   # None while it holds bytes back (never "")
            self._held = chunk is None
            if chunk is not None:
                self._streamed += chunk
                self._chunks_end = (self._chunks_end[1], i + 1)
        self._fed = len(ids)

    def _whole_text(self, ids: Sequence[int]) -> str:
        if self._held_at[0] != len(ids):
            self._held_at = (len(ids), self._whole(ids))
        return self._held_at[1]

    def _held_text(self, ids: Sequence[int]) -> str:
        """The streamed text and the held tokens' text: ids from the last chunk but one decoded,
        less that chunk's own text (else, where a decoder joins them otherwise, the whole)."""
        start, end = self._chunks_end
        if self._context[:2] != (start, end):
            self._context = (start, end, self._whole(ids[start:end]))
        known = self._context[2]
        tail = self._whole(ids[start:])
        if tail.startswith(known):
            return self._streamed + tail[len(known):]
        return self._whole(ids)


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
