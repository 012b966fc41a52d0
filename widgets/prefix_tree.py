"""Prefix tree panel: the prefix cache as a tree of cached blocks over the run, tied to the pool:
each node named by the engine's block hash (the id the pool shows), lit with the blocks that hold
it at the shown step, with its hits over time and its evictions."""
from __future__ import annotations

from typing import ClassVar, TypedDict

from ._base import Panel, bundle_css, bundle_esm


class TreeEvictionDict(TypedDict):
    """One eviction of a prefix-tree node, up to the shown step."""
    step: int
    by: str | None          # the request whose allocation evicted it
    block: int
    age_steps: int | None   # how long it sat unused in the free queue (LRU age), in steps
    age_s: float | None     # ... and in seconds


class TreeNodeDict(TypedDict):
    """One node of the prefix tree panel: a cached prefix, one block of tokens."""
    id: str                 # the engine's block hash (16 hex digits), else the content key in hex
    parent: str | None      # the parent node's id (None: a root, or its parent is not drawn)
    depth: int
    num_tokens: int
    text: str
    present: bool           # cached at the shown step
    blocks: list[int]       # the block ids holding it then
    owners: list[str]       # the requests whose block tables hold those blocks
    users: list[str]        # who stored and hit it
    first_by: str
    hits: int               # up to the shown step
    stored: list[int]       # the steps it was cached at
    evictions: list[TreeEvictionDict]
    unused: bool            # evicted without a hit
    lifeline: list[int]     # hits per bin of the run
    folded: bool            # evicted with nothing cached under it
    domain: str             # its hash domain in words ("salt s LoRA l"; "" for none)


class KvEventsAgreementDict(TypedDict):
    """vLLM's own prefix tree (its KV events) against the ledger's present nodes."""
    blocks: int
    agree: bool
    only_here: list[str]
    only_in_events: list[str]
    counters: dict[str, int]   # the event reader's counts: batches, events, rejected, missed


class PrefixTreeDict(TypedDict):
    """The prefix tree at the shown step (explorer.ui.why_view.tree_state): the panel's `tree`."""
    step: int
    first_step: int
    last_step: int
    bins: int
    nodes: list[TreeNodeDict]
    hidden: int             # nodes not drawn (past MAX_TREE_NODES)
    num_present: int
    num_evicted: int
    num_hits: int
    block_size: int
    unmapped: int
    notes: list[str]
    kv_events: KvEventsAgreementDict | None


class PrefixTreeState(TypedDict):
    """What the panel draws: explorer.ui.why_view.tree_state's tree."""
    tree: PrefixTreeDict


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

