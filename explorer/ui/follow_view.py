"""The Follow panel (widgets.follow) bound to a Session that only watches its engine (a live
vLLM server): Follow / Pause and the feed's counters. vLLM's prefix cache is the prefix tree
panel's (explorer.ui.why_view: the tree over the run, tied to the pool, checked against vLLM's
own KV events where the Session has them)."""
from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # the panel's module needs anywidget (imported when a panel is made)
    from widgets.follow import FollowPanel

    from ..core.history import HistoryEntry
    from ..core.session_view import SessionView


class ViewBinder(Protocol):
    """What the Follow panel uses of the Dashboard's binder (explorer.ui.dashboard.SessionBinder)."""
    link_group: str
    view_index: int | None   # the history index the panels are held at (None: the latest step)

    def shown_entry(self) -> HistoryEntry: ...

    def scrub(self, index: int | None) -> None: ...

    def hold_at(self, step: int) -> None: ...


def follow_panel(session: SessionView, binder: ViewBinder | None = None) -> FollowPanel:
    """A FollowPanel wired to `session`: its buttons call follow() / pause(), and it redraws
    after the session's events (at most every 0.2 s while steps stream in). With the
    Dashboard's `binder`: Pause shows the step the browser held the panels at, Follow returns
    the view to the latest step, and the panel says when the view is parked on an older one."""
    from widgets.follow import FollowPanel

    panel = FollowPanel()
    last = [0.0]
    trailing: list[threading.Timer] = []

    def refresh_trailing() -> None:
        trailing.clear()
        refresh()

    def refresh(force: bool = True) -> None:
        now = time.monotonic()
        if not force and now - last[0] < 0.2:
            if not trailing:  # the last step of a burst still gets drawn, 0.2 s later
                timer = threading.Timer(0.2, refresh_trailing)
                timer.daemon = True
                trailing.append(timer)
                timer.start()
            return
        last[0] = now
        status = session.feed_status() | {"engine": session.engine_name}
        parked = None
        shown = int(session.current.step)
        if binder is not None:
            panel.link_group = binder.link_group  # held and released with the Dashboard's panels
            entry = binder.shown_entry()
            shown = int(entry.step) if entry is not None else shown
            if binder.view_index is not None and session.following:
                parked = shown
        # `step` is the step the Dashboard shows, as every panel's is: the browser's Pause holds
        # the panels at the step the panels last said (a parked view stays parked, not the latest).
        panel.show({"following": session.following, "status": status, "parked_at": parked, "step": shown})

    def on_action(content: Mapping[str, object]) -> None:   # the browser's message (JSON)
        action = content.get("action")
        if action == "follow":
            if binder is not None:
                binder.view_index = None  # the view follows too, back to the latest step (drawn below)
            session.follow()  # its "follow" event redraws this panel first: it says following at once
            if binder is not None:
                binder.scrub(None)
        elif action == "pause":
            at = content.get("at_step")
            if binder is not None and isinstance(at, int) and not isinstance(at, bool):
                binder.hold_at(at)  # what the browser held the panels at, before the steps since
            session.pause()
        refresh()

    panel.on_action(on_action)
    session.subscribe(lambda event, _s: refresh(force=event != "step"))
    refresh()
    return panel
