"""`explorer.Dashboard`: the Dashboard whose "save this run, then rebuild" writes the run as a
one-file HTML export (the ui layer cannot import the export, which sits above it: this layer
hands the writer down)."""
from __future__ import annotations

from collections.abc import Iterable

from ..core.session_view import FleetView, SessionView
from ..export import export_html
from ..ui import dashboard as _ui
from ..ui.dashboard import RunWriter


class Dashboard(_ui.Dashboard):
    """Every kvscope panel bound to one Session (`explorer.ui.dashboard.Dashboard`), saving a run
    as `explorer.export_html` writes it unless another `run_writer` is given."""

    def __init__(self, session: SessionView | FleetView, *, panels: Iterable[str] | None = None,
                 run_writer: RunWriter | None = export_html) -> None:
        super().__init__(session, panels=panels, run_writer=run_writer)
