"""bf16 on a CPU (engine/dtypes.py): bf16 weights and KV cache, linears that take and give bf16
values, fp32 sums. Checked on the default model: half the KV bytes per block, the same bits for a
prefix hit as for a fresh prompt, chunked or whole prompts and the torch fallback parting only
at near-ties (the same roundings, sums in another order), and logits close to fp32's."""
import pytest
import torch

from engine import LLM, SamplingParams
from engine.cpu_kernels import DISABLE_ENV_VAR, cache_clear
from engine.runner.crossover import LINEAR_ROWS

# The largest limit a machine can measure: past it, every machine's linears run on oneDNN.
PANELS_LIMIT = max(LINEAR_ROWS)

PROMPTS = ["The capital of France is", "def fibonacci(n):\n    ",
           "Once upon a time, in a land far away, there lived a dragon who", "1, 2, 3, 4,"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module")
def bf16_llm(default_model_path):
    return LLM(model=str(default_model_path), dtype="bfloat16", max_num_batched_tokens=24)


def test_bf16_stores_weights_and_kv_in_bf16_and_computes_in_fp32(bf16_llm, default_model_path):
    runner = bf16_llm.engine.runner
    fp32 = LLM(model=str(default_model_path), dtype="float32").engine.runner
    info = bf16_llm.engine.model_info
    assert (info["dtype"], info["compute_dtype"]) == ("bfloat16", "float32")
    assert runner.model.norm.weight.dtype == torch.float32  # the arithmetic's dtype
    assert runner.kv_caches[0][0].dtype == torch.bfloat16
    assert runner.bytes_per_block * 2 == fp32.bytes_per_block
    w = runner.model.embed_tokens.weight
    assert w.dtype == torch.float32 and torch.equal(w, w.to(torch.bfloat16).float())  # bf16 values
    assert torch.equal(w, fp32.model.embed_tokens.weight.to(torch.bfloat16).float())


def last_logits(llm: LLM, prompt) -> torch.Tensor:
    """The logits a greedy one-token generate of `prompt` samples from (its last forward's last row)."""
    runner, seen = llm.engine.runner, []
    forward = runner.forward
    runner.forward = lambda *a, **k: seen.append(forward(*a, **k)) or seen[-1]
    try:
        llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=1))
    finally:
        runner.forward = forward
    return seen[-1].logits[-1].clone()


# The widest top-1/top-2 logit gap at which two bf16 paths' tokens may part (cpu_linear.py: the
# paths round at the same places but order their fp32 sums differently). Measured where they
# parted (12 prompts x 32 greedy tokens, chunks of 24 against whole prompts and against the torch
# fallback; 2-core AMD EPYC with AVX512_BF16, 2026-12-03): 4 partings, gaps 0.037-0.066. A clear
# next token is several logits ahead (the prompts here: 0.7-3.5).
NEAR_TIE = 0.25


def assert_parts_only_at_near_ties(reference: LLM, prompts: list[str], want: list[list[int]],
                                   got: list[list[int]]) -> None:
    """`got` equals `want` (greedy tokens of `reference`) for most prompts, and where one parts,
    the reference's own top two logits at that token are within NEAR_TIE."""
    assert sum(g == w for g, w in zip(got, want)) >= len(prompts) // 2
    for prompt, g, w in zip(prompts, got, want):
        if g == w:
            continue
        i = next(i for i, (a, b) in enumerate(zip(g, w)) if a != b)
        top = last_logits(reference, reference.tokenizer.encode(prompt) + w[:i]).topk(2).values
        gap = (top[0] - top[1]).item()
        print(f"{prompt[:40]!r}: parts at token {i}, the reference's top-1/top-2 gap {gap:.3f}")
        assert gap < NEAR_TIE, f"{prompt!r} parts at token {i} where the top two logits are {gap:.3f} apart"


def test_bf16_chunked_and_whole_prompts_part_only_at_near_ties(bf16_llm, default_model_path):
    """Chunks of 24 against whole prompts, one of them longer than PANELS_LIMIT (oneDNN's
    linears): the same roundings, sums in another order."""
    whole = LLM(model=str(default_model_path), dtype="bfloat16")  # budget 2048: one chunk
    prompts = [*PROMPTS, LONG_PROMPT]
    assert len(whole.tokenizer.encode(LONG_PROMPT)) > PANELS_LIMIT
    want = [o.token_ids for o in bf16_llm.generate(prompts, GREEDY)]
    assert_parts_only_at_near_ties(bf16_llm, prompts, want, [o.token_ids for o in whole.generate(prompts, GREEDY)])


def test_bf16_without_the_native_kernels_parts_only_at_near_ties(bf16_llm, default_model_path, monkeypatch):
    """The torch path (oneDNN's linears, the torch backend's SDPA over the bf16 cache widened)
    rounds at the same places as the panels; budget 24 chunks the prompts."""
    want = [o.token_ids for o in bf16_llm.generate(PROMPTS, GREEDY)]
    monkeypatch.setenv(DISABLE_ENV_VAR, "0")
    cache_clear()
    try:
        llm = LLM(model=str(default_model_path), dtype="bfloat16", max_num_batched_tokens=24)
        assert llm.engine.model_info["attention_backend"] == "torch"
        got = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    finally:
        monkeypatch.delenv(DISABLE_ENV_VAR)
        cache_clear()
    assert_parts_only_at_near_ties(bf16_llm, PROMPTS, want, got)


def test_bf16_prefix_hit_attends_to_what_a_fresh_prompt_does(bf16_llm):
    """A fresh prompt attends to its own K/V rounded as the cache holds them, so a second run
    that reads the first one's blocks from the cache gives the same tokens."""
    eng, runs = bf16_llm.engine, []
    for _ in range(2):
        rid = eng.add_request("Tell me about the moons of Jupiter and Saturn. " * 4, GREEDY)
        records = []
        while eng.has_unfinished_requests():
            records.append(eng.step())
        runs.append((records[0].scheduled[0]["num_cached_tokens"], list(eng.requests[rid].output_token_ids)))
    (cached_first, tokens_first), (cached_hit, tokens_hit) = runs
    assert cached_first == 0 and cached_hit >= 32 and tokens_hit == tokens_first


LONG_PROMPT = "The capital of France is Paris. The capital of Italy is Rome. " * 10 + "The capital of Spain is"


@pytest.mark.parametrize("prompt", ["The capital of France is", LONG_PROMPT], ids=["short", "long"])
def test_bf16_logits_stay_close_to_fp32(default_model_path, prompt):
    """Rounding the weights and the KV cache to bf16 moves the logits a little, not the argmax
    of a clear next token: in a short prefill and in one longer than PANELS_LIMIT (where the
    linears run on oneDNN, in bf16 where the CPU multiplies bf16: model_info's cpu_gemm_dtype)."""
    fp32 = LLM(model=str(default_model_path), dtype="float32")
    bf16 = LLM(model=str(default_model_path), dtype="bfloat16")  # one chunk: every row through one GEMM
    assert (len(bf16.tokenizer.encode(prompt)) > PANELS_LIMIT) == (prompt is LONG_PROMPT)
    logits = {name: last_logits(llm, prompt) for name, llm in (("fp32", fp32), ("bf16", bf16))}
    assert logits["fp32"].argmax() == logits["bf16"].argmax()
    diff = (logits["fp32"] - logits["bf16"]).abs().max().item()
    assert 0 < diff < 0.05 * logits["fp32"].abs().max().item()
