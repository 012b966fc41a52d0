"""kvscope's explorer: a Session that drives an engine (or follows a vLLM server) step by
step, and the Dashboard that shows it in JupyterLab.

Layers, bottom to top (docs/architecture.md): `drivers/` (the engines), `core/` (Session,
history, the engine protocol), `ui/` (views, captions, the Dashboard), `export/` (one HTML
file of a run), `apps/` (the CLI and launchers).

The names below are imported on first use (module `__getattr__`): `python -m explorer --help`
should not wait for torch, and `Session` users should not pull in ipywidgets, anywidget or
plotly.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from .apps.dashboard import Dashboard
    from .core.history import HistoryEntry
    from .core.session import Session
    from .export import export_html

__all__ = ["Dashboard", "HistoryEntry", "Session", "export_html"]


def __getattr__(name: str) -> Any:
    value: Any  # a class or a function, by name
    if name in ("Session", "HistoryEntry"):
        from .core import history, session

        value = session.Session if name == "Session" else history.HistoryEntry
    elif name == "Dashboard":   # the ui's Dashboard, saving runs as HTML exports
        from .apps.dashboard import Dashboard as value
    elif name == "export_html":
        from .export import export_html as value
    else:
        raise AttributeError(f"module 'explorer' has no attribute {name!r}")
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
