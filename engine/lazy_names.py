"""A package's names, loaded on first use (PEP 562's module __getattr__), so importing the package
loads none of their modules: `engine` (torch only for the model side) and `explorer.whatif`
(numpy only for the step model and the sweep) use it.

    __getattr__ = lazy_names(__name__, {"LLM": ".llm", ...})
"""
from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """The `__getattr__` of `package`: name -> the module (relative to it) that defines it."""
    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name], package), name)
        setattr(sys.modules[package], name, value)   # loaded once
        return value

    return __getattr__
