"""Each step at a glance, in headless chromium at two common screen sizes: the caption of a
preempting step names the victim and the reason, the token chart's bars stay readable when
the budget drops to 16, the timeline follows the window's width, and the history slider's
keys move the history without reaching the page (JupyterLab's shortcuts listen there; the
real Lab check is tests/e2e/test_lab_keyboard.py). Panels run their real ESM against a real
Session (tests/widgets/minifrontend.py)."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from explorer.ui.dashboard import SessionBinder

from .minifrontend import MiniFrontend

pytestmark = pytest.mark.slow

VIEWPORTS = [(1366, 768), (1920, 1080)]
GREEDY = {"temperature": 0.0, "ignore_eos": True}


@pytest.fixture(params=VIEWPORTS, ids=lambda v: f"{v[0]}x{v[1]}")
def glance(request, browser: Any, fresh_session: Any) -> Iterator[tuple[Any, MiniFrontend, SessionBinder]]:
    width, height = request.param
    s = fresh_session
    # A few steps at the default budget, then budget 16 on a 6-block pool: A (15 tokens),
    # B (40) and C (30) fill it, and when A needs a block B (the newest running) is preempted.
    s.reset(num_kv_blocks=7)
    s.set_budget(max_num_batched_tokens=2048)
    s.add_request("Hi", max_tokens=2, **GREEDY)
    s.run_until_idle()
    s.set_budget(max_num_batched_tokens=16)
    for k, n in enumerate((15, 40, 30)):
        s.add_request(list(range(4000 + 1000 * k, 4000 + 1000 * k + n)), max_tokens=30, **GREEDY)
    s.run_until_idle()
    binder = SessionBinder(s, ["controls", "timeline"])
    page = browser.new_page(viewport={"width": width, "height": height})
    front = MiniFrontend(page, binder.panels, body_width="auto")
    yield page, front, binder
    assert front.errors() == []
    binder.close()
    page.close()


def chart_box(page: Any, selector: str) -> list[dict]:
    return page.locator(f'[data-testid="kvs-timeline-chart"] {selector}').evaluate_all(
        "els => els.map((e) => { const r = e.getBoundingClientRect(); return {top: r.top, bottom: r.bottom, "
        "height: r.height, step: e.closest('[data-step]')?.dataset.step}; })")


def test_a_learner_reads_each_step_at_a_glance(glance) -> None:
    page, front, binder = glance
    s = binder.session
    page.wait_for_selector('[data-testid="kvs-timeline-chart"]')

    # -- the token chart: scaled to the batches, not to a budget of 2,048 in view ----------
    steps = binder.panels["timeline"].steps
    full = [str(st) for st, p, d, b in zip(steps["step"], steps["prefill"], steps["decode"], steps["budget"])
            if b == 16 and p + d == 16]
    assert full, steps
    bars = {b["step"]: b for b in chart_box(page, ".kvs-bar-prefill")}
    assert all(bars[st]["height"] > 80 for st in full), [bars[st] for st in full]  # a full 16-token batch
    decodes = chart_box(page, ".kvs-bar-decode")
    assert decodes and min(b["height"] for b in decodes) >= 6  # a single decode token stays visible
    assert "budget 2048" in page.text_content('[data-testid="kvs-budget-offscale"]')
    # Preemption markers sit in their own lane, above every budget line.
    lines = chart_box(page, ".kvs-budget-line") + chart_box(page, ".kvs-budget-offscale")
    marks = chart_box(page, ".kvs-preempt-mark")
    assert lines and marks and max(m["bottom"] for m in marks) <= min(x["top"] for x in lines)

    # -- the timeline is as wide as its panel, and follows the window ---------------------
    def widths() -> tuple[float, float]:
        return page.evaluate("""() => {
            const h = document.querySelector('[data-testid=kvs-timeline] .kvs-timeline-svg');
            return [h.clientWidth, h.querySelector('svg').getBoundingClientRect().width]; }""")
    holder, chart = widths()
    vw, vh = page.viewport_size["width"], page.viewport_size["height"]
    assert abs(holder - chart) <= 1 and chart > vw - 80
    page.set_viewport_size({"width": vw - 400, "height": vh})
    page.wait_for_function("""(w) => { const s = document.querySelector('[data-testid=kvs-timeline-chart]');
                                      return Math.abs(s.getBoundingClientRect().width - w) <= 1; }""",
                           arg=page.evaluate("() => document.querySelector('[data-testid=kvs-timeline] "
                                             ".kvs-timeline-svg').clientWidth"))
    narrow_holder, narrow_chart = widths()
    assert narrow_chart < chart - 300 and abs(narrow_holder - narrow_chart) <= 1

    # -- the preempting step's caption: who was preempted, and why -------------------------
    (pre,) = [e for e in s.history if e.record and e.record["preempted"]][:1]
    victim = pre.record["preempted"][0]
    assert page.locator(f'.kvs-preempt-mark[data-step="{pre.step}"]').count() == 1
    page.click(f'[data-testid="kvs-timeline-chart"] g.kvs-step-bar[data-step="{pre.step}"] rect')
    page.wait_for_function("(s) => document.querySelector('[data-testid=kvs-controls]').dataset.step === String(s)",
                           arg=pre.step)
    # Scrubbed back, the whole run stays drawn, with the cursor on the shown step.
    page.wait_for_selector(f'[data-testid="kvs-timeline-cursor"][data-step="{pre.step}"]')
    assert page.locator('[data-testid="kvs-timeline-chart"] g.kvs-step-bar').count() == len(steps["step"])
    assert page.get_attribute('[data-testid="kvs-timeline-chart"]', "data-last-step") == str(steps["step"][-1])
    caption = page.inner_text('[data-testid="kvs-caption"]')
    assert caption.startswith(f"step {pre.step}: ")
    assert f"needed a new block and none was free \u2192 preempted #{victim} (newest running)" in caption, caption
    # The bar's tooltip says the same.
    page.hover(f'[data-testid="kvs-timeline-chart"] g.kvs-step-bar[data-step="{pre.step}"] rect')
    tip = page.inner_text('[data-testid="kvs-timeline-tooltip"]')
    assert f"step {pre.step}:" in tip and f"preempted #{victim}" in tip and "none was free" in tip
    # Scrubbed back, the budget knob shows what that step ran under (read-only).
    assert page.input_value('[data-testid="kvs-budget-tokens"]') == "16"
    assert page.is_disabled('[data-testid="kvs-budget-tokens"]')
    assert f"step {pre.step} ran under these" in page.inner_text('[data-testid="kvs-budget-note"]')

    # -- one very slow step (a first plotly draw, a compile) does not flatten the ms chart --
    slow = steps["step"][len(steps["step"]) // 2]
    k = steps["step"].index(slow)
    forward = list(steps["forward"])
    normal = sorted(forward)[len(forward) // 2]
    forward[k] = max(forward) * 50 + 1000.0
    binder.panels["timeline"].steps = {**steps, "forward": forward}
    front.sync()
    page.wait_for_selector(f'[data-testid="kvs-timeline-chart"] .kvs-ms-outlier[data-step="{slow}"]')
    assert page.get_attribute('[data-testid="kvs-timeline-chart"] .kvs-ms-max', "data-cut") == "true"
    parts = page.locator('[data-testid="kvs-timeline-chart"] .kvs-time-part').evaluate_all(
        "rs => rs.map(r => [r.dataset.step, r.getBoundingClientRect().height])")
    per_step: dict[str, float] = {}
    for st, h in parts:
        per_step[st] = per_step.get(st, 0.0) + h
    # The axis fits the other steps (the 95th percentile's reaches ~70 of 80 px); drawn linear
    # up to the outlier, every other bar would be under 2 px.
    others = [h for st, h in per_step.items() if st != str(slow)]
    assert normal > 0 and max(others) >= 40, per_step
    assert per_step[str(slow)] <= 81  # drawn to the cut, its real time written over it
    binder.panels["timeline"].steps = steps
    front.sync()

    # -- the slider's keys move the history and stop there -------------------------------
    page.evaluate("""() => { window.__kvsKeysOutside = 0;
        document.addEventListener('keydown', () => { window.__kvsKeysOutside += 1; }); }""")
    label = '[data-testid="kvs-history-label"]'
    last = s.current.step
    page.focus('[data-testid="kvs-history-slider"]')
    for key, expected in (("End", last), ("ArrowLeft", last - 1), ("ArrowLeft", last - 2), ("ArrowRight", last - 1),
                          ("Home", 0), ("ArrowUp", 1)):
        page.keyboard.press(key)
        page.wait_for_function("([sel, text]) => document.querySelector(sel).textContent === text",
                               arg=[label, f"step {expected} of {last}"])
        assert binder.view_index == (None if expected == last else expected)
    assert page.evaluate("() => window.__kvsKeysOutside") == 0


def test_a_fresh_form_hints_what_to_do_and_outlines_the_bad_input(browser: Any, fresh_session: Any) -> None:
    binder = SessionBinder(fresh_session, ["controls", "timeline", "queues"])
    page = browser.new_page(viewport={"width": 1366, "height": 768})
    front = MiniFrontend(page, binder.panels, body_width="auto")
    try:
        # Nothing has run: hints instead of empty axes, and Step says there is nothing to step.
        assert page.inner_text('[data-testid="kvs-timeline-empty"]') == "no steps yet: add a request and press Step"
        assert page.locator('[data-testid="kvs-timeline-chart"]').count() == 0
        assert page.inner_text('[data-testid="kvs-caption"]') == "no steps yet: add a request and press Step"
        assert not page.is_visible('[data-testid="kvs-notice"]')
        page.click('[data-testid="kvs-step-btn"]')
        page.wait_for_selector('[data-testid="kvs-notice"]:visible')
        assert "nothing to step: add a request" in page.inner_text('[data-testid="kvs-notice"]')
        # A laptop screen: one compact bar; the form and the knobs wait folded in the drawer.
        assert page.get_attribute('[data-testid="kvs-controls"]', "data-drawer") == "closed"
        assert not page.is_visible('[data-testid="kvs-add-form"]')
        assert page.inner_text('[data-testid="kvs-engine-badge"]') == "kvscope"
        page.click('[data-testid="kvs-drawer-toggle"]')
        page.wait_for_selector('[data-testid="kvs-add-form"]:visible')
        # The model's tokenizer has a chat template: the switch is on by default.
        assert page.is_checked('[data-testid="kvs-chat-template"]')
        # An emptied max_tokens is an error naming it, not a silent 16.
        page.fill('[data-testid="kvs-max-tokens"]', "")
        page.click('[data-testid="kvs-add-btn"]')
        page.wait_for_selector('[data-testid="kvs-error"]:visible')
        assert "max_tokens is empty" in page.inner_text('[data-testid="kvs-error"]')
        assert page.get_attribute('[data-testid="kvs-max-tokens"]', "aria-invalid") == "true"
        assert fresh_session.current.snapshot["queues"]["waiting"] == []
        page.fill('[data-testid="kvs-max-tokens"]', "16")
        # A bad field: the engine's message, and that input outlined until it is edited.
        page.fill('[data-testid="kvs-top-p"]', "1.5")
        page.click('[data-testid="kvs-add-btn"]')
        page.wait_for_selector('[data-testid="kvs-error"]:visible')
        assert "top_p" in page.inner_text('[data-testid="kvs-error"]')
        assert page.get_attribute('[data-testid="kvs-top-p"]', "aria-invalid") == "true"
        outline = page.eval_on_selector('[data-testid="kvs-top-p"]', "e => getComputedStyle(e).outlineColor")
        assert outline == "rgb(211, 47, 47)"
        assert page.locator(".kvs-invalid").count() == 1
        assert not page.is_visible('[data-testid="kvs-notice"]')  # the next action cleared the notice
        page.fill('[data-testid="kvs-top-p"]', "1")
        assert page.locator(".kvs-invalid").count() == 0
        page.click('[data-testid="kvs-add-btn"]')
        page.wait_for_selector('[data-testid="kvs-error"]', state="hidden")
        (req,) = fresh_session.current.snapshot["queues"]["waiting"]
        assert req["prompt_text"].startswith("<|im_start|>") and "The capital of France is" in req["prompt_text"]
        page.click('[data-testid="kvs-step-btn"]')
        page.wait_for_selector('[data-testid="kvs-timeline-chart"]')
        assert page.inner_text('[data-testid="kvs-caption"]').startswith("step 1: #0 prefill all")
        # The user's words on the queue card; the template folded into a dimmed chip.
        card = page.locator('[data-testid="kvs-req-0"]')
        assert card.locator('[data-testid="kvs-user-words"]').inner_text() == "The capital of France is"
        assert "<|im_start|>" not in card.locator(".kvs-text").inner_text()
        card.locator('[data-testid="kvs-tmpl-chip"]').click()
        assert "<|im_start|>" in card.locator(".kvs-text").inner_text()
        assert card.locator(".kvs-tmpl-tok").first.inner_text() == "<|im_start|>"
        # A pool knob says it is not applied until Apply rebuilds the engine (Enter only moves to
        # Apply); Apply asks first, since the run would go.
        blocks = fresh_session.config.num_kv_blocks
        page.fill('[data-testid="kvs-pool-blocks"]', "6")
        assert "not applied yet" in page.inner_text('[data-testid="kvs-pool-note"]')
        assert "rebuilds the engine" in page.inner_text('[data-testid="kvs-pool-apply"]')
        assert fresh_session.config.num_kv_blocks == blocks
        page.press('[data-testid="kvs-pool-blocks"]', "Enter")
        assert fresh_session.config.num_kv_blocks == blocks
        page.keyboard.press("Enter")  # on Apply now
        page.click('[data-testid="kvs-rebuild-discard"]')
        page.wait_for_function("() => document.querySelector('[data-testid=kvs-pool-note]').textContent === ''")
        assert fresh_session.config.num_kv_blocks == 6 and fresh_session.history[-1].step == 0
        assert page.input_value('[data-testid="kvs-pool-blocks"]') == "6"
        assert front.errors() == []
    finally:
        binder.close()
        page.close()
