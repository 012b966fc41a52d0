"""Adding a panel touches four files: widgets/<name>.py (its state class and NAME),
widgets/<name>.js and widgets/<name>.css, and its view in explorer/ui/panel_views.py PANEL_VIEWS
(`python -m widgets --write` then regenerates widgets/_panels.js, the browser's field lists); a
place in explorer/ui/layout.py LAYOUT is optional (else: the bottom).

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
from explorer.ui import dashboard, layout, views
from explorer.ui.panel_views import PANEL_VIEWS, PanelContext
from widgets import Panel

from .conftest import send


class ComputedTokensState(TypedDict):
    """What `computed_tokens` returns: each request's computed tokens, in the snapshot's order."""
    computed: list[int]


def computed_tokens(c: PanelContext) -> ComputedTokensState:
    return {"computed": [r["num_computed_tokens"] for r in views.all_requests(c.snapshot)]}


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

    monkeypatch.setitem(PANEL_VIEWS, "computed", computed_tokens)
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
        _step_two_requests(s)
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


def _step_two_requests(s: Any) -> None:
    s.add_request("The capital of France is", max_tokens=4, temperature=0.0)
    s.add_request("One two three four five six seven eight nine ten", max_tokens=3, temperature=0.0)
    s.step(3)


def test_a_new_panel_placed_in_the_middle_of_the_layout(computed_panel: type[Panel], fresh_session: Any,
                                                         monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """One row in explorer/ui/layout.py LAYOUT puts it beside the slots, under the pool, in the
    Dashboard and on the export page alike."""
    rows = list(layout.LAYOUT)
    at = next(i for i, row in enumerate(rows) if row.panels[0][0] == "blocks")
    rows.insert(at + 1, layout.Row((("computed", "1 1 200px"), ("latency", "2 1 0")), wrap=True))
    rows.remove(layout.Row((("latency", ""),)))
    monkeypatch.setattr(layout, "LAYOUT", tuple(rows))
    s = fresh_session
    names = dashboard.dashboard_panels()
    assert names.index("computed") == names.index("slots") + 1 and names[-1] == "timeline"
    dash = Dashboard(s)
    try:
        pair = dash.children[at + 1]
        assert list(pair.children) == [dash.computed, dash.latency]
        assert dash.computed.layout.flex == "1 1 200px" and pair.layout.flex_flow == "row wrap"
        assert dash.children[at].children == (dash.blocks, dash.slots)
        _step_two_requests(s)
        assert dash.computed.computed == expected(s.history[-1]) != []
    finally:
        dash.close_binding()

    html = export.export_html(s, tmp_path / "run.html").path.read_text()
    slots = [m.split('"')[1] for m in html.split('data-panel=')[1:]]
    assert slots[slots.index("slots") + 1:slots.index("slots") + 3] == ["computed", "latency"]
    assert '<div data-panel="computed" class="kvs-slot" style="flex: 1 1 200px; min-width: 0">' in html


def test_a_panel_name_is_taken_once(computed_panel: type[Panel]) -> None:
    with pytest.raises(TypeError, match=r"panel name 'queues' is taken by widgets\.queues\.QueuesPanel"):
        type("OtherQueues", (Panel,), {"NAME": "queues"})
