"""Controls panel: stepping, Play, reset, the add-request form, budget knobs, history."""
from __future__ import annotations

from typing import ClassVar, TypedDict

import traitlets as t

from ._base import Panel, bundle_css, bundle_esm

#: Presets offered by the form; the Dashboard turns a name into real requests.
DEFAULT_PRESETS: list[dict] = [
    {"name": "shared_prefix", "label": "Shared-prefix pair",
     "hint": "adds one prompt, steps until its prefill is done, adds a second with the same prefix: "
             "watch prefix-cache hits"},
    {"name": "long_prompt", "label": "Long prompt",
     "hint": "a prompt 2.5x the token budget: watch chunked prefill (lower the budget for more chunks)"},
    {"name": "burst", "label": "Burst of N",
     "hint": "N requests at once; with a small pool (Reset with few KV blocks), watch preemption"},
]


class ControlsStatus(TypedDict):
    """The status line and the engine's badge."""
    info: str   # one-line summary of the engine state
    busy: bool   # Python is inside an action right now
    engine: str   # which engine the panels show ("kvscope", "vLLM 0.32.0"): a badge


class ControlsHistory(TypedDict):
    """The history slider."""
    history_len: int   # number of steps in the Session history
    history_first: int
    history_dropped: int   # steps a bounded history dropped before history[0]
    view_index: int


class ControlsError(TypedDict):
    """An action's error, and the input it is about."""
    error: str   # the engine's last error message, inline
    error_field: str   # the form input that message is about (outlined)


class ControlsCaption(TypedDict):
    """The shown step in words, and a notice."""
    caption: str   # the shown step in words (explorer.ui.captions)
    notice: str   # a hint that is not an error ("nothing to step ...")


class ControlsBudget(TypedDict, total=False):
    """The scheduler knobs (engine.config.SCHEDULER_KNOBS, as engine.report.schema.BudgetsDict has them): live,
    those in force; scrubbed back, those the shown step ran under (a recording may lack some)."""
    max_num_batched_tokens: int
    max_num_seqs: int
    enable_chunked_prefill: bool
    enable_prefix_caching: bool
    scheduler_reserve_full_isl: bool
    scheduling_policy: str


class ControlsPool(TypedDict, total=False):
    """The pool knobs of the engine's config (explorer.ui.layout.POOL_KEYS): Apply / Reset builds a new engine."""
    num_kv_blocks: int | None   # None: sized from the memory left
    block_size: int


class ControlsKnobs(TypedDict):
    """The scheduler's and the pool's knobs."""
    budget: ControlsBudget   # scheduler knobs in force (scrubbed: the shown step's)
    pool: ControlsPool   # pool knobs (Apply / Reset: a new engine)


class DiscardedRunDict(TypedDict):
    """What a new engine would discard of a run (explorer.ui.views.run_summary)."""
    steps: int
    requests: int
    unfinished: int   # requests still waiting or running


class ControlsRunSummary(DiscardedRunDict):
    """What a rebuild would discard, and whether it can offer to save the run first (an HTML export is installed)."""
    can_save: bool


class ControlsState(ControlsStatus, ControlsHistory, ControlsCaption, ControlsKnobs):
    """What the Dashboard sets after each change (explorer.ui.dashboard._render_controls)."""
    has_work: bool
    chat_template_available: bool
    read_only: str
    run_summary: ControlsRunSummary


class ControlsPanel(Panel):
    """Buttons and forms that drive a Session.

    Browser actions (custom messages, each acknowledged): ``step {n}``,
    ``reset {num_kv_blocks?, block_size?, save_run?}`` (Reset, and the pool knobs' Apply: a new
    engine; the browser asks first when `run_summary` has a run to lose, and `save_run` writes
    that run to an HTML file before it goes),
    ``add {prompt, max_tokens, temperature, top_k, top_p, ignore_eos, seed}`` (an empty
    required field arrives as "" and is an error naming it), ``preset {name, n?, chat_template?}``,
    ``set_budget {max_num_batched_tokens?, max_num_seqs?, enable_chunked_prefill?,
    enable_prefix_caching?, scheduler_reserve_full_isl?, scheduling_policy?}``, ``scrub {index}``, ``live``,
    ``clear_error``. ``add`` also carries ``chat_template`` (the form's switch: wrap the
    prompt in the tokenizer's chat template). Play is a browser timer that sends the next ``step`` only after
    the previous one was acknowledged, so the kernel is never flooded.
    """

    NAME = "controls"
    PARTS: ClassVar[dict[str, type]] = {"status": ControlsStatus, "history": ControlsHistory,
                                        "error": ControlsError, "caption": ControlsCaption, "knobs": ControlsKnobs}
    _esm = bundle_esm("controls.js")
    _css = bundle_css("controls.css")

    history_first = t.Int(1).tag(sync=True)      # step number of history[0]
    view_index = t.Int(-1).tag(sync=True)        # -1: live, else an index into history
    has_work = t.Bool(False).tag(sync=True)      # the engine has unfinished requests
    chat_template_available = t.Bool(False).tag(sync=True)  # the tokenizer has a chat template
    # What a new engine would discard: {"steps", "requests", "unfinished"} (the rebuild question says it),
    # and "can_save": whether it can offer to save the run first (an HTML export is installed).
    run_summary = t.Dict({}).tag(sync=True)
    form_defaults = t.Dict({"prompt": "The capital of France is", "max_tokens": 16, "temperature": 0.0,
                            "top_k": 0, "top_p": 1.0, "ignore_eos": False, "seed": None}).tag(sync=True)
    presets = t.List(DEFAULT_PRESETS).tag(sync=True)
    play_interval_ms = t.Int(250).tag(sync=True)
    # Why the Session only watches its engine ("" when it drives it): a live server's clients
    # send the requests and its command line sets the budgets, so Step, the form and the pool
    # are hidden and the budgets are shown read-only.
    read_only = t.Unicode("").tag(sync=True)

    def handle_action(self, content: dict) -> bool:
        if content.get("action") == "clear_error":
            with self.hold_sync():
                self.error = ""
                self.error_field = ""
            return True
        return False
