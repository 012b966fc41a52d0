"""The Follow panel (widgets.follow) bound to a Session that only watches its engine (a live
vLLM server): Follow / Pause and the feed's counters. vLLM's prefix cache is the prefix tree
panel's (explorer.ui.why_view: the tree over the run, tied to the pool, checked against vLLM's
own KV events where the Session has them)."""
from __future__ import annotations

import threading
import time
from typing import Any

def follow_panel(session: Any) -> Any:
    """A FollowPanel wired to `session`: its buttons call follow() / pause(),
    and it redraws after the session's events (at most every 0.2 s while steps stream in)."""
    from widgets.follow import FollowPanel

    panel = FollowPanel()
    last = [0.0]
    trailing: list[threading.Timer] = []

    def refresh(force: bool = True) -> None:
        now = time.monotonic()
        if not force and now - last[0] < 0.2:
            if not trailing:  # the last step of a burst still gets drawn, 0.2 s later
                timer = threading.Timer(0.2, lambda: (trailing.clear(), refresh()))
                timer.daemon = True
                trailing.append(timer)
                timer.start()
            return
        last[0] = now
        status = session.feed_status() | {"engine": session.engine_name}
        panel.show({"following": session.following, "status": status, "step": int(session.current.step)})

    def on_action(content: dict) -> None:
        action = content.get("action")
        if action == "follow":
            session.follow()
        elif action == "pause":
            session.pause()
        refresh()

    panel.on_action(on_action)
    session.subscribe(lambda event, _s: refresh(force=event != "step"))
    refresh()
    return panel
