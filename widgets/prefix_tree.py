"""Prefix tree panel: the prefix cache as a tree of cached blocks over the run, tied to the pool:
each node named by the engine's block hash (the id the pool shows), lit with the blocks that hold
it at the shown step, with its hits over time and its evictions."""
from __future__ import annotations

from typing import ClassVar, TypedDict

import traitlets as t

from ._base import Panel, bundle_css, bundle_esm


class PrefixTreeState(TypedDict):
    """What explorer.ui.why_view.tree_state returns, as the panel's `tree`."""
    tree: dict


class PrefixTreePanel(Panel):
    """`tree` is ``{step, first_step, last_step, bins, nodes, hidden, num_present, num_evicted,
    num_hits, block_size, unmapped, notes, kv_events}``; each node ``{id (the engine's block
    hash), parent, depth, num_tokens, text, present (cached at the shown step), blocks (the
    block ids holding it then), owners, users (who stored and hit it), first_by, hits (until
    the shown step), stored ([step]), evictions ([{step, by, block, age_steps, age_s}]), unused
    (evicted without a hit), lifeline ([hits per bin of the run]), domain, folded (evicted with
    nothing cached under it: hidden behind the panel's "show N evicted prefixes" toggle)}``;
    cached subtrees come first at every level. `kv_events`: vLLM's
    own tree from its KV events against this one (a live server), or None.
    Hovering a node lights its blocks in the pool (kvsLink) and a block lights its node; a click
    pins it and shows its detail. Browser actions: ``scrub_step {step}`` (the panel's slider:
    every panel shows that step) and ``live``."""

    NAME = "tree"
    PARTS: ClassVar[dict[str, type]] = {"draw": PrefixTreeState}
    _esm = bundle_esm("prefix_tree.js")
    _css = bundle_css("prefix_tree.css")

    tree = t.Dict({}).tag(sync=True)
