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
    ttft.update_layout(title=f"TTFT p90 against the token budget (predicted; {err})", xaxis_title="max_num_batched_tokens",
                       yaxis_title="seconds", template="plotly_white", title_font_size=12)
    figs["ttft_p90"] = ttft
    pre = go.Figure(go.Bar(x=[r["label"] for r in rows], y=[r["preemptions"] for r in rows],
                           text=[r["recomputed_tokens"] for r in rows], hovertemplate="%{x}<br>%{y} preemptions, "
                           "%{text} tokens recomputed<extra></extra>"))
    pre.update_layout(title="Preemptions per setting (exact)", yaxis_title="preemptions", template="plotly_white")
    figs["preemptions"] = pre
    return figs
