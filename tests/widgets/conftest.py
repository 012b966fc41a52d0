"""Fixtures for the panel tests: a real Session over a tiny random Qwen3, and a way to
send a panel the custom message its JavaScript would send."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

# Small enough that a burst of requests runs the pool dry (preemption), large enough
# for every other scenario. Tests that change knobs reset back to these.
BASE_CONFIG = {"num_kv_blocks": 48, "max_num_batched_tokens": 64, "max_num_seqs": 256,
               "enable_chunked_prefill": True, "enable_prefix_caching": True, "scheduler_reserve_full_isl": True,
               "scheduling_policy": "unified", "block_size": 16, "async_scheduling": False}


@pytest.fixture(scope="session")
def session(tiny_qwen3_path: Path) -> Any:
    """One Session for all panel tests (building one loads the model and tokenizer)."""
    from explorer import Session

    return Session(str(tiny_qwen3_path), **BASE_CONFIG)


@pytest.fixture
def fresh_session(session: Any) -> Any:
    """The module's Session, reset to BASE_CONFIG with an empty history."""
    session.reset(**BASE_CONFIG)
    return session


def send(panel: Any, **content: Any) -> dict | None:
    """Deliver `content` as the browser would (a custom comm message) and return the ack."""
    acks: list[dict] = []
    panel.send = lambda msg, buffers=None: acks.append(msg)  # no kernel: catch what Python sends
    try:
        content.setdefault("seq", "test:1")
        panel._handle_msg({"content": {"data": {"method": "custom", "content": content}}, "buffers": []})
    finally:
        del panel.send
    return acks[-1] if acks else None


def node_tool(name: str, package: str) -> Path:
    """The node tool `name` that scripts/setup.sh installs into .venv/node (npm `package`); the test
    skips without node and fails, saying how to install it, without the tool."""
    tool = Path(__file__).resolve().parents[2] / ".venv" / "node" / "node_modules" / ".bin" / name
    if shutil.which("node") is None:
        pytest.skip("node is not installed (scripts/setup.sh --with-browser installs it)")
    if not tool.exists():
        pytest.fail(f"{package} is not installed at {tool}: "
                    "run `bash scripts/setup.sh --with-browser` (make test does)")
    return tool
