"""CUDA-graph decode: the bucket sizes, when graphs are off and why, and the padded replay.

On a CPU the graphs themselves cannot be captured, but everything around them can run:
`DecodeGraphs(capture=False)` pads each decode batch into its bucket's static buffers
exactly as a replay would, then runs the forward eagerly on them. The captured replay is
tested in tests/gpu."""
import pytest
import torch

from engine import LLM
from engine.runner.cuda_graphs import DecodeGraphs, graph_batch_sizes, why_no_graphs

from .helpers import greedy, run_all

PROMPTS = [[11, 12, 13, 14, 15], list(range(30, 50)), [7] * 17]


def test_buckets_follow_vllm_sizes():
    assert graph_batch_sizes(1) == [1]
    assert graph_batch_sizes(6) == [1, 2, 4]
    assert graph_batch_sizes(20) == [1, 2, 4, 8, 16]
    assert graph_batch_sizes(64) == [1, 2, 4, 8, 16, 32, 48, 64]
    assert graph_batch_sizes(10_000)[-1] == 512 and len(graph_batch_sizes(10_000)) == 4 + 32


def test_graphs_are_off_with_a_reason():
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert "enforce_eager" in why_no_graphs(True, gpu, "triton", 1)
    assert "GPU" in why_no_graphs(False, cpu, "triton", 1)
    assert "'torch'" in why_no_graphs(False, gpu, "torch", 1)
    assert "tensor parallel" in why_no_graphs(False, gpu, "triton", 2)
    assert why_no_graphs(False, gpu, "triton", 1) is None


def test_cpu_engine_reports_eager_steps(tiny_qwen3_path):
    llm = LLM(model=str(tiny_qwen3_path), device="cpu")
    assert llm.engine.model_info["cuda_graphs"] is None
    assert "GPU" in llm.engine.model_info["cuda_graphs_off"]
    llm.engine.add_request([1, 2, 3], greedy(2, ignore_eos=True))
    rec = llm.engine.step()
    assert rec.timings_ms["forward_path"] == "eager" and rec.timings_ms["cuda_graph_bucket"] is None


@pytest.mark.parametrize("backend", ["torch", "triton", "flash_attn"])
def test_padded_bucket_replay_gives_the_eager_tokens(tiny_qwen3_path, backend, request):
    kw = dict(model=str(tiny_qwen3_path), device="cpu", attention_backend=backend, max_model_len=64,
              max_num_seqs=6, block_size=8)
    if backend != "torch":
        pytest.importorskip("triton")
    if backend == "flash_attn":  # over flash-attn's torch transcription (tests/conftest.py)
        request.getfixturevalue("flash_attn_transcription")
        kw.update(block_size=256, dtype="bfloat16")
    eager = run_all(LLM(**kw), PROMPTS, greedy(6, ignore_eos=True))

    llm = LLM(**kw)
    r = llm.engine.runner
    r.graphs = DecodeGraphs(r.model, r.kv_caches, r.backend, max_num_seqs=6, max_model_len=64,
                            block_size=kw["block_size"], device=r.device, capture=False)
    assert r.graphs.sizes == [1, 2, 4]
    eng = llm.engine
    ids = [eng.add_request(p, greedy(6, ignore_eos=True)) for p in PROMPTS]
    buckets = []
    while eng.has_unfinished_requests():
        rec = eng.step()
        pure_decode = all(not s["is_prefill"] for s in rec.scheduled)
        buckets.append(rec.timings_ms["cuda_graph_bucket"])
        assert (rec.timings_ms["forward_path"] == "cuda_graph") == pure_decode
    assert [eng.requests[i].output_token_ids for i in ids] == eager
    assert 4 in buckets                      # three decodes ran padded to the bucket of 4
    # Padding rows wrote nothing: a pad slot of 0 instead of -1 would land in the null block.
    for k_cache, v_cache in r.kv_caches:
        assert torch.count_nonzero(k_cache[0]) == 0 and torch.count_nonzero(v_cache[0]) == 0
