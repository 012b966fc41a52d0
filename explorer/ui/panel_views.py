"""Each panel's view: the one function that turns what is on display into that panel's state.

The Dashboard's binder (explorer/ui/dashboard.py `SessionBinder.render`) and the one-file export
(explorer/export/states.py) draw every panel of `PANEL_VIEWS` the same way: build one
`PanelContext` for the shown entry, call the panel's view. What each adds around that loop is
what only it has: the binder, a live Session's history cursor, the knobs in force and the
attention heatmap probed from the live cache; the export, what a page without Python needs ahead
(the sampler's state for every request one could select, each block's hover detail).

The timeline and the why panel read the whole run, not one entry: they have run views
(`views.timeline_state`, explorer/ui/why_view.py), drawn once per new step.

Nothing here imports a widget (their state types are read under TYPE_CHECKING), so this view code
also runs where only Python does: a docs page's Pyodide.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict, cast

from engine.config import SCHEDULER_KNOBS
from engine.report.schema import BudgetsDict, EngineSnapshotDict, StepRecordDict

from ..core.history import Entry
from ..why import WhyLedger
from . import views, why_view
from .layout import POOL_KEYS
from .views import AttentionShapeDict, TokenText

if TYPE_CHECKING:
    from widgets.prefix_tree import PrefixTreeDict

    from ..drivers.vllm_live.kv_events import KvEventSubscriber


class PoolConfigDict(TypedDict, total=False):
    """An engine config's pool and budget fields (EngineConfig's names), as the Controls panel shows the pool
    and the command line gives them to a new Session (None: not given, the engine's default)."""
    num_kv_blocks: int | None
    block_size: int | None
    max_num_batched_tokens: int | None
    max_num_seqs: int | None


class ControlsViewState(TypedDict):
    """The Controls panel's traits one entry sets (of widgets.controls.ControlsState)."""
    info: str
    engine: str
    budget: BudgetsDict      # live: the knobs in force; else the ones the step ran under
    pool: PoolConfigDict     # the pool's fields (ui.layout.POOL_KEYS) of the engine's config
    caption: str


class TreeViewState(TypedDict):
    """The prefix tree panel's state (widgets.prefix_tree.PrefixTreeState)."""
    tree: PrefixTreeDict


class AttentionViewState(AttentionShapeDict):
    """The attention panel's choices at one entry (of widgets.attention.AttentionChoices)."""
    requests: list[str]


@dataclass(frozen=True)
class PanelContext:
    """What a panel's view may read: the shown entry, the history up to it, the chosen request,
    the why-ledger of the history, and how the panels name requests and tokens."""

    step: int
    record: StepRecordDict
    snapshot: EngineSnapshotDict
    entries: Sequence[Entry]            # the history up to and including the shown entry
    token_text: TokenText
    ledger: WhyLedger                   # fed with the history (an empty one where no panel reads it)
    names: Callable[[str], str]         # a request's name on screen ("#17" for a long vLLM id)
    caption: str                        # the shown step's plain-language line
    selected: str = ""                  # the request chosen for the panel ("": its default)
    live: bool = False                  # the Session's latest entry, with its knobs editable
    config: Mapping[str, object] | None = None   # the engine's config now (None: the snapshot's)
    kv_events: KvEventSubscriber | None = None   # a live server's KV events, which the tree checks


def entry_context(entries: Sequence[Entry], index: int, token_text: TokenText, ledger: WhyLedger,
                  names: Callable[[str], str], caption: str, *, live: bool = False,
                  config: Mapping[str, object] | None = None,
                  kv_events: KvEventSubscriber | None = None) -> PanelContext:
    """The context with entries[index] on display."""
    step, record, snapshot = views.entry_parts(entries[index])
    return PanelContext(step, record, snapshot, entries[:index + 1], token_text, ledger, names, caption,
                        live=live, config=config, kv_events=kv_events)


def controls_view(c: PanelContext) -> ControlsViewState:
    """Which engine, the step's numbers and caption, the pool, and the budgets: live, the knobs in
    force (editable); any other entry, the budgets it ran under."""
    config: Mapping[str, object] = c.config if c.config is not None else (c.snapshot.get("config") or {})
    # SCHEDULER_KNOBS are BudgetsDict's keys (engine/report/schema.py checks it), POOL_KEYS PoolConfigDict's
    in_force = cast(BudgetsDict, {k: config[k] for k in SCHEDULER_KNOBS if k in config})
    return {"info": views.controls_info(c.record, c.snapshot), "engine": views.engine_label(c.snapshot),
            "budget": in_force if c.live else views.budgets_ran_under(c.record, c.snapshot, in_force),
            "pool": cast(PoolConfigDict, {k: config[k] for k in POOL_KEYS if k in config}), "caption": c.caption}


def sampler_view(c: PanelContext) -> views.SamplerState:
    """The latest sample of the chosen request (else the step's default) in the entries given."""
    return views.sampler_state(c.entries, c.snapshot, c.selected, c.token_text)


def attention_view(c: PanelContext) -> AttentionViewState:
    """The requests holding KV to probe, and the model's layers and heads (the weights themselves
    are read from a live cache: the binder probes them)."""
    return {"requests": views.probe_targets(c.snapshot), **views.attention_shape(c.snapshot)}


def _tensor_parallel_view(c: PanelContext) -> Mapping[str, object]:
    from .tp_view import tensor_parallel_state  # its panel module needs anywidget: read on first use

    return tensor_parallel_state(c.record, c.snapshot, c.entries)


#: A panel's state from what is on display.
PanelView = Callable[[PanelContext], Mapping[str, object]]
#: Every panel's view, by panel name (widgets/<panel>.py's NAME). The Dashboard's binder and the export
#: draw each panel through this table, so a new panel is its widgets/<name>.py, .js and .css plus one
#: entry here and its place in explorer/ui/layout.py (docs/architecture.md, "Adding a panel").
#: (Each entry looks its function up when called: benchmarks/ui.py times them by module attribute.)
PANEL_VIEWS: dict[str, PanelView] = {
    "controls": controls_view,
    "queues": lambda c: views.queues_state(c.record, c.snapshot, why=why_view.why_rows(c.ledger, c.step),
                                           names=c.names),
    "tree": lambda c: {"tree": why_view.tree_state(c.ledger, c.step, c.snapshot, c.token_text,
                                                   kv_events=c.kv_events)},
    "blocks": lambda c: views.block_pool_state(c.record, c.snapshot),
    "slots": lambda c: views.shown_slot_mapping(c.record, c.snapshot, c.token_text),
    "latency": lambda c: views.latency_state(c.snapshot),
    "sampler": sampler_view,
    "attention": attention_view,
    "tensor_parallel": _tensor_parallel_view,
}
#: The panels whose view reads the why-ledger (the binder feeds it only when one is shown).
LEDGER_PANELS = frozenset({"queues", "tree", "why"})
