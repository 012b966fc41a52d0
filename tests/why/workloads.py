"""Seeded random traffic for the why-view's tests: prompts from a few shared prefixes of lengths
that end inside a block, repeats of whole prompts (vLLM's last-token rule), unique prompts, a
pool small enough that cached blocks are evicted and running requests preempted, and requests
added while others run."""
from __future__ import annotations

import random
from typing import Any


def random_workload(seed: int, *, block_size: int, num_requests: int = 14, vocab: tuple[int, int] = (200, 20000),
                    max_prompt: int = 100) -> list[dict]:
    """[{prompt, max_tokens, after_steps}]: each request is added after `after_steps` more steps."""
    rng = random.Random(seed)
    lengths = [block_size // 2 + 3, block_size + block_size // 2 + 2, 2 * block_size + 3, 3 * block_size]
    prefixes = [[rng.randrange(*vocab) for _ in range(rng.choice(lengths))] for _ in range(3)]
    out: list[dict] = []
    for _ in range(num_requests):
        kind = rng.random()
        if kind < 0.55:
            base = list(rng.choice(prefixes))
        elif kind < 0.7 and out:
            base = list(rng.choice(out)["prompt"])   # a repeat: whole, or its start
            base = base[:rng.choice([len(base), max(1, len(base) // 2)])]
        else:
            base = []
        tail = [rng.randrange(*vocab) for _ in range(rng.randrange(1, 2 * block_size))] if kind < 0.55 or not base \
            else []
        prompt = (base + tail)[:max_prompt] or [rng.randrange(*vocab)]
        out.append({"prompt": prompt, "max_tokens": rng.randrange(4, 40), "after_steps": rng.choice([0, 0, 1, 3, 6])})
    return out


def drive(session: Any, workload: list[dict]) -> list[str]:
    """Add each request after its steps, then run to the end; the request ids in order."""
    ids = []
    for w in workload:
        if w["after_steps"]:
            session.step(w["after_steps"])
        ids.append(session.add_request(w["prompt"], max_tokens=w["max_tokens"], ignore_eos=True, temperature=0.0))
    session.run_until_idle()
    return ids
