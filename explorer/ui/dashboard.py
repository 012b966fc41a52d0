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
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, cast

import ipywidgets as W

import widgets
from engine.config import SCHEDULER_KNOBS
from engine.report.schema import EngineSnapshotDict, StepRecordDict
from widgets.attention import PreparedProbeDict, prepare_probe

from ..core.labels import RequestLabels
from ..core.session_view import FleetView, SessionView
from ..why import WhyLedger
from . import captions, layout, presets, views, why_view
from .layout import ON_DEMAND, POOL_KEYS, SELECTION_LINKS, chosen
from .panel_views import LEDGER_PANELS, PANEL_VIEWS, PanelContext, attention_view, controls_view, entry_context

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


#: Writes a Session's run to a file: `run_writer(session, path)` (what it returns is not read).
RunWriter = Callable[[SessionView, Path], object]


def dashboard_panels() -> tuple[str, ...]:
    """The panels the layout places, then every other registered panel; none that is ON_DEMAND."""
    placed = layout.laid_out()
    return tuple(n for n in (*placed, *(n for n in widgets.PANELS if n not in placed)) if n not in ON_DEMAND)


class SessionBinder:
    """Keeps panels in step with a Session and routes their browser actions to it.

    `view_index` is None while live (panels show `session.current`), else the index
    of the history entry every panel shows (scrubbing). A ValueError from the engine
    (bad input) is shown inline in the Controls panel; the Session keeps working.
    """

    def __init__(self, session: SessionView, panels: Iterable[str] | None = None, *,
                 run_writer: RunWriter | None = None) -> None:
        self.session = session
        #: What "save this run, then rebuild" writes the run with (None: the question offers no save).
        self.run_writer = run_writer
        self.view_index: int | None = None
        self.auto_probe = True  # re-read attention after each live step
        self._in_run = False       # inside a multi-step action: probe once, at its end
        self.panels: dict[str, Panel] = {}
        self._pinned: set[str] = set()   # the panels whose request the user chose (else the step's default)
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
        self._see_requests()
        p = self.panels
        ledger = self.why.feed(self.session.history) if LEDGER_PANELS & p.keys() else None
        c = self._context(ledger)
        # Each panel's view (panel_views.PANEL_VIEWS), but where the binder adds what only a live
        # Session has. In this order: the attention panel reads the queues' selection.
        own: dict[str, Callable[[PanelContext], None]] = {
            "controls": self._render_controls, "sampler": self._render_sampler,
            "attention": partial(self._render_attention, probe=c.live and self.auto_probe and probe),
            "why": self._render_why, "timeline": lambda _c: p["timeline"].show(self._timeline())}
        drawn = [n for n in dict.fromkeys([*PANEL_VIEWS, *own]) if n in p]
        for name in p.keys() - set(drawn):   # a panel with no view of an entry still says the step
            with p[name].hold_sync():
                p[name].step, p[name].live = c.step, c.live
        for name in drawn:
            panel = p[name]
            # A panel's step and what it shows of that step go in one comm message, so the
            # browser never sees data-step N over step N-1's content (tests and users wait on it).
            with panel.hold_sync():
                panel.step, panel.live = c.step, c.live
                if name in own:
                    own[name](c)
                else:
                    panel.show(PANEL_VIEWS[name](c))

    def _context(self, ledger: WhyLedger | None = None) -> PanelContext:
        """What the panels' views read with the shown entry on display (`ledger`: fed; None: an empty one)."""
        history = self.session.history or [self.session.current]
        index = len(history) - 1 if self.view_index is None else max(0, min(self.view_index, len(history) - 1))
        config = self.session.config
        return entry_context(history, index, self.token_text, ledger if ledger is not None else WhyLedger(),
                             self.labels.name, self._captions.caption(history, index), live=self.view_index is None,
                             config={k: getattr(config, k) for k in (*SCHEDULER_KNOBS, *POOL_KEYS)},
                             kv_events=getattr(self.session.source, "kv_events", None))

    def _render_controls(self, c: PanelContext) -> None:
        history = self.session.history
        self.panels["controls"].show({
            **controls_view(c),   # live: the knobs in force (editable); scrubbed back: those the step ran under
            "history_len": len(history), "history_first": int(history[0].step) if history else 1,
            "history_dropped": int(self.session.history_window["dropped"]),
            "view_index": -1 if self.view_index is None else self.view_index,
            "has_work": bool(self.session.source.pending()),
            "chat_template_available": presets.has_chat_template(self.session.source.tokenizer),
            # No controls (a live server's Session): Step, the form and the pool are hidden.
            "read_only": self.session.watch_only,
            "run_summary": {**views.run_summary(history), "can_save": self.run_writer is not None},
        })

    def _render_why(self, c: PanelContext) -> None:
        """The why panel as it stood after the shown step (live: the latest, the whole run)."""
        panel, why = self.panels["why"], self.why
        step = None if c.live else c.step
        rid = panel.request_id or (self.panels["queues"].selected if "queues" in self.panels else "")
        with why.lock:
            panel.summary = why_view.summary_state(why.ledger, why.proof, step=step)
            if not rid:  # nothing chosen: the latest admitted request by the shown step
                rid = why_view.latest_admitted(why.ledger, step)
            panel.request = why_view.request_state(why.ledger, rid, c.snapshot, self.token_text, step) if rid else {}
        panel.proving = why.proving

    def _render_sampler(self, c: PanelContext) -> None:
        sampler = self.panels["sampler"]
        picked = sampler.request_id if "sampler" in self._pinned else ""
        sampler.show(PANEL_VIEWS["sampler"](replace(c, selected=picked)))

    def _timeline(self) -> TimelineState:
        # The whole history is sent once per new step; scrubbing only moves the window.
        history = self.session.history
        key = (len(history), id(history[-1]) if history else None)
        state = self._timeline_state
        if key != self._timeline_key or state is None:
            self._timeline_key = key
            state = self._timeline_state = views.timeline_state(history, self._captions.captions(history))
        return state

    def _render_attention(self, c: PanelContext, *, probe: bool) -> None:
        att = self.panels["attention"]
        snapshot, step = c.snapshot, c.step
        heads = int((snapshot.get("model_info") or {}).get("num_heads") or 0)
        shape = attention_view(c)
        targets = shape["requests"]
        with att.hold_sync():
            att.requests = targets
            att.num_layers = shape["num_layers"]
            att.layer_names = shape["layer_names"]
            if "num_heads" in shape and att.num_heads != shape["num_heads"]:
                att.num_heads = shape["num_heads"]
                att.kv_head_of_head = shape["kv_head_of_head"]
        rid = att.request_id if "attention" in self._pinned else ""
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
        prep = prepare_probe(probe_dict, att.max_rows)
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
        self._pinned.clear()
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
            self._render_controls(self._context())

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
                self._render_attention(self._context(), probe=self.auto_probe)
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
            self._pin("attention")
            self._render_attention(self._context(), probe=True)

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
        `run_writer` (explorer's Dashboard hands it explorer.export's export_html)."""
        if self.run_writer is None:
            raise ValueError("this Dashboard was given no run_writer: explorer.Dashboard saves runs as HTML exports")
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = Path(self.save_dir) / f"kvscope-run-{stamp}.html"
        n = 1
        while path.exists():
            n += 1
            path = path.with_name(f"kvscope-run-{stamp}-{n}.html")
        self.run_writer(self.session, path)
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

    def _pin(self, name: str) -> None:
        """`name` shows the request the user chose in it, or follows the step when none is."""
        if self.panels[name].request_id:
            self._pinned.add(name)
        else:
            self._pinned.discard(name)

    def _select(self, source: str, rid: str) -> None:
        """A request chosen in one panel: the panels it links to (layout.SELECTION_LINKS) follow it."""
        p = self.panels
        for name in SELECTION_LINKS.get(source, ()):
            if name in p:
                p[name].request_id = chosen(name, rid, p[name].request_id)
                self._pin(name)
        c = self._context()
        if "sampler" in p:
            self._render_sampler(c)
        if "why" in p:
            with p["why"].hold_sync():
                self._render_why(c)
        if "attention" in p:
            self._render_attention(c, probe=True)


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

    def __new__(cls, session: SessionView | FleetView, *, panels: Iterable[str] | None = None,
                run_writer: RunWriter | None = None) -> Dashboard | FleetDashboard:
        if isinstance(session, FleetView):
            # A Fleet (the ranks of a data-parallel server): its engine cores side by side. Its
            # columns have no Controls: no rebuild, so no run to save.
            from .fleet_view import FleetDashboard

            return FleetDashboard(session, panel) if panels is None else FleetDashboard(session, panel,
                                                                                       panels=tuple(panels))
        return super().__new__(cls)

    def __init__(self, session: SessionView | FleetView, *, panels: Iterable[str] | None = None,
                 run_writer: RunWriter | None = None) -> None:
        if isinstance(session, FleetView):  # __new__ laid it out as a FleetDashboard
            raise TypeError(f"{type(self).__name__} shows one Session; Dashboard(fleet) shows a Fleet")
        self.session = session
        if panels is None:  # the sharding view only when there is sharding to see
            tp = getattr(session.config, "tensor_parallel_size", 1)
            panels = dashboard_panels() + (ON_DEMAND if tp > 1 else ())
        self.binder = SessionBinder(session, panels, run_writer=run_writer)
        for name, panel in self.binder.panels.items():
            setattr(self, name, panel)
        p = self.binder.panels
        rows: list[W.Widget] = []
        if session.controls is None:  # a Session that only watches (a live server): Follow / Pause
            from .follow_view import follow_panel

            self.follow = follow_panel(session, self.binder)
            rows.append(self.follow)
        for row in layout.rows_of(p):   # the layout's rows (explorer/ui/layout.py), new panels last
            if row.alone:
                rows.append(p[row.panels[0][0]])
                continue
            for name, flex in row.panels:
                p[name].layout = W.Layout(flex=flex, min_width="0")
            # Wrapping: each keeps its own height; else both as tall as the row (no white gap).
            box = (W.Layout(width="100%", align_items="flex-start", flex_flow="row wrap") if row.wrap
                   else W.Layout(width="100%", align_items="stretch"))
            rows.append(W.HBox([p[name] for name, _ in row.panels], layout=box))
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
