"""notebooks/walkthrough.ipynb, executed headless top to bottom on the real default model.

The kernel is this interpreter (a kernel spec written to a temporary folder points at
sys.executable), so the notebook runs in the same virtual environment as the tests.
nbclient runs no JavaScript: the widgets' front end is tested in tests/widgets and
tests/e2e; here every cell must run, every chapter's checks must pass, and the
outputs must show what the engine really did.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from .headless import NOTEBOOKS, WIDGET_VIEW, chapter_cells, execute_headless, output_text, read_notebook, widget_views

NOTEBOOK = NOTEBOOKS / "walkthrough.ipynb"
KERNEL_NAME = "kvscope-walkthrough-test"
CELL_TIMEOUT_S = 900  # one cell; the first model load on a busy 2-core machine can take a minute

CHAPTERS = [
    "1. Setup",
    "2. One request and its three tokens",
    "3. Tokens -> first schedule -> prefill inputs",
    "4. Inside layer 0",
    "5. Logits -> sampler",
    "6. Decode with the KV cache",
    "7. Crossing a block boundary",
    "8. Finishing and giving blocks back",
    "9. Two requests in one step",
    "10. Prefix cache hit with refcount 2",
    "11. A hit on blocks computed in the same step",
    "12. Chunked prefill of a long prompt under a small budget",
    "13. Preemption under a tiny pool",
    "14. Changing the budget and comparing TTFT/ITL",
]


# ---- the notebook as stored ------------------------------------------------------------

def test_notebook_is_stored_without_outputs():
    """Nothing canned: every output a reader sees is produced by their own engine."""
    nb = read_notebook(NOTEBOOK)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code
    assert [i for i, c in enumerate(code) if c.get("outputs") or c.get("execution_count") is not None] == []


def test_every_chapter_has_its_heading_in_order_and_ends_with_a_check():
    chapters = chapter_cells(read_notebook(NOTEBOOK))
    numbered = [title for title in chapters if re.match(r"\d+\. ", title)]
    assert numbered == CHAPTERS
    for title in CHAPTERS:
        code = [c for c in chapters[title] if c.cell_type == "code"]
        assert any(re.search(r"^\s*assert ", c.source, flags=re.M) for c in code), f"chapter {title!r} has no check"
        assert any("**Check.**" in c.source for c in chapters[title] if c.cell_type == "markdown"), title


# ---- the notebook executed ---------------------------------------------------------------

# Appended to the run (not to the notebook): the widgets the kernel still holds at the end.
OPEN_WIDGETS = "KVS_OPEN_WIDGETS "
PROBE = ("import json as _json, ipywidgets.widgets.widget as _w\n"
         f"print({OPEN_WIDGETS!r} + _json.dumps(sorted(_w._instances)))")


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory, default_model_path: Path):
    """The walkthrough after a headless run: (notebook, seconds, errors), its last cell the
    probe of the widgets still open."""
    import nbformat

    nb = read_notebook(NOTEBOOK)
    nb.cells.append(nbformat.v4.new_code_cell(PROBE))
    return execute_headless(nb, NOTEBOOK, tmp_path_factory.mktemp("jupyter"),
                            kernel_name=KERNEL_NAME, cell_timeout_s=CELL_TIMEOUT_S)


@pytest.mark.slow
def test_walkthrough_runs_top_to_bottom_and_every_check_passes(executed):
    nb, seconds, errors = executed
    assert errors == [], "walkthrough cells failed:\n\n" + "\n\n".join(errors)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.get("execution_count") for c in code), "some cells did not run"


@pytest.mark.slow
def test_walkthrough_outputs_show_what_the_engine_did(executed):
    nb, _, _ = executed
    chapters = chapter_cells(nb)
    text = {title: "\n".join(output_text(c) for c in cells if c.cell_type == "code")
            for title, cells in chapters.items()}
    assert "KV pool: 64 blocks x 16 slots, 63 free" in text["1. Setup"]
    assert "[504, 3575, 282, 4649, 314]" in text["2. One request and its three tokens"]  # SmolLM2's ids
    prefill = text["3. Tokens -> first schedule -> prefill inputs"]
    for key in ("input_ids", "positions", "query_start_loc", "seq_lens", "slot_mapping", "block_tables",
                "logits_indices"):
        assert re.search(rf"^{key}\s+\[", prefill, flags=re.M), key
    assert "query_start_loc [0, 5]" in prefill and "logits_indices  [4]" in prefill
    assert "GQA: each KV head serves 3 query heads" in text["4. Inside layer 0"]
    assert "chosen: 7042 ' Paris'" in text["5. Logits -> sampler"]
    assert "Paris" in text["6. Decode with the KV cache"] and "(length)" in text["6. Decode with the KV cache"]
    assert "prefix cache:" in text["10. Prefix cache hit with refcount 2"]
    same_step = text["11. A hit on blocks computed in the same step"]
    assert "the first 39 are the same: 2 full blocks" in same_step  # SmolLM2's chat template
    assert re.search(r'^rec\.blocks\["same_step_hits"\]\s+\[(\d+), (\d+), \1, \2\]$', same_step, flags=re.M), same_step
    assert "tiny-" in text["13. Preemption under a tiny pool"]
    assert "long prompt TTFT (ms)" in text["14. Changing the budget and comparing TTFT/ITL"]


@pytest.mark.slow
def test_walkthrough_shows_the_dashboard_and_a_panel_in_every_chapter(executed):
    nb, _, _ = executed
    chapters = chapter_cells(nb)
    assert sum(widget_views(c) for c in chapters["1. Setup"] if c.cell_type == "code") >= 1  # the Dashboard
    for title in CHAPTERS[2:]:
        assert sum(widget_views(c) for c in chapters[title] if c.cell_type == "code") >= 1, title


@pytest.mark.slow
def test_every_widget_the_saved_notebook_shows_is_still_open(executed):
    """Run All, save, reopen: JupyterLab draws each widget view in the outputs from the model
    the kernel still holds. A widget closed after it was displayed (a progress bar that removes
    itself) would say "Error displaying widget: model not found" there."""
    nb, _, _ = executed
    probe = output_text(nb.cells[-1])
    assert OPEN_WIDGETS in probe, probe
    open_now = set(json.loads(probe.split(OPEN_WIDGETS, 1)[1].splitlines()[0]))
    shown = [(i, out["data"][WIDGET_VIEW]["model_id"]) for i, c in enumerate(nb.cells) if c.cell_type == "code"
             for out in c.get("outputs", []) if WIDGET_VIEW in out.get("data", {})]
    assert shown and open_now
    assert [(i, m) for i, m in shown if m not in open_now] == []
