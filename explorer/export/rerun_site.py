"""What a static site needs to re-run its recorded chapters in the reader's browser
(explorer/export/rerun.py there, run by Pyodide), written at build time by scripts/build_docs.py:

- `rerun/`: Pyodide's runtime from its npm package (installed by scripts/setup.sh into
  .venv/node), the project's own Python files that a re-run imports (one zip, found by importing
  explorer.export.rerun with torch, numpy, anywidget and the rest unimportable), the panels' code
  and defaults, and rerun.js / rerun.css (the form, the loader, the result);
- per chapter, `<name>.workload.js`: its recording, model facts and token texts.

A page opened from file:// can load classic scripts but neither fetch() files nor import
modules, so every file travels as a script that hands its bytes (base64; the WebAssembly
binary gzipped first) to rerun.js, which serves them to Pyodide's loader. Nothing loads until the
reader first presses Run.
"""
from __future__ import annotations

import base64
import gzip
import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterable
from io import BytesIO
from pathlib import Path
from typing import Literal

from .rerun import ChapterWorkloadDict, RerunSettingsDict, rerun_assets

REPO = Path(__file__).resolve().parents[2]
PYODIDE_VERSION = "0.29.5"   # scripts/setup.sh installs this one (npm)
HERE = Path(__file__).parent
# What the browser has not: each is refused while the re-run's modules are listed, so a new
# import of one of them fails the build (and tests/docs/test_rerun_pyodide.py) instead of the page.
NOT_IN_THE_BROWSER = ("torch", "numpy", "xxhash", "transformers", "tokenizers", "anywidget", "ipywidgets",
                      "traitlets", "IPython", "plotly", "zmq", "msgspec", "vllm", "safetensors", "jinja2")
_LIST_MODULES = r"""
import json, sys
class _Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in NOT:
            raise ImportError(f"{name}: not in the browser (explorer/export/rerun_site.py NOT_IN_THE_BROWSER)")
NOT = set(sys.argv[1].split(","))
sys.meta_path.insert(0, _Refuse())
import explorer.export.rerun
ours = [m for m in list(sys.modules.values()) if m.__name__.split(".")[0] in ("engine", "explorer", "widgets")]
print(json.dumps(sorted({m.__file__ for m in ours if getattr(m, "__file__", None)})))
"""


def pyodide_dir() -> Path:
    """Pyodide's npm package (KVSCOPE_PYODIDE_DIR, or .venv/node/node_modules/pyodide)."""
    folder = Path(os.environ.get("KVSCOPE_PYODIDE_DIR") or REPO / ".venv" / "node" / "node_modules" / "pyodide")
    package = folder / "package.json"
    if not package.is_file():
        raise FileNotFoundError(f"Pyodide {PYODIDE_VERSION} is not in {folder}: `bash scripts/setup.sh` installs it "
                                "(npm), or set KVSCOPE_PYODIDE_DIR to an unpacked npm package of it")
    version = json.loads(package.read_text()).get("version")
    if version != PYODIDE_VERSION:
        raise FileNotFoundError(f"{folder} holds Pyodide {version}, not {PYODIDE_VERSION}: `bash scripts/setup.sh` "
                                "installs the pinned one")
    return folder


def python_files() -> list[Path]:
    """The project's files a re-run reads: the Python modules it imports (found in a fresh
    interpreter), and the export page's host script and style (explorer/export/page.py reads them)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", _LIST_MODULES, ",".join(NOT_IN_THE_BROWSER)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"explorer.export.rerun does not import where only Python runs:\n{done.stderr[-3000:]}")
    return [Path(f) for f in json.loads(done.stdout.splitlines()[-1])] + [HERE / "host.js", HERE / "host.css"]


def python_zip(files: Iterable[Path]) -> bytes:
    """The files, at their paths in the repository, in one zip (sorted, fixed times: reproducible)."""
    out = BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for f in sorted(files):
            info = zipfile.ZipInfo(str(f.resolve().relative_to(REPO)), date_time=(2026, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, f.read_bytes())
    return out.getvalue()


def file_script(name: str, data: bytes, *, gzipped: bool = False) -> str:
    """A classic script that hands `data` to rerun.js (window.KVS_RERUN_FILES[name])."""
    body = gzip.compress(data, 9, mtime=0) if gzipped else data
    return (f"(window.KVS_RERUN_FILES = window.KVS_RERUN_FILES || {{}})[{json.dumps(name)}] = "
            f"{{gzip: {'true' if gzipped else 'false'}, b64: \"{base64.b64encode(body).decode()}\"}};\n")


def workload_script(key: str, workload: ChapterWorkloadDict) -> str:
    """A chapter's workload as a classic script (window.KVS_RERUN_WORKLOADS[key])."""
    text = json.dumps(workload, separators=(",", ":")).replace("</", "<\\/")
    return f"(window.KVS_RERUN_WORKLOADS = window.KVS_RERUN_WORKLOADS || {{}})[{json.dumps(key)}] = {text};\n"


def write_runtime(out: Path, panels: Iterable[str]) -> dict[str, int]:
    """Write `out` (the site's rerun/ folder): Pyodide, the Python zip, the panels' assets and the
    page's own script and style. Returns {file: bytes}."""
    pyo = pyodide_dir()
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "pyodide.js": (pyo / "pyodide.js").read_text(),
        "pyodide.asm.js": (pyo / "pyodide.asm.js").read_text(),
        "pyodide.asm.wasm.js": file_script("pyodide.asm.wasm", (pyo / "pyodide.asm.wasm").read_bytes(), gzipped=True),
        "python_stdlib.zip.js": file_script("python_stdlib.zip", (pyo / "python_stdlib.zip").read_bytes()),
        "pyodide-lock.json.js": file_script("pyodide-lock.json", (pyo / "pyodide-lock.json").read_bytes()),
        "kvscope.zip.js": file_script("kvscope.zip", python_zip(python_files())),
        "assets.js": file_script("assets.json", json.dumps(rerun_assets(list(panels))).encode()),
        "rerun.js": (HERE / "rerun.js").read_text(),
        "rerun.css": (HERE / "rerun.css").read_text(),
    }
    for name, text in files.items():
        (out / name).write_text(text)
    return {name: (out / name).stat().st_size for name in files}


#: The form's fields, in order: each setting and its label.
_FORM_FIELDS: tuple[tuple[Literal["num_blocks", "block_size", "max_num_batched_tokens", "max_num_seqs",
                                  "enable_prefix_caching", "enable_chunked_prefill"], str], ...] = (
    ("num_blocks", "pool (num_blocks)"), ("block_size", "block_size"), ("max_num_batched_tokens", "token budget"),
    ("max_num_seqs", "max_num_seqs"), ("enable_prefix_caching", "prefix caching"),
    ("enable_chunked_prefill", "chunked prefill"))


def rerun_form(key: str, settings: RerunSettingsDict, runtime: str = "../rerun/",
               workload_src: str | None = None) -> str:
    """The HTML of a chapter's re-run: its settings as a form, Run, and where the result goes.
    `runtime`: the rerun/ folder's URL from the page; `workload_src`: the workload script's."""
    def field(name: str, label: str, value: int | bool) -> str:
        if isinstance(value, bool):
            return (f'<label class="kvs-rerun-field"><input type="checkbox" name="{name}"'
                    f'{" checked" if value else ""}> {label}</label>')
        return (f'<label class="kvs-rerun-field">{label} <input type="number" min="1" step="1" name="{name}" '
                f'value="{int(value)}"></label>')

    fields = "".join(field(k, label, settings[k]) for k, label in _FORM_FIELDS if k in settings)
    src = workload_src or f"replays/{key}.workload.js"
    return (f'<form class="kvs-rerun" data-testid="kvs-rerun" data-key="{key}" data-runtime="{runtime}" '
            f'data-workload="{src}" onsubmit="return false">'
            f'<div class="kvs-rerun-fields">{fields}</div>'
            '<button type="submit" class="kvs-rerun-run" data-testid="kvs-rerun-run">Run</button> '
            '<span class="kvs-rerun-status" data-testid="kvs-rerun-status" role="status">'
            'Runs in this page: the first Run loads Python (about 9 MB, once).</span>'
            '<div class="kvs-rerun-result" data-testid="kvs-rerun-result" hidden></div>'
            '</form>')


def rerun_script(runtime: str = "../rerun/") -> str:
    """What a page with re-run forms carries once: their style, and rerun.js (a few kB; it loads
    the rest on the first Run)."""
    return f'<link rel="stylesheet" href="{runtime}rerun.css"><script src="{runtime}rerun.js"></script>'
