"""InputProcessor (vLLM v1's name): turns `add_request`'s arguments into a checked Request.

Every refusal is a ValueError naming the field and the limit, raised before anything is
queued, so a bad request leaves the engine exactly as it was."""
from __future__ import annotations

import itertools
from typing import Any

import torch

from .config import EngineConfig
from .model import ModelSpec
from .request import Request, check_fits, checked_request_args, token_id_list
from .sampling_params import SamplingParams


class InputProcessor:
    """Tokenizes prompts, checks them against the config and the pool, and names requests."""

    def __init__(self, tokenizer: Any, spec: ModelSpec) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = spec.vocab_size
        eos = spec.eos_token_ids or ((tokenizer.eos_token_id,) if tokenizer.eos_token_id is not None else ())
        self.eos_token_id = eos[0] if eos else None
        self.extra_stop_ids = list(eos[1:])  # e.g. an Instruct model's end-of-turn token
        self._ids = itertools.count()

    def process(self, prompt: str | list[int], params: SamplingParams | None, request_id: str | None,
                existing: dict[str, Request], config: EngineConfig, num_blocks: int) -> Request:
        params = checked_request_args(params, request_id, existing)
        token_ids, text = self.tokenize(prompt)
        check_fits(token_ids, params, config, num_blocks)
        if request_id is None:  # only a valid request takes the next id
            request_id = next(i for i in (str(n) for n in self._ids) if i not in existing)
        req = Request(request_id, token_ids, params, self.eos_token_id, prompt_text=text)
        if self.extra_stop_ids:
            req.params = SamplingParams(**{**params.to_dict(),
                                           "stop_token_ids": params.stop_token_ids + self.extra_stop_ids})
        if params.seed is not None:
            req.generator = torch.Generator().manual_seed(params.seed)
        return req

    def tokenize(self, prompt: str | list[int]) -> tuple[list[int], str | None]:
        """(token ids, the prompt's text or None for a token-id prompt)."""
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt must not be empty")
            return list(self.tokenizer(prompt)["input_ids"]), prompt
        token_ids = token_id_list(prompt)
        for i, t in enumerate(token_ids):
            if not 0 <= t < self.vocab_size:
                raise ValueError(f"token id {t} at index {i} is outside the vocabulary [0, {self.vocab_size})")
        return token_ids, None
