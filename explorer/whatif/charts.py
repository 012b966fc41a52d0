"""A sweep's charts as plotly figures, and what they show in words.

Each line holds every knob but the x axis fixed: one series per value of the other knobs the
sweep varies (lines whose points are all equal are drawn once, named for all of them), so a line
never joins points that differ in something else. A chart whose figure is the same at every
setting says so in its title, and its axis shows the digits that would move. `findings` writes
the sentences a notebook shows beside the charts from the same rows, so a claim ("a bigger pool
keeps more prefix hits") appears only where the data make it.
"""
from __future__ import annotations

from itertools import pairwise
from typing import TYPE_CHECKING

from .settings import KNOBS, Knob
from .target import TargetMetric

if TYPE_CHECKING:
    import plotly.graph_objects as go

    from .rows import SweepRowDict, SweepRows

KnobValue = bool | int | float | str   # a knob's value in a row's settings (SettingsDict)
Point = tuple[KnobValue, float]         # (a knob's value, a figure of the row at it)
Line = tuple[str, list[Point]]          # a series: its name, its points sorted by the knob

_NAMES = {"block_size": "block size", "num_blocks": "blocks", "max_num_batched_tokens": "budget",
          "max_num_seqs": "max_num_seqs", "enable_prefix_caching": "prefix caching",
          "enable_chunked_prefill": "chunked prefill", "long_prefill_token_threshold": "long prefill"}


def varied(rows: list[SweepRowDict]) -> list[Knob]:
    """The knobs whose value differs between the rows."""
    return [k for k in KNOBS if len({str(r["settings"][k]) for r in rows}) > 1]


def _value(knob: str, v: KnobValue) -> str:
    if isinstance(v, bool):
        return f"{_NAMES.get(knob, knob)} {'on' if v else 'off'}"
    return f"{v} blocks" if knob == "num_blocks" else f"{_NAMES.get(knob, knob)} {v}"


def setting_text(row: SweepRowDict, knobs: list[Knob]) -> str:
    """A row's settings among `knobs`, in a few words ("40 blocks, budget 128")."""
    return ", ".join(_value(k, row["settings"][k]) for k in knobs) or "as recorded"


def series(rows: list[SweepRowDict], x: Knob, y: TargetMetric) -> list[Line]:
    """(name, sorted points) per value of the other varied knobs; equal series merged."""
    others = [k for k in varied(rows) if k != x]
    groups: dict[tuple[KnobValue, ...], list[Point]] = {}
    names: dict[tuple[KnobValue, ...], str] = {}
    for r in rows:
        got = r.get(y)
        if got is None:
            continue
        key = tuple(r["settings"][k] for k in others)
        groups.setdefault(key, []).append((r["settings"][x], got))
        names[key] = setting_text(r, others)
    merged: dict[tuple[Point, ...], list[str]] = {}
    for key in sorted(groups, key=lambda k: tuple(str(v) for v in k)):
        merged.setdefault(tuple(sorted(groups[key])), []).append(names[key])
    out = []
    for pts, labels in merged.items():
        out.append((labels[0] if len(labels) == 1 else f"{_joined(others, labels)} alike", list(pts)))
    return out


def _joined(others: list[Knob], labels: list[str]) -> str:
    """Several series' names as one: "20, 21 and 26 blocks" when one knob tells them apart."""
    if len(others) != 1:
        return " / ".join(labels)
    knob = others[0]
    values = [label.removesuffix(" blocks").removeprefix(f"{_NAMES.get(knob, knob)} ") for label in labels]
    listed = f"{', '.join(values[:-1])} and {values[-1]}"
    return f"{listed} blocks" if knob == "num_blocks" else f"{_NAMES.get(knob, knob)} {listed}"


def _spread(lines: list[Line]) -> tuple[float, float] | None:
    ys = [v for _, pts in lines for _, v in pts]
    return (min(ys), max(ys)) if ys else None


def _figure(lines: list[Line], title: str, x_title: str, y_title: str, percent: bool) -> go.Figure:
    import plotly.graph_objects as go

    fig = go.Figure()
    for name, pts in lines:
        fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers", name=name))
    spread = _spread(lines)
    if spread is not None and spread[0] == spread[1]:
        shown = f"{spread[0]:.1%}" if percent else f"{spread[0]:.3g}"
        title += f": the same at every setting ({shown})"
    fmt = ".0%" if percent else None
    if percent and spread is not None and spread[1] - spread[0] < 0.05:
        fmt = ".1%"    # a spread of a few points would read as one repeated tick at whole percents
    fig.update_layout(title=title, xaxis_title=x_title, yaxis_title=y_title, template="plotly_white",
                      title_font_size=12, yaxis_tickformat=fmt, legend_title_text="other knobs fixed at")
    return fig


def sweep_charts(result: SweepRows) -> dict[str, go.Figure]:
    import plotly.graph_objects as go

    rows = result.ok_rows
    figs: dict[str, go.Figure] = {}
    figs["hit_rate"] = _figure(series(rows, "num_blocks", "hit_rate"), "Prefix-hit rate against pool size (exact)",
                               "KV blocks", "hit tokens / prompt tokens", percent=True)
    err = result.step_model.error_text() if result.step_model is not None else ""
    figs["ttft_p90"] = _figure(series(rows, "max_num_batched_tokens", "ttft_p90"),
                               f"TTFT p90 against the token budget (predicted; {err})", "max_num_batched_tokens",
                               "seconds", percent=False)
    knobs = varied(rows) or ["num_blocks"]
    pre = go.Figure(go.Bar(x=[setting_text(r, knobs) for r in rows], y=[r["preemptions"] for r in rows],
                           text=[str(r["preemptions"]) for r in rows], textposition="outside", cliponaxis=False,
                           customdata=[r["recomputed_tokens"] for r in rows],
                           hovertemplate="%{x}<br>%{y} preemptions, %{customdata} tokens recomputed<extra></extra>"))
    pre.update_layout(title="Preemptions per setting (exact; the label is the count)", yaxis_title="preemptions",
                      template="plotly_white", title_font_size=12, yaxis_rangemode="tozero",
                      # counts: whole ticks from 0 (plotly's own put them at 0.5 for a top of 3)
                      yaxis_tick0=0, yaxis_dtick=max(1, -(-max((r["preemptions"] for r in rows), default=0) // 5)))
    figs["preemptions"] = pre
    return figs


def trend(points: list[Point]) -> str:
    """How y moves as x grows: 'rises', 'falls', 'flat', or 'both ways' (never smoothed)."""
    ys = [v for _, v in sorted(points)]
    ups = any(b > a for a, b in pairwise(ys))
    downs = any(b < a for a, b in pairwise(ys))
    return "both ways" if ups and downs else "rises" if ups else "falls" if downs else "flat"


def findings(result: SweepRows) -> list[str]:
    """What the sweep's figures show, one sentence per knob and figure, each read from the rows:
    prefix-hit tokens and preemptions against the pool, TTFT p90 against the budget."""
    rows = result.ok_rows
    out = []
    plots: tuple[tuple[Knob, TargetMetric, str], ...] = (
        ("num_blocks", "hit_tokens", "prefix-hit tokens"), ("num_blocks", "preemptions", "preemptions"),
        ("max_num_batched_tokens", "ttft_p90", "TTFT p90 (predicted)"))
    for x, y, what in plots:
        lines = [(name, pts) for name, pts in series(rows, x, y) if len({p[0] for p in pts}) > 1]
        said = [f"{what}: {_moves(x, y, pts)}" + ("" if name == "as recorded" else f", at {name}")
                for name, pts in lines]
        if said:
            out.append(f"As the {'pool' if x == 'num_blocks' else 'budget'} grows: " + "; ".join(said) + ".")
    return out


def _moves(x: str, y: str, pts: list[Point]) -> str:
    unit = "blocks" if x == "num_blocks" else "tokens"
    (x0, y0), (x1, y1) = pts[0], pts[-1]
    move = trend(pts)
    if move == "flat":
        return f"{_fmt(y, y0)} at every setting from {x0} to {x1} {unit}"
    if move == "both ways":
        ys = [v for _, v in pts]
        return f"up and down between {_fmt(y, min(ys))} and {_fmt(y, max(ys))} from {x0} to {x1} {unit}"
    return f"{'up' if move == 'rises' else 'down'} from {_fmt(y, y0)} at {x0} to {_fmt(y, y1)} at {x1} {unit}"


def _fmt(metric: str, v: float) -> str:
    if metric == "ttft_p90":
        return f"{v * 1e3:.0f} ms"
    return f"{v:g}"


def sweep_svg(result: SweepRows, width: int = 640, height: int = 260) -> str:
    """Prefix-hit rate against pool size, one line per value of the other knobs (exact figures),
    as one standalone SVG: for a page that runs no script (the docs site)."""
    import html

    lines = series(result.ok_rows, "num_blocks", "hit_rate")
    xs = sorted({x for _, pts in lines for x, _ in pts})
    if not xs:
        return ""
    left, right, top, bottom = 48, 190, 16, 36
    w, h = width - left - right, height - top - bottom
    px = {x: left + (w * i / max(1, len(xs) - 1)) for i, x in enumerate(xs)}
    py = lambda v: top + h * (1 - v)  # noqa: E731
    colors = ["#1565c0", "#ef6c00", "#2e7d32", "#6a1b9a", "#c62828"]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
           f'aria-label="prefix-hit rate against pool size" font-family="sans-serif" font-size="11">']
    for v in (0, 0.25, 0.5, 0.75, 1.0):
        out.append(f'<line x1="{left}" x2="{left + w}" y1="{py(v):.1f}" y2="{py(v):.1f}" stroke="#e0e0e0"/>'
                   f'<text x="{left - 6}" y="{py(v) + 4:.1f}" text-anchor="end">{v:.0%}</text>')
    for x in xs:
        out.append(f'<text x="{px[x]:.1f}" y="{top + h + 16}" text-anchor="middle">{x}</text>')
    out.append(f'<text x="{left + w / 2:.1f}" y="{height - 4}" text-anchor="middle">KV blocks in the pool</text>')
    for k, (name, pts) in enumerate(lines):
        c = colors[k % len(colors)]
        label = html.escape(name)
        path = " ".join(f"{px[x]:.1f},{py(v):.1f}" for x, v in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{c}" stroke-width="2"/>')
        out += [f'<circle cx="{px[x]:.1f}" cy="{py(v):.1f}" r="3" fill="{c}"><title>{label}, {x} blocks: '
                f'{v:.1%} of prompt tokens hit</title></circle>' for x, v in pts]
        out.append(f'<text x="{left + w + 12}" y="{top + 14 + 16 * k}" fill="{c}">{label}</text>')
    out.append("</svg>")
    return "".join(out)
