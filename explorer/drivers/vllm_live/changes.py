"""A step's changes to the server's state: built by the recorder, applied by the client.

A whole EngineSnapshot per step costs the server O(pool size + tokens in flight): on a GPU
server (tens of thousands of blocks, hundreds of requests of thousands of tokens) that is
hundreds of milliseconds on vLLM's scheduler thread, every step. So a step message carries
only what the step touched, and costs O(what the step did):

- `blocks`: the block dicts (explorer.drivers.vllm.records.block_dict) of every block the step
  allocated, hit, freed or dropped a reference to, cached, evicted, or wrote tokens into.
  `owners` is left out: the client derives it from the running requests' block tables.
- `requests`: each request the step scheduled or preempted, and each one added since the
  previous step, as its request dict without the growing lists; those come as tails:
  `output_from` / `output_tail` (the output token ids from index `output_from` on),
  `table_from` / `table_tail` (the block table likewise) and `clocks` (its metrics' times,
  `token_times` as a tail). A request new to the feed also carries its prompt, its text,
  `max_tokens` and sampling parameters, which never change.
- `queues`: the waiting and running request ids in order; `finished`: the finished request
  dicts of this step (each sent once); `num_free_blocks` and `metrics`.

The client holds the state of the step before (from the snapshot it joined with, then from
every step applied); a tail that does not fit it raises `OutOfStep`, and the client takes a
fresh snapshot instead of guessing.
"""
from __future__ import annotations

from engine.report.schema import BLOCK, POOL, QUEUE, REQ, RMETRICS, SNAP
from engine.request import ClockEvents

# The request dict's growing lists travel as tails (see the module doc).
_TAILS = {REQ.OUTPUT_TOKEN_IDS: ("output_from", "output_tail"), REQ.BLOCK_TABLE: ("table_from", "table_tail")}
_DELTA_KEYS = frozenset(k for pair in _TAILS.values() for k in pair) | {"clocks"}
# A request's metrics: two clocks of ClockEvents, sent as their times (token_times as a tail);
# the client derives the latencies with the same ClockEvents.to_dict as the full snapshot.
CLOCKS = (RMETRICS.ENGINE, RMETRICS.WALL)
_CLOCK_SCALARS = ("arrival_time", "first_scheduled_time", "first_token_time", "finished_time")


class OutOfStep(ValueError):
    """A step's changes do not fit the state the client holds (a step was missed)."""


# -- recorder side ------------------------------------------------------------------------------
def clock_change(clock: ClockEvents, num_new: int) -> dict:
    """One clock of a request's metrics as a change: its times, `token_times` from the first of
    the `num_new` tokens the subscribers do not hold yet (one time per token)."""
    times = clock.token_times
    start = max(0, len(times) - num_new)
    return {"arrival_time": clock.arrival_time, "first_scheduled_time": clock.first_scheduled_time,
            "first_token_time": clock.first_token_time, "finished_time": clock.finished_time,
            "preempted_times": clock.preempted_times[:], "token_times_from": start, "token_times_tail": times[start:]}


# -- client side --------------------------------------------------------------------------------
def apply(snapshot: dict, changes: dict, step: int) -> dict:
    """The snapshot after a step: `snapshot` (the state before it) with `changes` applied. Parts
    the step left alone are the same objects as in `snapshot`; `snapshot` is not modified."""
    queues = snapshot[SNAP.QUEUES]
    known = {r[REQ.REQUEST_ID]: r for q in (QUEUE.WAITING, QUEUE.RUNNING) for r in queues[q]}
    for rid, change in changes["requests"].items():
        known[rid] = _request(known.get(rid), change, rid)
    try:
        waiting = [known[rid] for rid in changes["queues"][QUEUE.WAITING]]
        running = [known[rid] for rid in changes["queues"][QUEUE.RUNNING]]
    except KeyError as exc:
        raise OutOfStep(f"request {exc.args[0]} is queued but was never announced") from None
    pool = snapshot[SNAP.BLOCK_POOL]
    blocks = list(pool[POOL.BLOCKS])
    changed = changes["blocks"]
    if changed:
        owners = _owners(running, {b[BLOCK.BLOCK_ID] for b in changed})
        for b in changed:
            i = b[BLOCK.BLOCK_ID]
            if not 0 <= i < len(blocks):
                raise OutOfStep(f"block {i} is outside the pool of {len(blocks)}")
            blocks[i] = {**b, BLOCK.OWNERS: owners.get(i, [])}
    new = dict(snapshot)
    new[SNAP.STEP] = step
    new[SNAP.METRICS] = changes["metrics"]
    new[SNAP.QUEUES] = {QUEUE.WAITING: waiting, QUEUE.RUNNING: running, QUEUE.FINISHED: changes["finished"]}
    new[SNAP.BLOCK_POOL] = {**pool, POOL.NUM_FREE_BLOCKS: changes["num_free_blocks"], POOL.BLOCKS: blocks}
    return new


def _request(old: dict | None, change: dict, rid: str) -> dict:
    """The request dict after a change: what the change leaves out (the prompt, the sampling
    params, the texts) is kept from `old`; the growing lists continue `old`'s."""
    if old is None and REQ.PROMPT_TOKEN_IDS not in change:
        raise OutOfStep(f"request {rid} changed, but its first appearance was missed")
    new = dict(old or {REQ.OUTPUT_TEXT: ""})
    new.update((k, v) for k, v in change.items() if k not in _DELTA_KEYS)
    for key, (at, tail) in _TAILS.items():
        new[key] = _continued(old[key] if old is not None else [], change[at], change[tail], f"request {rid}: {key}")
    old_metrics = (old or {}).get(REQ.METRICS) or {}
    new[REQ.METRICS] = {c: _clock(old_metrics.get(c), change["clocks"][c], rid) for c in CLOCKS}
    return new


def _continued(before: list, start: int, tail: list, what: str) -> list:
    if len(before) < start:
        raise OutOfStep(f"{what} continues at {start}, this client holds {len(before)}")
    return before[:start] + list(tail)


def _clock(old: dict | None, change: dict, rid: str) -> dict:
    """The client side of `clock_change`: the clock's metrics dict (ClockEvents.to_dict)."""
    times = _continued((old or {}).get("token_times") or [], change["token_times_from"], change["token_times_tail"],
                       f"request {rid}: token_times")
    return ClockEvents(**{k: change[k] for k in _CLOCK_SCALARS}, preempted_times=list(change["preempted_times"]),
                       token_times=times).to_dict()


def _owners(running: list[dict], wanted: set[int]) -> dict[int, list[str]]:
    """For the blocks in `wanted`: the running requests whose block table holds them, in queue
    order (as the recorder's whole snapshot lists them)."""
    owners: dict[int, list[str]] = {}
    for r in running:
        for b in r[REQ.BLOCK_TABLE]:
            if b in wanted:
                owners.setdefault(b, []).append(r[REQ.REQUEST_ID])
    return owners
