"""notebooks/walkthrough.ipynb, executed headless top to bottom on the real default model.

The kernel is this interpreter (a kernel spec written to a temporary folder points at
sys.executable), so the notebook runs in the same virtual environment as the tests.
nbclient runs no JavaScript: the widgets' front end is tested in tests/widgets and
tests/e2e; here every cell must run, every chapter's checks must pass, and the
outputs must show what the engine really did.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = REPO / "notebooks" / "walkthrough.ipynb"
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
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def read_notebook():
    import nbformat

    return nbformat.read(NOTEBOOK, as_version=4)


def chapter_cells(nb) -> dict[str, list]:
    """The cells of each chapter (from its '## N.' heading to the next '## ' heading)."""
    out: dict[str, list] = {}
    current = None
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            m = re.match(r"^## (.+)$", cell.source.splitlines()[0]) if cell.source else None
            if m:
                current = m.group(1).strip()
                out[current] = []
        if current is not None:
            out[current].append(cell)
    return out


def output_text(cell) -> str:
    """Everything a code cell printed or displayed, as text (stream, text/plain, text/html)."""
    parts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            parts.append(out.get("text", ""))
        elif out.get("output_type") in ("display_data", "execute_result"):
            data = out.get("data", {})
            parts += [str(data.get(k, "")) for k in ("text/plain", "text/html")]
        elif out.get("output_type") == "error":
            parts.append("\n".join(out.get("traceback", [])))
    return "\n".join(parts)


def widget_views(cell) -> int:
    return sum(WIDGET_VIEW in out.get("data", {}) for out in cell.get("outputs", [])
               if out.get("output_type") in ("display_data", "execute_result"))


# ---- the notebook as stored ------------------------------------------------------------

def test_notebook_is_stored_without_outputs():
    """Nothing canned: every output a reader sees is produced by their own engine."""
    nb = read_notebook()
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code
    assert [i for i, c in enumerate(code) if c.get("outputs") or c.get("execution_count") is not None] == []


def test_every_chapter_has_its_heading_in_order_and_ends_with_a_check():
    chapters = chapter_cells(read_notebook())
    numbered = [title for title in chapters if re.match(r"\d+\. ", title)]
    assert numbered == CHAPTERS
    for title in CHAPTERS:
        code = [c for c in chapters[title] if c.cell_type == "code"]
        assert any(re.search(r"^\s*assert ", c.source, flags=re.M) for c in code), f"chapter {title!r} has no check"
        assert any("**Check.**" in c.source for c in chapters[title] if c.cell_type == "markdown"), title


# ---- the notebook executed ---------------------------------------------------------------

@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory, default_model_path: Path):
    """The walkthrough after a headless run: (notebook, seconds, errors)."""
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    home = tmp_path_factory.mktemp("jupyter")
    spec_dir = home / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True)
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "kvscope test kernel", "language": "python", "env": env}))
    nb = read_notebook()
    with pytest.MonkeyPatch.context() as mp:
        # The kernel spec is found through JUPYTER_PATH; IPython writes its profile to a
        # temporary folder, not into the user's home.
        mp.setenv("JUPYTER_PATH", os.pathsep.join(filter(None, [str(home), os.environ.get("JUPYTER_PATH")])))
        mp.setenv("IPYTHONDIR", str(home / "ipython"))
        client = nbclient.NotebookClient(nb, kernel_name=KERNEL_NAME, timeout=CELL_TIMEOUT_S, allow_errors=True,
                                         resources={"metadata": {"path": str(NOTEBOOK.parent)}})
        t0 = time.monotonic()
        client.execute()
        seconds = time.monotonic() - t0
    errors = [f"cell {i}:\n{c.source}\n---\n{output_text(c)}" for i, c in enumerate(nb.cells)
              if c.cell_type == "code" and any(o.get("output_type") == "error" for o in c.get("outputs", []))]
    print(f"\nwalkthrough executed in {seconds:.1f} s")
    return nb, seconds, errors


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
