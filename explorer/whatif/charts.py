"""A sweep's charts as plotly figures: prefix-hit rate against pool size (one line per block
size), TTFT p90 against the token budget (one line per pool), preemptions per setting."""
from __future__ import annotations

from collections import defaultdict
from typing import Any


def _lines(rows: list[dict], x: str, y: str, by: str) -> dict[Any, list[tuple[Any, Any]]]:
    out: dict[Any, list[tuple[Any, Any]]] = defaultdict(list)
    for r in rows:
        s = r["settings"]
        if r.get(y) is not None:
            out[s[by]].append((s[x], r[y]))
    return {k: sorted(v) for k, v in sorted(out.items())}


def sweep_charts(result: Any) -> dict[str, Any]:
    import plotly.graph_objects as go

    rows = result.ok_rows
    figs: dict[str, Any] = {}
    hit = go.Figure()
    for bs, pts in _lines(rows, "num_blocks", "hit_rate", "block_size").items():
        hit.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers",
                                 name=f"block size {bs}"))
    hit.update_layout(title="Prefix-hit rate against pool size (exact)", xaxis_title="KV blocks",
                      yaxis_title="hit tokens / prompt tokens", yaxis_tickformat=".0%", template="plotly_white")
    figs["hit_rate"] = hit
    ttft = go.Figure()
    for nb, pts in _lines(rows, "max_num_batched_tokens", "ttft_p90", "num_blocks").items():
        ttft.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers",
                                  name=f"{nb} blocks"))
    err = result.step_model.error_text() if result.step_model is not None else ""
    ttft.update_layout(title=f"TTFT p90 against the token budget (predicted; {err})",
                       xaxis_title="max_num_batched_tokens", yaxis_title="seconds", template="plotly_white",
                       title_font_size=12)
    figs["ttft_p90"] = ttft
    pre = go.Figure(go.Bar(x=[r["label"] for r in rows], y=[r["preemptions"] for r in rows],
                           text=[r["recomputed_tokens"] for r in rows], hovertemplate="%{x}<br>%{y} preemptions, "
                           "%{text} tokens recomputed<extra></extra>"))
    pre.update_layout(title="Preemptions per setting (exact)", yaxis_title="preemptions", template="plotly_white")
    figs["preemptions"] = pre
    return figs


def sweep_svg(result: Any, width: int = 640, height: int = 260) -> str:
    """Prefix-hit rate against pool size, one line per block size (exact figures), as one
    standalone SVG: for a page that runs no script (the docs site)."""
    import html

    lines = _lines(result.ok_rows, "num_blocks", "hit_rate", "block_size")
    xs = sorted({x for pts in lines.values() for x, _ in pts})
    if not xs:
        return ""
    left, right, top, bottom = 48, 150, 16, 36
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
    for k, (bs, pts) in enumerate(lines.items()):
        c = colors[k % len(colors)]
        path = " ".join(f"{px[x]:.1f},{py(v):.1f}" for x, v in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{c}" stroke-width="2"/>')
        out += [f'<circle cx="{px[x]:.1f}" cy="{py(v):.1f}" r="3" fill="{c}"><title>block size {bs}, {x} blocks: '
                f'{v:.1%} of prompt tokens hit</title></circle>' for x, v in pts]
        out.append(f'<text x="{left + w + 12}" y="{top + 14 + 16 * k}" fill="{c}">'
                   f'block size {html.escape(str(bs))}</text>')
    out.append("</svg>")
    return "".join(out)
