"""`python -m explorer app` for real: Voila serves the Dashboard alone on 127.0.0.1 with
token auth, a busy port is replaced, the page shows progress while the model loads, Step
advances the engine, bad input shows its message, and nothing is fetched off the machine."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.lab_harness import REPO, focus_pixels_js, isolated_jupyter_env
from explorer.apps.lab import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

START_TIMEOUT_S = 120.0
DASHBOARD_TIMEOUT_MS = 300_000  # kernel start, torch + model + tokenizer on a shared 2-core machine
ACTION_TIMEOUT_MS = 60_000


class App:
    def __init__(self, proc: subprocess.Popen, log: Path) -> None:
        self.proc, self.log = proc, log
        self.url = ""

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # the group: Voila and its kernel
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)


@pytest.fixture(scope="module")
def app(tiny_qwen3_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[App]:
    """The app on a port someone else holds: it must say so and move."""
    home = tmp_path_factory.mktemp("voila-home")
    env = isolated_jupyter_env(home)
    env["XDG_CACHE_HOME"] = str(home / "cache")  # the generated notebook goes here
    busy = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    busy.bind(("127.0.0.1", free_port()))
    busy.listen(1)
    port = busy.getsockname()[1]
    log = home / "app.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "explorer", "app", "--no-browser", "--port", str(port),
                                 "--model", str(tiny_qwen3_path), "--num-kv-blocks", "48"],
                                env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server = App(proc, log)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (m := re.search(r"open: (\S+)", server.output())):
            assert proc.poll() is None and time.monotonic() < deadline, server.output()
            time.sleep(0.2)
        server.url = m.group(1)
        server.busy_port = port
        chosen = int(re.search(r"127\.0\.0\.1:(\d+)/", server.url).group(1))
        while True:  # Voila listens once its web app is up
            try:
                socket.create_connection(("127.0.0.1", chosen), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, server.output()
                time.sleep(0.3)
        yield server
    finally:
        server.stop()
        busy.close()


def test_busy_port_is_replaced_and_the_token_is_required(app: App) -> None:
    out = app.output()
    assert f"port {app.busy_port} is busy; using free port" in out
    assert app.url.startswith("http://127.0.0.1:") and f":{app.busy_port}/" not in app.url
    token = app.url.split("token=")[1]
    assert token not in " ".join(app.proc.args)  # never on the command line
    bare = app.url.split("?")[0]

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    try:
        with urllib.request.build_opener(NoRedirect).open(bare, timeout=60) as resp:
            status, location = resp.status, ""
    except urllib.error.HTTPError as err:
        status, location = err.code, err.headers.get("Location", "")
    # No page without the token: refused, or sent to the login form.
    assert status in (401, 403) or (status in (302, 303) and "login" in location), (status, location)


def open_drawer(page) -> None:
    """The add-request form and the knobs: the drawer starts folded on a laptop-sized window."""
    page.wait_for_selector('[data-testid="kvs-controls"][data-drawer]', timeout=ACTION_TIMEOUT_MS)
    if page.get_attribute('[data-testid="kvs-controls"]', "data-drawer") == "closed":
        page.click('[data-testid="kvs-drawer-toggle"]')
    page.wait_for_selector('[data-testid="kvs-add-form"]:visible', timeout=ACTION_TIMEOUT_MS)


def version_warnings(page) -> list[str]:
    """Console messages about JupyterLab's shared modules (a federated extension built for
    another JupyterLab than the one Voila bundles); collected on `page.kvs_warnings`."""
    found: list[str] = []
    page.on("console", lambda m: found.append(m.text) if re.search(
        r"shared module|Unsatisfied version|requiredVersion", m.text, re.I) else None)
    return found


def test_the_page_loads_steps_and_shows_bad_input(page, app: App) -> None:
    warnings = version_warnings(page)
    outside: list[str] = []
    page.on("request", lambda r: None if r.url.startswith(("http://127.0.0.1", "ws://127.0.0.1", "data:", "blob:"))
            else outside.append(r.url))
    page.goto(app.url, timeout=DASHBOARD_TIMEOUT_MS)
    # Progress first (the model loads in a worker thread), then the Dashboard replaces it.
    page.wait_for_selector('[data-testid="kvs-app-loading"], [data-testid="kvs-controls"]',
                           timeout=DASHBOARD_TIMEOUT_MS)
    page.wait_for_selector('[data-testid="kvs-controls"]', timeout=DASHBOARD_TIMEOUT_MS)
    assert page.locator('[data-testid="kvs-app-loading"]').count() == 0
    assert page.title() == "kvscope"
    for tid in ("kvs-queues", "kvs-block-pool", "kvs-slot-mapping", "kvs-timeline"):
        assert page.locator(f'[data-testid="{tid}"]').count() == 1, tid
    assert page.locator(".jp-Cell-inputWrapper:visible").count() == 0  # the app shows no code

    open_drawer(page)
    page.fill('[data-testid="kvs-prompt"]', "The capital of France is")
    page.fill('[data-testid="kvs-max-tokens"]', "4")
    page.click('[data-testid="kvs-add-btn"]')
    page.wait_for_selector('[data-testid="kvs-queue-waiting"] .kvs-card', timeout=ACTION_TIMEOUT_MS)
    page.click('[data-testid="kvs-step-btn"]')
    page.wait_for_selector('[data-testid="kvs-queues"][data-step="1"]', timeout=ACTION_TIMEOUT_MS)
    page.wait_for_selector('[data-testid="kvs-slot-mapping"][data-step="1"]', timeout=ACTION_TIMEOUT_MS)
    assert page.locator('[data-testid="kvs-queue-running"] .kvs-card').count() == 1
    assert "step 1" in page.inner_text('[data-testid="kvs-status"]')

    page.fill('[data-testid="kvs-prompt"]', "")
    page.click('[data-testid="kvs-add-btn"]')
    page.wait_for_selector('[data-testid="kvs-error"]:visible', timeout=ACTION_TIMEOUT_MS)
    assert "prompt" in page.inner_text('[data-testid="kvs-error"]')
    assert outside == []
    # The widget manager built for JupyterLab 4.6 next to Voila's 4.2: no version warnings shown.
    assert warnings == [], warnings
    assert page.evaluate("() => typeof window.kvsVersionSkewWarnings") == "number"


# A laptop's screen and a desktop's: the Dashboard in a real widget manager (Voila's).
LAYOUT_VIEWPORTS = ({"width": 1366, "height": 768}, {"width": 1920, "height": 1080})
FOCUS_PIXELS = focus_pixels_js('[data-testid=kvs-pool-canvas]')


def test_the_dashboard_fits_a_laptop_and_its_separate_views_light_each_other_up(page, app: App) -> None:
    page.set_viewport_size(LAYOUT_VIEWPORTS[0])
    page.goto(app.url, timeout=DASHBOARD_TIMEOUT_MS)
    page.wait_for_selector('[data-testid="kvs-controls"]', timeout=DASHBOARD_TIMEOUT_MS)
    assert page.get_attribute('[data-testid="kvs-controls"]', "data-drawer") == "closed"  # a laptop: compact
    open_drawer(page)
    page.fill('[data-testid="kvs-prompt"]', "The capital of France is")
    page.fill('[data-testid="kvs-max-tokens"]', "8")
    page.click('[data-testid="kvs-add-btn"]')
    page.wait_for_selector('[data-testid="kvs-queue-waiting"] .kvs-card', timeout=ACTION_TIMEOUT_MS)
    for step in (1, 2):  # a prefill, then a decode
        page.click('[data-testid="kvs-step-btn"]')
        page.wait_for_selector(f'[data-testid="kvs-slot-mapping"][data-step="{step}"]', timeout=ACTION_TIMEOUT_MS)
    page.wait_for_selector('[data-testid="kvs-attn-bars"] text.kvs-attn-xlabel', timeout=ACTION_TIMEOUT_MS)
    for viewport in LAYOUT_VIEWPORTS:
        page.set_viewport_size(viewport)
        page.wait_for_timeout(400)  # reflow, and the panels' ResizeObservers
        where = f"at {viewport['width']}x{viewport['height']}"
        # No horizontal scrollbar on the page or on the dashboard itself.
        widths = page.evaluate("""() => { const d = document.querySelector('.kvs-dashboard');
            return [document.scrollingElement.scrollWidth, window.innerWidth, d.scrollWidth, d.clientWidth,
                    Math.ceil(d.getBoundingClientRect().right)]; }""")
        assert widths[0] <= widths[1] and widths[2] <= widths[3] and widths[4] <= widths[1], (where, widths)
        # The pool and the slots side by side.
        pool = page.locator('[data-testid="kvs-block-pool"]').bounding_box()
        slots = page.locator('[data-testid="kvs-slot-mapping"]').bounding_box()
        assert abs(pool["y"] - slots["y"]) < 2 and pool["x"] + pool["width"] <= slots["x"] + 1, (where, pool, slots)
        # An empty queue column stays narrow; the sampler's "chosen" chip is not cut off.
        assert page.locator('[data-testid="kvs-queue-waiting"]').bounding_box()["width"] < 160, where
        chip = page.locator('[data-testid="kvs-sampler"] .kvs-chosen-chip').bounding_box()
        sampler = page.locator('[data-testid="kvs-sampler"]').bounding_box()
        assert chip["x"] + chip["width"] <= sampler["x"] + sampler["width"] - 2, (where, chip, sampler)
        # One decode is one compact row.
        assert page.locator('[data-testid="kvs-seg-0"]').bounding_box()["height"] < 40, where
        # Hovering a slot cell lights its block in the pool: separate widget views, one channel.
        cell = page.locator('[data-testid="kvs-seg-0"] .kvs-cell').first
        block = int(cell.get_attribute("data-block"))
        page.mouse.move(1, 1)
        assert page.evaluate(FOCUS_PIXELS, block) == 0, where
        cell.hover()
        assert page.evaluate(FOCUS_PIXELS, block) > 40, where
        assert "kvs-lit" in page.get_attribute('[data-testid="kvs-req-0"]', "class"), where
        page.mouse.move(1, 1)

    # -- pool knobs: Apply says it rebuilds the engine; 364 blocks still show their numbers --
    page.set_viewport_size(LAYOUT_VIEWPORTS[0])
    page.fill('[data-testid="kvs-pool-blocks"]', "364")
    assert "not applied yet" in page.inner_text('[data-testid="kvs-pool-note"]')
    assert "rebuilds the engine" in page.inner_text('[data-testid="kvs-pool-apply"]')
    page.click('[data-testid="kvs-pool-apply"]')
    page.click('[data-testid="kvs-rebuild-discard"]')  # it asks first: the run would go
    page.wait_for_selector('[data-testid="kvs-pool-canvas"][data-labels="ids"]', timeout=ACTION_TIMEOUT_MS)
    assert page.inner_text('[data-testid="kvs-leg-free"]') == "free 363"
    assert page.inner_text('[data-testid="kvs-pool-note"]') == ""
    canvas = page.locator('[data-testid="kvs-pool-canvas"]')
    canvas.scroll_into_view_if_needed()
    box = canvas.bounding_box()
    cell = 15  # block_pool.js: 15 px cells from 257 to 1,024 blocks, ids drawn in them
    ncols = int(box["width"] // cell)
    x, y = box["x"] + (ncols - 1) * cell + cell / 2, box["y"] + cell + cell / 2  # the second row's last block
    page.mouse.move(x - 2, y - 2)
    page.mouse.move(x, y)
    num = page.locator('[data-testid="kvs-pool-hover-num"]')
    num.wait_for(state="visible", timeout=10_000)
    assert num.inner_text() == str(2 * ncols - 1)
    # The tooltip of a block at the right edge stays inside the window.
    tip = page.locator('[data-testid="kvs-block-tooltip"]')
    tip.wait_for(state="visible", timeout=10_000)
    t = tip.bounding_box()
    vw, vh = LAYOUT_VIEWPORTS[0]["width"], LAYOUT_VIEWPORTS[0]["height"]
    assert t["x"] >= 0 and t["y"] >= 0 and t["x"] + t["width"] <= vw and t["y"] + t["height"] <= vh, t
