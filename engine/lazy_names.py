"""A package's names, loaded on first use (PEP 562's module __getattr__), so importing the package
loads none of their modules: `engine` (torch only for the model side) and `explorer.whatif`
(numpy only for the step model and the sweep) use it.

    __getattr__ = lazy_names(__name__, {"LLM": ".llm", ...})

A name may be its module's name too (explorer.whatif's `replay`, in replay.py). Importing such a
submodule binds the package's attribute to the submodule; here it binds it to what the submodule
defines under that name, as an eager `from .replay import replay` in the package would.
"""
from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Callable, Mapping
from typing import Any


class _LazyPackage(types.ModuleType):
    """A package module whose same-named submodules bind their own definition (see the module doc)."""

    def __setattr__(self, name: str, value: Any) -> None:
        where = self.__dict__.get("_lazy_where") or {}
        if isinstance(value, types.ModuleType) and where.get(name) == f".{name}" and hasattr(value, name):
            value = getattr(value, name)
        super().__setattr__(name, value)


def lazy_names(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """The `__getattr__` of `package`: name -> the module (relative to it) that defines it."""
    module = sys.modules[package]
    module.__class__ = _LazyPackage
    module._lazy_where = dict(where)   # type: ignore[attr-defined]

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name], package), name)
        setattr(module, name, value)   # loaded once
        return value

    return __getattr__
