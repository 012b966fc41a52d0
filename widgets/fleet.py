"""Fleet panel: the engine cores of a data-parallel vLLM server (or several servers) side by
side: Follow / Pause for all, each core's feed and load, and where each request went, with
what its routing cost it (the tokens it hit where it ran, the tokens the rank with the
longest prefix held at its arrival, and the difference: routing loss)."""
from __future__ import annotations

from typing import Any

import traitlets as t

from ._base import Panel, bundle_css, bundle_esm


class FleetPanel(Panel):
    """`following`: whether every engine core's steps are applied as they arrive. `ranks`:
    one ``{label, address, step, applied, missed, dropped_here, running, waiting, free_blocks,
    num_blocks, requests, scheduled_ahead}`` per engine core. `rows`: the latest requests,
    ``{request_id, rank, label, arrival_time, hit_tokens, would_hit: [tokens|None per rank],
    best_rank, best_tokens, loss_tokens, known}``; `summary`: their totals
    (explorer.core.fleet.Fleet.routing_summary) plus ``shown`` / ``total`` rows. Browser
    actions: ``follow``, ``pause``."""

    _esm = bundle_esm("fleet.js")
    _css = bundle_css("fleet.css")

    following = t.Bool(False).tag(sync=True)
    ranks: t.List[Any] = t.List([]).tag(sync=True)
    rows: t.List[Any] = t.List([]).tag(sync=True)
    summary = t.Dict({}).tag(sync=True)
