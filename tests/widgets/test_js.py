"""The panels' JavaScript: it parses, loads nothing from the network, and carries the
test ids the browser tests look for."""
from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import widgets
from widgets import Panel

PANELS = [widgets.ControlsPanel, widgets.QueuesPanel, widgets.BlockPoolPanel, widgets.SlotMappingPanel,
          widgets.AttentionPanel, widgets.SamplerPanel, widgets.TimelinePanel, widgets.LatencyPanel]
WIDGETS_DIR = Path(widgets.__file__).parent


@pytest.mark.parametrize("cls", PANELS, ids=lambda c: c.__name__)
def test_panel_esm_parses_as_a_module(cls: type, assert_node_parses) -> None:
    assert_node_parses(str(cls._esm), f"{cls.__name__}.mjs")  # exactly what anywidget hands the browser


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
    code = ("import sys, widgets; "
            "bad = [m for m in ('torch', 'engine', 'explorer') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            cwd=WIDGETS_DIR.parent)
    assert result.returncode == 0, result.stdout + result.stderr


def _js_block_pool_codes(tmp_path: Path) -> dict:
    """The status names and event bits block_pool.js works with, as the browser computes them:
    its ESM (KVS_SCHEMA and _common.js prepended) imported by node, its constants read back."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    module = tmp_path / "block_pool.mjs"
    module.write_text(str(widgets.BlockPoolPanel._esm) + "\nexport const codes = { STATUS_NAMES, NULL_BLOCK, FREE, "
                      "FREE_CACHED, IN_USE, IN_USE_HASHED, SAME_STEP, EVICTED, KVS_EVENTS };\n")
    script = f"import({json.dumps(module.as_uri())}).then((m) => console.log(JSON.stringify(m.codes)))"
    out = subprocess.run([node, "-e", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _js_events(common: str) -> list[tuple[int, str, str, str, str]]:
    """KVS_EVENTS rows as the browser builds them: (bit, record key, label, colour, tip) from
    KVS_SCHEMA's block events (_schema.js) and _common.js's KVS_EVENT_LOOKS (colour, icon by key)."""
    table = re.search(r"^const KVS_EVENT_LOOKS = \{\n(.*?)^\};", common, re.M | re.S).group(1)
    looks = dict(re.findall(r'(\w+): \["(#[0-9a-f]{6})", "[^"]+"\]', table))
    from engine.report import schema

    events = schema.widget_schema()["block_events"]
    assert sorted(looks) == sorted(e["key"] for e in events), "one look per block event, none without one"
    return [(e["bit"], e["key"], e["label"], looks[e["key"]], e["tip"]) for e in events]


def test_the_panels_schema_module_is_generated_from_the_engines_record_schema() -> None:
    # widgets/_schema.js is engine/report/schema.py's copy for the widgets (which never import
    # the engine); regenerating it must give the file as committed.
    from engine.report import schema

    assert (WIDGETS_DIR / "_schema.js").read_text() == schema.widget_schema_js(), (
        "widgets/_schema.js is stale: python -m engine.report --write")
    for cls in PANELS:
        assert str(cls._esm).startswith((WIDGETS_DIR / "_schema.js").read_text()), cls.__name__


def test_block_pool_js_takes_its_codes_from_the_generated_schema(tmp_path: Path) -> None:
    # One definition: engine/report/schema.py. explorer.ui.views imports it; the browser reads
    # its generated copy (KVS_SCHEMA) and names the statuses by their schema keys.
    from engine.report import schema

    js = _js_block_pool_codes(tmp_path)
    assert [js[k] for k in ("NULL_BLOCK", "FREE", "FREE_CACHED", "IN_USE", "IN_USE_HASHED")] == list(
        schema.BLOCK_STATUS.values())
    assert js["STATUS_NAMES"] == {str(schema.FREE_CACHED): "free (cached)", str(schema.NULL): "null",
                                  str(schema.FREE): "free", str(schema.IN_USE): "in use",
                                  str(schema.IN_USE_HASHED): "in use (hashed)"}
    assert js["SAME_STEP"] == schema.EVENT_BITS["same_step_hits"] and js["EVICTED"] == schema.EVENT_BITS["evicted"]
    assert {key: bit for bit, key, *_ in js["KVS_EVENTS"]} == schema.EVENT_BITS
    tips = {key: row[5] for row in js["KVS_EVENTS"] for key in [row[1]]}
    assert tips["same_step_hits"] == ("hit on a block computed in this same step: its KV is written by this "
                                      "step's forward before any layer reads it")
    # No number of a status or an event is written in the panels' JavaScript.
    src = (WIDGETS_DIR / "block_pool.js").read_text()
    assert not re.search(r"(SAME_STEP|EVICTED|NULL_BLOCK|FREE|IN_USE)\w*\s*=\s*\d", src)
    assert not re.search(r"\[\s*SAME_STEP\s*,\s*\d", src)
    # No other copy of the bits: the table is written out only in engine/report/schema.py.
    root = WIDGETS_DIR.parent
    spelled = [p.relative_to(root).as_posix() for pkg in ("engine", "explorer", "widgets")
               for p in (root / pkg).rglob("*.*") if p.suffix in (".py", ".js")
               and re.search(r'(\bcached"?\]?:\s*16\b|\[16, "cached")', p.read_text(), re.I)]
    assert spelled == ["engine/report/schema.py"]


def _lab(hex_colour: str) -> tuple[float, float, float]:
    """CIE L*a*b* (D65) of an sRGB colour."""
    def linear(c: float) -> float:
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4
    r, g, b = (linear(int(hex_colour[i:i + 2], 16) / 255) for i in (1, 3, 5))
    x, y, z = ((0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047, 0.2126 * r + 0.7152 * g + 0.0722 * b,
               (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883)
    f = [v ** (1 / 3) if v > 0.008856 else 7.787 * v + 16 / 116 for v in (x, y, z)]
    return 116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])


def test_request_colours_stay_clear_of_the_event_and_mark_colours() -> None:
    # A colour means one thing: no request may look like a block event (allocated, hit, ...)
    # or a mark (the sampled row, the linked-highlight halo). CIE76 distance >= 25 is
    # "clearly another colour"; the requests also differ from each other.
    common = (WIDGETS_DIR / "_common.js").read_text()
    colors_js = re.search(r"^const KVS_REQUEST_COLORS = \[(.*?)\];", common, re.M | re.S).group(1)
    requests = re.findall(r'"(#[0-9a-f]{6})"', colors_js)
    marks_js = re.search(r"^const KVS_MARKS = \{(.*?)\};", common, re.M | re.S).group(1)
    marks = dict(re.findall(r'(\w+): "(#[0-9a-f]{6})"', marks_js))
    events = {label: colour for _, _, label, colour, _ in _js_events(common)}
    assert len(requests) >= 10 and len(set(requests)) == len(requests) and len(events) == 6
    reserved = {**events, "sampled": marks["sampled"], "focus": marks["focus"], "cache": marks["cache"]}
    for r in requests:
        for name, colour in reserved.items():
            assert math.dist(_lab(r), _lab(colour)) >= 25, (r, name, colour)
    assert min(math.dist(_lab(a), _lab(b)) for i, a in enumerate(requests) for b in requests[i + 1:]) >= 15
    # Every panel takes its request colours from here: none computes its own.
    for p in WIDGETS_DIR.glob("*.js"):
        assert "137.508" not in p.read_text(), p.name


def test_a_frozen_panel_answers_the_same_actions_in_both_languages() -> None:
    # A still sends (_common.js) and answers (widgets/_base.py) only hover look-ups.
    common = (WIDGETS_DIR / "_common.js").read_text()
    actions_js = re.search(r"^const KVS_FROZEN_ACTIONS = new Set\(\[(.*?)\]\);", common, re.M).group(1)
    js = set(re.findall(r'"(\w+)"', actions_js))
    assert js == set(Panel.FROZEN_ACTIONS) == {"block_detail"}


# A render past this does several jobs: move one out (its own function, named). Lines as Prettier
# writes them (tests/widgets/test_js_format.py), one call argument or object key a line where they
# do not fit 120 columns: the longest render, why.js's, is 198 (it was 100 packed by hand).
FUNCTION_MAX_LINES = 200


def test_no_panel_function_runs_past_the_line_limit() -> None:
    long = []
    for path in [*sorted(WIDGETS_DIR.glob("*.js")), WIDGETS_DIR.parent / "explorer" / "export" / "host.js"]:
        start = name = None
        for i, line in enumerate(path.read_text().splitlines()):
            m = re.match(r"(?:async )?function (\w+)\(", line)
            if m:
                start, name = i, m.group(1)
            elif start is not None and line == "}":
                if i - start + 1 > FUNCTION_MAX_LINES:
                    long.append(f"{path.name}: {name} ({i - start + 1} lines)")
                start = None
    assert long == []
