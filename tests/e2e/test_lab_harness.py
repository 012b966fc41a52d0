"""The browser harness itself: JupyterLab starts, a notebook runs, widgets round-trip.

When the walkthrough test fails, this one says whether the harness or the dashboard
is to blame. The scratch notebook mirrors the dashboard's contract on a tiny scale: an
anywidget panel with a data-testid and a data-step attribute, driven by a custom
message from the browser.
"""
from __future__ import annotations

import textwrap
import time

import nbformat
import pytest

pytestmark = pytest.mark.e2e

SCRATCH_CELLS = [
    """\
    import ipywidgets as w
    button = w.Button(description="Click me")
    label = w.Label("0")
    button.on_click(lambda _: setattr(label, "value", str(int(label.value) + 1)))
    w.VBox([button, label])
    """,
    """\
    import anywidget, traitlets

    class Stepper(anywidget.AnyWidget):
        _esm = '''
        function render({ model, el }) {
          const btn = document.createElement("button");
          btn.textContent = "Step";
          btn.dataset.testid = "scratch-step-btn";
          const panel = document.createElement("div");
          panel.dataset.testid = "scratch-panel";
          const draw = () => {
            panel.dataset.step = model.get("step");
            panel.textContent = "step " + model.get("step");
          };
          btn.addEventListener("click", () => model.send({ action: "step" }));
          model.on("change:step", draw);
          draw();
          el.append(btn, panel);
        }
        export default { render };
        '''
        step = traitlets.Int(0).tag(sync=True)

        def __init__(self):
            super().__init__()
            self.on_msg(self._on_action)

        def _on_action(self, widget, content, buffers):
            if content.get("action") == "step":
                self.step += 1

    Stepper()
    """,
]


def write_scratch_notebook(path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(textwrap.dedent(src)) for src in SCRATCH_CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nbformat.write(nb, path)


def test_lab_runs_a_notebook_and_widget_clicks_reach_the_kernel(tmp_path, lab_factory, page, lab_ui,
                                                                save_screenshot):
    root = tmp_path / "notebooks"
    root.mkdir()
    write_scratch_notebook(root / "scratch.ipynb")
    t0 = time.monotonic()
    server = lab_factory(root)
    ui = lab_ui(page, server)
    ui.open_notebook("scratch.ipynb")
    ui.run_all_cells()

    button = page.get_by_role("button", name="Click me")
    button.wait_for(timeout=60_000)
    button.click()
    button.click()
    page.locator(".widget-label", has_text="2").wait_for(timeout=10_000)

    panel = page.get_by_test_id("scratch-panel")
    panel.wait_for(timeout=60_000)
    assert panel.get_attribute("data-step") == "0"
    page.get_by_test_id("scratch-step-btn").click()
    page.locator('[data-testid="scratch-panel"][data-step="1"]').wait_for(timeout=10_000)
    assert panel.inner_text() == "step 1"
    save_screenshot(page, "harness-scratch")
    assert ui.cell_errors() == []
    print(f"harness round trip took {time.monotonic() - t0:.1f} s")
