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
from collections.abc import Collection, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Final, TypedDict, cast

from engine.report.schema import BlockDict
from widgets.hover import block_detail

from ..core.history import HistoryEntry
from ..core.labels import RequestLabels
from ..ui import captions as _captions
from ..ui import views, why_view
from ..ui.panel_views import (
    PANEL_VIEWS,
    AttentionViewState,
    ControlsViewState,
    PanelContext,
    TreeViewState,
    entry_context,
    sampler_view,
)
from ..why import WhyLedger
from . import delta
from .delta import JSONValue

if TYPE_CHECKING:  # the panels' state types (their modules need anywidget; these names are only read here)
    from widgets.block_pool import BlockPoolCells
    from widgets.latency import LatencyState
    from widgets.queues import QueuesState
    from widgets.sampler import SamplerSample
    from widgets.slot_mapping import SlotMappingState
    from widgets.why import WhyRequestDict, WhySummaryDict

    from ..why.proof import ProofReport

#: The key a byte column is replaced by in a packed view: {ARRAY_KEY: typecode, "values": [...]}.
ARRAY_KEY: Final = "__array__"
#: A byte column in a packed view (`_encode_columns`): its array typecode, and its values.
PackedColumnDict = TypedDict("PackedColumnDict", {"__array__": str, "values": list[int]})


class BlockDetailState(TypedDict):
    """A block's hover detail as the page holds it: widgets.hover.block_detail's, less its `step`."""
    block_id: int
    ref_count: int
    hash: str | None
    owners: list[str]
    token_ids: list[int]
    tokens: list[str]
    is_null: bool
    is_free: bool


class SamplerViewsState(TypedDict):
    """The sampler's states at one entry (`_SamplerChoices`)."""
    requests: list[str]
    default: str                               # the request "" selects
    samples: dict[str, SamplerSample]   # request -> its SamplerState `sample`


class EntryViewsDict(TypedDict, total=False):
    """Each shown panel's state with one entry on display (`step_views`): its view's
    (explorer/ui/panel_views.py PANEL_VIEWS, a new panel too), the sampler's for every request, and
    each block's hover detail. `blocks` is the pool panel's state less its cells' hover details."""
    step: int
    blocks: BlockPoolCells   # and its legend's counts and block tables: BlockPoolState less `blocks`
    slots: SlotMappingState
    latency: LatencyState
    controls: ControlsViewState
    queues: QueuesState
    tree: TreeViewState
    block_details: list[BlockDetailState]   # each block's, by block id
    sampler: SamplerViewsState
    attention: AttentionViewState


class WhyViewsDict(TypedDict):
    """The why panel's states as [step, state] items, one per step where they change (`why_views`)."""
    summary: list[list[int | WhySummaryDict]]
    requests: dict[str, list[list[int | WhyRequestDict]]]   # by admitted request
    default: list[list[int | str]]                          # the request shown when none is chosen


# -- what each panel shows, per entry ---------------------------------------------------------------
def step_views(entries: Sequence[HistoryEntry], token_text: views.TokenText, panels: Collection[str],
               ledger: WhyLedger | None = None) -> list[EntryViewsDict]:
    """One dict per entry: the state of each of `panels` with that entry on display, as the
    Dashboard's binder draws it (each panel's view in PANEL_VIEWS, with the same context; a
    recording's controls show the budgets each step ran under and the pool it ran on).
    `ledger`: the why-ledger of the whole run (read from `entries` when not given)."""
    entries = list(entries)
    ledger = ledger if ledger is not None else WhyLedger().feed(entries)
    names = RequestLabels().see_entries(entries).name   # "#17" for a long vLLM id, as the Dashboard says it
    captions = _captions.CaptionCache(names).captions(entries)  # the binder's captions, entry by entry
    samplers = _SamplerChoices(entries) if "sampler" in panels else None
    details = _DetailCache(token_text)
    shown = [name for name in PANEL_VIEWS if name in panels and name != "sampler"]
    out: list[EntryViewsDict] = []
    for i, caption in enumerate(captions):
        c = entry_context(entries, i, token_text, ledger, names, caption)
        # (each view's state is its panel's TypedDict: EntryViewsDict names them)
        state = cast(EntryViewsDict, {"step": c.step, **{name: PANEL_VIEWS[name](c) for name in shown}})
        if "blocks" in state:   # the pool's cells apart: each one's hover detail, without its `step`
            pool: dict[str, object] = dict(state["blocks"])
            blocks = cast("list[BlockDict]", pool.pop("blocks"))   # the pool's blocks (views.block_pool_state)
            state["blocks"] = cast("BlockPoolCells", pool)
            state["block_details"] = [details.detail(blocks, b) for b in range(len(blocks))]
        if samplers is not None:
            state["sampler"] = samplers.at(c)
        out.append(state)
    return out


def why_views(ledger: WhyLedger, entries: Sequence[HistoryEntry], token_text: views.TokenText,
              proof: ProofReport | None = None) -> WhyViewsDict:
    """The why panel's states as [step, state] lists, one item per step where they change (an
    admission, a preemption): the page shows the last item at or before the shown step, as the
    Dashboard draws the panel for its scrubbed step. The summary (from the first entry's step:
    nothing admitted yet), each admitted request's state, and the request shown by default."""
    snapshot = views.entry_parts(entries[-1])[2] if entries else _captions.no_snapshot()
    first = int(views.entry_parts(entries[0])[0]) if entries else 0
    changes = why_view.change_steps(ledger)
    steps = sorted({first, *changes})
    summary: list[list[int | WhySummaryDict]] = [[s, why_view.summary_state(ledger, proof, step=s)] for s in steps]
    admitted = [rid for rid, w in ledger.requests.items() if w.admissions]
    return {"summary": summary,
            "requests": {rid: [[s, why_view.request_state(ledger, rid, snapshot, token_text, s)]
                               for s in why_view.change_steps(ledger, rid)] for rid in admitted},
            "default": [[s, why_view.latest_admitted(ledger, s)] for s in changes]}


class _SamplerChoices:
    """The sampler's state, entry after entry, for each request the user could select there.

    `{"requests", "default", "samples": {request_id: sample}}`: the panel shows PANEL_VIEWS'
    "sampler" view of the entry with that request selected = {requests, request_id: rid,
    sample: samples[rid]}, with rid the selected request, else `default` (what "" selects).
    Every request of every kept snapshot is selectable everywhere (a request pinned at a later
    step, shown before it arrived, says it has not been sampled yet)."""

    def __init__(self, entries: Sequence[HistoryEntry]) -> None:
        self.rids = list(dict.fromkeys(r["request_id"] for e in entries
                                       for r in views.all_requests(views.entry_parts(e)[2])))
        self.last_sampled: dict[str, int] = {}  # request -> index of the latest entry that sampled it

    def at(self, c: PanelContext) -> SamplerViewsState:
        """The choices at `c`'s entry (the entries are fed in order)."""
        i = len(c.entries) - 1
        for rid in c.record.get("sampled") or {}:
            self.last_sampled[rid] = i
        # The view reads the shown entry's record and the latest one that sampled the request:
        # the entries from that one on give the same state as the whole prefix.
        view = sampler_view   # PANEL_VIEWS["sampler"], typed
        default = view(replace(c, entries=c.entries[i:], selected=""))
        samples = {rid: view(replace(c, entries=c.entries[self.last_sampled.get(rid, i):], selected=rid))["sample"]
                   for rid in self.rids}
        samples.setdefault(default["request_id"], default["sample"])
        return {"requests": default["requests"], "default": default["request_id"], "samples": samples}


class _DetailCache:
    """Block hover details of consecutive snapshots: a block the history shares with the
    previous snapshot (explorer/core/history.py) keeps its detail object, so it is built once
    and `diff` skips it at once. The page adds the shown step, so a block that did not change
    costs nothing in the next step's delta."""

    def __init__(self, token_text: views.TokenText) -> None:
        self.token_text = token_text
        self._last: dict[int, tuple[BlockDict, BlockDetailState]] = {}  # id(block) -> (block, its detail)
        self._now: dict[int, tuple[BlockDict, BlockDetailState]] = {}
        self._blocks: Sequence[BlockDict] | None = None

    def detail(self, blocks: Sequence[BlockDict], block_id: int) -> BlockDetailState:
        if blocks is not self._blocks:  # a new snapshot: keep only the previous one's details
            self._last, self._now, self._blocks = self._now, {}, blocks
        block = blocks[block_id]
        kept = self._last.get(id(block))
        if kept is None or kept[0] is not block:
            # widgets.hover.block_detail takes and returns plain dicts: a BlockDetailState and its `step`
            detail = block_detail(cast("Sequence[dict]", blocks), block_id, 0, self.token_text)
            del detail["step"]
            kept = (block, cast(BlockDetailState, detail))
        self._now[id(block)] = kept
        return kept[1]


# -- on the wire ------------------------------------------------------------------------------------
def pack_views(per_step: Sequence[EntryViewsDict]) -> list[JSONValue | delta.DeltaDict | None]:
    """The first step's views whole, then each step's delta against the one before (byte
    columns as lists of numbers, so a delta names the blocks that changed)."""
    out: list[JSONValue | delta.DeltaDict | None] = []
    prev: JSONValue = None
    for state in per_step:
        cur = _encode_columns(state)
        out.append(cur if prev is None else delta.diff(prev, cur))
        prev = cur
    return out


def unpack_views(packed: Sequence[JSONValue]) -> list[EntryViewsDict]:
    """The inverse of `pack_views` (consecutive steps share what did not change), from the JSON it became."""
    out: list[EntryViewsDict] = []
    cur: JSONValue = None
    for i, item in enumerate(packed):
        # pack_views' items: the first step's views, then each step's delta from the one before
        cur = item if i == 0 else delta.patch(cur, cast("delta.DeltaDict | None", item))
        encoded = cast("dict[str, JSONValue]", cur)   # a step's views, as _encode_columns left them
        pool = encoded.get("blocks")
        decoded = {k: _column_bytes(v) for k, v in pool.items()} if isinstance(pool, dict) else None
        out.append(cast(EntryViewsDict, encoded if decoded is None else {**encoded, "blocks": decoded}))
    return out


def _encode_columns(state: EntryViewsDict) -> JSONValue:
    if "blocks" not in state:   # a page without the pool panel
        return cast(JSONValue, state)
    blocks = dict(state["blocks"])
    for key, code in views.BLOCK_COLUMNS.items():
        column = blocks.get(key)
        if isinstance(column, bytes):
            packed: PackedColumnDict = {ARRAY_KEY: code, "values": array(code, column).tolist()}
            blocks[key] = packed
    # JSON: a panel's state holds strings, numbers, lists and dicts, and the pool's byte columns (now lists).
    return cast(JSONValue, {**state, "blocks": blocks})


def _column_bytes(value: JSONValue) -> JSONValue | bytes:
    """A byte column `_encode_columns` packed, as bytes again; any other value as it is."""
    if isinstance(value, dict) and ARRAY_KEY in value:
        column = cast(PackedColumnDict, value)   # the only dicts with that key
        return array(column[ARRAY_KEY], column["values"]).tobytes()
    return value
