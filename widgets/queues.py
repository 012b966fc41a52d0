"""Queues panel: waiting / running / finished requests and what this step did for each."""
from __future__ import annotations

from typing import Any, ClassVar, TypedDict

import traitlets as t

from ._base import Panel, bundle_css, bundle_esm


class WhyRowDict(TypedDict):
    """A queue card's why column (`queues_state`'s `why`: explorer.ui.why_view.why_rows)."""
    text: str   # RequestWhy.why(): "12 hit; 4 evicted +"
    cls: str    # the biggest miss class of its first admission ("hit" when none missed; "" not admitted)


class QueueScheduledDict(TypedDict):
    """What this step scheduled for a queue card's request (its ScheduledDict's fields, None where absent)."""
    num_tokens: int | None
    num_computed_before: int | None
    is_prefill: bool | None
    num_cached_tokens: int | None
    chunk_index: int | None


class QueueRowDict(TypedDict):
    """One request's card in the queues panel."""
    request_id: str
    label: str                # its name ("#17" for a long vLLM id)
    status: str
    prompt_text: str
    output_text: str
    num_prompt_tokens: int
    num_output_tokens: int
    max_tokens: int | None
    num_computed_tokens: int
    num_cached_tokens: int
    num_preemptions: int
    finish_reason: str | None
    num_blocks: int
    scheduled: QueueScheduledDict | None   # None: not scheduled in this step
    sampled_text: str | None
    why: WhyRowDict | None    # why its prompt hit or missed the prefix cache (explorer.ui.why_view.why_rows)


class QueueCardsDict(TypedDict):
    """The three queues' cards (finished: the latest, newest first)."""
    waiting: list[QueueRowDict]
    running: list[QueueRowDict]
    finished: list[QueueRowDict]


class QueuesState(TypedDict):
    """What explorer.ui.views.queues_state returns: the three queues' rows, and how many
    requests have finished (the rows may stop at the latest ones)."""
    queues: QueueCardsDict
    finished_total: int   # finished rows may be truncated to the latest


class QueuesPanel(Panel):
    """The engine's three queues, one card per request.

    `queues` is ``{"waiting": [row], "running": [row], "finished": [row]}`` with rows
    as built by ``explorer.ui.views.queues_state``: request_id, label (its short name, "#17"
    for a long vLLM id; the id shows on hover), status, prompt_text,
    output_text, token counts (prompt, output, computed, cached), num_preemptions,
    finish_reason and ``scheduled`` (what this step ran for it, or None).
    Browser actions: ``select {request_id}`` (sets `selected`; the Dashboard points
    the sampler and attention panels at it) and ``abort {request_id}``.
    """

    NAME = "queues"
    PARTS: ClassVar[dict[str, type]] = {"draw": QueuesState}
    _esm = bundle_esm("queues.js")
    _css = bundle_css("queues.css")

    queues: t.Dict[str, Any] = t.Dict({"waiting": [], "running": [], "finished": []}).tag(sync=True)
    selected = t.Unicode("").tag(sync=True)

    def handle_action(self, content: dict) -> bool:
        if content.get("action") == "select":
            self.selected = str(content.get("request_id") or "")
        return False  # the Dashboard also hears it
