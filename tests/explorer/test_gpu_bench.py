"""benchmarks.gpu runs end to end on a CPU with a tiny model (`--device cpu --shape tiny`):
not a measurement, but every line of the GPU benchmark runs, so it cannot first fail on a
GPU machine's scarce time."""
from __future__ import annotations

import json

from benchmarks.gpu import main, workload
from engine.cpu_kernels import native


def test_gpu_bench_runs_on_cpu_with_a_tiny_model(tmp_path, capsys):
    out = tmp_path / "bench.json"
    args = ["--device", "cpu", "--shape", "tiny", "--requests", "4", "--min-len", "5", "--max-len", "20",
            "--hf-requests", "2", "--json", str(out)]
    results = main(args)
    assert json.loads(out.read_text()) == results
    _, max_tokens = workload(4, 5, 20)
    for label in ("eager", "cuda_graphs"):
        r = results[label]
        assert r["output_tokens"] == sum(max_tokens)  # ignore_eos: every request ran to max_tokens
        assert r["tok_s"] > 0 and r["subset_tok_s"] > 0 and r["decode_bandwidth"] > 0
    # A CPU has no CUDA graphs: without enforce_eager its decode steps run as one native call.
    assert set(results["eager"]["decode_steps"]) == {"eager"}
    assert "cuda_graph" not in results["cuda_graphs"]["decode_steps"]
    assert ("native_decode" in results["cuda_graphs"]["decode_steps"]) == (native() is not None)
    assert results["hf"]["tok_s"] > 0
    printed = capsys.readouterr().out
    assert "engine       eager:" in printed and "transformers generate on 2 requests" in printed
    assert "CUDA graphs / eager:" in printed
