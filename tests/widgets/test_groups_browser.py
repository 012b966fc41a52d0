"""A model with sliding-window layers in the browser (issue 60's panels): the block-table rows
show each KV cache group's table, the null block where tokens left the window, each group's own
prefix hit and the group that cut the request's; the pool marks the sliding group's blocks; the
slot mapping shows each group's slot of a token; the attention panel's layer picker names the
sliding layers' window. Headless chromium on the panels' real ESM and a real Session
(tests/widgets/minifrontend.py)."""
from __future__ import annotations

import random
from typing import Any

import pytest

from explorer import Session
from explorer.ui.dashboard import SessionBinder

from .minifrontend import MiniFrontend

pytestmark = pytest.mark.slow

WINDOW = 20
LAPTOP = {"width": 1366, "height": 768}


@pytest.fixture(scope="module")
def mixed_session(tiny_checkpoint) -> Session:
    model = tiny_checkpoint("qwen3", num_layers=4, sliding_window=WINDOW,
                            layer_types=("full_attention", "sliding_attention", "sliding_attention", "full_attention"))
    return Session(str(model), attention_backend="torch", num_kv_blocks=48, block_size=16)


def show(browser: Any, session: Session, panels: list[str]) -> tuple[Any, MiniFrontend, SessionBinder]:
    binder = SessionBinder(session, panels)
    page = browser.new_page(viewport=LAPTOP)
    front = MiniFrontend(page, binder.panels, body_width="1040px")
    front.sync()
    step = session.current.step
    page.wait_for_function(
        "(s) => [...document.querySelectorAll('.kvs-panel')].every((p) => p.dataset.step === String(s))",
        arg=step, timeout=30_000)
    return page, front, binder


def test_block_tables_and_slots_show_every_kv_cache_group(browser, mixed_session):
    s = mixed_session
    s.reset()
    rng = random.Random(5)
    rid = s.add_request([rng.randrange(200, 20000) for _ in range(130)], max_tokens=4, temperature=0.0,
                        ignore_eos=True)
    s.step(2)  # the prompt, then its first decode: the blocks before the window were freed
    req = s.engine.requests[rid]
    sliding = req.extra_block_tables[0]
    page, front, binder = show(browser, s, ["blocks", "slots", "attention"])
    try:
        row = page.locator(f'[data-testid="kvs-bt-{rid}"]')
        tags = row.locator('[data-testid="kvs-bt-group-tag"]').all_inner_texts()
        assert tags[0].startswith("full attention") and tags[1].startswith(f"sliding window {WINDOW}")
        group_cells = row.locator(".kvs-bt-group .kvs-bt-cell")
        assert group_cells.count() == len(sliding)
        assert row.locator(".kvs-bt-group .kvs-bt-null").count() == sliding.count(0) == 6
        assert "left the window" in (row.locator(".kvs-bt-null").first.get_attribute("title") or "")
        # The pool marks the sliding group's blocks (a corner) and its legend names the group.
        state = binder.panels["blocks"]
        held = {b for b in sliding if b}
        assert {i for i, g in enumerate(state.group) if g} == held
        assert state.group_labels[1] == f"sliding window {WINDOW}"
        assert page.locator('[data-testid="kvs-leg-group"]').inner_text() == f"corner = sliding window {WINDOW}"
        # The decode's one row: its slot in group 0 and its own slot in the sliding group.
        batch = s.current.record["batch"]
        slot_lines = page.locator(".kvs-slot-mapping .kvs-cell-group-slot").all_inner_texts()
        assert slot_lines == [f"\u21b3{batch['group_slot_mappings'][0][0]}"]
        assert batch["group_slot_mappings"][0][0] // 16 == sliding[130 // 16]
        # The attention panel's layer picker says which layers slide.
        layers = page.locator('[data-testid="kvs-attn-layer"] option').all_inner_texts()
        assert layers == ["0", f"1 (window {WINDOW})", f"2 (window {WINDOW})", "3"]
        assert front.errors() == []
    finally:
        binder.close()
        page.close()
