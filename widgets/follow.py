"""Follow panel: Follow / Pause of a Session attached to a live vLLM server, and what its feed
did (steps applied, missed, dropped, rejected, the recorder's own counters, notes). The prefix
cache is the prefix tree panel's (widgets.prefix_tree)."""
from __future__ import annotations

from typing import TypedDict

import traitlets as t

from ._base import Panel, bundle_css, bundle_esm


class FollowState(TypedDict):
    """What explorer.ui.follow_view sets: following or paused, and the feed's counters."""
    following: bool
    status: dict


class FollowPanel(Panel):
    """`following`: whether steps are applied as they arrive. `status` is
    ``{address, engine, run_id, seq, pending, applied, missed, dropped_here, rejected,
    last_rejection, server: {published, unobserved, errors}, notes: [str]}``. Browser actions:
    ``follow``, ``pause``."""

    PARTS = {"draw": FollowState}
    _esm = bundle_esm("follow.js")
    _css = bundle_css("follow.css")

    following = t.Bool(False).tag(sync=True)
    status = t.Dict({}).tag(sync=True)
