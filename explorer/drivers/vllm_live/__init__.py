"""Attach kvscope to a running vLLM server.

In the server: `--scheduler-cls explorer.drivers.vllm_live.RecordingScheduler` (recorder.py)
publishes each step over ZMQ. In the notebook: `Session.attach("tcp://127.0.0.1:5590")` follows
it through client.py's LiveSource; kv_events.py reads vLLM's own KV events into a prefix-cache
tree; server.py starts a server for notebooks, tests and benchmarks. Importing this package
imports neither vLLM nor zmq.
"""
from __future__ import annotations

from typing import Any

__all__ = ["KvEventSubscriber", "LiveSource", "PrefixTree", "RecordingScheduler"]


def __getattr__(name: str) -> Any:
    if name == "RecordingScheduler":  # vLLM resolves --scheduler-cls by module + attribute
        from .recorder import RecordingScheduler
        return RecordingScheduler
    if name == "LiveSource":
        from .client import LiveSource
        return LiveSource
    if name in ("PrefixTree", "KvEventSubscriber"):
        from . import kv_events
        return getattr(kv_events, name)
    raise AttributeError(name)
