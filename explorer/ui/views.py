"""Pure functions from Session history entries (record + snapshot dicts) to panel states.

Everything here reads the dict shapes of engine/report/schema.py (through its key constants) and returns
plain values ready for a panel's traitlets: no widget objects, no torch, no engine (the
block-pool codes come from the panel's module, which defines its byte columns).
"""
from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

# The block pool's `status` codes and `events` bits are the record schema's (the browser reads
# them from its generated copy, widgets/_schema.js's KVS_SCHEMA).
from engine.report.schema import (
    BATCH,
    BLOCK,
    BUDGET,
    CLOCK,
    EV,
    EVENT_BITS,
    FREE,
    FREE_CACHED,
    IN_USE,
    IN_USE_HASHED,
    INFO,
    METRICS,
    NULL,
    POOL,
    QUEUE,
    REC,
    REQ,
    RMETRICS,
    SAMPLE,
    SCHED,
    SNAP,
    TIME,
)
from engine.token_replay import BACKEND as REPLAY_BACKEND
from engine.tokenizer import fast_decoder

from ..core.labels import kv_cache_group_label
from .captions import BATCH_SOURCE_WORDS, history_captions

if TYPE_CHECKING:  # each panel's state type, what the functions below return (widgets/<panel>.py); only
    # their names are read here, so this module runs without anywidget (a docs page's Pyodide)
    from widgets.block_pool import BlockPoolState
    from widgets.latency import LatencyState
    from widgets.queues import QueuesState
    from widgets.sampler import SamplerState
    from widgets.slot_mapping import SlotMappingState
    from widgets.timeline import TimelineState

TokenText = Callable[[Sequence[int]], list[str]]

EMPTY_RECORD: dict = {REC.STEP: 0, REC.SCHEDULED: [], REC.BATCH: {}, REC.SAMPLED: {}, REC.PREEMPTED: [],
                      REC.FINISHED: [], REC.NEW_REQUESTS: [], REC.BLOCKS: {}, REC.TIMINGS_MS: {}}

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
                except Exception:  # noqa: BLE001 - an id outside the vocabulary still gets a label
                    cache[i] = f"<{i}>"
            out.append(cache[i])
        return out
    return texts


def all_requests(snapshot: dict) -> list[dict]:
    """Every request of a snapshot: waiting, running, then finished."""
    q = snapshot.get(SNAP.QUEUES) or {}
    return [*q.get(QUEUE.WAITING, []), *q.get(QUEUE.RUNNING, []), *q.get(QUEUE.FINISHED, [])]


def _clip(text: str | None, limit: int) -> str:
    # Long prompts would bloat every state update; the middle is the least telling part.
    text = text or ""
    return text if len(text) <= limit else text[: limit - limit // 4] + " \u2026 " + text[-(limit // 4):]


def queues_state(record: dict | None, snapshot: dict, *, max_finished: int = 50, max_text: int = 400,
                 why: dict[str, dict] | None = None, names: Callable[[str], str] | None = None) -> QueuesState:
    """QueuesPanel traits: one row per request, with what this step scheduled for it, its name
    (`names`: explorer.core.labels, "#17" for a long vLLM id; the card keeps the id on hover), and
    (given `why`, explorer.ui.why_view.why_rows) why its prompt hit or missed the prefix cache."""
    record = record or EMPTY_RECORD
    scheduled = {s[SCHED.REQUEST_ID]: s for s in record.get(REC.SCHEDULED, [])}
    sampled = record.get(REC.SAMPLED, {})

    def row(req: dict) -> dict:
        rid = req[REQ.REQUEST_ID]
        s = scheduled.get(rid)
        return {
            "request_id": rid, "label": names(rid) if names is not None else f"#{rid}",
            "status": req.get(REQ.STATUS, ""),
            "prompt_text": _clip(req.get(REQ.PROMPT_TEXT), max_text),
            "output_text": _clip(req.get(REQ.OUTPUT_TEXT), max_text),
            "num_prompt_tokens": len(req.get(REQ.PROMPT_TOKEN_IDS, [])),
            "num_output_tokens": len(req.get(REQ.OUTPUT_TOKEN_IDS, [])),
            "max_tokens": req.get(REQ.MAX_TOKENS), "num_computed_tokens": req.get(REQ.NUM_COMPUTED_TOKENS, 0),
            "num_cached_tokens": req.get(REQ.NUM_CACHED_TOKENS, 0), "num_preemptions": req.get(REQ.NUM_PREEMPTIONS, 0),
            "finish_reason": req.get(REQ.FINISH_REASON), "num_blocks": len(req.get(REQ.BLOCK_TABLE, [])),
            "scheduled": None if s is None else {k: s.get(k) for k in (
                SCHED.NUM_TOKENS, SCHED.NUM_COMPUTED_BEFORE, SCHED.IS_PREFILL, SCHED.NUM_CACHED_TOKENS,
                SCHED.CHUNK_INDEX)},
            "sampled_text": (sampled.get(rid) or {}).get(SAMPLE.TEXT),
            "why": (why or {}).get(rid),
        }
    q = snapshot.get(SNAP.QUEUES) or {}
    finished = q.get(QUEUE.FINISHED, [])
    return {"queues": {"waiting": [row(r) for r in q.get(QUEUE.WAITING, [])],
                       "running": [row(r) for r in q.get(QUEUE.RUNNING, [])],
                       "finished": [row(r) for r in finished[-max_finished:]][::-1]},  # newest first
            "finished_total": len(finished)}


# The block pool's byte columns, one element per block, as `array` typecodes: uint8 status,
# uint16 ref_count, int16 owner (an index into owners, -1 none), uint8 events, uint8 group (the
# KV cache group whose table holds it: 0 full attention, 1.. the others, e.g. a sliding window's).
BLOCK_COLUMNS = {"status": "B", "ref_count": "H", "owner": "h", "events": "B", "group": "B"}


def block_pool_state(record: dict | None, snapshot: dict) -> BlockPoolState:
    """BlockPoolPanel traits as compact byte columns (+ "blocks", kept Python-side)."""
    record = record or EMPTY_RECORD
    pool = snapshot.get(SNAP.BLOCK_POOL) or {}
    blocks = pool.get(POOL.BLOCKS, [])
    n = len(blocks)
    status, events = array(BLOCK_COLUMNS["status"], bytes(n)), array(BLOCK_COLUMNS["events"], bytes(n))
    ref, owner = array(BLOCK_COLUMNS["ref_count"], bytes(2 * n)), array(BLOCK_COLUMNS["owner"], [-1] * n)
    owners: list[str] = []
    owner_index: dict[str, int] = {}
    shared: list[list] = []  # [block_id, [owner indices]] of blocks with several owners
    for i, b in enumerate(blocks):
        if b.get(BLOCK.IS_NULL, i == 0):
            status[i] = NULL
        elif b.get(BLOCK.IS_FREE):
            status[i] = FREE_CACHED if b.get(BLOCK.HASH) else FREE
        else:
            status[i] = IN_USE_HASHED if b.get(BLOCK.HASH) else IN_USE
        ref[i] = min(int(b.get(BLOCK.REF_COUNT, 0)), 0xFFFF)
        idx = []
        for rid in b.get(BLOCK.OWNERS) or ():
            idx.append(owner_index.setdefault(rid, len(owner_index)))
            if idx[-1] == len(owners):
                owners.append(rid)
        if idx:
            owner[i] = idx[0]
        if len(idx) > 1:
            shared.append([i, idx])
    record_blocks = record.get(REC.BLOCKS) or {}
    counts = {k: 0 for k in EVENT_BITS}
    for key, bit in EVENT_BITS.items():
        for bid in record_blocks.get(key, []):
            if 0 <= bid < n:
                events[bid] |= bit
                counts[key] += 1
    counts.update(free=sum(s == FREE for s in status), free_cached=sum(s == FREE_CACHED for s in status),
                  in_use=sum(s >= IN_USE for s in status), num_free_blocks=pool.get(POOL.NUM_FREE_BLOCKS, 0))
    block_size = int(pool.get(POOL.BLOCK_SIZE, 16))
    # A request admitted in this step took its first num_cached_tokens // block_size blocks
    # as prefix hits; those registered earlier in this same step are same-step hits.
    admitted = set(record.get(REC.NEW_REQUESTS, []))
    hit_blocks = {s[SCHED.REQUEST_ID]: s.get(SCHED.NUM_CACHED_TOKENS, 0) // block_size
                  for s in record.get(REC.SCHEDULED, []) if s[SCHED.REQUEST_ID] in admitted}
    same_step = set(record_blocks.get(EV.SAME_STEP_HITS, []))
    labels = group_labels(snapshot)
    group = array(BLOCK_COLUMNS["group"], bytes(n))
    tables = []
    for r in (snapshot.get(SNAP.QUEUES) or {}).get(QUEUE.RUNNING, []):
        table = list(r.get(REQ.BLOCK_TABLE, []))
        if not table:
            continue
        hits = list(range(min(hit_blocks.get(r[REQ.REQUEST_ID], 0), len(table))))
        # Entries whose KV came from the prefix cache when the request was (last) admitted:
        # marked for as long as it runs, not only in the step of the hit.
        cached = list(range(min(int(r.get(REQ.NUM_CACHED_TOKENS) or 0) // block_size, len(table))))
        row = {"request_id": r[REQ.REQUEST_ID], "block_table": table,
               "num_computed_tokens": r.get(REQ.NUM_COMPUTED_TOKENS, 0),
               "hits": hits, "same_step_hits": [i for i in hits if table[i] in same_step], "cached": cached}
        if len(labels) > 1:
            row["groups"] = group_rows(r, labels)
            for g, group_table in enumerate(r.get(REQ.GROUP_BLOCK_TABLES) or (), start=1):
                for b in group_table:
                    if 0 < b < n:
                        group[b] = g
        tables.append(row)
    return {"num_blocks": n, "block_size": block_size, "status": status.tobytes(),
            "ref_count": ref.tobytes(), "owner": owner.tobytes(), "events": events.tobytes(),
            # one KV cache group (most models): no column, the panel draws no group marks
            "group": group.tobytes() if len(labels) > 1 else b"", "group_labels": labels,
            "owners": owners, "shared": shared, "block_tables": tables, "counts": counts, "blocks": blocks}


def group_labels(snapshot: Mapping[str, Any]) -> list[str]:
    """A short name for each KV cache group of the snapshot's model ("full attention",
    "sliding window 4096"); one entry where the model has one group (or says nothing of them)."""
    groups = (snapshot.get(SNAP.MODEL_INFO) or {}).get(INFO.KV_CACHE_GROUPS) or []
    return [kv_cache_group_label(g) for g in groups] or ["full attention"]


def group_rows(req: Mapping[str, Any], labels: list[str]) -> list[dict[str, Any]]:
    """A request's block table in each KV cache group, as the block-table rows show them: the
    group's name, its table (0: the null block, where a block left a sliding window), its own
    prefix hit when the request was admitted, and whether that hit is the one that cut the
    request's (the groups' hits are intersected: the shortest wins)."""
    hits = list(req.get(REQ.GROUP_HIT_TOKENS) or [])
    tables = [list(req.get(REQ.BLOCK_TABLE, [])), *(req.get(REQ.GROUP_BLOCK_TABLES) or [])]
    shortest = min(hits) if hits else None
    cut = shortest is not None and max(hits) > shortest
    return [{"label": label, "block_table": table, "hit_tokens": hits[g] if g < len(hits) else None,
             "cut": bool(cut and g < len(hits) and hits[g] == shortest)}
            for g, (label, table) in enumerate(zip(labels, tables))]


def slot_mapping_state(record: dict | None, token_text: TokenText, *, block_size: int = 16,
                       max_rows: int = 1024, snapshot: dict | None = None) -> SlotMappingState:
    """SlotMappingPanel traits: the packed batch, cut to `max_rows` rows for the browser.

    A request admitted in this step with prefix-cache hits gets `cached_blocks`: one entry
    per block it took from the cache ({block, start, end, text}: positions [start, end),
    their text from the `snapshot`'s token ids), drawn as "from cache" cells."""
    record = record or EMPTY_RECORD
    batch = record.get(REC.BATCH) or {}
    ids = list(batch.get(BATCH.INPUT_IDS, []))
    qsl = list(batch.get(BATCH.QUERY_START_LOC, []))
    seq_lens = list(batch.get(BATCH.SEQ_LENS, []))
    tables = list(batch.get(BATCH.BLOCK_TABLES, []))
    sampled = record.get(REC.SAMPLED, {})
    known = {r[REQ.REQUEST_ID]: r for r in all_requests(snapshot or {})}
    # Other KV cache groups (sliding-window layers): their own slots and tables over the same rows.
    group_tables = list(batch.get(BATCH.GROUP_BLOCK_TABLES, []))
    labels = group_labels(snapshot or {})[1:]
    segments = []
    for k, s in enumerate(record.get(REC.SCHEDULED, [])):
        start = qsl[k] if k < len(qsl) else 0
        end = qsl[k + 1] if k + 1 < len(qsl) else start + s[SCHED.NUM_TOKENS]
        rid = s[SCHED.REQUEST_ID]
        table = list(tables[k]) if k < len(tables) else []
        segments.append({"request_id": rid, "start": start, "end": end, "is_prefill": s.get(SCHED.IS_PREFILL, False),
                         "chunk_index": s.get(SCHED.CHUNK_INDEX),
                         "num_computed_before": s.get(SCHED.NUM_COMPUTED_BEFORE, 0),
                         "num_cached_tokens": s.get(SCHED.NUM_CACHED_TOKENS, 0),
                         "seq_len": seq_lens[k] if k < len(seq_lens) else None,
                         "block_table": table,
                         "sampled_text": (sampled.get(rid) or {}).get(SAMPLE.TEXT),
                         "cached_blocks": _cached_blocks(s.get(SCHED.NUM_CACHED_TOKENS, 0), table, block_size,
                                                         known.get(rid), token_text),
                         "groups": [{"label": labels[g] if g < len(labels) else f"group {g + 1}",
                                     "block_table": list(tables_g[k]) if k < len(tables_g) else []}
                                    for g, tables_g in enumerate(group_tables)]})
    shown = ids[:max_rows]
    return {"input_ids": shown, "tokens": token_text(shown),
            "positions": list(batch.get(BATCH.POSITIONS, []))[:max_rows],
            "slot_mapping": list(batch.get(BATCH.SLOT_MAPPING, []))[:max_rows], "segments": segments,
            "group_slot_mappings": [list(m)[:max_rows] for m in batch.get(BATCH.GROUP_SLOT_MAPPINGS, [])],
            "query_start_loc": qsl, "logits_indices": list(batch.get(BATCH.LOGITS_INDICES, [])),
            "block_size": block_size, "num_rows": len(ids), "truncated": max(0, len(ids) - max_rows),
            **batch_source_state(record)}


class BatchSourceState(TypedDict):
    """The slot-mapping panel's two fields that say where its batch came from."""
    batch_source: str
    batch_source_words: list[str]


def batch_source_state(record: dict) -> BatchSourceState:
    """The slot-mapping panel's `batch_source` and its [badge, hover text] (none for the engine's own)."""
    source = str(record.get(REC.BATCH_SOURCE) or "")
    words = BATCH_SOURCE_WORDS.get(source, (f"batch from: {source}", "")) if source else ()
    return {"batch_source": source, "batch_source_words": list(words)}


def shown_slot_mapping(record: dict | None, snapshot: dict, token_text: TokenText) -> SlotMappingState:
    """The SlotMappingPanel's state as the Dashboard shows an entry: at its pool's block size."""
    block_size = int((snapshot.get(SNAP.BLOCK_POOL) or {}).get(POOL.BLOCK_SIZE, 16))
    return slot_mapping_state(record, token_text, block_size=block_size, snapshot=snapshot)


def _cached_blocks(num_cached: int, table: list, block_size: int, req: dict | None,
                   token_text: TokenText) -> list[dict]:
    """The blocks of a prefix hit, in order: {block, start, end, text} (text: "" unknown)."""
    tokens = [*(req or {}).get(REQ.PROMPT_TOKEN_IDS, []), *(req or {}).get(REQ.OUTPUT_TOKEN_IDS, [])]
    out = []
    for i in range(min(int(num_cached or 0) // block_size, len(table))):
        lo, hi = i * block_size, (i + 1) * block_size
        out.append({"block": table[i], "start": lo, "end": hi,
                    "text": "".join(token_text(tokens[lo:hi])) if len(tokens) >= hi else ""})
    return out


def entry_parts(entry: Any) -> tuple[int, dict, dict]:
    """(step, record, snapshot) of a history entry (an object with attributes, or a dict), as
    the panels read it: no record is EMPTY_RECORD, no step the snapshot's."""
    if isinstance(entry, dict):
        step, record, snapshot = entry.get("step"), entry.get("record"), entry.get("snapshot")
    else:
        step, record, snapshot = (getattr(entry, k, None) for k in ("step", "record", "snapshot"))
    snapshot = snapshot or {}
    return int(step or snapshot.get(SNAP.STEP, 0) or 0), record or EMPTY_RECORD, snapshot


# A record can name the sampled token without its candidates: a live vLLM server's feed carries
# none (the logprobs stay with the client that asked), and in-process vLLM records none with
# logprobs_top=0. With KVSCOPE_FEED_TOKENS=0 the feed leaves out the token too.
_NO_CANDIDATES = ("no candidates recorded for this step, only the chosen token: a live server's feed carries "
                  "none (its logprobs go to the client that asked for them)")
_NO_TOKEN_IDS = "the feed leaves token ids out (KVSCOPE_FEED_TOKENS=0): neither the token nor its candidates"
_NO_MODEL = "no candidates: a replay of recorded tokens runs no model, so each step's token is the recorded one"


def sampler_state(entries: Sequence[Any], snapshot: dict, request_id: str, token_text: TokenText) -> SamplerState:
    """SamplerPanel traits: the latest sample of `request_id` in `entries` (newest last)."""
    record = entry_parts(entries[-1])[1] if entries else EMPTY_RECORD
    requests = list(record.get(REC.SAMPLED, {}))
    rid = request_id if request_id else (requests[0] if requests else "")
    params = {}
    for req in all_requests(snapshot):
        if req[REQ.REQUEST_ID] == rid:
            sp = req.get(REQ.SAMPLING_PARAMS) or {"max_tokens": req.get(REQ.MAX_TOKENS)}
            params = {k: sp.get(k) for k in _PARAM_KEYS if k in sp}
    for entry in reversed(entries):
        rec = entry_parts(entry)[1]
        s = rec.get(REC.SAMPLED, {}).get(rid)
        if s is None:
            continue
        top = [[int(t), p] for t, p in s.get(SAMPLE.TOP, [])]
        texts = token_text([t for t, _ in top])
        sample = {"request_id": rid, "step": rec.get(REC.STEP, 0), "token_id": s.get(SAMPLE.TOKEN_ID),
                  "text": s.get(SAMPLE.TEXT), "top": [[t, x, float(p)] for (t, p), x in zip(top, texts)],
                  "params": params}
        if not top:  # say what is missing rather than draw an empty chart
            replayed = (rec.get(REC.TIMINGS_MS) or {}).get(TIME.BACKEND) == REPLAY_BACKEND
            sample["note"] = _NO_TOKEN_IDS if s.get(SAMPLE.TOKEN_ID) is None else _NO_MODEL if replayed \
                else _NO_CANDIDATES
        return {"requests": requests, "request_id": rid, "sample": sample}
    note = f"#{rid} has not been sampled yet" if rid else "no request sampled yet"
    return {"requests": requests, "request_id": rid, "sample": {"note": note, "params": params}}


_TIMING_KEYS = (TIME.SCHEDULE, TIME.PREPARE, TIME.FORWARD, TIME.SAMPLE, TIME.UPDATE)


def timeline_state(entries: Iterable[Any], captions: Sequence[str] | None = None) -> TimelineState:
    """TimelinePanel traits: per-step columns and run-length Gantt segments per request.
    `captions` (one per entry, explorer.ui.captions.history_captions) are computed when not given."""
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
        _, record, snapshot = entry_parts(entry)
        step = int(record.get(REC.STEP, 0))
        if step <= 0:
            continue
        sched = record.get(REC.SCHEDULED, [])
        t = record.get(REC.TIMINGS_MS) or {}
        cols["step"].append(step)
        cols["caption"].append(caption)
        cols["prefill"].append(sum(s[SCHED.NUM_TOKENS] for s in sched if s.get(SCHED.IS_PREFILL)))
        cols["decode"].append(sum(s[SCHED.NUM_TOKENS] for s in sched if not s.get(SCHED.IS_PREFILL)))
        config = snapshot.get(SNAP.CONFIG) or {}
        cols["budget"].append(record.get(REC.TOKEN_BUDGET) or config.get(BUDGET.MAX_NUM_BATCHED_TOKENS, 0))
        cols["preempted"].append(len(record.get(REC.PREEMPTED, [])))
        for k in _TIMING_KEYS:
            cols[k].append(float(t.get(k) or 0.0))
        # Which attention backend ran, how the forward ran ('eager', 'cuda_graph', 'native_decode')
        # and the CUDA graph bucket a decode step replayed (None: none).
        cols["backend"].append(t.get(TIME.BACKEND))
        cols["graph_bucket"].append(t.get(TIME.CUDA_GRAPH_BUCKET))
        cols["forward_path"].append(t.get(TIME.FORWARD_PATH, "eager"))
        done = set()
        for s in sched:
            rid = s[SCHED.REQUEST_ID]
            if s.get(SCHED.IS_PREFILL):
                chunk = int(s.get('chunk_index') or 0) + 1
                mark(rid, step, "prefill", f"prefill chunk {chunk}: {s['num_tokens']} tokens")
            else:
                mark(rid, step, "decode", "decode")
            done.add(rid)
        for rid in record.get(REC.PREEMPTED, []):
            if rid not in done:
                mark(rid, step, "preempted", "preempted")
                done.add(rid)
        q = snapshot.get(SNAP.QUEUES) or {}
        for req in q.get(QUEUE.WAITING, []):
            rid = req[REQ.REQUEST_ID]
            if rid not in done:
                kind = "preempted" if req.get(REQ.STATUS) == "preempted" or req.get(REQ.NUM_PREEMPTIONS) else "queued"
                mark(rid, step, kind, "waiting after preemption" if kind == "preempted" else "queued")
        for req in q.get(QUEUE.RUNNING, []):
            if req[REQ.REQUEST_ID] not in done:
                mark(req[REQ.REQUEST_ID], step, "stalled", "running, not scheduled")
    return {"steps": cols, "gantt": {"requests": requests, "segments": segments}}


# The clock the TTFT / ITL panel reads, and what it counts. A live server steps on its own: its
# request times (vLLM's own, on the wall clock) are what its clients saw; kvscope's and in-process
# vLLM's engine clock leaves out the pauses between manual steps.
LATENCY_CLOCKS = {
    RMETRICS.ENGINE: ("engine clock",
                      "advances only while a step executes, so pauses and manual stepping do not count"),
    RMETRICS.WALL: ("server clock", "the live server's own request times (wall clock, as vLLM's metrics count them)"),
}


def latency_clock(snapshot: dict) -> str:
    """RMETRICS.WALL for a live server's snapshot (its model info says `live`), else RMETRICS.ENGINE."""
    return RMETRICS.WALL if (snapshot.get(SNAP.MODEL_INFO) or {}).get("live") else RMETRICS.ENGINE


def latency_state(snapshot: dict) -> LatencyState:
    """LatencyPanel traits: per-request rows on the snapshot's clock, and that clock in words."""
    clock = latency_clock(snapshot)
    name, note = LATENCY_CLOCKS[clock]
    return {"rows": latency_rows(snapshot, clock), "clock": name, "clock_note": note}


def latency_rows(snapshot: dict, clock: str = RMETRICS.ENGINE) -> list[dict]:
    """Per-request TTFT and ITLs (seconds, on `clock`: RMETRICS.ENGINE or RMETRICS.WALL)."""
    rows = []
    for req in all_requests(snapshot):
        m = ((req.get(REQ.METRICS) or {}).get(clock)) or {}
        rows.append({"request_id": req[REQ.REQUEST_ID], "time_to_first_token": m.get(CLOCK.TIME_TO_FIRST_TOKEN),
                     "inter_token_latency": list(m.get(CLOCK.INTER_TOKEN_LATENCY) or [])})
    rows.sort(key=lambda r: (len(r[REQ.REQUEST_ID]), r[REQ.REQUEST_ID]))  # "2" before "10"
    return rows


def probe_targets(snapshot: dict) -> list[str]:
    """Requests whose KV is in the cache now (an attention probe can read them)."""
    return [r[REQ.REQUEST_ID] for r in (snapshot.get(SNAP.QUEUES) or {}).get(QUEUE.RUNNING, [])
            if r.get(REQ.NUM_COMPUTED_TOKENS, 0) > 0]


def attention_note(snapshot: dict) -> str:
    """Why the attention panel has no request to probe in this snapshot."""
    q = snapshot.get(SNAP.QUEUES) or {}
    waiting, running, finished = (len(q.get(k, [])) for k in ("waiting", "running", "finished"))
    if waiting or running:
        return f"no running request has KV in the cache yet ({waiting} waiting): step to compute it"
    if finished:
        who = "the request has" if finished == 1 else f"all {finished} requests have"
        return (f"{who} finished: the KV blocks were freed (full blocks stay in the prefix cache until "
                "evicted), so there is no attention to read; add a request and step")
    return "no request yet: add one and step"


def no_kv_note(rid: str, step: int, snapshot: dict, record: dict | None = None, before: dict | None = None) -> str:
    """Why request `rid` has no attention to read at `step` (it is not among `probe_targets`):
    not added yet, preempted (in this step, from `record`, with the tokens it had computed in
    `before`, the previous step's snapshot; or earlier), waiting, or finished; and which
    requests do hold KV then."""
    req = next((r for r in all_requests(snapshot) if r[REQ.REQUEST_ID] == rid), None)
    if req is None:
        why = f"#{rid} did not exist yet at step {step} (it was added later)"
    elif req.get(REQ.STATUS) == "finished":
        return f"#{rid} had finished by step {step}: its KV blocks were freed"
    elif rid in ((record or {}).get(REC.PREEMPTED) or ()):
        had = next((r.get(REQ.NUM_COMPUTED_TOKENS) for r in all_requests(before or {}) if r[REQ.REQUEST_ID] == rid),
                   None)
        lost = f"its {count(int(had), 'computed token')}" if had else "its computed tokens"
        why = (f"#{rid} holds no KV at step {step}: it was preempted in this step, {lost} freed; it waits to be "
               "re-admitted")
    elif req.get(REQ.NUM_PREEMPTIONS):
        why = (f"#{rid} holds no KV at step {step}: it was preempted earlier (its KV freed) and waits to be "
               "re-admitted")
    else:
        why = f"#{rid} holds no KV at step {step}: it was waiting, its prompt not computed yet"
    held = probe_targets(snapshot)
    if held:
        return f"{why}; {count(len(held), 'request')} held KV then ({ids_words(held)}): choose one above"
    return why if req is not None else f"{why}; {attention_note(snapshot)}"


def count(n: int, noun: str, plural: str | None = None) -> str:
    """"1 token", "3 tokens"."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def ids_words(rids: Sequence[str], limit: int = 6) -> str:
    """"#0, #1 and #2" (at most `limit` named, then how many more)."""
    names = [f"#{r}" for r in rids[:limit]]
    if len(rids) > limit:
        return ", ".join(names) + f" and {len(rids) - limit} more"
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def run_summary(history: Sequence[Any]) -> dict:
    """What a new engine would discard of this run: {"steps", "requests", "unfinished"}."""
    if not history:
        return {"steps": 0, "requests": 0, "unfinished": 0}
    step, _, snapshot = entry_parts(history[-1])
    q = snapshot.get(SNAP.QUEUES) or {}
    unfinished = len(q.get(QUEUE.WAITING, [])) + len(q.get(QUEUE.RUNNING, []))
    return {"steps": step, "requests": unfinished + len(q.get(QUEUE.FINISHED, [])), "unfinished": unfinished}


def run_words(summary: dict) -> str:
    """"59 steps and 10 requests, 4 of them unfinished" ("" when there is nothing to lose): no
    brackets, so a notice may put the whole in brackets."""
    parts = []
    if summary.get("steps"):
        parts.append(count(summary["steps"], "step"))
    if summary.get("requests"):
        open_ = summary.get("unfinished") or 0
        parts.append(count(summary["requests"], "request") + (f", {open_} of them unfinished" if open_ else ""))
    return " and ".join(parts)


def summary_line(record: dict | None, snapshot: dict) -> str:
    """The Controls status line: step, queue sizes, free blocks, last step's time."""
    q = snapshot.get(SNAP.QUEUES) or {}
    pool = snapshot.get(SNAP.BLOCK_POOL) or {}
    parts = [f"step {snapshot.get('step', 0)}",
             " \u00b7 ".join(f"{len(q.get(k, []))} {k}" for k in ("waiting", "running", "finished")),
             f"{pool.get('num_free_blocks', 0)}/{max(0, pool.get('num_blocks', 1) - 1)} blocks free"]
    total = (record or {}).get(REC.TIMINGS_MS, {}).get(TIME.TOTAL)
    if total is not None:
        parts.append(f"last step {total:.1f} ms")
    return " \u00b7 ".join(parts)


def engine_label(snapshot: dict) -> str:
    """Which engine a snapshot is of ("kvscope", or what another engine calls itself: "vLLM 0.32.0")."""
    return (snapshot.get(SNAP.MODEL_INFO) or {}).get(INFO.ENGINE) or "kvscope"


def controls_info(record: dict | None, snapshot: dict) -> str:
    """The Controls panel's info line: the engine, `summary_line`, and the prefix-cache hit rate."""
    info = f"{engine_label(snapshot)} \u00b7 " + summary_line(record, snapshot)
    m = snapshot.get(SNAP.METRICS) or {}
    if m.get(METRICS.PREFIX_CACHE_QUERIES):
        info += f" \u00b7 prefix hits {m.get(METRICS.PREFIX_CACHE_HITS, 0)}/{m[METRICS.PREFIX_CACHE_QUERIES]}"
    return info


def budgets_ran_under(record: dict | None, snapshot: dict, in_force: dict) -> dict:
    """The scheduler knobs of `in_force` as the shown step ran under them: the record's budgets
    (else the snapshot's config), each knob they do not name keeping its `in_force` value."""
    ran_under = (record or {}).get(REC.BUDGETS) or snapshot.get(SNAP.CONFIG) or {}
    return {k: ran_under.get(k, v) for k, v in in_force.items()}


def attention_shape(snapshot: dict) -> dict:
    """The AttentionPanel's model traits: `num_layers` with each layer's name in the layer
    picker (`layer_names`: a sliding-window layer says its window), and `num_heads` with each
    head's KV head (`kv_head_of_head`, GQA) when the model info names both head counts."""
    info = snapshot.get(SNAP.MODEL_INFO) or {}
    heads, kv_heads = int(info.get(INFO.NUM_HEADS) or 0), int(info.get(INFO.NUM_KV_HEADS) or 0)
    num_layers = int(info.get(INFO.NUM_LAYERS) or 0)
    names = [str(i) for i in range(num_layers)]
    for group in info.get(INFO.KV_CACHE_GROUPS) or ():
        for layer in group.get("layers") or ():
            if group.get("sliding_window") and 0 <= layer < num_layers:
                names[layer] = f"{layer} (window {group['sliding_window']})"
    out: dict = {"num_layers": num_layers, "layer_names": names}
    if heads and kv_heads:
        out.update(num_heads=heads, kv_head_of_head=[h // (heads // kv_heads) for h in range(heads)])
    return out


#: A panel's state from one history entry alone: its record, its snapshot, and the engine's token texts.
StepView = Callable[[dict | None, dict, TokenText], Mapping[str, Any]]
#: The panels whose state is a `StepView`, by panel name (widgets/<panel>.py's NAME). The Dashboard's
#: binder and the export draw each of them through this table alone, so a new panel of this kind is
#: its widgets/<name>.py, .js and .css plus one entry here (docs/architecture.md, "Adding a panel").
#: (Each entry looks its function up when called: benchmarks/ui.py times them by module attribute.)
STEP_VIEWS: dict[str, StepView] = {
    "blocks": lambda record, snapshot, _text: block_pool_state(record, snapshot),
    "slots": lambda record, snapshot, text: shown_slot_mapping(record, snapshot, text),
    "latency": lambda _record, snapshot, _text: latency_state(snapshot),
}
