"""vLLM's own KV cache events (`--kv-events-config`), read beside the kvscope feed, and the
prefix cache they describe as a tree of block hashes.

Why a plain SUB socket hears nothing: vLLM's ZmqEventPublisher *binds* only a wildcard
(`tcp://*:PORT`), `::` or an ipc/inproc endpoint; `tcp://127.0.0.1:PORT` makes it *connect*
there. Two connecting ends never meet, so for a loopback endpoint the subscriber must bind
it (`KvEventSubscriber(..., bind=True)`, the default for tcp://127.0.0.1). Each message is
three frames: the topic (`""` unless configured), an 8-byte big-endian sequence number, and a
msgpack `KVEventBatch` [ts, [events], dp_rank], each event a map tagged by "type"
(BlockStored / BlockRemoved / AllBlocksCleared), sent once per engine step that had events.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, cast

from .protocol import event_key, received_messages


def _block_key(h: Any) -> str:
    """A stored or removed block's key: event_key of a hash, which those events never leave out."""
    return cast(str, event_key(h))


@dataclass
class PrefixNode:
    """One hashed KV block the server announced, linked to its parent block (a prefix tree node)."""
    key: str
    parent: str | None
    token_ids: list[int] = field(default_factory=list)
    children: list[str] = field(default_factory=list)
    stored: int = 0   # BlockStored events naming it (a re-store after eviction counts again)
    hits: int = 0     # prefix-cache hits on it, from the kvscope feed's block events


class PrefixTree:
    """The prefix cache as vLLM reports it: one node per cached block hash, linked to its
    parent block's hash (the chain of a cached prefix). A block whose parent was evicted
    stays, as a root marked `orphan`. A pure data structure: `apply` takes decoded events."""

    def __init__(self) -> None:
        self.nodes: dict[str, PrefixNode] = {}
        self.counters = {"stored": 0, "removed": 0, "cleared": 0, "hits": 0, "unknown": 0}

    def apply(self, event: dict) -> None:
        kind = event.get("type")
        if kind == "BlockStored":
            parent = event_key(event.get("parent_block_hash"))
            tokens = list(event.get("token_ids") or ())
            size = int(event.get("block_size") or 0) or len(tokens)
            for i, h in enumerate(event.get("block_hashes") or ()):
                key = _block_key(h)
                node = self.nodes.get(key)
                if node is None:
                    node = self.nodes[key] = PrefixNode(key, parent, tokens[i * size:(i + 1) * size])
                    if parent in self.nodes and key not in self.nodes[parent].children:
                        self.nodes[parent].children.append(key)
                node.stored += 1
                self.counters["stored"] += 1
                parent = key
        elif kind == "BlockRemoved":
            for h in event.get("block_hashes") or ():
                node = self.nodes.pop(_block_key(h), None)
                if node is not None:
                    self.counters["removed"] += 1
                    if node.parent in self.nodes:
                        self.nodes[node.parent].children.remove(node.key)
        elif kind == "AllBlocksCleared":
            self.nodes.clear()
            self.counters["cleared"] += 1
        else:
            self.counters["unknown"] += 1

    def add_hit(self, key: str | None, n: int = 1) -> None:
        node = self.nodes.get(key) if key else None
        if node is not None:
            node.hits += n
            self.counters["hits"] += n

    def keys(self) -> set[str]:
        return set(self.nodes)

    def roots(self) -> list[PrefixNode]:
        return [n for n in self.nodes.values() if n.parent not in self.nodes]

    def to_dict(self) -> dict:
        """Nested, JSON-able: [{key, tokens, stored, hits, orphan, children: [...]}]."""
        def one(node: PrefixNode) -> dict:
            return {"key": node.key, "num_tokens": len(node.token_ids), "token_ids": list(node.token_ids),
                    "stored": node.stored, "hits": node.hits, "orphan": node.parent is not None
                    and node.parent not in self.nodes, "children": [one(self.nodes[c]) for c in node.children
                                                                     if c in self.nodes]}
        return {"roots": [one(n) for n in self.roots()], "num_blocks": len(self.nodes), "counters": dict(self.counters)}

    def text(self, decode=None, width: int = 40) -> str:
        """The tree as indented lines: hash, hits, and (with `decode`) the block's text."""
        lines: list[str] = []

        def walk(node: PrefixNode, depth: int) -> None:
            label = ""
            if decode is not None and node.token_ids:
                label = " " + repr(decode(node.token_ids))[:width]
            mark = " (parent evicted)" if depth == 0 and node.parent is not None else ""
            lines.append(f"{'  ' * depth}{node.key}  hits={node.hits}{mark}{label}")
            for c in node.children:
                if c in self.nodes:
                    walk(self.nodes[c], depth + 1)

        for r in self.roots():
            walk(r, 0)
        return "\n".join(lines) if lines else "(the prefix cache is empty)"


class KvEventSubscriber:
    """Reads vLLM's KV events in a thread into a PrefixTree (bounded: the socket's HWM).

    `address` is the server's `--kv-events-config` endpoint. With a loopback tcp address the
    publisher connects, so this side binds it (`bind=None` decides by the address: bind for
    tcp://127.0.0.1 / localhost, connect for anything else, e.g. `tcp://host:PORT` of a server
    started with `tcp://*:PORT`). Start the subscriber before the server when it binds."""

    def __init__(self, address: str, *, topic: str = "", bind: bool | None = None, hwm: int = 10_000) -> None:
        import zmq

        self.address = address
        self.tree = PrefixTree()
        self.lock = threading.Lock()
        self.counters = {"batches": 0, "events": 0, "rejected": 0, "missed": 0}
        self.last_error: str | None = None
        self.last_seq: int | None = None
        self.cleared_at: list[float] = []
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.RCVHWM, hwm)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
        if bind is None:
            bind = any(h in address for h in ("127.0.0.1", "localhost", "[::1]"))
        (self._sock.bind if bind else self._sock.connect)(address)
        self._running = True
        self._thread = threading.Thread(target=self._run, name="kvscope-kv-events", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import msgspec
        import zmq

        for frames in received_messages(zmq, self._sock, lambda: self._running):
            try:
                if len(frames) != 3 or len(frames[1]) != 8:
                    raise ValueError(f"{len(frames)} frames, not vLLM's (topic, seq, batch)")
                seq = int.from_bytes(frames[1], "big", signed=True)
                batch = msgspec.msgpack.decode(frames[2])
                if not isinstance(batch, list) or len(batch) < 2 or not isinstance(batch[1], list):
                    raise ValueError("not a KVEventBatch")
            except Exception as exc:  # noqa: BLE001 - a foreign message is counted, never fatal
                self.counters["rejected"] += 1
                self.last_error = str(exc)
                continue
            with self.lock:
                if self.last_seq is not None and seq > self.last_seq + 1:
                    self.counters["missed"] += seq - self.last_seq - 1
                self.last_seq = seq
                self.counters["batches"] += 1
                for ev in batch[1]:
                    if isinstance(ev, dict):
                        if ev.get("type") == "AllBlocksCleared":
                            self.cleared_at.append(time.time())
                        self.tree.apply(ev)
                        self.counters["events"] += 1
                    else:
                        self.counters["rejected"] += 1

    def wait_for(self, predicate, timeout: float = 5.0) -> bool:
        """Poll (bounded) until predicate(tree) holds; events arrive a step late."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self.lock:
                if predicate(self.tree):
                    return True
            time.sleep(0.05)
        with self.lock:
            return bool(predicate(self.tree))

    def close(self) -> None:
        """Stop listening (a second call does nothing: a Session and its notebook may both close it)."""
        if not self._running:
            return
        self._running = False
        self._thread.join(timeout=1.0)
        self._sock.close(0)
        self._ctx.term()
