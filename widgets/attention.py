"""Attention panel: a heatmap of one request / layer / head, read from the paged KV cache."""
from __future__ import annotations

from array import array
from collections.abc import Mapping
from typing import Any, ClassVar, TypedDict

import traitlets as t

from ._base import Panel, bundle_css, bundle_esm


class AttentionChoices(TypedDict):
    """What can be chosen: the requests with KV, the layer and head, and each head's thumbnail."""
    requests: list[str]   # request ids that have KV to probe
    request_id: str
    layer: int
    head: int
    num_layers: int
    layer_names: list[str]   # the layer picker's words ("1 (window 4096)")
    kv_head_of_head: list[int]
    thumbs: bytes   # uint8 per head: thumb_shape, head after head
    thumb_heads: list[int]
    thumb_shape: list[int]


class AttentionWeights(TypedDict):
    """The chosen head's weights (or why there are none)."""
    probs: bytes
    context_len: int
    row_positions: list[int]
    block_table: list[int]
    message: str   # why no heatmap, or a probe error
    probe_step: int
    num_prompt_tokens: int   # keys at positions >= this were generated
    tokens: list[str]   # text of each context token


class AttentionPanel(Panel):
    """Attention weights from ``Session.probe(...)`` (``AttentionProbe.to_dict()``).

    The chosen head's weights travel as float32 bytes `probs` (rows x
    `context_len`, row-major); `row_positions` are the query positions of those
    rows (long prompts are thinned to `max_rows` evenly spaced rows, the last one
    always kept). Columns are KV positions, grouped by block (`block_table`).
    `kv_head_of_head` shows GQA: query heads that share a KV head. A probe of every
    head also fills `thumbs`: one small uint8 picture per head (`thumb_shape` rows x
    columns, head after head, in `thumb_heads` order) to pick a head from.
    `probe_step` is the step the weights belong to (the Dashboard shows a probe only
    at its own step); `num_prompt_tokens` splits the keys into prompt and generated.
    Browser actions: ``select {request_id?, layer?, head?}`` and ``refresh``; the
    Dashboard answers both by probing the Session again (or from its per-step cache).
    """

    NAME = "attention"
    PARTS: ClassVar[dict[str, type]] = {"choices": AttentionChoices, "weights": AttentionWeights}
    _esm = bundle_esm("attention.js")
    _css = bundle_css("attention.css")

    num_heads = t.Int(0).tag(sync=True)
    block_size = t.Int(16).tag(sync=True)
    probe_step = t.Int(-1).tag(sync=True)         # engine step the weights were read at
    thumb_shape = t.List([0, 0]).tag(sync=True)
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

    def show_probe(self, probe: Mapping[str, Any], *, step: int = -1) -> None:
        """Display one ``AttentionProbe.to_dict()``; picks `self.head` from its heads."""
        self.show_prepared(prepare_probe(probe, self.max_rows), step=step)

    def show_prepared(self, prep: PreparedProbeDict, *, step: int = -1) -> None:
        """Display a probe from `prepare_probe` (the Dashboard keeps them per step)."""
        heads = prep["heads"]
        head = self.head if self.head in heads else (heads[0] if heads else 0)
        # A one-head probe carries that head's KV head only; the full map comes from
        # model_info (set by the Dashboard) unless this probe covers every head.
        kv = prep["kv_head_of_head"]
        full_map = len(kv) == len(heads) and heads == list(range(len(heads))) and len(heads) > 1
        with self.hold_sync():
            self.head = head
            self.request_id = prep["request_id"] or self.request_id
            self.layer = prep["layer"] if prep["layer"] is not None else self.layer
            if full_map:
                self.kv_head_of_head = kv
                self.num_heads = len(kv)
            self.context_len = prep["context_len"]
            self.block_size = prep["block_size"] or self.block_size
            self.block_table = prep["block_table"]
            self.tokens = prep["tokens"]
            self.row_positions = prep["row_positions"]
            self.probs = prep["head_probs"][heads.index(head)] if heads else b""
            self.thumbs, self.thumb_shape, self.thumb_heads = prep["thumbs"], prep["thumb_shape"], prep["thumb_heads"]
            self.probe_step = step
            self.message = ""

    def clear(self, message: str) -> None:
        """No heatmap; say why (no request, request finished, probe failed, not captured)."""
        with self.hold_sync():
            self.probs = b""
            self.row_positions = []
            self.context_len = 0
            self.tokens = []
            self.block_table = []
            self.thumbs, self.thumb_shape, self.thumb_heads = b"", [0, 0], []
            self.probe_step = -1
            self.message = message


THUMB_ROWS, THUMB_COLS = 24, 48  # at most: a head's thumbnail, averaged down to this


class PreparedProbeDict(TypedDict):
    """A probe ready to show and to keep: what `prepare_probe` returns."""
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


def prepare_probe(probe: Mapping[str, Any], max_rows: int = 256) -> PreparedProbeDict:
    """A probe ready to show and to keep: each head's rows (thinned to `max_rows`) as
    float32 bytes, and, when it covers several heads, one small uint8 thumbnail per head."""
    heads = [int(h) for h in probe.get("heads") or []]
    per_head = probe.get("probs") or []
    first = per_head[0] if per_head else []
    positions = list(probe.get("query_positions") or range(len(first)))
    keep = _thin(len(first), max_rows)
    n = int(probe.get("context_len") or (len(first[0]) if first else 0))
    head_probs = []
    for rows in per_head:
        flat = array("f")
        for i in keep:
            row = list(rows[i])[:n]
            flat.extend(row + [0.0] * (n - len(row)))
        head_probs.append(flat.tobytes())
    thumbs, shape = b"", [0, 0]
    if len(heads) > 1 and keep and n:
        shape = [min(THUMB_ROWS, len(keep)), min(THUMB_COLS, n)]
        thumbs = b"".join(_thumbnail(array("f", hp), len(keep), n, *shape) for hp in head_probs)
    return {"request_id": str(probe.get("request_id", "")), "layer": probe.get("layer"), "heads": heads,
            "kv_head_of_head": list(probe.get("kv_head_of_head") or []), "context_len": n,
            "block_size": int(probe.get("block_size") or 0), "block_table": list(probe.get("block_table") or []),
            "tokens": [str(x) for x in (probe.get("tokens") or [])],
            "row_positions": [positions[i] if i < len(positions) else i for i in keep],
            "head_probs": head_probs, "thumbs": thumbs, "thumb_shape": shape,
            "thumb_heads": heads if thumbs else [], "source": probe.get("source")}


def _thumbnail(values: array, rows: int, cols: int, th: int, tw: int) -> bytes:
    """rows x cols weights averaged into th x tw cells, scaled to the head's own max (sqrt, as the heatmap)."""
    sums = [0.0] * (th * tw)
    counts = [0] * (th * tw)
    for r in range(rows):
        base, tr = r * cols, r * th // rows
        for c in range(cols):
            k = tr * tw + c * tw // cols
            sums[k] += values[base + c]
            counts[k] += 1
    means = [s / k if k else 0.0 for s, k in zip(sums, counts)]
    top = max(means) or 1.0
    return bytes(min(255, round(255 * (m / top) ** 0.5)) for m in means)


def _thin(n: int, limit: int) -> list[int]:
    """At most `limit` evenly spaced indices of range(n), the last one always kept."""
    if n <= limit:
        return list(range(n))
    step = (n - 1) / (limit - 1)
    return sorted({round(i * step) for i in range(limit)})
