"""Browser test harness: a private JupyterLab server, a headless Debian chromium, and
the few JupyterLab gestures the tests make (LabUI).

Each server gets its own temporary JUPYTER_CONFIG_DIR / JUPYTER_DATA_DIR /
JUPYTER_RUNTIME_DIR / IPYTHONDIR / JUPYTERLAB_SETTINGS_DIR / JUPYTERLAB_WORKSPACES_DIR
and serves a copy of the notebooks, so a test run writes nothing into the project or
the user's Jupyter set-up. It binds 127.0.0.1 on a free port and is stopped by PID.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from explorer.apps.lab import free_port, lab_launch

REPO = Path(__file__).resolve().parents[1]
TEST_OUTPUT = REPO / "test-output"

# Chromium flags that work headless in a container: no sandbox (no user namespaces there), no
# GPU, nothing fetched in the background, and no /dev/shm (often 64 MiB in a container).
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage",
]

# Lab settings that keep dialogs away: no "Select Kernel" prompt, no news prompt.
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"autoStartDefaultKernel": True},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false", "checkForUpdates": False},
}

SERVER_START_TIMEOUT_S = 90.0


def find_chromium() -> str | None:
    """Debian's chromium binary; the real one first (the /usr/bin wrapper starts slower)."""
    for path in ("/usr/lib/chromium/chromium", "/usr/bin/chromium"):
        if os.access(path, os.X_OK):
            return path
    return shutil.which("chromium") or shutil.which("chromium-browser")


@dataclass
class LabServer:
    """A running JupyterLab test server."""

    proc: subprocess.Popen
    port: int
    token: str
    root_dir: Path
    home: Path
    log_path: Path
    env: dict[str, str] = field(repr=False, default_factory=dict)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str = "lab") -> str:
        """URL of `path` with `?reset` (fresh workspace) and the token."""
        return f"{self.base_url}/{path}?reset&token={self.token}"

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """SIGTERM by PID (Jupyter then shuts its kernels down); SIGKILL if it hangs."""
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)


def isolated_jupyter_env(home: Path) -> dict[str, str]:
    """Environment with every Jupyter/IPython folder under `home`, Lab settings written."""
    dirs = {
        "JUPYTER_CONFIG_DIR": home / "config",
        "JUPYTER_DATA_DIR": home / "data",
        "JUPYTER_RUNTIME_DIR": home / "runtime",
        "IPYTHONDIR": home / "ipython",
        "JUPYTERLAB_SETTINGS_DIR": home / "lab-settings",
        "JUPYTERLAB_WORKSPACES_DIR": home / "lab-workspaces",
    }
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    for rel, value in LAB_SETTINGS.items():
        path = dirs["JUPYTERLAB_SETTINGS_DIR"] / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))
    env = dict(os.environ)
    env.update({k: str(v) for k, v in dirs.items()})
    env["JUPYTER_PLATFORM_DIRS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    # Kernels must not reach out for anything; the engine's model is local.
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_OFFLINE"] = "1"
    return env


def wait_until_ready(server: LabServer, timeout_s: float = SERVER_START_TIMEOUT_S) -> None:
    """Poll /api/status (authenticated) until the server answers."""
    deadline = time.monotonic() + timeout_s
    url = f"{server.base_url}/api/status?token={server.token}"
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"JupyterLab exited with {server.proc.returncode}:\n{server.log_tail()}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.25)
    raise RuntimeError(f"JupyterLab did not answer within {timeout_s:.0f} s:\n{server.log_tail()}")


def start_lab_server(root_dir: Path, home: Path) -> LabServer:
    """Start JupyterLab serving `root_dir` with its Jupyter folders under `home`."""
    env = isolated_jupyter_env(home)
    port = free_port()
    launch = lab_launch(root_dir, port, notebook=None, open_browser=False, env=env,
                        extra_args=["--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"])
    log_path = home / "jupyterlab.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen(launch.argv, env=launch.env, cwd=launch.cwd, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    server = LabServer(proc=proc, port=port, token=launch.token, root_dir=launch.cwd, home=home,
                       log_path=log_path, env=launch.env)
    try:
        wait_until_ready(server)
    except BaseException:
        server.stop()
        raise
    return server


# A kernel is connected once the status bar names it and says Idle ("No Kernel | Idle"
# and the notebook toolbar's early "idle" show up before the websocket is open, and a
# Run All clicked then is silently dropped).
_KERNEL_IDLE_JS = """() => [...document.querySelectorAll('.jp-StatusBar-TextItem')]
    .some(e => /^(?!No Kernel).+ \\| Idle$/.test(e.textContent.trim()))"""


class LabUI:
    """What a person does in JupyterLab, as Playwright calls."""

    def __init__(self, page, server: LabServer) -> None:
        self.page = page
        self.server = server

    def open_notebook(self, name: str, timeout_ms: float = 90_000) -> None:
        """Open `name` (relative to the server's root) and wait until its kernel is connected."""
        self.page.goto(self.server.url(f"lab/tree/{name}"))
        self.page.wait_for_selector(".jp-Notebook", timeout=timeout_ms)
        self.wait_kernel_idle(timeout_ms)

    def wait_kernel_idle(self, timeout_ms: float = 90_000) -> None:
        self.page.wait_for_function(_KERNEL_IDLE_JS, timeout=timeout_ms)

    def run_all_cells(self) -> None:
        """Run menu -> Run All Cells, as a person would."""
        self.page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
        self.page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()

    def failed_cells(self):
        """The cell outputs that show a traceback (a Playwright locator: a wait can end on one)."""
        # Lab renders an error as a stderr output; its IPython traceback tells it from a warning.
        return self.page.locator("[data-mime-type='application/vnd.jupyter.stderr']",
                                 has_text="Traceback (most recent call last)")

    def cell_errors(self) -> list[str]:
        """Tracebacks shown in cell outputs (a failed cell explains a missing widget)."""
        return self.failed_cells().all_inner_texts()


def focus_pixels_js(canvas_selector: str) -> str:
    """A JS function `(block) => n`: pixels of the linked-highlight halo (_common.js
    KVS_MARKS.focus) in that block's cell of the pool canvas (26 px cells: at most 256 blocks)."""
    return """(block) => {
    const c = document.querySelector('CANVAS');
    const dpr = window.devicePixelRatio || 1, cell = 26, ncols = Math.round(parseFloat(c.style.width) / cell);
    const x = (block % ncols) * cell, y = Math.floor(block / ncols) * cell;
    const d = c.getContext('2d').getImageData(x * dpr, y * dpr, cell * dpr, cell * dpr).data;
    let n = 0;
    for (let k = 0; k < d.length; k += 4) if (d[k] > 247 && Math.abs(d[k + 1] - 214) < 8 && d[k + 2] < 8) n++;
    return n; }""".replace("CANVAS", canvas_selector)


def screenshot_whole(page, element, path: Path, width: int = 1600) -> None:
    """A picture of the whole element at a window `width` px wide: one taller than the viewport
    is clipped inside Lab's scrolling notebook, so the viewport grows to its height first."""
    page.set_viewport_size({"width": width, "height": 900})
    page.wait_for_timeout(500)  # the width first: the layout (and so the height) follows it
    height = int(element.bounding_box()["height"])
    page.set_viewport_size({"width": width, "height": height + 300})
    page.wait_for_timeout(500)  # let Lab re-lay out and plotly resize
    element.scroll_into_view_if_needed()
    element.screenshot(path=str(path))
