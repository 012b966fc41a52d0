"""Python run in Pyodide under Node (tests/docs/pyodide_run.cjs), with the project's files as a
docs page gets them (explorer/export/rerun_site.py's zip), for the tests that hold it to CPython."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_in_pyodide(script: str, payload: str, tmp_path: Path, zip_bytes: bytes | None = None) -> str:
    """What `script`'s last expression returns (a str) in Pyodide, its global INPUT = `payload`;
    `zip_bytes`: the project's files (default: built now, as `make docs` builds them)."""
    from explorer.export.rerun_site import pyodide_dir, python_files, python_zip

    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (scripts/setup.sh --with-browser installs it)")
    try:
        pyodide = pyodide_dir()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    (tmp_path / "kvscope.zip").write_bytes(zip_bytes if zip_bytes is not None else python_zip(python_files()))
    (tmp_path / "script.py").write_text(script)
    (tmp_path / "input.json").write_text(payload)
    done = subprocess.run([node, str(REPO / "tests" / "docs" / "pyodide_run.cjs"), str(pyodide),
                           str(tmp_path / "kvscope.zip"), str(tmp_path / "script.py"), str(tmp_path / "input.json"),
                           str(tmp_path / "out.json")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    print(done.stderr.strip())
    return (tmp_path / "out.json").read_text()
