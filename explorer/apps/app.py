"""`python -m explorer app`: the Dashboard alone on a web page, served by Voila.

For a lab session or a talk: no notebook, no code cells, just the panels of one live
Session. Voila runs a generated one-cell notebook (`app_notebook`) whose cell calls
`loading_dashboard(...)`: the page shows at once with a progress line while the model
loads in a worker thread, and the Dashboard replaces it when the Session is ready.

As `make lab` (explorer/apps/lab.py): the server binds 127.0.0.1 only, keeps token
authentication on (the token goes to Voila through JUPYTER_TOKEN, not the command line,
where `ps` would show it), and a busy port is replaced by a free one, said on stdout.
"""
from __future__ import annotations

import hashlib
import html
import json
import logging
import os
import secrets
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, cast

from .lab import HOST, ServerLaunch, choose_port, exec_server

if TYPE_CHECKING:
    import asyncio

    import ipywidgets as W

    from ..core.session import Session
    from ..export.delta import JSONValue
    from ..ui.panel_views import PoolConfigDict

DEFAULT_PORT = 8866
TEMPLATES = Path(__file__).resolve().parent / "app_templates"  # voila/templates/kvscope
APP_TITLE = "kvscope"
_POOL_AND_BUDGET = ("num_kv_blocks", "block_size", "max_num_batched_tokens", "max_num_seqs")


# -- the page: a progress line, then the Dashboard ----------------------------------------------
class _LastLine(logging.Handler):
    """Keeps the last log line of the engine while it loads (conversion, weights, pool)."""

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.line = ""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.line = record.getMessage()[:200]
        except Exception:  # noqa: BLE001 - a progress line must never fail the load
            pass


def loading_dashboard(model: str | None = None, config: PoolConfigDict | None = None, *,
                      session_factory: Callable[[], Session] | None = None) -> W.VBox:
    """A widget that shows loading progress, then becomes the Dashboard of a new Session.

    The Session (the model load: seconds, or a minute or two the first time the default
    model is converted) is built in a worker thread; every widget is made and changed on
    the kernel's own event loop. Outside a running event loop it loads in place."""

    import ipywidgets as W

    config = config.copy() if config else {}
    name = model or "SmolLM2-135M-Instruct (the default model)"
    status = W.HTML()
    box = W.VBox([status], layout=W.Layout(width="100%"))
    box.add_class("kvs-app")
    started = time.monotonic()
    handler = _LastLine()
    state = {"done": False}

    def show_progress() -> None:
        elapsed = time.monotonic() - started
        detail = f"<div style='color:#777;font-size:12px'>{html.escape(handler.line)}</div>" if handler.line else ""
        status.value = (
            "<div data-testid='kvs-app-loading' style='font-family:system-ui,sans-serif;padding:16px'>"
            f"<div style='font-size:15px;margin-bottom:6px'>kvscope: loading {html.escape(name)} "
            f"<span data-testid='kvs-app-elapsed'>({elapsed:.0f} s)</span></div>"
            "<progress style='width:320px'></progress>"
            "<div style='color:#555;font-size:12px;margin-top:4px'>The first run converts the default model once "
            "(a minute or two on a CPU); later runs take seconds.</div>"
            f"{detail}</div>")

    def build() -> Session:
        if session_factory is not None:
            return session_factory()
        from ..core.session import Session

        return Session(model, **config)

    def finish(session: Session | None, error: BaseException | None) -> None:
        state["done"] = True
        for name_ in ("engine", "explorer"):
            logging.getLogger(name_).removeHandler(handler)
        if error is not None:
            status.value = ("<div data-testid='kvs-app-error' style='font-family:system-ui,sans-serif;padding:16px;"
                            "color:#a31515'>kvscope could not start the engine: "
                            f"{html.escape(f'{type(error).__name__}: {error}')}</div>")
            return
        from .dashboard import Dashboard  # saving a run as an HTML export

        assert session is not None   # without an error, build() made one
        dash = Dashboard(session)
        box.children = [dash]
        box.session = session  # for whoever holds the page's widget
        box.dashboard = dash

    for name_ in ("engine", "explorer"):
        logging.getLogger(name_).addHandler(handler)
    show_progress()
    loop = _kernel_loop()
    if loop is None:  # no kernel loop (a plain script): load here and now
        try:
            session = build()
        except Exception as exc:  # noqa: BLE001 - shown on the page
            finish(None, exc)
        else:
            finish(session, None)
        return box

    def tick() -> None:
        if not state["done"]:
            show_progress()
            loop.call_later(1.0, tick)

    def work() -> None:
        try:
            session = build()
        except BaseException as exc:  # noqa: BLE001 - shown on the page
            loop.call_soon_threadsafe(finish, None, exc)
        else:
            loop.call_soon_threadsafe(finish, session, None)

    loop.call_later(1.0, tick)
    threading.Thread(target=work, name="kvscope-app-load", daemon=True).start()
    return box


def _kernel_loop() -> asyncio.AbstractEventLoop | None:
    """The running event loop of the IPython kernel this code runs in, or None. Only a
    kernel's loop counts: another library's loop (Playwright's sync API keeps one set on
    the main thread) would never run the callbacks that finish the page."""
    import asyncio

    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    if shell is None or getattr(shell, "kernel", None) is None:
        return None
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


# -- the notebook Voila runs --------------------------------------------------------------------
class NotebookCellDict(TypedDict):
    """One cell of an nbformat 4 notebook."""
    cell_type: str
    id: str
    metadata: dict[str, JSONValue]   # nbformat's free-form cell metadata
    execution_count: int | None
    outputs: list[JSONValue]
    source: str


class KernelSpecDict(TypedDict):
    """The kernel a notebook runs on."""
    name: str
    display_name: str
    language: str


class LanguageInfoDict(TypedDict):
    """A notebook's language."""
    name: str


class NotebookMetadataDict(TypedDict):
    """The app notebook's metadata: its kernel and language, and the page's title (Voila's)."""
    kernelspec: KernelSpecDict
    language_info: LanguageInfoDict
    title: str


class NotebookDict(TypedDict):
    """An nbformat 4 notebook, as its JSON file holds it."""
    nbformat: int
    nbformat_minor: int
    metadata: NotebookMetadataDict
    cells: list[NotebookCellDict]


def app_notebook(model: str | None = None, config: PoolConfigDict | None = None) -> NotebookDict:
    """A one-cell notebook (nbformat 4) that shows `loading_dashboard(model, config)`."""
    code = ("from explorer.apps.app import loading_dashboard\n"
            f"loading_dashboard(model={model!r}, config={json.loads(json.dumps(config or {}))!r})")
    return {
        "nbformat": 4, "nbformat_minor": 5,
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                     "language_info": {"name": "python"}, "title": APP_TITLE},
        "cells": [{"cell_type": "code", "id": "kvscope-app", "metadata": {}, "execution_count": None,
                   "outputs": [], "source": code}],
    }


def app_dir() -> Path:
    """Where generated app notebooks live (kvscope's cache folder)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "kvscope" / "app"


def write_app_notebook(model: str | None = None, config: PoolConfigDict | None = None,
                       folder: Path | None = None) -> Path:
    """Write the app notebook (named after its settings, so two apps never share one)."""
    nb = app_notebook(model, config)
    text = json.dumps(nb, indent=1)
    folder = Path(folder) if folder else app_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"kvscope-app-{hashlib.sha1(text.encode()).hexdigest()[:10]}.ipynb"
    path.write_text(text)
    return path


@dataclass
class AppLaunch(ServerLaunch):
    """A Voila server's launch, and the one notebook it serves."""

    notebook: Path = Path()


def app_launch(notebook: Path, port: int, *, open_browser: bool = False, token: str | None = None,
               env: dict[str, str] | None = None, extra_args: list[str] | None = None) -> AppLaunch:
    """The command for Voila on 127.0.0.1:`port` serving `notebook` alone.

    Voila's own port retries are off: if the port is taken between our check and its
    bind, a clear failure beats a server on a port the printed URL does not name.
    `--token` turns token auth on; the token itself travels in JUPYTER_TOKEN."""
    notebook = Path(notebook).resolve()
    token = token or secrets.token_hex(24)
    argv = [
        sys.executable, "-m", "voila", str(notebook),
        f"--Voila.ip={HOST}", f"--port={port}", "--Voila.port_retries=0", "--token",
        "--theme=light", "--show_tracebacks=True", "--template=kvscope",
        f"--Voila.open_browser={open_browser}",
    ]
    argv += list(extra_args or [])
    full_env = dict(os.environ if env is None else env)
    full_env["JUPYTER_TOKEN"] = token
    # Voila finds the kvscope page template (explorer/apps/app_templates) on the Jupyter path.
    paths = [str(TEMPLATES), *(p for p in full_env.get("JUPYTER_PATH", "").split(os.pathsep) if p)]
    full_env["JUPYTER_PATH"] = os.pathsep.join(dict.fromkeys(paths))
    url = f"http://{HOST}:{port}/?token={token}"
    return AppLaunch(argv=argv, env=full_env, cwd=notebook.parent, port=port, token=token, url=url, notebook=notebook)


def run_app(port: int = DEFAULT_PORT, open_browser: bool = True, model: str | None = None,
            config: PoolConfigDict | None = None) -> int:
    """Print the URL and replace this process by the Voila server (same PID, so Ctrl-C
    and `kill PID` reach Voila directly and it shuts its kernel down)."""
    try:
        import voila  # noqa: F401
    except ImportError:
        print("error: app mode needs Voila: pip install voila (scripts/setup.sh installs it)", file=sys.stderr)
        return 2
    if model is not None and not Path(model).is_dir():
        print(f"error: model: no such folder {model!r}", file=sys.stderr)
        return 2
    # The options given: their keys, less those left to the engine's default.
    given = cast("PoolConfigDict", {k: v for k, v in (config or {}).items() if v is not None})
    notebook = write_app_notebook(str(Path(model).resolve()) if model else None, given)
    chosen = choose_port(port)
    if chosen != port:
        print(f"[kvscope] port {port} is busy; using free port {chosen} instead", flush=True)
    exec_server(app_launch(notebook, chosen, open_browser=open_browser),
                f"app: the Dashboard alone, served by Voila ({notebook})")
    return 0  # not reached
