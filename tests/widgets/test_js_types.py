"""The panels' JavaScript type-checks: every widgets/*.js file and the export host carry
`// @ts-check` with JSDoc types, and `tsc --noEmit -p tsconfig.json` (typescript, pinned and
installed into .venv/node by scripts/setup.sh) finds no error. The panels run as plain ES
modules with _schema.js and _common.js prepended, so tsc sees those two as global scripts and
widgets/kvs_types.d.ts as the types of anywidget's model."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import node_tool

REPO = Path(__file__).resolve().parents[2]
# Generated (engine/report/schema.py and `python -m widgets` write them): checked, without a header of their own.
GENERATED = {"_schema.js", "_panels.js"}


def run_tsc(project: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(node_tool("tsc", "typescript")), "--noEmit", "--pretty", "false", "-p", str(project)],
                          capture_output=True, text=True, timeout=300, cwd=project.parent)


def checked_files() -> list[Path]:
    return [*sorted((REPO / "widgets").glob("*.js")), REPO / "explorer" / "export" / "host.js"]


def test_every_panel_file_asks_for_the_check() -> None:
    missing = [p.name for p in checked_files() if p.name not in GENERATED
               and p.read_text().splitlines()[0].strip() != "// @ts-check"]
    assert missing == []
    config = json.loads((REPO / "tsconfig.json").read_text())
    assert config["compilerOptions"]["checkJs"] and config["compilerOptions"]["strict"]
    assert set(config["include"]) >= {"widgets/*.js", "widgets/*.d.ts", "explorer/export/host.js"}


@pytest.mark.slow  # tsc takes ~10-20 s on a shared 2-core machine
def test_the_panels_javascript_type_checks() -> None:
    result = run_tsc(REPO / "tsconfig.json")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_the_check_catches_a_planted_type_error(tmp_path: Path) -> None:
    # The same project over copies of the files, one call given a number where a tag name goes
    # and one queue card's field misspelt (the card's type is generated from Python's
    # QueueRowDict, widgets/_panel_states.d.ts): tsc must name both.
    (tmp_path / "widgets").mkdir()
    (tmp_path / "explorer" / "export").mkdir(parents=True)
    for src in [*checked_files(), *sorted((REPO / "widgets").glob("*.d.ts"))]:
        dst = tmp_path / src.relative_to(REPO)
        dst.write_text(src.read_text())
    queues = tmp_path / "widgets" / "queues.js"
    text = queues.read_text()
    assert "row.num_prompt_tokens" in text
    text = text.replace('kvsEl("div"', "kvsEl(7", 1).replace("row.num_prompt_tokens", "row.num_prompt_tokenz", 1)
    queues.write_text(text)
    shutil.copy(REPO / "tsconfig.json", tmp_path / "tsconfig.json")
    result = run_tsc(tmp_path / "tsconfig.json")
    assert result.returncode != 0
    errors = [line for line in result.stdout.splitlines() if "error TS" in line]
    assert len(errors) == 2 and all(line.startswith("widgets/queues.js(") for line in errors), result.stdout
    assert any("TS2345" in line for line in errors), errors
    assert any("TS2551" in line and "num_prompt_tokenz" in line for line in errors), errors
