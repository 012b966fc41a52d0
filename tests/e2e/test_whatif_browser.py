"""The what-if view in headless chromium: a real recording (kvscope's engine, the tiny model)
replayed as recorded and with a smaller pool, side by side on one slider; the first parting is
marked on the strip and said in words, and the slider, the step buttons and the jump move both
runs together (tests/widgets/minifrontend.py stands in for JupyterLab's widget manager)."""
from __future__ import annotations

import pytest

from explorer.core.recording import Recording, save_recording
from tests.whatif.conftest import CONFIG, drive
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
    page = browser.new_page(viewport={"width": 1200, "height": 900})
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
