"""`python -m explorer lab`: start JupyterLab on the walkthrough notebook.

In a checkout it serves the repository's notebooks/ in place. An installed kvscope (pip
install) carries the same notebooks as package data (explorer/apps/notebooks, a symlink to
notebooks/ in the repository): they are copied into a working folder, ./kvscope-notebooks,
where the user's edits stay theirs (a notebook already there is never overwritten).

The server binds 127.0.0.1 only and keeps Jupyter's token authentication on. The
token is generated here and handed to Jupyter through the JUPYTER_TOKEN environment
variable (not the command line, where `ps` would show it), so the URL printed below
is the one that works.
"""
from __future__ import annotations

import os
import secrets
import shutil
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

HOST = "127.0.0.1"
DEFAULT_PORT = 8888
NOTEBOOK = "walkthrough.ipynb"
WORKING_FOLDER = "kvscope-notebooks"


def repo_notebooks_dir() -> Path:
    """The repository's notebooks/ folder (the explorer package sits beside it)."""
    return Path(__file__).resolve().parents[2] / "notebooks"


def packaged_notebooks_dir() -> Path:
    """The notebooks the package carries (in a checkout, the symlink to notebooks/)."""
    return Path(__file__).resolve().parent / "notebooks"


def in_checkout() -> bool:
    """True when this explorer package is the one of a repository checkout (editable install
    or PYTHONPATH), not a copy installed into site-packages."""
    root = Path(__file__).resolve().parents[2]
    return (root / "pyproject.toml").is_file() and (root / "notebooks" / NOTEBOOK).is_file()


def copy_notebooks(dest: Path) -> tuple[list[str], list[str]]:
    """Copy the packaged notebooks into `dest` (created), leaving any already there as they
    are: returns (the names copied, the names kept)."""
    source = packaged_notebooks_dir()
    names = sorted(p.name for p in source.glob("*.ipynb"))
    if NOTEBOOK not in names:
        raise FileNotFoundError(f"{source / NOTEBOOK} is not installed (a kvscope package built without its "
                                "notebooks): reinstall kvscope")
    dest.mkdir(parents=True, exist_ok=True)
    copied, kept = [], []
    for name in names:
        if (dest / name).exists():
            kept.append(name)
        else:
            shutil.copyfile(source / name, dest / name)
            copied.append(name)
    return copied, kept


def notebooks_root(notebooks_dir: Path | None) -> Path:
    """The folder lab serves: `notebooks_dir` as it is, else the checkout's notebooks/, else
    the working folder the packaged notebooks are copied into (named on the console)."""
    if notebooks_dir:
        return Path(notebooks_dir)
    if in_checkout():
        return repo_notebooks_dir()
    dest = Path.cwd() / WORKING_FOLDER
    copied, kept = copy_notebooks(dest)
    print(f"[kvscope] working folder: {dest.resolve()}", flush=True)
    if copied:
        print(f"[kvscope]   copied from the installed package: {', '.join(copied)}", flush=True)
    if kept:
        print(f"[kvscope]   already there, kept as they are (yours): {', '.join(kept)}", flush=True)
    return dest


def port_is_free(port: int, host: str = HOST) -> bool:
    """True when nothing listens on host:port (we can bind it ourselves)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # No SO_REUSEADDR: a port held by a listener must read as busy.
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = HOST) -> int:
    """A port the OS says is free now (it may be taken again before we use it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def choose_port(requested: int, host: str = HOST) -> int:
    """`requested` if it is free, else another free port."""
    return requested if port_is_free(requested, host) else free_port(host)


@dataclass
class ServerLaunch:
    """Everything needed to start one Jupyter server (JupyterLab, or Voila for app mode):
    argv, env and the URL to open."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path
    port: int
    token: str
    url: str


def exec_server(launch: ServerLaunch, what: str) -> None:
    """Print the URL and replace this process by the server (same PID, so Ctrl-C and
    `kill PID` reach it directly and it shuts its kernels down)."""
    print(f"[kvscope] {what}", flush=True)
    print(f"[kvscope] open: {launch.url}", flush=True)
    print(f"[kvscope] pid {os.getpid()}; stop with Ctrl-C or `kill {os.getpid()}`", flush=True)
    os.chdir(launch.cwd)
    os.execve(launch.argv[0], launch.argv, launch.env)


def lab_launch(root_dir: Path, port: int, *, notebook: str | None = NOTEBOOK, open_browser: bool = False,
               token: str | None = None, env: dict[str, str] | None = None,
               extra_args: list[str] | None = None) -> ServerLaunch:
    """Build the command for a JupyterLab server on 127.0.0.1:`port` serving `root_dir`.

    Jupyter's own port retries are off (`port_retries=0`): if the port is taken between
    our check and its bind, a clear failure beats a server on a port the printed URL
    does not name. `sys.executable` runs it, so kernels get this interpreter's packages.
    """
    root_dir = Path(root_dir).resolve()
    token = token or secrets.token_hex(24)
    argv = [
        sys.executable, "-m", "jupyterlab",
        f"--ServerApp.ip={HOST}",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--ServerApp.root_dir={root_dir}",
        f"--ServerApp.open_browser={open_browser}",
        # Voila's Lab extension reads the deprecated ServerApp.token while it links (the token is
        # IdentityProvider's, from JUPYTER_TOKEN) and turns traitlets' deprecation warnings back
        # on, so Lab would warn about a setting nobody made. `explorer app` runs Voila on its own.
        "--ServerApp.jpserver_extensions={'voila.server_extension': False}",
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        argv.append("--allow-root")  # Jupyter refuses to run as root without it
    argv += list(extra_args or [])
    if notebook:
        argv.append(notebook)  # relative to cwd=root_dir: Lab opens it on start
    full_env = dict(os.environ if env is None else env)
    full_env["JUPYTER_TOKEN"] = token
    path = f"lab/tree/{notebook}" if notebook else "lab"
    url = f"http://{HOST}:{port}/{path}?token={token}"
    return ServerLaunch(argv=argv, env=full_env, cwd=root_dir, port=port, token=token, url=url)


def run_lab(port: int = DEFAULT_PORT, open_browser: bool = True, notebooks_dir: Path | None = None) -> int:
    """Print the URL and replace this process by the JupyterLab server (exec_server)."""
    try:
        root = notebooks_root(notebooks_dir)
    except OSError as exc:  # the package lacks its notebooks, or the working folder cannot be written
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not root.is_dir():
        print(f"error: notebooks folder not found: {root}\n"
              "  run from a checkout of the repository, or pass --notebook-dir PATH", file=sys.stderr)
        return 2
    chosen = choose_port(port)
    if chosen != port:
        print(f"[kvscope] port {port} is busy; using free port {chosen} instead", flush=True)
    notebook = NOTEBOOK if (root / NOTEBOOK).is_file() else None
    if notebook is None:
        print(f"[kvscope] note: {root / NOTEBOOK} not found; opening the file browser", flush=True)
    exec_server(lab_launch(root, chosen, notebook=notebook, open_browser=open_browser), f"JupyterLab serving {root}")
    return 0  # not reached
