"""Attach kvscope to a running vLLM server.

In the server: `--scheduler-cls explorer.drivers.vllm_live.RecordingScheduler` (explorer.drivers.vllm_live.recorder)
publishes each step over ZMQ. In the notebook: `Session.attach("tcp://127.0.0.1:5590")`
(explorer.drivers.vllm_live.client) follows it; explorer.drivers.vllm_live.kv_events reads vLLM's own KV events
into a prefix-cache tree. Importing this package imports neither vLLM nor zmq.
"""
from __future__ import annotations

from typing import Any

__all__ = ["RecordingScheduler", "attach", "LiveSession", "PrefixTree", "KvEventSubscriber"]


def __getattr__(name: str) -> Any:
    if name == "RecordingScheduler":  # vLLM resolves --scheduler-cls by module + attribute
        from .recorder import RecordingScheduler
        return RecordingScheduler
    if name in ("attach", "LiveSession"):
        from . import client
        return getattr(client, name)
    if name in ("PrefixTree", "KvEventSubscriber"):
        from . import kv_events
        return getattr(kv_events, name)
    raise AttributeError(name)
