"""The panels' JavaScript: it parses, loads nothing from the network, and carries the
test ids the browser tests look for."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import widgets
from widgets import Panel

PANELS = [widgets.ControlsPanel, widgets.QueuesPanel, widgets.BlockPoolPanel, widgets.SlotMappingPanel,
          widgets.AttentionPanel, widgets.SamplerPanel, widgets.TimelinePanel]
WIDGETS_DIR = Path(widgets.__file__).parent


@pytest.mark.parametrize("cls", PANELS, ids=lambda c: c.__name__)
def test_panel_esm_parses_as_a_module(cls: type, tmp_path: Path) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    module = tmp_path / f"{cls.__name__}.mjs"
    module.write_text(str(cls._esm))  # exactly what anywidget hands the browser
    result = subprocess.run([node, "--check", str(module)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("cls", PANELS, ids=lambda c: c.__name__)
def test_panel_esm_imports_nothing_and_exports_render(cls: type) -> None:
    # The SVG namespace is an identifier, not a URL anything fetches.
    esm = str(cls._esm).replace('"http://www.w3.org/2000/svg"', "")
    assert not re.search(r"^\s*import\s", esm, re.M), "panels must not import modules (no CDN, no network)"
    assert "import(" not in esm and "fetch(" not in esm and "http://" not in esm and "https://" not in esm
    assert "export default { render }" in esm


@pytest.mark.parametrize("cls", PANELS, ids=lambda c: c.__name__)
def test_panel_has_css_and_keeps_ipywidgets_message_dispatch(cls: type) -> None:
    assert ".kvs-panel" in str(cls._css)
    # Defining _handle_custom_msg would replace ipywidgets' own method and break every message.
    assert "_handle_custom_msg" not in vars(cls) and "_handle_custom_msg" not in vars(Panel)
    assert issubclass(cls, Panel)


@pytest.mark.parametrize("testid", [
    "kvs-step-btn", "kvs-run-btn", "kvs-play-btn", "kvs-reset-btn", "kvs-add-form", "kvs-add-btn", "kvs-error",
    "kvs-history-slider", "kvs-live-btn", "kvs-budget", "kvs-queues", "kvs-block-pool", "kvs-pool-canvas",
    "kvs-slot-mapping", "kvs-attention", "kvs-attn-canvas", "kvs-sampler", "kvs-timeline",
])
def test_stable_test_ids_are_in_the_sources(testid: str) -> None:
    sources = "".join(p.read_text() for p in WIDGETS_DIR.glob("*.js"))
    assert f'"{testid}"' in sources


def test_every_panel_root_carries_data_step() -> None:
    common = (WIDGETS_DIR / "_common.js").read_text()
    assert "root.dataset.step" in common
    for cls in PANELS:
        assert "kvsRoot(el, model," in str(cls._esm), cls.__name__


def test_widgets_import_neither_torch_nor_the_engine() -> None:
    code = ("import sys, widgets, widgets.latency; "
            "bad = [m for m in ('torch', 'engine', 'explorer') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            cwd=WIDGETS_DIR.parent)
    assert result.returncode == 0, result.stdout + result.stderr


def _js_block_pool_codes() -> tuple[list[str], dict[str, int], dict[str, str]]:
    """block_pool.js's STATUS_NAMES, and its EVENT_BITS as {record key: bit} and {record key: tip}."""
    src = (WIDGETS_DIR / "block_pool.js").read_text()
    consts = {name: int(v) for name, v in re.findall(r"^const (\w+) = (\d+);", src, re.M)}
    strings = dict(re.findall(r'^const (\w+) = "([^"]*)";', src, re.M))
    status = re.findall(r'"([^"]+)"', re.search(r"^const STATUS_NAMES = \[(.*?)\];", src, re.M).group(1))
    table = re.search(r"^const EVENT_BITS = \[\n(.*?)^\];", src, re.M | re.S).group(1)
    rows = re.findall(r'^\s*\[(\w+), "(\w+)", "[^"]+", "#[0-9a-f]{6}", (?:"([^"]+)"|(\w+))\],$', table, re.M)
    bits = {key: int(bit) if bit.isdigit() else consts[bit] for bit, key, _, _ in rows}
    tips = {key: text or strings[name] for _, key, text, name in rows}
    return status, bits, tips


def test_block_pool_js_spells_the_same_codes_as_python() -> None:
    # One place per language: widgets/block_pool.py for Python (explorer.views imports it),
    # block_pool.js's STATUS_NAMES / EVENT_BITS for the browser; they must agree.
    from widgets import block_pool

    status, bits, tips = _js_block_pool_codes()
    assert len(status) == block_pool.IN_USE_HASHED + 1 and status[block_pool.NULL] == "null"
    assert status[block_pool.FREE_CACHED] == "free (cached)" and status[block_pool.IN_USE] == "in use"
    assert bits == block_pool.EVENT_BITS
    assert tips["same_step_hits"] == ("hit on a block computed in this same step: its KV is written by this "
                                      "step's forward before any layer reads it")
    # No other copy of the bits: the Python table is written out only in widgets/block_pool.py.
    spelled = [p for p in (*WIDGETS_DIR.glob("*.py"), *(WIDGETS_DIR.parent / "explorer").glob("*.py"))
               if re.search(r'"cached":\s*16', p.read_text())]
    assert spelled == [WIDGETS_DIR / "block_pool.py"]
