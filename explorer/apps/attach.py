"""`python -m explorer attach ADDRESS`: follow a live vLLM server in a terminal, one line per step."""
from __future__ import annotations

import sys
import time
from typing import Any


def step_line(rec: dict, snap: dict) -> str:
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
    extra = "".join(f" {k}={[r[-8:] for r in rec[k]]}" for k in ("preempted", "finished") if rec[k])
    return (f"step {rec['step']:>5}  {sum(s['num_tokens'] for s in rec['scheduled']):>4} tok  "
            f"free {rec['num_free_blocks']:>4}  {'; '.join(parts) or '-'}  {events}{extra}")


def run_attach(address: str, *, model: str | None = None, kv_events: str | None = None, seconds: float | None = None,
               export: str | None = None, timeout: float = 10.0, record: str | None = None,
               stop: Any = None, snapshot_address: str | None = None) -> int:
    """Follow the feed until `seconds` pass, Ctrl-C, or `stop` (a threading.Event) is set."""
    from ..core.recording import RecordingWriter
    from ..core.session import Session

    try:
        s = Session.attach(address, model, timeout=timeout, kv_events=kv_events, snapshot_address=snapshot_address)
    except (TimeoutError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    cfg = s.current.snapshot["config"]
    print(f"attached to {s.engine_name} at {address} (run {s.engine.run_id[:8]}, step {s.current.step}): "
          f"{cfg.get('num_kv_blocks')} blocks of {cfg.get('block_size')}, budget {cfg.get('max_num_batched_tokens')} "
          f"tokens, {cfg.get('max_num_seqs')} seqs")
    for note in s.notes:
        print(f"note: {note}")
    seen = len(s.notes)
    writer = None
    if record:  # a recording of every step applied from now on (explorer.whatif replays it)
        writer = RecordingWriter(record, notes=[f"recorded by `python -m explorer attach {address}`"])
        writer.add(s.history[0])
        s.subscribe(lambda event, _s: event == "reset" and _stop_recording(writer, s))
    end = None if seconds is None else time.monotonic() + seconds
    try:
        while (end is None or time.monotonic() < end) and not (stop is not None and stop.is_set()):
            applied = s.poll()
            for e in (s.history[-len(applied):] if applied else ()):
                print(step_line(e.record, e.snapshot), flush=True)
                if writer is not None and not writer.closed:
                    writer.add(e)
            for note in s.notes[seen:]:
                print(f"note: {note}", flush=True)
            seen = len(s.notes)
            time.sleep(0.05)
    except KeyboardInterrupt:
        pass
    finally:
        st = s.feed_status()
        print(f"feed: {st['applied']} steps applied, {st['missed']} missed, {st['dropped_here']} dropped here, "
              f"{st['rejected']} rejected; recorder: {st['server']}")
        if export:
            from ..export import export_html

            print(export_html(s, export))
        if writer is not None and not writer.closed:
            print(f"recording: {writer.close()}")
        s.close()
    return 0


def _stop_recording(writer, session) -> None:
    """The server restarted (or cleared its cache): the steps after it start from another pool,
    so the recording ends here."""
    if not writer.closed:
        print(f"note: the feed restarted; the recording ends before it: {writer.close()}", flush=True)
