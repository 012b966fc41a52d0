"""Traffic helpers for the tests that drive a real vLLM server."""
from __future__ import annotations

import time
from typing import Any


def complete_together(client: Any, model: str, prompts: list, max_tokens: int) -> list[tuple[str, Any]]:
    """Greedy completions of `prompts` in one completions call: [(the request id's prefix, choice)].

    vLLM's front end adds a call's prompts to the engine core together, as requests
    '{response id}-{index}', so they run at once. Separate calls from client threads reach a busy
    2-core machine's server as much as seconds apart, and a burst meant to run the pool dry may not.
    """
    r = client.completions.create(model=model, prompt=prompts, max_tokens=max_tokens, temperature=0.0,
                                  extra_body={"ignore_eos": True})
    assert len(r.choices) == len(prompts), (len(r.choices), len(prompts))
    return [(f"{r.id}-{c.index}", c) for c in sorted(r.choices, key=lambda c: c.index)]


def settled_history(live: Any, writer: Any, timeout: float = 120) -> list:
    """Wait until an attached Session sees the server idle (nothing running or waiting), take in
    the last steps, close the RecordingWriter following it and return the Session's history."""
    assert live.wait_for(lambda s: not s.current.snapshot["queues"]["running"]
                         and not s.current.snapshot["queues"]["waiting"], timeout=timeout)
    time.sleep(0.5)
    live.poll()
    writer.close()
    return live.history
