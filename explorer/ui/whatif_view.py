"""The what-if view: a recording replayed at its own settings and at a variant, side by side on
one slider (widgets.WhatIfPanel), the first step where they part marked and explained.

    from explorer.ui.whatif_view import whatif_panel
    whatif_panel(rec, num_blocks=128)                 # both runs with the recorded arrival steps
    whatif_panel(rec, max_num_batched_tokens=256, arrivals="timed")

Both runs take the same arrivals (by default the recorded steps), so where they part is the
setting's doing alone. Runs longer than `max_steps` are shown up to it (the notes say so).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.recording import Recording
from ..core.session_view import SettingValue
from ..whatif.parting import Parting, first_parting
from ..whatif.replay import ReplayResult, replay
from ..whatif.settings import variant
from ..whatif.step_model import fit

if TYPE_CHECKING:   # loaded when a panel is made: this module also runs where only Python does (the docs build)
    from widgets.whatif import WhatIfPanel, WhatIfRunDict, WhatIfRunsDict, WhatIfStateDict

MAX_STEPS = 2000


def run_state(rec: Recording, res: ReplayResult, max_steps: int = MAX_STEPS) -> WhatIfRunDict:
    """One run's columns (widgets.WhatIfPanel's `steps` entry)."""
    prompt = {r.request_id: len(r.prompt_token_ids) for r in rec.requests}
    details = res.details[:max_steps]
    cols: WhatIfRunDict = {"step": [], "time": [], "kv_usage": [], "free_blocks": [], "num_waiting": [],
                           "num_running": [], "scheduled": [], "preempted": [], "waiting": [], "finished": []}
    for i, d in enumerate(details):
        cols["step"].append(d.step)
        cols["time"].append(d.time)
        cols["kv_usage"].append(round(res.kv_usage[i], 4))
        cols["free_blocks"].append(d.free_blocks)
        cols["num_waiting"].append(res.num_waiting[i])
        cols["num_running"].append(res.num_running[i])
        cols["scheduled"].append([[rid, n, b, c, "decode" if n == 1 and b >= prompt[rid] else "prefill"]
                                  for rid, n, b, c in d.decisions["scheduled"]])
        cols["preempted"].append([[p.victim, p.for_request] for p in d.preemptions])
        cols["waiting"].append(list(d.waiting))
        cols["finished"].append(list(d.decisions["finished"]))
    return cols


def whatif_state(rec: Recording, a: ReplayResult, b: ReplayResult, parting: Parting | None,
                 max_steps: int = MAX_STEPS) -> WhatIfStateDict:
    """The panel's traits for runs `a` (the recorded settings) and `b` (the variant)."""
    notes = list(rec.source.notes)
    longest = max(a.num_steps, b.num_steps)
    if longest > max_steps:
        notes.append(f"showing the first {max_steps} of {longest} steps")
    if a.arrivals == "timed" and a.step_model is not None:
        notes.append("times are predicted: " + a.step_model.error_text())
    runs: WhatIfRunsDict = {
        "a": {"label": "as recorded" if not a.variant.changed else a.variant.label,
              "settings": a.variant.settings.to_dict()},
        "b": {"label": b.variant.label, "settings": b.variant.settings.to_dict()}}
    return {"runs": runs, "steps": {"a": run_state(rec, a, max_steps), "b": run_state(rec, b, max_steps)},
            "parting": parting.to_dict() if parting is not None and parting.index < max_steps else {},
            "index": parting.index if parting is not None and parting.index < max_steps else 0, "notes": notes}


def compare(rec: Recording, arrivals: str = "step",
            **changes: SettingValue) -> tuple[ReplayResult, ReplayResult, Parting | None]:
    """Both replays, kept step by step, and where they part."""
    model = fit(rec) if arrivals == "timed" else None
    a = replay(rec, arrivals=arrivals, step_model=model, keep_steps=True)
    b = replay(rec, variant(rec, **changes), arrivals=arrivals, step_model=model, keep_steps=True)
    return a, b, first_parting(rec, a, b)


def whatif_panel(rec: Recording, *, arrivals: str = "step", max_steps: int = MAX_STEPS,
                 **changes: SettingValue) -> WhatIfPanel:
    """A WhatIfPanel of `rec` at its own settings against `changes` (what-if knobs)."""
    from widgets.whatif import WhatIfPanel

    a, b, parting = compare(rec, arrivals, **changes)
    panel = WhatIfPanel()
    panel.show(whatif_state(rec, a, b, parting, max_steps))
    return panel


# The panel's own ESM in a page of its own (the docs site's replay): a model that holds the state
# and answers the panel's get / set / on; nothing is loaded from anywhere.
_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>{title}</title>
<style>body{{margin:8px;font-family:system-ui,sans-serif}}{css}</style></head>
<body><div id="kvs-whatif-root"></div>
<script type="application/json" id="kvs-whatif-state">{state}</script>
<script type="module">
const state = JSON.parse(document.getElementById("kvs-whatif-state").textContent);
const handlers = {{}};
const model = {{
  get: (k) => state[k],
  set: (k, v) => {{ state[k] = v; (handlers["change:" + k] || []).forEach((h) => h()); }},
  on: (ev, h) => {{ (handlers[ev] = handlers[ev] || []).push(h); }},
  off: () => {{}}, save_changes: () => {{}}, send: () => {{}},
}};
const esm = JSON.parse(document.getElementById("kvs-whatif-esm").textContent);
const mod = await import(URL.createObjectURL(new Blob([esm], {{ type: "text/javascript" }})));
await mod.default.render({{ model, el: document.getElementById("kvs-whatif-root") }});
</script>
<script type="application/json" id="kvs-whatif-esm">{esm}</script>
</body></html>
"""


def whatif_html(state: WhatIfStateDict, title: str = "kvscope what-if") -> str:
    """A self-contained page of the what-if panel over `state` (whatif_state's traits)."""
    import html
    import json

    from widgets.whatif import WhatIfPanel

    traits = {"step": 0, "live": True, "frozen": False, "link_group": "", **state}

    def embed(value: object) -> str:  # JSON inside a <script>: no "</" may close it early
        return json.dumps(value, separators=(",", ":")).replace("</", "<\\/")

    return _PAGE.format(title=html.escape(title), css=str(WhatIfPanel._css).replace("</", ""),
                        state=embed(traits), esm=embed(str(WhatIfPanel._esm)))
