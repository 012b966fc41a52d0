"""Fixtures of the browser tests (the machinery is in benchmarks/lab_harness.py)."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import nbformat
import pytest

from benchmarks.lab_harness import TEST_OUTPUT, LabServer, LabUI, start_lab_server


@pytest.fixture(scope="session")
def lab_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[Path], LabServer]]:
    """`start(root_dir)` -> LabServer; every server started is stopped at the end."""
    servers: list[LabServer] = []

    def start(root_dir: Path) -> LabServer:
        server = start_lab_server(root_dir, tmp_path_factory.mktemp("jupyter-home"))
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def page(browser, request: pytest.FixtureRequest):
    """A fresh browser context per test; console errors are collected on `page.console_errors`."""
    context = browser.new_context(viewport={"width": 1600, "height": 1000})
    pg = context.new_page()
    pg.console_errors = []  # type: ignore[attr-defined]
    pg.on("console", lambda m: pg.console_errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: pg.console_errors.append(str(e)))
    yield pg
    # Keep a picture of the final state of a failed test: the cheapest way to debug it.
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        TEST_OUTPUT.mkdir(exist_ok=True)
        try:
            pg.screenshot(path=str(TEST_OUTPUT / f"FAILED-{request.node.name}.png"), full_page=True)
        except Exception:  # noqa: BLE001 - best effort only
            pass
    context.close()


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)


@pytest.fixture
def lab_ui() -> type[LabUI]:
    """The LabUI class: `lab_ui(page, server)`."""
    return LabUI


@pytest.fixture
def save_screenshot() -> Callable[..., Path]:
    """`save_screenshot(page, name)`: a PNG under test-output/ (git-ignored); returns its path."""

    def save(page, name: str, **kwargs) -> Path:
        TEST_OUTPUT.mkdir(exist_ok=True)
        path = TEST_OUTPUT / f"{name}.png"
        page.screenshot(path=str(path), **kwargs)
        return path

    return save


@pytest.fixture
def run_notebook(tmp_path: Path, lab_factory: Callable[[Path], LabServer], page) -> Callable[..., LabUI]:
    """`run_notebook(name, *cells)`: a notebook of those code cells, in a folder of its own,
    opened in JupyterLab with every cell run; returns its LabUI."""

    def run(name: str, *cells: str) -> LabUI:
        root = tmp_path / "notebooks"
        root.mkdir(exist_ok=True)
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_code_cell(cell) for cell in cells]
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
        nbformat.write(nb, root / name)
        ui = LabUI(page, lab_factory(root))
        ui.open_notebook(name)
        ui.run_all_cells()
        return ui

    return run
