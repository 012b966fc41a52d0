"""Shared helpers for engine tests: run requests to completion and compare with transformers."""
from __future__ import annotations

import torch

from engine import LLM, SamplingParams


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, **kw)


def run_all(llm: LLM, prompts, params) -> dict[str, list[int]]:
    """Add every prompt, step until idle, return output ids by prompt index."""
    eng = llm.engine
    params = params if isinstance(params, list) else [params] * len(prompts)
    ids = [eng.add_request(p, sp) for p, sp in zip(prompts, params)]
    while eng.has_unfinished_requests():
        eng.step()
    return [list(eng.requests[r].output_token_ids) for r in ids]


def hf_greedy(model_dir, prompt_ids: list[list[int]], max_new_tokens: int,
              device: str = "cpu") -> list[list[int]]:
    """transformers' own greedy generate, one prompt at a time (no padding), fp32."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).to(device).eval()
    outs = []
    with torch.inference_mode():
        for ids in prompt_ids:
            x = torch.tensor([ids], device=device)
            y = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                               max_new_tokens=max_new_tokens, pad_token_id=0)
            outs.append(y[0, len(ids):].tolist())
    return outs
