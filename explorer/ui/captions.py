"""One plain-language line per engine step, for a learner: what was scheduled and why, and
what happened to the KV blocks (allocated, reused from the prefix cache, freed, evicted).

`step_caption(record, snapshot, before)` reads only the documented dicts: the step's
StepRecord, the engine after it (the same history entry's snapshot: prompt lengths, finish
reasons, block tables) and, when given, the engine before it (the previous entry's
snapshot: block tables and free blocks, which name the request whose missing block caused
a preemption). Both kvscope's engine and the vLLM adapter produce these shapes, so the
same captions describe either. `history_captions(entries)` gives one per history entry.

Example: "#0-#2 decode 1 token each; #0 needed a new block and none was free → preempted
#3 (newest running), freed blocks 9, 4".
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import cast

from engine.report.schema import (
    AHEAD,
    REC,
    UNKNOWN_TOKEN,
    BudgetsDict,
    EngineSnapshotDict,
    RequestDict,
    ScheduledAheadDict,
    ScheduledDict,
    StepRecordDict,
)

from ..core.history import Entry, entry_fields

EMPTY_HINT = "no steps yet: add a request and press Step"
ARROW = "\u2192"


# Where a record's packed batch came from (REC.BATCH_SOURCE, docs/attach.md): a live server's
# recorder derives it from the scheduler's block tables ("scheduler"); kvscope's engine and vLLM in
# process read their model runner's buffers ("runner").
BATCH_SOURCE_WORDS = {
    "scheduler": ("derived from the scheduler's block tables",
                  "the server's model runner keeps its input buffers to itself, so each row's slot is computed as the "
                  "runner computes it: block_table[position // block_size] * block_size + position % block_size"),
    "runner": ("read from the model runner's buffers",
               "the very input_ids, positions and slot_mapping the forward ran on"),
    "replay": ("packed as the model runner packs it",
               "a replay of recorded tokens runs no model: this is the runner's own packing of the step "
               "(engine.runner.batch.build_batch), from the scheduler's decision"),
}


def step_caption(record: StepRecordDict | None, snapshot: EngineSnapshotDict | None = None,
                 before: EngineSnapshotDict | None = None, names: Callable[[str], str] | None = None) -> str:
    """What step `record` did, in words (see the module docstring for the arguments); `names`
    gives a request's name (explorer.core.labels: "#17" for a long vLLM id; default "#" + id)."""
    snapshot = snapshot or no_snapshot()
    if not record or int(record.get("step", 0) or 0) <= 0:
        return _start_caption(snapshot)
    return _Step(record, snapshot, before, names).caption()


def history_captions(entries: Sequence[Entry], names: Callable[[str], str] | None = None) -> list[str]:
    """The caption of every history entry (each with its predecessor's snapshot as `before`)."""
    out: list[str] = []
    prev: EngineSnapshotDict | None = None
    for entry in entries:
        record, snapshot = _parts(entry)
        out.append(step_caption(record, snapshot, prev, names))
        prev = snapshot
    return out


def no_snapshot() -> EngineSnapshotDict:
    """What an entry without a snapshot (a dict entry from outside) reads as: an engine with nothing in it.
    Every reader .get()s a snapshot's parts with a default, so {} stands for that state (hence the cast)."""
    return cast("EngineSnapshotDict", {})


def _parts(entry: Entry) -> tuple[StepRecordDict | None, EngineSnapshotDict]:
    _, record, snapshot = entry_fields(entry)
    return record, snapshot or no_snapshot()


def _start_caption(snapshot: EngineSnapshotDict) -> str:
    waiting = len((snapshot.get("queues") or {}).get("waiting", []))
    if waiting:
        return f"no steps yet: {waiting} request{_s(waiting)} waiting; press Step to run the first step"
    return EMPTY_HINT


# -- wording helpers -----------------------------------------------------------------------------
def _s(n: int) -> str:
    return "" if n == 1 else "s"


def _hash_name(rid: str) -> str:
    return f"#{rid}"


def ids_text(rids: Iterable[str], names: Callable[[str], str] = _hash_name) -> str:
    """'#0-#2' for a run of three or more consecutive numbers, else '#0, #5' (each id by its
    name: a long vLLM id by its short label)."""
    shown = [names(r) for r in rids]
    if len(shown) >= 3 and all(n[1:].isdigit() for n in shown):
        nums = [int(n[1:]) for n in shown]
        if nums == list(range(nums[0], nums[0] + len(nums))):
            return f"{shown[0]}-{shown[-1]}"
    return ", ".join(shown)


def _blocks_text(blocks: Sequence[int]) -> str:
    return f"block{_s(len(blocks))} {', '.join(str(b) for b in blocks)}"


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class _Step:
    """The facts one caption needs, gathered once from the record and the two snapshots."""

    def __init__(self, record: StepRecordDict, snapshot: EngineSnapshotDict, before: EngineSnapshotDict | None,
                 names: Callable[[str], str] | None = None) -> None:
        self.name = names or _hash_name
        self.rec = record
        self.before = before
        pool = snapshot.get("block_pool") or {}
        config = snapshot.get("config") or {}
        self.bs = int(pool.get("block_size") or config.get("block_size") or 16)
        # The knobs of the snapshot's config (the engine config's fields), overridden by the record's budgets.
        self.budgets = cast("BudgetsDict", {
            **{k: config[k] for k in ("max_num_batched_tokens", "max_num_seqs", "enable_chunked_prefill",
                                      "scheduler_reserve_full_isl", "scheduling_policy") if k in config},
            **(record.get("budgets") or {})})
        self.budget = int(record.get("token_budget") or self.budgets.get("max_num_batched_tokens") or 0)
        q = snapshot.get("queues") or {}
        # every request of the snapshot by id (finished, waiting, then running: a later queue's entry wins)
        self.reqs = {r["request_id"]: r for r in (*q.get("finished", []), *q.get("waiting", []), *q.get("running", []))}
        self.waiting_after = [r["request_id"] for r in q.get("waiting", [])]
        self.running_after = q.get("running", [])
        bq = (before or no_snapshot()).get("queues") or {}
        self.before_running = [r["request_id"] for r in bq.get("running", [])]
        self.before_tables = {r["request_id"]: list(r.get("block_table", [])) for r in bq.get("running", [])}
        self.before_known = {r["request_id"] for r in (*bq.get("waiting", []), *bq.get("running", []))}
        self.sched = list(record.get("scheduled", []))
        self.by_rid = {s["request_id"]: s for s in self.sched}
        self.new = set(record.get("new_requests", []))
        self.preempted = list(record.get("preempted", []))
        self.finished = list(record.get("finished", []))
        self.sampled = record.get("sampled", {}) or {}
        self.blocks = record.get("blocks", {}) or {}
        self._claimed: set[int] = set()          # freed blocks a clause already named
        self._unattributed_alloc: list[int] = []  # allocated blocks no running request holds now

    # -- request facts --
    def known_tokens(self, rid: str) -> int | None:
        """Tokens the request had before this step (prompt + outputs generated before it)."""
        r = self.reqs.get(rid)
        if r is None:
            return None
        n = len(r.get("prompt_token_ids", [])) + len(r.get("output_token_ids", []))
        return n - (1 if rid in self.sampled else 0)

    def prompt_len(self, rid: str) -> int | None:
        r = self.reqs.get(rid)
        return None if r is None else len(r.get("prompt_token_ids", []))

    # -- the caption --
    def caption(self) -> str:
        parts: list[str] = []
        # A resumed request whose cached blocks leave one token to compute is scheduled as a
        # decode; it is still an admission (with prefix hits), so it gets its own clause.
        decodes = [s["request_id"] for s in self.sched if not s.get("is_prefill") and s["request_id"] not in self.new]
        if decodes:
            parts.append(f"{ids_text(decodes, self.name)} decode 1 token{' each' if len(decodes) > 1 else ''}")
        used = 0
        for s in self.sched:
            if s.get("is_prefill") or s["request_id"] in self.new:
                parts.append(self.prefill_text(s, self.budget - used))
            used += int(s["num_tokens"])
        if self.preempted:
            parts.append(self.preemption_text())
        parts += self.allocation_texts()
        for rid in self.finished:
            parts.append(self.finish_text(rid))
        if self.blocks.get("evicted"):
            ev = self.blocks["evicted"]
            parts.append(f"evicted cached {_blocks_text(ev)} from the prefix cache "
                         f"to reuse {'it' if len(ev) == 1 else 'them'}")
        unclaimed = [b for b in self.blocks.get("freed", []) if b not in self._claimed]
        if unclaimed:
            parts.append(f"freed {_blocks_text(unclaimed)}")
        wait = self.waiting_text(used)
        if wait:
            parts.append(wait)
        if not self.sched and not parts:
            return "nothing was scheduled"
        if not self.sched:
            parts.insert(0, "nothing was scheduled")
        if ahead := self.rec.get(REC.SCHEDULED_AHEAD):
            parts.append(self.ahead_text(ahead))
        if self.rec.get(REC.BATCH_SOURCE) == "scheduler" and self.sched:
            # a live feed's batch is not the runner's own but derived: say so with it (an engine's own
            # batch, read from its runner, needs no word: the panel's badge names it)
            parts.append(f"slot mapping {BATCH_SOURCE_WORDS['scheduler'][0]}")
        return "; ".join(parts)

    def ahead_text(self, ahead: ScheduledAheadDict) -> str:
        """Async scheduling: which step still ran when this one was scheduled, and what the
        placeholder inputs it took from that step turned out to be."""
        step, held = ahead[AHEAD.IN_FLIGHT_STEP], ahead[AHEAD.PLACEHOLDERS]
        text = f"scheduled while step {step} still ran (async scheduling)"
        if not held:
            return text
        were = "was a placeholder" if len(held) == 1 else "were placeholders"
        text = f"{text}: {len(held)} decode input{_s(len(held))} {were} for step {step}'s token{_s(len(held))}"
        known = [(rid, token) for rid, token in held.items() if token != UNKNOWN_TOKEN]
        if not known:   # a live feed without token ids
            return f"{text}, filled once it landed (the feed carries no token ids)"
        shown = ", ".join(f"{self.name(rid)} {ARROW} {token}" for rid, token in known[:3])
        more = f" and {len(known) - 3} more" if len(known) > 3 else ""
        return f"{text}, filled once it landed ({shown}{more})"

    def prefill_text(self, s: ScheduledDict, left: int) -> str:
        """A prefill (or a resumed request's recompute): how many of its tokens, from where,
        what the prefix cache gave, and which limit chunked it."""
        rid = s["request_id"]
        n, before = int(s["num_tokens"]), int(s.get("num_computed_before", 0))
        known, prompt = self.known_tokens(rid), self.prompt_len(rid)
        r = self.reqs.get(rid)
        cached = int(s.get("num_cached_tokens") or 0) if rid in self.new else 0
        end = before + n
        total = known if known is not None else end
        # A preempted request recomputes its prompt and the tokens it had generated.
        again = int((r.get("num_preemptions") if r else None) or 0) > 0 and prompt is not None and total > prompt
        resumed = again and rid in self.new
        verb, kind = ("recompute", "tokens") if again else ("prefill", "prompt tokens")
        head = self.name(rid) + (" resumed after its preemption:" if resumed else "")
        if cached:
            nb = cached // self.bs if self.bs else 0
            head += f" reused {nb} cached block{_s(nb)} ({cached} tokens) from the prefix cache"
            if set(self._hit_blocks(rid)) & set(self.blocks.get("same_step_hits", [])):
                head += " (a same-step hit: computed by this very step, before any layer reads it)"
            head += ","
        notes: list[str] = []
        if before == 0 and end >= total:
            what = f"{verb} all {n} {kind}" if n > 1 else f"{verb} its 1 {kind[:-1]}"
        elif before == 0:
            what = f"{verb} {n} of {total} {kind}"
        elif before == cached and end >= total:
            what = f"{verb} the other {n} of {total} {kind}"
        else:
            what = f"{verb} tokens {before + 1}-{end} of {total}"
            if before > cached:  # a later chunk
                chunk = s.get("chunk_index")
                notes.append(f"chunk {int(chunk) + 1}" if chunk is not None else "next chunk")
                if end >= total:
                    notes.append("the last")
        if resumed and prompt is not None:  # resumed implies a known prompt: this says so to mypy
            notes.insert(0, f"prompt {prompt} + {total - prompt} generated")
        if n == 1 and before > 0:  # attention sees one query row with context: vLLM's "decode" there
            notes.append("one query row: attention runs it as a decode")
        if end < total:  # chunked: say which limit cut it
            if n >= left and left < self.budget:
                notes.append(f"chunked: {left} of the {self.budget}-token budget left")
            elif n >= left:
                notes.append(f"chunked: token budget {self.budget}")
        text = f"{head} {what}" + (f" ({'; '.join(notes)})" if notes else "")
        tok = self.sampled.get(rid)
        if tok is not None:
            text += f" {ARROW} {'next' if again else 'first'} token {_quote(tok.get('text'), tok.get('token_id'))}"
        return text

    def _hit_blocks(self, rid: str) -> list[int]:
        """The blocks `rid` took as prefix-cache hits in this step (hits are taken in admission order)."""
        hits = list(self.blocks.get("hits", []))
        i = 0
        for s in self.sched:
            if s["request_id"] not in self.new:
                continue
            k = int(s.get("num_cached_tokens") or 0) // self.bs if self.bs else 0
            if s["request_id"] == rid:
                return hits[i:i + k]
            i += k
        return []

    # -- preemption: who needed a block, who was preempted, what it freed --
    def preemption_text(self) -> str:
        order = {rid: i for i, rid in enumerate(self.before_running)}
        victims = sorted(self.preempted, key=lambda r: -order.get(r, -1)) if order else list(self.preempted)
        trigger, need = self._trigger()
        freed = self._freed_by(victims)
        if trigger is not None:
            blocks = "a new block" if need <= 1 else f"{need} new blocks"
            why = f"{self.name(trigger)} needed {blocks} and {'none was' if need <= 1 else 'not enough were'} free"
        else:
            why = "the pool ran out of free KV blocks"
        if trigger is not None and victims == [trigger]:
            what = "preempted itself (it was the newest running request)"
        elif trigger is not None and trigger in victims:
            others = [v for v in victims if v != trigger]
            what = f"preempted {ids_text(others, self.name)}, then itself (newest running first)"
        elif len(victims) == 1:
            what = f"preempted {self.name(victims[0])} (newest running)"
        else:
            what = f"preempted {' then '.join('#' + v for v in victims)} (newest running first)"
        text = f"{why} {ARROW} {what}"
        if freed:
            text += f", freed {_blocks_text(freed)}"
        text += (f"; {'it goes' if len(victims) == 1 else 'they go'} back to the front of the waiting queue, "
                 "to be recomputed")
        return text

    def _trigger(self) -> tuple[str | None, int]:
        """The running request whose block allocation failed, replayed from the state before the
        step: running requests are served in admission order, each taking blocks for its new
        tokens from the free ones; the first that finds too few caused the preemption."""
        if self.before is None or not self.before_running:
            return None, 1
        free = int(((self.before.get("block_pool") or {}).get("num_free_blocks")) or 0)
        for rid in self.before_running:
            s = self.by_rid.get(rid)
            if s is None:
                if rid in self.preempted:  # reached a victim first: it tried to grow, and preempted itself
                    return rid, 1
                continue
            need = _ceil_div(int(s.get("num_computed_before", 0)) + int(s["num_tokens"]), self.bs) \
                - len(self.before_tables.get(rid, []))
            if need > free:
                return rid, need
            free -= max(0, need)
        return None, 1

    def _freed_by(self, rids: Iterable[str], extra: Iterable[int] = ()) -> list[int]:
        mine = {b for rid in rids for b in self.before_tables.get(rid, [])} | set(extra)
        out = [b for b in self.blocks.get("freed", []) if b in mine and b not in self._claimed]
        self._claimed.update(out)
        return out

    # -- allocation, finishing, waiting --
    def allocation_texts(self) -> list[str]:
        allocated = list(self.blocks.get("allocated", []))
        if not allocated:
            return []
        alloc_set = set(allocated)
        per: list[str] = []
        seen: set[int] = set()
        for r in self.running_after:
            rid = r["request_id"]
            table = list(r.get("block_table", []))
            skip = len(self._hit_blocks(rid)) if rid in self.new else 0
            got = [b for b in table[skip:] if b in alloc_set and b not in seen]
            if got:
                seen.update(got)
                per.append(f"{_blocks_text(got)} to {self.name(rid)}")
        self._unattributed_alloc = [b for b in allocated if b not in seen]
        rest = self._unattributed_alloc
        if rest:
            per.append(_blocks_text(rest) if not per else f"{_blocks_text(rest)} (to a request that finished)")
        return [f"allocated {', '.join(per)}"]

    def finish_text(self, rid: str) -> str:
        r: RequestDict | None = self.reqs.get(rid)
        reason = r.get("finish_reason") if r else None
        out = len(r.get("output_token_ids", [])) if r else 0
        max_tokens = (r.get("max_tokens") or (r.get("sampling_params") or {}).get("max_tokens")) if r else None
        if reason == "length":
            limit = int(max_tokens) if max_tokens else None
            why = f"max_tokens={max_tokens} reached" if limit is not None and out >= limit else "max_model_len reached"
        elif reason == "stop":
            why = "sampled its end-of-sequence / stop token"
        elif reason == "abort":
            why = "aborted"
        else:
            why = reason or "done"
        text = f"{self.name(rid)} finished ({why})"
        extra = self._unattributed_alloc if len(self.finished) == 1 else []
        freed = self._freed_by([rid], extra)
        if freed:
            text += f", freed {_blocks_text(freed)}"
        return text

    def waiting_text(self, used: int) -> str:
        """Why the head of the waiting queue was not admitted (only for requests that were
        already waiting before this step: a later add shows in this entry's snapshot too)."""
        if self.before is None:
            return ""
        waiting = [rid for rid in self.waiting_after if rid in self.before_known and rid not in self.preempted]
        if not waiting:
            return ""
        head = waiting[0]
        more = f" (and {len(waiting) - 1} more behind it)" if len(waiting) > 1 else ""
        if self.preempted:
            return f"{self.name(head)} waits{more}: a step that preempts admits no waiting request"
        left = self.budget - used
        seqs = self.budgets.get("max_num_seqs")
        running = len(self.before_running) + len(self.new)
        known = self.known_tokens(head) or 0
        if left <= 0:
            why = f"the {self.budget}-token budget is used up"
        elif seqs and running >= int(seqs):
            why = f"max_num_seqs={seqs} requests are running"
        elif self.budgets.get("scheduling_policy") == "prefill_first" and any(
                not s.get("is_prefill") for s in self.sched):
            why = "prefill_first runs prefill and decode in separate steps, and this one decodes"
        elif not self.budgets.get("enable_chunked_prefill", True) and known > left:
            why = f"its {known} tokens do not fit the {left} tokens left, and chunked prefill is off"
        else:
            free = int(((self.before.get("block_pool") or {}).get("num_free_blocks")) or 0)
            free -= len(self.blocks.get("allocated", []))
            full = self.budgets.get("scheduler_reserve_full_isl", True)
            need = _ceil_div(known if full else min(known, left), self.bs)
            if need <= free:
                return f"{self.name(head)} waits{more}"
            what = "its whole sequence" if full else "its first chunk"
            why = f"not enough free KV blocks for {what} ({known if full else min(known, left)} tokens need " \
                  f"{need} blocks, {max(0, free)} free)"
        return f"{self.name(head)} waits{more}: {why}"


def _quote(text: str | None, token_id: int | None) -> str:
    if text is None:
        return f"id {token_id}"
    return repr(str(text)).replace("\\n", "\u21b5")


# A memo's entry: an entry's record and snapshot, its predecessor's snapshot, and their caption.
_Hit = tuple[StepRecordDict | None, EngineSnapshotDict, EngineSnapshotDict | None, str]


class CaptionCache:
    """Captions of a growing history, each computed once: an entry's caption depends on its
    record, its snapshot and its predecessor's snapshot, held here and compared by identity
    (the Session replaces the latest snapshot when requests are added or aborted)."""

    def __init__(self, names: Callable[[str], str] | None = None) -> None:
        self._memo: dict[tuple[int, int, int], _Hit] = {}   # by the ids of a hit's first three
        self.names = names   # a request's name in the words (explorer.core.labels)

    def captions(self, entries: Sequence[Entry]) -> list[str]:
        """One caption per entry, as `history_captions` gives them."""
        memo: dict[tuple[int, int, int], _Hit] = {}
        out: list[str] = []
        prev: EngineSnapshotDict | None = None
        for entry in entries:
            out.append(self._one(entry, prev, memo))
            prev = _parts(entry)[1]
        self._memo = memo  # only the entries of this history stay
        return out

    def caption(self, entries: Sequence[Entry], index: int) -> str:
        """The caption of entries[index]."""
        if not entries:
            return EMPTY_HINT
        index = max(0, min(index, len(entries) - 1))
        prev = _parts(entries[index - 1])[1] if index > 0 else None
        return self._one(entries[index], prev, self._memo)

    def _one(self, entry: Entry, prev: EngineSnapshotDict | None, memo: dict[tuple[int, int, int], _Hit]) -> str:
        record, snapshot = _parts(entry)
        key = (id(record), id(snapshot), id(prev))
        hit = self._memo.get(key)
        if hit is None or hit[0] is not record or hit[1] is not snapshot or hit[2] is not prev:
            hit = (record, snapshot, prev, step_caption(record, snapshot, prev, self.names))
        memo[key] = hit
        return hit[3]
