"""In a real JupyterLab: once the history slider is clicked, the arrow keys (and Home / End)
move the history and never reach Lab's notebook shortcuts (in command mode ArrowLeft would
jump to the heading above and collapse it, ArrowUp / ArrowDown would change the active
cell); and the timeline and the latency charts follow the window's width, at
1366x768 and 1920x1080."""
from __future__ import annotations

import textwrap
import time

import nbformat
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TIMEOUT_MS = 180_000  # kernel start, torch import and the model load on a shared 2-core machine

CELLS = [
    ("markdown", "# Keys in the explorer\nThe slider below takes the arrow keys."),
    ("markdown", "## A few steps"),
    ("code", """\
        from explorer import Session
        from explorer.ui.dashboard import controls_panel, latency_panel, timeline_panel
        import ipywidgets as W

        s = Session(r"{model}", num_kv_blocks=16, max_num_batched_tokens=16)
        for i in range(3):
            s.add_request(f"Hello number {{i}}, tell me a story", max_tokens=8, temperature=0.0, ignore_eos=True)
        s.run_until_idle()
        W.VBox([controls_panel(s), timeline_panel(s), latency_panel(s)])
        """),
    ("markdown", "## After the panels\nA heading below the widget."),
]

ACTIVE_CELL_JS = """() => [...document.querySelectorAll('.jp-Notebook .jp-Cell')]
    .findIndex((c) => c.classList.contains('jp-mod-active'))"""
COLLAPSED_JS = """() => document.querySelectorAll('.jp-Notebook [data-heading-collapsed="true"]').length"""
WIDTHS_JS = """() => {
    const holder = document.querySelector('[data-testid=kvs-timeline] .kvs-timeline-svg');
    const box = document.querySelector('[data-testid=kvs-latency] .kvs-lat-box');
    const svg = box && box.querySelector('svg');
    return { holder: holder.clientWidth, chart: holder.querySelector('svg').getBoundingClientRect().width,
             box: box ? box.clientWidth : 0, plot: svg ? Number(svg.getAttribute('width')) : 0 }; }"""


def write_notebook(path, model: str) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(textwrap.dedent(src).format(model=model)) if kind == "code"
                else nbformat.v4.new_markdown_cell(src) for kind, src in CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nbformat.write(nb, path)


def widths_follow(page) -> dict:
    """Wait until the timeline and the latency charts are as wide as their boxes; return the widths."""
    page.wait_for_function(f"""() => {{ const w = ({WIDTHS_JS})();
        return w.box > 0 && Math.abs(w.holder - w.chart) <= 1 && Math.abs(w.box - w.plot) <= 2; }}""",
                           timeout=30_000)
    return page.evaluate(WIDTHS_JS)


def test_slider_keys_stay_in_the_widget_and_panels_follow_the_window(tmp_path, lab_factory, page, lab_ui,
                                                                      tiny_qwen3_path, save_screenshot):
    root = tmp_path / "notebooks"
    root.mkdir()
    write_notebook(root / "keys.ipynb", str(tiny_qwen3_path))
    t0 = time.monotonic()
    page.set_viewport_size({"width": 1366, "height": 768})
    ui = lab_ui(page, lab_factory(root))
    ui.open_notebook("keys.ipynb")
    t_open = time.monotonic() - t0
    ui.run_all_cells()
    slider = page.get_by_test_id("kvs-history-slider")
    slider.wait_for(timeout=TIMEOUT_MS)
    ui.wait_kernel_idle(TIMEOUT_MS)
    assert ui.cell_errors() == []
    label = page.get_by_test_id("kvs-history-label")
    page.wait_for_function("() => /^step \\d+ of \\d+$/.test(document.querySelector("
                           "'[data-testid=kvs-history-label]').textContent)", timeout=TIMEOUT_MS)
    last = int(label.inner_text().split()[-1])
    assert last >= 5

    # -- the keys move the history; the notebook does not move --------------------------------
    slider.scroll_into_view_if_needed()
    slider.click()  # a click on the track also moves the history to where it lands
    page.wait_for_function(f"() => ({ACTIVE_CELL_JS})() !== -1")
    active = page.evaluate(ACTIVE_CELL_JS)
    assert active == 2  # the code cell whose output holds the panels
    slider.press("End")
    page.locator('[data-testid="kvs-history-label"]', has_text=f"step {last} of {last}").wait_for(timeout=30_000)
    for key, expected in (("ArrowLeft", last - 1), ("ArrowLeft", last - 2), ("ArrowUp", last - 1),
                          ("ArrowDown", last - 2), ("ArrowRight", last - 1), ("Home", 0), ("End", last)):
        slider.press(key)
        page.locator('[data-testid="kvs-history-label"]', has_text=f"step {expected} of {last}").wait_for(
            timeout=30_000)
        assert page.evaluate(ACTIVE_CELL_JS) == active, f"{key} changed the active cell"
        assert page.evaluate(COLLAPSED_JS) == 0, f"{key} collapsed a heading"
    assert page.get_by_test_id("kvs-controls").get_attribute("data-step") == str(last)
    save_screenshot(page, "lab-keys-1366x768")

    # -- the timeline and the latency charts follow the window --------------------------------
    small = widths_follow(page)
    page.set_viewport_size({"width": 1920, "height": 1080})
    page.wait_for_function(f"(w) => ({WIDTHS_JS})().holder > w + 300", arg=small["holder"], timeout=30_000)
    large = widths_follow(page)
    # The latency charts sit two by two: each grows with its half of the panel.
    assert large["chart"] > small["chart"] + 300 and large["plot"] > small["plot"] * 1.4, (small, large)
    save_screenshot(page, "lab-keys-1920x1080")
    kvs_errors = [e for e in page.console_errors if "kvs" in e.lower()]
    assert kvs_errors == [], kvs_errors
    print(f"lab keyboard e2e: Lab open {t_open:.1f} s, total {time.monotonic() - t0:.1f} s")
