"""Where the Dashboard's "save this run, then rebuild" writes a run: `WRITER(session, path)`.

The HTML export (explorer/export) sits above this layer, so it installs its writer here when
it is imported (explorer's `Dashboard` name imports it); without one the rebuild question
offers no save."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (its module imports torch: this one also runs where only Python does, a re-run's Pyodide)
    from ..core.session_view import SessionView

Writer = Callable[["SessionView", Path], object]   # what it returns is not read
WRITER: Writer | None = None


def install(writer: Writer) -> None:
    """Save runs with `writer(session, path)` from now on."""
    global WRITER
    WRITER = writer
