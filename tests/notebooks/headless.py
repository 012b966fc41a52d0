"""Executing a notebook headless (nbclient) in a private kernel spec, and reading what its
cells showed: shared by the notebooks' tests."""
from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
# vLLM's start-up notes that must fold into one line, never a red stderr box: its CPU build says
# "Triton is installed, but doesn't include CPU backend. Disabling Triton." then "Triton is not
# installed...", and each replay process "Reset SSM cache type to float32 ...".
VLLM_STARTUP_NOTES = ("Reset SSM cache type", "Triton is")


def read_notebook(path: Path):
    """The notebook at `path`, as stored (nbformat 4)."""
    import nbformat

    return nbformat.read(path, as_version=4)


def execute_headless(nb, path: Path, home: Path, *, kernel_name: str, cell_timeout_s: int):
    """Run every cell of `nb` (read from `path`) in a kernel spec of its own under `home`;
    returns (notebook with outputs, seconds, [text of each failed cell])."""
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    spec_dir = home / "kernels" / kernel_name
    spec_dir.mkdir(parents=True)
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"kvscope test kernel ({path.name})", "language": "python", "env": env}))
    with pytest.MonkeyPatch.context() as mp:
        # The kernel spec is found through JUPYTER_PATH; IPython writes its profile to a
        # temporary folder, not into the user's home.
        mp.setenv("JUPYTER_PATH", os.pathsep.join(filter(None, [str(home), os.environ.get("JUPYTER_PATH")])))
        mp.setenv("IPYTHONDIR", str(home / "ipython"))
        # The kernel starts as a user's Jupyter starts it: without what vLLM run in this test
        # process put in os.environ (its engine core in this process, WARNING logs), which a
        # server the notebook starts would otherwise inherit.
        from explorer.drivers.vllm.config import IN_PROCESS_ENV

        for key, value in IN_PROCESS_ENV.items():
            if os.environ.get(key) == value:
                mp.delenv(key)
        client = nbclient.NotebookClient(nb, kernel_name=kernel_name, timeout=cell_timeout_s, allow_errors=True,
                                         resources={"metadata": {"path": str(path.parent)}})
        t0 = time.monotonic()
        client.execute()
        seconds = time.monotonic() - t0
    errors = [f"cell {i}:\n{c.source}\n---\n{output_text(c)}" for i, c in enumerate(nb.cells)
              if c.cell_type == "code" and any(o.get("output_type") == "error" for o in c.get("outputs", []))]
    print(f"\n{path.name} executed in {seconds:.1f} s")
    return nb, seconds, errors


def execute_every_cell(nb, path: Path, home: Path, *, kernel_name: str, cell_timeout_s: int):
    """`execute_headless`, where every cell must pass; returns the executed notebook."""
    nb, _, errors = execute_headless(nb, path, home, kernel_name=kernel_name, cell_timeout_s=cell_timeout_s)
    assert errors == [], f"{path.name} cells failed:\n\n" + "\n\n".join(errors)
    return nb


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


def stderr_text(cell) -> str:
    """What a code cell wrote to stderr (Jupyter's red boxes)."""
    return "".join(o.get("text", "") for o in cell.get("outputs", [])
                   if o.get("output_type") == "stream" and o.get("name") == "stderr")


def assert_no_startup_notes_in_stderr(nb, chapters: list[str], also: tuple[str, ...] = ()) -> None:
    """No cell of these chapters shows vLLM's start-up notes (or any of `also`) as stderr."""
    cells = chapter_cells(nb)
    for title in chapters:
        for cell in cells[title]:
            err = stderr_text(cell)
            seen = [note for note in (*VLLM_STARTUP_NOTES, *also) if note in err]
            assert not seen, (title, seen, err[:500])


def widget_views(cell) -> int:
    return sum(WIDGET_VIEW in out.get("data", {}) for out in cell.get("outputs", [])
               if out.get("output_type") in ("display_data", "execute_result"))


def assert_stored_clean_with_checks(nb, chapters: list[str]) -> None:
    """The notebook is stored without outputs, has exactly these numbered chapters, and each
    chapter's last code cell asserts something."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.get("outputs") and c.get("execution_count") is None for c in code)
    cells = chapter_cells(nb)
    assert [t for t in cells if re.match(r"\d+\. ", t)] == chapters
    for title in chapters:
        last_code = [c for c in cells[title] if c.cell_type == "code"][-1]
        assert re.search(r"^\s*assert ", last_code.source, flags=re.M), title


def chapter_texts(nb) -> dict[str, str]:
    """What each chapter's code cells printed or displayed, as text."""
    return {t: "\n".join(output_text(c) for c in cells if c.cell_type == "code") for t, cells in chapter_cells(nb).items()}


def execute_against_a_server(nb, path: Path, home: Path, kernel_name: str):
    """Run a notebook that starts a real vLLM server (skipped where vLLM or openai is missing);
    every cell must pass. Returns the executed notebook. The notebook's server logs into `home`
    (the kernel inherits the variable), so a failed start leaves its log with the test's files."""
    from explorer.drivers.vllm_live.server import LOG_DIR_ENV_VAR
    from tests.oracle.vllm_available import require_vllm

    require_vllm()
    pytest.importorskip("openai")
    before = os.environ.get(LOG_DIR_ENV_VAR)
    os.environ[LOG_DIR_ENV_VAR] = str(home / "vllm-server-logs")
    try:
        return execute_every_cell(nb, path, home, kernel_name=kernel_name, cell_timeout_s=900)
    finally:
        if before is None:
            os.environ.pop(LOG_DIR_ENV_VAR, None)
        else:
            os.environ[LOG_DIR_ENV_VAR] = before
