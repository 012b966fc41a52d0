"""Memory per step of the Session history at a bench-ui scale (64 requests, 4,096 blocks):
snapshots kept whole vs built from each step's changes, which share what the step did not
change (`python -m benchmarks.history_cost`)."""
from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from engine.report.changes import apply
from explorer.core.history import history_bytes


def measure(model: str | None = None, *, num_requests: int = 64, num_kv_blocks: int = 4096, steps: int = 10,
            progress: Any = None) -> dict:
    """Memory per step of a plain and of an applied history, at `num_requests` decoding
    requests over `num_kv_blocks` blocks (the bench-ui workload). The same engine steps
    feed both: each step's snapshot is kept once as `to_dict()` gave it and once as the
    previous one with the step's changes applied. Returns bytes per step (sys.getsizeof, each
    object once) and the JSON bytes per step of the records and of their changes (what a live
    feed sends)."""
    from .ui import prepare_session

    session = prepare_session(model, num_requests=num_requests, num_kv_blocks=num_kv_blocks, steps=steps,
                              progress=progress)
    engine = session.engine
    first = engine.snapshot().to_dict()
    engine.take_changes()  # the snapshot is the refresh point
    plain = [first]
    shared = [engine.snapshot().to_dict()]
    records = []
    for _ in range(steps):
        rec = engine.step().to_dict()
        records.append(rec)
        plain.append(engine.snapshot().to_dict())
        shared.append(apply(shared[-1], rec["changes"]))

    def per_step(snaps: list) -> float:  # what each step after the first adds
        entries = [{"step": i, "record": None, "snapshot": s} for i, s in enumerate(snaps)]
        whole = history_bytes(entries)
        base = history_bytes(entries[:1])
        return (whole - base) / steps

    record_bytes = history_bytes({"step": 0, "record": r, "snapshot": None} for r in records) / steps
    import json

    changes_bytes = sum(len(json.dumps(r["changes"], separators=(",", ":"))) for r in records) / steps
    record_json = sum(len(json.dumps(r, separators=(",", ":"))) for r in records) / steps
    return {"num_requests": num_requests, "num_kv_blocks": num_kv_blocks, "steps": steps,
            "snapshot_bytes_per_step_plain": per_step(plain), "snapshot_bytes_per_step_shared": per_step(shared),
            "record_bytes_per_step": record_bytes, "changes_json_bytes_per_step": changes_bytes,
            "record_json_bytes_per_step": record_json,
            "first_snapshot_bytes": history_bytes([{"step": 0, "record": None, "snapshot": plain[0]}])}


def main(argv: Sequence[str] | None = None) -> int:
    import argparse
    import json

    p = argparse.ArgumentParser(prog="python -m benchmarks.history_cost",
                                description="Memory per step of the Session history, plain vs shared snapshots.")
    p.add_argument("--model", default=None, help="local HF folder (default: SmolLM2-135M-Instruct)")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--blocks", type=int, default=4096)
    p.add_argument("--steps", type=int, default=10)
    args = p.parse_args(argv)
    result = measure(args.model, num_requests=args.requests, num_kv_blocks=args.blocks, steps=args.steps,
                     progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
