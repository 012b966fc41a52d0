"""notebooks/why.ipynb executed headless: a hit-rate mystery on kvscope's engine (the default
model), solved with the why-ledger (the first divergent token, the classes of the tokens that
still miss, the evictions and who caused them), each cause proven by a replay through vLLM's own
scheduler, and the Why panel in the Dashboard. Every chapter ends with a check."""
from __future__ import annotations

import pytest

from .headless import (
    NOTEBOOKS,
    assert_no_startup_notes_in_stderr,
    assert_stored_clean_with_checks,
    chapter_texts,
    execute_every_cell,
    read_notebook,
)

NOTEBOOK = NOTEBOOKS / "why.ipynb"
CHAPTERS = ["1. The mystery: a shared system prompt that never hits", "2. Ask why: the first divergent token",
            "3. The fix, and the tokens that still miss", "4. A second mystery: the cache forgets",
            "5. Prove it: replays through vLLM's own scheduler", "6. The same view in the Dashboard"]


def test_why_notebook_is_stored_without_outputs_and_each_chapter_ends_with_a_check():
    assert_stored_clean_with_checks(read_notebook(NOTEBOOK), CHAPTERS)


@pytest.mark.slow
def test_why_notebook_solves_its_mysteries(tmp_path_factory):
    from tests.oracle.vllm_available import require_vllm

    require_vllm()   # chapter 5 replays through vLLM's scheduler
    nb = execute_every_cell(read_notebook(NOTEBOOK), NOTEBOOK, tmp_path_factory.mktemp("jupyter"),
                            kernel_name="kvscope-why-notebook-test", cell_timeout_s=900)
    text = chapter_texts(nb)
    assert "0 hit (0%)" in text["1. The mystery: a shared system prompt that never hits"]
    assert "leaves request #0's prefix at token" in text["2. Ask why: the first divergent token"]
    assert "evicted at step" in text["4. A second mystery: the cache forgets"]
    proof = text["5. Prove it: replays through vLLM's own scheduler"]
    assert "evicted: proven" in proof and "evicted: 80 of 80 tokens proven by replay" in proof
    # vLLM's start-up notes (its scheduler's first import, for the replays) fold into one line:
    # no red stderr box in any chapter repeats them.
    assert_no_startup_notes_in_stderr(nb, CHAPTERS)
