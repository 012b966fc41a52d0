"""The what-if view in headless chromium: a real recording (kvscope's engine, the tiny model)
replayed as recorded and with a smaller pool, side by side on one slider; the first parting is
marked on the strip and said in words, and the slider, the step buttons and the jump move both
runs together (tests/widgets/minifrontend.py stands in for JupyterLab's widget manager). The
sweep's charts, drawn by plotly.js from a page with plotly's own bundle (no network), read as the
review found them wrong: identical y ticks, four budgets joined in one zig-zag line, three
identical lines under one, bars labelled with recomputed tokens and none for 0 preemptions.
Both at a laptop's 1366x768."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from explorer.core.recording import Recording, save_recording
from tests.e2e import LAPTOP
from tests.whatif.conftest import CONFIG, drive
from tests.whatif.sweep_rows import BUDGETS, review_rows, sweep_result
from tests.widgets.minifrontend import MiniFrontend

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def panel(tiny_qwen3_path, tmp_path_factory):
    from explorer import Session
    from explorer.ui.whatif_view import whatif_panel

    s = Session(str(tiny_qwen3_path), **CONFIG)
    drive(s)
    rec = Recording.load(save_recording(s, tmp_path_factory.mktemp("rec") / "run.kvrec"))
    return whatif_panel(rec, num_blocks=17)


def test_the_whatif_view_marks_and_explains_the_first_parting(browser, panel):
    page = browser.new_page(viewport=LAPTOP)
    front = MiniFrontend(page, {"whatif": panel})
    try:
        p = panel.parting
        assert p and "preempted" in p["text"]
        root = page.locator('[data-testid="kvs-whatif"]')
        # It opens on the parting: the words, the mark on the strip, both runs at that step.
        assert root.get_attribute("data-index") == str(p["index"])
        assert page.inner_text('[data-testid="kvs-whatif-parting"]').startswith("They part here: step ")
        assert p["text"] in page.inner_text('[data-testid="kvs-whatif-parting"]')
        assert page.locator('[data-testid="kvs-whatif-mark"]').count() == 1
        assert page.inner_text('[data-testid="kvs-whatif-b-step"]').startswith(f"step {p['step_b']}")
        assert page.locator('[data-testid="kvs-whatif-b"] [data-testid="kvs-whatif-preempted"]').count() >= 1
        assert page.locator('[data-testid="kvs-whatif-a"] [data-testid="kvs-whatif-preempted"]').count() == 0
        # Next moves both runs; Python hears the slider's position.
        page.click('[data-testid="kvs-whatif-next"]')
        page.wait_for_function("(i) => document.querySelector('[data-testid=kvs-whatif]').dataset.index === String(i)",
                               arg=p["index"] + 1)
        assert panel.index == p["index"] + 1
        assert page.inner_text('[data-testid="kvs-whatif-parting"]').startswith("First parting: ")
        steps = panel.steps
        a_step = steps["a"]["step"][p["index"] + 1]
        assert page.inner_text('[data-testid="kvs-whatif-a-step"]').startswith(f"step {a_step}")
        # The slider to the first step: the same schedule on both sides, no row marked different.
        page.eval_on_selector('[data-testid="kvs-whatif-slider"]',
                              "(e) => { e.value = '0'; e.dispatchEvent(new Event('input')); }")
        page.wait_for_function("() => document.querySelector('[data-testid=kvs-whatif]').dataset.index === '0'")
        assert page.locator(".kvs-whatif-diff").count() == 0
        # The jump goes back to the parting, where the rows that differ are marked.
        page.click('[data-testid="kvs-whatif-jump"]')
        page.wait_for_function("(i) => document.querySelector('[data-testid=kvs-whatif]').dataset.index === String(i)",
                               arg=p["index"])
        assert page.locator(".kvs-whatif-diff").count() >= 1
        # The KV-usage strip has its y scale, and a click on its far right lands on the last step.
        ticks = page.locator('[data-testid="kvs-whatif-strip"] .kvs-whatif-tick').all_text_contents()
        assert ticks == ["0%", "50%", "100%"]
        box = page.locator('[data-testid="kvs-whatif-strip"] svg').bounding_box()
        page.mouse.click(box["x"] + box["width"] - 2, box["y"] + box["height"] / 2)
        last = max(len(steps["a"]["step"]), len(steps["b"]["step"])) - 1
        page.wait_for_function("(i) => document.querySelector('[data-testid=kvs-whatif]').dataset.index === String(i)",
                               arg=last)
        assert front.errors() == []
    finally:
        page.close()


def _charts_page(figs: dict, folder: Path) -> Path:
    """The figures in one page, plotly.js inlined once from the plotly package (nothing fetched)."""
    parts = [f'<div data-testid="kvs-sweep-{name}">' + fig.to_html(full_html=False, include_plotlyjs=i == 0,
                                                                     div_id=f"fig-{name}") + "</div>"
             for i, (name, fig) in enumerate(figs.items())]
    path = folder / "sweep_charts.html"
    path.write_text('<!doctype html><html><head><meta charset="utf-8"></head><body>' + "".join(parts)
                    + "</body></html>")
    return path


def _xs(d: str) -> list[float]:
    """The x of each point of an SVG path drawn by plotly ("M59.2,252.75L1049.8,252.75")."""
    return [float(x) for x in re.findall(r"[ML]([-\d.]+),", d)]


def test_the_sweep_charts_read_right_in_a_browser(browser, tmp_path):
    rows = review_rows()
    figs = sweep_result(rows).charts()   # what the notebook's res.charts() draws
    path = _charts_page(figs, tmp_path)
    page = browser.new_page(viewport=LAPTOP)
    fetched: list[str] = []
    page.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:")
               else (fetched.append(route.request.url), route.abort()))
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    try:
        page.goto(path.resolve().as_uri())
        for name in figs:
            page.wait_for_selector(f"#fig-{name} .main-svg", timeout=30_000)
        wrong: list[str] = []   # every finding at once: a failure names all that are still wrong

        def texts(selector: str) -> list[str]:
            return page.eval_on_selector_all(selector, "es => es.map(e => e.textContent)")

        def lines(name: str) -> list[str]:
            return page.eval_on_selector_all(f"#fig-{name} .scatterlayer .trace path.js-line",
                                             "es => es.map(e => e.getAttribute('d'))")

        # -- Prefix-hit rate against pool size: ticks that tell 22.7% from 23.3%; one line per budget --
        ticks = texts("#fig-hit_rate .ytick text")
        if len(set(ticks)) < 2 or len(set(ticks)) != len(ticks):
            wrong.append(f"hit-rate y ticks repeat: {ticks}")
        names = texts("#fig-hit_rate .legend .legendtext")
        if names != [f"budget {b}" for b in BUDGETS]:
            wrong.append(f"hit-rate series are not one per budget: {names}")
        for d in lines("hit_rate"):
            xs = _xs(d)
            if xs != sorted(set(xs)):
                wrong.append(f"a hit-rate line goes back along x (points of several budgets joined): {d}")
        # -- TTFT p90 against the budget: one line per pool that differs, each line visible ------------
        names = texts("#fig-ttft_p90 .legend .legendtext")
        drawn = lines("ttft_p90")
        if names != ["34 blocks", "40 and 80 blocks alike"]:
            wrong.append(f"TTFT series are not one per distinct pool: {names}")
        if len(set(drawn)) != len(drawn) or len(drawn) != len(names):
            wrong.append(f"TTFT lines drawn over each other: {len(drawn)} lines, {len(set(drawn))} distinct, "
                         f"{len(names)} in the legend")
        # -- Preemptions per setting: a bar and its count for every setting, 0 included -----------------
        bars = page.locator("#fig-preemptions .barlayer .point").count()
        labels = texts("#fig-preemptions .barlayer .bartext")
        counts = [str(r["preemptions"]) for r in rows]
        if bars != len(rows):
            wrong.append(f"{bars} bars for {len(rows)} settings")
        if labels != counts:
            wrong.append(f"bar labels {labels} are not the preemption counts {counts}")
        assert "0" in counts and "0" not in [str(r["recomputed_tokens"]) for r in rows if r["preemptions"]]
        # -- At 1366 px each chart and its title fit the page -------------------------------------------
        for name in figs:
            svg = page.eval_on_selector(f"#fig-{name} .main-svg", "e => e.getBoundingClientRect().right")
            title = page.eval_on_selector(f"#fig-{name} .gtitle", "e => e.getBoundingClientRect().right")
            if not title <= svg <= LAPTOP["width"]:
                wrong.append(f"{name}: the title ends at {title:.0f} px, the chart at {svg:.0f} px")
        assert wrong == [], "\n".join(wrong)
        assert fetched == [] and errors == [], (fetched, errors)
    finally:
        page.close()
