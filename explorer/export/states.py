"""The panel states of a recorded history, computed in Python for the one-file export.

An exported page (explorer/export/page.py) runs no Python, so it cannot turn a history entry into
panel states the way the live Dashboard does. Instead, every state the page can show is
computed here, at export time, by the very functions the Dashboard's binder calls
(explorer/ui/views.py, widgets/hover.block_detail): per kept entry, what
`SessionBinder.render` sends each panel with that entry on display, plus the answers the
page gives later without Python: the sampler's state for every request the user could
select, and every block's hover detail. The page's host (explorer/export/host.js) only
decodes them and hands them to the panels; it has no view code of its own.

`pack_views` delta-encodes each step against the one before with explorer/export/delta.py's
`diff` (a step costs what it changed), and turns the block pool's byte columns into JSON
lists; `unpack_views` gives back exactly the states `step_views` made.
"""
from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from typing import Any

from engine.config import SCHEDULER_KNOBS
from widgets.hover import block_detail

from ..core.labels import RequestLabels
from ..ui import captions as _captions
from ..ui import views, why_view
from ..ui.layout import POOL_KEYS
from ..why import WhyLedger
from . import delta

#: The key a byte column is replaced by in a packed view: {ARRAY_KEY: typecode, "values": [...]}.
ARRAY_KEY = "__array__"


# -- what each panel shows, per entry ---------------------------------------------------------------
def step_views(entries: Sequence[Any], token_text: views.TokenText, ledger: WhyLedger | None = None) -> list[dict]:
    """One dict per entry: each panel's state with that entry on display (see `_entry_views`).
    `ledger`: the why-ledger of the whole run (read from `entries` when not given)."""
    entries = list(entries)
    ledger = ledger if ledger is not None else WhyLedger().feed(entries)
    names = RequestLabels().see_entries(entries).name   # "#17" for a long vLLM id, as the Dashboard says it
    captions = _captions.CaptionCache(names).captions(entries)  # the binder's captions, entry by entry
    samplers = sampler_views(entries, token_text)
    details = _DetailCache(token_text)
    return [_entry_views(entry, caption, sampler, details, ledger, names)
            for entry, caption, sampler in zip(entries, captions, samplers)]


def why_views(ledger: WhyLedger, entries: Sequence[Any], token_text: views.TokenText, proof: Any = None) -> dict:
    """The why panel's states as [step, state] lists, one item per step where they change (an
    admission, a preemption): the page shows the last item at or before the shown step, as the
    Dashboard draws the panel for its scrubbed step. The summary (from the first entry's step:
    nothing admitted yet), each admitted request's state, and the request shown by default."""
    snapshot = views.entry_parts(entries[-1])[2] if entries else {}
    first = int(views.entry_parts(entries[0])[0]) if entries else 0
    changes = why_view.change_steps(ledger)
    steps = sorted({first, *changes})
    summary = [[s, why_view.summary_state(ledger, proof, step=s)] for s in steps]
    admitted = [rid for rid, w in ledger.requests.items() if w.admissions]
    return {"summary": summary,
            "requests": {rid: [[s, why_view.request_state(ledger, rid, snapshot, token_text, s)]
                               for s in why_view.change_steps(ledger, rid)] for rid in admitted},
            "default": [[s, why_view.latest_admitted(ledger, s)] for s in changes]}


def _entry_views(entry: Any, caption: str, sampler: dict, details: _DetailCache, ledger: WhyLedger,
                 names: Callable[[str], str]) -> dict:
    """What the binder sends each panel with `entry` on display (a recording's controls show
    the budgets the step ran under and the pool it ran on), and each block's hover detail
    without its `step`: the page adds the shown step, so a block that did not change costs
    nothing in the next step's delta."""
    step, record, snapshot = views.entry_parts(entry)
    config = snapshot.get("config") or {}
    shown = {name: dict(view(record, snapshot, details.token_text)) for name, view in views.STEP_VIEWS.items()}
    blocks = shown["blocks"].pop("blocks")  # apart, below: the pool's cells, and each one's hover detail
    return {
        "step": step,
        **shown,
        "controls": {"info": views.controls_info(record, snapshot), "engine": views.engine_label(snapshot),
                     "budget": views.budgets_ran_under(record, snapshot,
                                                       {k: config[k] for k in SCHEDULER_KNOBS if k in config}),
                     "pool": {k: config[k] for k in POOL_KEYS if k in config}, "caption": caption},
        "queues": views.queues_state(record, snapshot, why=why_view.why_rows(ledger, step), names=names),
        "tree": {"tree": why_view.tree_state(ledger, step, snapshot, details.token_text)},
        "block_details": [details.detail(blocks, i) for i in range(len(blocks))],
        "sampler": sampler,
        "attention": {"requests": views.probe_targets(snapshot), **views.attention_shape(snapshot)},
    }


def sampler_views(entries: Sequence[Any], token_text: views.TokenText) -> list[dict]:
    """Per entry, the sampler's state for each request the user could select there.

    `{"requests", "default", "samples": {request_id: sample}}`: the panel shows
    `views.sampler_state(entries[:i + 1], snapshot, rid)` = {requests, request_id: rid,
    sample: samples[rid]}, with rid the selected request, else `default` (what "" selects).
    Every request of every kept snapshot is selectable everywhere (a request pinned at a later
    step, shown before it arrived, says it has not been sampled yet)."""
    rids = list(dict.fromkeys(r["request_id"] for e in entries
                              for r in views.all_requests(views.entry_parts(e)[2])))
    last_sampled: dict[str, int] = {}  # request -> index of the latest entry that sampled it
    out = []
    for i, entry in enumerate(entries):
        _, record, snapshot = views.entry_parts(entry)
        for rid in record.get("sampled") or {}:
            last_sampled[rid] = i
        # sampler_state reads the last entry's record and the latest one that sampled the
        # request: the entries from that one on give the same state as the whole prefix.
        default = views.sampler_state(entries[i:i + 1], snapshot, "", token_text)
        samples = {rid: views.sampler_state(entries[last_sampled.get(rid, i):i + 1], snapshot, rid,
                                            token_text)["sample"] for rid in rids}
        samples.setdefault(default["request_id"], default["sample"])
        out.append({"requests": default["requests"], "default": default["request_id"], "samples": samples})
    return out


class _DetailCache:
    """Block hover details of consecutive snapshots: a block the history shares with the
    previous snapshot (explorer/core/history.py) keeps its detail object, so it is built once
    and `diff` skips it at once."""

    def __init__(self, token_text: views.TokenText) -> None:
        self.token_text = token_text
        self._last: dict[int, tuple[dict, dict]] = {}  # id(block) -> (block, its detail)
        self._now: dict[int, tuple[dict, dict]] = {}
        self._blocks: Sequence[dict] | None = None

    def detail(self, blocks: Sequence[dict], block_id: int) -> dict:
        if blocks is not self._blocks:  # a new snapshot: keep only the previous one's details
            self._last, self._now, self._blocks = self._now, {}, blocks
        block = blocks[block_id]
        kept = self._last.get(id(block))
        if kept is None or kept[0] is not block:
            detail = block_detail(blocks, block_id, 0, self.token_text)
            del detail["step"]
            kept = (block, detail)
        self._now[id(block)] = kept
        return kept[1]


# -- on the wire ------------------------------------------------------------------------------------
def pack_views(per_step: Sequence[dict]) -> list:
    """The first step's views whole, then each step's delta against the one before (byte
    columns as lists of numbers, so a delta names the blocks that changed)."""
    out: list = []
    prev = None
    for state in per_step:
        cur = _encode_columns(state)
        out.append(cur if prev is None else delta.diff(prev, cur))
        prev = cur
    return out


def unpack_views(packed: Sequence[Any]) -> list[dict]:
    """The inverse of `pack_views` (consecutive steps share what did not change)."""
    out: list[dict] = []
    cur = None
    for i, item in enumerate(packed):
        cur = item if i == 0 else delta.patch(cur, item)
        out.append({**cur, "blocks": _decode_columns(cur["blocks"])})
    return out


def _encode_columns(state: dict) -> dict:
    blocks = dict(state["blocks"])
    for key, code in views.BLOCK_COLUMNS.items():
        if key in blocks:
            blocks[key] = {ARRAY_KEY: code, "values": array(code, blocks[key]).tolist()}
    return {**state, "blocks": blocks}


def _decode_columns(blocks: dict) -> dict:
    return {k: array(v[ARRAY_KEY], v["values"]).tobytes() if isinstance(v, dict) and ARRAY_KEY in v else v
            for k, v in blocks.items()}
