"""TTFT / ITL charts on the engine clock, drawn by plotly's FigureWidget (no CDN)."""
from __future__ import annotations

import html
from pathlib import Path

import anywidget
import ipywidgets as W
import plotly.graph_objects as go
from plotly.subplots import make_subplots

_TITLES = ("Time to first token per request", "Inter-token latency per request",
           "TTFT distribution", "ITL distribution")
EMPTY_HINT = "no steps yet: add a request and press Step"
_SHORT_IDS = 8     # request ids up to this long read level on the x axis; longer ones are rotated
_ROTATED = -40     # degrees: long ids stay whole (two cut ids could read the same)


class FitWidth(anywidget.AnyWidget):
    """An empty widget that keeps the plotly figures of the box it sits in as wide as the box
    (widgets/latency.js: a ResizeObserver, then plotly's own resize)."""

    _esm = (Path(__file__).parent / "latency.js").read_text()


def tick_angle(names: list[str]) -> int:
    """The x tick angle for these labels: level while every id is short, else rotated, so each
    label is its whole request id (ids cut to fit once read "#budge…-long" twice)."""
    return 0 if all(len(n) <= _SHORT_IDS for n in names) else _ROTATED


class LatencyPanel(W.VBox):
    """Per-request TTFT and ITL, and their distributions, updating live.

    Feed it rows ``{"request_id", "time_to_first_token": seconds | None, "inter_token_latency": [seconds]}`` (from
    ``explorer.ui.views.latency_rows``) with :meth:`show`. All times are on the engine
    clock, which advances only while a step executes, so manual stepping and pauses
    do not inflate them. `figure` is the plotly ``FigureWidget``.
    """

    def __init__(self) -> None:
        fig = make_subplots(rows=2, cols=2, subplot_titles=_TITLES, vertical_spacing=0.26, horizontal_spacing=0.1)
        fig.add_trace(go.Bar(name="TTFT", x=[], y=[], marker_color="#fb8c00"), row=1, col=1)
        fig.add_trace(go.Box(name="ITL", x=[], y=[], boxpoints="all", jitter=0.4, pointpos=0,
                             marker_color="#1e88e5"), row=1, col=2)
        fig.add_trace(go.Histogram(name="TTFT", x=[], marker_color="#fb8c00"), row=2, col=1)
        fig.add_trace(go.Histogram(name="ITL", x=[], marker_color="#1e88e5"), row=2, col=2)
        fig.update_layout(height=580, showlegend=False, margin=dict(l=50, r=20, t=60, b=40),
                          title=dict(text="TTFT / ITL (engine clock: advances only while a step executes)",
                                     font=dict(size=13)))
        for col in (1, 2):
            fig.update_yaxes(title_text="ms (engine clock)", row=1, col=col)
            fig.update_xaxes(title_text="request", type="category", automargin=True, tickangle=0,
                             row=1, col=col)
            fig.update_xaxes(title_text="ms (engine clock)", row=2, col=col)
            fig.update_yaxes(title_text="count", row=2, col=col)
        #: The plotly FigureWidget (an anywidget with plotly's own front end).
        self.figure = go.FigureWidget(fig)
        self.figure.add_class("kvs-latency-figure")
        self.header = W.HTML()
        self._last: tuple | None = None
        self.step = 0
        #: Follows the panel's width (plotly alone sizes a figure once, when drawn).
        self.fit_width = FitWidth()
        # The figure sits in a box of its own: FigureWidget's `layout` is plotly's, so hiding it
        # while there is nothing to plot takes this box's ipywidgets layout.
        self._figure_box = W.VBox([self.figure], layout=W.Layout(width="100%"))
        super().__init__([self.header, self._figure_box, self.fit_width], layout=W.Layout(width="100%"))
        self.add_class("kvs-latency")
        self.show([], step=0)

    def show(self, rows: list[dict], *, step: int = 0, live: bool = True) -> None:
        """Redraw from per-request rows (seconds); a no-op when nothing changed."""
        self.step = step
        n_ttft = sum(r.get("time_to_first_token") is not None for r in rows)
        n_itl = sum(len(r.get("inter_token_latency") or []) for r in rows)
        text = f"{len(rows)} requests · {n_ttft} with a first token · {n_itl} inter-token gaps · engine clock"
        # Nothing to plot yet: a hint instead of empty axes.
        hint = EMPTY_HINT if not rows else "no first token yet: press Step" if not n_ttft else ""
        if hint:
            text += f" · {hint}"
        self._figure_box.layout.display = "none" if hint else None
        self.header.value = (
            f'<div class="kvs-latency-head" data-testid="kvs-latency" data-step="{step}" '
            f'data-live="{str(live).lower()}" data-empty="{str(bool(hint)).lower()}" '
            f'style="font-size:12px;color:#555">{html.escape(text)}</div>')
        key = tuple((r["request_id"], r.get("time_to_first_token"), tuple(r.get("inter_token_latency") or ())) for r in rows)
        if key == self._last:
            return
        self._last = key
        ms = 1000.0
        with_ttft = [r for r in rows if r.get("time_to_first_token") is not None]
        itl_x = [f"#{r['request_id']}" for r in rows for _ in (r.get("inter_token_latency") or [])]
        itl_y = [v * ms for r in rows for v in (r.get("inter_token_latency") or [])]
        names = [f"#{r['request_id']}" for r in rows]
        with self.figure.batch_update():
            bar, box, h_ttft, h_itl = self.figure.data
            bar.x = [f"#{r['request_id']}" for r in with_ttft]
            bar.y = [r["time_to_first_token"] * ms for r in with_ttft]
            box.x, box.y = itl_x, itl_y
            # Whole ids on the axis (rotated when long; automargin makes room below).
            for axis in (self.figure.layout.xaxis, self.figure.layout.xaxis2):
                axis.tickmode, axis.tickvals, axis.ticktext = "array", names, names
                axis.tickangle = tick_angle(names)
            h_ttft.x = [r["time_to_first_token"] * ms for r in with_ttft]
            h_itl.x = itl_y
