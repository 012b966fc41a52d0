"""The Controls panel's demo presets and the add-request form's prompt helpers.

`add_preset(session, name, fields)` turns a preset's name (widgets.controls.DEFAULT_PRESETS)
into real requests on a Session; `has_chat_template` / `chat_prompt` let the form wrap a
typed prompt in the tokenizer's chat template (the default model is an Instruct model).
"""
from __future__ import annotations

from typing import Any

from . import views

SHARED_PREFIX = ("You are a concise assistant for a geography quiz. Answer with the name of the city only, "
                 "no explanation, no punctuation, and no extra words. Here is the question.")
LONG_TEXT = ("The paged KV cache stores keys and values in fixed-size blocks, so a request's memory grows "
             "one block at a time and blocks can be shared between requests with a common prefix. ")
BURST_TOPICS = ("the ocean", "mountains", "a library", "trains", "the moon", "gardens", "rivers", "old maps",
                "clocks", "bridges", "deserts", "music", "forests", "islands", "bicycles", "lighthouses")
PRESET_NAMES = ("shared_prefix", "long_prompt", "burst")


def add_preset(session: Any, name: str, fields: dict) -> None:
    """Add the requests of preset `name`; `fields` may carry max_tokens, temperature and n (burst)."""
    s = session
    common = {"max_tokens": int(fields.get("max_tokens") or 16), "temperature": fields.get("temperature") or 0.0}
    if name == "shared_prefix":
        # Prefix hits need the first request's blocks computed (and hashed) before the
        # second is scheduled, so run the first one through its prefill before adding.
        first = s.add_request(SHARED_PREFIX + " Question: the capital of France?", **common)
        for _ in range(64):
            if not waiting_for_prefill(s.current, first):
                break
            s.step(1)
        s.add_request(SHARED_PREFIX + " Question: the capital of Italy?", **common)
    elif name == "long_prompt":
        cfg = s.engine.config
        target = min(int(cfg.max_num_batched_tokens * 2.5), cfg.max_model_len - common["max_tokens"] - 1)
        unit = list(s.engine.tokenizer.encode(LONG_TEXT, add_special_tokens=False))
        ids = (unit * (target // max(1, len(unit)) + 1))[:max(1, target)]
        s.add_request(ids, **common)
    elif name == "burst":
        for i in range(max(1, int(fields.get("n") or 8))):
            topic = BURST_TOPICS[i % len(BURST_TOPICS)]
            s.add_request(f"Write a long story about {topic}, part {i + 1}.", ignore_eos=True, **common)
    else:
        raise ValueError(f"unknown preset {name!r}")


def waiting_for_prefill(entry: Any, rid: str) -> bool:
    """True while `rid` has prompt tokens without KV (so it cannot be a prefix source yet)."""
    snapshot = getattr(entry, "snapshot", None) or {}
    for req in views.all_requests(snapshot):
        if req["request_id"] == rid:
            missing = len(req.get("prompt_token_ids", [])) - req.get("num_computed_tokens", 0)
            return req.get("status") != "finished" and missing > 0
    return True


def has_chat_template(tokenizer: Any) -> bool:
    """True when the tokenizer carries a chat template (kvscope's and vLLM's are HF tokenizers)."""
    return bool(getattr(tokenizer, "chat_template", None)) and hasattr(tokenizer, "apply_chat_template")


def chat_prompt(tokenizer: Any, text: str) -> str:
    """`text` as one user turn in the tokenizer's chat template, ready for the assistant's answer.
    An empty text stays empty, so the engine's own "prompt must not be empty" still speaks."""
    if not text or not has_chat_template(tokenizer):
        return text
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                         add_generation_prompt=True)
