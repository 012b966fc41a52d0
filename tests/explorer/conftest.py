"""Fixtures for the explorer tests."""
from __future__ import annotations

import functools

import pytest


@pytest.fixture(autouse=True)
def _share_tokenizers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Share one tokenizer per model folder across the engines these tests build.

    Loading Qwen's 151k-token tokenizer costs ~2.5 s per engine, and a Session test
    builds one to three engines (reset builds another); the weights load in ~0.2 s.
    The engine only reads its tokenizer, so sharing it changes no behaviour.
    """
    import engine.llm_engine as llm_engine

    load = getattr(llm_engine, "load_tokenizer", None)
    if load is not None:  # only a speed-up: without it the tests still run, slower
        monkeypatch.setattr(llm_engine, "load_tokenizer", _cached_load_tokenizer(load))


@functools.cache
def _cached_load_tokenizer(load):
    return functools.lru_cache(maxsize=8)(lambda folder: load(folder))
