"""Run All, save, reopen in JupyterLab: every widget the saved outputs show still draws. A
progress bar that was a widget and closed itself (tqdm's notebook bar with leave=False, as the
engine's weights bar was) left an output naming a model the kernel no longer held, which Lab
then shows as "Error displaying widget: model not found", and the browser console an error. At
a laptop's 1366x768, the size the review used."""
from __future__ import annotations

import textwrap

import nbformat
import pytest

from tests.e2e import LAPTOP

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_a_session_cell_reopened_after_run_all_shows_no_missing_widget(tmp_path, lab_factory, page, lab_ui,
                                                                        tiny_qwen3_path):
    page.set_viewport_size(LAPTOP)
    root = tmp_path / "notebooks"
    root.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(textwrap.dedent(src)) for src in (
        f"""\
        from explorer import Session, Dashboard
        s = Session({str(tiny_qwen3_path)!r}, num_kv_blocks=32)   # loads the weights: the bar draws here
        s""",
        "Dashboard(s)")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nbformat.write(nb, root / "reopen.ipynb")
    server = lab_factory(root)
    ui = lab_ui(page, server)
    ui.open_notebook("reopen.ipynb")
    ui.run_all_cells()
    page.get_by_test_id("kvs-controls").wait_for(timeout=120_000)
    ui.wait_kernel_idle()
    page.keyboard.press("Control+s")
    page.wait_for_function("() => !document.querySelector('.jp-mod-dirty')", timeout=30_000)
    page.reload()   # the notebook opens again from the saved file, its kernel still running
    page.wait_for_selector(".jp-Notebook", timeout=90_000)
    ui.wait_kernel_idle()
    page.get_by_test_id("kvs-controls").wait_for(timeout=60_000)   # the Dashboard draws from the live kernel
    # Lab says "Error displaying widget: model not found" once its widget manager has looked for
    # the models: give it time to, then see that it did not.
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    missing = page.get_by_text("model not found")
    with pytest.raises(PlaywrightTimeout):
        missing.first.wait_for(timeout=10_000)
    assert missing.count() == 0
    assert ui.cell_errors() == []
    assert page.console_errors == [], page.console_errors   # the review saw one, beside the missing model
