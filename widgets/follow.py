"""Follow panel: Follow / Pause of a Session attached to a live vLLM server, what its feed
did (steps applied, missed, dropped, rejected, the recorder's own counters, notes), and the
prefix cache as vLLM's KV events report it (a tree of block hashes with hit counts)."""
from __future__ import annotations

from typing import TypedDict

import traitlets as t

from ._base import Panel, bundle_css, bundle_esm


class FollowState(TypedDict):
    """What explorer.ui.follow_view sets: following or paused, the feed's counters, the tree."""
    following: bool
    status: dict
    tree: dict


class FollowPanel(Panel):
    """`following`: whether steps are applied as they arrive. `status` is
    ``{address, engine, run_id, seq, pending, applied, missed, dropped_here, rejected,
    last_rejection, server: {published, unobserved, errors}, notes: [str]}``.
    `tree` is ``{roots: [{key, num_tokens, text, stored, hits, orphan, children}], num_blocks,
    counters}`` or {} without KV events. Browser actions: ``follow``, ``pause``."""

    PARTS = {"draw": FollowState}
    _esm = bundle_esm("follow.js")
    _css = bundle_css("follow.css")

    following = t.Bool(False).tag(sync=True)
    status = t.Dict({}).tag(sync=True)
    tree = t.Dict({}).tag(sync=True)
