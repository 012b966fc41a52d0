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
from typing import TYPE_CHECKING, Final, TypedDict, cast

from engine.config import SCHEDULER_KNOBS
from engine.report.schema import BlockDict, BudgetsDict
from widgets.hover import block_detail

from ..core.history import HistoryEntry
from ..core.labels import RequestLabels
from ..ui import captions as _captions
from ..ui import views, why_view
from ..ui.layout import POOL_KEYS
from ..ui.views import AttentionShapeDict
from ..why import WhyLedger
from . import delta
from .delta import JSONValue

if TYPE_CHECKING:  # the panels' state types (their modules need anywidget; these names are only read here)
    from widgets.block_pool import BlockPoolCells
    from widgets.latency import LatencyState
    from widgets.prefix_tree import PrefixTreeDict
    from widgets.queues import QueuesState
    from widgets.sampler import SamplerSample
    from widgets.slot_mapping import SlotMappingState
    from widgets.why import WhyRequestDict, WhySummaryDict

    from ..why.proof import ProofReport

#: The key a byte column is replaced by in a packed view: {ARRAY_KEY: typecode, "values": [...]}.
ARRAY_KEY: Final = "__array__"
#: A byte column in a packed view (`_encode_columns`): its array typecode, and its values.
PackedColumnDict = TypedDict("PackedColumnDict", {"__array__": str, "values": list[int]})


class PoolConfigDict(TypedDict, total=False):
    """An engine config's pool and budget fields (EngineConfig's names), as the Controls panel shows the pool
    and the command line gives them to a new Session (None: not given, the engine's default)."""
    num_kv_blocks: int | None
    block_size: int | None
    max_num_batched_tokens: int | None
    max_num_seqs: int | None


class ControlsViewState(TypedDict):
    """The Controls panel's traits a recorded step sets (of widgets.controls.ControlsState)."""
    info: str
    engine: str
    budget: BudgetsDict      # the scheduler knobs the step ran under
    pool: PoolConfigDict     # the pool's fields (ui.layout.POOL_KEYS) of the engine's config
    caption: str


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


class TreeViewState(TypedDict):
    """The prefix tree panel's state (widgets.prefix_tree.PrefixTreeState)."""
    tree: PrefixTreeDict


class SamplerViewsState(TypedDict):
    """The sampler's states at one entry (`sampler_views`)."""
    requests: list[str]
    default: str                               # the request "" selects
    samples: dict[str, SamplerSample]   # request -> its SamplerState `sample`


class AttentionViewState(AttentionShapeDict):
    """The attention panel's choices at one entry (of widgets.attention.AttentionChoices)."""
    requests: list[str]


class EntryViewsDict(TypedDict):
    """Each panel's state with one entry on display (`step_views`); `blocks`, `slots` and `latency` are
    ui.views.STEP_VIEWS' panels (a panel added there comes along)."""
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
def step_views(entries: Sequence[HistoryEntry], token_text: views.TokenText,
               ledger: WhyLedger | None = None) -> list[EntryViewsDict]:
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


def _entry_views(entry: HistoryEntry, caption: str, sampler: SamplerViewsState, details: _DetailCache,
                 ledger: WhyLedger, names: Callable[[str], str]) -> EntryViewsDict:
    """What the binder sends each panel with `entry` on display (a recording's controls show
    the budgets the step ran under and the pool it ran on), and each block's hover detail
    without its `step`: the page adds the shown step, so a block that did not change costs
    nothing in the next step's delta."""
    step, record, snapshot = views.entry_parts(entry)
    config = snapshot.get("config") or {}
    shown = {name: dict(view(record, snapshot, details.token_text)) for name, view in views.STEP_VIEWS.items()}
    blocks = shown["blocks"].pop("blocks")  # apart, below: the pool's cells, and each one's hover detail
    # STEP_VIEWS types each state as a Mapping: they are block_pool_state's (less `blocks`), shown_slot_mapping's
    # and latency_state's; the other keys follow, in this order.
    out = cast(EntryViewsDict, {"step": step, **shown})
    in_force = cast(BudgetsDict, {k: config[k] for k in SCHEDULER_KNOBS if k in config})  # BudgetsDict's keys
    pool = cast(PoolConfigDict, {k: config[k] for k in POOL_KEYS if k in config})   # PoolConfigDict's keys
    out["controls"] = {"info": views.controls_info(record, snapshot), "engine": views.engine_label(snapshot),
                       "budget": views.budgets_ran_under(record, snapshot, in_force), "pool": pool,
                       "caption": caption}
    out["queues"] = views.queues_state(record, snapshot, why=why_view.why_rows(ledger, step), names=names)
    out["tree"] = {"tree": why_view.tree_state(ledger, step, snapshot, details.token_text)}
    out["block_details"] = [details.detail(blocks, i) for i in range(len(blocks))]
    out["sampler"] = sampler
    out["attention"] = {"requests": views.probe_targets(snapshot), **views.attention_shape(snapshot)}
    return out


def sampler_views(entries: Sequence[HistoryEntry], token_text: views.TokenText) -> list[SamplerViewsState]:
    """Per entry, the sampler's state for each request the user could select there.

    `{"requests", "default", "samples": {request_id: sample}}`: the panel shows
    `views.sampler_state(entries[:i + 1], snapshot, rid)` = {requests, request_id: rid,
    sample: samples[rid]}, with rid the selected request, else `default` (what "" selects).
    Every request of every kept snapshot is selectable everywhere (a request pinned at a later
    step, shown before it arrived, says it has not been sampled yet)."""
    rids = list(dict.fromkeys(r["request_id"] for e in entries
                              for r in views.all_requests(views.entry_parts(e)[2])))
    last_sampled: dict[str, int] = {}  # request -> index of the latest entry that sampled it
    out: list[SamplerViewsState] = []
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
        pool = encoded["blocks"]
        decoded = {k: _column_bytes(v) for k, v in pool.items()} if isinstance(pool, dict) else pool
        out.append(cast(EntryViewsDict, {**encoded, "blocks": decoded}))   # the views step_views made
    return out


def _encode_columns(state: EntryViewsDict) -> JSONValue:
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
