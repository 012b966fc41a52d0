"""Fleet panel: the engine cores of a data-parallel vLLM server (or several servers) side by
side: Follow / Pause for all, each core's feed and load, and where each request went, with
what its routing cost it (the tokens it hit where it ran, the tokens the rank with the
longest prefix held at its arrival, and the difference: routing loss)."""
from __future__ import annotations

from typing import ClassVar, TypedDict

from ._base import Panel, bundle_css, bundle_esm


class FleetRankDict(TypedDict):
    """One engine core in the fleet panel: its feed's counters (Session.feed_status) and its load."""
    label: str
    address: str
    step: int
    applied: int
    missed: int
    dropped_here: int
    running: int
    waiting: int
    free_blocks: int
    num_blocks: int
    scheduled_ahead: int | None
    requests: int          # waiting, running and finished


class RoutingRowDict(TypedDict):
    """One request's routing (explorer.core.fleet.Fleet.routing): where it ran, and what the best rank held."""
    request_id: str
    rank: int               # the index of the engine core it ran on
    label: str
    arrival_time: float | None
    hit_tokens: int         # where it ran
    prompt_blocks: int      # its full prompt blocks a hit could cover
    would_hit: list[int | None]   # tokens per engine core at its arrival (None: history too short)
    best_rank: int | None
    best_tokens: int | None
    loss_tokens: int        # best minus hit, never below 0
    known: bool             # False: no prompt hashes for it, so nothing is said


class RoutingSummaryDict(TypedDict):
    """Totals over routing rows (explorer.core.fleet.Fleet.routing_summary)."""
    requests: int
    per_rank: list[int]
    measured: int
    hit_tokens: int
    best_tokens: int
    loss_tokens: int
    requests_with_loss: int


class FleetSummaryDict(RoutingSummaryDict):
    """The routing totals, and how many of the rows the panel shows."""
    shown: int
    total: int


class FleetDrawState(TypedDict):
    """What the panel draws: Follow / Pause, each engine core, the latest requests' routing and its totals."""
    following: bool
    ranks: list[FleetRankDict]
    rows: list[RoutingRowDict]   # the latest MAX_ROWS (explorer.ui.fleet_view)
    summary: FleetSummaryDict


class FleetState(FleetDrawState):
    """`fleet_state` (explorer.ui.fleet_view): the FleetPanel's traits, the step of the furthest engine core too."""
    step: int


class FleetPanel(Panel):
    """`following`: whether every engine core's steps are applied as they arrive. `ranks`:
    one ``{label, address, step, applied, missed, dropped_here, running, waiting, free_blocks,
    num_blocks, requests, scheduled_ahead}`` per engine core. `rows`: the latest requests,
    ``{request_id, rank, label, arrival_time, hit_tokens, would_hit: [tokens|None per rank],
    best_rank, best_tokens, loss_tokens, known}``; `summary`: their totals
    (explorer.core.fleet.Fleet.routing_summary) plus ``shown`` / ``total`` rows. Browser
    actions: ``follow``, ``pause``."""

    NAME = "fleet"
    IN_DASHBOARD = False  # above a data-parallel server's columns (explorer.ui.fleet_view), never in the Dashboard
    PARTS: ClassVar[dict[str, type]] = {"draw": FleetDrawState}
    _esm = bundle_esm("fleet.js")
    _css = bundle_css("fleet.css")

