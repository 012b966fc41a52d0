"""The flash_attn backend's glue: which flash-attn entry point each kind of step calls, with
what arguments, and that the answers are the torch reference's.

flash-attn cannot be installed on these machines (it builds CUDA kernels), so these tests
run the backend against tests/fixtures/flash_attn_reference.py, a torch transcription of
flash-attn's documented semantics and preconditions, put in sys.modules as `flash_attn`.
With the real package on a GPU, tests/gpu checks the backend against the triton one."""
from __future__ import annotations

import sys

import pytest
import torch

pytest.importorskip("triton", reason="the triton package is not installed (pip install -e '.[dev]')")

from engine.attention.backend import get_attention_backend  # noqa: E402

from .paged_cases import run_backends  # noqa: E402

BF16_TOL = {"atol": 2e-2, "rtol": 2e-2}


@pytest.fixture
def flash_attn(flash_attn_transcription):
    """The FlashAttentionBackend class, over flash-attn's transcription."""
    from engine.attention.flash_attn_backend import FlashAttentionBackend
    return FlashAttentionBackend


def _run(seqs, backend_cls, **kw):
    return run_backends(seqs, backend_cls, block_size=256, h=6, kvh=2, d=16, dtype=torch.bfloat16, **kw)


def test_mixed_step_is_one_varlen_call_over_the_paged_cache(flash_attn, flash_attn_transcription):
    # A fresh prompt, a decode, a chunk after 260 cached tokens, a decode, a prefix hit of a
    # whole 256-token page: one flash_attn_varlen_func call per layer, bottom-right causal.
    seqs = [(0, 5), (300, 1), (260, 9), (3, 1), (256, 4)]
    (ref, got), _ = _run(seqs, flash_attn)
    assert flash_attn_transcription.CALLS == ["flash_attn_varlen_func"] * 2  # two layers, same metadata
    torch.testing.assert_close(got[0].float(), ref[0].float(), **BF16_TOL)
    assert torch.equal(got[1], ref[1]) and torch.equal(got[2], ref[2])  # the same K/V written


def test_pure_decode_step_is_one_with_kvcache_call(flash_attn, flash_attn_transcription):
    seqs = [(4, 1), (300, 1), (1, 1), (511, 1)]
    (ref, got), _ = _run(seqs, flash_attn)
    assert flash_attn_transcription.CALLS == ["flash_attn_with_kvcache"] * 2
    torch.testing.assert_close(got[0].float(), ref[0].float(), **BF16_TOL)
    assert torch.equal(got[1], ref[1]) and torch.equal(got[2], ref[2])


def test_probe_reads_the_cache_and_writes_nothing(flash_attn, flash_attn_transcription):
    (ref, got), (k0, v0) = _run([(260, 6)], flash_attn, probe_layer=1, layer=1)
    assert flash_attn_transcription.CALLS == ["flash_attn_varlen_func"] * 2
    torch.testing.assert_close(got[0].float(), ref[0].float(), **BF16_TOL)
    assert torch.equal(got[1], k0) and torch.equal(got[2], v0)
    torch.testing.assert_close(got[3], ref[3])


def test_auto_prefers_flash_attn_where_the_cache_suits_it(flash_attn):
    cuda = torch.device("cuda")  # only named: building a backend touches no GPU
    assert get_attention_backend("auto", cuda, 256, torch.bfloat16).name == "flash_attn"
    assert get_attention_backend("auto", cuda, 16, torch.bfloat16).name == "triton"     # pages of 16
    assert get_attention_backend("auto", cuda, 256, torch.float32).name == "triton"     # fp32
    assert get_attention_backend("auto", torch.device("cpu"), 256, torch.bfloat16).name == "torch"
    with pytest.raises(ValueError, match="float16 or bfloat16, got dtype float32"):
        get_attention_backend("flash_attn", cuda, 256, torch.float32)


def test_without_the_package_a_clear_error_and_auto_falls_back(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # `import flash_attn` now raises ImportError
    monkeypatch.delitem(sys.modules, "engine.attention.flash_attn_backend", raising=False)
    with pytest.raises(ValueError, match="'flash_attn' is not available here: the flash-attn package is not installed"):
        get_attention_backend("flash_attn", torch.device("cuda"), 256, torch.bfloat16)
    assert get_attention_backend("auto", torch.device("cuda"), 256, torch.bfloat16).name == "triton"


def test_engine_runs_chunks_prefix_hits_and_decodes_through_flash_attn(flash_attn_transcription, default_model_path):
    # The default model (a real one: a random tiny model's near-uniform bf16 logits tie).
    from engine import LLM, SamplingParams

    runs = {}
    for backend in ("torch", "flash_attn"):
        llm = LLM(model=str(default_model_path), attention_backend=backend, device="cpu", dtype="bfloat16",
                  block_size=256, max_num_batched_tokens=128, num_kv_blocks=8, check_invariants=True)
        assert llm.engine.runner.backend.name == backend
        eng = llm.engine
        tok = eng.tokenizer
        story = tok("The quick brown fox jumps over the lazy dog. " * 26)["input_ids"][:256]  # one full page
        prompts = [story + tok(" What did the fox do?")["input_ids"], story + tok(" Who slept?")["input_ids"],
                   tok("The capital of France is")["input_ids"]]
        params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
        ids = [eng.add_request(prompts[0], params)]
        while eng.has_unfinished_requests():  # the first prompt alone (chunked): its page is cached after
            eng.step()
        ids += [eng.add_request(p, params) for p in prompts[1:]]
        while eng.has_unfinished_requests():
            eng.step()
        runs[backend] = [list(eng.requests[r].output_token_ids) for r in ids]
        assert eng.metrics["prefix_cache_hits"] > 0
    assert runs["flash_attn"] == runs["torch"]
    assert set(flash_attn_transcription.CALLS) == {"flash_attn_varlen_func", "flash_attn_with_kvcache"}
