"""The live feed's step messages as typed structs: named fields on both ends, the compact bytes of
positional lists on the wire, and each message checked against these types when it is decoded.

An op is a `msgspec.Struct` with `array_like=True` and a one-letter tag, as vLLM declares its own
inter-process messages: `Arrived(...)` travels as ["a", idx, request_id, ...], the same msgpack
array as a list in that order. A `Body` is what one step moved (mirror.py's module doc says what
each part means); the recorder builds it on its thread (recorder.py), both `Mirror`s apply it, and
the client decodes it, typed, from the feed (protocol.py `decode`).
"""
from __future__ import annotations

from typing import Any

import msgspec

BlockIds = list[int]
#: A request's finish: (its position in the op's ids, or its index; vLLM's reason in lower case).
Finish = tuple[int, str]


class Arrived(msgspec.Struct, array_like=True, tag="a"):
    """A request arrived: its name, prompt and parameters, the only time they go."""
    idx: int                          # the small integer the recorder names it by from now on
    request_id: str
    prompt: list[int]                 # [] when the feed leaves token ids out
    num_prompt: int
    max_tokens: int
    sampling_params: dict[str, Any]   # SamplingParams.to_dict()
    arrival_time: float
    stop: list[str]
    prompt_hashes: list[str]          # its full prompt blocks' hash keys
    domain: dict[str, Any]            # its priority, and its cache_salt and LoRA name where it has them


class Scheduled(msgspec.Struct, array_like=True, tag="s"):
    """vLLM's SchedulerOutput `sid`, as it is."""
    sid: int
    order: list[int]                  # the batch's requests, in vLLM's order
    num_tokens: list[int]             # each one's scheduled tokens
    new: list[tuple[int, int, BlockIds]]   # the new requests: (idx, tokens computed before, block ids)
    cached_ids: list[int]             # vLLM's CachedRequestData, list by list
    cached_before: list[int]
    cached_new_blocks: list[BlockIds | None]
    cached_outputs: list[int]
    resumed: list[int]
    preempted: list[int]
    token_budget: int
    # Several KV cache groups: per group past kvscope's first, the same two lists as `new`'s block
    # ids and `cached_new_blocks` (the tables vLLM's model runner extends, and the step's slots read).
    groups: list[tuple[list[BlockIds], list[BlockIds | None]]] = msgspec.field(default_factory=list)


class FinishedBetween(msgspec.Struct, array_like=True, tag="f"):
    """Requests that finished outside a step (an abort)."""
    wall_time: float
    finished: list[Finish]            # (idx, reason)


class Updated(msgspec.Struct, array_like=True, tag="u"):
    """The update of SchedulerOutput `sid`; it ends a body, and the body is that step's record."""
    sid: int | None                   # None: a step the recorder did not see scheduled
    wall_time: float
    step_s: float
    schedule_s: float
    update_s: float
    ids: list[int]                    # the requests with outputs
    new_tokens: list[list[int] | int]   # each one's new token ids, or their count without token ids
    finished: list[Finish]            # (position in `ids`, reason)
    events: dict[str, list[int]]      # the step's block events (engine/report/keys.py EV)


class RanNothing(msgspec.Struct, array_like=True, tag="x"):
    """The update of a SchedulerOutput that ran nothing (vLLM tells its workers about finished
    requests that way): no record."""
    sid: int | None


Op = Arrived | Scheduled | FinishedBetween | Updated | RanNothing


class GroupTables(msgspec.Struct, array_like=True):
    """A running request's tables in the KV cache groups past kvscope's first, whole, after the
    update, and each group's own prefix hit where vLLM looked it up since the last body."""
    idx: int
    tables: list[BlockIds]
    hits: list[int] | None


class Body(msgspec.Struct, omit_defaults=True):
    """What vLLM's scheduler did since the previous body (mirror.py's module doc)."""
    ops: list[Op]
    blocks: tuple[BlockIds, list[int], list[str | None]]   # changed blocks: ids, refcounts, hash keys
    cached: list[tuple[int, int, int]]     # newly cached blocks: (block, idx, index in its table)
    cleared: bool                          # the prefix cache was reset
    queues: tuple[list[int], list[int]] | None   # (running, waiting) where they moved
    free: int
    usage: float
    wall: float | None = None
    groups: list[GroupTables] | None = None   # a model of several KV cache groups only


# -- the whole state, for a client that joins (mirror_state.MirrorState.to_wire) -----------------
class ClockState(msgspec.Struct, array_like=True):
    """One clock of a request's event times (mirror_state.Clock)."""
    arrival_time: float | None
    first_scheduled_time: float | None
    finished_time: float | None
    token_times: list[float]
    preempted_times: list[float]


class RequestState(msgspec.Struct, array_like=True):
    """One request as the feed knows it (mirror_state.Req)."""
    idx: int
    request_id: str
    prompt: list[int]
    num_prompt: int
    output: list[int]                 # its output token ids ([] without token ids)
    num_output: int                   # with the tokens the feed left out
    max_tokens: int
    sampling_params: dict[str, Any]
    stop: list[str]
    prompt_hashes: list[str]
    status: str
    computed: int
    cached: int
    preemptions: int
    finish_reason: str | None
    table: BlockIds
    chunks: int
    engine_clock: ClockState
    wall_clock: ClockState
    domain: dict[str, Any]
    group_tables: list[BlockIds]
    group_hits: list[int] | None
    runner_tables: list[BlockIds] = msgspec.field(default_factory=list)   # mirror_state.Req.runner_tables


class PendingState(msgspec.Struct, array_like=True):
    """A schedule whose update is still to come (mirror_state.Sched)."""
    sid: int
    op: Scheduled
    before: list[int]
    admitted: list[int]
    known: dict[int, int]
    decode: list[bool]
    chunk: dict[int, int]
    tables: dict[int, BlockIds]       # the tables reset before its record, as they ran
    runner_tables: dict[int, list[BlockIds]] = msgspec.field(default_factory=dict)   # and the other groups'


class MirrorWire(msgspec.Struct):
    """One engine core's whole state as the feed keeps it (mirror_state.MirrorState)."""
    config: dict[str, Any]
    model_info: dict[str, Any]
    null_block: int
    tokens: bool
    finished_keep: int | None        # the finished requests it keeps (None: all)
    step: int
    engine_time: float
    counters: dict[str, int]
    usage: float
    free: int
    ref: list[int]
    hash: list[str | None]
    memo: list[tuple[int, str, list[int]]]   # a cached block's hash key and tokens
    requests: list[RequestState]
    finished: list[RequestState]
    running: list[int]
    waiting: list[int]
    pending: list[PendingState]
    gone: list[RequestState]          # finished, and still named by a pending schedule


class SnapshotMessage(msgspec.Struct, tag_field="kind", tag="snapshot"):
    """The snapshot endpoint's answer: the whole state after message `seq`."""
    schema: int
    run_id: str
    rank: int
    seq: int
    state: MirrorWire
    counters: dict[str, int | float]
    tokens_left_out: bool = False


class StepMessage(msgspec.Struct, tag_field="kind", tag="step"):
    """One feed message: a step's body, numbered (`seq`) within the recorder's run."""
    schema: int
    run_id: str
    rank: int                     # the data-parallel rank whose engine core it comes from
    seq: int
    counters: dict[str, int | float]   # the recorder's own counts and times (published, recorder_ms, ...)
    body: Body


class StoppedMessage(msgspec.Struct, tag_field="kind", tag="stopped"):
    """The recorder stopped (a step it could not record): `seq` skips the lost step."""
    schema: int
    run_id: str
    rank: int
    seq: int
    error: str
    counters: dict[str, int | float]


FeedMessage = StepMessage | StoppedMessage
