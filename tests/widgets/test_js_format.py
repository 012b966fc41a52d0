"""The project's JavaScript is formatted by Prettier (pinned and installed into .venv/node by
scripts/setup.sh; its options in .prettierrc.json, the generated and vendored files it leaves
alone in .prettierignore). To format after an edit:
`.venv/node/node_modules/.bin/prettier --write 'widgets/*.js' 'explorer/export/*.js' 'tests/widgets/js/*.mjs'
'tests/docs/*.cjs'`."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from .conftest import node_tool

REPO = Path(__file__).resolve().parents[2]
# Every hand-written JavaScript file (the panels' and the export's CSS keep their own compact style).
FORMATTED = ["widgets/*.js", "explorer/export/*.js", "tests/widgets/js/*.mjs", "tests/docs/*.cjs"]


def check(paths: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(node_tool("prettier", "prettier")), "--check", "--no-color", *paths],
                          capture_output=True, text=True, timeout=300, cwd=cwd)


def test_the_javascript_is_formatted() -> None:
    result = check(FORMATTED, REPO)
    assert result.returncode == 0, ("format with `.venv/node/node_modules/.bin/prettier --write "
                                    f"{' '.join(repr(g) for g in FORMATTED)}`\n{result.stdout}{result.stderr}")
    assert "widgets/queues.js" not in result.stdout   # (it lists what it finds misformatted)


def test_the_check_catches_a_planted_misformat(tmp_path: Path) -> None:
    # A copy of a panel with one line's spacing changed, under the repository's options.
    for name in (".prettierrc.json", ".prettierignore"):
        shutil.copy(REPO / name, tmp_path / name)
    (tmp_path / "widgets").mkdir()
    source = (REPO / "widgets" / "queues.js").read_text()
    assert "const " in source
    (tmp_path / "widgets" / "queues.js").write_text(source.replace("const ", "const  ", 1))
    (tmp_path / "widgets" / "_panels.js").write_text("const   generated = 1\n")   # ignored: generated
    result = check(["widgets/*.js"], tmp_path)
    assert result.returncode != 0 and "queues.js" in result.stdout + result.stderr
    assert "_panels.js" not in result.stdout + result.stderr
