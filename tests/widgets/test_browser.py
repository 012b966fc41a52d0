"""The panels' JavaScript in headless chromium, wired to a real Session.

A plain HTML page (tests/widgets/minifrontend.py) stands in for JupyterLab's widget
manager, so this checks the panels themselves: clicks become actions, state changes
redraw, errors show inline. The JupyterLab end-to-end suite is tests/e2e.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from explorer.ui.dashboard import SessionBinder

from .minifrontend import MiniFrontend

pytestmark = pytest.mark.slow

PANELS = ["controls", "queues", "sampler", "blocks", "slots", "attention", "timeline"]
TESTIDS = {"queues": "kvs-queues", "sampler": "kvs-sampler", "blocks": "kvs-block-pool",
           "slots": "kvs-slot-mapping", "attention": "kvs-attention", "timeline": "kvs-timeline",
           "controls": "kvs-controls"}


@pytest.fixture
def ui(browser: Any, fresh_session: Any) -> Iterator[tuple[Any, MiniFrontend, SessionBinder]]:
    binder = SessionBinder(fresh_session, PANELS)
    page = browser.new_page(viewport={"width": 1200, "height": 1000})
    front = MiniFrontend(page, binder.panels)
    yield page, front, binder
    assert front.errors() == []  # no uncaught JavaScript error in any test
    binder.close()
    page.close()


def steps(page: Any) -> dict[str, str]:
    return {name: page.get_attribute(f'[data-testid="{tid}"]', "data-step") for name, tid in TESTIDS.items()}


def wait_step(page: Any, step: int, timeout: float = 30_000) -> None:
    page.wait_for_function(
        "(s) => [...document.querySelectorAll('.kvs-panel')].every((p) => p.dataset.step === String(s))",
        arg=step, timeout=timeout)


def step_and_show(ui: tuple[Any, MiniFrontend, SessionBinder], steps: int) -> None:
    """Step the session from Python (outside any browser action), send the change to the page
    and wait until every panel shows the new step."""
    page, front, binder = ui
    binder.session.step(steps)
    front.sync()
    wait_step(page, binder.session.current.step)


def hover_block_1(page: Any) -> tuple[str, dict[str, float]]:
    """Hover block 1 of the pool canvas (the second cell of the first row: 26 px cells for a
    pool this small) and wait until its tooltip has the token ids, i.e. Python answered the
    hover's block_detail; returns (the tooltip's text, the canvas's box)."""
    canvas = page.locator('[data-testid="kvs-pool-canvas"]')
    canvas.scroll_into_view_if_needed()
    box = canvas.bounding_box()
    page.mouse.move(box["x"] + 2, box["y"] + 2)
    page.mouse.move(box["x"] + 26 + 13, box["y"] + 13)
    page.wait_for_function("() => document.querySelector('[data-testid=kvs-block-tooltip]')"
                           ".textContent.includes('tokens')", timeout=10_000)
    return page.inner_text('[data-testid="kvs-block-tooltip"]'), box


def test_every_panel_renders_with_its_test_id_and_step(ui) -> None:
    page, _, _ = ui
    assert set(steps(page).values()) == {"0"}
    for tid in ["kvs-step-btn", "kvs-add-form", "kvs-error", "kvs-history-slider", "kvs-pool-canvas",
                "kvs-block-tables", "kvs-batch-strip", "kvs-attn-heads", "kvs-timeline-empty", "kvs-caption"]:
        assert page.locator(f'[data-testid="{tid}"]').count() == 1, tid
    assert not page.is_visible('[data-testid="kvs-error"]')
    assert page.locator('[data-testid="kvs-head-3"]').count() == 1  # 4 query heads ...
    assert page.locator('[data-testid="kvs-kv-group-1"] button').count() == 2  # ... 2 per KV head


def test_form_add_bad_input_inline_then_steps_by_clicks(ui) -> None:
    page, _, binder = ui
    page.fill('[data-testid="kvs-prompt"]', "")
    page.click('[data-testid="kvs-add-btn"]')
    page.wait_for_selector('[data-testid="kvs-error"]:visible')
    assert "prompt" in page.inner_text('[data-testid="kvs-error"]')
    page.fill('[data-testid="kvs-prompt"]', "The capital of France is")
    page.fill('[data-testid="kvs-max-tokens"]', "6")
    page.click('[data-testid="kvs-add-btn"]')
    page.wait_for_selector('[data-testid="kvs-queue-waiting"] .kvs-card')
    assert not page.is_visible('[data-testid="kvs-error"]')
    # Three quick clicks: all run, one after another.
    for _ in range(3):
        page.click('[data-testid="kvs-step-btn"]')
    wait_step(page, 3)
    assert len(binder.session.history) == 4
    assert page.get_attribute('[data-testid="kvs-controls"]', "data-pending") == "0"
    rid = page.get_attribute('[data-testid="kvs-queue-running"] .kvs-card', "data-request-id")
    assert page.locator(f'[data-testid="kvs-seg-{rid}"] .kvs-cell').count() == 1  # a decode row
    assert page.locator('[data-testid="kvs-sampler-chosen"]').count() == 1
    assert page.is_visible('[data-testid="kvs-attn-bars"]')  # a decode step: weights over the keys


def test_play_steps_until_idle_one_result_at_a_time(ui) -> None:
    page, front, binder = ui
    s = binder.session
    s.add_request("Hello", max_tokens=8, temperature=0.0, ignore_eos=True)
    s.add_request("Hello there", max_tokens=5, temperature=0.0, ignore_eos=True)
    binder.panels["controls"].play_interval_ms = 0
    front.sync()  # changes made from Python outside a browser action
    page.click('[data-testid="kvs-play-btn"]')
    page.wait_for_function("() => document.querySelector('[data-testid=kvs-controls]').dataset.playing === 'false'",
                           timeout=60_000)
    assert not s.engine.has_unfinished_requests()
    assert len(s.history) == 9  # 8 steps, and Play stopped by itself once idle
    wait_step(page, 8)


def test_slider_scrubs_every_panel_and_live_returns(ui) -> None:
    page, _, binder = ui
    binder.session.add_request("The capital of France is", max_tokens=6, temperature=0.0)
    step_and_show(ui, 5)
    page.evaluate("""() => { const s = document.querySelector('[data-testid=kvs-history-slider]');
                             s.value = '2'; s.dispatchEvent(new Event('input')); }""")
    wait_step(page, 2)
    assert page.get_attribute('[data-testid="kvs-queues"]', "data-live") == "false"
    assert page.inner_text('[data-testid="kvs-history-label"]') == "step 2 of 5"
    page.click('[data-testid="kvs-live-btn"]')
    wait_step(page, 5)
    page.click('[data-testid="kvs-timeline-chart"] g.kvs-step-bar[data-step="3"] rect')
    wait_step(page, 3)


def test_steps_scheduled_ahead_are_marked_on_the_timeline_and_in_the_caption(ui) -> None:
    """Async scheduling (vLLM's default on a GPU) on kvscope's engine: every step after the first
    was scheduled while the one before still ran. Its bar is underlined, the legend names the
    mark, and the bar's tooltip and the caption say which step still ran and what the
    placeholder inputs turned out to be. Pressing Step still shows one step at a time."""
    page, _, binder = ui
    binder.session.add_request("The capital of France is", max_tokens=8, temperature=0.0)
    step_and_show(ui, 2)   # synchronous: nothing is marked, and the legend does not name the mark
    assert page.locator('[data-testid="kvs-timeline-chart"] .kvs-ahead-mark').count() == 0
    assert page.locator('[data-testid="kvs-ahead-key"]').is_hidden()
    binder.session.reset(async_scheduling=True)
    binder.session.add_request("The capital of France is", max_tokens=8, temperature=0.0)
    for step in range(1, 6):
        page.click('[data-testid="kvs-step-btn"]')
        wait_step(page, step)
    assert page.locator('[data-testid="kvs-timeline-chart"] .kvs-ahead-mark').count() == 4   # steps 2-5
    assert page.locator('[data-testid="kvs-ahead-key"]').is_visible()
    token = binder.session.history[3].record["scheduled_ahead"]["placeholders"]["0"]
    page.hover('[data-testid="kvs-timeline-chart"] g.kvs-step-bar[data-step="3"] rect')
    tip = page.inner_text('[data-testid="kvs-timeline-tooltip"]')
    assert "step 3:" in tip and "scheduled while step 2 still ran (async scheduling)" in tip, tip
    assert f"1 decode input was a placeholder for step 2's token, filled once it landed (#0 \u2192 {token})" in tip
    caption = page.inner_text('[data-testid="kvs-caption"]')
    assert caption.startswith("step 5: ") and "scheduled while step 4 still ran" in caption, caption


def test_block_hover_shows_tokens_and_click_pins(ui) -> None:
    page, _, binder = ui
    binder.session.add_request("The capital of France is a city with a long history", max_tokens=3, temperature=0.0)
    step_and_show(ui, 1)
    tip, box = hover_block_1(page)
    assert tip.startswith("block 1") and "owner #0" in tip and "785" in tip
    page.mouse.click(box["x"] + 26 + 13, box["y"] + 13)
    page.wait_for_selector('[data-testid="kvs-block-detail"] .kvs-tok')
    assert "The" in page.inner_text('[data-testid="kvs-block-detail"]')


def test_a_same_step_hit_has_its_own_highlight_legend_entry_and_detail(ui) -> None:
    # Both requests arrive before the step, so B (admitted after A in step 1) hits A's two
    # shared blocks while this very step computes them: a same-step hit.
    page, _, binder = ui
    s = binder.session
    shared = list(range(1000, 1032))  # two full blocks of 16
    s.add_request([*shared, 7, 8, 9], max_tokens=2, temperature=0.0, ignore_eos=True)
    rid_b = s.add_request([*shared, 10, 11], max_tokens=2, temperature=0.0, ignore_eos=True)
    step_and_show(ui, 1)
    rec = s.current.record
    assert rec["blocks"]["same_step_hits"] == [1, 2] and rec["blocks"]["allocated"] == [1, 2, 3, 4]
    leg = page.locator('[data-testid="kvs-leg-ev-same_step_hits"]')
    assert leg.inner_text().strip() == "same-step hit 2"
    assert "computed in this same step" in leg.get_attribute("title")
    assert "before any layer reads it" in leg.get_attribute("title")
    assert page.inner_text('[data-testid="kvs-leg-ev-hits"]').strip() == "prefix hit 2"
    # B's block table marks its two hit blocks as same-step hits; A's table marks nothing.
    row = page.locator(f'[data-testid="kvs-bt-{rid_b}"]')
    assert row.locator(".kvs-bt-same-step").evaluate_all("els => els.map((e) => e.dataset.block)") == ["1", "2"]
    assert "same-step hit" in row.locator(".kvs-bt-same-step").first.get_attribute("title")
    assert page.locator(".kvs-bt-hit, .kvs-bt-same-step").count() == 2
    # On the canvas a same-step block is drawn in its own colour (teal, dashed and striped);
    # block 3 (only allocated) and the ordinary-hit colour (blue) show none of it.
    counts = page.evaluate("""() => {
        const c = document.querySelector('[data-testid=kvs-pool-canvas]');
        const ctx = c.getContext('2d'), cell = 26;
        const count = (i, [r, g, b]) => {
            const d = ctx.getImageData(i * cell, 0, cell, cell).data; let n = 0;
            for (let k = 0; k < d.length; k += 4)
                if (Math.abs(d[k] - r) < 12 && Math.abs(d[k + 1] - g) < 12 && Math.abs(d[k + 2] - b) < 12) n++;
            return n; };
        return { same1: count(1, [0, 137, 123]), same2: count(2, [0, 137, 123]),
                 alloc3: count(3, [0, 137, 123]), blue1: count(1, [21, 101, 192]) }; }""")
    assert counts["same1"] > 20 and counts["same2"] > 20, counts
    assert counts["alloc3"] == 0 and counts["blue1"] == 0, counts
    # Hover: the tooltip names the event and says why it is safe; a click pins the detail.
    tip, box = hover_block_1(page)
    assert "this step: allocated, prefix hit, same-step hit, cached" in tip
    assert "written by this step's forward before any layer reads it" in tip
    page.mouse.click(box["x"] + 26 + 13, box["y"] + 13)
    page.wait_for_selector('[data-testid="kvs-block-detail-events"]')
    detail = page.inner_text('[data-testid="kvs-block-detail-events"]')
    assert "same-step hit" in detail and "computed in this same step" in detail
    # The next step has no same-step hit: the count drops back to 0.
    step_and_show(ui, 1)
    assert page.inner_text('[data-testid="kvs-leg-ev-same_step_hits"]').strip() == "same-step hit 0"


def test_attention_head_buttons_reprobe(ui) -> None:
    page, _, binder = ui
    binder.session.add_request("The capital of France is", max_tokens=4, temperature=0.0)
    step_and_show(ui, 1)
    page.click('[data-testid="kvs-head-3"]')
    page.wait_for_selector('[data-testid="kvs-head-3"].kvs-on')
    assert binder.panels["attention"].head == 3
    assert page.locator('[data-testid="kvs-kv-group-1"].kvs-active').count() == 1
    page.select_option('[data-testid="kvs-attn-layer"]', "1")
    page.wait_for_function("() => document.querySelector('[data-testid=kvs-attention] .kvs-sub')"
                           ".textContent.includes('layer 1')")


def test_pool_of_4096_blocks_redraws_fast(ui) -> None:
    page, front, binder = ui
    s = binder.session
    s.reset(num_kv_blocks=4096)
    for i in range(8):
        s.add_request(f"Story number {i} " * 10, max_tokens=4, temperature=0.0)
    s.step(2)
    front.sync()
    page.wait_for_function("() => document.querySelector('[data-testid=kvs-block-pool]').dataset.step === '2'")
    per_draw_ms = page.evaluate("""() => {
        const c = document.querySelector('[data-testid=kvs-pool-canvas]');
        const r = c.getBoundingClientRect(); const t0 = performance.now();
        for (let i = 0; i < 30; i++) c.dispatchEvent(new MouseEvent('mousemove',
            {clientX: r.left + 5 + 10 * i, clientY: r.top + 5 + (i % 5) * 10, bubbles: true}));
        return (performance.now() - t0) / 30; }""")
    assert per_draw_ms < 50, f"a hover redraw of 4,096 blocks took {per_draw_ms:.1f} ms"


def test_budget_knob_applies_live_and_a_rejected_value_springs_back(ui) -> None:
    page, _, binder = ui
    knob = '[data-testid="kvs-budget-tokens"]'
    page.fill(knob, "32")
    page.dispatch_event(knob, "change")
    page.wait_for_function("() => document.querySelector('[data-testid=kvs-controls]').dataset.pending === '0'")
    assert binder.session.engine.config.max_num_batched_tokens == 32
    page.fill(knob, "0")
    page.dispatch_event(knob, "change")
    page.wait_for_selector('[data-testid="kvs-error"]:visible')
    assert "max_num_batched_tokens" in page.inner_text('[data-testid="kvs-error"]')
    page.wait_for_function("() => document.querySelector('[data-testid=kvs-budget-tokens]').value === '32'")
    assert page.is_checked('[data-testid="kvs-budget-chunked"]')
    # A plain click: the panel redraws its knobs from the engine's answer, which may land
    # before Playwright's own check of the box's state.
    page.click('[data-testid="kvs-budget-chunked"]')
    page.wait_for_function("() => document.querySelector('[data-testid=kvs-controls]').dataset.pending === '0'")
    assert binder.session.engine.config.enable_chunked_prefill is False


def test_gantt_rows_are_labelled_whole_or_cut_in_the_middle(ui) -> None:
    page, _, binder = ui
    s = binder.session
    s.add_request("Hi", max_tokens=2, temperature=0.0, request_id="budget2048-short-1")
    s.add_request("Hello", max_tokens=2, temperature=0.0, request_id="a-very-long-request-name-from-a-script")
    step_and_show(ui, 2)
    labels = page.locator('[data-testid="kvs-timeline-chart"] text.kvs-gantt-label')
    assert labels.evaluate_all("els => els.map((e) => e.textContent)") == [
        "#budget2048-short-1", "#a-very-lo\u2026-a-script"]
    chart = page.locator('[data-testid="kvs-timeline-chart"]').bounding_box()
    for i in range(labels.count()):  # the margin fits them: none starts left of the chart
        assert labels.nth(i).bounding_box()["x"] >= chart["x"]
