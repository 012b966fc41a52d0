"""Follow panel: Follow / Pause of a Session attached to a live vLLM server, and what its feed
did (steps applied, missed, dropped, rejected, the recorder's own counters, notes). The prefix
cache is the prefix tree panel's (widgets.prefix_tree)."""
from __future__ import annotations

from typing import ClassVar, TypedDict

from ._base import Panel, bundle_css, bundle_esm


class FollowServerCounters(TypedDict, total=False):
    """The recorder's own counters, as the server last sent them (explorer.drivers.vllm_live.recorder)."""
    published: int
    unobserved: int
    errors: int
    steps: int
    recorder_ms: float
    recorder_cpu_ms: float
    publisher_cpu_ms: float
    backlog: int
    unrecorded: int


class _FollowFeedStatus(TypedDict, total=False):
    """What a live feed says of itself (explorer.drivers.vllm_live.client's status()); a Session without one:
    none of it."""
    address: str
    rank: int
    run_id: str
    seq: int
    pending: int                  # steps received, not applied yet
    received: int
    applied: int
    rejected: int
    dropped_here: int
    missed: int
    resyncs: int
    stale: int
    rebased: int                  # snapshots the state was retaken from
    last_rejection: str | None
    server: FollowServerCounters
    tokens_left_out: bool
    scheduled_ahead: int | None
    stopped: str | None           # the recorder's words when it stopped recording
    notes: list[str]
    kv_events: dict[str, int]     # the KV event subscriber's counters, where the feed has one


class FollowStatus(_FollowFeedStatus):
    """Session.feed_status() and the engine's name: the feed's counters, and whether the Session follows it."""
    following: bool
    history: dict[str, float | None]   # explorer.core.history.HistoryWindowDict: where the kept history starts
    engine: str


class FollowState(TypedDict):
    """What explorer.ui.follow_view sets: following or paused, the feed's counters, and
    the step the Dashboard's view is parked at while it follows (None: it shows the latest)."""
    following: bool
    status: FollowStatus
    parked_at: int | None


class FollowPanel(Panel):
    """`following`: whether steps are applied as they arrive. `status` is
    ``{address, engine, run_id, seq, pending, applied, missed, dropped_here, rejected,
    last_rejection, server: {published, unobserved, errors}, notes: [str]}``. `parked_at`: the
    step the other panels show while the session follows (scrubbed back), or None. Browser
    actions: ``follow``, and ``pause {at_step}`` (the step the browser held the panels at when Pause was clicked)."""

    NAME = "follow"
    IN_DASHBOARD = False  # shown above a live server's Dashboard, by explorer.ui.follow_view
    PARTS: ClassVar[dict[str, type]] = {"draw": FollowState}
    _esm = bundle_esm("follow.js")
    _css = bundle_css("follow.css")

