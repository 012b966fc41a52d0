"""Pure functions from Session history entries (record + snapshot dicts) to panel states.

Everything here reads the documented dict shapes (docs/architecture.md) and returns
plain values ready for a panel's traitlets: no widget objects, no torch, no engine (the
block-pool codes come from the panel's module, which defines its byte columns).
"""
from __future__ import annotations

from array import array
from typing import Any, Callable, Iterable, Sequence

from engine.tokenizer import fast_decoder
# The block-pool panel's status codes and event bits: spelled once, by the panel.
from widgets.block_pool import EVENT_BITS, FREE, FREE_CACHED, IN_USE, IN_USE_HASHED, NULL

from .captions import history_captions

TokenText = Callable[[Sequence[int]], list[str]]

EMPTY_RECORD: dict = {"step": 0, "scheduled": [], "batch": {}, "sampled": {}, "preempted": [],
                      "finished": [], "new_requests": [], "blocks": {}, "timings_ms": {}}

_PARAM_KEYS = ("temperature", "top_k", "top_p", "max_tokens", "ignore_eos", "seed")  # shown by the sampler


def token_texts(tokenizer: Any) -> TokenText:
    """A token-id -> text function that decodes each id once (None: ids shown as text), by
    the engine's own decoder, so panels and records spell every token the same way."""
    cache: dict[int, str] = {}
    decode = fast_decoder(tokenizer) if tokenizer is not None else None

    def texts(ids: Sequence[int]) -> list[str]:
        out = []
        for i in ids:
            i = int(i)
            if i not in cache:
                try:
                    cache[i] = decode([i]) if decode is not None else str(i)
                except Exception:  # an id outside the vocabulary still gets a label
                    cache[i] = f"<{i}>"
            out.append(cache[i])
        return out
    return texts


def all_requests(snapshot: dict) -> list[dict]:
    """Every request of a snapshot: waiting, running, then finished."""
    q = snapshot.get("queues") or {}
    return [*q.get("waiting", []), *q.get("running", []), *q.get("finished", [])]


def _clip(text: str | None, limit: int) -> str:
    # Long prompts would bloat every state update; the middle is the least telling part.
    text = text or ""
    return text if len(text) <= limit else text[: limit - limit // 4] + " \u2026 " + text[-(limit // 4):]


def queues_state(record: dict | None, snapshot: dict, *, max_finished: int = 50, max_text: int = 400) -> dict:
    """QueuesPanel traits: one row per request, with what this step scheduled for it."""
    record = record or EMPTY_RECORD
    scheduled = {s["request_id"]: s for s in record.get("scheduled", [])}
    sampled = record.get("sampled", {})

    def row(req: dict) -> dict:
        rid = req["request_id"]
        s = scheduled.get(rid)
        return {
            "request_id": rid, "status": req.get("status", ""),
            "prompt_text": _clip(req.get("prompt_text"), max_text),
            "output_text": _clip(req.get("output_text"), max_text),
            "num_prompt_tokens": len(req.get("prompt_token_ids", [])),
            "num_output_tokens": len(req.get("output_token_ids", [])),
            "max_tokens": req.get("max_tokens"), "num_computed_tokens": req.get("num_computed_tokens", 0),
            "num_cached_tokens": req.get("num_cached_tokens", 0), "num_preemptions": req.get("num_preemptions", 0),
            "finish_reason": req.get("finish_reason"), "num_blocks": len(req.get("block_table", [])),
            "scheduled": None if s is None else {k: s.get(k) for k in (
                "num_tokens", "num_computed_before", "is_prefill", "num_cached_tokens", "chunk_index")},
            "sampled_text": (sampled.get(rid) or {}).get("text"),
        }
    q = snapshot.get("queues") or {}
    finished = q.get("finished", [])
    return {"queues": {"waiting": [row(r) for r in q.get("waiting", [])],
                       "running": [row(r) for r in q.get("running", [])],
                       "finished": [row(r) for r in finished[-max_finished:]][::-1]},  # newest first
            "finished_total": len(finished)}


def block_pool_state(record: dict | None, snapshot: dict) -> dict:
    """BlockPoolPanel traits as compact byte columns (+ "blocks", kept Python-side)."""
    record = record or EMPTY_RECORD
    pool = snapshot.get("block_pool") or {}
    blocks = pool.get("blocks", [])
    n = len(blocks)
    status, events = array("B", bytes(n)), array("B", bytes(n))
    ref, owner = array("H", bytes(2 * n)), array("h", [-1] * n)
    owners: list[str] = []
    owner_index: dict[str, int] = {}
    shared: list[list] = []  # [block_id, [owner indices]] of blocks with several owners
    for i, b in enumerate(blocks):
        if b.get("is_null", i == 0):
            status[i] = NULL
        elif b.get("is_free"):
            status[i] = FREE_CACHED if b.get("hash") else FREE
        else:
            status[i] = IN_USE_HASHED if b.get("hash") else IN_USE
        ref[i] = min(int(b.get("ref_count", 0)), 0xFFFF)
        idx = []
        for rid in b.get("owners") or ():
            idx.append(owner_index.setdefault(rid, len(owner_index)))
            if idx[-1] == len(owners):
                owners.append(rid)
        if idx:
            owner[i] = idx[0]
        if len(idx) > 1:
            shared.append([i, idx])
    record_blocks = record.get("blocks") or {}
    counts = {k: 0 for k in EVENT_BITS}
    for key, bit in EVENT_BITS.items():
        for bid in record_blocks.get(key, []):
            if 0 <= bid < n:
                events[bid] |= bit
                counts[key] += 1
    counts.update(free=sum(s == FREE for s in status), free_cached=sum(s == FREE_CACHED for s in status),
                  in_use=sum(s >= IN_USE for s in status), num_free_blocks=pool.get("num_free_blocks", 0))
    block_size = int(pool.get("block_size", 16))
    # A request admitted in this step took its first num_cached_tokens // block_size blocks
    # as prefix hits; those registered earlier in this same step are same-step hits.
    admitted = set(record.get("new_requests", []))
    hit_blocks = {s["request_id"]: s.get("num_cached_tokens", 0) // block_size
                  for s in record.get("scheduled", []) if s["request_id"] in admitted}
    same_step = set(record_blocks.get("same_step_hits", []))
    tables = []
    for r in (snapshot.get("queues") or {}).get("running", []):
        table = list(r.get("block_table", []))
        if not table:
            continue
        hits = list(range(min(hit_blocks.get(r["request_id"], 0), len(table))))
        # Entries whose KV came from the prefix cache when the request was (last) admitted:
        # marked for as long as it runs, not only in the step of the hit.
        cached = list(range(min(int(r.get("num_cached_tokens") or 0) // block_size, len(table))))
        tables.append({"request_id": r["request_id"], "block_table": table,
                       "num_computed_tokens": r.get("num_computed_tokens", 0),
                       "hits": hits, "same_step_hits": [i for i in hits if table[i] in same_step],
                       "cached": cached})
    return {"num_blocks": n, "block_size": block_size, "status": status.tobytes(),
            "ref_count": ref.tobytes(), "owner": owner.tobytes(), "events": events.tobytes(),
            "owners": owners, "shared": shared, "block_tables": tables, "counts": counts, "blocks": blocks}


def slot_mapping_state(record: dict | None, token_text: TokenText, *, block_size: int = 16,
                       max_rows: int = 1024, snapshot: dict | None = None) -> dict:
    """SlotMappingPanel traits: the packed batch, cut to `max_rows` rows for the browser.

    A request admitted in this step with prefix-cache hits gets `cached_blocks`: one entry
    per block it took from the cache ({block, start, end, text}: positions [start, end),
    their text from the `snapshot`'s token ids), drawn as "from cache" cells."""
    record = record or EMPTY_RECORD
    batch = record.get("batch") or {}
    ids = list(batch.get("input_ids", []))
    qsl = list(batch.get("query_start_loc", []))
    seq_lens = list(batch.get("seq_lens", []))
    tables = list(batch.get("block_tables", []))
    sampled = record.get("sampled", {})
    known = {r["request_id"]: r for r in all_requests(snapshot or {})}
    segments = []
    for k, s in enumerate(record.get("scheduled", [])):
        start = qsl[k] if k < len(qsl) else 0
        end = qsl[k + 1] if k + 1 < len(qsl) else start + s["num_tokens"]
        rid = s["request_id"]
        table = list(tables[k]) if k < len(tables) else []
        segments.append({"request_id": rid, "start": start, "end": end, "is_prefill": s.get("is_prefill", False),
                         "chunk_index": s.get("chunk_index"), "num_computed_before": s.get("num_computed_before", 0),
                         "num_cached_tokens": s.get("num_cached_tokens", 0),
                         "seq_len": seq_lens[k] if k < len(seq_lens) else None,
                         "block_table": table,
                         "sampled_text": (sampled.get(rid) or {}).get("text"),
                         "cached_blocks": _cached_blocks(s.get("num_cached_tokens", 0), table, block_size,
                                                         known.get(rid), token_text)})
    shown = ids[:max_rows]
    return {"input_ids": shown, "tokens": token_text(shown), "positions": list(batch.get("positions", []))[:max_rows],
            "slot_mapping": list(batch.get("slot_mapping", []))[:max_rows], "segments": segments,
            "query_start_loc": qsl, "logits_indices": list(batch.get("logits_indices", [])),
            "block_size": block_size, "num_rows": len(ids), "truncated": max(0, len(ids) - max_rows)}


def _cached_blocks(num_cached: int, table: list, block_size: int, req: dict | None,
                   token_text: TokenText) -> list[dict]:
    """The blocks of a prefix hit, in order: {block, start, end, text} (text: "" unknown)."""
    tokens = [*(req or {}).get("prompt_token_ids", []), *(req or {}).get("output_token_ids", [])]
    out = []
    for i in range(min(int(num_cached or 0) // block_size, len(table))):
        lo, hi = i * block_size, (i + 1) * block_size
        out.append({"block": table[i], "start": lo, "end": hi,
                    "text": "".join(token_text(tokens[lo:hi])) if len(tokens) >= hi else ""})
    return out


def _entry_parts(entry: Any) -> tuple[dict, dict]:
    """(record, snapshot) of a history entry (an object with attributes, or a dict)."""
    if isinstance(entry, dict):
        return entry.get("record") or EMPTY_RECORD, entry.get("snapshot") or {}
    return getattr(entry, "record", None) or EMPTY_RECORD, getattr(entry, "snapshot", None) or {}


def sampler_state(entries: Sequence[Any], snapshot: dict, request_id: str, token_text: TokenText) -> dict:
    """SamplerPanel traits: the latest sample of `request_id` in `entries` (newest last)."""
    record = _entry_parts(entries[-1])[0] if entries else EMPTY_RECORD
    requests = list(record.get("sampled", {}))
    rid = request_id if request_id else (requests[0] if requests else "")
    params = {}
    for req in all_requests(snapshot):
        if req["request_id"] == rid:
            sp = req.get("sampling_params") or {"max_tokens": req.get("max_tokens")}
            params = {k: sp.get(k) for k in _PARAM_KEYS if k in sp}
    for entry in reversed(entries):
        rec = _entry_parts(entry)[0]
        s = rec.get("sampled", {}).get(rid)
        if s is None:
            continue
        top = [[int(t), p] for t, p in s.get("top", [])]
        texts = token_text([t for t, _ in top])
        return {"requests": requests, "request_id": rid,
                "sample": {"request_id": rid, "step": rec.get("step", 0), "token_id": s.get("token_id"),
                           "text": s.get("text"), "top": [[t, x, float(p)] for (t, p), x in zip(top, texts)],
                           "params": params}}
    note = f"#{rid} has not been sampled yet" if rid else "no request sampled yet"
    return {"requests": requests, "request_id": rid, "sample": {"note": note, "params": params}}


_TIMING_KEYS = ("schedule", "prepare", "forward", "sample", "update")


def timeline_state(entries: Iterable[Any], captions: Sequence[str] | None = None) -> dict:
    """TimelinePanel traits: per-step columns and run-length Gantt segments per request.
    `captions` (one per entry, explorer.captions.history_captions) are computed when not given."""
    entries = list(entries)
    if captions is None:
        captions = history_captions(entries)
    cols: dict[str, list] = {k: [] for k in ("step", "prefill", "decode", "budget", "preempted", *_TIMING_KEYS,
                                             "backend", "graph_bucket", "forward_path", "caption")}
    requests: list[str] = []
    index: dict[str, int] = {}
    segments: list[list] = []
    open_seg: dict[str, list] = {}  # request -> its latest segment, extended while the kind repeats

    def mark(rid: str, step: int, kind: str, label: str) -> None:
        if rid not in index:
            index[rid] = len(requests)
            requests.append(rid)
        seg = open_seg.get(rid)
        # Prefill chunks stay separate segments so each chunk is visible.
        if seg and seg[3] == kind and seg[2] == step - 1 and kind != "prefill":
            seg[2] = step
            seg[4] = f"{kind} ({step - seg[1] + 1} steps)"
            return
        seg = [index[rid], step, step, kind, label]
        segments.append(seg)
        open_seg[rid] = seg

    for entry, caption in zip(entries, captions):
        record, snapshot = _entry_parts(entry)
        step = int(record.get("step", 0))
        if step <= 0:
            continue
        sched = record.get("scheduled", [])
        t = record.get("timings_ms") or {}
        cols["step"].append(step)
        cols["caption"].append(caption)
        cols["prefill"].append(sum(s["num_tokens"] for s in sched if s.get("is_prefill")))
        cols["decode"].append(sum(s["num_tokens"] for s in sched if not s.get("is_prefill")))
        config = snapshot.get("config") or {}
        cols["budget"].append(record.get("token_budget") or config.get("max_num_batched_tokens", 0))
        cols["preempted"].append(len(record.get("preempted", [])))
        for k in _TIMING_KEYS:
            cols[k].append(float(t.get(k) or 0.0))
        # Which attention backend ran, how the forward ran ('eager', 'cuda_graph', 'native_decode')
        # and the CUDA graph bucket a decode step replayed (None: none).
        cols["backend"].append(t.get("backend"))
        cols["graph_bucket"].append(t.get("cuda_graph_bucket"))
        cols["forward_path"].append(t.get("forward_path", "eager"))
        done = set()
        for s in sched:
            rid = s["request_id"]
            if s.get("is_prefill"):
                mark(rid, step, "prefill", f"prefill chunk {int(s.get('chunk_index') or 0) + 1}: {s['num_tokens']} tokens")
            else:
                mark(rid, step, "decode", "decode")
            done.add(rid)
        for rid in record.get("preempted", []):
            if rid not in done:
                mark(rid, step, "preempted", "preempted")
                done.add(rid)
        q = snapshot.get("queues") or {}
        for req in q.get("waiting", []):
            rid = req["request_id"]
            if rid not in done:
                kind = "preempted" if req.get("status") == "preempted" or req.get("num_preemptions") else "queued"
                mark(rid, step, kind, "waiting after preemption" if kind == "preempted" else "queued")
        for req in q.get("running", []):
            if req["request_id"] not in done:
                mark(req["request_id"], step, "stalled", "running, not scheduled")
    return {"steps": cols, "gantt": {"requests": requests, "segments": segments}}


def latency_rows(snapshot: dict) -> list[dict]:
    """Per-request TTFT and ITLs (seconds, engine clock) for LatencyPanel."""
    rows = []
    for req in all_requests(snapshot):
        m = ((req.get("metrics") or {}).get("engine")) or {}
        rows.append({"request_id": req["request_id"], "time_to_first_token": m.get("time_to_first_token"),
                     "inter_token_latency": list(m.get("inter_token_latency") or [])})
    rows.sort(key=lambda r: (len(r["request_id"]), r["request_id"]))  # "2" before "10"
    return rows


def probe_targets(snapshot: dict) -> list[str]:
    """Requests whose KV is in the cache now (an attention probe can read them)."""
    return [r["request_id"] for r in (snapshot.get("queues") or {}).get("running", [])
            if r.get("num_computed_tokens", 0) > 0]


def attention_note(snapshot: dict) -> str:
    """Why the attention panel has no request to probe in this snapshot."""
    q = snapshot.get("queues") or {}
    waiting, running, finished = (len(q.get(k, [])) for k in ("waiting", "running", "finished"))
    if waiting or running:
        return f"no running request has KV in the cache yet ({waiting} waiting): step to compute it"
    if finished:
        who = "the request has" if finished == 1 else f"all {finished} requests have"
        return (f"{who} finished: the KV blocks were freed (full blocks stay in the prefix cache until "
                "evicted), so there is no attention to read; add a request and step")
    return "no request yet: add one and step"


def summary_line(record: dict | None, snapshot: dict) -> str:
    """The Controls status line: step, queue sizes, free blocks, last step's time."""
    q = snapshot.get("queues") or {}
    pool = snapshot.get("block_pool") or {}
    parts = [f"step {snapshot.get('step', 0)}",
             " \u00b7 ".join(f"{len(q.get(k, []))} {k}" for k in ("waiting", "running", "finished")),
             f"{pool.get('num_free_blocks', 0)}/{max(0, pool.get('num_blocks', 1) - 1)} blocks free"]
    if record and record.get("timings_ms", {}).get("total") is not None:
        parts.append(f"last step {record['timings_ms']['total']:.1f} ms")
    return " \u00b7 ".join(parts)
