"""The walkthrough in a real browser: JupyterLab runs notebooks/walkthrough.ipynb, and a
person's clicks on the dashboard reach the engine and come back as new panels.

Set KVSCOPE_UPDATE_SCREENSHOT=1 to also rewrite docs/dashboard.png and
docs/dashboard_laptop.png (the README's pictures). KVSCOPE_E2E_NOTEBOOK=/path/to/other.ipynb drives the same scenario on
another notebook (its folder is served), e.g. while the walkthrough is being written.
"""
from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import pytest

from benchmarks.lab_harness import REPO, focus_pixels_js, screenshot_whole
from tests.e2e.cells import assert_cells_ran

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PROMPT = "The capital of France is"
DASHBOARD_TIMEOUT_MS = 240_000  # run all: kernel start, model load, the first draw
CELLS_TIMEOUT_MS = 600_000
ACTION_TIMEOUT_MS = 60_000      # one click -> one engine step on a shared 2-core machine
PANELS = ("kvs-queues", "kvs-block-pool", "kvs-slot-mapping")
FOCUS_PIXELS = focus_pixels_js('.kvs-dashboard [data-testid=kvs-pool-canvas]')
ALL_CELLS_RAN_JS = """() => { const cells = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt')];
    return cells.length > 0 && cells.every(p => /\\[\\d+\\]/.test(p.textContent)); }"""


def notebook_under_test() -> Path:
    override = os.environ.get("KVSCOPE_E2E_NOTEBOOK")
    return Path(override).resolve() if override else REPO / "notebooks" / "walkthrough.ipynb"


def data_step(scope, testid: str) -> int:
    return int(scope.get_by_test_id(testid).first.get_attribute("data-step"))


def wait_data_step(scope, testid: str, step: int) -> None:
    scope.locator(f'[data-testid="{testid}"][data-step="{step}"]').first.wait_for(timeout=ACTION_TIMEOUT_MS)


def click_step(scope, step_btn) -> None:
    """Click Step and wait until the queues panel shows the next step."""
    step = data_step(scope, "kvs-queues")
    step_btn.click()
    wait_data_step(scope, "kvs-queues", step + 1)


def open_drawer(scope) -> None:
    """The add-request form, presets and knobs: the drawer starts folded on a laptop's screen."""
    controls = scope.get_by_test_id("kvs-controls").first
    if controls.get_attribute("data-drawer") == "closed":
        scope.get_by_test_id("kvs-drawer-toggle").first.click()
    scope.get_by_test_id("kvs-add-form").first.wait_for(state="visible", timeout=ACTION_TIMEOUT_MS)


def panel_tops(page, dash) -> dict[str, float]:
    """Each watched panel's top in the window, with the dashboard scrolled to the top of the notebook."""
    dash.evaluate("el => el.scrollIntoView({block: 'start'})")
    page.wait_for_timeout(300)
    return {t: dash.get_by_test_id(t).first.bounding_box()["y"] for t in PANELS}


def timeline_bars(dash) -> list[dict]:
    """Every step drawn in the dashboard's timeline: its step, and its prefill / decode bar heights."""
    chart = dash.get_by_test_id("kvs-timeline-chart").first
    return chart.evaluate("""svg => [...svg.querySelectorAll('g.kvs-step-bar')]
        .map(g => ({step: Number(g.dataset.step),
                    prefill: g.querySelector('.kvs-bar-prefill')?.getBoundingClientRect().height || 0,
                    decode: g.querySelector('.kvs-bar-decode')?.getBoundingClientRect().height || 0}))""")


def latency_counts(scope) -> tuple[int, int]:
    """(requests with a first token, inter-token gaps) from the latency panel's header."""
    text = scope.get_by_test_id("kvs-latency").first.inner_text()
    m = re.search(r"(\d+) with a first token · (\d+) inter-token gaps?", text)
    assert m, text
    return int(m.group(1)), int(m.group(2))


PLOTTED = ("[data-testid=kvs-lat-ttft] rect, [data-testid=kvs-lat-itl] circle")


def plotted_points(scope) -> int:
    """Marks drawn in the latency charts (TTFT bars and ITL gap dots)."""
    return scope.get_by_test_id("kvs-latency").first.locator(PLOTTED).count()


def save_readme_picture(page, dash, step_btn) -> None:
    """docs/dashboard.png (and docs/dashboard_laptop.png, a 1366 px window): the whole
    dashboard with a few requests sharing a prefix."""
    open_drawer(dash)
    dash.get_by_test_id("kvs-chat-template").check()  # as a learner starts: the Instruct model's template on
    dash.get_by_test_id("kvs-max-tokens").fill("24")
    dash.get_by_test_id("kvs-prompt").fill("What is a paged KV cache?")
    dash.get_by_test_id("kvs-add-btn").click()
    dash.get_by_test_id("kvs-preset-shared_prefix").click()
    dash.locator(".kvs-card", has_text="capital of Italy").first.wait_for(timeout=ACTION_TIMEOUT_MS)
    for _ in range(2):
        click_step(dash, step_btn)
    screenshot_whole(page, dash, REPO / "docs" / "dashboard.png")
    # A laptop's dashboard: the drawer folded, as it starts on a 768 px high screen.
    dash.get_by_test_id("kvs-drawer-toggle").first.click()
    dash.get_by_test_id("kvs-add-form").first.wait_for(state="hidden", timeout=ACTION_TIMEOUT_MS)
    screenshot_whole(page, dash, REPO / "docs" / "dashboard_laptop.png", width=1366)


def test_walkthrough_dashboard_in_a_real_browser(tmp_path, lab_factory, page, lab_ui, save_screenshot):
    nb = notebook_under_test()
    assert nb.is_file(), f"{nb} does not exist: the e2e test drives the walkthrough notebook"
    root = tmp_path / "notebooks"
    shutil.copytree(nb.parent, root, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    timings: dict[str, float] = {}
    t0 = time.monotonic()

    server = lab_factory(root)
    page.set_viewport_size({"width": 1366, "height": 768})  # a laptop first; a desktop later
    ui = lab_ui(page, server)
    ui.open_notebook(nb.name)
    timings["lab_open_s"] = time.monotonic() - t0
    ui.run_all_cells()
    step_btn = page.locator(".kvs-dashboard").get_by_test_id("kvs-step-btn").first
    # The kernel idle once every cell has run: nothing else steps the engine.
    assert_cells_ran(ui, step_btn, DASHBOARD_TIMEOUT_MS, CELLS_TIMEOUT_MS)
    timings["run_all_s"] = time.monotonic() - t0 - timings["lab_open_s"]
    dash = page.locator(".kvs-dashboard").first
    dash.scroll_into_view_if_needed()
    save_screenshot(page, "walkthrough-1-loaded")

    # "Idle" also shows for a moment between two cells: wait until every code cell has run
    # (its prompt holds an execution count), then for chapter 14's 320-token prefill in the
    # timeline (the page may still be drawing the last steps), then for the shown step to settle.
    page.wait_for_function(ALL_CELLS_RAN_JS, timeout=CELLS_TIMEOUT_MS)
    ui.wait_kernel_idle(CELLS_TIMEOUT_MS)
    page.wait_for_function(
        "() => Number(document.querySelector('.kvs-dashboard .kvs-tok-max')?.textContent || 0) >= 300",
        timeout=CELLS_TIMEOUT_MS)
    settled = None
    while settled != data_step(dash, "kvs-queues"):
        settled = data_step(dash, "kvs-queues")
        page.wait_for_timeout(1500)
    # -- a laptop (1366x768): one compact control bar; queues, pool and slots above the fold --
    assert dash.get_by_test_id("kvs-controls").first.get_attribute("data-drawer") == "closed"
    tops = panel_tops(page, dash)
    assert all(top + 30 <= 768 for top in tops.values()), tops
    save_screenshot(page, "walkthrough-1b-laptop-fold")
    # -- the timeline shows every step: chapter 14's 320-token prefill next to 1-token decodes --
    bars = timeline_bars(dash)
    assert int(dash.locator(".kvs-tok-max").first.text_content()) >= 300
    decode_only = [b for b in bars if b["prefill"] == 0 and b["decode"] > 0]
    assert decode_only and bars[-1]["step"] - bars[0]["step"] + 1 == len(bars), bars
    assert min(b["decode"] for b in decode_only) >= 6, decode_only
    page.set_viewport_size({"width": 1920, "height": 1080})
    page.wait_for_timeout(400)
    bars = timeline_bars(dash)
    assert min(b["decode"] for b in bars if b["prefill"] == 0 and b["decode"] > 0) >= 6
    tops = panel_tops(page, dash)
    assert all(top + 30 <= 1080 for top in tops.values()), tops
    # -- TTFT/ITL: chapter 14's ids whole under the bars ("#budget2048-long", "#budget32-long") --
    ticks = dash.get_by_test_id("kvs-lat-ttft").first.locator(".kvs-lat-tick").all_text_contents()
    assert "#budget2048-long" in ticks and "#budget32-long" in ticks, ticks
    assert len(set(ticks)) == len(ticks) and not any("\u2026" in t for t in ticks), ticks
    open_drawer(dash)

    # -- add a request through the form: it appears in the waiting queue ------------------
    waiting = dash.get_by_test_id("kvs-queue-waiting")
    # The page may still be drawing the notebook's last cells (a reset restarts request ids):
    # wait until no waiting card holds the prompt, so the card that appears is the new request.
    page.wait_for_function(
        """([sel, text]) => ![...document.querySelectorAll(sel)].some(c => c.textContent.includes(text))""",
        arg=['.kvs-dashboard [data-testid="kvs-queue-waiting"] .kvs-card', PROMPT], timeout=ACTION_TIMEOUT_MS)
    dash.get_by_test_id("kvs-prompt").fill(PROMPT)
    dash.get_by_test_id("kvs-max-tokens").fill("6")
    dash.get_by_test_id("kvs-temperature").fill("0")
    dash.get_by_test_id("kvs-chat-template").uncheck()  # a plain completion: " Paris."
    dash.get_by_test_id("kvs-add-btn").click()
    new_card = waiting.locator(".kvs-card", has_text=PROMPT).last
    new_card.wait_for(timeout=ACTION_TIMEOUT_MS)
    rid = new_card.get_attribute("data-request-id")
    assert waiting.locator(f'[data-request-id="{rid}"]').count() == 1
    save_screenshot(page, "walkthrough-2-added")

    # -- Step: queues, block pool and slot mapping all move to the new step's data ----------
    before = {t: data_step(dash, t) for t in PANELS}
    assert len(set(before.values())) == 1, before
    ttft_before, itl_before = latency_counts(dash)
    points_before = plotted_points(dash)
    t_click = time.monotonic()
    step_btn.click()
    for testid in PANELS:
        wait_data_step(dash, testid, before[testid] + 1)
    timings["step_click_to_panels_s"] = time.monotonic() - t_click
    dash.get_by_test_id("kvs-slot-mapping").get_by_test_id(f"kvs-seg-{rid}").wait_for(timeout=ACTION_TIMEOUT_MS)
    seg_text = dash.get_by_test_id(f"kvs-seg-{rid}").inner_text()
    assert "prefill" in seg_text and "seq_len" in seg_text, seg_text
    dash.get_by_test_id("kvs-block-pool").get_by_test_id(f"kvs-bt-{rid}").wait_for(timeout=ACTION_TIMEOUT_MS)
    card = dash.get_by_test_id(f"kvs-req-{rid}").first
    assert card.locator("xpath=ancestor::*[@data-testid='kvs-queue-running']").count() == 1
    save_screenshot(page, "walkthrough-3-stepped")

    # -- linked: the panels are separate widget views, yet a hovered slot lights its block ----
    cell = dash.get_by_test_id(f"kvs-seg-{rid}").locator(".kvs-cell").last
    block = int(cell.get_attribute("data-block"))
    cell.hover()
    page.wait_for_function(f"() => ({FOCUS_PIXELS})({block}) > 40", timeout=ACTION_TIMEOUT_MS)
    assert "kvs-lit" in card.get_attribute("class")
    page.mouse.move(1, 1)
    # The notebook's stills are frozen, and say at which step (tests/widgets: clicks do nothing).
    still = page.locator('.kvs-panel[data-frozen="true"]').first  # may be off screen: its text, not its look
    assert re.fullmatch(r"frozen at step \d+", still.get_by_test_id("kvs-frozen-badge").text_content())

    # -- more steps: TTFT / ITL charts gain points ------------------------------------------
    output = card.locator(".kvs-output-text")
    for _ in range(10):  # the request has its first token and two more
        if "Paris" in output.inner_text() and latency_counts(dash)[1] >= itl_before + 2:
            break
        click_step(dash, step_btn)
    page.wait_for_function(
        """([ttft, itl]) => {
            const t = document.querySelector('.kvs-dashboard [data-testid="kvs-latency"]')?.textContent || "";
            const m = t.match(/(\\d+) with a first token · (\\d+) inter-token gaps?/);
            return m && Number(m[1]) > ttft && Number(m[2]) >= itl + 2;
        }""", arg=[ttft_before, itl_before], timeout=ACTION_TIMEOUT_MS)
    page.wait_for_function(
        """([n, sel]) => {
            const f = document.querySelector('.kvs-dashboard [data-testid="kvs-latency"]');
            return f && f.querySelectorAll(sel).length > n;
        }""", arg=[points_before, PLOTTED], timeout=ACTION_TIMEOUT_MS)
    assert plotted_points(dash) > points_before
    assert "Paris" in output.inner_text()  # SmolLM2, greedy: " Paris."
    dash.get_by_test_id("kvs-latency").first.scroll_into_view_if_needed()
    save_screenshot(page, "walkthrough-4-latency")

    # -- bad input: the engine's message shows inline and the dashboard keeps working --------
    error = dash.get_by_test_id("kvs-error")
    dash.get_by_test_id("kvs-prompt").fill("")
    dash.get_by_test_id("kvs-add-btn").click()
    page.locator('.kvs-dashboard [data-testid="kvs-error"]:visible', has_text="prompt").wait_for(
        timeout=ACTION_TIMEOUT_MS)
    dash.get_by_test_id("kvs-prompt").fill(PROMPT)
    dash.get_by_test_id("kvs-max-tokens").fill("0")
    dash.get_by_test_id("kvs-add-btn").click()
    page.locator('.kvs-dashboard [data-testid="kvs-error"]:visible', has_text="max_tokens").wait_for(
        timeout=ACTION_TIMEOUT_MS)
    error.scroll_into_view_if_needed()
    save_screenshot(page, "walkthrough-5-error")
    step_before_good = data_step(dash, "kvs-queues")
    step_btn.click()  # a good action clears the error
    error.wait_for(state="hidden", timeout=ACTION_TIMEOUT_MS)
    assert data_step(dash, "kvs-queues") >= step_before_good

    if os.environ.get("KVSCOPE_UPDATE_SCREENSHOT") == "1":
        save_readme_picture(page, dash, step_btn)

    kvs_errors = [e for e in page.console_errors if "kvs" in e.lower()]
    assert kvs_errors == [], kvs_errors
    timings["total_s"] = time.monotonic() - t0
    print("walkthrough e2e timings: " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))
