"""kvscope's explorer: a Session that drives the engine step by step, and the Dashboard
that shows it in JupyterLab.

Both are imported on first use (module `__getattr__`): `python -m explorer --help`
should not wait for torch, and `Session` users should not pull in ipywidgets,
anywidget or plotly.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from .dashboard import Dashboard
    from .session import HistoryEntry, Session

__all__ = ["Session", "HistoryEntry", "Dashboard"]

_LAZY = {"Session": ".session", "HistoryEntry": ".session", "Dashboard": ".dashboard"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'explorer' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
