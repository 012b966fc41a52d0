"""A live Session's memory over a long run at the real defaults (`python -m benchmarks.follower_soak`).

A real vLLM server with kvscope's recorder, four OpenAI clients keeping it busy with requests
of varied lengths (some sharing a prefix), and a Session attached with `Session.attach`'s
default bounds (the latest 2,000 steps, about 1 GiB of what they added, 1,000 finished
requests). Every `--every` seconds it prints one row of the memory curve: steps applied,
requests finished, the history window (entries kept, steps dropped, its MiB estimate), this
process's RSS and the server's (every process of its group: the API server and its engine
core, where the recorder runs), and the feed's missed and rebased counts. The follower's RSS
must level off once the window is full, and the server's must not grow with the run.
`--plain` runs the same traffic against a server without the recorder and no Session (the
server's own growth, to compare with).
"""
from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from explorer.drivers.vllm_live.server import VllmServer

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mib(pid: int | str = "self") -> float:
    """A process's resident memory in MiB (Linux's /proc/PID/statm); 0 for one that is gone."""
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE / 2**20
    except (OSError, IndexError, ValueError):
        return 0.0


def group_rss_mib(pgid: int) -> float:
    """The resident memory of every process in process group `pgid`, MiB."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid:  # fields after the name: state, ppid, pgrp, ...
                total += rss_mib(entry.name)
    return total


def _users(server: VllmServer, stop: threading.Event, users: int, done: list[int]) -> list[threading.Thread]:
    """`users` client threads, each sending one completion after another until `stop` (`done[0]`
    counts the completions answered)."""
    client = server.client(timeout=300)

    def user(u: int) -> None:
        k = 0
        while not stop.is_set():
            k += 1
            shared = "You answer questions about ships and the sea. " * (1 + k % 3)  # a shared prefix, 3 lengths
            try:
                client.completions.create(model=server.model, prompt=f"{shared}User {u} asks question {k}:",
                                          max_tokens=8 + (k * 7 + u) % 40, temperature=0.0,
                                          extra_body={"ignore_eos": True})
                done[0] += 1
            except Exception:  # noqa: BLE001 - a timeout under load; the next request goes on
                if stop.is_set():
                    return
    threads = [threading.Thread(target=user, args=(u,), daemon=True) for u in range(users)]
    for t in threads:
        t.start()
    return threads


def soak(model: str, minutes: float, every: float = 60.0, users: int = 4, recorder: bool = True,
         report: Callable[[dict], None] = lambda row: None, **bounds) -> list[dict]:
    """Run the soak for `minutes`; a row of the memory curve every `every` seconds (also passed to
    `report` as it comes). `bounds`: Session.attach's max_history, max_history_mib, max_finished
    (its defaults when left out). Without the `recorder`, no Session follows: the rows' session
    fields are 0."""
    from explorer import Session

    server = VllmServer(model, num_gpu_blocks=128, max_num_batched_tokens=256, max_num_seqs=8, kv_events=False,
                        recorder=recorder, env={"OMP_NUM_THREADS": "1"})
    rows: list[dict] = []
    stop = threading.Event()
    try:
        server.start().wait_ready(600)
        assert server.proc is not None
        session = Session.attach(server.feed, snapshot_address=server.snapshots, **bounds) if recorder else None
        done = [0]
        threads = _users(server, stop, users, done)
        start = next_row = time.monotonic()
        while True:
            if session is not None:
                session.poll()
            now = time.monotonic()
            if now >= next_row:
                row = {"minute": (now - start) / 60, "steps": 0, "finished": done[0], "entries": 0, "dropped": 0,
                       "history_mib": 0.0, "rss_mib": rss_mib(), "server_rss_mib": group_rss_mib(server.proc.pid),
                       "missed": 0, "rebased": 0}
                if session is not None:
                    window, status = session.history_window, session.feed_status()
                    row.update(steps=session.current.step, entries=len(session.history), dropped=window["dropped"],
                               history_mib=window.get("mib") or 0.0, missed=status["missed"],
                               rebased=status["rebased"])
                rows.append(row)
                report(row)
                if now - start >= minutes * 60:
                    break
                next_row += every
            time.sleep(0.2)
        stop.set()
        for t in threads:
            t.join(timeout=60)
        if session is not None:
            session.close()
    finally:
        stop.set()
        server.stop()
    return rows


def print_row(row: dict) -> None:
    print(f"{row['minute']:6.1f} {row['steps']:8d} {row['finished']:8d} {row['entries']:8d} {row['dropped']:8d} "
          f"{row['history_mib']:8.1f} {row['rss_mib']:8.1f} {row['server_rss_mib']:10.1f} {row['missed']:6d} "
          f"{row['rebased']:7d}", flush=True)


def main(argv: list[str] | None = None) -> None:
    from engine.default_model import default_model_path

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--every", type=float, default=60.0, help="seconds between rows of the curve")
    parser.add_argument("--model", default=None, help="model folder (default: kvscope's default model)")
    parser.add_argument("--plain", action="store_true", help="a server without the recorder, and no Session")
    args = parser.parse_args(argv)
    print("minute    steps finished  entries  dropped hist MiB  RSS MiB server MiB missed rebased", flush=True)
    soak(args.model or str(default_model_path()), args.minutes, args.every, recorder=not args.plain, report=print_row)


if __name__ == "__main__":
    main()
