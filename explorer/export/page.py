"""One-file HTML export of a recorded Session: the panels, their history, no kernel.

`export_html(session, "run.html")` (also `Session.export_html`) writes one self-contained
HTML file: the panels' own ESM and CSS inlined, every panel state of every kept step computed
here in Python by the Dashboard's own view code (explorer/export/states.py: the first step
whole, then each step's delta), and a small host (explorer/export/host.js) that plays the
part of the kernel: it hands those states to the panels and has no view code of its own.
Opened from file:// with no network, it scrubs the history, shows block details on hover and
pin, links the panels (select a request, click a timeline bar), draws the timeline and
TTFT/ITL charts, and shows captions; engine actions are disabled with one line on how to run
live. A Content-Security-Policy in the page forbids every fetch.

`python -m explorer export OUT.html [--workload FILE|walkthrough]` records a workload first
(explorer/export/workloads.py).

Size: each step costs what changed in its panels' states (the packed batch and its token
texts, the requests and blocks the step touched, the samples it drew). Long runs are bounded
by `max_steps` (default 400 steps; `keep` says which: the last ones, the first ones, or evenly
spaced ones), and the page says so.
"""
from __future__ import annotations

import base64
import dataclasses
import datetime as _dt
import html
import json
import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from ..core.history import HistoryEntry
from ..ui import views
from ..ui.layout import KEEPS_CHOICE, SELECTION_LINKS, rows_of
from ..why import WhyLedger
from . import states
from .delta import DeltaDict, JSONValue

if TYPE_CHECKING:
    from widgets.timeline import TimelineState

    from ..core.session_view import SessionView
    from ..why.proof import ProofReport

HOST_JS = Path(__file__).with_name("host.js")
HOST_CSS = Path(__file__).with_name("host.css")

DEFAULT_MAX_STEPS = 400
# A page larger than this keeps fewer steps (64 decoding requests on 4,096 blocks cost ~90 KB
# a step; the walkthrough's ~60 steps on 64 blocks, ~0.6 MB in all).
DEFAULT_MAX_BYTES = 16_000_000
KEEP_CHOICES = ("last", "first", "even")
RUN_LIVE = "run `make lab` in a kvscope checkout (or `python -m explorer app` for the dashboard alone)"
_WIDGET_TRAITS = frozenset({"layout", "tabbable", "tooltip", "comm", "keys", "log"})
FORMAT, VERSION = "kvscope-export", 2  # 1 embedded the history itself; 2, its panel states
CSP = ("default-src 'none'; script-src 'unsafe-inline' blob: data:; style-src 'unsafe-inline'; "
       "img-src data: blob:; font-src data:; connect-src 'none'; form-action 'none'; base-uri 'none'")


class ExportMetaDict(TypedDict):
    """What the page's header says, and how it opens."""
    title: str
    created: str            # ISO 8601, UTC
    engine: str
    model: str | None
    device: str | None
    dtype: str | None
    steps_total: int        # engine steps in the history given
    first_step: int         # the first and last kept steps
    last_step: int
    notice: str             # about a shortened history ("" when whole)
    run_live: str
    panels: list[str]
    links: dict[str, list[str]]   # a request chosen in one panel -> the panels it is chosen in (layout.SELECTION_LINKS)
    keeps_choice: list[str]       # the panels a cleared choice leaves on their request (layout.KEEPS_CHOICE)
    start: str              # the step shown first: "last" or "first"


class _ExportFields(TypedDict):
    """The keys an exported page's document has, but its `views`."""
    format: str
    version: int
    meta: ExportMetaDict
    timeline: TimelineState
    captions: list[list[int | str]]   # [step, caption], by step
    why: states.WhyViewsDict


class ExportDataDict(_ExportFields):
    """The document an exported page embeds (`build_export_data`)."""
    views: list[JSONValue | DeltaDict | None]   # states.pack_views': each step's panel states, packed


class LoadedExportDict(_ExportFields):
    """The document of an exported page as `load_export` reads it back."""
    views: list[states.EntryViewsDict]   # unpacked: each kept step's panel states


@dataclasses.dataclass(frozen=True)
class ExportResult:
    """What `export_html` wrote."""

    path: Path
    bytes: int
    steps_total: int        # engine steps in the history given
    steps_included: int     # history entries in the file (the first one included)
    notice: str             # the page's note about a shortened history ("" when whole)


# -- choosing what goes in ----------------------------------------------------------------------
def select_entries(entries: Sequence[HistoryEntry], max_steps: int = DEFAULT_MAX_STEPS,
                   keep: str = "last", why: str | None = None) -> tuple[list[HistoryEntry], str]:
    """At most `max_steps` + 1 entries of `entries` (the first kept one is the starting
    state), and the notice the page shows when some were left out (`why`: the limit
    that did it, as the notice names it)."""
    if keep not in KEEP_CHOICES:
        raise ValueError(f"keep must be one of {', '.join(KEEP_CHOICES)}, got {keep!r}")
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        raise ValueError(f"max_steps must be an integer >= 1, got {max_steps!r}")
    entries = list(entries)
    if not entries:
        raise ValueError("the history is empty: nothing to export")
    if len(entries) <= max_steps + 1:
        return entries, ""
    first, last = _step(entries[0]), _step(entries[-1])
    if keep == "last":
        kept = entries[-(max_steps + 1):]
        how = f"the last {max_steps} steps"
    elif keep == "first":
        kept = entries[: max_steps + 1]
        how = f"the first {max_steps} steps"
    else:
        n = len(entries)
        idx = sorted({round(i * (n - 1) / max_steps) for i in range(max_steps + 1)})
        kept = [entries[i] for i in idx]
        how = f"{len(kept)} evenly spaced steps (each record is its own step's; the steps between are left out)"
    notice = (f"Shortened: this file holds {how}, steps {_step(kept[0])}\u2013{_step(kept[-1])} of the "
              f"recorded {first}\u2013{last} ({why or f'export limit max_steps={max_steps}'}).")
    return kept, notice


def _step(entry: HistoryEntry) -> int:
    return views.entry_parts(entry)[0]


# -- building the data ------------------------------------------------------------------------
def panel_defaults(names: Iterable[str]) -> dict[str, dict[str, JSONValue]]:
    """Each panel's synced traits as a fresh Python panel has them (bytes as base64)."""
    import widgets

    out: dict[str, dict[str, JSONValue]] = {}
    for name in names:
        if name not in widgets.PANELS:
            continue
        panel = widgets.PANELS[name]()
        try:
            state: dict[str, JSONValue] = {}
            for key in panel.trait_names(sync=True):
                if key.startswith("_") or key in _WIDGET_TRAITS:
                    continue
                value = getattr(panel, key)
                if isinstance(value, (bytes, bytearray, memoryview)):
                    value = {"__b64__": base64.b64encode(bytes(value)).decode()}
                state[key] = value
            out[name] = state
        finally:
            panel.close()
    return out


def panel_sources(names: Iterable[str]) -> dict[str, tuple[str, str]]:
    """(ESM, CSS) of each panel, exactly what anywidget hands the browser."""
    import widgets

    return {name: (str(widgets.PANELS[name]._esm), str(widgets.PANELS[name]._css))
            for name in names if name in widgets.PANELS}


def build_export_data(entries: Sequence[HistoryEntry], *,
                      token_text: Callable[[Sequence[int]], list[str]] | None = None,
                      title: str = "kvscope recording", captions: dict[int, str] | None = None,
                      notice: str = "", steps_total: int | None = None, engine_name: str = "kvscope",
                      start: str = "last", panels: Sequence[str] | None = None, ledger: WhyLedger | None = None,
                      proof: ProofReport | None = None) -> ExportDataDict:
    """The JSON-able document the page embeds (`load_export` reads it back): the panels'
    states of every entry, packed (explorer/export/states.py), the timeline, the captions, the
    why panel's states (`ledger`: the whole run's why-ledger, `proof` its proofs where made).
    `panels`: the Dashboard's (`dashboard_panels`), each running its own ESM (the TTFT/ITL charts
    too: one renderer for the notebook and the export); the attention panel says why it has no
    heatmap here."""
    if start not in ("last", "first"):
        raise ValueError(f"start must be 'last' or 'first', got {start!r}")
    token_text = token_text or views.token_texts(None)
    entries = list(entries)
    ledger = ledger if ledger is not None else WhyLedger().feed(entries)
    panels = list(_dashboard_panels() if panels is None else panels)
    per_step = states.step_views(entries, token_text, panels, ledger)
    last_snapshot = views.entry_parts(entries[-1])[2]
    info = last_snapshot.get("model_info") or {}
    created = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()
    return {
        "format": FORMAT, "version": VERSION,
        "meta": {"title": title, "created": created, "engine": engine_name,
                 "model": info.get("name"), "device": info.get("device"), "dtype": info.get("dtype"),
                 "steps_total": steps_total if steps_total is not None else _step(entries[-1]),
                 "first_step": _step(entries[0]), "last_step": _step(entries[-1]), "notice": notice,
                 "run_live": RUN_LIVE, "panels": panels,
                 "links": {source: list(targets) for source, targets in SELECTION_LINKS.items()},
                 "keeps_choice": list(KEEPS_CHOICE),
                 "start": start},
        # Sent once, as the binder does: the whole run, with the shown step as a cursor.
        "timeline": views.timeline_state(entries, [v["controls"]["caption"] for v in per_step]
                                         if "controls" in panels else None),
        "captions": sorted([[int(k), str(v)] for k, v in (captions or {}).items()]),
        "views": states.pack_views(per_step),
        "why": states.why_views(ledger, entries, token_text, proof),
    }


def _dashboard_panels() -> tuple[str, ...]:
    from ..ui.dashboard import dashboard_panels  # the widgets' registry: the page's own data needs none

    return dashboard_panels()


# -- writing the page ---------------------------------------------------------------------------
def _json_for_html(data: object) -> str:
    """`data` (anything json.dumps takes) as JSON a script element can hold."""
    try:
        text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError:  # NaN / infinity: not JSON; None says "unknown" as everywhere else
        text = json.dumps(_finite(data), ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    # "</script" or "<!--" would end or confuse the script element; "\/" is the same JSON.
    return text.replace("</", "<\\/").replace("<!--", "<\\u0021--")


def _finite(value: object) -> object:
    """`value` with NaN and the infinities as None, in its dicts and lists too."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _script_text(source: str) -> str:
    # Inside a script element only "</script" ends it; in JS "<\/script" means the same.
    return source.replace("</script", "<\\/script").replace("</SCRIPT", "<\\/SCRIPT").replace("<!--", "<\\!--")


def render_html(data: ExportDataDict, *, defaults: dict[str, dict[str, JSONValue]] | None = None,
                sources: dict[str, tuple[str, str]] | None = None) -> str:
    """The page for `data` (from `build_export_data`)."""
    meta = data["meta"]
    panels = meta["panels"]
    sources = panel_sources(panels) if sources is None else sources
    defaults = panel_defaults(panels) if defaults is None else defaults
    esc = html.escape
    styles = "\n".join(f'<style data-kvs-css="{esc(n)}">\n{css}\n</style>' for n, (_, css) in sources.items())
    esms = "\n".join(f'<script type="text/plain" data-kvs-esm="{esc(n)}">\n{_script_text(esm)}\n</script>'
                     for n, (esm, _) in sources.items())
    described = " \u00b7 ".join(x for x in (
        f"model {meta['model']}" if meta.get("model") else "",
        f"on {meta['device']}" if meta.get("device") else "",
        f"engine {meta['engine']}" if meta.get("engine") else "",
        f"steps {meta['first_step']}\u2013{meta['last_step']}",
        f"recorded {meta['created']}") if x)

    def slot(name: str, flex: str = "") -> str:
        style = f' style="flex: {flex}; min-width: 0"' if flex else ""
        return f'<div data-panel="{esc(name)}" class="kvs-slot"{style}></div>'

    body = ""   # the Dashboard's rows (explorer/ui/layout.py), a new panel last
    for row in rows_of(panels):
        if row.alone:
            body += slot(row.panels[0][0])
        else:
            body += (f'<div class="kvs-export-row{" kvs-export-wrap" if row.wrap else ""}">'
                     f'{"".join(slot(name, flex) for name, flex in row.panels)}</div>')
    limit = (f'<div class="kvs-export-limit" data-testid="kvs-export-limit">{esc(meta["notice"])}</div>'
             if meta.get("notice") else "")
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{html.escape(CSP, quote=False)}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="kvscope export (explorer/export/page.py)">
<title>{esc(meta["title"])}</title>
<style>
{HOST_CSS.read_text()}
</style>
{styles}
</head>
<body>
<header class="kvs-export-head" data-testid="kvs-export-head">
<h1>{esc(meta["title"])}</h1>
<div class="kvs-export-meta">{esc(described)}</div>
{limit}
<noscript>This recording needs JavaScript to draw its panels.</noscript>
</header>
<div id="kvs-export-error" class="kvs-export-error" role="alert" style="display:none"></div>
<div class="kvs-export-caption" data-testid="kvs-export-caption" style="display:none"></div>
<main id="kvs-export-root" class="kvs-dashboard">{body}</main>
<footer class="kvs-export-foot">Recorded with kvscope: a real paged-KV inference engine, one scheduler step at a time.
This page is a recording and runs no engine; to run one live, {esc(RUN_LIVE)}.</footer>
<script type="application/json" id="kvs-history">{_json_for_html(data)}</script>
<script type="application/json" id="kvs-panel-defaults">{_json_for_html(defaults)}</script>
{esms}
<script type="module">
{_script_text(HOST_JS.read_text())}
</script>
</body>
</html>
"""


def export_html(source: SessionView | Sequence[HistoryEntry], path: str | Path, *, title: str | None = None,
                captions: dict[int, str] | None = None,
                max_steps: int = DEFAULT_MAX_STEPS, keep: str = "last", start: str = "last",
                max_bytes: int = DEFAULT_MAX_BYTES,
                token_text: Callable[[Sequence[int]], list[str]] | None = None, prove: bool = False) -> ExportResult:
    """Write `source`'s history as one self-contained HTML file at `path`.

    `source` is a Session (its history, tokenizer and engine name are used) or a list of
    history entries (`HistoryEntry`s; pass `token_text` to show token texts). `captions` maps a
    step to a line shown from that step on (until the next caption). At most `max_steps` steps
    go in (`keep`: "last", "first" or "even"), and fewer when the page would pass `max_bytes`; the page says so
    when some are left out. `start`: the step shown when the page opens ("last" or
    "first"). The why panel and the prefix tree read the whole history, also the steps left out;
    `prove=True` also replays the run through vLLM's scheduler to prove each cause (seconds)."""
    entries = list(source.history) if hasattr(source, "history") else list(source)
    ledger = WhyLedger().feed(entries)
    proof = None
    if prove:
        from ..why import proof as why_proof  # vLLM's scheduler, loaded only to prove

        proof = why_proof.prove(ledger, why_proof.recording_of(entries))
    if token_text is None and hasattr(source, "engine"):
        token_text = views.token_texts(getattr(source.engine, "tokenizer", None))
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise ValueError(f"max_bytes must be an integer >= 1, got {max_bytes!r}")
    engine_name = str(getattr(source, "engine_name", "kvscope"))
    kept, notice = select_entries(entries, max_steps, keep)
    panels = _dashboard_panels()
    sources, defaults = panel_sources(panels), panel_defaults(panels)

    def page_for(kept: list[HistoryEntry], notice: str) -> str:
        name = title
        if name is None:
            info = (views.entry_parts(kept[-1])[2].get("model_info") or {})
            name = f"kvscope recording: {info.get('name') or 'engine'}, {len(kept) - 1} steps"
        data = build_export_data(kept, token_text=token_text, title=name, captions=captions, notice=notice,
                                 steps_total=_step(entries[-1]), engine_name=engine_name, start=start,
                                 panels=panels, ledger=ledger, proof=proof)
        return render_html(data, sources=sources, defaults=defaults)

    page = page_for(kept, notice)
    # Too big: keep proportionally fewer steps (each step costs about the same), a few times at most.
    for _ in range(4):
        size = len(page.encode("utf-8"))
        if size <= max_bytes or len(kept) <= 2:
            break
        steps = len(kept) - 1
        fewer = max(1, min(steps - 1, int(steps * max_bytes / size * 0.9)))
        kept, notice = select_entries(entries, fewer, keep,
                                      why=f"export size limit {max_bytes / 1e6:.1f} MB; {fewer} steps fit")
        page = page_for(kept, notice)
    path = Path(path)
    path.write_text(page, encoding="utf-8")
    return ExportResult(path=path, bytes=path.stat().st_size, steps_total=_step(entries[-1]),
                        steps_included=len(kept), notice=notice)


def load_export(path: str | Path) -> LoadedExportDict:
    """The document embedded in an exported page, with `views` added: each kept step's panel
    states, unpacked (explorer/export/states.py; byte columns as bytes again)."""
    text = Path(path).read_text(encoding="utf-8")
    marker = '<script type="application/json" id="kvs-history">'
    start = text.index(marker) + len(marker)
    end = text.index("</script>", start)
    data = json.loads(text[start:end])
    data["views"] = states.unpack_views(data["views"])
    return data
