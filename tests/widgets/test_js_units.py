"""The panels' pure JavaScript (scales, step windows, labels, the schema's event codes) under
node's own test runner, without a browser: tests/widgets/js/*.test.mjs load each panel's
bundle as anywidget gets it (tests/widgets/js/load_panel.mjs)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

JS_TESTS = Path(__file__).parent / "js"


def test_the_panels_pure_parts_pass_under_node():
    node = shutil.which("node")
    if node is None:
        if os.environ.get("CI"):
            pytest.fail("node is not installed (the set-up installs Debian's nodejs)")
        pytest.skip("node is not installed")
    tests = sorted(str(p) for p in JS_TESTS.glob("*.test.mjs"))
    assert tests, "no JS unit tests found"
    result = subprocess.run([node, "--test", *tests], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "# fail 0" in result.stdout and "# pass 0" not in result.stdout, result.stdout[-2000:]
