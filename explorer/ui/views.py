"""Pure functions from Session history entries (record + snapshot dicts) to panel states.

Everything here reads the dict shapes of engine/report/schema.py (through its key constants) and returns
plain values ready for a panel's traitlets: no widget objects, no torch, no engine (the
block-pool codes come from the panel's module, which defines its byte columns).
"""
from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Literal, TypedDict, cast

from engine.report.records import StepRecord

# The block pool's `status` codes and `events` bits are the record schema's (the browser reads
# them from its generated copy, widgets/_schema.js's KVS_SCHEMA).
from engine.report.schema import (
    AHEAD,
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
    BudgetsDict,
    EngineSnapshotDict,
    RequestDict,
    SampledDict,
    StepRecordDict,
)
from engine.token_replay import BACKEND as REPLAY_BACKEND
from engine.tokenizer import fast_decoder

from ..core.history import Entry, entry_fields
from ..core.labels import kv_cache_group_label
from .captions import BATCH_SOURCE_WORDS, history_captions, no_snapshot

if TYPE_CHECKING:  # each panel's state type, what the functions below return (widgets/<panel>.py); only
    # their names are read here, so this module runs without anywidget (a docs page's Pyodide)
    from widgets.block_pool import BlockPoolState, BlockTableRowDict, GroupRowDict
    from widgets.controls import DiscardedRunDict
    from widgets.latency import LatencyRowDict, LatencyState
    from widgets.queues import QueueRowDict, QueuesState, WhyRowDict
    from widgets.sampler import SamplerCandidate, SamplerParams, SamplerSample, SamplerState
    from widgets.slot_mapping import CachedBlockDict, SlotMappingState, SlotSegmentDict
    from widgets.timeline import GanttSegment, TimelineState, TimelineSteps


TokenText = Callable[[Sequence[int]], list[str]]

#: What the panels read for an entry without a record (the step-0 entry): the record of a step that did nothing.
EMPTY_RECORD: StepRecordDict = StepRecord(step=0).to_dict()


_PARAM_KEYS = ("temperature", "top_k", "top_p", "max_tokens", "ignore_eos", "seed")  # shown by the sampler

#: A snapshot queue's name (QueuesDict's keys), and the three in the order the panels count them.
QueueName = Literal["waiting", "running", "finished"]
QUEUE_NAMES: tuple[QueueName, ...] = (QUEUE.WAITING, QUEUE.RUNNING, QUEUE.FINISHED)


def token_texts(tokenizer: object) -> TokenText:
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


def all_requests(snapshot: EngineSnapshotDict) -> list[RequestDict]:
    """Every request of a snapshot: waiting, running, then finished."""
    q = snapshot.get(SNAP.QUEUES) or {}
    return [*q.get(QUEUE.WAITING, []), *q.get(QUEUE.RUNNING, []), *q.get(QUEUE.FINISHED, [])]


def _clip(text: str | None, limit: int) -> str:
    # Long prompts would bloat every state update; the middle is the least telling part.
    text = text or ""
    return text if len(text) <= limit else text[: limit - limit // 4] + " \u2026 " + text[-(limit // 4):]


def queues_state(record: StepRecordDict | None, snapshot: EngineSnapshotDict, *, max_finished: int = 50,
                 max_text: int = 400, why: Mapping[str, WhyRowDict] | None = None,
                 names: Callable[[str], str] | None = None) -> QueuesState:
    """QueuesPanel traits: one row per request, with what this step scheduled for it, its name
    (`names`: explorer.core.labels, "#17" for a long vLLM id; the card keeps the id on hover), and
    (given `why`, explorer.ui.why_view.why_rows) why its prompt hit or missed the prefix cache."""
    record = record or EMPTY_RECORD
    scheduled = {s[SCHED.REQUEST_ID]: s for s in record.get(REC.SCHEDULED, [])}
    sampled = record.get(REC.SAMPLED, {})

    def row(req: RequestDict) -> QueueRowDict:
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
            "scheduled": None if s is None else {
                SCHED.NUM_TOKENS: s.get(SCHED.NUM_TOKENS), SCHED.NUM_COMPUTED_BEFORE: s.get(SCHED.NUM_COMPUTED_BEFORE),
                SCHED.IS_PREFILL: s.get(SCHED.IS_PREFILL), SCHED.NUM_CACHED_TOKENS: s.get(SCHED.NUM_CACHED_TOKENS),
                SCHED.CHUNK_INDEX: s.get(SCHED.CHUNK_INDEX)},
            "sampled_text": _sampled_text(sampled.get(rid)),
            "why": why.get(rid) if why else None,
        }
    q = snapshot.get(SNAP.QUEUES) or {}
    finished = q.get(QUEUE.FINISHED, [])
    return {"queues": {"waiting": [row(r) for r in q.get(QUEUE.WAITING, [])],
                       "running": [row(r) for r in q.get(QUEUE.RUNNING, [])],
                       "finished": [row(r) for r in finished[-max_finished:]][::-1]},  # newest first
            "finished_total": len(finished)}


def _sampled_text(s: SampledDict | None) -> str | None:
    """The text of a sampled token (None: none sampled)."""
    return s.get(SAMPLE.TEXT) if s else None


# The block pool's byte columns, one element per block, as `array` typecodes: uint8 status,
# uint16 ref_count, int16 owner (an index into owners, -1 none), uint8 events, uint8 group (the
# KV cache group whose table holds it: 0 full attention, 1.. the others, e.g. a sliding window's).
BLOCK_COLUMNS = {"status": "B", "ref_count": "H", "owner": "h", "events": "B", "group": "B"}


def block_pool_state(record: StepRecordDict | None, snapshot: EngineSnapshotDict) -> BlockPoolState:
    """BlockPoolPanel traits as compact byte columns (+ "blocks", kept Python-side)."""
    record = record or EMPTY_RECORD
    pool = snapshot.get(SNAP.BLOCK_POOL) or {}
    blocks = pool.get(POOL.BLOCKS, [])
    n = len(blocks)
    status, events = array(BLOCK_COLUMNS["status"], bytes(n)), array(BLOCK_COLUMNS["events"], bytes(n))
    ref, owner = array(BLOCK_COLUMNS["ref_count"], bytes(2 * n)), array(BLOCK_COLUMNS["owner"], [-1] * n)
    owners: list[str] = []
    owner_index: dict[str, int] = {}
    shared: list[list[int | list[int]]] = []  # [block_id, [owner indices]] of blocks with several owners
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
    # The step's block events by key: every BlockEventsDict value is a list of block ids.
    record_blocks = cast("Mapping[str, list[int]]", record.get(REC.BLOCKS) or {})
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
    tables: list[BlockTableRowDict] = []
    for r in (snapshot.get(SNAP.QUEUES) or {}).get(QUEUE.RUNNING, []):
        table = list(r.get(REQ.BLOCK_TABLE, []))
        if not table:
            continue
        hits = list(range(min(hit_blocks.get(r[REQ.REQUEST_ID], 0), len(table))))
        # Entries whose KV came from the prefix cache when the request was (last) admitted:
        # marked for as long as it runs, not only in the step of the hit.
        cached = list(range(min(int(r.get(REQ.NUM_CACHED_TOKENS) or 0) // block_size, len(table))))
        row: BlockTableRowDict = {"request_id": r[REQ.REQUEST_ID], "block_table": table,
                                  "num_computed_tokens": r.get(REQ.NUM_COMPUTED_TOKENS, 0),
                                  "hits": hits, "same_step_hits": [i for i in hits if table[i] in same_step],
                                  "cached": cached}
        if len(labels) > 1:
            row["groups"] = group_rows(r, labels)
            for g, group_table in enumerate(r.get(REQ.GROUP_BLOCK_TABLES) or (), start=1):
                for gb in group_table:
                    if 0 < gb < n:
                        group[gb] = g
        tables.append(row)
    return {"num_blocks": n, "block_size": block_size, "status": status.tobytes(),
            "ref_count": ref.tobytes(), "owner": owner.tobytes(), "events": events.tobytes(),
            # one KV cache group (most models): no column, the panel draws no group marks
            "group": group.tobytes() if len(labels) > 1 else b"", "group_labels": labels,
            "owners": owners, "shared": shared, "block_tables": tables, "counts": counts,
            # the pool's BlockDicts, as widgets/block_pool.py's BlockPoolState types them (list[dict])
            "blocks": cast("list[dict]", blocks)}


def group_labels(snapshot: EngineSnapshotDict) -> list[str]:
    """A short name for each KV cache group of the snapshot's model ("full attention",
    "sliding window 4096"); one entry where the model has one group (or says nothing of them)."""
    groups = (snapshot.get(SNAP.MODEL_INFO) or {}).get(INFO.KV_CACHE_GROUPS) or []
    return [kv_cache_group_label(g) for g in groups] or ["full attention"]


def group_rows(req: RequestDict, labels: list[str]) -> list[GroupRowDict]:
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


def slot_mapping_state(record: StepRecordDict | None, token_text: TokenText, *, block_size: int = 16,
                       max_rows: int = 1024, snapshot: EngineSnapshotDict | None = None) -> SlotMappingState:
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
    known = {r[REQ.REQUEST_ID]: r for r in (all_requests(snapshot) if snapshot else [])}
    # Other KV cache groups (sliding-window layers): their own slots and tables over the same rows.
    group_tables = list(batch.get(BATCH.GROUP_BLOCK_TABLES, []))
    labels = group_labels(snapshot)[1:] if snapshot else []   # (no snapshot: one group, "full attention")
    segments: list[SlotSegmentDict] = []
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
                         "sampled_text": _sampled_text(sampled.get(rid)),
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


def batch_source_state(record: StepRecordDict) -> BatchSourceState:
    """The slot-mapping panel's `batch_source` and its [badge, hover text] (none for the engine's own)."""
    source = str(record.get(REC.BATCH_SOURCE) or "")
    words = BATCH_SOURCE_WORDS.get(source, (f"batch from: {source}", "")) if source else ()
    return {"batch_source": source, "batch_source_words": list(words)}


def shown_slot_mapping(record: StepRecordDict | None, snapshot: EngineSnapshotDict,
                       token_text: TokenText) -> SlotMappingState:
    """The SlotMappingPanel's state as the Dashboard shows an entry: at its pool's block size."""
    block_size = int((snapshot.get(SNAP.BLOCK_POOL) or {}).get(POOL.BLOCK_SIZE, 16))
    return slot_mapping_state(record, token_text, block_size=block_size, snapshot=snapshot)


def _cached_blocks(num_cached: int, table: list[int], block_size: int, req: RequestDict | None,
                   token_text: TokenText) -> list[CachedBlockDict]:
    """The blocks of a prefix hit, in order: {block, start, end, text} (text: "" unknown)."""
    tokens = [*req.get(REQ.PROMPT_TOKEN_IDS, []), *req.get(REQ.OUTPUT_TOKEN_IDS, [])] if req else []
    out: list[CachedBlockDict] = []
    for i in range(min(int(num_cached or 0) // block_size, len(table))):
        lo, hi = i * block_size, (i + 1) * block_size
        out.append({"block": table[i], "start": lo, "end": hi,
                    "text": "".join(token_text(tokens[lo:hi])) if len(tokens) >= hi else ""})
    return out


def entry_parts(entry: Entry) -> tuple[int, StepRecordDict, EngineSnapshotDict]:
    """(step, record, snapshot) of a history entry (a HistoryEntry, or its dict form), as
    the panels read it: no record is EMPTY_RECORD, no step the snapshot's."""
    step, record, snapshot = entry_fields(entry)
    snapshot = snapshot or no_snapshot()   # a dict entry without one
    return int(step or snapshot.get(SNAP.STEP, 0) or 0), record or EMPTY_RECORD, snapshot


# A record can name the sampled token without its candidates: a live vLLM server's feed carries
# none (the logprobs stay with the client that asked), and in-process vLLM records none with
# logprobs_top=0. With KVSCOPE_FEED_TOKENS=0 the feed leaves out the token too.
_NO_CANDIDATES = ("no candidates recorded for this step, only the chosen token: a live server's feed carries "
                  "none (its logprobs go to the client that asked for them)")
_NO_TOKEN_IDS = "the feed leaves token ids out (KVSCOPE_FEED_TOKENS=0): neither the token nor its candidates"
_NO_MODEL = "no candidates: a replay of recorded tokens runs no model, so each step's token is the recorded one"


def sampler_state(entries: Sequence[Entry], snapshot: EngineSnapshotDict, request_id: str,
                  token_text: TokenText) -> SamplerState:
    """SamplerPanel traits: the latest sample of `request_id` in `entries` (newest last)."""
    record = entry_parts(entries[-1])[1] if entries else EMPTY_RECORD
    requests = list(record.get(REC.SAMPLED, {}))
    rid = request_id if request_id else (requests[0] if requests else "")
    params: SamplerParams = {}
    for req in all_requests(snapshot):
        if req[REQ.REQUEST_ID] == rid:
            sp = req.get(REQ.SAMPLING_PARAMS) or {"max_tokens": req.get(REQ.MAX_TOKENS)}
            params = cast("SamplerParams", {k: sp.get(k) for k in _PARAM_KEYS if k in sp})   # SamplerParams' keys
    for entry in reversed(entries):
        rec = entry_parts(entry)[1]
        s = rec.get(REC.SAMPLED, {}).get(rid)
        if s is None:
            continue
        top = [(int(t), float(p)) for t, p in s.get(SAMPLE.TOP, [])]
        texts = token_text([t for t, _ in top])
        # [token id, text, probability] lists: what SamplerCandidate's tuples become on the wire
        candidates = cast("list[SamplerCandidate]", [[t, x, float(p)] for (t, p), x in zip(top, texts)])
        sample: SamplerSample = {"request_id": rid, "step": rec.get(REC.STEP, 0), "token_id": s.get(SAMPLE.TOKEN_ID),
                                 "text": s.get(SAMPLE.TEXT), "top": candidates, "params": params}
        if not top:  # say what is missing rather than draw an empty chart
            replayed = (rec.get(REC.TIMINGS_MS) or {}).get(TIME.BACKEND) == REPLAY_BACKEND
            sample["note"] = _NO_TOKEN_IDS if s.get(SAMPLE.TOKEN_ID) is None else _NO_MODEL if replayed \
                else _NO_CANDIDATES
        return {"requests": requests, "request_id": rid, "sample": sample}
    note = f"#{rid} has not been sampled yet" if rid else "no request sampled yet"
    return {"requests": requests, "request_id": rid, "sample": {"note": note, "params": params}}


#: The step phases the timeline charts (TimingsDict's keys, each in milliseconds).
Phase = Literal["schedule", "prepare", "forward", "sample", "update"]
_TIMING_KEYS: tuple[Phase, ...] = (TIME.SCHEDULE, TIME.PREPARE, TIME.FORWARD, TIME.SAMPLE, TIME.UPDATE)


def timeline_state(entries: Iterable[Entry], captions: Sequence[str] | None = None) -> TimelineState:
    """TimelinePanel traits: per-step columns and run-length Gantt segments per request.
    `captions` (one per entry, explorer.ui.captions.history_captions) are computed when not given."""
    entries = list(entries)
    if captions is None:
        captions = history_captions(entries)
    cols: dict[str, list] = {k: [] for k in ("step", "prefill", "decode", "budget", "preempted", *_TIMING_KEYS,
                                             "backend", "graph_bucket", "forward_path", "scheduled_ahead",
                                             "caption")}
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
        ahead = record.get(REC.SCHEDULED_AHEAD)
        cols["scheduled_ahead"].append(ahead[AHEAD.IN_FLIGHT_STEP] if ahead else None)
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
    # the columns TimelineSteps names; segments as lists (mark extends them), GanttSegment's tuples on the wire
    return {"steps": cast("TimelineSteps", cols),
            "gantt": {"requests": requests, "segments": cast("list[GanttSegment]", segments)}}


# The clock the TTFT / ITL panel reads, and what it counts. A live server steps on its own: its
# request times (vLLM's own, on the wall clock) are what its clients saw; kvscope's and in-process
# vLLM's engine clock leaves out the pauses between manual steps.
LatencyClock = Literal["engine", "wall"]   # RequestMetricsDict's keys: RMETRICS.ENGINE, RMETRICS.WALL
LATENCY_CLOCKS = {
    RMETRICS.ENGINE: ("engine clock",
                      "advances only while a step executes, so pauses and manual stepping do not count"),
    RMETRICS.WALL: ("server clock", "the live server's own request times (wall clock, as vLLM's metrics count them)"),
}


def latency_clock(snapshot: EngineSnapshotDict) -> LatencyClock:
    """RMETRICS.WALL for a live server's snapshot (its model info says `live`), else RMETRICS.ENGINE."""
    return RMETRICS.WALL if (snapshot.get(SNAP.MODEL_INFO) or {}).get("live") else RMETRICS.ENGINE


def latency_state(snapshot: EngineSnapshotDict) -> LatencyState:
    """LatencyPanel traits: per-request rows on the snapshot's clock, and that clock in words."""
    clock = latency_clock(snapshot)
    name, note = LATENCY_CLOCKS[clock]
    rows = latency_rows(snapshot, clock)
    return {"rows": rows, "clock": name, "clock_note": note}


def latency_rows(snapshot: EngineSnapshotDict, clock: LatencyClock = RMETRICS.ENGINE) -> list[LatencyRowDict]:
    """Per-request TTFT and ITLs (seconds, on `clock`: RMETRICS.ENGINE or RMETRICS.WALL)."""
    rows: list[LatencyRowDict] = []
    for req in all_requests(snapshot):
        m = ((req.get(REQ.METRICS) or {}).get(clock)) or {}
        rows.append({"request_id": req[REQ.REQUEST_ID], "time_to_first_token": m.get(CLOCK.TIME_TO_FIRST_TOKEN),
                     "inter_token_latency": list(m.get(CLOCK.INTER_TOKEN_LATENCY) or [])})
    rows.sort(key=lambda r: (len(r[REQ.REQUEST_ID]), r[REQ.REQUEST_ID]))  # "2" before "10"
    return rows


def probe_targets(snapshot: EngineSnapshotDict) -> list[str]:
    """Requests whose KV is in the cache now (an attention probe can read them)."""
    return [r[REQ.REQUEST_ID] for r in (snapshot.get(SNAP.QUEUES) or {}).get(QUEUE.RUNNING, [])
            if r.get(REQ.NUM_COMPUTED_TOKENS, 0) > 0]


def attention_note(snapshot: EngineSnapshotDict) -> str:
    """Why the attention panel has no request to probe in this snapshot."""
    q = snapshot.get(SNAP.QUEUES) or {}
    waiting, running, finished = (len(q.get(k, [])) for k in QUEUE_NAMES)
    if waiting or running:
        return f"no running request has KV in the cache yet ({waiting} waiting): step to compute it"
    if finished:
        who = "the request has" if finished == 1 else f"all {finished} requests have"
        return (f"{who} finished: the KV blocks were freed (full blocks stay in the prefix cache until "
                "evicted), so there is no attention to read; add a request and step")
    return "no request yet: add one and step"


def no_kv_note(rid: str, step: int, snapshot: EngineSnapshotDict, record: StepRecordDict | None = None,
               before: EngineSnapshotDict | None = None) -> str:
    """Why request `rid` has no attention to read at `step` (it is not among `probe_targets`):
    not added yet, preempted (in this step, from `record`, with the tokens it had computed in
    `before`, the previous step's snapshot; or earlier), waiting, or finished; and which
    requests do hold KV then."""
    req = next((r for r in all_requests(snapshot) if r[REQ.REQUEST_ID] == rid), None)
    if req is None:
        why = f"#{rid} did not exist yet at step {step} (it was added later)"
    elif req.get(REQ.STATUS) == "finished":
        return f"#{rid} had finished by step {step}: its KV blocks were freed"
    elif rid in ((record.get(REC.PREEMPTED) if record else None) or ()):
        had = next((r.get(REQ.NUM_COMPUTED_TOKENS) for r in (all_requests(before) if before else [])
                    if r[REQ.REQUEST_ID] == rid), None)
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


def run_summary(history: Sequence[Entry]) -> DiscardedRunDict:
    """What a new engine would discard of this run: {"steps", "requests", "unfinished"}."""
    if not history:
        return {"steps": 0, "requests": 0, "unfinished": 0}
    step, _, snapshot = entry_parts(history[-1])
    q = snapshot.get(SNAP.QUEUES) or {}
    unfinished = len(q.get(QUEUE.WAITING, [])) + len(q.get(QUEUE.RUNNING, []))
    return {"steps": step, "requests": unfinished + len(q.get(QUEUE.FINISHED, [])), "unfinished": unfinished}


def run_words(summary: DiscardedRunDict) -> str:
    """"59 steps and 10 requests, 4 of them unfinished" ("" when there is nothing to lose): no
    brackets, so a notice may put the whole in brackets."""
    parts = []
    if summary.get("steps"):
        parts.append(count(summary["steps"], "step"))
    if summary.get("requests"):
        open_ = summary.get("unfinished") or 0
        parts.append(count(summary["requests"], "request") + (f", {open_} of them unfinished" if open_ else ""))
    return " and ".join(parts)


def summary_line(record: StepRecordDict | None, snapshot: EngineSnapshotDict) -> str:
    """The Controls status line: step, queue sizes, free blocks, last step's time."""
    q = snapshot.get(SNAP.QUEUES) or {}
    pool = snapshot.get(SNAP.BLOCK_POOL) or {}
    parts = [f"step {snapshot.get('step', 0)}",
             " \u00b7 ".join(f"{len(q.get(k, []))} {k}" for k in QUEUE_NAMES),
             f"{pool.get('num_free_blocks', 0)}/{max(0, pool.get('num_blocks', 1) - 1)} blocks free"]
    total = record.get(REC.TIMINGS_MS, {}).get(TIME.TOTAL) if record else None
    if total is not None:
        parts.append(f"last step {total:.1f} ms")
    return " \u00b7 ".join(parts)


def engine_label(snapshot: EngineSnapshotDict) -> str:
    """Which engine a snapshot is of ("kvscope", or what another engine calls itself: "vLLM 0.32.0")."""
    return (snapshot.get(SNAP.MODEL_INFO) or {}).get(INFO.ENGINE) or "kvscope"


def controls_info(record: StepRecordDict | None, snapshot: EngineSnapshotDict) -> str:
    """The Controls panel's info line: the engine, `summary_line`, and the prefix-cache hit rate."""
    info = f"{engine_label(snapshot)} \u00b7 " + summary_line(record, snapshot)
    m = snapshot.get(SNAP.METRICS) or {}
    if m.get(METRICS.PREFIX_CACHE_QUERIES):
        info += f" \u00b7 prefix hits {m.get(METRICS.PREFIX_CACHE_HITS, 0)}/{m[METRICS.PREFIX_CACHE_QUERIES]}"
    return info


def budgets_ran_under(record: StepRecordDict | None, snapshot: EngineSnapshotDict,
                      in_force: BudgetsDict) -> BudgetsDict:
    """The scheduler knobs of `in_force` as the shown step ran under them: the record's budgets
    (else the snapshot's config), each knob they do not name keeping its `in_force` value."""
    budgets = record.get(REC.BUDGETS) if record else None
    ran_under = budgets or snapshot.get(SNAP.CONFIG) or {}
    # in_force's keys, each with a value for that knob (a config's fields are the knobs' values)
    return cast("BudgetsDict", {k: ran_under.get(k, v) for k, v in in_force.items()})


class _AttentionLayers(TypedDict):
    """The keys every AttentionShapeDict has."""
    num_layers: int
    layer_names: list[str]   # each layer's name in the layer picker ("3 (window 4096)")


class AttentionShapeDict(_AttentionLayers, total=False):
    """The AttentionPanel's model traits (`attention_shape`); the head keys only where the model info names both
    head counts."""
    num_heads: int
    kv_head_of_head: list[int]   # each query head's KV head (GQA)


def attention_shape(snapshot: EngineSnapshotDict) -> AttentionShapeDict:
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
    out: AttentionShapeDict = {"num_layers": num_layers, "layer_names": names}
    if heads and kv_heads:
        out["num_heads"] = heads
        out["kv_head_of_head"] = [h // (heads // kv_heads) for h in range(heads)]
    return out
