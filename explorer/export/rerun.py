"""A recorded run re-run at other settings through kvscope's own core, shown as the one-file
export shows a run: what a docs chapter's "Re-run" does in the reader's browser (Pyodide), and
what CPython does alike (the tests compare the two).

    workload = chapter_workload(entries, first_step=20, title="Chapter 13", token_text=texts, panels=[...])
    page = rerun_page(workload, {"num_blocks": 8}, assets=rerun_assets(workload["panels"]))
    page["html"]       # the export page of the re-run, from the chapter's first step
    page["parting"]    # where it parts from the recorded run, in words

The workload is the chapter's recording (the requests, their arrival steps and recorded output
tokens), the model facts the panels show, and the texts of the tokens it uses. Every scheduling
and caching decision of the re-run is the engine's own (explorer.whatif.core_replay); the tokens
are the recorded ones, and no model runs, so the re-run shows no attention and no model timings.
"""
from __future__ import annotations

import base64
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from typing import TypedDict, cast

from engine.config import SCHEDULER_KNOBS
from engine.report.schema import ModelInfoDict

from ..core.history import HistoryEntry
from ..core.recording import Recording, save_recording
from ..ui import views
from ..whatif.core_replay import CORE_KNOBS, CoreReplay, core_replay, core_variant
from ..whatif.parting import first_parting
from ..whatif.settings import SettingRejected, SettingValue
from .delta import JSONValue
from .page import build_export_data, panel_defaults, panel_sources, render_html


class RerunSettingsDict(TypedDict, total=False):
    """A re-run's settings (explorer.whatif.core_replay.CORE_KNOBS): the recorded ones, or those a reader sets."""
    num_blocks: int
    block_size: int
    max_num_batched_tokens: int
    max_num_seqs: int
    enable_prefix_caching: bool
    enable_chunked_prefill: bool


class ChapterWorkloadDict(TypedDict):
    """What a page needs to re-run a chapter (`chapter_workload`), as its workload script carries it."""
    title: str
    first_step: int                                   # the step the chapter's panels start from
    recording: str                                    # the recording's file, base64
    knob_changes: dict[str, dict[str, SettingValue]]   # step -> the scheduler knobs changed just before it
    model_info: ModelInfoDict
    token_texts: dict[str, str]                       # token id -> its text, for the tokens the run uses
    panels: list[str]
    settings: RerunSettingsDict                       # the recorded run's


class RerunAssetsDict(TypedDict):
    """The panels' code and default states a re-run's page embeds (`rerun_assets`)."""
    sources: dict[str, list[str]]                  # panel -> [ESM, CSS]
    defaults: dict[str, dict[str, JSONValue]]      # panel -> its synced traits (page.panel_defaults)


class RunTotalsDict(TypedDict):
    """A replay's totals."""
    steps: int
    preemptions: int
    hit_tokens: int
    finished: int
    replay_ms_per_step: float


class RerunSummaryDict(TypedDict):
    """Both runs' totals: the recording re-run at its own settings, and at the reader's."""
    recorded: RunTotalsDict
    rerun: RunTotalsDict


class RerunPageDict(TypedDict):
    """A re-run as its page shows it (`rerun_page`)."""
    notes: list[str]
    html: str         # the export page of the re-run
    label: str        # the settings in words
    stopped: str      # why it stopped early ("" when every request finished)
    exact: str
    parting: str      # where it parts from the recorded run, in words
    summary: RerunSummaryDict


# What a re-run cannot show: no model runs (attention weights, step timings).
RERUN_LEAVES_OUT = ("attention", "latency")
EXACT = ("Every scheduling and caching decision here is kvscope's engine's own, made again at these settings in "
         "your browser (the same Python files, run by Pyodide). The tokens are the recorded run's: no model runs, so "
         "a request says what it said when the page was built.")


def chapter_workload(entries: Sequence[HistoryEntry], *, first_step: int, title: str,
                     token_text: Callable[[Sequence[int]], list[str]], panels: Sequence[str]) -> ChapterWorkloadDict:
    """What a page needs to re-run a chapter: `entries` is the history of the chapter's engine
    from its start (an empty pool) to the chapter's last step, `first_step` the step the chapter
    starts from (its panels show the re-run from there)."""
    entries = list(entries)
    fd, path = tempfile.mkstemp(suffix=".kvrec.gz")
    os.close(fd)
    try:
        save_recording(entries, path)
        data = open(path, "rb").read()
        rec = Recording.load(path)
    finally:
        os.unlink(path)
    ids = sorted({t for r in rec.requests for t in (*r.prompt_token_ids, *r.output_token_ids)})
    snapshot = views.entry_parts(entries[-1])[2]
    return {"title": title, "first_step": int(first_step), "recording": base64.b64encode(data).decode(),
            "knob_changes": knob_changes(entries),
            "model_info": snapshot.get("model_info") or {}, "token_texts": dict(zip(map(str, ids), token_text(ids))),
            "panels": [p for p in panels if p not in RERUN_LEAVES_OUT],
            "settings": cast(RerunSettingsDict, {k: getattr(rec.settings, k) for k in CORE_KNOBS})}  # its keys


def knob_changes(entries: Sequence[HistoryEntry]) -> dict[str, dict[str, SettingValue]]:
    """Step -> the scheduler knobs the run changed just before it (a Session's set_budget): an
    entry's snapshot holds the config its next step runs with. A change after the last step is
    left out: no recorded step ran with it (a re-run that takes longer must not meet it)."""
    out: dict[str, dict[str, SettingValue]] = {}
    before: dict[str, SettingValue] | None = None
    for entry in entries[:-1]:
        step, _, snapshot = views.entry_parts(entry)
        config = snapshot.get("config") or {}
        knobs = {k: config.get(k) for k in SCHEDULER_KNOBS}
        if before is not None and knobs != before:
            out[str(step + 1)] = {k: v for k, v in knobs.items() if before.get(k) != v}
        before = knobs
    return out


def rerun_assets(panels: Sequence[str]) -> RerunAssetsDict:
    """The panels' code (ESM, CSS) and default states a re-run's page embeds (built where the
    widgets are, once per site: the browser has no anywidget)."""
    return {"sources": {k: list(v) for k, v in panel_sources(panels).items()}, "defaults": panel_defaults(panels)}


def load_recording(workload: ChapterWorkloadDict) -> Recording:
    fd, path = tempfile.mkstemp(suffix=".kvrec.gz")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(base64.b64decode(workload["recording"]))
        return Recording.load(path)
    finally:
        os.unlink(path)


def rerun(workload: ChapterWorkloadDict, settings: RerunSettingsDict) -> tuple[Recording, CoreReplay, CoreReplay]:
    """(the recording, its re-run at its own settings, its re-run at `settings`): a setting the
    engine refuses raises SettingRejected naming it."""
    rec = load_recording(workload)
    texts = workload.get("token_texts") or {}

    def decode(ids: Sequence[int]) -> str:
        return "".join(texts.get(str(t), "") for t in ids)

    info: ModelInfoDict = workload.get("model_info") or {}
    v = core_variant(rec, **settings)
    knobs = {int(k): x for k, x in (workload.get("knob_changes") or {}).items()}
    base = core_replay(rec, model_info=info, decode=decode, knob_changes=knobs)
    run = base if not v.changed else core_replay(rec, v, model_info=info, decode=decode, knob_changes=knobs)
    return rec, base, run


def recorded_identity(workload: ChapterWorkloadDict) -> str | None:
    """None when the re-run at the recorded settings decides every recorded step as the recording
    did (each step's decisions digest, explorer.core.recording.step_decisions); else where not."""
    rec, base, _ = rerun(workload, {})
    ours = list(zip(base.result.steps, base.result.digests))
    recorded = list(zip(rec.steps.step, rec.steps.digest))
    for mine, theirs in zip(ours, recorded):
        if mine != theirs:
            return f"step {theirs[0]}: the re-run decides otherwise than the recorded engine"
    # Past the recording's last step it may go on prefilling a prompt the recording left unfinished.
    if len(ours) < len(recorded):
        return f"the re-run ends after {len(ours)} steps, the recording holds {len(recorded)}"
    return None


def rerun_page(workload: ChapterWorkloadDict, settings: RerunSettingsDict, *,
               assets: RerunAssetsDict) -> RerunPageDict:
    """The re-run at `settings` as an export page (`html`), with what a reader needs beside it:
    the settings in words (`label`), where it parts from the recorded run (`parting`), why it
    stopped early (`stopped`), and the totals of both runs (`summary`)."""
    rec, base, run = rerun(workload, settings)
    texts = workload.get("token_texts") or {}

    def token_text(ids: Sequence[int]) -> list[str]:
        return [texts.get(str(t), f"<{t}>") for t in ids]

    first = int(workload.get("first_step", 0))
    start = max((i for i, e in enumerate(run.entries) if e.step <= first), default=0)
    shown = run.entries[start:]
    label = run.result.variant.label
    title = f"{workload.get('title', 'kvscope run')}: re-run with {label}"
    data = build_export_data(shown, token_text=token_text, title=title, captions={shown[0].step: title},
                             engine_name="kvscope's core, replaying recorded tokens", start="first",
                             panels=list(workload.get("panels") or ()))
    parting = first_parting(rec, base.result, run.result)
    notes = []
    if workload.get("knob_changes"):
        said = "; ".join(f"before step {step}: " + ", ".join(f"{k}={v}" for k, v in knobs.items())
                         for step, knobs in sorted(workload["knob_changes"].items(), key=lambda kv: int(kv[0])))
        notes.append(f"The recorded run changed settings between steps ({said}). A setting changed here holds for "
                     "the whole re-run; the others change where the recorded run changed them.")
    return {"notes": notes, "html": render_html(data, defaults=dict(assets["defaults"]),
                                sources={k: (esm, css) for k, (esm, css) in assets["sources"].items()}),
            "label": label, "stopped": run.stopped, "exact": EXACT,
            "parting": parting.text if parting else "the same decisions as the recorded run, step for step",
            "summary": {"recorded": _totals(base), "rerun": _totals(run)}}


def _totals(run: CoreReplay) -> RunTotalsDict:
    r = run.result
    return {"steps": r.num_steps, "preemptions": r.preemptions, "hit_tokens": r.hit_tokens,
            "finished": sum(1 for q in r.requests.values() if q.finished_step is not None),
            "replay_ms_per_step": 1e3 * r.seconds / max(1, r.num_steps)}


_ASSETS: dict[str, RerunAssetsDict] = {}   # the page's assets JSON -> parsed, once


def rerun_page_json(workload: str, settings: str, assets: str) -> str:
    """`rerun_page` with JSON in and out, as the browser calls it: a setting the engine refuses
    comes back as {"error": one line naming it}; anything else that fails raises (a bug, shown as one)."""
    if assets not in _ASSETS:
        _ASSETS[assets] = json.loads(assets)
    try:
        page = rerun_page(json.loads(workload), json.loads(settings), assets=_ASSETS[assets])
    except SettingRejected as exc:
        return json.dumps({"error": str(exc)})
    return json.dumps(page)
