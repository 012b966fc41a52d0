"""The engine cores of a data-parallel vLLM server (or several servers) side by side: a
FleetPanel (widgets/fleet.py: Follow / Pause for all, each core's load, where each request
went and its routing loss) above one column per engine core with its own queues, KV pool and
timeline, each bound to that core's Session (explorer.core.fleet.Fleet holds them)."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import ipywidgets as W

if TYPE_CHECKING:  # the panel's module needs anywidget, imported when a panel is made
    from widgets.fleet import FleetPanel, FleetRankDict, FleetState

    from ..core.session_view import FleetView, SessionView

MAX_ROWS = 200          # the routing table shows the latest this many requests
COLUMN_PANELS = ("queues", "blocks", "timeline")
REFRESH_S = 0.5         # the fleet panel redraws at most this often while steps stream in


def fleet_state(fleet: FleetView, max_rows: int = MAX_ROWS) -> FleetState:
    """The FleetPanel's traits from a Fleet (plain data)."""
    rows = fleet.routing()
    summary = fleet.routing_summary(rows)
    ranks: list[FleetRankDict] = []
    for label, s in zip(fleet.labels, fleet.sessions):
        snap, st = s.current.snapshot, s.feed_status()
        q, pool = snap["queues"], snap["block_pool"]
        ranks.append({"label": label, "address": st.get("address", ""), "step": int(s.current.step),
                      "applied": st.get("applied", 0), "missed": st.get("missed", 0),
                      "dropped_here": st.get("dropped_here", 0), "running": len(q["running"]),
                      "waiting": len(q["waiting"]), "free_blocks": pool["num_free_blocks"],
                      "num_blocks": pool["num_blocks"], "scheduled_ahead": st.get("scheduled_ahead"),
                      "requests": sum(len(q[k]) for k in ("waiting", "running", "finished"))})
    shown = rows[-max_rows:]
    return {"ranks": ranks, "rows": shown, "summary": {**summary, "shown": len(shown), "total": len(rows)},
            "following": fleet.following, "step": max((r["step"] for r in ranks), default=0)}


def fleet_panel(fleet: FleetView) -> FleetPanel:
    """A FleetPanel bound to `fleet`: its button follows or pauses every engine core, and it
    redraws after their steps (at most every REFRESH_S while they stream in, the last one too)."""
    from widgets.fleet import FleetPanel

    panel = FleetPanel()
    last = [0.0]
    timer: list[threading.Timer] = []
    lock = threading.Lock()

    def refresh_trailing() -> None:
        timer.clear()
        refresh()

    def refresh(force: bool = True) -> None:
        with lock:
            wait = REFRESH_S - (time.monotonic() - last[0])
            if not force and wait > 0:
                if not timer:  # the last step of a burst is still drawn
                    t = threading.Timer(wait, refresh_trailing)
                    t.daemon = True
                    timer.append(t)
                    t.start()
                return
            last[0] = time.monotonic()
        panel.show(fleet_state(fleet))

    def on_action(content: Mapping[str, object]) -> None:   # the browser's message (JSON)
        if content.get("action") == "follow":
            fleet.follow()
        elif content.get("action") == "pause":
            fleet.pause()
        refresh()

    panel.on_action(on_action)
    fleet.subscribe(lambda event, _s: refresh(force=event in ("follow", "pause", "reset")))
    refresh()
    return panel


class FleetDashboard(W.VBox):
    """The FleetPanel above one column per engine core (queues, KV pool, timeline of its own
    Session): `Dashboard(fleet)` builds one, handing it `panel_of` (dashboard.panel: one panel
    bound to a Session). `fleet_panel` and `columns` are its parts."""

    def __init__(self, fleet: FleetView, panel_of: Callable[[SessionView, str], W.Widget], *,
                 panels: tuple[str, ...] = COLUMN_PANELS) -> None:
        panel = panel_of
        self.fleet = fleet
        self.fleet_panel = fleet_panel(fleet)
        self.columns = []
        for label, s in zip(fleet.labels, fleet.sessions):
            head = W.HTML(f"<b>{label}</b> <span style='color:#666'>{s.feed_status().get('address', '')}</span>")
            col = W.VBox([head, *(panel(s, name) for name in panels)],
                         layout=W.Layout(flex="1 1 0", min_width="0"))
            col.add_class("kvs-fleet-column")
            self.columns.append(col)
        row = W.HBox(self.columns, layout=W.Layout(width="100%", align_items="flex-start"))
        super().__init__([self.fleet_panel, row], layout=W.Layout(width="100%"))
        self.add_class("kvs-dashboard")
        self.add_class("kvs-fleet-dashboard")
