"""`python -m explorer attach ADDRESS`: follow a live vLLM server in a terminal, one line per step."""
from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import threading

    from engine.report.schema import EngineSnapshotDict, StepRecordDict

    from ..core.recording import RecordingWriter
    from ..core.session import Session


def step_line(rec: StepRecordDict, snap: EngineSnapshotDict) -> str:
    """One step as a line: what was scheduled (prefill chunk / decode, cached tokens), block events."""
    parts = []
    for s in rec["scheduled"]:
        rid = s["request_id"][-8:]
        if s["is_prefill"]:
            cached = f" cached {s['num_cached_tokens']}" if s["num_cached_tokens"] else ""
            parts.append(f"{rid} prefill#{s['chunk_index']} {s['num_tokens']}{cached}")
        else:
            parts.append(f"{rid} decode")
    b = rec["blocks"]
    events = " ".join(f"{k}={v}" for k, v in b.items() if v and k != "same_step_hits")
    extra = "".join(f" {k}={[r[-8:] for r in rids]}" for k, rids in (("preempted", rec["preempted"]),
                                                                         ("finished", rec["finished"])) if rids)
    return (f"step {rec['step']:>5}  {sum(s['num_tokens'] for s in rec['scheduled']):>4} tok  "
            f"free {rec['num_free_blocks']:>4}  {'; '.join(parts) or '-'}  {events}{extra}")


def run_attach(address: str, *, model: str | None = None, kv_events: str | None = None, seconds: float | None = None,
               export: str | None = None, timeout: float = 10.0, record: str | None = None,
               stop: threading.Event | None = None, snapshot_address: str | None = None,
               max_finished: int | None = None) -> int:
    """Follow the server at `address` (every data-parallel rank of it: each line then starts
    with its rank) until `seconds` pass, Ctrl-C, or `stop` (a threading.Event) is set. `record`:
    a recording of every step applied from now on (one file per rank: run.rank1.kvrec.gz), every
    request in it however few finished ones the follower keeps (`max_finished`: None, a live
    Session's default bound)."""
    from ..core.session import LIVE_FINISHED, Session

    try:
        attached = Session.attach(address, model, timeout=timeout, kv_events=kv_events,
                                  snapshot_address=snapshot_address,
                                  max_finished=LIVE_FINISHED if max_finished is None else max_finished)
    except (TimeoutError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sessions = getattr(attached, "sessions", [attached])
    labels = [f"[{label}] " for label in attached.labels] if len(sessions) > 1 else [""]
    for s, label in zip(sessions, labels):
        cfg = s.current.snapshot["config"]
        print(f"{label}attached to {s.engine_name} at {s.source.address} (run {s.engine.run_id[:8]}, step "
              f"{s.current.step}): {cfg.get('num_kv_blocks')} blocks of {cfg.get('block_size')}, budget "
              f"{cfg.get('max_num_batched_tokens')} tokens, {cfg.get('max_num_seqs')} seqs")
    seen = [0] * len(sessions)
    writers = [_recorder(s, record if len(sessions) == 1 else _ranked(record, k), address, label)
               for k, (s, label) in enumerate(zip(sessions, labels))] if record else [None] * len(sessions)
    end = None if seconds is None else time.monotonic() + seconds
    try:
        while (end is None or time.monotonic() < end) and not (stop is not None and stop.is_set()):
            for k, (s, label, writer) in enumerate(zip(sessions, labels, writers)):
                applied = s.poll()
                for e in (s.history[-len(applied):] if applied else ()):
                    print(label + step_line(e.record, e.snapshot), flush=True)
                    if writer is not None and not writer.closed:
                        writer.add(e)
                for note in s.notes[seen[k]:]:
                    print(f"{label}note: {note}", flush=True)
                seen[k] = len(s.notes)
            time.sleep(0.05)
    except KeyboardInterrupt:
        pass
    finally:
        for s, label in zip(sessions, labels):
            st = s.feed_status()
            print(f"{label}feed: {st['applied']} steps applied, {st['missed']} missed, {st['dropped_here']} dropped "
                  f"here, {st['rejected']} rejected; recorder: {st['server']}")
        if len(sessions) > 1:
            r = attached.routing_summary()
            print(f"fleet: {r['requests']} requests, per rank {r['per_rank']}; prefix hits {r['hit_tokens']} tokens "
                  f"where they ran, {r['best_tokens']} on the best rank at arrival; routing loss {r['loss_tokens']} "
                  f"tokens ({r['requests_with_loss']} requests)")
        if export:
            from ..export import export_html

            for k, (s, label) in enumerate(zip(sessions, labels)):
                path = export if len(sessions) == 1 else _ranked(export, k)
                print(label + str(export_html(s, path)))
        for writer, label in zip(writers, labels):
            if writer is not None and not writer.closed:
                print(f"{label}recording: {writer.close()}")
        attached.close()
    return 0


def _recorder(session: Session, path: str, address: str, label: str) -> RecordingWriter:
    """A RecordingWriter fed from `session`'s first entry on; it ends when the feed restarts."""
    from ..core.recording import RecordingWriter

    writer = RecordingWriter(path, notes=[f"recorded by `python -m explorer attach {address}`"])
    writer.add(session.history[0])
    def stop_on_reset(event: str, _session: Session) -> None:
        if event == "reset":
            _stop_recording(writer, label)

    session.subscribe(stop_on_reset)
    return writer


def _stop_recording(writer: RecordingWriter, label: str) -> None:
    """The server restarted (or cleared its cache): the steps after it start from another pool,
    so the recording ends here."""
    if not writer.closed:
        print(f"{label}note: the feed restarted; the recording ends before it: {writer.close()}", flush=True)


def _ranked(path: str, rank: int) -> str:
    """`path` with the rank before its suffix (run.html -> run.rank1.html, run.kvrec.gz -> run.rank1.kvrec.gz)."""
    for suffix in (".kvrec.gz", ".kvrec"):
        if path.endswith(suffix):
            return f"{path[:-len(suffix)]}.rank{rank}{suffix}"
    head, dot, tail = path.rpartition(".")
    return f"{head}.rank{rank}.{tail}" if dot else f"{path}.rank{rank}"
