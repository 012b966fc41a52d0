"""The first check of a browser test that runs a whole notebook: every cell ran, none failed."""
from __future__ import annotations

from typing import Any

from benchmarks.lab_harness import LabUI


def assert_cells_ran(ui: LabUI, shown: Any, shown_timeout_ms: float, idle_timeout_ms: float) -> None:
    """Wait until `shown` (a Playwright locator of what the cells display) is on the page and the
    kernel is idle, then assert that no cell shows a traceback. The tracebacks are read even when
    a wait times out (pytest -l shows them): a failed cell is why a widget never showed."""
    try:
        shown.wait_for(timeout=shown_timeout_ms)
        ui.wait_kernel_idle(idle_timeout_ms)
    finally:
        errors = ui.cell_errors()
    assert errors == [], "a notebook cell failed:\n" + "\n\n".join(errors)
