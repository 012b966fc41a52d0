"""Which running request's allocation caused a step's preemptions, read from the state before
the step: both schedulers (vLLM's v1 and kvscope's) serve running requests in their queue order,
each taking blocks for its new tokens from the free ones; the first that finds too few preempts
the newest running request (itself, when it is the newest). Waiting requests never preempt: one
that does not fit waits. The step caption and the why-view both say it from here."""
from __future__ import annotations

from engine.report.schema import EngineSnapshotDict, StepRecordDict


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def needing_request(before: EngineSnapshotDict | None, record: StepRecordDict,
                    block_size: int) -> tuple[str | None, int]:
    """(the running request whose block allocation failed, the blocks it needed), replayed from
    `before` (the snapshot before the step); (None, 1) where the state before is unknown."""
    if before is None:
        return None, 1
    running = before["queues"]["running"]
    if not running:
        return None, 1
    preempted = set(record.get("preempted") or ())
    scheduled = {s["request_id"]: s for s in record["scheduled"]}
    free = int(before["block_pool"].get("num_free_blocks") or 0)
    for r in running:
        rid = r["request_id"]
        s = scheduled.get(rid)
        if s is None:
            if rid in preempted:  # reached a victim first: it tried to grow, and preempted itself
                return rid, 1
            continue
        need = _ceil_div(int(s.get("num_computed_before", 0)) + int(s["num_tokens"]), block_size) \
            - len(r.get("block_table") or [])
        if need > free:
            return rid, need
        free -= max(0, need)
    return None, 1


def work_of(record: StepRecordDict, request_id: str | None) -> str | None:
    """What a running request was scheduled for in this step: 'decode' or 'prompt chunk'."""
    for s in record["scheduled"]:
        if s["request_id"] == request_id:
            return "prompt chunk" if s["is_prefill"] else "decode"
    return None
