"""A fleet: every engine core of a data-parallel vLLM server, or several servers (replicas),
followed side by side, one Session per engine core, and what no single one of them can say:
which rank each request went to, and what that choice cost it.

    fleet = Session.attach("tcp://127.0.0.1:5590")              # a DP server: all its ranks
    fleet = Session.attach(["tcp://a:5590", "tcp://b:5590"])    # replicas (each may have ranks)
    fleet.follow(); fleet.routing(); fleet.routing_summary()

vLLM runs one scheduler per data-parallel rank, so each rank has its own recorder, feed and
KV pool (explorer/drivers/vllm_live/protocol.py: rank r at the feed's ports + 2r). A dense
model's ranks do not know how many they are (vLLM configures each as DP=1), so `attach` asks
rank 1, 2, ... in turn until one does not answer (or takes `ranks=N`).

Routing loss, per request: the tokens it hit in the prefix cache of the rank it ran on, and the
tokens it would have hit on the rank whose pool held the longest prefix of its prompt when it
arrived: its prompt's block hashes (the recorder sends them once per request) looked up, in
order, in each rank's recorded pool at the last step that rank finished before the request's
arrival time. It is measured on the ranks' true pools, not on a router's estimate; ranks on
other machines compare wall clocks, so their clocks should agree.
"""
from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from engine.report.schema import EngineSnapshotDict, RequestDict

from .follow import wait_until
from .history import HistoryEntry
from .session_view import SessionView

if TYPE_CHECKING:   # the fleet panel's types (widgets.fleet, which needs anywidget): names only
    from widgets.fleet import RoutingRowDict, RoutingSummaryDict

PROBE_TIMEOUT = 1.0   # seconds a rank past the last one takes to not answer


class Fleet:
    """Several Sessions (the engine cores of one or more servers) followed together.
    `sessions[k]` is the engine core `labels[k]` names ("rank 0", or "server 1 rank 0")."""

    def __init__(self, sessions: Sequence[SessionView], labels: Sequence[str] | None = None) -> None:
        if not sessions:
            raise ValueError("a fleet needs at least one session")
        self.sessions: list[SessionView] = list(sessions)
        self.labels = list(labels) if labels is not None else [f"rank {k}" for k in range(len(self.sessions))]
        if len(self.labels) != len(self.sessions):
            raise ValueError(f"{len(self.labels)} labels for {len(self.sessions)} sessions")
        self._rows: dict[tuple[int, str], RoutingRowDict] = {}   # finished requests' rows (they no longer change)
        self._pool_keys: dict[int, frozenset[str]] = {}

    def __len__(self) -> int:
        return len(self.sessions)

    def __repr__(self) -> str:
        return f"Fleet({', '.join(f'{label}: {s!r}' for label, s in zip(self.labels, self.sessions))})"

    # -- following, for every engine core at once ---------------------------------------------------
    def follow(self, interval: float = 0.1) -> None:
        for s in self.sessions:
            s.follow(interval)

    def pause(self) -> None:
        for s in self.sessions:
            s.pause()

    @property
    def following(self) -> bool:
        return all(s.following for s in self.sessions)

    def poll(self) -> int:
        """Apply every step ready now on every engine core; returns how many were applied."""
        return sum(len(s.poll()) for s in self.sessions if not s.following)

    def wait_for(self, predicate: Callable[[Fleet], bool], timeout: float = 30.0, interval: float = 0.05) -> bool:
        """Apply steps as they come until `predicate(fleet)` holds or `timeout` passes."""
        def ready() -> bool:
            self.poll()
            return predicate(self)

        return wait_until(ready, timeout, interval)

    def subscribe(self, callback: Callable[[str, Any], None]) -> Callable[[], None]:
        """`callback(event, session)` after every change of any engine core's Session."""
        undo = [s.subscribe(callback) for s in self.sessions]

        def unsubscribe() -> None:
            for u in undo:
                u()

        return unsubscribe

    def feed_status(self) -> list[dict]:
        return [s.feed_status() | {"label": label} for label, s in zip(self.labels, self.sessions)]

    def close(self) -> None:
        for s in self.sessions:
            s.close()

    # -- where requests went ----------------------------------------------------------------------------
    def requests(self) -> list[tuple[int, RequestDict]]:
        """Every request the engine cores' latest states hold, with the index of its engine core."""
        out: list[tuple[int, RequestDict]] = []
        for k, s in enumerate(self.sessions):
            q = s.current.snapshot["queues"]
            out += [(k, r) for name in ("waiting", "running", "finished") for r in q[name]]
        return out

    def routing(self) -> list[RoutingRowDict]:
        """One row per request (see the module doc): `request_id`, `rank` (its engine core's
        index), `label`, `arrival_time`, `prompt_blocks` (its full prompt blocks a hit could
        cover), `hit_tokens` (where it ran), `would_hit` (tokens, per engine core, at its
        arrival; None where that core's kept history does not reach back to it), `best_rank`,
        `best_tokens`, `loss_tokens` (best minus hit, never below 0), `known` (False: no prompt
        hashes for it, so nothing is said)."""
        walls = [self._walls(s) for s in self.sessions]
        rows: list[RoutingRowDict] = []
        for k, r in self.requests():
            rid = r["request_id"]
            cached = self._rows.get((k, rid))
            if cached is not None:
                rows.append(cached)
                continue
            row = self._row(k, r, walls)
            if r["status"] == "finished" and row["known"]:
                self._rows[(k, rid)] = row
            rows.append(row)
        if len(self._rows) > 2 * len(rows):  # forget requests the states no longer hold
            held = {(row["rank"], row["request_id"]) for row in rows}
            self._rows = {key: row for key, row in self._rows.items() if key in held}
        rows.sort(key=lambda row: (row["arrival_time"] or 0.0, row["rank"]))
        return rows

    def routing_summary(self, rows: list[RoutingRowDict] | None = None) -> RoutingSummaryDict:
        """Totals over `rows` (default: routing()): requests per engine core, prompt tokens the
        cache could cover, tokens hit, tokens the best rank held, tokens lost to routing."""
        rows = self.routing() if rows is None else rows
        known = [r for r in rows if r["known"] and r["best_tokens"] is not None]
        per = [sum(1 for r in rows if r["rank"] == k) for k in range(len(self.sessions))]
        return {"requests": len(rows), "per_rank": per, "measured": len(known),
                "hit_tokens": sum(r["hit_tokens"] for r in known),
                "best_tokens": sum(r["best_tokens"] or 0 for r in known),
                "loss_tokens": sum(r["loss_tokens"] for r in known),
                "requests_with_loss": sum(1 for r in known if r["loss_tokens"] > 0)}

    def _walls(self, session: SessionView) -> tuple[list[float], list[HistoryEntry]]:
        entries = session.history
        return [e.record["wall_time_s"] if e.record else float("-inf") for e in entries], entries

    def _row(self, k: int, r: RequestDict, walls: list[tuple[list[float], list[HistoryEntry]]]) -> RoutingRowDict:
        rid = r["request_id"]
        arrival = ((r.get("metrics") or {}).get("wall") or {}).get("arrival_time")
        hashes = self._prompt_hashes(k, rid)
        row: RoutingRowDict = {"request_id": rid, "rank": k, "label": self.labels[k], "arrival_time": arrival,
               "hit_tokens": int(r.get("num_cached_tokens") or 0), "prompt_blocks": 0, "would_hit": [],
               "best_rank": None, "best_tokens": None, "loss_tokens": 0, "known": hashes is not None}
        if hashes is None or arrival is None:
            row["known"] = False
            return row
        n_prompt = len(r.get("prompt_token_ids") or ()) or int(r.get("num_prompt_tokens") or 0)
        bs = int(self.sessions[k].current.snapshot["block_pool"]["block_size"])
        # vLLM computes a prompt's last token itself: a hit covers at most (n - 1) // bs blocks.
        limit = min(len(hashes), max(0, n_prompt - 1) // bs)
        row["prompt_blocks"] = limit
        would: list[int | None] = []
        for times, entries in walls:
            i = bisect_right(times, arrival) - 1
            if i < 0 or (i == 0 and entries[0].record is not None):
                would.append(None)  # that core's kept history starts after the arrival
                continue
            keys = self._keys(entries[i].snapshot)
            n = 0
            while n < limit and hashes[n] in keys:
                n += 1
            would.append(n * bs)
        row["would_hit"] = would
        measured = [(t, j) for j, t in enumerate(would) if t is not None]
        if measured:
            best, j = max(measured, key=lambda tj: (tj[0], tj[1] == k))
            row["best_rank"], row["best_tokens"] = j, best
            row["loss_tokens"] = max(0, best - row["hit_tokens"])
        return row

    def _prompt_hashes(self, k: int, rid: str) -> list[str] | None:
        table = getattr(self.sessions[k].source, "prompt_hashes", None)
        return None if table is None else table.get(rid)

    def _keys(self, snapshot: EngineSnapshotDict) -> frozenset[str]:
        """The prefix-cache keys a pool holds (its hashed blocks, free ones too), memoised per blocks list."""
        blocks = snapshot["block_pool"]["blocks"]
        keys = self._pool_keys.get(id(blocks))
        if keys is None:
            if len(self._pool_keys) > 64:
                self._pool_keys.clear()
            keys = self._pool_keys[id(blocks)] = frozenset(b["hash"] for b in blocks if b["hash"])
        return keys


def attach(session_cls: Any, address: str | Sequence[str], model: str | None = None, *,
           session_options: dict | None = None, ranks: int | None = None, **options: Any) -> Any:
    """Session.attach: a Session for a server with one engine core, a Fleet for more (every
    data-parallel rank of each address; `ranks` says how many a server has instead of asking),
    each Session built with `session_options` (its history's bounds)."""
    from ..drivers.vllm_live import protocol
    from ..drivers.vllm_live.client import LiveDriver

    addresses = [address] if isinstance(address, str) else list(address)
    if not addresses:
        raise ValueError("address must be a feed address (tcp://HOST:PORT) or a list of them")
    if ranks is not None and (isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1):
        raise ValueError(f"ranks must be an integer >= 1 (the server's data-parallel size) or None, got {ranks!r}")
    if len(addresses) > 1 and options.get("snapshot_address"):
        raise ValueError("snapshot_address names one server's endpoint: with several addresses each takes its "
                         "feed's port + 1")
    sessions, labels = [], []
    try:
        for n, feed in enumerate(addresses):
            first = LiveDriver.connect(feed, model, **options)
            drivers = [first]
            size = ranks or int(first.source.model_info.get("data_parallel_size") or 1)
            kv = options.get("kv_events")
            for r in range(1, size if ranks or size > 1 else 1 << 16):
                rank_feed, rank_snapshot = protocol.rank_addresses(feed, options.get("snapshot_address"), r)
                rank_options = {**options, "snapshot_address": rank_snapshot,
                                "kv_events": _rank_endpoint(kv, r) if isinstance(kv, str) else None,
                                "tokenizer": first.source.tokenizer}
                if not ranks and size <= 1:
                    if not _listening(rank_snapshot):
                        break  # nothing at rank r's snapshot endpoint: the server has r ranks
                    rank_options["timeout"] = min(float(options.get("timeout", 10.0)), PROBE_TIMEOUT)
                try:
                    drivers.append(LiveDriver.connect(rank_feed, model, **rank_options))
                except (TimeoutError, ValueError):
                    if ranks or size > 1:
                        raise
                    break  # no rank r: the server has r ranks
            for r, driver in enumerate(drivers):
                sessions.append(session_cls(engine=driver, **(session_options or {})))
                labels.append(f"rank {r}" if len(addresses) == 1 else f"server {n} rank {r}")
    except BaseException:
        for s in sessions:
            s.close()
        raise
    return sessions[0] if len(sessions) == 1 else Fleet(sessions, labels)


def _listening(address: str) -> bool:
    """Whether a TCP address accepts connections (a refused port answers at once)."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(address)
    try:
        with socket.create_connection((parts.hostname, parts.port), timeout=PROBE_TIMEOUT):
            return True
    except OSError:
        return False


def _rank_endpoint(endpoint: str, rank: int) -> str:
    """vLLM's KV-event endpoint of data-parallel rank `rank`: its port + rank (vLLM's own rule)."""
    head, _, port = endpoint.rpartition(":")
    return f"{head}:{int(port) + rank}"
