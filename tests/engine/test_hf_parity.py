"""Greedy parity with Hugging Face transformers, token for token (fp32, CPU)."""
import pytest

from engine import LLM

from .helpers import greedy, hf_greedy, run_all

PROMPTS = [
    "The capital of France is",
    "Hi",
    "Write a haiku about the sea.",
    "List three prime numbers and explain why each of them is prime, step by step, in plain words.",
    "In 1969, Apollo 11 landed on the Moon. The commander of the mission was",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "The quick brown fox jumps over the lazy dog. " * 12 + "What did the fox do?",
    "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is",
    # Shares 7 full blocks with the fox prompt above: the batched run hits the prefix cache.
    "The quick brown fox jumps over the lazy dog. " * 12 + "Where did the dog sleep?",
]
MAX_NEW = 10


def _check(model_dir, prompts, **batched_config):
    alone_llm = LLM(model=str(model_dir), check_invariants=True)
    tok = alone_llm.engine.tokenizer
    prompt_ids = [tok(p)["input_ids"] if isinstance(p, str) else p for p in prompts]
    expected = hf_greedy(model_dir, prompt_ids, MAX_NEW)
    alone = [run_all(alone_llm, [p], greedy(MAX_NEW))[0] for p in prompt_ids]
    assert alone == expected
    batched_llm = LLM(model=str(model_dir), check_invariants=True, **batched_config)
    batched = run_all(batched_llm, prompt_ids, greedy(MAX_NEW))
    assert batched == expected
    rec = batched_llm.engine.metrics
    return rec


@pytest.mark.slow
def test_default_model_matches_transformers_alone_and_batched(default_model_path):
    metrics = _check(default_model_path, PROMPTS, max_num_batched_tokens=64, block_size=16,
                     enable_prefix_caching=True, enable_chunked_prefill=True)
    # The batched run really chunked and really hit the prefix cache.
    assert metrics["prefix_cache_hits"] > 0


def _random_prompts(vocab: int, seed: int = 0) -> list[list[int]]:
    import random
    rng = random.Random(seed)
    shared = [rng.randrange(vocab) for _ in range(40)]
    # The two shared-prefix prompts are far apart so the first one's blocks are computed
    # (and registered) before the second is admitted.
    prompts = [shared + [rng.randrange(vocab) for _ in range(5)]]
    prompts += [[rng.randrange(vocab) for _ in range(n)] for n in (1, 3, 17, 33, 70, 130)]
    return [*prompts, shared + [rng.randrange(vocab) for _ in range(9)]]


def test_tiny_qwen3_matches_transformers(tiny_qwen3_path):
    m = _check(tiny_qwen3_path, _random_prompts(151_000), max_num_batched_tokens=48, block_size=16)
    assert m["prefix_cache_hits"] > 0


def test_tiny_qwen2_matches_transformers(tiny_qwen2_path):
    m = _check(tiny_qwen2_path, _random_prompts(151_000, seed=1), max_num_batched_tokens=40, block_size=8)
    assert m["prefix_cache_hits"] > 0
