"""The prefix tree in headless chromium, wired to a real Session whose small pool evicts: the
prefixes cached at the shown step come first, the evicted ones with nothing cached under them
fold behind one toggle, and unfolding shows them in their place in the tree."""
from __future__ import annotations

from typing import Any

import pytest

from explorer.ui.dashboard import SessionBinder

from .minifrontend import MiniFrontend

pytestmark = pytest.mark.slow


def test_cached_prefixes_come_first_and_evicted_ones_fold(browser: Any, fresh_session: Any) -> None:
    s = fresh_session
    s.reset(num_kv_blocks=12, block_size=16)
    for i in range(6):   # one after another: each new prompt's blocks evict an older one's cached blocks
        s.add_request([100 + 50 * i + k for k in range(40)], max_tokens=4, temperature=0.0, ignore_eos=True)
        s.run_until_idle()
    binder = SessionBinder(s, ["blocks", "tree"])
    page = browser.new_page(viewport={"width": 1366, "height": 768})
    try:
        front = MiniFrontend(page, binder.panels)
        tree = binder.panels["tree"].tree
        nodes = tree["nodes"]
        assert tree["num_evicted"] > 0 and tree["num_present"] > 0
        folded = [n for n in nodes if n["folded"]]
        assert folded and all(not n["present"] for n in folded)
        # Cached subtrees first: no node that holds (or leads to) a cached prefix after a folded root.
        roots = [n for n in nodes if n["parent"] is None]
        first_folded = next(i for i, n in enumerate(roots) if n["folded"])
        assert all(n["folded"] for n in roots[first_folded:])
        rows = page.locator('[data-testid="kvs-tree-node"]')
        rows.first.wait_for()
        assert rows.count() == len(nodes) - len(folded)
        assert page.eval_on_selector_all('[data-testid="kvs-tree-node"]', "rs => rs.map(r => r.dataset.present)")[0] \
            == "true"
        toggle = page.locator('[data-testid="kvs-tree-fold"]')
        assert toggle.inner_text() == f"show {len(folded)} evicted prefix{'es' if len(folded) != 1 else ''}"
        toggle.click()
        page.wait_for_function("(n) => document.querySelectorAll('[data-testid=\"kvs-tree-node\"]').length === n",
                               arg=len(nodes))
        keys = page.eval_on_selector_all('[data-testid="kvs-tree-node"]', "rs => rs.map(r => r.dataset.key)")
        assert keys == [n["id"] for n in nodes]   # unfolded: every node in the tree's order
        assert toggle.inner_text().startswith("hide ")
        assert front.errors() == []
    finally:
        binder.close()
        page.close()
