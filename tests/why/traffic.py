"""Traffic for a real vLLM server crafted so that every cause of a prefix-cache miss happens at
least once, with prompts given as token ids (the completions API takes them) so each lands on
the block boundaries it is meant to:

- `sys_b` shares `sys_a`'s 3 blocks and 16 tokens more: 96 hit, 16 below one block (a block of 16 holds them);
- `short_b` shares `short_a`'s first 16 tokens, half a block of 32: below one block (a block of 16 holds them);
- `time_b` differs from `time_a` in the timestamp's last digit: the first divergent token;
- `salt_b` repeats `salt_a`'s 2 blocks under another cache_salt: another hash domain;
- `evict_b` repeats `evict_a`'s 4 blocks after a flood of unique prompts evicted them;
- a burst of long answers in the small pool: preemptions, and their recompute.
"""
from __future__ import annotations

from typing import Any

from tests.vllm_traffic import complete_together

BLOCK, NUM_BLOCKS, BUDGET, MAX_MODEL_LEN = 32, 24, 128, 512
SERVER = dict(num_gpu_blocks=NUM_BLOCKS, block_size=BLOCK, max_model_len=MAX_MODEL_LEN,
              max_num_batched_tokens=BUDGET, max_num_seqs=8)


def _ids(tokenizer: Any, text: str, n: int | None = None) -> list[int]:
    ids = tokenizer.encode(text, add_special_tokens=False)
    while n is not None and len(ids) < n:
        ids = ids + ids
    return ids if n is None else ids[:n]


def prompts(tokenizer: Any) -> dict[str, list[int]]:
    sys_prompt = _ids(tokenizer, "You are kvscope's careful assistant: answer in one short sentence, plainly. ",
                      3 * BLOCK + 16)
    short = _ids(tokenizer, "Translate into French, word for word: ", 16)
    later = _ids(tokenizer, "Use these notes. The harbour opens at dawn, the ferry leaves at nine, tickets cost two "
                            "coins and the captain likes questions about the weather. ", 70)
    salted = _ids(tokenizer, "Private context of one tenant: the account number, the order history and the "
                             "delivery address are secret. ", 2 * BLOCK + 6)
    evict = _ids(tokenizer, "A long shared document that a later request will want again, about lighthouses, "
                            "tides and the keepers who kept them lit through the winter storms. ", 4 * BLOCK + 5)
    q = lambda text: _ids(tokenizer, text)  # noqa: E731
    return {
        "sys_a": sys_prompt + q(" Question: name a colour."), "sys_b": sys_prompt + q(" Which fruit is red?"),
        "short_a": short + q(" the cat sleeps on the warm red mat near the old wooden door of the house"),
        "short_b": short + q(" a dog runs along the cold grey beach under a low and heavy autumn sky"),
        "time_a": q("Today is 2026-12-03 09:14:05. ") + later, "time_b": q("Today is 2026-12-03 09:14:06. ") + later,
        "salt_a": salted + q(" Summarise it."), "salt_b": salted + q(" Summarise it."),
        "salt_c": salted + q(" List it."),
        "evict_a": evict + q(" Who kept them?"), "evict_b": evict + q(" When were they built?"),
    }


SALTS = {"salt_a": "tenant-a", "salt_b": "tenant-b", "salt_c": "tenant-a"}


def send(srv: Any, tokenizer: Any) -> dict[str, str]:
    """The crafted traffic, in order; name -> the prefix of its vLLM request id."""
    client = srv.client(timeout=300)
    p = prompts(tokenizer)
    ids: dict[str, str] = {}

    def complete(name: str, prompt: list[int], n: int = 4, **extra: Any) -> str:
        r = client.completions.create(model=srv.model, prompt=prompt, max_tokens=n, temperature=0.0,
                                      extra_body={"ignore_eos": True, **extra})
        ids[name] = r.id
        return r.id

    for name in ("sys_a", "sys_b", "short_a", "short_b", "time_a", "time_b", "salt_a", "salt_b", "salt_c",
                 "evict_a"):
        complete(name, p[name], **({"cache_salt": SALTS[name]} if name in SALTS else {}))
    # A flood of unique prompts cycles the whole pool: evict_a's blocks go.
    for i in range(7):
        complete(f"flood_{i}", _ids(tokenizer, f"Unrelated request {i}: {'abcdefghij'[i]} " * 3, 4 * BLOCK))
    complete("evict_b", p["evict_b"])
    # Four answers of 150 tokens after 64-token prompts (7 blocks each) from a 23-block pool: running
    # requests run out of blocks.
    burst = complete_together(client, srv.model, [_ids(tokenizer, f"Story {i} about ships: ", 2 * BLOCK)
                                                  for i in range(4)], 150)
    ids.update((f"burst_{i}", rid) for i, (rid, _) in enumerate(burst))
    return ids


def request_of(history: Any, response_id: str) -> str:
    """The Session's request id of a completion (the server's id starts with the response's)."""
    for e in reversed(history):
        q = e.snapshot["queues"]
        for r in (*q["finished"], *q["running"], *q["waiting"]):
            if r["request_id"].startswith(response_id):
                return r["request_id"]
    raise KeyError(response_id)
