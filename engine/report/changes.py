"""A step's changes: the one way a history of snapshots is built, for every engine.

Each StepRecord carries `changes` (schema.ChangesDict): what the step changed in the engine's
state since the previous *refresh point* (the previous step, or the last `take_changes()`
after a between-step action). Whoever holds the snapshot of that refresh point gets the next
one with `apply(snapshot, changes)`:

    snap[k + 1] = apply(snap[k], record_k_plus_1["changes"])

The producers are kvscope's engine (engine/report/change_notes.py's ChangeNotes), vLLM in
process (explorer/drivers/vllm/changes.py) and the server's recorder
(explorer/drivers/vllm_live/mirror_expand.py); the consumers are the Session (its history) and
the live feed's client. A change costs O(what the step touched):

- `requests`: each request the step touched that has not finished, as its small fields plus
  its growing lists as tails (`output_from` / `output_tail`, `table_from` / `table_tail`,
  each clock's `token_times` likewise); what never changes (the prompt, its text, max_tokens,
  the sampling parameters) comes once, the first time the consumer sees the request.
- `decodes` (optional): the step's plain decodes as columns, a row each: requests the consumer
  holds after their first token, to which the step added one output token and its time on
  each clock and changed nothing else but the computed count and the text (`Sent.decoded`).
- `queues`: the waiting and running request ids in order; `finished`: the requests that
  finished since, whole, once each (the consumer appends them to its finished queue).
- `blocks`: the dict of every block whose dict changed; `owners` is derived here from the
  running requests' block tables (in queue order, as a whole snapshot lists them).
- `num_free_blocks`, `metrics`, and `config` / `model_info` when they changed.
- `snapshot` (with `restart` when the history must start again): the whole state instead,
  where the producer cannot say what changed (a live feed that missed steps, a new server run).

`apply` never changes what its input holds: every part a step left alone is the same object
in the snapshot before and after it, so a history of snapshots shares what did not change, and
a growing list is a `ListPrefix` view, whose list the next step's tail extends past the end
the older views read.
A tail that does not fit the state held raises `OutOfStep`, never a silent guess.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import pairwise
from typing import TypeVar, cast

from ..request import ClockEvents, RequestMetrics, clock_dict, time_per_output_token
from .list_prefix import ListPrefix
from .schema import (
    BLOCK,
    CCHANGE,
    CHANGES,
    CLOCK,
    DECODES,
    POOL,
    QUEUE,
    RCHANGE,
    REQ,
    RMETRICS,
    SNAP,
    BlockPoolDict,
    ChangesDict,
    ClockChangeDict,
    ClockDict,
    DecodesDict,
    EngineSnapshotDict,
    QueuesDict,
    RequestChangeDict,
    RequestDict,
    RequestFieldsDict,
)

CLOCKS = (RMETRICS.ENGINE, RMETRICS.WALL)
# What a request change carries only the first time the consumer sees the request.
# The hash domain (vLLM's cache_salt, the LoRA adapter's name) only where the request has one.
HASH_DOMAIN = (REQ.CACHE_SALT, REQ.LORA_NAME)
FIRST_SEEN = (REQ.PROMPT_TOKEN_IDS, REQ.PROMPT_TEXT, REQ.MAX_TOKENS, REQ.SAMPLING_PARAMS, REQ.PRIORITY, *HASH_DOMAIN)
T = TypeVar("T")


class OutOfStep(ValueError):
    """Changes that do not fit the snapshot they are applied to (a step was missed)."""


# -- the consumer side -------------------------------------------------------------------------
def apply(snapshot: EngineSnapshotDict, changes: ChangesDict) -> EngineSnapshotDict:
    """The snapshot after `changes`, from `snapshot` (the state at the previous refresh point).
    Parts the changes leave alone are `snapshot`'s own objects; `snapshot` is not modified."""
    whole = changes.get(CHANGES.SNAPSHOT)
    if whole is not None:
        return whole
    queues = snapshot[SNAP.QUEUES]
    known = {r[REQ.REQUEST_ID]: r for r in (*queues[QUEUE.WAITING], *queues[QUEUE.RUNNING])}
    finished = queues[QUEUE.FINISHED]
    if changes[CHANGES.FINISHED]:
        finished = finished + [_keep_unchanging(r, known.get(r[REQ.REQUEST_ID])) for r in changes[CHANGES.FINISHED]]
    for rid, change in changes[CHANGES.REQUESTS].items():
        known[rid] = _request(known.get(rid), change, rid)
    decodes = changes.get(CHANGES.DECODES)
    if decodes is not None:
        for row in zip(decodes[DECODES.REQUEST_IDS], decodes[DECODES.NUM_COMPUTED_TOKENS],
                       decodes[DECODES.OUTPUT_TOKENS], decodes[DECODES.OUTPUT_TEXTS],
                       decodes[DECODES.ENGINE_TOKEN_TIMES], decodes[DECODES.WALL_TOKEN_TIMES], strict=True):
            old = known.get(row[0])
            if old is None:
                raise OutOfStep(f"request {row[0]} decoded, but the state held does not have it")
            known[row[0]] = _decoded(old, *row[1:])
    order = changes[CHANGES.QUEUES]
    try:
        waiting = [known[rid] for rid in order[QUEUE.WAITING]]
        running = [known[rid] for rid in order[QUEUE.RUNNING]]
    except KeyError as exc:
        raise OutOfStep(f"request {exc.args[0]} is queued but was never announced") from None
    pool = snapshot[SNAP.BLOCK_POOL]
    blocks = pool[POOL.BLOCKS]
    changed = changes[CHANGES.BLOCKS]
    if changed:
        blocks = list(blocks)
        owners = _owners(running, {b[BLOCK.BLOCK_ID] for b in changed})
        for b in changed:
            i = b[BLOCK.BLOCK_ID]
            if not 0 <= i < len(blocks):
                raise OutOfStep(f"block {i} is outside the pool of {len(blocks)}")
            blocks[i] = {**b, BLOCK.OWNERS: owners.get(i, [])}
    waiting, running = _same_or(waiting, queues[QUEUE.WAITING]), _same_or(running, queues[QUEUE.RUNNING])
    unmoved = (waiting is queues[QUEUE.WAITING] and running is queues[QUEUE.RUNNING]
               and finished is queues[QUEUE.FINISHED])
    new_queues: QueuesDict = queues if unmoved else \
        {QUEUE.WAITING: waiting, QUEUE.RUNNING: running, QUEUE.FINISHED: finished}
    free = changes[CHANGES.NUM_FREE_BLOCKS]
    new_pool: BlockPoolDict = pool if blocks is pool[POOL.BLOCKS] and free == pool[POOL.NUM_FREE_BLOCKS] else \
        {**pool, POOL.NUM_FREE_BLOCKS: free, POOL.BLOCKS: blocks}
    return {SNAP.STEP: changes[CHANGES.STEP],
            SNAP.CONFIG: changes.get(CHANGES.CONFIG, snapshot[SNAP.CONFIG]),
            SNAP.MODEL_INFO: changes.get(CHANGES.MODEL_INFO, snapshot[SNAP.MODEL_INFO]),
            SNAP.METRICS: changes[CHANGES.METRICS], SNAP.QUEUES: new_queues, SNAP.BLOCK_POOL: new_pool}


def _keep_unchanging(finished: RequestDict, old: RequestDict | None) -> RequestDict:
    """A finished request's dict, sharing what never changes (its prompt, the sampling
    parameters) with its dict before it finished."""
    if old is None:
        return finished
    shared = finished
    if old[REQ.PROMPT_TOKEN_IDS] is not finished[REQ.PROMPT_TOKEN_IDS] and \
            old[REQ.PROMPT_TOKEN_IDS] == finished[REQ.PROMPT_TOKEN_IDS]:
        shared = {**shared, REQ.PROMPT_TOKEN_IDS: old[REQ.PROMPT_TOKEN_IDS]}
    if old[REQ.SAMPLING_PARAMS] is not finished[REQ.SAMPLING_PARAMS] and \
            old[REQ.SAMPLING_PARAMS] == finished[REQ.SAMPLING_PARAMS]:
        shared = {**shared, REQ.SAMPLING_PARAMS: old[REQ.SAMPLING_PARAMS]}
    return shared


def _same_or(new: list[T], old: list[T]) -> list[T]:
    """`old` itself when `new` holds the same objects in the same order (nothing moved)."""
    return old if len(new) == len(old) and all(a is b for a, b in zip(new, old)) else new


def _request(old: RequestDict | None, change: RequestChangeDict, rid: str) -> RequestDict:
    """The request dict after a change: what the change leaves out (the prompt, the sampling
    parameters, the texts) is kept from `old`; the growing lists continue `old`'s."""
    prev = old if old is not None else _first_appearance(change, rid)
    clocks, prev_metrics = change[RCHANGE.CLOCKS], prev[REQ.METRICS]
    new: RequestDict = {
        **prev,
        REQ.REQUEST_ID: change[RCHANGE.REQUEST_ID], REQ.STATUS: change[RCHANGE.STATUS],
        REQ.NUM_COMPUTED_TOKENS: change[RCHANGE.NUM_COMPUTED_TOKENS],
        REQ.NUM_CACHED_TOKENS: change[RCHANGE.NUM_CACHED_TOKENS],
        REQ.NUM_PREEMPTIONS: change[RCHANGE.NUM_PREEMPTIONS], REQ.FINISH_REASON: change[RCHANGE.FINISH_REASON],
        # Announced once, but a producer may announce a request again: the latest word counts.
        REQ.PROMPT_TOKEN_IDS: change.get(RCHANGE.PROMPT_TOKEN_IDS, prev[REQ.PROMPT_TOKEN_IDS]),
        REQ.PROMPT_TEXT: change.get(RCHANGE.PROMPT_TEXT, prev[REQ.PROMPT_TEXT]),
        REQ.MAX_TOKENS: change.get(RCHANGE.MAX_TOKENS, prev[REQ.MAX_TOKENS]),
        REQ.SAMPLING_PARAMS: change.get(RCHANGE.SAMPLING_PARAMS, prev[REQ.SAMPLING_PARAMS]),
        REQ.PRIORITY: change.get(RCHANGE.PRIORITY, prev[REQ.PRIORITY]),
        REQ.OUTPUT_TEXT: change.get(RCHANGE.OUTPUT_TEXT, prev[REQ.OUTPUT_TEXT]),
        REQ.OUTPUT_TOKEN_IDS: _continued(prev[REQ.OUTPUT_TOKEN_IDS], change[RCHANGE.OUTPUT_FROM],
                                         change[RCHANGE.OUTPUT_TAIL], f"request {rid}: {REQ.OUTPUT_TOKEN_IDS}"),
        REQ.BLOCK_TABLE: _continued(prev[REQ.BLOCK_TABLE], change[RCHANGE.TABLE_FROM], change[RCHANGE.TABLE_TAIL],
                                    f"request {rid}: {REQ.BLOCK_TABLE}"),
        REQ.METRICS: {RMETRICS.ENGINE: _clock(prev_metrics[RMETRICS.ENGINE], clocks[RMETRICS.ENGINE], rid),
                      RMETRICS.WALL: _clock(prev_metrics[RMETRICS.WALL], clocks[RMETRICS.WALL], rid)}}
    if RCHANGE.NUM_PROMPT_TOKENS in change:  # token ids left out: the counts instead
        new[REQ.NUM_PROMPT_TOKENS] = change[RCHANGE.NUM_PROMPT_TOKENS]
    if RCHANGE.NUM_OUTPUT_TOKENS in change:
        new[REQ.NUM_OUTPUT_TOKENS] = change[RCHANGE.NUM_OUTPUT_TOKENS]
    if RCHANGE.GROUP_BLOCK_TABLES in change:  # several KV cache groups: their tables come whole
        new[REQ.GROUP_BLOCK_TABLES] = change[RCHANGE.GROUP_BLOCK_TABLES]
    if RCHANGE.GROUP_HIT_TOKENS in change:
        new[REQ.GROUP_HIT_TOKENS] = change[RCHANGE.GROUP_HIT_TOKENS]
    return new


def _decoded(old: RequestDict, num_computed_tokens: int, token: int, text: str, engine_time: float,
             wall_time: float) -> RequestDict:
    """The request dict after a plain decode (DecodesDict): one more output token, its time on
    each clock; the rest is `old`'s."""
    output, metrics = old[REQ.OUTPUT_TOKEN_IDS], old[REQ.METRICS]
    return {**old, REQ.NUM_COMPUTED_TOKENS: num_computed_tokens, REQ.OUTPUT_TEXT: text,
            REQ.OUTPUT_TOKEN_IDS: ListPrefix.continued(output, len(output), (token,)),
            REQ.METRICS: {RMETRICS.ENGINE: _ticked(metrics[RMETRICS.ENGINE], engine_time),
                          RMETRICS.WALL: _ticked(metrics[RMETRICS.WALL], wall_time)}}


def _ticked(old: ClockDict, time: float) -> ClockDict:
    """One clock's dict after one more token at `time`: its times and their gaps continued, and
    the mean gap with them; its event times, and the latencies read from them, are `old`'s (a
    plain decode moves none of them)."""
    before, gaps = old[CLOCK.TOKEN_TIMES], old[CLOCK.INTER_TOKEN_LATENCY]
    times = ListPrefix.continued(before, len(before), (time,))
    if not before or len(gaps) != len(before) - 1:   # gaps that do not continue the times: derived from them
        return clock_dict(old[CLOCK.ARRIVAL_TIME], old[CLOCK.FIRST_SCHEDULED_TIME], old[CLOCK.FIRST_TOKEN_TIME],
                          times, old[CLOCK.PREEMPTED_TIMES], old[CLOCK.FINISHED_TIME])
    itl = ListPrefix.continued(gaps, len(gaps), (time - before[-1],))
    return {**old, CLOCK.TOKEN_TIMES: times, CLOCK.INTER_TOKEN_LATENCY: itl,
            CLOCK.TIME_PER_OUTPUT_TOKEN: time_per_output_token(times, itl)}


def _first_appearance(change: RequestChangeDict, rid: str) -> RequestDict:
    """A request new to the consumer, before its first change: what that change announces
    once (FIRST_SEEN), nothing computed, no event times."""
    if any(key not in change for key in FIRST_SEEN if key not in HASH_DOMAIN):
        raise OutOfStep(f"request {rid} changed, but its first appearance was missed")
    first: RequestDict = {REQ.REQUEST_ID: change[RCHANGE.REQUEST_ID], REQ.STATUS: change[RCHANGE.STATUS],
            REQ.PROMPT_TOKEN_IDS: change[RCHANGE.PROMPT_TOKEN_IDS], REQ.OUTPUT_TOKEN_IDS: [],
            REQ.PROMPT_TEXT: change[RCHANGE.PROMPT_TEXT], REQ.OUTPUT_TEXT: "", REQ.NUM_COMPUTED_TOKENS: 0,
            REQ.NUM_CACHED_TOKENS: 0, REQ.BLOCK_TABLE: [], REQ.NUM_PREEMPTIONS: 0, REQ.FINISH_REASON: None,
            REQ.MAX_TOKENS: change[RCHANGE.MAX_TOKENS], REQ.SAMPLING_PARAMS: change[RCHANGE.SAMPLING_PARAMS],
            REQ.PRIORITY: change[RCHANGE.PRIORITY],
            REQ.METRICS: {RMETRICS.ENGINE: ClockEvents().to_dict(), RMETRICS.WALL: ClockEvents().to_dict()}}
    if RCHANGE.CACHE_SALT in change:
        first[REQ.CACHE_SALT] = change[RCHANGE.CACHE_SALT]
    if RCHANGE.LORA_NAME in change:
        first[REQ.LORA_NAME] = change[RCHANGE.LORA_NAME]
    return first


def _continued(before: Sequence[T], start: int, tail: Sequence[T], what: str) -> Sequence[T]:
    """`before` continued by a tail from `start`: a view of the list consecutive snapshots
    share (list_prefix.py), so a step costs its tail, never the list's length."""
    if len(before) < start:
        raise OutOfStep(f"{what} continues at {start}, the state held has {len(before)}")
    if not tail and start == len(before):
        return before  # nothing new: keep sharing the list
    return ListPrefix.continued(before, start, tail)


def _clock(old: ClockDict, change: ClockChangeDict, rid: str) -> ClockDict:
    """The clock's metrics dict (ClockEvents.to_dict, the latencies derived) after a change: the
    gaps between token times continue the old ones where the times do."""
    before = old[CLOCK.TOKEN_TIMES]
    start = change[CCHANGE.TOKEN_TIMES_FROM]
    times = _continued(before, start, change[CCHANGE.TOKEN_TIMES_TAIL], f"request {rid}: {CLOCK.TOKEN_TIMES}")
    gaps = old[CLOCK.INTER_TOKEN_LATENCY]
    if times is not before:
        # The old gaps are kept where the times continue them; the rest are derived from the times.
        kept = len(gaps) if 0 < start == len(before) and len(gaps) == start - 1 else 0
        gaps = ListPrefix.continued(gaps, kept, [b - a for a, b in pairwise(times[kept:])])
    return clock_dict(change[CCHANGE.ARRIVAL_TIME], change[CCHANGE.FIRST_SCHEDULED_TIME],
                      change[CCHANGE.FIRST_TOKEN_TIME], times, list(change[CCHANGE.PREEMPTED_TIMES]),
                      change[CCHANGE.FINISHED_TIME], gaps)


def _owners(running: list[RequestDict], wanted: set[int]) -> dict[int, list[str]]:
    """For the blocks in `wanted`: the running requests whose block table holds them, in queue order."""
    owners: dict[int, list[str]] = {}
    for r in running:
        for table in (r[REQ.BLOCK_TABLE], *r.get(REQ.GROUP_BLOCK_TABLES, ())):  # every KV cache group's
            # A table holds a block once (the null block aside, which has no owner): the set
            # walks each table in C, where a loop here cost O(every block held) in Python a step.
            for b in wanted.intersection(table):
                if b != 0:
                    owners.setdefault(b, []).append(r[REQ.REQUEST_ID])
    return owners


# -- the producer side -------------------------------------------------------------------------
_FIRST_SEEN = frozenset(FIRST_SEEN)


class _Held:
    """What the consumer holds of one request: its growing lists' lengths, and its state
    (status, cached tokens, preemptions) as last sent (None: not said, as after a whole snapshot)."""

    __slots__ = ("engine_times", "outputs", "state", "table", "wall_times")

    def __init__(self, outputs: int = 0, table: int = 0, engine_times: int = 0, wall_times: int = 0,
                 state: tuple[str, int, int] | None = None) -> None:
        self.outputs, self.table, self.engine_times, self.wall_times = outputs, table, engine_times, wall_times
        self.state = state


class Sent:
    """What the consumer holds of each request (after the last refresh point), so a producer
    sends only the tails of its growing lists, and a plain decode as a row of the decodes
    (`decoded`). A request's block table only grows while it runs; `table_went_back`
    (preempted, or finished) makes the next change send it from the start."""

    def __init__(self) -> None:
        self._held: dict[str, _Held] = {}

    def knows(self, rid: str) -> bool:
        return rid in self._held

    def table_went_back(self, rid: str) -> None:
        held = self._held.get(rid)
        if held is not None:
            held.table = 0

    def forget(self, rids: Iterable[str]) -> None:
        for rid in rids:
            self._held.pop(rid, None)

    def hold(self, rid: str, output: Sequence[int], table: Sequence[int], metrics: RequestMetrics) -> None:
        """The consumer now holds the whole request (it took a whole snapshot)."""
        self._held[rid] = _Held(len(output), len(table), len(metrics.engine.token_times),
                                len(metrics.wall.token_times))

    def decoded(self, rid: str, state: tuple[str, int, int], output: Sequence[int], table: Sequence[int],
                metrics: RequestMetrics) -> bool:
        """Whether the request's step was a plain decode as the consumer holds it (DecodesDict):
        it holds the request after its first token, in this `state` (status, cached tokens,
        preemptions: the clocks' event times move only with these) and at this table's length,
        and the step added one output token and one token time on each clock. If so the consumer
        holds them once the caller sends the row."""
        held = self._held.get(rid)
        if held is None or held.state != state or held.outputs == 0 or len(output) != held.outputs + 1 \
                or len(table) != held.table or len(metrics.engine.token_times) != held.engine_times + 1 \
                or len(metrics.wall.token_times) != held.wall_times + 1:
            return False
        held.outputs += 1
        held.engine_times += 1
        held.wall_times += 1
        return True

    def change(self, rid: str, fields: RequestFieldsDict, output: Sequence[int], table: Sequence[int],
               metrics: RequestMetrics, first_seen: Callable[[], Mapping[str, object]] | None = None,
               ) -> RequestChangeDict:
        """The request change: `fields` (status, counts, finish_reason, and the FIRST_SEEN keys
        and texts as the producer has them; FIRST_SEEN ones are dropped when the consumer has
        seen the request) plus the tails of what the consumer does not hold yet. `first_seen()`
        gives what never changes (the prompt, its text, max_tokens, the sampling parameters),
        asked for only when the consumer has not seen the request."""
        held = self._held.get(rid)
        if held is None:
            held = self._held[rid] = _Held()
            if first_seen is not None:   # its keys are RequestFieldsDict's optional ones
                fields = cast("RequestFieldsDict", {**fields, **first_seen()})
        elif not _FIRST_SEEN.isdisjoint(fields):   # kvscope's engine leaves them out itself
            fields = cast("RequestFieldsDict", {k: v for k, v in fields.items() if k not in _FIRST_SEEN})
        start, table_from = min(held.outputs, len(output)), min(held.table, len(table))
        change: RequestChangeDict = {
            **fields, RCHANGE.OUTPUT_FROM: start, RCHANGE.OUTPUT_TAIL: list(output[start:]),
            RCHANGE.TABLE_FROM: table_from, RCHANGE.TABLE_TAIL: list(table[table_from:]),
            RCHANGE.CLOCKS: {RMETRICS.ENGINE: clock_change(metrics.engine, held.engine_times),
                             RMETRICS.WALL: clock_change(metrics.wall, held.wall_times)}}
        held.outputs, held.table = len(output), len(table)
        held.engine_times, held.wall_times = len(metrics.engine.token_times), len(metrics.wall.token_times)
        held.state = (fields[RCHANGE.STATUS], fields[RCHANGE.NUM_CACHED_TOKENS], fields[RCHANGE.NUM_PREEMPTIONS])
        return change


# A plain decode as a producer notes it (`Sent.decoded` said yes): request id, computed count,
# output text, and the output ids and metrics `Sent.decoded` read (their latest items are the step's).
DecodeRow = tuple[str, int, str, Sequence[int], RequestMetrics]


def decodes_dict(rows: Sequence[DecodeRow]) -> DecodesDict:
    """The decodes' columns from the step's rows: each new output token and its time on each clock."""
    return {DECODES.REQUEST_IDS: [r[0] for r in rows], DECODES.NUM_COMPUTED_TOKENS: [r[1] for r in rows],
            DECODES.OUTPUT_TOKENS: [r[3][-1] for r in rows], DECODES.OUTPUT_TEXTS: [r[2] for r in rows],
            DECODES.ENGINE_TOKEN_TIMES: [r[4].engine.token_times[-1] for r in rows],
            DECODES.WALL_TOKEN_TIMES: [r[4].wall.token_times[-1] for r in rows]}


def request_fields(request_id: str, status: str, num_computed_tokens: int, num_cached_tokens: int,
                   num_preemptions: int, finish_reason: str | None) -> RequestFieldsDict:
    """The small fields every producer's request change carries (each adds its texts and its
    other KV cache groups' fields)."""
    return {REQ.REQUEST_ID: request_id, REQ.STATUS: status, REQ.NUM_COMPUTED_TOKENS: num_computed_tokens,
            REQ.NUM_CACHED_TOKENS: num_cached_tokens, REQ.NUM_PREEMPTIONS: num_preemptions,
            REQ.FINISH_REASON: finish_reason}


def hold_tokens(held: dict[int, list[int]], table: Sequence[int], first: int, block_size: int,
                tokens: Sequence[int], num_computed: int, null_block: int | None = None) -> None:
    """Note in `held` (block id -> token ids) the computed tokens a request keeps in each block
    of `table` from index `first` on; `tokens` starts at the first of them (position
    first * block_size). A block already noted keeps its tokens (a shared block holds the same
    ones); the null block (where a sliding window's blocks were freed) holds none."""
    base = first * block_size
    for i in range(first, len(table)):
        b = table[i]
        if b not in held and b != null_block:
            start = i * block_size
            end = min(start + block_size, num_computed)
            held[b] = list(tokens[start - base:end - base]) if end > start else []


def clock_change(clock: ClockEvents, held: int) -> ClockChangeDict:
    """One clock of a request's metrics as a change: its times, `token_times` from index `held`."""
    times = clock.token_times
    start = min(held, len(times))
    return {CCHANGE.ARRIVAL_TIME: clock.arrival_time, CCHANGE.FIRST_SCHEDULED_TIME: clock.first_scheduled_time,
            CCHANGE.FIRST_TOKEN_TIME: clock.first_token_time, CCHANGE.FINISHED_TIME: clock.finished_time,
            CCHANGE.PREEMPTED_TIMES: list(clock.preempted_times), CCHANGE.TOKEN_TIMES_FROM: start,
            CCHANGE.TOKEN_TIMES_TAIL: times[start:]}


def whole(snapshot: EngineSnapshotDict, step: int, restart: str | None = None) -> ChangesDict:
    """Changes that replace the state with `snapshot` (and, with `restart`, start the history again)."""
    changes: ChangesDict = {CHANGES.STEP: step, CHANGES.REQUESTS: {}, CHANGES.QUEUES: {QUEUE.WAITING: [],
                            QUEUE.RUNNING: []}, CHANGES.FINISHED: [], CHANGES.BLOCKS: [],
                            CHANGES.NUM_FREE_BLOCKS: snapshot[SNAP.BLOCK_POOL][POOL.NUM_FREE_BLOCKS],
                            CHANGES.METRICS: snapshot[SNAP.METRICS], CHANGES.SNAPSHOT: snapshot}
    if restart is not None:
        changes[CHANGES.RESTART] = restart
    return changes
