"""The why-ledger: a Session's history read step by step into why each prompt token hit or missed
the prefix cache, which allocation evicted what, and why each preemption happened.

    ledger = WhyLedger().feed(session.history)      # or WhyLedger.follow(session)
    ledger.requests["3"].first.classes               # {'hit': 64, 'evicted': 32, 'below_block': 7, ...}
    print(ledger.summary().text())                   # "62% of missed prompt tokens were evicted; ..."

It reads only the history's shapes (records and snapshots), so it explains kvscope's engine,
vLLM in process and a live server alike. Within one step it follows the scheduler's order:
running requests first (their allocations may evict; their preemptions happen then), then each
admitted request in order: its lookup sees what the requests before it cached and evicted in
that same step, and nothing after.

Which block holds which content: a block cached in a step is found in the block table of the
request that holds it after the step (else in the step's batch, for a request that finished in
it), and gets that request's content key (explorer.why.chains) at that index; the engine's own
hash is kept beside it, so a block cached before the ledger started is known by its hash once
any request computes the same content.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Literal, NamedTuple

from engine.report.schema import BlockDict, EngineSnapshotDict, ScheduledDict, StepRecordDict

from ..core.history import HistoryEntry
from ..core.labels import kv_cache_group_label
from ..core.session_view import SessionView
from .chains import PLAIN, Domain, SeenIndex, Sequence
from .mamba import MambaCheckpoints, NearestCheckpoint
from .model import Admission, Divergence, Eviction, Node, PreemptionWhy, RequestWhy, Span
from .preemption import needing_request, work_of

if TYPE_CHECKING:
    from .summary import RunSummary

# One block event of a step, in the order `_apply` replays them: (kind, block id, what it held or
# will hold, the request that did it, the block's dict on the side of the step it is read from).
# An eviction names the content key it evicted (None: unknown) and the block before the step
# (None: past the pool's end); a caching the content key, or (a request's sequence, its block
# index) whose node is made when the event applies, and the block after the step.
Evicted = tuple[Literal["evicted"], int, bytes | None, str | None, BlockDict | None]
Cached = tuple[Literal["cached"], int, bytes | tuple[Sequence, int], str | None, BlockDict]


class WhyLedger:
    """Why each prompt token of a Session's history hit or missed the prefix cache, what evicted
    what, and why each preemption happened (the module docstring has the reading order)."""

    def __init__(self) -> None:
        self.requests: dict[str, RequestWhy] = {}
        self.seqs: dict[str, Sequence] = {}
        self.seen = SeenIndex()
        self.nodes: dict[bytes, Node] = {}
        self.by_hash: dict[str, bytes] = {}          # the engine's hash -> content key
        self.block_key: dict[int, bytes] = {}        # block id -> the content it holds now
        self.plain_domains: dict[bytes, set[Domain]] = {}    # content key without domain -> domains it was cached in
        self.freed_at: dict[int, tuple[int, float | None]] = {}   # block -> (step, wall time) it joined the free queue
        self.preemptions: list[PreemptionWhy] = []
        self.block_size: int | None = None
        self.first_step: int | None = None
        self.last_step: int | None = None
        self.notes: list[str] = []
        self.unmapped = 0                            # cached blocks whose content the ledger could not name
        self.engine: str | None = None
        self.mamba = MambaCheckpoints()                # a Mamba group's cached states (explorer.why.mamba)
        self._prev: EngineSnapshotDict | None = None
        self._finished_ids: set[str] = set()  # the finished queue's requests at the previous entry
        self._tokens_left_out = False
        self._evicted_now: set[int] = set()  # the blocks evicted so far in the step being read

    # -- reading a history -----------------------------------------------------------------------
    def feed(self, entries: Iterable[HistoryEntry]) -> WhyLedger:
        for e in entries:
            self.add(e)
        return self

    def add(self, entry: HistoryEntry) -> None:
        """One history entry (step, record, snapshot), in order; an entry already read is skipped."""
        step, record, snap = int(entry.step), entry.record, entry.snapshot
        if self.last_step is not None and step <= self.last_step and not _restarts(record):
            return
        if record is None or self._prev is None or self.last_step is None or _restarts(record):
            self._start(step, record, snap)
            return
        if step != self.last_step + 1:
            self.notes.append(f"steps {self.last_step + 1}-{step - 1} were not in the history: requests admitted "
                              "then are not explained, and blocks cached then are known only by their hash")
        self._step(step, record, snap)

    def follow(self, session: SessionView) -> Callable[[], None]:
        """Read `session`'s history now and every entry it applies from now on; returns the
        unsubscribe function."""
        def catch_up(event: str = "step", s: SessionView = session) -> None:
            if event == "reset":
                self.__init__()  # type: ignore[misc]
            if event in ("step", "reset"):
                self.feed(s.history)

        catch_up()
        return session.subscribe(catch_up)

    def _start(self, step: int, record: StepRecordDict | None, snap: EngineSnapshotDict) -> None:
        if record is not None and _restarts(record):
            self.notes.append(f"step {step}: the history started again ({_restarts(record)}); the ledger too")
            self.__init__()  # type: ignore[misc]
        self.first_step = self.first_step if self.first_step is not None else step
        self.last_step = step
        self.block_size = int(snap["block_pool"]["block_size"])
        self.engine = (snap.get("model_info") or {}).get("engine") or "kvscope"
        self._learn(snap)
        hashed = [b for b in snap["block_pool"]["blocks"] if b["hash"] is not None]
        if hashed or snap["queues"]["running"] or snap["queues"]["finished"]:
            self.notes.append(f"the ledger began at step {step}, after the engine had run ({len(hashed)} cached "
                              "blocks): a prefix cached before then counts as never seen until a request computes it "
                              "again")
        self._prev = snap

    # -- one step --------------------------------------------------------------------------------
    def _step(self, step: int, rec: StepRecordDict, snap: EngineSnapshotDict) -> None:
        prev = self._prev
        assert prev is not None
        self._evicted_now.clear()
        self._learn(snap)
        bs = self.block_size = int(snap["block_pool"]["block_size"])
        holders = _holders(snap, rec)
        new = list(rec.get("new_requests") or ())
        rank = {rid: i + 1 for i, rid in enumerate(new)}
        scheduled = {x["request_id"]: x for x in rec["scheduled"]}
        caching = _caching_on(rec, snap)
        events = self._events(rec, snap, prev, holders, rank)
        self._preempted(step, rec, prev, bs)
        # Running requests come first in the scheduler's order: what they computed and did to
        # blocks in this step precedes every admission's lookup.
        for rid, x in scheduled.items():
            if rid not in rank and rid in self.seqs:
                self.seen.computed(self.seqs[rid], int(x["num_computed_before"]) + int(x["num_tokens"]))
        self._apply(events.get(0, ()), step, rec)
        for rid in new:
            got = scheduled.get(rid)
            if got is not None and rid in self.seqs:
                self._admit(step, rid, got, rec, caching, _group_hits(snap, rid))
                self.seen.computed(self.seqs[rid], int(got["num_computed_before"]) + int(got["num_tokens"]))
            self._apply(events.get(rank[rid], ()), step, rec)
        self._settle(snap, prev, step, rec)
        mamba = _mamba_group(snap)
        if mamba is not None:
            self.mamba.read(mamba, rec, snap, bs)
        self.last_step = step
        self._prev = snap

    def _events(self, rec: StepRecordDict, snap: EngineSnapshotDict, prev: EngineSnapshotDict,
                holders: dict[int, tuple[str, int]], rank: dict[str, int]) -> dict[int, list[Evicted | Cached]]:
        """The step's evictions and cachings, by the rank of the request that did them (0: a
        running request, or unknown), evictions first within a rank (an allocation evicts, then
        the computed tokens fill the block)."""
        out: dict[int, list[Evicted | Cached]] = {}
        before = prev["block_pool"]["blocks"]
        after = snap["block_pool"]["blocks"]
        for b in rec["blocks"].get("evicted") or ():
            by = holders.get(b, (None, 0))[0]
            key = self.block_key.get(b)
            if key is None and b < len(before) and (h := before[b]["hash"]) is not None:
                key = self.by_hash.get(h)
            was = before[b] if b < len(before) else None
            out.setdefault(rank.get(by, 0) if by is not None else 0, []).append(("evicted", b, key, by, was))
        for b in rec["blocks"].get("cached") or ():
            rid, j = holders.get(b, (None, 0))
            seq = self.seqs.get(rid) if rid is not None else None
            what: bytes | tuple[Sequence, int] | None = None
            if seq is not None and (j + 1) * seq.block_size <= len(seq.tokens):
                what = (seq, j)   # its node is made when the event applies, in the scheduler's order
            elif (h := after[b]["hash"]) is not None:
                what = self.by_hash.get(h)
            if what is None:
                self.unmapped += 1
                continue
            out.setdefault(rank.get(rid, 0) if rid is not None else 0, []).append(("cached", b, what, rid, after[b]))
        for items in out.values():
            items.sort(key=lambda e: e[0] != "evicted")
        return out

    def _apply(self, events: Iterable[Evicted | Cached], step: int, rec: StepRecordDict) -> None:
        for ev in events:
            if ev[0] == "evicted":
                _, b, key, rid, before = ev
                self._unmap(b)
                self._evicted_now.add(b)
                if key is None:
                    continue
                free_step, free_wall = self.freed_at.get(b, (None, None))
                if before is not None and (before["ref_count"] or not before["is_free"]):
                    free_step, free_wall = step, rec.get("wall_time_s")   # in use before: freed in this step
                wall = rec.get("wall_time_s")
                self.nodes[key].evictions.append(Eviction(
                    step=step, block=b, hash=self.nodes[key].hash, by=rid, free_step=free_step,
                    lru_age_steps=None if free_step is None else step - free_step,
                    lru_age_s=None if free_wall is None or wall is None else max(0.0, wall - free_wall)))
            else:
                _, b, what, rid, block = ev
                node = self._node_of(*what) if isinstance(what, tuple) else self.nodes[what]
                node.stored.append(step)
                if block["hash"] is not None:
                    node.hash = block["hash"]
                    self.by_hash[block["hash"]] = node.key
                self._map(b, node.key)

    def _settle(self, snap: EngineSnapshotDict, prev: EngineSnapshotDict, step: int, rec: StepRecordDict) -> None:
        """After the step: blocks that lost their hash without an eviction (a cache reset), or that
        hold a hash the ledger knows from elsewhere; when each freed block joined the free queue."""
        after, before = snap["block_pool"]["blocks"], prev["block_pool"]["blocks"]
        if after is not before:
            for i, blk in enumerate(after):
                if i < len(before) and blk is before[i]:
                    continue
                if blk["hash"] is None:
                    self._unmap(i)
                elif i not in self.block_key and blk["hash"] in self.by_hash:
                    self._map(i, self.by_hash[blk["hash"]])
        for b in rec["blocks"].get("freed") or ():
            self.freed_at[b] = (step, rec.get("wall_time_s"))

    def _map(self, b: int, key: bytes) -> None:
        self._unmap(b)
        self.block_key[b] = key
        self.nodes[key].present += 1

    def _unmap(self, b: int) -> None:
        key = self.block_key.pop(b, None)
        if key is not None:
            self.nodes[key].present -= 1

    def _node_of(self, seq: Sequence, j: int) -> Node:
        key = seq.key(j)
        node = self.nodes.get(key)
        if node is None:
            node = self.nodes[key] = Node(key=key, parent=seq.key(j - 1) if j else None, depth=j,
                                          tokens=seq.block_tokens(j), domain=seq.domain, first_by=seq.request_id)
            self.plain_domains.setdefault(seq.plain_key(j), set()).add(seq.domain)
        return node

    # -- requests --------------------------------------------------------------------------------
    def _learn(self, snap: EngineSnapshotDict) -> None:
        """New requests' prompts and domains; the output tokens known now."""
        queues = snap["queues"]
        # New finishes by id, against the previous entry's queue: a Session keeping its latest
        # max_finished requests holds the queue's length still while requests keep finishing.
        finished = queues["finished"]
        fresh = [r for r in finished if r["request_id"] not in self._finished_ids]
        self._finished_ids = {r["request_id"] for r in finished}
        for r in (*queues["running"], *queues["waiting"], *fresh):
            rid = r["request_id"]
            seq = self.seqs.get(rid)
            if seq is None:
                if "prompt_token_ids" not in r:
                    if not self._tokens_left_out:
                        self._tokens_left_out = True
                        self.notes.append("the feed leaves token ids out (KVSCOPE_FEED_TOKENS=0): requests cannot "
                                          "be explained")
                    continue
                domain = (r.get("cache_salt"), r.get("lora_name"))
                seq = self.seqs[rid] = Sequence(rid, list(r["prompt_token_ids"]), domain, self.block_size or 1)
                self.requests[rid] = RequestWhy(rid, len(r["prompt_token_ids"]), domain)
            seq.grow(r.get("output_token_ids") or [])

    def _admit(self, step: int, rid: str, x: ScheduledDict, rec: StepRecordDict, caching: bool,
               group_hits: GroupHits | None = None) -> None:
        """`group_hits`: with several KV cache groups, the groups' hits when this admission took them."""
        seq, why = self.seqs[rid], self.requests[rid]
        resumed = bool(why.admissions)
        # The tokens its lookup covered: the prompt, or (re-admitted) every token known before this step.
        tokens = seq.prompt_len if not resumed else len(seq.tokens) - (1 if rid in (rec.get("sampled") or {}) else 0)
        hit = int(x["num_computed_before"])
        bs = seq.block_size
        shared, other = self.seen.longest(seq, tokens)
        lost = seq.lost if resumed else 0
        spans: list[Span] = []
        evictions: list[Eviction] = []

        def put(start: int, end: int, cls: str, detail: str = "") -> None:
            if start >= end:
                return
            if spans and spans[-1].cls == cls and spans[-1].detail == detail and spans[-1].end == start:
                spans[-1].end = end
            else:
                spans.append(Span(start, end, cls, detail))

        def by_position(start: int, end: int) -> None:
            """Tokens no cached block explains: shared with an earlier request or not."""
            if lost > start:
                put(start, min(end, lost), "recomputed", "computed before its preemption")
                start = min(end, lost)
            cut = max(start, min(end, shared))
            put(start, cut, "below_block" if caching else "caching_off",
                f"#{other} had tokens 0-{shared - 1}" if other is not None else "")
            put(cut, end, "never_seen")

        put(0, hit, "hit")
        # Blocks the full-attention group found but another group's shorter hit cut off: a sliding
        # window's own cause (the blocks left its window), a Mamba group's (no state cached within
        # them), or another kind of group's.
        cut_end = hit
        checkpoint = None
        if group_hits is not None and group_hits.shortest == hit < group_hits.full:
            cut_end, g = group_hits.full, group_hits
            said = f"full attention had tokens 0-{cut_end - 1} cached; the {g.label} group's hit ended at {hit}"
            if g.window:
                put(hit, cut_end, "left_window", f"{said}: it keeps a block only while its tokens are within the "
                                                 f"last {g.window} the request computed")
            elif g.kind == "mamba":
                checkpoint = self._mamba_cut(seq, hit, cut_end, said, put)
            else:
                put(hit, cut_end, "group_cut", said)
        hittable = (tokens - 1) // bs
        for j in range(cut_end // bs, hittable):
            start, end = max(hit, j * bs), (j + 1) * bs
            cls, detail, ev = self._missed_block(seq, j)
            if cls is None:
                by_position(start, end)
                continue
            if lost > start:   # its own blocks, lost by its preemption: that is the cause here
                put(start, end, "recomputed", "computed before its preemption")
                continue
            put(start, end, cls, detail)
            if ev is not None and ev not in evictions:
                evictions.append(ev)
        by_position(max(hit, hittable * bs), tokens)
        for j in range(hit // bs):
            node = self.nodes.get(seq.key(j))
            if node is not None:
                node.hits.append((step, rid))
        div = None
        if shared < tokens:
            o = self.seqs.get(other) if other is not None else None
            div = Divergence(position=shared, token=seq.tokens[shared], other_request=other,
                             other_token=o.tokens[shared] if o is not None and len(o.tokens) > shared else None,
                             shared=shared)
        a = Admission(step=step, tokens=tokens, hit=hit, resumed=resumed, classes=_count(spans), spans=spans,
                      evictions=evictions, divergence=div, seen=shared, seen_by=other, lost=lost,
                      checkpoint=checkpoint)
        if not caching:
            a.notes.append("prefix caching was off at this step")
        why.admissions.append(a)
        if resumed:
            seq.lost = 0
            for p in reversed(why.preemptions):
                if p.readmitted_step is None:
                    p.readmitted_step, p.recomputed_tokens = step, a.classes.get("recomputed", 0)
                    break

    def _mamba_cut(self, seq: Sequence, hit: int, end: int, said: str,
                   put: Callable[[int, int, str, str], None]) -> NearestCheckpoint | None:
        """Tokens [hit, end) that a Mamba group cut: up to a state it could have resumed from
        and whose block was evicted, evicted; the rest without a Mamba checkpoint, with the
        cached state the prompt came closest to (returned)."""
        start = hit
        gone = self.mamba.evicted_within(seq, self.seqs, self._prev, self._evicted_now, hit, end)
        if gone is not None:
            put(hit, gone.tokens, "evicted", f"{said}: its state after {gone.tokens} tokens (#{gone.request_id}'s) "
                                             "was cached, and its block was evicted")
            start = gone.tokens
        near = self.mamba.nearest(seq, self.seqs, self._prev, self._evicted_now, start, self._full_attention_cached())
        put(start, end, "no_mamba_checkpoint", f"{said}: align mode caches a state only where a prompt's chunk ended "
            "on a block boundary, and none cached lay within these tokens; " +
            (near.text() if near else "no earlier request's state is cached past them"))
        return near

    def _full_attention_cached(self) -> Callable[[Sequence, int], bool]:
        """Whether, at this point of the step, full attention holds a cached block of each whole
        block of a sequence's first tokens: the pool's hashes before the step but those evicted
        since and those of the Mamba states (a Mamba group's block of the same content has the
        same hash)."""
        blocks = self._prev["block_pool"]["blocks"] if self._prev is not None else []
        left_out = self.mamba.blocks(self._prev) | self._evicted_now
        full = {b["hash"] for b in blocks if b["hash"] is not None and b["block_id"] not in left_out}

        def cached_through(seq: Sequence, tokens: int) -> bool:
            return all((node := self.nodes.get(seq.key(j))) is not None and node.hash in full
                       for j in range(tokens // seq.block_size))
        return cached_through

    def _missed_block(self, seq: Sequence, j: int) -> tuple[str | None, str, Eviction | None]:
        """Why full block j of `seq` missed, from the blocks: (class, detail, the eviction), or
        (None, '', None) where no block explains it (then its tokens are classed by position)."""
        node = self.nodes.get(seq.key(j))
        if node is not None:   # cached before this lookup: it must have been evicted since
            if node.present > 0 or not node.evictions:
                return "evicted", "still cached, but a block before it in the prefix was evicted", None
            ev = node.evictions[-1]
            return "evicted", ev.text(), ev
        domains = self.plain_domains.get(seq.plain_key(j), set()) - {seq.domain}
        if domains:
            return "other_domain", "cached under " + ", ".join(_domain_text(d) for d in sorted(domains, key=repr)), None
        return None, "", None

    def _preempted(self, step: int, rec: StepRecordDict, prev: EngineSnapshotDict, bs: int) -> None:
        victims = list(rec.get("preempted") or ())
        if not victims:
            return
        running = {r["request_id"]: r for r in prev["queues"]["running"]}
        for_request, need = needing_request(prev, rec, bs)
        freed = set(rec["blocks"].get("freed") or ())
        for v in victims:
            r = running.get(v)   # None: not running before the step
            lost = int(r.get("num_computed_tokens") or 0) if r is not None else 0
            table = (r.get("block_table") or ()) if r is not None else ()
            if v in self.seqs:
                self.seqs[v].lost = lost
            p = PreemptionWhy(step=step, victim=v, lost_tokens=lost, for_request=for_request,
                              for_work=work_of(rec, for_request), needed_blocks=need,
                              free_blocks_before=int(prev["block_pool"]["num_free_blocks"]),
                              num_blocks=int(prev["block_pool"]["num_blocks"]), running_before=len(running),
                              freed_blocks=[b for b in table if b in freed])
            self.preemptions.append(p)
            if v in self.requests:
                self.requests[v].preemptions.append(p)

    # -- reading it ------------------------------------------------------------------------------
    def check(self) -> None:
        """Every request's classes sum to its tokens (RequestWhy.check)."""
        for why in self.requests.values():
            why.check()

    def summary(self, step: int | None = None) -> RunSummary:
        """The run's RunSummary (as it stood after `step`, when given)."""
        from .summary import RunSummary

        return RunSummary.of(self, step)


def _count(spans: list[Span]) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in spans:
        out[s.cls] = out.get(s.cls, 0) + s.end - s.start
    return out


class GroupHits(NamedTuple):
    """A request's hits in a model of several KV cache groups, when it was admitted."""

    full: int              # the full-attention group's own hit
    shortest: int          # the shortest group's (the request's hit)
    label: str             # that group's name
    window: int | None     # its sliding window, if it is a sliding-window group
    kind: str | None       # its kind (model_info's kv_cache_groups), None where the snapshot names none


def _group_hits(snap: EngineSnapshotDict, rid: str) -> GroupHits | None:
    """Request `rid`'s GroupHits in a snapshot of several KV cache groups (records:
    REQ.GROUP_HIT_TOKENS); None with one group."""
    hits = next((r.get("group_hit_tokens") for q in ("running", "finished", "waiting")
                 for r in snap["queues"][q] if r["request_id"] == rid), None)
    if not hits:
        return None
    groups = (snap.get("model_info") or {}).get("kv_cache_groups") or []
    g = min(range(len(hits)), key=lambda i: (hits[i], i))
    if g >= len(groups):
        return GroupHits(hits[0], hits[g], f"KV cache group {g}", None, None)
    return GroupHits(hits[0], hits[g], kv_cache_group_label(groups[g]), groups[g].get("sliding_window") or None,
                     groups[g].get("kind"))


def _mamba_group(snap: EngineSnapshotDict) -> int | None:
    """The index of the snapshot's Mamba KV cache group (None: it has none)."""
    groups = (snap.get("model_info") or {}).get("kv_cache_groups") or []
    return next((g for g, x in enumerate(groups) if x.get("kind") == "mamba"), None)


def _holders(snap: EngineSnapshotDict, rec: StepRecordDict) -> dict[int, tuple[str, int]]:
    """Block id -> (the request holding it after the step, its index in that request's table);
    blocks of requests that finished in the step from the step's batch, where its rows line up."""
    out: dict[int, tuple[str, int]] = {}
    running = {}
    for r in snap["queues"]["running"]:
        running[r["request_id"]] = r["block_table"]
        for j, b in enumerate(r["block_table"]):
            out.setdefault(b, (r["request_id"], j))
    tables = (rec.get("batch") or {}).get("block_tables") or []
    scheduled = rec["scheduled"]
    if tables and len(tables) == len(scheduled) and all(
            list(t[:len(running[x["request_id"]])]) == list(running[x["request_id"]])[:len(t)]
            for x, t in zip(scheduled, tables) if x["request_id"] in running):
        for x, table in zip(scheduled, tables):
            for j, b in enumerate(table):
                out.setdefault(b, (x["request_id"], j))
    return out


def _caching_on(rec: StepRecordDict, snap: EngineSnapshotDict) -> bool:
    budgets = rec.get("budgets") or {}
    if "enable_prefix_caching" in budgets:
        return bool(budgets["enable_prefix_caching"])
    return bool((snap.get("config") or {}).get("enable_prefix_caching", True))


def _restarts(record: StepRecordDict | None) -> str | None:
    if record is None:
        return None
    return (record.get("changes") or {}).get("restart")


def _domain_text(domain: Domain) -> str:
    salt, lora = domain
    if domain == PLAIN:
        return "no cache_salt"
    parts = ([f"cache_salt {salt!r}"] if salt else []) + ([f"LoRA {lora!r}"] if lora else [])
    return " and ".join(parts)
