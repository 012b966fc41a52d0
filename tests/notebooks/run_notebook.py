"""A chapter notebook of notebooks/ run headless by its test (headless.py does the running): the
executed notebook with what each chapter printed, and the widgets a chapter displayed."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .headless import (
    chapter_cells,
    chapter_texts,
    execute_against_a_server,
    execute_every_cell,
    read_notebook,
    widget_views,
)


def _kernel_name(notebook: Path) -> str:
    return f"kvscope-{notebook.stem}-notebook-test"   # a kernel spec of its own per notebook


def run_against_a_server(notebook: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict[str, str]]:
    """`notebook` executed against the real vLLM server it starts, every cell passing (skipped
    where vLLM is missing): (the executed notebook, each chapter's printed text by title)."""
    nb = execute_against_a_server(read_notebook(notebook), notebook, tmp_path_factory.mktemp("jupyter"),
                                  _kernel_name(notebook))
    return nb, chapter_texts(nb)


def run_every_cell(notebook: Path, tmp_path_factory: pytest.TempPathFactory,
                   cell_timeout_s: int) -> tuple[Any, dict[str, str]]:
    """`notebook` executed in this interpreter's environment, every cell passing:
    (the executed notebook, each chapter's printed text by title)."""
    nb = execute_every_cell(read_notebook(notebook), notebook, tmp_path_factory.mktemp("jupyter"),
                            kernel_name=_kernel_name(notebook), cell_timeout_s=cell_timeout_s)
    return nb, chapter_texts(nb)


def chapter_widget_views(nb: Any, title: str) -> int:
    """How many widgets the code cells of chapter `title` displayed."""
    return sum(widget_views(c) for c in chapter_cells(nb)[title] if c.cell_type == "code")
