"""What the UI benchmark's kernel side (ui.py) and browser side (ui_page.py)
share: the panels whose redraw is timed, and the error for a part that cannot run here."""
from __future__ import annotations

WATCHED_PANELS = ("kvs-queues", "kvs-block-pool", "kvs-slot-mapping")


class BenchUnavailable(RuntimeError):
    """A part of the benchmark cannot run here (no checkout, playwright or chromium)."""
