"""ruff (pyproject.toml's [tool.ruff]) on the whole repository, every file its configuration
includes, and mypy ([tool.mypy]) on all of engine/, explorer/ and widgets/: anything either
reports fails the test, with their output (docs/testing.md).

mypy keeps its cache in .mypy_cache (git-ignored): a fresh checkout's first run analyses torch
too and takes longer (docs/testing.md has the times). A planted type error and a planted lint
error, in a temporary copy of a checked module, show that both tools would report one."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "pyproject.toml"
CHECKED = ["engine", "explorer", "widgets"]   # mypy's paths; ruff checks the whole repository


def _run(tool: list[str], paths: list[str]) -> subprocess.CompletedProcess:
    # MYPYPATH: this checkout's engine/ and explorer/ for a module outside it (the planted copy),
    # not the ones an editable install elsewhere would point at.
    env = {**os.environ, "MYPYPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", *tool, *paths], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


def ruff(paths: list[str]) -> subprocess.CompletedProcess:
    return _run(["ruff", "check", "--config", str(CONFIG), "--output-format", "concise", "--no-cache"], paths)


def mypy(paths: list[str]) -> subprocess.CompletedProcess:
    return _run(["mypy", "--config-file", str(CONFIG)], paths)


def _report(result: subprocess.CompletedProcess) -> str:
    return f"exit {result.returncode}\n{result.stdout}{result.stderr}"


def test_checked_paths_exist():
    missing = [p for p in CHECKED if not (ROOT / p).exists()]
    assert not missing, f"CHECKED names paths that are gone: {missing}"


def test_ruff_reports_nothing():
    # The repository root: ruff finds the files itself, less what [tool.ruff] excludes.
    result = ruff(["."])
    assert result.returncode == 0, _report(result)


def test_mypy_reports_nothing():
    result = mypy(CHECKED)
    assert result.returncode == 0 and "Success: no issues found" in result.stdout, _report(result)


def test_a_planted_type_error_and_lint_error_are_reported(tmp_path):
    # Copies of a checked module: one with an unused import (ruff), one with a misspelt record key
    # in StepRecord.to_dict (mypy; its relative imports made absolute: it lives outside the
    # packages). Each copy is clean before the plant, so what is reported is what was planted.
    source = (ROOT / "engine" / "report" / "records.py").read_text()
    assert "import gc\n" in source and "REC.STEP: self.step," in source, "the planting spots moved: plant elsewhere"

    lint_copy = tmp_path / "lint" / "records.py"
    lint_copy.parent.mkdir()
    lint_copy.write_text(source)
    assert ruff([str(lint_copy)]).returncode == 0, _report(ruff([str(lint_copy)]))
    lint_copy.write_text(source.replace("import gc\n", "import gc\nimport shutil\n", 1))
    lint = ruff([str(lint_copy)])
    assert lint.returncode == 1 and "F401" in lint.stdout and "shutil" in lint.stdout, _report(lint)

    absolute = re.sub(r"^(\s*)from \.\.(\w)", r"\1from engine.\2", source, flags=re.M)
    absolute = re.sub(r"^(\s*)from \.(\w)", r"\1from engine.report.\2", absolute, flags=re.M)
    types_copy = tmp_path / "types" / "planted_records.py"
    types_copy.parent.mkdir()
    types_copy.write_text(absolute)
    clean = mypy([str(types_copy)])
    assert clean.returncode == 0, _report(clean)
    types_copy.write_text(absolute.replace("REC.STEP: self.step,", '"stepp": self.step,', 1))
    types = mypy([str(types_copy)])
    assert types.returncode == 1, _report(types)
    assert '"stepp"' in types.stdout and "[typeddict-unknown-key]" in types.stdout, _report(types)
    assert 'Missing key "step"' in types.stdout, _report(types)
