"""The browser half of `python -m benchmarks bench-ui` (benchmarks/ui.py).

A scratch notebook builds the benchmark's Session (every request decoding) and a
Dashboard, with benchmarks.ui.StepTimer logging the kernel's split of each step
to a JSON-lines file. JupyterLab (lab_harness: private Jupyter folders, 127.0.0.1,
stopped by PID) runs it in headless Debian chromium; the page itself clicks Step and
times, with performance.now() and a MutationObserver, when the watched panels show the
new data-step, when their DOM last changes, the frame after that, Python's ack, and
when the whole dashboard goes quiet. Not a test: nothing here judges a time.
"""
from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import nbformat

from .lab_harness import CHROMIUM_ARGS, REPO, LabUI, find_chromium, start_lab_server
from .ui_common import WATCHED_PANELS, BenchUnavailable

NOTEBOOK = "bench_ui.ipynb"
KERNEL_LOG = "kernel_steps.jsonl"
DASHBOARD_TIMEOUT_MS = 1_200_000   # kernel start, model load, the warm-up prefill of every request
CLICK_TIMEOUT_MS = 120_000
QUIET_MS = 400                     # no DOM change anywhere in the dashboard for this long: settled

# Runs in the page: click Step, resolve with times relative to the click (ms).
CLICK_JS = """
async ({target, ids, quietMs, timeoutMs}) => {
  const dash = document.querySelector(".kvs-dashboard");
  const roots = ids.map((id) => dash.querySelector(`[data-testid="${id}"]`));
  const controls = dash.querySelector('[data-testid="kvs-controls"]');
  const btn = controls.querySelector('[data-testid="kvs-step-btn"]');
  const seen = {}, lastOf = {};
  const longTasks = [];
  const lt = new PerformanceObserver((list) => { for (const e of list.getEntries()) longTasks.push(e); });
  try { lt.observe({ type: "longtask" }); } catch (e) { /* no Long Tasks API: reported as null */ }
  let t0 = 0, lastPanel = null, lastAny = null, painted = null, ack = null, sawPending = false;
  return await new Promise((resolve) => {
    const finish = (timedOut) => {
      obs.disconnect();
      clearInterval(poll);
      for (const e of lt.takeRecords()) longTasks.push(e);
      lt.disconnect();
      const mine = longTasks.filter((e) => e.startTime >= t0);
      const rel = (t) => (t === null ? null : t - t0);
      const all = ids.every((id) => id in seen);
      resolve({ target, timedOut,
        step_attr_ms: all ? Math.max(...ids.map((id) => seen[id])) - t0 : null,
        per_panel_step_ms: Object.fromEntries(ids.map((id) => [id, rel(seen[id] ?? null)])),
        per_panel_last_ms: Object.fromEntries(ids.map((id) => [id, rel(lastOf[id] ?? null)])),
        long_tasks: mine.length, long_task_ms: mine.reduce((a, e) => a + e.duration, 0),
        panels_ms: rel(lastPanel), painted_ms: rel(painted), ack_ms: rel(ack), quiet_ms: rel(lastAny),
        steps_now: roots.map((r) => r.dataset.step) });
    };
    const obs = new MutationObserver((mutations) => {
      const now = performance.now();
      lastAny = now;
      const hit = roots.filter((r) => mutations.some((m) => r.contains(m.target)));
      hit.forEach((r) => { lastOf[ids[roots.indexOf(r)]] = now; });
      if (hit.length) {
        lastPanel = now;
        requestAnimationFrame(() => { painted = performance.now(); });
      }
      roots.forEach((r, i) => { if (!(ids[i] in seen) && r.dataset.step === String(target)) seen[ids[i]] = now; });
      const pending = controls.dataset.pending;
      if (pending && pending !== "0") sawPending = true;
      else if (sawPending && ack === null) ack = now;
    });
    obs.observe(dash, { subtree: true, childList: true, attributes: true, characterData: true });
    const poll = setInterval(() => {
      const now = performance.now();
      const settled = ids.every((id) => id in seen) && ack !== null && now - lastAny >= quietMs
        && painted !== null && painted >= lastPanel;
      if (settled) finish(false);
      else if (now - t0 > timeoutMs) finish(true);
    }, 10);
    t0 = performance.now();
    btn.click();
  });
}
"""


def build_notebook(path: Path, *, model: str | None, num_requests: int, num_kv_blocks: int, block_size: int,
                   steps: int, prompt_len: tuple[int, int], kernel_log: Path) -> None:
    """The scratch notebook: the benchmark's Session, a StepTimer, a Dashboard."""
    setup = (
        # The kernel runs in a temporary folder, and benchmarks/ is in no install (an editable
        # one maps engine, explorer and widgets only): it imports this checkout.
        f"import os, sys; sys.path.insert(0, {str(REPO)!r})\n"
        "from explorer import Dashboard\n"
        "from benchmarks.ui import StepTimer, prepare_session, all_decoding\n"
        f"session = prepare_session({model!r}, num_requests={num_requests}, num_kv_blocks={num_kv_blocks},\n"
        f"                          block_size={block_size}, steps={steps + 4}, prompt_len={tuple(prompt_len)!r})\n"
        f"assert all_decoding(session.current.snapshot, {num_requests})\n"
        f"timer = StepTimer(session, log_path={str(kernel_log)!r})\n"
        "session"
    )
    show = "dash = Dashboard(session)\ntimer.watch(dash.binder)\ndash"
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(setup), nbformat.v4.new_code_cell(show)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))


def read_kernel_log(path: Path) -> dict[int, dict]:
    if not path.is_file():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {int(r["step"]): r for r in rows}


def run_browser_bench(*, model: str | None, num_requests: int, num_kv_blocks: int, steps: int,
                      block_size: int = 16, prompt_len: tuple[int, int] = (64, 448), warmup_clicks: int = 1,
                      out: Callable[[str], None] = print) -> dict:
    """Start Lab + chromium, run the notebook, click Step `warmup_clicks + steps` times."""
    chromium = find_chromium()
    if chromium is None:
        raise BenchUnavailable("Debian chromium is not installed (scripts/setup.sh --with-browser installs it); "
                           "pass --no-browser to skip the browser part")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise BenchUnavailable("the playwright package is not installed (pip install -e '.[dev]'); "
                           "pass --no-browser to skip the browser part") from None
    import jupyterlab

    with tempfile.TemporaryDirectory(prefix="kvscope-bench-ui-") as tmp:
        root, home = Path(tmp) / "nb", Path(tmp) / "home"
        root.mkdir()
        kernel_log = root / KERNEL_LOG
        build_notebook(root / NOTEBOOK, model=model, num_requests=num_requests, num_kv_blocks=num_kv_blocks,
                       block_size=block_size, steps=steps + warmup_clicks, prompt_len=prompt_len,
                       kernel_log=kernel_log)
        t_start = time.monotonic()
        server = start_lab_server(root, home)
        try:
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
                try:
                    # Tall enough that the watched panels are on screen (so they are painted).
                    page = browser.new_context(viewport={"width": 1600, "height": 2400}).new_page()
                    clicks = _drive(page, server, steps=steps, warmup_clicks=warmup_clicks, out=out)
                    version = browser.version
                finally:
                    browser.close()
        except BaseException:
            out("JupyterLab log tail:\n" + server.log_tail(30))
            raise
        finally:
            server.stop()
        kernel = read_kernel_log(kernel_log)
    for c in clicks:
        c["kernel"] = kernel.get(int(c["target"]))
    measured = clicks[warmup_clicks:]
    return {"setup": {"num_requests": num_requests, "num_kv_blocks": num_kv_blocks, "block_size": block_size,
                      "clicks": len(measured), "warmup_clicks": warmup_clicks, "browser_version": version,
                      "jupyterlab": jupyterlab.__version__, "quiet_window_ms": QUIET_MS,
                      "timeouts": sum(bool(c["timedOut"]) for c in measured),
                      "all_decode": all((c["kernel"] or {}).get("num_decode") == num_requests for c in measured),
                      "wall_s": time.monotonic() - t_start},
            "clicks": clicks}


def _drive(page, server, *, steps: int, warmup_clicks: int, out: Callable[[str], None]) -> list[dict]:
    ui = LabUI(page, server)
    ui.open_notebook(NOTEBOOK)
    ui.run_all_cells()
    dash = page.locator(".kvs-dashboard").first
    failed = ui.failed_cells()
    try:
        # The Dashboard, or a cell's traceback at once (not after the whole timeout).
        dash.get_by_test_id("kvs-step-btn").or_(failed).first.wait_for(timeout=DASHBOARD_TIMEOUT_MS)
        if not failed.count():
            for testid in WATCHED_PANELS:
                dash.get_by_test_id(testid).first.wait_for(timeout=DASHBOARD_TIMEOUT_MS)
            ui.wait_kernel_idle(DASHBOARD_TIMEOUT_MS)
    finally:
        errors = ui.cell_errors()
    if errors:
        raise RuntimeError("the benchmark notebook failed:\n" + "\n\n".join(errors))
    dash.get_by_test_id("kvs-queues").first.scroll_into_view_if_needed()
    page.wait_for_timeout(1000)  # let Lab finish laying out before the first click
    clicks = []
    for i in range(warmup_clicks + steps):
        step = int(dash.get_by_test_id("kvs-queues").first.get_attribute("data-step"))
        res = page.evaluate(CLICK_JS, {"target": step + 1, "ids": list(WATCHED_PANELS), "quietMs": QUIET_MS,
                                       "timeoutMs": CLICK_TIMEOUT_MS})
        clicks.append(res)
        tag = "warm-up" if i < warmup_clicks else f"{i - warmup_clicks + 1}/{steps}"
        out(f"  click {tag}: step {res['target']}: panels {res['step_attr_ms'] or float('nan'):.0f} ms"
            + (" (timed out)" if res["timedOut"] else ""))
    return clicks
