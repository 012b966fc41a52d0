"""Linked highlighting, frozen stills and the attention views in headless chromium, with the
panels' real ESM wired to a real Session (tests/widgets/minifrontend.py), at a laptop's and
a desktop's width. The Dashboard's own layout in a real widget manager is checked in
tests/e2e/test_app_mode.py."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from explorer.ui import views
from explorer.ui.dashboard import SessionBinder

from .minifrontend import MiniFrontend

pytestmark = pytest.mark.slow

PANELS = ["controls", "queues", "sampler", "blocks", "slots", "attention"]
SHARED = list(range(1000, 1032))  # two full blocks of 16 tokens
VIEWPORTS = [{"width": 1366, "height": 768}, {"width": 1920, "height": 1080}]
FOCUS = [255, 214, 0]  # _common.js KVS_MARKS.focus: the linked-highlight halo


@pytest.fixture(params=VIEWPORTS, ids=lambda v: f"{v['width']}x{v['height']}")
def viewport(request: pytest.FixtureRequest) -> dict:
    return request.param


@pytest.fixture
def shared_prefix(fresh_session: Any) -> Any:
    """Request 0 computes two shared blocks in step 1; request 1 hits them in step 2
    (0 holds blocks [1, 2, 3], 1 holds [1, 2, 4]; step 2 decodes 0 and prefills 1)."""
    s = fresh_session
    s.add_request([*SHARED, 7, 8, 9], max_tokens=4, temperature=0.0, ignore_eos=True)
    s.step(1)
    s.add_request([*SHARED, 10, 11], max_tokens=4, temperature=0.0, ignore_eos=True)
    s.step(1)
    running = {r["request_id"]: r["block_table"] for r in s.current.snapshot["queues"]["running"]}
    assert running == {"0": [1, 2, 3], "1": [1, 2, 4]}
    return s


def mount(browser: Any, viewport: dict, panels: dict) -> tuple[Any, MiniFrontend]:
    page = browser.new_page(viewport=viewport)
    front = MiniFrontend(page, panels, body_width="auto")
    page.wait_for_function("() => [...document.querySelectorAll('.kvs-panel')].every((p) => p.dataset.step === '2')")
    return page, front


@pytest.fixture
def live(browser: Any, shared_prefix: Any, viewport: dict) -> Iterator[tuple[Any, SessionBinder]]:
    binder = SessionBinder(shared_prefix, PANELS)
    page, front = mount(browser, viewport, binder.panels)
    yield page, binder
    assert front.errors() == []
    binder.close()
    page.close()


def pool_focus_pixels(page: Any, block: int, host: str = "blocks") -> int:
    """Pixels of the linked-highlight colour in `block`'s cell of the pool canvas."""
    return page.evaluate("""([b, host, rgb]) => {
        const c = document.querySelector(`.kvs-host[data-panel="${host}"] [data-testid=kvs-pool-canvas]`);
        const dpr = window.devicePixelRatio || 1, cell = 26;
        const ncols = Math.round(parseFloat(c.style.width) / cell);
        const x = (b % ncols) * cell, y = Math.floor(b / ncols) * cell;
        const d = c.getContext('2d').getImageData(x * dpr, y * dpr, cell * dpr, cell * dpr).data;
        let n = 0;
        for (let k = 0; k < d.length; k += 4)
            if (Math.abs(d[k] - rgb[0]) < 8 && Math.abs(d[k + 1] - rgb[1]) < 8 && Math.abs(d[k + 2] - rgb[2]) < 8) n++;
        return n; }""", [block, host, FOCUS])


def lit(page: Any, selector: str) -> list[str]:
    return page.eval_on_selector_all(selector, "els => els.filter((e) => e.classList.contains('kvs-lit') || "
                                               "e.classList.contains('kvs-lit-strong'))"
                                               ".map((e) => e.dataset.block ?? e.dataset.requestId)")


def test_hovering_a_slot_cell_lights_its_block_request_and_token_everywhere(live) -> None:
    page, _ = live
    cell = page.locator('[data-testid="kvs-seg-1"] .kvs-cell[data-pos="32"]')
    assert cell.get_attribute("data-block") == "4"
    assert pool_focus_pixels(page, 4) == 0
    cell.hover()
    assert pool_focus_pixels(page, 4) > 40                        # its block in the pool ...
    assert pool_focus_pixels(page, 3) == pool_focus_pixels(page, 1) == 0  # ... and no other
    assert lit(page, '[data-testid="kvs-bt-1"] .kvs-bt-cell') == ["4"]  # its block-table entry
    assert lit(page, '[data-testid="kvs-bt-0"] .kvs-bt-cell') == []
    assert lit(page, ".kvs-card") == ["1"]                        # its request's card
    assert "kvs-lit-strong" in cell.get_attribute("class")        # the token itself, strongest
    # Leaving it clears every panel.
    page.mouse.move(2, 2)
    assert pool_focus_pixels(page, 4) == 0 and page.locator(".kvs-lit, .kvs-lit-strong").count() == 0
    # A "from cache" cell (positions 16..31, a prefix hit on block 2) lights that block.
    cached = page.locator('[data-testid="kvs-cache-1-2"]')
    assert "16\u201331" in cached.get_attribute("title") and "prefix cache" in cached.get_attribute("title")
    cached.hover()
    assert pool_focus_pixels(page, 2) > 40 and pool_focus_pixels(page, 4) == 0
    assert lit(page, '[data-testid="kvs-bt-1"] .kvs-bt-cell') == ["2"]


@pytest.mark.parametrize("viewport", VIEWPORTS[:1], ids=["1366x768"], indirect=True)
def test_hovering_a_block_lights_its_slots_and_a_shared_block_wears_both_colours(live) -> None:
    page, _ = live
    canvas = page.locator('[data-testid="kvs-pool-canvas"]')
    canvas.scroll_into_view_if_needed()
    box = canvas.bounding_box()
    page.mouse.move(box["x"] + 3 * 26 + 13, box["y"] + 13)       # block 3: request 0's last block
    page.wait_for_function("() => document.querySelectorAll('.kvs-slot-mapping .kvs-lit').length > 0")
    lit_cells = page.eval_on_selector_all(".kvs-slot-mapping .kvs-cell.kvs-lit", "els => els.map((e) => e.dataset.pos)")
    assert lit_cells == ["35"]                                    # request 0's decode row, in block 3
    assert lit(page, ".kvs-card") == ["0"]
    assert lit(page, ".kvs-bt-cell") == ["3"]
    # Block 1 belongs to both requests: one stripe per owner, in the queues' colours.
    halves = page.evaluate("""() => {
        const c = document.querySelector('[data-testid=kvs-pool-canvas]');
        const dpr = window.devicePixelRatio || 1, ctx = c.getContext('2d');
        const px = (x, y) => Array.from(ctx.getImageData(x * dpr, y * dpr, 1, 1).data.slice(0, 3));
        return [px(26 + 7, 21), px(26 + 19, 21)]; }""")
    colours = page.evaluate("""() => [0, 1].map((r) => getComputedStyle(
        document.querySelector(`[data-testid=kvs-req-${r}]`)).borderLeftColor)""")
    assert [f"rgb({', '.join(map(str, h))})" for h in halves] == colours
    notation = page.inner_text('[data-testid="kvs-leg-notation"]')
    assert notation == "7\u00b72 = block 7, refcount 2"
    for tid in ("kvs-leg-shared", "kvs-leg-hashed", "kvs-leg-focus", "kvs-leg-ev-freed", "kvs-leg-ev-evicted"):
        assert page.get_attribute(f'[data-testid="{tid}"]', "title"), tid


def test_the_decode_attention_view_has_token_labels_blocks_and_prompt_marks(live) -> None:
    page, binder = live
    s = binder.session
    bars = page.locator('[data-testid="kvs-attn-bars"]')
    bars.wait_for()
    assert not page.is_visible('[data-testid="kvs-attn-canvas"]')
    assert page.inner_text('[data-testid="kvs-attn-sub"]').startswith("weights of step 2 \u00b7 #0")
    req = next(r for r in s.current.snapshot["queues"]["running"] if r["request_id"] == "0")
    ids = (req["prompt_token_ids"] + req["output_token_ids"])[:36]
    texts = views.token_texts(s.engine.tokenizer)(ids)
    tok = [t.replace("\n", "\u21b5").replace("\t", "\u21e5").replace(" ", "\u00b7") for t in texts]
    expected = [t if len(t) <= 10 else t[:9] + "\u2026" for t in tok]
    labels = bars.locator("text.kvs-attn-xlabel").evaluate_all(
        "els => els.map((e) => [Number(e.dataset.pos), e.textContent])")
    assert labels == [[i, t] for i, t in enumerate(expected)]    # one label per key token
    blocks = bars.locator("text.kvs-attn-blabel").evaluate_all("els => els.map((e) => e.textContent)")
    assert blocks == ["b1", "b2", "b3"]                           # banded by KV block
    kinds = bars.locator('[data-testid="kvs-attn-kinds"] text').evaluate_all("els => els.map((e) => e.textContent)")
    assert kinds == ["prompt (35)", "gen 1"]
    widths = bars.locator("rect.kvs-attn-hit").evaluate_all("els => els.map((e) => Number(e.getAttribute('width')))")
    assert len(widths) == 36 and min(widths) >= 12                # readable: never thinner than 12 px
    # Hovering a key lights its block in the pool, and request 0's cells in that block.
    bars.locator('g.kvs-attn-col[data-pos="33"]').hover()
    assert pool_focus_pixels(page, 3) > 40 and pool_focus_pixels(page, 4) == 0
    assert page.eval_on_selector_all(".kvs-slot-mapping .kvs-cell.kvs-lit",
                                     "els => els.map((e) => e.dataset.pos)") == ["35"]
    # The prefill of request 1 is a heatmap; its colour scale is labelled.
    page.select_option('[data-testid="kvs-attn-request"]', "1")
    page.wait_for_function("() => document.querySelector('[data-testid=kvs-attn-sub]').textContent.includes('#1')")
    assert page.is_visible('[data-testid="kvs-attn-canvas"]') and not bars.is_visible()
    assert "2 queries \u00d7 34 keys" in page.inner_text('[data-testid="kvs-attn-sub"]')
    assert page.inner_text('[data-testid="kvs-attn-scale"]').startswith("weight 0")


def test_a_frozen_still_ignores_clicks_lights_nothing_and_says_when_it_froze(browser: Any, shared_prefix: Any,
                                                                              viewport: dict) -> None:
    s = shared_prefix
    binder = SessionBinder(s, PANELS)
    still = SessionBinder(s, ("queues", "blocks", "slots", "attention"))
    still.close()  # as the walkthrough's still(...) makes one
    panels = {**binder.panels, **{f"still_{n}": p for n, p in still.panels.items()}}
    page, front = mount(browser, viewport, panels)
    try:
        for name in ("still_queues", "still_blocks", "still_slots", "still_attention"):
            host = f'.kvs-host[data-panel="{name}"]'
            assert page.get_attribute(f"{host} .kvs-panel", "data-frozen") == "true"
            assert page.inner_text(f'{host} [data-testid="kvs-frozen-badge"]') == "frozen at step 2"
            assert not page.is_visible(f'{host} [data-testid="kvs-collapse"]')
        assert not page.is_visible('.kvs-host[data-panel="queues"] [data-testid="kvs-frozen-badge"]')
        # Clicks on the still: a card, a head, a block, a table entry. None takes.
        sq = '.kvs-host[data-panel="still_queues"]'
        page.click(f'{sq} [data-testid="kvs-req-1"]', force=True)
        sa, sbp = '.kvs-host[data-panel="still_attention"]', '.kvs-host[data-panel="still_blocks"]'
        page.click(f'{sa} [data-testid="kvs-head-3"]', force=True)
        page.click(f'{sbp} [data-testid="kvs-bt-1"] .kvs-bt-cell[data-block="4"]', force=True)
        sb = page.locator(f'{sbp} [data-testid="kvs-pool-canvas"]').bounding_box()
        page.mouse.click(sb["x"] + 2 * 26 + 13, sb["y"] + 13)
        page.wait_for_timeout(300)  # what a click would have sent has had time to come back
        assert "kvs-selected" not in page.get_attribute(f'{sq} [data-testid="kvs-req-1"]', "class")
        assert (still.panels["queues"].selected, still.panels["attention"].head,
                still.panels["blocks"].selected) == ("", 0, -1)
        assert "kvs-on" not in page.get_attribute(f'{sa} [data-testid="kvs-head-3"]', "class")
        # Hovering the still lights nothing, in the still or in the live panels.
        page.hover('.kvs-host[data-panel="still_slots"] [data-testid="kvs-seg-1"] .kvs-cell[data-pos="32"]')
        page.mouse.move(sb["x"] + 4 * 26 + 13, sb["y"] + 13)
        assert page.locator(".kvs-lit, .kvs-lit-strong").count() == 0
        assert pool_focus_pixels(page, 4) == 0 and pool_focus_pixels(page, 4, "still_blocks") == 0
        # The live panels beside it still answer the same gestures.
        page.hover('.kvs-host[data-panel="slots"] [data-testid="kvs-seg-1"] .kvs-cell[data-pos="32"]')
        assert pool_focus_pixels(page, 4) > 40 and pool_focus_pixels(page, 4, "still_blocks") == 0
        page.click('.kvs-host[data-panel="queues"] [data-testid="kvs-req-1"]')
        page.wait_for_function("() => document.querySelector('.kvs-host[data-panel=\"queues\"] "
                               "[data-testid=kvs-req-1]').classList.contains('kvs-selected')")
        assert binder.panels["queues"].selected == "1"
        # A live panel collapses to its title and back.
        slots = '.kvs-host[data-panel="slots"]'
        page.click(f'{slots} [data-testid="kvs-collapse"]')
        assert not page.is_visible(f'{slots} [data-testid="kvs-batch-strip"]')
        assert page.is_visible(f"{slots} .kvs-title")
        page.click(f'{slots} [data-testid="kvs-collapse"]')
        assert page.is_visible(f'{slots} [data-testid="kvs-batch-strip"]')
        assert front.errors() == []
    finally:
        binder.close()
        page.close()
