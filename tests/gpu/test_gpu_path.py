"""The GPU path on a real NVIDIA GPU: Triton backend, CUDA-graph decode, KV pool sized from
GPU memory, bf16 by default, CUDA-event timings. Every test here is marked gpu (skipped on
a machine without CUDA; `pytest -m gpu` or scripts/gpu_check.sh runs them).

Parity is checked in fp32 (the Triton kernels then use exact fp32 products), where greedy
tokens must match exactly; bf16 is checked on logits, where rounding may flip near-ties."""
from __future__ import annotations

import pytest
import torch

from engine import LLM

from ..engine.helpers import greedy, hf_greedy, run_all

pytestmark = pytest.mark.gpu

PROMPTS = [[785, 6722, 315, 9625, 374], list(range(1000, 1040)), [42] * 70, list(range(5000, 5203))]


def gpu_llm(path, **kw) -> LLM:
    kw.setdefault("device", "cuda")
    kw.setdefault("gpu_memory_utilization", 0.3)
    return LLM(model=str(path), **kw)


@pytest.fixture(scope="module")
def qwen3_0_6b_shaped(tmp_path_factory):
    """Random weights in Qwen3-0.6B's shape (28 layers, 16 heads / 8 KV heads of 128, hidden
    1024, MLP 3072, tied 151,936-row vocabulary) at the usual init scale."""
    from benchmarks.gpu import random_checkpoint

    return random_checkpoint(tmp_path_factory.mktemp("qwen3-0.6b-shaped"), "qwen3-0.6b")


def test_gpu_defaults_bf16_triton_graphs_and_a_memory_sized_pool(tiny_qwen3_path):
    llm = gpu_llm(tiny_qwen3_path)
    info = llm.engine.model_info
    assert info["device"].startswith("cuda") and info["dtype"] == "bfloat16"
    assert info["attention_backend"] == "triton"
    assert info["cuda_graphs"][:4] == [1, 2, 4, 8] and info["cuda_graphs_off"] is None
    _, total = torch.cuda.mem_get_info()
    kv_bytes = llm.engine.runner.num_blocks * llm.engine.runner.bytes_per_block
    assert 0 < kv_bytes <= 0.3 * total


@pytest.mark.parametrize("arch", ["qwen3", "qwen2", "llama"])
def test_triton_backend_gives_the_torch_backend_tokens(tiny_checkpoint, arch):
    path = tiny_checkpoint(arch)
    ref = run_all(gpu_llm(path, dtype="float32", attention_backend="torch"), PROMPTS, greedy(12, ignore_eos=True))
    out = run_all(gpu_llm(path, dtype="float32", attention_backend="triton"), PROMPTS, greedy(12, ignore_eos=True))
    assert out == ref


def test_cuda_graphs_replay_buckets_and_give_the_eager_tokens(tiny_qwen3_path):
    eager = run_all(gpu_llm(tiny_qwen3_path, dtype="float32", enforce_eager=True), PROMPTS, greedy(16, ignore_eos=True))
    llm = gpu_llm(tiny_qwen3_path, dtype="float32")
    eng = llm.engine
    ids = [eng.add_request(p, greedy(16, ignore_eos=True)) for p in PROMPTS]
    paths = []
    while eng.has_unfinished_requests():
        rec = eng.step()
        paths.append((rec.timings_ms["forward_path"], rec.timings_ms["cuda_graph_bucket"], rec.timings_ms["forward"]))
    assert [eng.requests[i].output_token_ids for i in ids] == eager
    assert ("cuda_graph", 4) in {(p, b) for p, b, _ in paths}   # 4 decodes: the bucket of 4
    assert all(ms > 0 for _, _, ms in paths)            # CUDA-event timings, never zero


def test_async_scheduling_is_the_gpu_default_and_gives_the_synchronous_tokens(tiny_qwen3_path):
    """vLLM's default on a GPU: each step is scheduled while the one before runs, and its tokens
    come to the host only when it lands (Sampler.launch). The synchronous loop's tokens, through
    CUDA graphs, with every invariant after every landing."""
    sync = run_all(gpu_llm(tiny_qwen3_path, dtype="float32", async_scheduling=False), PROMPTS,
                   greedy(16, ignore_eos=True))
    llm = gpu_llm(tiny_qwen3_path, dtype="float32", check_invariants=True)
    eng = llm.engine
    assert eng.async_scheduling and eng.config.async_scheduling
    ids = [eng.add_request(p, greedy(16, ignore_eos=True)) for p in PROMPTS]
    records = []
    while eng.has_unfinished_requests():
        records.append(eng.step())
    assert [eng.requests[i].output_token_ids for i in ids] == sync
    assert records[0].scheduled_ahead is None and all(r.scheduled_ahead for r in records[1:] if r.scheduled)
    assert "cuda_graph" in {r.timings_ms["forward_path"] for r in records}


def test_chunked_prefill_prefix_hits_and_preemption_on_gpu(tiny_qwen3_path):
    shared = list(range(300, 364))
    prompts = [[*shared, 1, 2, 3], [*shared, 4, 5], list(range(2000, 2300))]
    ref = run_all(gpu_llm(tiny_qwen3_path, dtype="float32", attention_backend="torch", enable_prefix_caching=False),
                  prompts, greedy(20, ignore_eos=True))
    tight = gpu_llm(tiny_qwen3_path, dtype="float32", max_num_batched_tokens=64, num_kv_blocks=30,
                    check_invariants=True)
    assert run_all(tight, prompts, greedy(20, ignore_eos=True)) == ref
    assert tight.engine.metrics["prefix_cache_hits"] > 0


def test_attention_probe_reads_the_gpu_cache(tiny_qwen3_path):
    llm = gpu_llm(tiny_qwen3_path, dtype="float32")
    eng = llm.engine
    rid = eng.add_request(PROMPTS[1], greedy(3, ignore_eos=True))
    eng.step()
    probe = eng.attention_probe(rid, layer=1)
    probs = probe.probs
    assert probs.shape[-1] == probe.context_len
    assert torch.allclose(probs.sum(-1), torch.ones_like(probs.sum(-1)), atol=1e-4)


def test_hf_parity_on_gpu(tiny_qwen3_path):
    expected = hf_greedy(tiny_qwen3_path, PROMPTS, 12, device="cuda")
    assert run_all(gpu_llm(tiny_qwen3_path, dtype="float32"), PROMPTS, greedy(12, ignore_eos=True)) == expected


def test_default_model_parity_on_gpu(default_model_path):
    """SmolLM2-135M-Instruct, the default model, on the GPU (fp32, Triton kernels, CUDA-graph
    decode): the same greedy tokens as transformers' generate on the same GPU, alone and
    batched with chunked prefill and prefix hits. scripts/gpu_wheels.sh says how its wheel
    reaches a GPU machine without internet."""
    path = default_model_path
    llm = gpu_llm(path, dtype="float32", max_num_batched_tokens=64)
    tok = llm.engine.tokenizer
    fox = "The quick brown fox jumps over the lazy dog. " * 12
    prompts = [tok(p)["input_ids"] for p in ("The capital of France is", "Write a haiku about the sea.",
                                             fox + "What did the fox do?", fox + "Where did the dog sleep?")]
    expected = hf_greedy(path, prompts, 10, device="cuda")
    assert [run_all(llm, [p], greedy(10))[0] for p in prompts] == expected
    assert run_all(llm, prompts, greedy(10)) == expected
    assert llm.engine.metrics["prefix_cache_hits"] > 0


def test_flash_attn_backend_on_gpu(tiny_qwen3_path):
    """Where flash-attn is installed: 'auto' picks it for 256-token pages in bf16, its steps
    give the triton backend's logits, and its decode steps replay CUDA graphs."""
    pytest.importorskip("flash_attn", reason="flash-attn is not installed here (it builds against CUDA)")
    fa, tr = gpu_llm(tiny_qwen3_path, block_size=256), gpu_llm(tiny_qwen3_path, attention_backend="triton",
                                                              block_size=256)
    assert fa.engine.model_info["attention_backend"] == "flash_attn"
    assert fa.engine.model_info["cuda_graphs_off"] is None
    prompts = [list(range(1000, 1300)), [42] * 70, [7, 8, 9]]
    paths = set()
    for llm in (fa, tr):
        for p in prompts:
            llm.engine.add_request(p, greedy(4, ignore_eos=True))
    for _ in range(4):  # prefill, then decodes, in lockstep while the sampled tokens agree
        a, b = fa.engine.step(), tr.engine.step()
        paths.add(a.timings_ms["forward_path"])
        for (ta, tb) in zip(a.sampled.values(), b.sampled.values()):
            la, lb = dict(ta["top"]), dict(tb["top"])
            shared = set(la) & set(lb)
            assert shared and all(abs(la[t] - lb[t]) <= 0.1 * max(la[t], lb[t]) for t in shared)  # probabilities
        if [s["token_id"] for s in a.sampled.values()] != [s["token_id"] for s in b.sampled.values()]:
            break  # a bf16 near-tie went the other way: later steps see different tokens
    assert "cuda_graph" in paths


@pytest.mark.slow
def test_qwen3_0_6b_shaped_parity_and_bf16_logits(qwen3_0_6b_shaped):
    prompts = PROMPTS[:3]
    ref = run_all(gpu_llm(qwen3_0_6b_shaped, dtype="float32", attention_backend="torch"), prompts,
                  greedy(16, ignore_eos=True))
    assert run_all(gpu_llm(qwen3_0_6b_shaped, dtype="float32"), prompts, greedy(16, ignore_eos=True)) == ref
    assert hf_greedy(qwen3_0_6b_shaped, prompts, 16, device="cuda") == ref
    # bf16 (the GPU default) with graphs: first-token logits close to fp32's.
    bf16 = gpu_llm(qwen3_0_6b_shaped)
    # gpu_memory_utilization counts everything on the GPU (vLLM's meaning): bf16's 0.3 is taken.
    fp32 = gpu_llm(qwen3_0_6b_shaped, dtype="float32", gpu_memory_utilization=0.65)
    for llm in (bf16, fp32):
        llm.engine.add_request(prompts[1], greedy(1, ignore_eos=True))
    a, b = bf16.engine.step(), fp32.engine.step()
    (ta,), (tb,) = a.sampled.values(), b.sampled.values()
    assert ta["top"][0][0] in [t for t, _ in tb["top"][:5]]
