"""`python -m benchmarks bench` end to end at a tiny scale: every side runs the same prompts and
the table says how they compare. Figures are printed, never asserted (a shared machine)."""
from __future__ import annotations

import pytest

from benchmarks.bandwidth import read_bandwidth_gb_s, read_buffer, stream_steps_against_reads
from benchmarks.offline import bench
from engine import LLM
from engine.cpu_kernels import native
from tests.oracle.vllm_available import require_vllm

pytestmark = pytest.mark.slow
# vLLM's CPU build starts in 30-140 s on a shared 2-core machine (plus its runs): the whole
# bench runs on demand with the soak suite (`pytest -m soak`), the bandwidth probe in CI.


def test_read_bandwidth_is_a_plausible_dram_figure():
    gb_s = read_bandwidth_gb_s(passes=3)
    assert 0.5 < gb_s < 2000, gb_s  # a DRAM read, not a cache hit or a stalled process


def test_each_decode_step_of_the_stream_is_paired_with_a_read_of_the_weights_bytes(tiny_llama_path):
    llm = LLM(model=str(tiny_llama_path), kv_cache_memory_bytes=2**24)
    weight_bytes = sum(p.numel() * p.element_size() for p in llm.engine.runner.model.parameters())
    res = stream_steps_against_reads(llm, list(range(5, 21)), 7, read_buffer(weight_bytes))
    assert res["pairs"] == 6  # 7 tokens: the prefill's, then six one-row decode steps
    assert not llm.engine.has_unfinished_requests()
    assert res["step_ms"] > 0 and res["read_ms"] > 0 and 0 < res["share"] < 10  # a tiny model's read is a cache hit


def test_bench_linears_times_both_paths_of_every_layer_linear(tiny_llama_path, tmp_path, capsys):
    """`python -m benchmarks bench-linears`: each row count through the panels and through oneDNN,
    over every layer's linears (the LM head left out), where oneDNN first wins, and whole decode
    steps both ways (the engine's own limit put back afterwards)."""
    import json

    from benchmarks.__main__ import main
    from benchmarks.linears import bench_linears, layer_linears

    if native() is None:
        pytest.skip("kvscope's native CPU kernels are off here")
    llm = LLM(model=str(tiny_llama_path))
    linears = layer_linears(llm)
    assert len(linears) == 4 * llm.engine.spec.num_layers and llm.engine.runner.model.packed_lm_head not in linears
    res = bench_linears(model=str(tiny_llama_path), rows=(1, 80), reps=1, step_rows=(2, 80), out=lambda line: None)
    assert [r["rows"] for r in res["rows"]] == [1, 80] and all(r["panels_ms"] > 0 < r["onednn_ms"] for r in res["rows"])
    wins = [r["rows"] for r in res["rows"] if r["onednn_ms"] < r["panels_ms"]]
    assert res["onednn_faster_from"] == (wins[0] if wins else None) and res["cpu_gemm_dtype"] == "float32"
    assert [r["rows"] for r in res["steps"]] == [2, 80] and all(r["native_ms"] > 0 < r["layer_by_layer_ms"]
                                                                for r in res["steps"])
    runner = llm.engine.runner  # the engine's own limits, measured or kept, reported beside the tables
    assert (res["native_linear_rows"], res["native_decode_rows"]) == (runner.crossover.linear_max_rows,
                                                                       runner.crossover.decode_max_rows or None)
    out_file = tmp_path / "linears.json"
    assert main(["bench-linears", "--model", str(tiny_llama_path), "--reps", "1", "--json", str(out_file)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("CPU ") and "the engine here: native panels up to" in printed
    assert "whole decode steps" in printed
    assert [r["rows"] for r in json.loads(out_file.read_text())["rows"]] == [1, 4, 16, 32, 64, 128, 256, 1024]


@pytest.mark.soak
def test_bench_against_hf_and_vllm_prints_ratios_and_the_bandwidth_floor(default_model_path):
    require_vllm()
    lines: list[str] = []
    res = bench(reps=1, scale=0.05, dtype="float32", model=str(default_model_path), observation=False,
                vllm=True, vllm_eager=True, out=lines.append)
    text = "\n".join(lines)
    print(text)
    assert lines[0].startswith("CPU ")  # the CPU is named with every figure
    assert "vLLM 0.32" in text and "bandwidth" in text
    for name in ("offline", "stream", "shared"):
        row = res[name]
        assert row["vllm_ratio"] > 0 and row["ratio"] > 0
        n = row["requests"]
        # fp32 greedy: kvscope's tokens equal HF's and vLLM's for every request
        assert row["same_tokens"] == row["same_tokens_vllm"] == f"{n}/{n}", row
    assert 0 < res["stream"]["share_of_floor"] < 2
    assert res["stream_floor_ms"] > 0
