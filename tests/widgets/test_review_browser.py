"""What a real-browser review at a laptop's size (1366x768) found, each checked in headless
chromium against the panels' real ESM and a real Session (tests/widgets/minifrontend.py):
a rebuild that asks first, selections that do not outlive their engine, the history slider
under fast keys, the attention panel's words at a scrubbed step, and a status line that is
never cut. Each of these failed on the code before the fix (the test names say what)."""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from explorer.export import export_html
from explorer.ui.dashboard import SessionBinder

from .conftest import BASE_CONFIG
from .minifrontend import MiniFrontend

pytestmark = pytest.mark.slow

PANELS = ["controls", "queues", "sampler", "blocks", "slots", "attention"]
LAPTOP = {"width": 1366, "height": 768}


# At 1366 px JupyterLab leaves a notebook's output about this wide (its side bar and margins).
LAB_OUTPUT_WIDTH_AT_1366 = "1040px"
# A kernel's answer to a browser action comes back after a round trip (JupyterLab: tens of ms).
KERNEL_ROUND_TRIP_MS = 80


@pytest.fixture
def ui(browser: Any, fresh_session: Any, tmp_path: Path) -> Iterator[tuple[Any, MiniFrontend, SessionBinder]]:
    binder = SessionBinder(fresh_session, PANELS, run_writer=export_html)
    binder.save_dir = tmp_path
    page = browser.new_page(viewport=LAPTOP)
    front = MiniFrontend(page, binder.panels, body_width=LAB_OUTPUT_WIDTH_AT_1366, latency_ms=KERNEL_ROUND_TRIP_MS)
    yield page, front, binder
    assert front.errors() == []
    binder.close()
    page.close()
    fresh_session.reset(**BASE_CONFIG)


def wait_step(page: Any, step: int) -> None:
    page.wait_for_function(
        "(s) => [...document.querySelectorAll('.kvs-panel')].every((p) => p.dataset.step === String(s))",
        arg=step, timeout=30_000)


def idle(page: Any) -> None:
    # No action sent yet leaves data-pending unset.
    page.wait_for_function("() => (document.querySelector('[data-testid=kvs-controls]').dataset.pending || '0')"
                           " === '0'", timeout=60_000)


def a_run(front: MiniFrontend, binder: SessionBinder, steps: int = 3) -> None:
    s = binder.session
    s.add_request("The capital of France is", max_tokens=12, temperature=0.0, ignore_eos=True)
    s.add_request("Hello there, how are", max_tokens=12, temperature=0.0, ignore_eos=True)
    s.step(steps)
    front.sync()
    wait_step(front.page, steps)


def open_drawer(page: Any) -> None:
    if page.get_attribute('[data-testid="kvs-controls"]', "data-drawer") != "open":
        page.click('[data-testid="kvs-drawer-toggle"]')


def test_enter_in_the_pool_field_keeps_the_run_and_apply_asks_before_it_rebuilds(ui, tmp_path: Path) -> None:
    page, front, binder = ui
    s = binder.session
    a_run(front, binder)
    open_drawer(page)
    page.fill('[data-testid="kvs-pool-blocks"]', "40")
    page.press('[data-testid="kvs-pool-blocks"]', "Enter")
    page.wait_for_timeout(300)  # what Enter would have started (a reset action) has had time to land
    idle(page)
    # Enter moved to Apply, and nothing was rebuilt: the run and its 4 entries are still there.
    assert s.engine.config.num_kv_blocks == 48 and len(s.history) == 4
    assert page.evaluate("() => document.activeElement.dataset.testid") == "kvs-pool-apply"
    assert "not applied yet" in page.inner_text('[data-testid="kvs-pool-note"]')
    # Apply asks first and names what would go; Cancel keeps it all.
    page.click('[data-testid="kvs-pool-apply"]')
    page.wait_for_selector('[data-testid="kvs-rebuild-confirm"]:visible')
    question = page.inner_text('[data-testid="kvs-rebuild-text"]')
    assert "3 steps and 2 requests, 2 of them unfinished" in question, question
    page.click('[data-testid="kvs-rebuild-cancel"]')
    assert not page.is_visible('[data-testid="kvs-rebuild-confirm"]')
    assert s.engine.config.num_kv_blocks == 48 and len(s.history) == 4
    # Save, then rebuild: the run is in an HTML export that the notice names, the engine is new.
    page.click('[data-testid="kvs-pool-apply"]')
    page.click('[data-testid="kvs-rebuild-save"]')
    idle(page)
    wait_step(page, 0)
    assert s.engine.config.num_kv_blocks == 40 and len(s.history) == 1
    saved = list(tmp_path.glob("kvscope-run-*.html"))
    assert len(saved) == 1 and saved[0].stat().st_size > 10_000
    notice = page.inner_text('[data-testid="kvs-notice"]')
    assert str(saved[0]) in notice and "(3 steps and 2 requests, 2 of them unfinished)" in notice, notice
    assert "))" not in notice   # no brackets inside brackets
    # With nothing to lose, Reset asks nothing.
    page.click('[data-testid="kvs-reset-btn"]')
    idle(page)
    assert not page.is_visible('[data-testid="kvs-rebuild-confirm"]')


def test_a_rebuild_clears_every_selection_and_pin_of_the_old_engine(ui) -> None:
    page, front, binder = ui
    s = binder.session
    a_run(front, binder)
    # Pin request 1 everywhere: its queue card (sampler and attention follow).
    page.click('[data-testid="kvs-queue-running"] .kvs-card[data-request-id="1"]')
    idle(page)
    assert binder.panels["attention"].request_id == "1" and binder.panels["sampler"].request_id == "1"
    page.wait_for_selector('.kvs-card[data-request-id="1"].kvs-lit')
    open_drawer(page)
    page.click('[data-testid="kvs-reset-btn"]')
    page.click('[data-testid="kvs-rebuild-discard"]')
    idle(page)
    wait_step(page, 0)
    assert "3 steps and 2 requests" in page.inner_text('[data-testid="kvs-notice"]')
    # The new engine's ids start at 0 again: two new requests take "0" and "1".
    s.add_request("Once upon a time", max_tokens=6, temperature=0.0)
    s.add_request("A B C D", max_tokens=6, temperature=0.0)
    s.step(1)
    front.sync()
    wait_step(page, 1)
    att, smp = binder.panels["attention"], binder.panels["sampler"]
    assert "does not exist" not in att.message and att.request_id == "0", att.message
    assert smp.request_id == "0" and "not sampled" not in page.inner_text('[data-testid="kvs-sampler"]')
    assert binder.panels["queues"].selected == ""
    # The old pin on "1" lights nothing of the new engine's request "1".
    assert page.locator(".kvs-card.kvs-lit, .kvs-card.kvs-selected").count() == 0


def test_attention_of_a_request_added_later_says_so_at_a_scrubbed_step(ui) -> None:
    page, front, binder = ui
    s = binder.session
    s.add_request("The capital of France is", max_tokens=12, temperature=0.0, ignore_eos=True)
    s.step(2)
    late = s.add_request("Hello there, how are", max_tokens=12, temperature=0.0, ignore_eos=True)
    s.step(2)
    front.sync()
    wait_step(page, 4)
    page.click(f'[data-testid="kvs-queue-running"] .kvs-card[data-request-id="{late}"]')
    idle(page)
    binder.scrub(1)  # step 1: request 0 holds KV, the late one does not exist yet
    front.sync()
    wait_step(page, 1)
    text = page.inner_text('[data-testid="kvs-attention"]')
    assert f"#{late} did not exist yet at step 1" in text, text
    assert "no running request has KV" not in text
    assert "1 request held KV then (#0)" in text, text


def test_ten_fast_arrow_presses_on_the_history_slider_move_ten_steps(ui) -> None:
    page, front, binder = ui
    s = binder.session
    s.add_request("The capital of France is", max_tokens=14, temperature=0.0, ignore_eos=True)
    s.step(12)
    front.sync()
    wait_step(page, 12)
    page.focus('[data-testid="kvs-history-slider"]')
    # Ten presses 30 ms apart, each a real key event: most land while an earlier scrub's
    # answer is still on its way back (KERNEL_ROUND_TRIP_MS).
    for _ in range(10):
        page.keyboard.press("ArrowLeft")
        page.wait_for_timeout(30)
    wait_step(page, 2)
    idle(page)
    assert page.inner_text('[data-testid="kvs-history-label"]') == "step 2 of 12"
    page.keyboard.press("ArrowRight")  # and back up, all at once
    page.evaluate("""() => { const s = document.querySelector('[data-testid=kvs-history-slider]');
        const right = () => new KeyboardEvent('keydown', {key: 'ArrowRight', bubbles: true});
        for (let i = 0; i < 3; i++) s.dispatchEvent(right()); }""")
    wait_step(page, 6)
    idle(page)
    assert binder.view_index == 6 and page.input_value('[data-testid="kvs-history-slider"]') == "6"


def test_the_status_line_is_whole_at_a_laptops_width(ui) -> None:
    page, front, binder = ui
    s = binder.session
    s.add_request("The capital of France is", max_tokens=12, temperature=0.0, ignore_eos=True,
                  request_id="a-long-request-name-0")
    s.add_request("The capital of France is", max_tokens=12, temperature=0.0, ignore_eos=True)
    s.step(3)
    front.sync()
    wait_step(page, 3)
    status = page.locator('[data-testid="kvs-status"]')
    assert "prefix hits" in status.inner_text()  # the longest line the panel writes
    assert status.evaluate("(e) => e.scrollWidth <= e.clientWidth + 1"), status.inner_text()
    box, controls = status.bounding_box(), page.locator('[data-testid="kvs-controls"]').bounding_box()
    assert box["x"] >= controls["x"] and box["x"] + box["width"] <= controls["x"] + controls["width"] + 1


def test_a_feed_batch_is_marked_derived_in_the_slot_mapping_panel_and_its_caption(browser: Any,
                                                                                  fresh_session: Any) -> None:
    # A live server's recorder adds batch_source to the records it publishes (docs/attach.md); the
    # rest of such a record has this shape, so a real kvscope record carries the key here.
    from explorer.ui import captions, views
    from widgets import SlotMappingPanel

    s = fresh_session
    s.add_request("The capital of France is", max_tokens=4, temperature=0.0)
    s.step(2)  # step 2 decodes: one row of one request
    panel = SlotMappingPanel()
    text = views.token_texts(s.engine.tokenizer)
    page = browser.new_page(viewport=LAPTOP)
    front = MiniFrontend(page, {"slots": panel}, body_width=LAB_OUTPUT_WIDTH_AT_1366)
    badge = page.locator('[data-testid="kvs-batch-source"]')
    try:
        for source, words in (("scheduler", "derived from the scheduler's block tables"),
                              ("runner", "read from the model runner's buffers"), ("", "")):
            record = {**s.current.record, "batch_source": source or None}
            panel.show(views.shown_slot_mapping(record, s.current.snapshot, text))
            front.sync()
            if words:
                page.wait_for_function(
                    "(w) => document.querySelector('[data-testid=kvs-batch-source]').textContent === w", arg=words)
                assert badge.is_visible() and badge.get_attribute("data-source") == source
                caption = captions.step_caption(record, s.current.snapshot)
                if source == "scheduler":  # derived: the caption says so too
                    assert caption.endswith(f"; slot mapping {words}"), caption
                else:  # the runner's own batch: the badge names it, the caption needs no word
                    assert "slot mapping" not in caption, caption
            else:  # no source said: no badge, and the caption says nothing of it
                page.wait_for_function("() => document.querySelector('[data-testid=kvs-batch-source]').hidden")
                assert "slot mapping" not in captions.step_caption(record, s.current.snapshot)
        assert "block_table[position // block_size]" in views.shown_slot_mapping(
            {**s.current.record, "batch_source": "scheduler"}, s.current.snapshot, text)["batch_source_words"][1]
        # One row, one request: counted in the singular.
        sub = page.inner_text('[data-testid="kvs-slot-mapping"] .kvs-sub')
        assert sub.startswith("1 token \u00b7 1 request \u00b7"), sub
        assert front.errors() == []
    finally:
        page.close()


def test_a_finished_chat_answer_reads_without_its_end_token_and_a_pool_error_says_the_fix(
        browser: Any, default_model_path: Path) -> None:
    from explorer import Session
    from explorer.ui import presets

    s = Session(str(default_model_path), num_kv_blocks=12, block_size=16, max_num_batched_tokens=256)
    binder = SessionBinder(s, ["controls", "queues"])
    page = browser.new_page(viewport=LAPTOP)
    front = MiniFrontend(page, binder.panels, body_width=LAB_OUTPUT_WIDTH_AT_1366)
    try:
        rid = s.add_request(presets.chat_prompt(s.engine.tokenizer, "What is the capital of France?"),
                            max_tokens=40, temperature=0.0)
        s.run_until_idle()
        front.sync()
        (done,) = s.current.snapshot["queues"]["finished"]
        assert done["finish_reason"] == "stop"
        assert s.engine.tokenizer.decode(done["output_token_ids"][-1:]) == "<|im_end|>"
        card = page.locator(f'[data-testid="kvs-req-{rid}"] .kvs-output-text')
        card.wait_for()
        assert "Paris" in card.inner_text() and "<|im_end|>" not in card.inner_text(), card.inner_text()
        # A request the pool cannot hold: the error names the numbers and what to do about them.
        open_drawer(page)
        page.fill('[data-testid="kvs-max-tokens"]', "400")
        page.click('[data-testid="kvs-add-btn"]')
        page.wait_for_selector('[data-testid="kvs-error"]:visible')
        error = page.inner_text('[data-testid="kvs-error"]')
        assert "num_kv_blocks=12" in error, error
        assert "lower max_tokens, shorten the prompt, or use num_kv_blocks >= " in error, error
        assert page.get_attribute('[data-testid="kvs-prompt"]', "aria-invalid") == "true"
        assert front.errors() == []
    finally:
        binder.close()
        page.close()


# Ids as a vLLM server names its requests: long, and alike but for the middle and the end.
VLLM_IDS = [f"cmpl-{k:02d}9f1c2e7a6b3d4c5e8f9a0b1c2d3e4f{k:02d}-0" for k in range(12)]
OVERLAPS = """(sel) => {
  const boxes = [...document.querySelectorAll(sel)].map((e) => e.getBoundingClientRect());
  const hits = [];
  boxes.forEach((a, i) => boxes.forEach((b, j) => {
    if (i < j && a.left < b.right - 1 && b.left < a.right - 1 && a.top < b.bottom - 1 && b.top < a.bottom - 1) {
      hits.push([i, j]);
    }
  }));
  return hits; }"""
CROSSES = """([a, b]) => {
  const rect = (e) => e.getBoundingClientRect();
  const over = (p, q) => p.left < q.right - 1 && q.left < p.right - 1 && p.top < q.bottom - 1 && q.top < p.bottom - 1;
  const bs = [...document.querySelectorAll(b)].map(rect);
  return [...document.querySelectorAll(a)].filter((e) => bs.some((q) => over(rect(e), q)))
    .map((e) => e.textContent); }"""
OUTSIDE_ITS_CHART = """() => [...document.querySelectorAll('.kvs-lat-chart text')].filter((t) => {
  const r = t.getBoundingClientRect(), s = t.closest('svg').getBoundingClientRect();
  return r.left < s.left - 1 || r.right > s.right + 1 || r.top < s.top - 1 || r.bottom > s.bottom + 1;
}).map((t) => t.textContent)"""


@pytest.mark.parametrize("viewport", [LAPTOP, {"width": 1920, "height": 1080}], ids=["1366x768", "1920x1080"])
def test_ttft_itl_charts_label_every_request_and_nothing_overlaps(browser: Any, fresh_session: Any, tmp_path: Path,
                                                                   viewport: dict) -> None:
    from explorer.ui import views
    from widgets import LatencyPanel

    s = fresh_session
    for k, rid in enumerate(VLLM_IDS):
        s.add_request(f"Request {k} says", max_tokens=4, temperature=0.0, ignore_eos=True, request_id=rid)
    s.run_until_idle()
    panel = LatencyPanel()
    panel.show(views.latency_state(s.current.snapshot))
    page = browser.new_page(viewport=viewport)
    front = MiniFrontend(page, {"latency": panel}, body_width="auto")
    try:
        page.wait_for_selector('[data-testid="kvs-lat-itl-dist"]')
        for chart in ("kvs-lat-ttft", "kvs-lat-itl"):  # every request, each label its own
            ticks = page.locator(f'[data-testid="{chart}"] .kvs-lat-tick').all_text_contents()
            assert len(ticks) == len(set(ticks)) == 12, ticks
        assert page.evaluate(OVERLAPS, ".kvs-lat-box") == []          # no chart over another
        assert page.evaluate(OUTSIDE_ITS_CHART) == []                  # no label or title leaves its chart
        for chart in ("kvs-lat-ttft", "kvs-lat-itl", "kvs-lat-ttft-dist", "kvs-lat-itl-dist"):
            # Titles and axis titles over no other text (tilted labels' boxes overlap, their letters do not).
            texts = f'[data-testid="{chart}"] text:not(.kvs-lat-tick)'
            assert page.evaluate(OVERLAPS, texts) == [], chart
            assert page.evaluate(CROSSES, [texts, f'[data-testid="{chart}"] .kvs-lat-tick']) == [], chart
        assert "engine clock" in page.inner_text('[data-testid="kvs-latency-clock"]')
        # A live server's snapshot: its own request times, and the words say so.
        live = {**s.current.snapshot, "model_info": {**s.current.snapshot["model_info"], "live": True}}
        panel.show(views.latency_state(live))
        front.sync()
        page.wait_for_function("() => document.querySelector('[data-testid=kvs-latency-clock]').textContent"
                               ".startsWith('server clock')")
        assert "engine clock" not in page.inner_text('[data-testid="kvs-latency"]')
        assert front.errors() == []
        # The export draws the same charts with the same module: every request labelled there too.
        path = export_html(s, tmp_path / "run.html").path
        page.goto(path.resolve().as_uri())
        page.wait_for_function("() => document.body.dataset.ready === 'true'", timeout=30_000)
        ticks = page.locator('[data-testid="kvs-lat-itl"] .kvs-lat-tick').all_text_contents()
        assert len(ticks) == len(set(ticks)) == 12, ticks
        assert page.evaluate(OUTSIDE_ITS_CHART) == []
    finally:
        page.close()


def test_one_slow_gap_does_not_flatten_the_itl_charts(browser: Any, fresh_session: Any) -> None:
    """A live server's ITL: thousands of gaps near one value and a few far slower (a request that
    waited). The per-request axis is cut with the slow gap marked at the top (its real value in
    the tooltip), the distribution's bins are even in log(ms), and at a laptop's Lab width every
    title fits its chart."""
    from explorer.ui import views
    from widgets import LatencyPanel

    s = fresh_session
    for k in range(6):
        s.add_request(f"Request {k} says", max_tokens=24, temperature=0.0, ignore_eos=True)
    s.run_until_idle()
    state = views.latency_state(s.current.snapshot)
    gaps = [g for r in state["rows"] for g in r["inter_token_latency"]]
    slow = 80 * max(gaps)   # one gap far slower than all the engine's real ones
    state["rows"][0]["inter_token_latency"][3] = slow
    panel = LatencyPanel()
    panel.show(state)
    page = browser.new_page(viewport=LAPTOP)
    front = MiniFrontend(page, {"latency": panel}, body_width=LAB_OUTPUT_WIDTH_AT_1366)
    try:
        page.wait_for_selector('[data-testid="kvs-lat-itl-dist"]')
        axis = page.locator('[data-testid="kvs-lat-itl"] text.kvs-lat-axis:not(.kvs-lat-tick)').all_text_contents()
        top = axis[-1]   # the y axis' ticks: 0, the middle, the top
        assert top.endswith("\u2191") and float(top[:-1].replace(",", "")) < slow * 1e3 / 10, axis
        marks = [float(m) for m in page.eval_on_selector_all('[data-testid="kvs-lat-itl"] .kvs-lat-outlier',
                                                             "ms => ms.map(m => m.dataset.ms)")]
        cap = float(top[:-1].replace(",", ""))
        assert any(m == pytest.approx(slow * 1e3, abs=0.1) for m in marks) and all(m > cap for m in marks), marks
        dist = page.locator('[data-testid="kvs-lat-itl-dist"]')
        assert dist.get_attribute("data-bins") == "log"
        # Each bar holds the gaps whose log(ms) falls in its even share of log(lo)..log(hi): how many
        # bars that makes depends on how spread the engine's real gaps were, so it is counted here.
        values = [g * 1e3 for r in state["rows"] for g in r["inter_token_latency"]]
        lo, hi = min(values), max(values)
        bins = min(20, math.ceil(math.sqrt(len(values))))   # latency.js' MAX_BINS
        expected = Counter(min(bins - 1, math.floor(math.log(v / lo) / math.log(hi / lo) * bins)) for v in values)
        drawn = [int(t.rsplit(": ", 1)[1]) for t in dist.locator("rect.kvs-lat-bin title").all_text_contents()]
        assert drawn == [expected[k] for k in sorted(expected)], (drawn, expected)
        assert page.evaluate(OUTSIDE_ITS_CHART) == []   # the titles fit at 1366
        assert page.evaluate(OVERLAPS, '[data-testid="kvs-lat-itl"] text:not(.kvs-lat-tick)') == []
        assert front.errors() == []
    finally:
        page.close()


def test_long_request_ids_get_short_stable_labels_with_the_id_on_hover(ui) -> None:
    """A live server's ids ("cmpl-...") are named "#N" in the captions and on the queue cards (N:
    the order the view first saw them), the same at every step; the card keeps the id on hover."""
    page, front, binder = ui
    s = binder.session
    for k, rid in enumerate(VLLM_IDS[:8]):
        s.add_request(f"Request {k} says", max_tokens=6, temperature=0.0, ignore_eos=True, request_id=rid)
    binder.render()
    s.step(3)
    front.sync()
    wait_step(page, 3)
    caption = binder.panels["controls"].caption
    assert "#1-#8 decode 1 token each" in caption and "cmpl-" not in caption, caption
    chip = page.locator(f'.kvs-card[data-request-id="{VLLM_IDS[2]}"] .kvs-rid')
    assert chip.inner_text() == "#3" and chip.get_attribute("title") == f"request {VLLM_IDS[2]}"
    s.add_request("A late one", max_tokens=2, temperature=0.0, ignore_eos=True, request_id=VLLM_IDS[8])
    s.run_until_idle()
    front.sync()
    binder.scrub(1)   # an earlier step: the same request, the same name
    front.sync()
    wait_step(page, 1)
    assert page.locator(f'.kvs-card[data-request-id="{VLLM_IDS[2]}"] .kvs-rid').inner_text() == "#3"
    assert binder.labels.name(VLLM_IDS[8]) == "#9"


def test_attention_at_a_preemption_step_says_it_in_the_browser(ui) -> None:
    """The walkthrough's steps (a tiny pool, a burst, a pinned request, scrubbed to the step that
    preempted it): the attention panel says the request was preempted then, with its tokens."""
    page, front, binder = ui
    s = binder.session
    s.reset(num_kv_blocks=12, block_size=16, max_num_batched_tokens=64)
    for i in range(4):
        s.add_request([300 + 9 * i + k for k in range(40)], max_tokens=30, temperature=0.0, ignore_eos=True)
    s.step(40)
    index = next(i for i, e in enumerate(s.history) if e.record and e.record["preempted"])
    rid = s.history[index].record["preempted"][0]
    front.sync()
    binder.scrub(index)
    front.sync()
    step = s.history[index].step
    wait_step(page, step)
    page.click(f'[data-testid="kvs-queue-waiting"] .kvs-card[data-request-id="{rid}"]')
    page.wait_for_function("(w) => (document.querySelector('[data-testid=kvs-attn-message]') || {}).textContent"
                           "?.includes(w)", arg="it was preempted in this step")
    message = page.inner_text('[data-testid="kvs-attn-message"]')
    assert message.startswith(f"#{rid} holds no KV at step {step}: it was preempted in this step, its ") and \
        "prompt not computed yet" not in message
