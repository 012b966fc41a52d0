"""Dashboard: the kvscope panels wired to one explorer Session.

`SessionBinder` keeps any set of panels in step with a Session (it listens to the
Session's events, turns history entries into panel states with `explorer.ui.views`,
and routes browser actions to Session methods). `Dashboard` lays every panel out
in one VBox; `panel(session, name)` and the `*_panel(session)` helpers give one
panel alone for a notebook cell.
"""
from __future__ import annotations

import logging
import re
import secrets
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, cast

import ipywidgets as W

import widgets
from engine.config import SCHEDULER_KNOBS
from engine.report.schema import BudgetsDict, EngineSnapshotDict, StepRecordDict
from widgets.attention import prepare_probe

from ..core.labels import RequestLabels
from ..core.session_view import FleetView, SessionView
from . import captions, presets, run_writer, tp_view, views, why_view
from .layout import ON_DEMAND, PANEL_NAMES, POOL_KEYS

if TYPE_CHECKING:
    from widgets import Panel
    from widgets.timeline import TimelineState

    from ..core.history import HistoryEntry
    from .fleet_view import FleetDashboard

_log = logging.getLogger(__name__)

SAMPLING_KEYS = ("max_tokens", "temperature", "top_k", "top_p", "ignore_eos", "seed")
# Form fields that must not be left empty (the form sends an emptied one as ""), and what to enter.
REQUIRED_FIELDS = {"max_tokens": "how many tokens to generate, 1 or more", "temperature": "0 for greedy",
                   "top_k": "0 for off", "top_p": "1 for off"}
# Attention: probe every head (for the head thumbnails) while heads x rows x keys stays
# below this; keep captured probes of earlier steps up to this many bytes.
_ALL_HEADS_BUDGET = 400_000
_PROBE_CACHE_BYTES = 64 * 2**20
NOTHING_TO_STEP = "nothing to step: add a request (the form below, or a preset), then press Step"
# The inputs an action's error can be about: the earliest one its message names is outlined.
# An add's size errors name an engine limit, but the prompt is what the person can change.
_ERROR_FIELDS = {"add": ("prompt", *SAMPLING_KEYS, "max_model_len", "token", "num_kv_blocks",
                         "max_num_batched_tokens"),
                 "set_budget": SCHEDULER_KNOBS, "reset": POOL_KEYS, "step": ("n",), "preset": ("n", "max_tokens")}
_ERROR_ALIASES = {"max_model_len": "prompt", "token": "prompt", "num_kv_blocks": "prompt",  # (for "add")
                  "max_num_batched_tokens": "prompt"}


class PreparedProbeDict(TypedDict):
    """A probe ready to show and to keep: what widgets.attention.prepare_probe returns."""
    request_id: str
    layer: int | None
    heads: list[int]
    kv_head_of_head: list[int]
    context_len: int
    block_size: int
    block_table: list[int]
    tokens: list[str]
    row_positions: list[int]
    head_probs: list[bytes]   # per head: its (thinned) rows as float32 bytes
    thumbs: bytes             # uint8 per head: thumb_shape, head after head ("" for a one-head probe)
    thumb_shape: list[int]
    thumb_heads: list[int]
    source: str | None        # where the weights came from, when not kvscope's own engine


def dashboard_panels() -> tuple[str, ...]:
    """PANEL_NAMES, then every other registered panel that is not ON_DEMAND."""
    return PANEL_NAMES + tuple(n for n in widgets.PANELS if n not in PANEL_NAMES and n not in ON_DEMAND)


class SessionBinder:
    """Keeps panels in step with a Session and routes their browser actions to it.

    `view_index` is None while live (panels show `session.current`), else the index
    of the history entry every panel shows (scrubbing). A ValueError from the engine
    (bad input) is shown inline in the Controls panel; the Session keeps working.
    """

    def __init__(self, session: SessionView, panels: Iterable[str] | None = None) -> None:
        self.session = session
        self.view_index: int | None = None
        self.auto_probe = True  # re-read attention after each live step
        self._in_run = False       # inside a multi-step action: probe once, at its end
        self.panels: dict[str, Panel] = {}
        self._sampler_pinned = False   # the user chose the sampler's request
        self._attention_pinned = False  # ... or the attention panel's
        self._timeline_key: tuple[int, int | None] | None = None   # (history length, id of its last entry)
        self._timeline_state: TimelineState | None = None
        # A request's name in every panel and caption: "#17" for a long vLLM id, kept for the view's life.
        self.labels = RequestLabels()
        self._labels_from = -1   # the latest step the labels read (read again: an add or an abort replaces it)
        self._captions = captions.CaptionCache(self.labels.name)  # one plain-language line per step, kept per entry
        # Attention weights of earlier steps, as captured live: (step, request, layer) -> probe
        # ready to show (widgets.attention.prepare_probe). The history keeps no KV, so a
        # scrubbed step shows its own capture or says it has none, never another step's.
        self._probes: OrderedDict[tuple[int, str, int], PreparedProbeDict] = OrderedDict()
        # The browser channel these panels light each other up on (_common.js, kvsLink); a new
        # engine gets a new one, so a pin on the old engine's request "2" lights nothing of the new.
        self.link_group = f"kvs-{secrets.token_hex(4)}"
        #: Where "save this run, then rebuild" writes the run's HTML export (a notebook's folder).
        self.save_dir = Path.cwd()
        self.token_text = views.token_texts(session.source.tokenizer)
        self.why = why_view.WhyView()  # why each prompt token hit or missed, fed from the history as it grows
        self._detach: list[Callable[[], None]] = []  # unsubscribe functions of the panels' action handlers
        for name in dashboard_panels() if panels is None else panels:
            self.add(name)
        self._unsubscribe = session.subscribe(self._on_event)
        self._show_engine_notice()
        self.render()

    # ---- panels ----
    def add(self, name: str) -> Panel:
        """The panel called `name` (created and bound on first use)."""
        if name in self.panels:
            return self.panels[name]
        if name not in widgets.PANELS:
            raise ValueError(f"unknown panel {name!r}; choose from {', '.join(widgets.PANELS)}")
        cls = widgets.PANELS[name]
        panel = cls(token_text=self.token_text) if name == "blocks" else cls()
        self._detach.append(panel.on_action(partial(self._on_action, name)))
        panel.binder = self  # keeps the binding alive as long as the panel is
        panel.link_group = self.link_group
        self.panels[name] = panel
        return panel

    def close(self) -> None:
        """Stop following the Session and stop acting on it (the panels keep their last
        state: a frozen picture must not be redrawn by a click on it)."""
        self._unsubscribe()
        for detach in self._detach:
            detach()
        self._detach.clear()
        for panel in self.panels.values():
            panel.frozen = True  # the browser swallows clicks and says "frozen at step N"

    def _show_engine_notice(self) -> None:
        """A knob the engine's driver changed so the engine would start (vLLM: max_num_seqs
        lowered to the token budget), said once in the Controls' notice line."""
        notice = getattr(self.session.engine, "notice", "") or ""
        if notice and "controls" in self.panels:
            self.panels["controls"].notice = notice

    # ---- what is shown ----
    def entries(self) -> list[HistoryEntry]:
        return list(self.session.history)

    def shown_entry(self) -> HistoryEntry:
        """The history entry on display: the scrubbed one, else the Session's current."""
        history = self.session.history
        if self.view_index is not None and history:
            return history[max(0, min(self.view_index, len(history) - 1))]
        return self.session.current

    def render(self, *, probe: bool = True) -> None:
        """Redraw every panel from the shown entry (`probe`: re-read attention if live)."""
        entry = self.shown_entry()
        record = entry.record or views.EMPTY_RECORD
        snapshot = entry.snapshot
        step = int(entry.step or snapshot.get("step", 0) or 0)
        live = self.view_index is None
        p = self.panels
        self._see_requests()
        ledger = self.why.feed(self.session.history) if {"why", "tree", "queues"} & p.keys() else None
        # Only the draws of panels in `p` run: the queues' and the tree's find the ledger fed.
        fed = cast(why_view.WhyLedger, ledger)
        # In this order: the attention panel reads the queues' selection.
        draws: dict[str, Callable[[], None]] = {
            "controls": lambda: self._render_controls(record, snapshot),
            "queues": lambda: p["queues"].show(views.queues_state(record, snapshot, why=why_view.why_rows(fed, step),
                                                                  names=self.labels.name)),
            "why": lambda: self._render_why(snapshot, None if live else step),
            "tree": lambda: p["tree"].show({"tree": why_view.tree_state(
                fed, step, snapshot, self.token_text, kv_events=getattr(self.session.source, "kv_events", None))}),
            # The pool, the slots, the latency charts and any new panel of one entry alone.
            **{name: partial(self._draw_step_view, name, record, snapshot) for name in views.STEP_VIEWS},
            "sampler": lambda: self._render_sampler(snapshot),
            "timeline": lambda: p["timeline"].show(self._timeline()),
            "attention": lambda: self._render_attention(snapshot, step, probe=live and self.auto_probe and probe),
            "tensor_parallel": lambda: p["tensor_parallel"].show(
                tp_view.tensor_parallel_state(record, snapshot, self.session.history)),
        }
        for name, panel in p.items():
            if name not in draws:
                with panel.hold_sync():
                    panel.step, panel.live = step, live
        for name, draw in draws.items():
            if name not in p:
                continue
            panel = p[name]
            # A panel's step and what it shows of that step go in one comm message, so the
            # browser never sees data-step N over step N-1's content (tests and users wait on it).
            with panel.hold_sync():
                panel.step, panel.live = step, live
                draw()

    def _draw_step_view(self, name: str, record: StepRecordDict, snapshot: EngineSnapshotDict) -> None:
        self.panels[name].show(views.STEP_VIEWS[name](record, snapshot, self.token_text))

    def _render_controls(self, record: StepRecordDict, snapshot: EngineSnapshotDict) -> None:
        history = self.session.history
        config = self.session.config
        # Live: the knobs in force (editable). Scrubbed back: the budgets the shown step ran under.
        # (a config's knobs by name: SCHEDULER_KNOBS are BudgetsDict's keys, engine/report/schema.py checks it)
        budget = cast(BudgetsDict, {k: getattr(config, k) for k in SCHEDULER_KNOBS})
        if self.view_index is not None:
            budget = views.budgets_ran_under(record, snapshot, budget)
        index = len(history) - 1 if self.view_index is None else self.view_index
        self.panels["controls"].show({
            "history_len": len(history), "history_first": int(history[0].step) if history else 1,
            "history_dropped": int(self.session.history_window["dropped"]),
            "view_index": -1 if self.view_index is None else self.view_index,
            "has_work": bool(self.session.source.pending()),
            # Which engine the panels show (a vLLM session says "vLLM 0.32.0").
            "info": views.controls_info(record, snapshot), "engine": views.engine_label(snapshot),
            "budget": budget, "pool": {k: getattr(config, k) for k in POOL_KEYS},
            "caption": self._captions.caption(history, index),
            "chat_template_available": presets.has_chat_template(self.session.source.tokenizer),
            # No controls (a live server's Session): Step, the form and the pool are hidden.
            "read_only": self.session.watch_only,
            "run_summary": {**views.run_summary(history), "can_save": run_writer.WRITER is not None},
        })

    def _render_why(self, snapshot: EngineSnapshotDict, step: int | None) -> None:
        """The why panel as it stood after the shown step (`step`; None: the latest, the whole run)."""
        panel, why = self.panels["why"], self.why
        rid = panel.request_id or (self.panels["queues"].selected if "queues" in self.panels else "")
        with why.lock:
            panel.summary = why_view.summary_state(why.ledger, why.proof, step=step)
            if not rid:  # nothing chosen: the latest admitted request by the shown step
                rid = why_view.latest_admitted(why.ledger, step)
            panel.request = why_view.request_state(why.ledger, rid, snapshot, self.token_text, step) if rid else {}
        panel.proving = why.proving

    def _render_sampler(self, snapshot: EngineSnapshotDict) -> None:
        sampler = self.panels["sampler"]
        history = self.session.history
        end = len(history) if self.view_index is None else self.view_index + 1
        rid = sampler.request_id if self._sampler_pinned else ""
        sampler.show(views.sampler_state(history[:end], snapshot, rid, self.token_text))

    def _timeline(self) -> TimelineState:
        # The whole history is sent once per new step; scrubbing only moves the window.
        history = self.session.history
        key = (len(history), id(history[-1]) if history else None)
        state = self._timeline_state
        if key != self._timeline_key or state is None:
            self._timeline_key = key
            state = self._timeline_state = views.timeline_state(history, self._captions.captions(history))
        return state

    def _render_attention(self, snapshot: EngineSnapshotDict, step: int, *, probe: bool) -> None:
        att = self.panels["attention"]
        heads = int((snapshot.get("model_info") or {}).get("num_heads") or 0)
        shape = views.attention_shape(snapshot)
        targets = views.probe_targets(snapshot)
        with att.hold_sync():
            att.requests = targets
            att.num_layers = shape["num_layers"]
            att.layer_names = shape["layer_names"]
            if "num_heads" in shape and att.num_heads != shape["num_heads"]:
                att.num_heads = shape["num_heads"]
                att.kv_head_of_head = shape["kv_head_of_head"]
        rid = att.request_id if self._attention_pinned else ""
        if not rid:
            selected = self.panels["queues"].selected if "queues" in self.panels else ""
            rid = selected if selected in targets else (targets[0] if targets else "")
        if self.session.controls is None:
            # A watched server's weights live on its devices: say so, rather than "not
            # captured, probe now" or "nothing holds KV".
            att.request_id = rid
            att.clear("attention weights are not in the live feed: the server's queries and KV live on its "
                      "devices. Step vLLM in this process (Session(engine='vllm')) to see them")
            return
        if not rid:
            att.clear(views.attention_note(snapshot))
            return
        req = next((r for r in views.all_requests(snapshot) if r["request_id"] == rid), None)
        att.num_prompt_tokens = len((req.get("prompt_token_ids") if req else None) or [])
        head = att.head if 0 <= att.head < max(1, heads) else 0
        key = (step, rid, att.layer)
        kept = self._probes.get(key)
        if kept is not None and head in kept["heads"]:
            self._probes.move_to_end(key)
            self._show_probe(kept, step)
            return
        if rid not in targets:  # a chosen request that held no KV at this step: say why, never probe
            att.request_id = rid
            att.clear(views.no_kv_note(rid, step, snapshot, self._shown_record(), self._snapshot_before()))
            return
        # The engine's cache holds the latest step's KV only: a probe now reads that step.
        if not (probe and self.view_index is None):
            att.request_id = rid
            what = f"head {head} of step {step}" if kept is not None else f"step {step}"
            if self.view_index is None:
                why = "a run of several steps reads them once, at its end: press \u21bb probe now"
            else:
                why = ("the history keeps no KV, so weights are read from the live cache after each step: "
                       "step live to capture")
            att.clear(f"weights for {what} not captured: {why}")
            return
        rows = next((int(x.get("num_tokens") or 0)
                     for x in (self._shown_record() or views.EMPTY_RECORD).get("scheduled", [])
                     if x.get("request_id") == rid), 1)
        context = int((req.get("num_computed_tokens") if req else None) or 0)
        every_head = heads > 1 and heads * max(1, rows) * max(1, context) <= _ALL_HEADS_BUDGET
        try:
            probe_dict = self.session.probe(rid, att.layer, None if every_head else head)
        except ValueError as exc:  # e.g. the request finished and its blocks were freed
            att.request_id = rid
            att.clear(str(exc))
            return
        # widgets.attention.prepare_probe takes and returns a bare dict: this is the shape it builds.
        prep = cast(PreparedProbeDict, prepare_probe(dict(probe_dict), att.max_rows))
        self._probes[key] = prep
        while len(self._probes) > 1 and sum(_probe_bytes(p) for p in self._probes.values()) > _PROBE_CACHE_BYTES:
            self._probes.popitem(last=False)
        self._show_probe(prep, step)

    def _show_probe(self, prep: PreparedProbeDict, step: int) -> None:
        att = self.panels["attention"]
        att.show_prepared(prep, step=step)
        if prep.get("source"):  # where the weights came from, when not kvscope's own engine
            att.message = str(prep["source"])

    def _shown_record(self) -> StepRecordDict | None:
        return self.shown_entry().record

    def _snapshot_before(self) -> EngineSnapshotDict | None:
        """The snapshot of the entry before the shown one (None at the first)."""
        history = self.session.history
        i = len(history) - 1 if self.view_index is None else min(self.view_index, len(history) - 1)
        return (history[i - 1].snapshot or None) if i >= 1 else None

    # ---- Session events ----
    def _on_event(self, event: str, _session: SessionView | None = None) -> None:
        try:
            if event == "reset":
                self.view_index = None
                self.labels.clear()   # a new engine's ids start again
                self._labels_from = -1
                self.why.reset()
                self._probes.clear()  # a new engine counts its steps from 0 again
                self._forget_selections()
                self.token_text = views.token_texts(self.session.source.tokenizer)
                if "blocks" in self.panels:
                    self.panels["blocks"].token_text = self.token_text
                self._timeline_key = None
                self._show_engine_notice()
            if event == "error" and "controls" in self.panels:
                # An action of these panels outlines its input afterwards (_show_error).
                self._show_error(str(getattr(self.session, "last_error", "") or ""))
                return
            if event == "step" and self.view_index is not None:
                self._render_controls_only()  # scrubbed back: only the slider grows
                return
            self.render(probe=not self._in_run)
        except Exception:  # noqa: BLE001 - a broken view must not break the Session's caller
            _log.exception("kvscope dashboard failed to render after %r", event)

    def _forget_selections(self) -> None:
        """A new engine's requests are new: every choice made on the old one goes (its ids start
        again at 0, so a kept "2" would name a different request, and a kept name a missing one)."""
        self._sampler_pinned = self._attention_pinned = False
        p = self.panels
        if "sampler" in p:
            p["sampler"].request_id = ""
        if "attention" in p:
            p["attention"].request_id = ""
        if "queues" in p:
            p["queues"].selected = ""
        if "why" in p:
            p["why"].request_id = ""
        if "blocks" in p:
            with p["blocks"].hold_sync():
                p["blocks"].selected, p["blocks"].detail = -1, {}
        self.link_group = f"kvs-{secrets.token_hex(4)}"  # the browser's pins and hovers go with it
        for panel in p.values():
            panel.link_group = self.link_group

    def _see_requests(self) -> None:
        """Number the requests of the entries added since the last draw (the latest entry again:
        an add or an abort replaces it), so a label names the same request at every step."""
        history = self.session.history
        start = len(history)
        while start > 0 and int(history[start - 1].step) >= self._labels_from:
            start -= 1
        self.labels.see_entries(history[start:])
        if len(history):
            self._labels_from = int(history[-1].step)

    def _render_controls_only(self) -> None:
        self._see_requests()
        if "controls" in self.panels:
            entry = self.shown_entry()
            self._render_controls(entry.record or views.EMPTY_RECORD, entry.snapshot)

    # ---- browser actions ----
    def _on_action(self, source: str, content: dict) -> None:
        action = content.get("action")
        controls = self.panels.get("controls")
        mutating = action in ("step", "reset", "add", "preset", "set_budget", "abort")
        if controls is not None and mutating:
            controls.busy = True
            controls.notice = ""
        try:
            self._run_action(source, action, content)
            if controls is not None and mutating:
                controls.error = ""
                controls.error_field = ""
        except ValueError as exc:  # the engine's own message for bad input (it says the fix), shown inline
            self._show_error(str(exc), error_field(action, str(exc)))
        except Exception as exc:  # noqa: BLE001 - anything else still must not leave the UI stuck
            _log.exception("kvscope action %r failed", action)
            self._show_error(f"{type(exc).__name__}: {exc}")
        finally:
            if controls is not None and mutating:
                controls.busy = False

    def _show_error(self, message: str, field: str = "") -> None:
        if "controls" in self.panels:
            with self.panels["controls"].hold_sync():
                self.panels["controls"].error = message
                self.panels["controls"].error_field = field
        else:
            _log.warning("kvscope: %s", message)

    def _run_action(self, source: str, action: str | None, c: dict) -> None:
        s = self.session
        if action == "step":
            self.view_index = None
            n = c.get("n", 1)  # the Session validates it (and names it in its error)
            if not s.source.pending():  # say so, rather than do nothing silently
                if isinstance(n, int) and not isinstance(n, bool) and n >= 1 and "controls" in self.panels:
                    self.panels["controls"].notice = NOTHING_TO_STEP
                    self.render(probe=False)  # a scrubbed view returns to live, as any Step does
                    return
            # Probing attention re-runs layers; in a long run do it once, at the end.
            self._in_run = isinstance(n, int) and n > 1
            try:
                s.step(n)
            finally:
                self._in_run = False
            if isinstance(n, int) and n > 1 and "attention" in self.panels:
                entry = self.shown_entry()
                self._render_attention(entry.snapshot, int(entry.step), probe=self.auto_probe)
        elif action == "add":
            self.view_index = None
            check_required(c)
            fields = {k: c[k] for k in SAMPLING_KEYS if c.get(k) is not None}
            prompt = c.get("prompt", "")
            if c.get("chat_template") and isinstance(prompt, str):
                prompt = presets.chat_prompt(s.source.tokenizer, prompt)
            s.add_request(prompt, **fields)
        elif action == "preset":
            self.view_index = None
            check_required(c)
            # The browser's `preset` message carries the form's fields beside its name (widgets/controls.py).
            done = presets.add_preset(s, str(c.get("name")), cast(presets.PresetFieldsDict, c))
            if "controls" in self.panels:  # what the preset did, stepping included, in words
                self.panels["controls"].notice = done
        elif action == "set_budget":
            s.set_budget(**{k: c[k] for k in SCHEDULER_KNOBS if k in c and c[k] is not None})
        elif action == "reset":
            self._rebuild(c)
        elif action == "abort":
            self.view_index = None
            s.abort(str(c.get("request_id")))
        elif action == "scrub":
            self.scrub(int(c.get("index", -1)))
        elif action == "scrub_step":
            steps = [int(e.step) for e in s.history]
            if int(c.get("step", -1)) in steps:
                self.scrub(steps.index(int(c["step"])))
        elif action == "live":
            self.scrub(None)
        elif action == "select":
            self._select(source, str(c.get("request_id") or ""))
        elif action == "prove" and "why" in self.panels:
            self.why.prove(s, done=lambda: self.render(probe=False))
            self.panels["why"].proving = self.why.proving
        elif action == "refresh" and "attention" in self.panels:
            self._attention_pinned = bool(self.panels["attention"].request_id)
            entry = self.shown_entry()
            self._render_attention(entry.snapshot, int(entry.step or 0), probe=True)

    def _rebuild(self, c: dict) -> None:
        """Reset / Apply: a new engine. The browser asked first (it names what goes); `save_run`
        writes the run to an HTML export before it goes, and the notice says where."""
        s = self.session
        self.view_index = None
        lost = views.run_words(views.run_summary(s.history))
        saved = self.save_run() if c.get("save_run") and lost else None
        if "controls" in self.panels:  # a new engine can take a while (vLLM: half a minute or more)
            name = getattr(s, "engine_name", "kvscope")
            self.panels["controls"].info = f"building a new {name} engine \u2026"
        pool = {k: c[k] for k in POOL_KEYS if c.get(k) is not None}
        s.reset(**pool)
        if "controls" in self.panels:
            knobs = ", ".join(f"{k}={getattr(s.engine.config, k)}" for k in POOL_KEYS)
            prior = self.panels["controls"].notice  # the new engine's own notice (vLLM), kept
            note = (f"{prior} \u00b7 " if prior else "") + f"a new engine ({knobs})"
            if saved is not None:
                note += f": the previous run ({lost}) is saved in {saved}; open it in a browser"
            elif lost:
                note += f": the previous run ({lost}) was discarded"
            self.panels["controls"].notice = note

    def save_run(self) -> Path:
        """The Session's run as one HTML export in `save_dir` (a new file name each time), by
        the installed writer (explorer.export's export_html; explorer.ui.run_writer)."""
        if run_writer.WRITER is None:
            raise ValueError("no run writer is installed: import explorer.export (explorer's Dashboard does)")
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = Path(self.save_dir) / f"kvscope-run-{stamp}.html"
        n = 1
        while path.exists():
            n += 1
            path = path.with_name(f"kvscope-run-{stamp}-{n}.html")
        run_writer.WRITER(self.session, path)
        return path

    def hold_at(self, step: int) -> None:
        """Show engine step `step` in every panel and stay there as steps come (a Pause clicked
        while the panels showed it); a step no longer in the history: the oldest kept."""
        entries = self.session.history
        index = next((i for i, e in enumerate(entries) if e.step >= step), len(entries) - 1)
        self.view_index = index
        self.render()

    def scrub(self, index: int | None) -> None:
        """Show history[index] in every panel (None or past the end: back to live)."""
        n = len(self.session.history)
        self.view_index = None if index is None or index < 0 or index >= n - 1 else index
        self.render()

    def _select(self, source: str, rid: str) -> None:
        """A request chosen in one panel: the sampler and attention panels follow it."""
        p = self.panels
        if source in ("queues", "why") and "why" in p:
            p["why"].request_id = rid
        if source == "queues" or source == "sampler":
            if "sampler" in p:
                p["sampler"].request_id = rid
                self._sampler_pinned = bool(rid)
        if source == "queues" or source == "attention":
            if "attention" in p:
                if rid:
                    p["attention"].request_id = rid
                self._attention_pinned = bool(p["attention"].request_id)
        entry = self.shown_entry()
        snap = entry.snapshot
        if "sampler" in p:
            self._render_sampler(snap)
        if "why" in p:
            with p["why"].hold_sync():
                self._render_why(snap, None if self.view_index is None else int(entry.step or 0))
        if "attention" in p:
            self._render_attention(snap, int(entry.step or 0), probe=True)


def _probe_bytes(prep: PreparedProbeDict) -> int:
    return sum(len(b) for b in prep["head_probs"]) + len(prep["thumbs"])


def check_required(content: dict) -> None:
    """The form sends an emptied required field as "": an error naming it, never a silent default."""
    for key in REQUIRED_FIELDS:
        if isinstance(content.get(key), str) and not content[key].strip():
            raise ValueError(f"{key} is empty: enter a number ({REQUIRED_FIELDS[key]})")


def error_field(action: str | None, message: str) -> str:
    """The form input an action's error message is about ("" when none): the earliest of the
    action's field names that the message names as a word (the engine's errors name the field)."""
    best, at = "", len(message) + 1
    for name in _ERROR_FIELDS.get(action or "", ()):
        m = re.search(rf"(?<![\w.]){re.escape(name)}(?![\w])", message)
        if m and m.start() < at:
            best, at = (_ERROR_ALIASES.get(name, name) if action == "add" else name), m.start()
    return best


class Dashboard(W.VBox):
    """Every kvscope panel bound to one Session, in one VBox (it displays itself).

    Attributes: `session`, `binder` (a :class:`SessionBinder`), and one attribute per
    panel: `controls`, `queues`, `sampler`, `why` (why the chosen request's prompt hit or
    missed the prefix cache), `blocks`, `slots`, `tree` (the prefix tree, tied to the pool),
    `attention`, `timeline`, `latency`. Display one alone with ``display(dash.queues)``.
    """

    def __new__(cls, session: SessionView | FleetView, **kwargs: Any) -> Dashboard | FleetDashboard:
        if cls is Dashboard and isinstance(session, FleetView):
            # A Fleet (the ranks of a data-parallel server): its engine cores side by side.
            from .fleet_view import FleetDashboard

            return FleetDashboard(session, panel, **kwargs)
        return super().__new__(cls)

    def __init__(self, session: SessionView | FleetView, *, panels: Iterable[str] | None = None) -> None:
        if isinstance(session, FleetView):  # only Dashboard itself lays a Fleet out (__new__), never a subclass
            raise TypeError(f"{type(self).__name__} shows one Session; Dashboard(fleet) shows a Fleet")
        self.session = session
        if panels is None:  # the sharding view only when there is sharding to see
            tp = getattr(session.config, "tensor_parallel_size", 1)
            panels = dashboard_panels() + (ON_DEMAND if tp > 1 else ())
        self.binder = SessionBinder(session, panels)
        for name, panel in self.binder.panels.items():
            setattr(self, name, panel)
        p = self.binder.panels
        rows: list[W.Widget] = []
        if session.controls is None:  # a Session that only watches (a live server): Follow / Pause
            from .follow_view import follow_panel

            self.follow = follow_panel(session, self.binder)
            rows.append(self.follow)
        if "controls" in p:
            rows.append(p["controls"])
        top = [p[n] for n in ("queues", "sampler") if n in p]
        if top:
            for n, flex in (("queues", "3 1 0"), ("sampler", "1 1 0")):
                if n in p:
                    p[n].layout = W.Layout(flex=flex, min_width="0")
            # Stretched: both panels as tall as the row, so a taller Sampler leaves no white gap.
            rows.append(W.HBox(top, layout=W.Layout(width="100%", align_items="stretch")))
        # The pool and this step's slots side by side (a laptop's 1366 px hold both); each
        # wraps under the other below ~2 x 440 px.
        pair = [p[n] for n in ("blocks", "slots") if n in p]
        for panel_ in pair:
            panel_.layout = W.Layout(flex="1 1 440px", min_width="0")
        if pair:
            rows.append(W.HBox(pair, layout=W.Layout(width="100%", align_items="flex-start", flex_flow="row wrap")))
        # The chosen request's why and the prefix tree under the pool they are tied to: the queues,
        # the pool and the slots stay above a laptop's fold (1366 x 768).
        rows += [p[n] for n in ("why", "tree") if n in p]
        rows += [p[n] for n in ("attention", "tensor_parallel", "timeline", "latency") if n in p]
        rows += [panel_ for n, panel_ in p.items() if n not in PANEL_NAMES + ON_DEMAND]  # new ones, last
        super().__init__(rows, layout=W.Layout(width="100%"))
        self.add_class("kvs-dashboard")

    def close_binding(self) -> None:
        """Stop following the Session."""
        self.binder.close()


# One binder per Session for panels shown alone, so they scrub together. Keyed by id:
# the binder dies with its Session (the Session's observer list is what holds it).
_shared: weakref.WeakValueDictionary[int, SessionBinder] = weakref.WeakValueDictionary()


def panel(session: SessionView, name: str) -> Panel:
    """One panel bound to `session`, for a notebook cell of its own.

    Panels made this way for the same Session share one binder: scrubbing in a
    standalone controls panel moves the other standalone panels too. Asking twice
    for the same name gives the same widget (display it again, or in another cell).
    """
    binder = _shared.get(id(session))
    if binder is None or binder.session is not session:
        binder = SessionBinder(session, ())
        _shared[id(session)] = binder
    widget = binder.add(name)
    binder.render()
    return widget


def controls_panel(session: SessionView) -> Panel:
    """Step / Run N / Play / Reset, the add-request form, budget knobs, history."""
    return panel(session, "controls")


def queues_panel(session: SessionView) -> Panel:
    """Waiting / running / finished requests."""
    return panel(session, "queues")


def sampler_panel(session: SessionView) -> Panel:
    """Top candidates and the chosen token of a request."""
    return panel(session, "sampler")


def block_pool_panel(session: SessionView) -> Panel:
    """The KV block pool and per-request block tables."""
    return panel(session, "blocks")


def slot_mapping_panel(session: SessionView) -> Panel:
    """This step's packed batch, token by token."""
    return panel(session, "slots")


def attention_panel(session: SessionView) -> Panel:
    """Attention heatmap of a request / layer / head."""
    return panel(session, "attention")


def timeline_panel(session: SessionView) -> Panel:
    """Per-step batch composition and timings, and the per-request Gantt."""
    return panel(session, "timeline")


def latency_panel(session: SessionView) -> Panel:
    """TTFT / ITL charts (engine clock; a live server's own request times)."""
    return panel(session, "latency")
