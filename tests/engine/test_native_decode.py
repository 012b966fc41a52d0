"""Decode steps as one native call (engine/runner/native_decode.py) against the layer-by-layer forward
it replaces: the same logits bit for bit on every architecture, the path named in each
StepRecord, and the reasons it is off where it cannot run."""
import pytest
import torch

from engine import LLM, SamplingParams
from engine.cpu_kernels import DISABLE_ENV_VAR, cache_clear, native
from engine.runner.crossover import ENV_VAR as ROWS_ENV_VAR

from .test_cpu_bf16 import assert_parts_only_at_near_ties

pytestmark = pytest.mark.skipif(native() is None, reason="native CPU kernels need gcc and an AVX2 CPU")

PROMPTS = ["The capital of France is", "def fibonacci(n):\n    ",
           "Once upon a time, in a land far away, there lived a dragon who", "1, 2, 3, 4,"]


def _run_recording_logits(llm: LLM, prompts: list[str], params: SamplingParams) -> tuple[list, list, list]:
    """Generate, keeping each forward's path and its logits; returns (paths, logits, tokens)."""
    runner = llm.engine.runner
    forward, seen = runner.forward, []

    def recording(*args, **kwargs):
        out = forward(*args, **kwargs)
        seen.append((out.forward_path, out.logits.clone()))
        return out

    runner.forward = recording
    try:
        tokens = [o.token_ids for o in llm.generate(prompts, params)]
    finally:
        runner.forward = forward
    return [p for p, _ in seen], [x for _, x in seen], tokens


@pytest.fixture(scope="module")
def tiny_mixed_path(tiny_checkpoint):
    """A random Qwen3 of 4 layers, the middle two with an 8-token sliding window: a second KV cache
    group, whose blocks leave the window while the prompts decode."""
    return tiny_checkpoint("qwen3", num_layers=4, sliding_window=8,
                           layer_types=("full_attention", "sliding_attention", "sliding_attention", "full_attention"))


@pytest.mark.parametrize("model,dtype", [("default", "float32"), ("qwen3", "float32"), ("qwen2", "float32"),
                                         ("llama", "float32"), ("mixed", "float32"), ("default", "bfloat16"),
                                         ("qwen2", "bfloat16"), ("mixed", "bfloat16")])
def test_native_decode_gives_the_layer_by_layer_logits_bit_for_bit(model, dtype, request, monkeypatch):
    """Every architecture (Qwen3's per-head q/k norms, Qwen2's q/k/v biases, sliding-window layers
    with their own KV cache group, slots and tables), prompts of several
    blocks batched together with a small token budget (chunked prefills, mixed steps, then pure
    decode steps): the native path's logits equal the eager path's exactly, step by step. On the
    default model, the torch backend (SDPA prefills, gathered, padded SDPA decodes) gives the same
    tokens too in fp32, and in bf16 parts only at near-ties (test_cpu_bf16.py). In bf16 (bf16
    weights and KV cache, fp32 arithmetic) as in fp32. Both paths multiply on the panels (the
    limits set to 64: a machine whose measured crossover hands 4-row linears to oneDNN would
    compare the panels' sums with oneDNN's, in another order)."""
    monkeypatch.setenv(ROWS_ENV_VAR, "64")
    path = request.getfixturevalue("default_model_path" if model == "default" else f"tiny_{model}_path")
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    runs, llms = {}, {}
    for name, fields in [("native", {}), ("eager", {"enforce_eager": True}),
                         *([("torch", {"attention_backend": "torch"})] if model == "default" else [])]:
        llms[name] = LLM(model=str(path), max_num_batched_tokens=24, block_size=16, dtype=dtype, **fields)
        runs[name] = _run_recording_logits(llms[name], PROMPTS, params)
    (paths, logits, tokens), (eager_paths, eager_logits, eager_tokens) = runs["native"], runs["eager"]
    assert set(eager_paths) == {"eager"}
    assert "native_decode" in paths and "eager" in paths  # prefills and mixed steps stay layer by layer
    assert len(logits) == len(eager_logits)
    for step, (a, b) in enumerate(zip(logits, eager_logits)):
        assert torch.equal(a, b), f"forward {step} ({paths[step]}) differs from the layer-by-layer forward"
    assert tokens == eager_tokens
    if model == "mixed":   # the sliding layers' blocks left their window while decodes ran natively
        assert llms["native"].engine.kv.hybrid.num_blocks_left_window > 0
    if "torch" in runs and dtype == "float32":
        assert runs["torch"][2] == tokens
    elif "torch" in runs:  # bf16: SDPA sums the prompts' attention in another order than the prefill kernel
        assert_parts_only_at_near_ties(llms["native"], PROMPTS, tokens, runs["torch"][2])


def test_step_record_and_model_info_name_the_native_decode(default_model_path):
    llm = LLM(model=str(default_model_path))
    info = llm.engine.model_info
    assert info["native_decode"] == llm.engine.runner.crossover.decode_max_rows > 0
    assert info["native_decode_off"] is None
    llm.engine.add_request("The capital of France is", SamplingParams(max_tokens=3, ignore_eos=True))
    records = [llm.engine.step() for _ in range(3)]
    assert [r.timings_ms["forward_path"] for r in records] == ["eager", "native_decode", "native_decode"]


def test_batches_above_the_native_rows_run_layer_by_layer(tiny_llama_path, monkeypatch):
    """More decodes than the machine's limit (here set, as KVSCOPE_NATIVE_MAX_ROWS sets it):
    oneDNN's GEMM is the faster step there, so the step runs eager; once requests finish and
    the batch fits, it runs natively again."""
    limit = 8
    monkeypatch.setenv(ROWS_ENV_VAR, str(limit))
    n = limit + 3
    llm = LLM(model=str(tiny_llama_path), max_num_seqs=n + 1)
    eng = llm.engine
    for i in range(n):
        # The first three finish after one decode, leaving exactly `limit` running.
        eng.add_request(f"request {i}", SamplingParams(max_tokens=2 if i < 3 else 4, ignore_eos=True))
    paths = []
    while eng.has_unfinished_requests():
        rec = eng.step()
        decodes = [s for s in rec.scheduled if not s["is_prefill"]]
        paths.append((len(decodes), rec.timings_ms["forward_path"]))
    assert (n, "eager") in paths and (limit, "native_decode") in paths
    assert all(path == "eager" for count, path in paths if count > limit)


@pytest.mark.parametrize("fields,reason", [
    ({"enforce_eager": True}, "enforce_eager=True"),
    ({"attention_backend": "torch"}, "attention backend 'torch'"),
    ({"dtype": "float16"}, "cpu in float16"),
])
def test_native_decode_off_says_why_and_steps_run_eager(tiny_llama_path, fields, reason):
    llm = LLM(model=str(tiny_llama_path), **fields)
    info = llm.engine.model_info
    assert info["native_decode"] is None and reason in info["native_decode_off"]
    llm.engine.add_request("hello", SamplingParams(max_tokens=3, ignore_eos=True))
    while llm.engine.has_unfinished_requests():
        assert llm.engine.step().timings_ms["forward_path"] == "eager"


def test_native_decode_is_off_with_the_native_kernels(tiny_llama_path, monkeypatch):
    monkeypatch.setenv(DISABLE_ENV_VAR, "0")
    cache_clear()
    try:
        info = LLM(model=str(tiny_llama_path), attention_backend="torch").engine.model_info
        assert info["native_decode"] is None and "native CPU kernels are off" in info["native_decode_off"]
    finally:
        monkeypatch.delenv(DISABLE_ENV_VAR)
        cache_clear()
