"""Adding a panel touches four files: widgets/<name>.py (its state class, traits and NAME),
widgets/<name>.js and widgets/<name>.css, and its entry in explorer/ui/views.py STEP_VIEWS
(`python -m widgets --write` then regenerates widgets/_panels.js, the browser's field lists).

Nothing else names a panel: here one is defined in the test, its ESM inline, and with no other
change it reaches the Dashboard (an attribute, its place in the layout, each step's state,
scrubbing) and the one-file export (a slot on the page and its state at every kept step)."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, TypedDict

import pytest
import traitlets as t

import widgets
from explorer import Dashboard
from explorer.export import page as export
from explorer.ui import dashboard, views
from widgets import Panel

from .conftest import send


class ComputedTokensState(TypedDict):
    """What `computed_tokens` returns: each request's computed tokens, in the snapshot's order."""
    computed: list[int]


def computed_tokens(_record: dict | None, snapshot: dict, _text: views.TokenText) -> ComputedTokensState:
    return {"computed": [r["num_computed_tokens"] for r in views.all_requests(snapshot)]}


@pytest.fixture
def computed_panel(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[Panel]]:
    """A new panel, registered as widgets/computed.py would register it, and its view: both
    taken back afterwards (the registry is the process's)."""
    saved = dict(widgets.PANELS), dict(widgets.STATEFUL_PANELS)

    class ComputedPanel(Panel):
        NAME = "computed"
        PARTS: ClassVar[dict[str, type]] = {"draw": ComputedTokensState}
        _esm = "export default { render({ model, el }) { el.textContent = String(model.get('computed')); } };"
        _css = ""
        computed = t.List([]).tag(sync=True)

    monkeypatch.setitem(views.STEP_VIEWS, "computed", computed_tokens)
    try:
        yield ComputedPanel
    finally:
        for registry, before in zip((widgets.PANELS, widgets.STATEFUL_PANELS), saved):
            registry.clear()
            registry.update(before)


def expected(entry: Any) -> list[int]:
    return [r["num_computed_tokens"] for r in views.all_requests(entry.snapshot)]


def test_a_new_panel_reaches_the_dashboard_and_the_export(computed_panel: type[Panel], fresh_session: Any,
                                                            tmp_path: Path) -> None:
    s = fresh_session
    assert dashboard.dashboard_panels()[-1] == "computed"
    dash = Dashboard(s)
    try:
        assert isinstance(dash.computed, computed_panel) and dash.children[-1] is dash.computed  # laid out last
        s.add_request("The capital of France is", max_tokens=4, temperature=0.0)
        s.add_request("One two three four five six seven eight nine ten", max_tokens=3, temperature=0.0)
        s.step(3)
        last = s.history[-1]
        assert dash.computed.step == last.step and dash.computed.computed == expected(last) != []
        send(dash.controls, action="scrub", index=1)  # scrubbing moves it with the others
        assert dash.computed.step == s.history[1].step and dash.computed.computed == expected(s.history[1])
    finally:
        dash.close_binding()

    result = export.export_html(s, tmp_path / "run.html")
    html = result.path.read_text()
    assert 'data-panel="computed"' in html and computed_panel._esm in html
    data = export.load_export(result.path)
    assert data["meta"]["panels"][-1] == "computed"
    assert [v["computed"]["computed"] for v in data["views"]] == [expected(e) for e in s.history]


def test_a_panel_name_is_taken_once(computed_panel: type[Panel]) -> None:
    with pytest.raises(TypeError, match=r"panel name 'queues' is taken by widgets\.queues\.QueuesPanel"):
        type("OtherQueues", (Panel,), {"NAME": "queues"})
