"""The tensor-parallel view: the panel state built from a history entry, and the panel bound
to a Session on its own (`tensor_parallel_panel(session)`).

Everything here reads the snapshot's `model_info` (what each rank holds, as the engine
reports it) and the StepRecords' `timings_ms["collectives"]` (rank 0's time in
all-reduce / gather); nothing is recomputed from the model.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, cast

from engine.report.schema import EngineSnapshotDict, StepRecordDict
from widgets.tensor_parallel import TensorParallelPanel

from .captions import no_snapshot

if TYPE_CHECKING:
    from widgets.tensor_parallel import TensorParallelState, TpInfoDict, TpLastStepDict, TpNoStepDict

    from ..core.history import Entry
    from ..core.session_view import SessionView

RECENT_STEPS = 40

CPU_NOTE = ("On CPU the ranks are processes talking over gloo (TCP on this machine): each all-reduce "
            "costs a millisecond or more, and a 30-layer model does 61 per step (one after the "
            "embedding, two per layer), so on a 2-core machine tensor parallelism adds 100 ms or more "
            "to every step. It is here for correctness and to show how the model is split, not for speed.")
GPU_NOTE = ("The ranks are GPUs joined by NCCL; collective time is measured on rank 0's stream "
            "(CUDA events), so it includes waiting for the slowest rank.")


def tensor_parallel_state(record: StepRecordDict | None, snapshot: EngineSnapshotDict,
                          history: Iterable[Entry] = ()) -> TensorParallelState:
    """Panel state (`widgets.TensorParallelPanel` traits) for one history entry.

    `history`: the Session's entries up to the displayed one, for the recent-steps chart.
    """
    info = snapshot.get("model_info") or {}
    tp = info.get("tensor_parallel") or {}
    size = int(info.get("tensor_parallel_size") or 1)
    config = snapshot.get("config") or {}
    summary = {k: info.get(k) for k in ("name", "num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                                        "vocab_size", "intermediate_size", "dtype", "kv_bytes_per_rank",
                                        "kv_bytes_per_block_per_rank")}
    summary.update(size=size, backend=info.get("tp_backend"), num_blocks=config.get("num_kv_blocks"))
    recent: list[list[float]] = []
    for entry in list(history)[-RECENT_STEPS:]:
        rec = entry.get("record") if isinstance(entry, dict) else entry.record
        if rec and rec.get("step") and rec.get("scheduled"):
            t = rec.get("timings_ms") or {}
            recent.append([int(rec["step"]), float(t.get("collectives") or 0.0), float(t.get("forward") or 0.0)])
    last: TpLastStepDict | TpNoStepDict = {}
    if record and record.get("step"):
        t = record.get("timings_ms") or {}
        last = {"step": int(record["step"]), "collectives_ms": float(t.get("collectives") or 0.0),
                "forward_ms": float(t.get("forward") or 0.0), "total_ms": float(t.get("total") or 0.0)}
    note = "" if size == 1 else (GPU_NOTE if info.get("tp_backend") == "nccl" else CPU_NOTE)
    if size == 1:
        note = "tensor_parallel_size=1: rank 0 holds every weight and the whole KV pool; no collectives."
    # `summary`: the keys TpInfoDict names, each as model_info has it (or None), and the group's size, backend, pool
    return {"info": cast("TpInfoDict", summary), "ranks": list(tp.get("ranks") or []),
            "weights": list(tp.get("weights") or []), "last_step": last, "recent": recent, "note": note}


def session_state(session: SessionView) -> TensorParallelState:
    """`tensor_parallel_state` of the Session's current entry."""
    entry = session.current
    if entry is None:
        return tensor_parallel_state(None, no_snapshot())
    return tensor_parallel_state(entry.record, entry.snapshot, session.history)


def tensor_parallel_panel(session: SessionView) -> TensorParallelPanel:
    """A `TensorParallelPanel` kept up to date with `session` (after each step and reset).

    The panel lives as long as the Session does (the Session's observer list holds it);
    `panel.unbind()` stops the updates.
    """
    panel = TensorParallelPanel()

    def refresh(event: str | None = None, _session: SessionView | None = None) -> None:
        if event in (None, "step", "reset", "add", "abort"):
            entry = session.current
            with panel.hold_sync():
                panel.step = int(entry.step) if entry is not None else 0
                panel.show(session_state(session))

    panel.unbind = session.subscribe(refresh)
    refresh()
    return panel
