"""Where the native panels give way to oneDNN (engine/runner/crossover.py): measured by the first
engine of a model and dtype on this machine, kept for the next, set by KVSCOPE_NATIVE_MAX_ROWS,
and obeyed: the engine takes the panels only up to the limits it holds. The timings themselves
are the machine's; these tests check what is done with them, never how fast anything was."""
import json

import pytest
import torch

from engine import LLM, SamplingParams
from engine.cpu_kernels import native
from engine.runner import crossover
from engine.runner.crossover import ENV_VAR, LINEAR_ROWS, STEP_ROWS, limit_from, packed_linears, setting

pytestmark = pytest.mark.skipif(native() is None, reason="no native CPU kernels here: nothing runs on the panels")
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
PROMPTS = ["The capital of France is", "1, 2, 3,", "Once upon a time"]


@pytest.fixture
def kept(tmp_path, monkeypatch):
    """A cache file of this test's own (the machine's stays untouched), no setting."""
    path = tmp_path / "crossover.json"
    monkeypatch.setattr(crossover, "cache_path", lambda: path)
    monkeypatch.delenv(ENV_VAR, raising=False)
    return path


def test_the_limit_is_the_last_row_count_before_the_panels_clearly_lose():
    # (rows, panels ms, oneDNN ms): 16 is within 5% (noise: the panels keep it), 32 a clear
    # loss, and a later win does not count.
    assert limit_from(((1, 5, 9), (4, 6, 9), (16, 10.2, 9.8), (32, 20, 15), (64, 30, 40))) == 16
    assert limit_from(((1, 5, 9), (4, 6, 9))) == 4    # never lost: the largest measured
    assert limit_from(((1, 10, 5), (4, 6, 9))) == 0   # lost at once: no panels
    assert limit_from(()) == 0


@pytest.mark.parametrize("raw,want", [("8", (8, 8)), (" 4, 16 ", (4, 16)), ("0", (0, 0)), ("", None)])
def test_the_setting_gives_both_limits_or_each(raw, want, monkeypatch):
    monkeypatch.setenv(ENV_VAR, raw)
    assert setting() == want


@pytest.mark.parametrize("raw", ["many", "-1", "1,2,3", "1.5"])
def test_a_bad_setting_names_the_variable_and_its_form_and_the_next_engine_starts(raw, tiny_llama_path,
                                                                                 monkeypatch, kept):
    monkeypatch.setenv(ENV_VAR, raw)
    with pytest.raises(ValueError, match=f"{ENV_VAR} must be a row count N .* or LINEAR,DECODE .*got '{raw}'"):
        LLM(model=str(tiny_llama_path))
    monkeypatch.setenv(ENV_VAR, "3,5")
    runner = LLM(model=str(tiny_llama_path)).engine.runner
    assert (runner.crossover.linear_max_rows, runner.native_decode.max_rows) == (3, 5)
    assert not kept.exists()  # a setting measures nothing


def test_an_engine_measures_once_and_the_next_takes_what_was_kept(tiny_llama_path, kept):
    first = LLM(model=str(tiny_llama_path))
    runner, found = first.engine.runner, first.engine.runner.crossover
    assert found.source == "measured" and found.seconds > 0
    # Ascending from the first candidate, both paths timed at each row count measured.
    assert [r for r, _, _ in found.linears] == list(LINEAR_ROWS[:len(found.linears)])
    assert [r for r, _, _ in found.steps] == list(STEP_ROWS[:len(found.steps)])
    assert all(a > 0 < b for _, a, b in (*found.linears, *found.steps))
    assert (found.linear_max_rows, found.decode_max_rows) == (limit_from(found.linears), limit_from(found.steps))
    # Obeyed: every packed linear (the LM head too) and the native decode hold the limits.
    assert {lin.native_max_rows for lin in packed_linears(runner)} == {found.linear_max_rows}
    info = first.engine.model_info
    assert info["native_linear_rows"] == found.linear_max_rows
    assert info["native_decode"] == (found.decode_max_rows or None)
    assert "measured on this CPU at load" in info["native_rows_source"]
    # The whole steps ran through a throwaway pool: the engine's own is as allocated.
    assert not any(k.any() or v.any() for k, v in runner.kv_caches)
    # Kept under a key naming this CPU, the kernels, the dtype and the model's shapes.
    entries = json.loads(kept.read_text())["entries"]
    assert list(entries) == [found.key] and crossover.cpu_key() in found.key and "float32" in found.key
    assert f"kernels {native().variant}" in found.key

    again = LLM(model=str(tiny_llama_path)).engine
    assert again.runner.crossover.source == "cached" and again.runner.crossover.linears == found.linears
    assert (again.runner.crossover.linear_max_rows, again.runner.crossover.decode_max_rows) == (
        found.linear_max_rows, found.decode_max_rows)
    assert f"kept in {kept}" in again.model_info["native_rows_source"]
    assert crossover.kept_for_this_cpu(kept)[0].key == found.key
    # Another dtype is another measurement, kept beside the first.
    assert LLM(model=str(tiny_llama_path), dtype="bfloat16").engine.runner.crossover.source == "measured"
    assert len(json.loads(kept.read_text())["entries"]) == 2


def test_a_measurement_on_busy_cpus_is_used_but_not_kept(tiny_llama_path, kept):
    """Other processes keep every CPU busy while the first engine measures: it runs on what it
    measured, says so, and keeps nothing; the next engine, on idle CPUs, measures and keeps."""
    import os
    import subprocess
    import sys

    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    try:
        busy = LLM(model=str(tiny_llama_path)).engine
    finally:
        for b in burners:
            b.kill()
            b.wait()
    assert busy.runner.crossover.source == "busy" and not kept.exists()
    assert "while it was busy: not kept" in busy.model_info["native_rows_source"]
    calm = LLM(model=str(tiny_llama_path)).engine
    assert calm.runner.crossover.source == "measured" and kept.exists()


def test_where_the_panels_measured_slower_the_engine_runs_onednn(tiny_llama_path, kept):
    """A machine whose measurement says the panels lose from 2 rows and the native decode at
    every size (as oneDNN's AMX tiles make an Intel Xeon's bf16): the engine takes the panels for
    single rows only, runs every step layer by layer and says why, with the same fp32 tokens."""
    measured = LLM(model=str(tiny_llama_path))
    want = [o.token_ids for o in measured.generate(PROMPTS, GREEDY)]
    data = json.loads(kept.read_text())
    entry = data["entries"][measured.engine.runner.crossover.key]
    entry["linear_max_rows"], entry["decode_max_rows"] = 1, 0
    kept.write_text(json.dumps(data))

    llm = LLM(model=str(tiny_llama_path))
    info, runner = llm.engine.model_info, llm.engine.runner
    assert info["native_decode"] is None and runner.native_decode is None
    assert "slower than layer by layer at every batch size on this CPU (cached)" in info["native_decode_off"]
    assert info["native_linear_rows"] == 1
    assert {lin.native_max_rows for lin in packed_linears(runner)} == {1}
    eng, paths = llm.engine, set()
    ids = [eng.add_request(p, GREEDY) for p in PROMPTS]
    while eng.has_unfinished_requests():
        paths.add(eng.step().timings_ms["forward_path"])
    assert paths == {"eager"}
    assert [list(eng.requests[i].output_token_ids) for i in ids] == want


def test_no_native_kernels_no_crossover(tiny_llama_path, kept):
    """The torch attention backend still packs the linears (their limit is measured); only the
    decode steps are not (the native decode is the cpu backend's)."""
    llm = LLM(model=str(tiny_llama_path), attention_backend="torch")
    found = llm.engine.runner.crossover
    assert found.linears and not found.steps and found.decode_max_rows == 0
    assert "attention backend 'torch'" in llm.engine.model_info["native_decode_off"]
    # A later engine that can run the native decode measures the steps too, not the kept linears alone.
    assert LLM(model=str(tiny_llama_path)).engine.runner.crossover.steps


def test_a_layer_reads_its_limit_at_each_forward(tiny_llama_path, kept, monkeypatch):
    """The limit a PackedLinear holds is what its forward obeys (the panels' kernel called up to
    it, oneDNN past it)."""
    monkeypatch.setenv(ENV_VAR, "2,0")
    lin = packed_linears(LLM(model=str(tiny_llama_path)).engine.runner)[0]
    calls = []
    monkeypatch.setattr(lin, "panels_linear", lambda x: calls.append(x.shape[0]) or torch.zeros(x.shape[0], 1))
    monkeypatch.setattr(lin, "onednn_linear", lambda x: torch.ones(x.shape[0], 1))
    assert [lin(torch.randn(n, lin.in_features))[0, 0].item() for n in (1, 2, 3)] == [0.0, 0.0, 1.0]
    assert calls == [1, 2]
