"""Per-request sampling settings (vLLM names), validated on construction."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SamplingParams:
    """How to pick the next token. temperature 0 is greedy; top_k 0 and top_p 1.0 are off.

    `seed` gives the request its own random generator, so the same seed yields the same
    tokens whatever else shares the batch.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_tokens: int = 16
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None
    logprobs_top: int = 10  # how many candidates the StepRecord shows

    def __post_init__(self) -> None:
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) or self.temperature < 0:
            raise ValueError(f"temperature must be a number >= 0, got {self.temperature!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be a bool, got {self.ignore_eos!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            raise ValueError(f"seed must be an integer >= 0 or None, got {self.seed!r}")
        try:
            self.stop_token_ids = [int(t) for t in self.stop_token_ids]
        except (TypeError, ValueError):
            raise ValueError(f"stop_token_ids must be a list of integers, got {self.stop_token_ids!r}") from None
        if isinstance(self.logprobs_top, bool) or not isinstance(self.logprobs_top, int) or self.logprobs_top < 0:
            raise ValueError(f"logprobs_top must be an integer >= 0, got {self.logprobs_top!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def to_dict(self) -> dict[str, Any]:
        # Every field is a scalar but one list: a shallow copy with its own list is what
        # dataclasses.asdict returns, without its deep copy field by field (several times slower,
        # and a live recorder builds one per arriving request).
        d = dict(self.__dict__)
        d["stop_token_ids"] = list(self.stop_token_ids)
        return d
