"""The compact state of one vLLM engine core as the live feed keeps it (explorer/drivers/
vllm_live/mirror.py has the body format that moves it on): its requests (`Req`, with their
clocks and metrics), its pool's refcounts and hashes, the queues, the schedules whose update is
still to come (`Sched`), and the whole state on the wire for a client that joins (wire.py's
`MirrorWire`, a typed struct decoded as such by protocol.decode_snapshot).

mirror.py's `Mirror` applies bodies to it, mirror_expand.py's `Expander` spells it as the
schema's dicts; this file is what both read."""
from __future__ import annotations

from collections import deque
from typing import Self

from engine.report.changes import Sent
from engine.report.schema import (
    INFO,
    REQ,
    RMETRICS,
    ClockDict,
    RequestDict,
    RequestMetricsDict,
)
from engine.request import ClockEvents

from .wire import ClockState, MirrorWire, PendingState, RequestState, Scheduled

COUNTERS = ("prefix_cache_hits", "prefix_cache_queries", "num_preemptions", "num_generated_tokens",
            "num_prompt_tokens_computed")


DEFER_AT_MOST = 256   # deferred decode steps held at most (then settled): memory stays small
NO_BLOCKS = 1 << 62   # a touched request whose blocks did not change (only its outputs or times did)


class Clock:
    """One clock of a request's event times, shaped as engine.request.ClockEvents (what
    engine.report.changes reads), with the first token's time taken from the token times."""

    __slots__ = ("arrival_time", "finished_time", "first_scheduled_time", "preempted_times", "token_times")

    def __init__(self) -> None:
        self.arrival_time: float | None = None
        self.first_scheduled_time: float | None = None
        self.finished_time: float | None = None
        self.token_times: list[float] = []
        self.preempted_times: list[float] = []

    @property
    def first_token_time(self) -> float | None:
        return self.token_times[0] if self.token_times else None

    def to_dict(self) -> ClockDict:
        return ClockEvents(self.arrival_time, self.first_scheduled_time, self.first_token_time, list(self.token_times),
                           list(self.preempted_times), self.finished_time).to_dict()

    def to_wire(self) -> ClockState:
        return ClockState(self.arrival_time, self.first_scheduled_time, self.finished_time, self.token_times,
                          self.preempted_times)

    def from_wire(self, w: ClockState) -> None:
        self.arrival_time, self.first_scheduled_time, self.finished_time = (w.arrival_time, w.first_scheduled_time,
                                                                              w.finished_time)
        self.token_times, self.preempted_times = list(w.token_times), list(w.preempted_times)


class Metrics:
    """A request's two clocks (engine.request.RequestMetrics' shape)."""

    __slots__ = ("engine", "wall")

    def __init__(self) -> None:
        self.engine, self.wall = Clock(), Clock()

    def to_dict(self) -> RequestMetricsDict:
        return {RMETRICS.ENGINE: self.engine.to_dict(), RMETRICS.WALL: self.wall.to_dict()}


class Req:
    """One request as the feed knows it (vLLM's Request stays in the server)."""

    __slots__ = (
        "cached",
        "chunks",
        "computed",
        "domain",
        "finish_reason",
        "frozen",
        "group_hits",
        "group_tables",
        "hashes",
        "idx",
        "max_tokens",
        "metrics",
        "n_hidden",
        "n_prompt",
        "output",
        "params",
        "preemptions",
        "prompt",
        "rid",
        "runner_tables",
        "status",
        "stop",
        "table",
        "te",
        "tw",
    )

    def __init__(self, idx: int, rid: str, prompt: list[int], n_prompt: int, max_tokens: int, params: dict,
                 stop: list[str], hashes: list[str], domain: dict | None = None) -> None:
        self.idx, self.rid, self.prompt, self.n_prompt = idx, rid, prompt, n_prompt
        self.output: list[int] = []
        self.n_hidden = 0   # outputs counted but not held (token ids left out of the feed)
        self.max_tokens, self.params, self.stop, self.hashes = max_tokens, params, stop, hashes
        # priority, and cache_salt / lora_name where set: RequestDict's keys, sent once
        self.domain: dict = domain if domain is not None else {REQ.PRIORITY: 0}
        self.status = "waiting"
        self.computed = self.cached = self.preemptions = self.chunks = 0
        self.finish_reason: str | None = None
        self.table: list[int] = []
        self.group_tables: list[list[int]] = []  # several KV cache groups: its table in each past the first
        self.group_hits: list[int] | None = None  # and each group's own hit at its admission
        # ... and its tables there as vLLM's model runner holds them, which the step's slots read:
        # only ever extended (where the scheduler put the null block for tokens that left a
        # sliding window, the runner keeps the block it had, which no attention reads any more).
        self.runner_tables: list[list[int]] = []
        self.metrics = Metrics()
        self.frozen: RequestDict | None = None
        self.tw, self.te = self.metrics.wall.token_times, self.metrics.engine.token_times  # the hot path's handles

    @property
    def n_output(self) -> int:
        return len(self.output) + self.n_hidden

    def tokens(self, start: int = 0, end: int | None = None) -> list[int]:
        """Its token ids [start, end): the prompt's, then the outputs'."""
        prompt, n = self.prompt, len(self.prompt)
        end = n + len(self.output) if end is None else end
        if end <= n:
            return prompt[start:end]
        if start >= n:
            return self.output[start - n:end - n]
        return prompt[start:] + self.output[:end - n]

    # -- the wire ----------------------------------------------------------------------------
    def to_wire(self) -> RequestState:
        m = self.metrics
        return RequestState(self.idx, self.rid, self.prompt, self.n_prompt, self.output, self.n_output,
                            self.max_tokens, self.params, self.stop, self.hashes, self.status, self.computed,
                            self.cached, self.preemptions, self.finish_reason, self.table, self.chunks,
                            m.engine.to_wire(), m.wall.to_wire(), self.domain, self.group_tables, self.group_hits,
                            self.runner_tables)

    @classmethod
    def from_wire(cls, w: RequestState) -> Req:
        r = cls(w.idx, w.request_id, list(w.prompt), w.num_prompt, w.max_tokens, w.sampling_params, list(w.stop),
                list(w.prompt_hashes), dict(w.domain))
        r.output = list(w.output)
        r.n_hidden = w.num_output - len(r.output)
        r.status, r.computed, r.cached, r.preemptions = w.status, w.computed, w.cached, w.preemptions
        r.finish_reason, r.table, r.chunks = w.finish_reason, list(w.table), w.chunks
        r.group_tables, r.group_hits = [list(t) for t in w.group_tables], w.group_hits
        r.runner_tables = [list(t) for t in w.runner_tables]
        r.metrics.engine.from_wire(w.engine_clock)
        r.metrics.wall.from_wire(w.wall_clock)
        r.tw, r.te = r.metrics.wall.token_times, r.metrics.engine.token_times
        return r


def stamp(m: Metrics, event: str, wall: float, engine: float) -> None:
    """An event's time on both clocks, the first time it happens."""
    if getattr(m.wall, event) is None:
        setattr(m.wall, event, wall)
    if getattr(m.engine, event) is None:
        setattr(m.engine, event, engine)


class MirrorState:
    """One engine core's state (see the module doc); `Mirror` moves it on. `tokens` False: the
    feed carries counts instead of token ids (KVSCOPE_FEED_TOKENS=0).

    `defer_decodes` (the recorder's copy, which is read only when a client joins): a step in
    which every request decoded one token is kept as two lists, and its tokens and times reach
    the requests in runs of such steps, one extend per request and run instead of three
    appends per request and step, before anything reads them (`settle`)."""

    def __init__(self, config: dict, model_info: dict, *, null_block: int = 0, num_free: int | None = None,
                 finished_keep: int | None = 256, tokens: bool = True, defer_decodes: bool = False) -> None:
        self.config, self.model_info = config, model_info
        self.block_size = int(config["block_size"])
        n = int(config["num_kv_blocks"])
        self.null_block = null_block
        self.other_groups = max(0, len(model_info.get(INFO.KV_CACHE_GROUPS) or []) - 1)  # past kvscope's first
        self.tokens = tokens
        self.requests: dict[int, Req] = {}
        self.running: list[int] = []
        self.waiting: list[int] = []
        self.finished: deque[Req] = deque(maxlen=finished_keep)
        self.ref = [0] * n
        self.hash: list[str | None] = [None] * n
        self.memo: dict[int, tuple[str, list[int]]] = {}   # block -> (hash, the tokens it was hashed with)
        self.num_free = n - 1 if num_free is None else num_free
        self.usage = 0.0
        self.step_count = 0
        self.engine_time = 0.0
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.pending: dict[int, Sched] = {}   # scheduled, not yet updated (async scheduling)
        self.scheduled_ahead: int | None = None  # the step whose allocations the state already holds
        self._gone: dict[int, Req] = {}        # finished requests a pending schedule still names
        self.sent: Sent | None = None          # what the consumer holds (expanding side only)
        self.defer_decodes = defer_decodes
        self._decodes: list[tuple[list[int], list[int], float, float]] = []  # (ids, tokens, wall, engine)
        self._memo_due: list[tuple[int, str, Req, int]] = []  # (block, hash, request, table index), after them
        # The last scheduled batch: its request indices, its Reqs, their prompt lengths less one.
        self._rows: tuple[list[int], list[Req], list[int]] = ([], [], [])

    def _req(self, idx: int) -> Req:
        """A request by its index, finished ones a pending schedule still names included."""
        return self.requests.get(idx) or self._gone[idx]

    def settle(self) -> None:
        """Give the requests the decode steps deferred so far (`defer_decodes`), a run of steps
        over the same requests at a time, then the tokens of the blocks hashed meanwhile."""
        log = self._decodes
        if log:
            self._decodes = []
            reqs = self.requests
            start = 0
            for end in range(1, len(log) + 1):
                if end < len(log) and log[end][0] == log[start][0]:
                    continue
                run = log[start:end]
                walls, engines = [e[2] for e in run], [e[3] for e in run]
                for req, new in zip(map(reqs.get, run[0][0]), zip(*[e[1] for e in run])):
                    if req is not None:
                        req.output += new
                        req.tw += walls
                        req.te += engines
                start = end
        if self._memo_due:
            bs, memo = self.block_size, self.memo
            for b, h, req, i in self._memo_due:
                memo[b] = (h, req.tokens(i * bs, (i + 1) * bs))
            self._memo_due = []

    # -- the wire ----------------------------------------------------------------------------------
    def to_wire(self) -> MirrorWire:
        """The whole state, for a joining client (`from_wire` rebuilds it)."""
        self.settle()
        return MirrorWire(self.config, self.model_info, self.null_block, self.tokens, self.finished.maxlen,
                          self.step_count, self.engine_time, self.counters, self.usage, self.num_free, self.ref,
                          self.hash, [(b, h, t) for b, (h, t) in self.memo.items()],
                          [r.to_wire() for r in self.requests.values()], [r.to_wire() for r in self.finished],
                          self.running, self.waiting,
                          [PendingState(sid, s.op, s.before, list(s.admitted), s.known, s.decode, s.chunk, s.tables,
                                        s.runner_tables) for sid, s in self.pending.items()],
                          [r.to_wire() for r in self._gone.values()])

    @classmethod
    def from_wire(cls, w: MirrorWire) -> Self:
        m = cls(w.config, w.model_info, null_block=w.null_block, num_free=w.free,
                finished_keep=w.finished_keep, tokens=w.tokens)
        m.step_count, m.engine_time, m.counters, m.usage = w.step, w.engine_time, dict(w.counters), w.usage
        m.ref, m.hash = list(w.ref), list(w.hash)
        m.memo = {b: (h, list(t)) for b, h, t in w.memo}
        for rw in w.requests:
            r = Req.from_wire(rw)
            m.requests[r.idx] = r
        m.finished.extend(Req.from_wire(rw) for rw in w.finished)
        m._gone = {r.idx: r for r in map(Req.from_wire, w.gone)}
        m.running, m.waiting = list(w.running), list(w.waiting)
        for p in w.pending:
            m.pending[p.sid] = Sched(p.op, list(p.before), set(p.admitted), dict(p.known), list(p.decode),
                                     dict(p.chunk), {i: list(t) for i, t in p.tables.items()},
                                     {i: [list(t) for t in ts] for i, ts in p.runner_tables.items()})
        m.scheduled_ahead = (m.step_count + 1) if m.pending else None
        return m


class Sched:
    """A schedule whose update is still to come: vLLM's SchedulerOutput in compact form (`op`),
    and what was derived from it when it was applied, row by row (for its record)."""

    __slots__ = ("_names", "admitted", "ahead_of", "before", "chunk", "decode", "known", "op", "order",
                 "placeholders", "runner_tables", "step", "tables")

    def __init__(self, op: Scheduled, before: list, admitted: set, known: dict, decode: list, chunk: dict,
                 tables: dict | None = None, runner_tables: dict | None = None) -> None:
        self.op, self.order, self.before, self.admitted = op, op.order, before, admitted
        self.known, self.decode, self.chunk = known, decode, chunk
        self.tables: dict[int, list[int]] = tables or {}   # tables reset before the record: as they ran
        self.runner_tables: dict[int, list[list[int]]] = runner_tables or {}   # the other groups' too
        self._names: set[int] | None = None
        # Async scheduling, on the expanding side: the schedule still in flight when this one was
        # made (its record clears it), the step number its update got, and this schedule's decode
        # inputs that were placeholders for the tokens in flight (request -> output index).
        self.ahead_of: Sched | None = None
        self.step: int | None = None
        self.placeholders: dict[int, int] = {}

    @property
    def names(self) -> set[int]:
        """The requests it scheduled or preempted (its record reads both, even once aborted)."""
        if self._names is None:
            self._names = {*self.order, *self.op.preempted}
        return self._names


class Update:
    """A schedule's update as a body carries it ("u": see mirror.py), kept until its record is built."""

    __slots__ = (
        "events",
        "finished",
        "finished_ids",
        "ids",
        "new_tokens",
        "sched",
        "schedule_s",
        "step_s",
        "update_s",
        "wall",
    )

    def __init__(self, sched, wall, step_s, schedule_s, update_s, ids, new_tokens, finished, events) -> None:
        self.sched, self.wall, self.step_s, self.schedule_s, self.update_s = sched, wall, step_s, schedule_s, update_s
        self.ids, self.new_tokens, self.finished, self.events = ids, new_tokens, finished, events
        self.finished_ids: list[str] = []


class BodyStep:
    """What one body touched, as it is applied."""

    __slots__ = ("finished", "gone", "touched", "update")

    def __init__(self) -> None:
        self.touched: dict[int, int] = {}   # request -> first table index whose block may hold new tokens
        self.finished: list[Req] = []
        self.gone: dict[int, Req] = {}
        self.update: Update | None = None
