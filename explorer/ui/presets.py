"""The Controls panel's demo presets and the add-request form's prompt helpers.

`add_preset(session, name, fields)` turns a preset's name (widgets.controls.DEFAULT_PRESETS)
into real requests on a Session; `has_chat_template` / `chat_prompt` let the form wrap a
typed prompt in the tokenizer's chat template (the default model is an Instruct model).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, TypedDict

from . import views

if TYPE_CHECKING:  # types only: this module imports no more than it needs

    from ..core.history import HistoryEntry
    from ..core.session_view import SessionView

SHARED_PREFIX = ("You are a concise assistant for a geography quiz. Answer with the name of the city only, "
                 "no explanation, no punctuation, and no extra words. Here is the question.")
SHARED_QUESTIONS = ("Question: the capital of France?", "Question: the capital of Italy?")
LONG_TEXT = ("The paged KV cache stores keys and values in fixed-size blocks, so a request's memory grows "
             "one block at a time and blocks can be shared between requests with a common prefix. ")
BURST_TOPICS = ("the ocean", "mountains", "a library", "trains", "the moon", "gardens", "rivers", "old maps",
                "clocks", "bridges", "deserts", "music", "forests", "islands", "bicycles", "lighthouses")
PRESET_NAMES = ("shared_prefix", "long_prompt", "burst")


class PresetFieldsDict(TypedDict, total=False):
    """The add-request form's fields a preset reads (the Controls panel's `preset` action carries them);
    an emptied number field arrives as ""."""
    max_tokens: int | str | None
    temperature: float | str | None
    n: int | str | None          # how many requests a burst adds
    chat_template: bool          # each prompt in the tokenizer's chat template


class PresetSamplingDict(TypedDict):
    """The sampling fields every request of a preset gets (SamplingParams' fields, as add_request's keywords)."""
    max_tokens: int
    temperature: float | str


class ChatTurnDict(TypedDict):
    """One turn of a chat, as a chat template takes it."""
    role: str      # "system" | "user"
    content: str


class ChatTokenizer(Protocol):
    """What the presets and the form use of a tokenizer (kvscope's and vLLM's are Hugging Face tokenizers)."""

    chat_template: str | None

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def apply_chat_template(self, conversation: list[ChatTurnDict], *, tokenize: bool = ...,
                            add_generation_prompt: bool = ...) -> str: ...


def add_preset(session: SessionView, name: str, fields: PresetFieldsDict) -> str:
    """Add the requests of preset `name` and say in one line what it did, steps included.

    `fields` may carry max_tokens, temperature, n (burst) and chat_template (the form's
    switch: each prompt goes in as a user turn of the tokenizer's chat template, the shared
    prefix as the system turn, so an Instruct model answers instead of continuing raw text).
    """
    s = session
    common: PresetSamplingDict = {"max_tokens": int(fields.get("max_tokens") or 16),
                                  "temperature": fields.get("temperature") or 0.0}
    tok = s.source.tokenizer
    chat = bool(fields.get("chat_template")) and has_chat_template(tok)
    wrap = ((lambda text, system=None: chat_prompt(tok, text, system=system)) if chat
            else (lambda text, system=None: text))
    how = " in the chat template" if chat else ""
    if name == "shared_prefix":
        # Prefix hits need the first request's blocks computed (and hashed) before the
        # second is scheduled, so run the first one through its prefill before adding.
        first = s.add_request(wrap(SHARED_QUESTIONS[0], SHARED_PREFIX) if chat
                              else SHARED_PREFIX + " " + SHARED_QUESTIONS[0], **common)
        stepped = 0
        for _ in range(64):
            if not waiting_for_prefill(s.current, first):
                break
            s.step(1)
            stepped += 1
        second = s.add_request(wrap(SHARED_QUESTIONS[1], SHARED_PREFIX) if chat
                               else SHARED_PREFIX + " " + SHARED_QUESTIONS[1], **common)
        return (f"Shared-prefix pair: added #{first}{how}, ran {stepped} step{'' if stepped == 1 else 's'} by itself "
                f"until its prompt was computed (its full blocks are now in the prefix cache), then added #{second} "
                f"with the same prefix: press Step to see its prefix-cache hits")
    if name == "long_prompt":
        cfg = s.config
        target = min(int(cfg.max_num_batched_tokens * 2.5), cfg.max_model_len - common["max_tokens"] - 1)
        if chat:
            prompt: str | list[int] = long_chat_prompt(tok, target)
            n = len(tok.encode(prompt, add_special_tokens=False))
        else:
            unit = list(tok.encode(LONG_TEXT, add_special_tokens=False))
            prompt = (unit * (target // max(1, len(unit)) + 1))[:max(1, target)]
            n = len(prompt)
        rid = s.add_request(prompt, **common)
        return (f"Long prompt: added #{rid}{how}, {n} tokens for a token budget of {cfg.max_num_batched_tokens} "
                f"(no step run): press Step to see its prefill chunked")
    if name == "burst":
        count = max(1, int(fields.get("n") or 8))
        ids = [s.add_request(wrap(f"Write a long story about {BURST_TOPICS[i % len(BURST_TOPICS)]}, part {i + 1}."),
                             ignore_eos=True, **common) for i in range(count)]
        return (f"Burst: added {count} requests{how} (#{ids[0]} \u2026 #{ids[-1]}; no step run): press Step or Play, "
                f"and with a small pool watch preemption")
    raise ValueError(f"unknown preset {name!r}")


def long_chat_prompt(tokenizer: ChatTokenizer, target: int) -> str:
    """A user turn of repeated LONG_TEXT whose templated prompt is about `target` tokens (never more)."""
    unit = max(1, len(tokenizer.encode(LONG_TEXT, add_special_tokens=False)))
    overhead = len(tokenizer.encode(chat_prompt(tokenizer, "x"), add_special_tokens=False)) - 1
    k = max(1, (target - overhead) // unit)
    prompt = chat_prompt(tokenizer, (LONG_TEXT * k).strip())
    while k > 1 and len(tokenizer.encode(prompt, add_special_tokens=False)) > target:
        k -= 1
        prompt = chat_prompt(tokenizer, (LONG_TEXT * k).strip())
    return prompt


def waiting_for_prefill(entry: HistoryEntry, rid: str) -> bool:
    """True while `rid` has prompt tokens without KV (so it cannot be a prefix source yet)."""
    for req in views.all_requests(entry.snapshot):
        if req["request_id"] == rid:
            missing = len(req.get("prompt_token_ids", [])) - req.get("num_computed_tokens", 0)
            return req.get("status") != "finished" and missing > 0
    return True


def has_chat_template(tokenizer: ChatTokenizer | None) -> bool:
    """True when the tokenizer carries a chat template (kvscope's and vLLM's are HF tokenizers)."""
    return bool(getattr(tokenizer, "chat_template", None)) and hasattr(tokenizer, "apply_chat_template")


def chat_prompt(tokenizer: ChatTokenizer | None, text: str, system: str | None = None) -> str:
    """`text` as one user turn in the tokenizer's chat template (after a `system` turn when
    given), ready for the assistant's answer. An empty text stays empty, so the engine's own
    "prompt must not be empty" still speaks."""
    if not text or tokenizer is None or not has_chat_template(tokenizer):
        return text
    turns: list[ChatTurnDict] = [{"role": "system", "content": system}] if system else []
    turns.append({"role": "user", "content": text})
    return tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
