"""Attention panel: a heatmap of one request / layer / head, read from the paged KV cache."""
from __future__ import annotations

from array import array

import traitlets as t

from ._base import Panel, bundle_css, bundle_esm


class AttentionPanel(Panel):
    """Attention weights from ``Session.probe(...)`` (``AttentionProbe.to_dict()``).

    The chosen head's weights travel as float32 bytes `probs` (rows x
    `context_len`, row-major); `row_positions` are the query positions of those
    rows (long prompts are thinned to `max_rows` evenly spaced rows, the last one
    always kept). Columns are KV positions, grouped by block (`block_table`).
    `kv_head_of_head` shows GQA: query heads that share a KV head.
    Browser actions: ``select {request_id?, layer?, head?}`` and ``refresh``; the
    Dashboard answers both by probing the Session again.
    """

    _esm = bundle_esm("attention.js")
    _css = bundle_css("attention.css")

    requests = t.List([]).tag(sync=True)          # request ids that have KV to probe
    request_id = t.Unicode("").tag(sync=True)
    layer = t.Int(0).tag(sync=True)
    head = t.Int(0).tag(sync=True)
    num_layers = t.Int(0).tag(sync=True)
    num_heads = t.Int(0).tag(sync=True)
    kv_head_of_head = t.List([]).tag(sync=True)
    context_len = t.Int(0).tag(sync=True)
    block_size = t.Int(16).tag(sync=True)
    block_table = t.List([]).tag(sync=True)
    tokens = t.List([]).tag(sync=True)            # text of each context token
    row_positions = t.List([]).tag(sync=True)
    probs = t.Bytes(b"").tag(sync=True)
    probe_step = t.Int(-1).tag(sync=True)         # engine step the weights were read at
    message = t.Unicode("").tag(sync=True)        # why no heatmap, or a probe error
    max_rows = t.Int(256).tag(sync=True)

    def handle_action(self, content: dict) -> bool:
        if content.get("action") == "select":
            with self.hold_sync():
                if content.get("request_id") is not None:
                    self.request_id = str(content["request_id"])
                if content.get("layer") is not None:
                    self.layer = int(content["layer"])
                if content.get("head") is not None:
                    self.head = int(content["head"])
        return False  # the Dashboard probes the Session

    def show_probe(self, probe: dict, *, step: int = -1) -> None:
        """Display one ``AttentionProbe.to_dict()``; picks `self.head` from its heads."""
        heads = list(probe.get("heads") or [])
        head = self.head if self.head in heads else (heads[0] if heads else 0)
        per_head = probe.get("probs") or []
        rows = per_head[heads.index(head)] if heads else []
        positions = list(probe.get("query_positions") or range(len(rows)))
        keep = _thin(len(rows), self.max_rows)
        n = int(probe.get("context_len") or (len(rows[0]) if rows else 0))
        flat = array("f")
        for i in keep:
            row = list(rows[i])[:n]
            flat.extend(row + [0.0] * (n - len(row)))
        # A one-head probe carries that head's KV head only; the full map comes from
        # model_info (set by the Dashboard) unless this probe covers every head.
        kv = list(probe.get("kv_head_of_head") or [])
        full_map = len(kv) == len(heads) and heads == list(range(len(heads))) and len(heads) > 1
        with self.hold_sync():
            self.head = head
            self.request_id = str(probe.get("request_id", self.request_id))
            self.layer = int(probe.get("layer", self.layer))
            if full_map:
                self.kv_head_of_head = kv
                self.num_heads = len(kv)
            self.context_len = n
            self.block_size = int(probe.get("block_size") or self.block_size)
            self.block_table = list(probe.get("block_table") or [])
            self.tokens = [str(x) for x in (probe.get("tokens") or [])]
            self.row_positions = [positions[i] if i < len(positions) else i for i in keep]
            self.probs = flat.tobytes()
            self.probe_step = step
            self.message = ""

    def clear(self, message: str) -> None:
        """No heatmap; say why (no request, request finished, probe failed)."""
        with self.hold_sync():
            self.probs = b""
            self.row_positions = []
            self.context_len = 0
            self.tokens = []
            self.block_table = []
            self.message = message


def _thin(n: int, limit: int) -> list[int]:
    """At most `limit` evenly spaced indices of range(n), the last one always kept."""
    if n <= limit:
        return list(range(n))
    step = (n - 1) / (limit - 1)
    return sorted({round(i * step) for i in range(limit)})
