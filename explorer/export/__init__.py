"""One self-contained HTML file of a history (page.py), every panel state computed at export
time by the UI's own views (states.py), and the workloads the CLI records for it
(workloads.py). Imports core and ui; never the apps."""
from .page import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_STEPS,
    KEEP_CHOICES,
    ExportResult,
    build_export_data,
    export_html,
    load_export,
    panel_defaults,
    panel_sources,
    render_html,
    select_entries,
)

__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_MAX_STEPS", "KEEP_CHOICES", "ExportResult", "build_export_data",
           "export_html", "load_export", "panel_defaults", "panel_sources", "render_html", "select_entries"]
