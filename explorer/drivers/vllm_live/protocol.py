"""The feed's wire format, shared by the recorder (in vLLM's engine-core process) and the
client (in the notebook). One place, so both sides agree on it.

Two sockets per engine core, both bound by its recorder:
- the feed (`KVSCOPE_FEED`, default tcp://127.0.0.1:5590): an XPUB socket. Each message is
  two frames, TOPIC and a msgpack map {schema, kind: "step", run_id, rank, seq, counters,
  body} (wire.py's `StepMessage`, decoded typed by `decode_feed`). `body` is a step in compact
  form (explorer/drivers/vllm_live/mirror.py spells it):
  what vLLM's scheduler did since the previous message as arrays of request indices, token
  counts and block ids, with a request's name, prompt and sampling parameters sent once, when
  it arrives. The client expands it into the StepRecord dict and its `changes`
  (engine/report/changes.py) with the same code the recorder keeps its own state with.
- the snapshot endpoint (the feed's port + 1, or `KVSCOPE_FEED_SNAPSHOT`): a REP socket. A
  client sends {schema, want: "snapshot"} and gets {schema, kind: "snapshot", run_id, rank,
  seq, state, counters}: the recorder's whole compact state after message `seq`, then
  follows the feed from seq + 1.

Data parallelism: vLLM runs one engine core, so one scheduler and one recorder, per rank.
Rank r binds the configured ports + 2r (`rank_addresses`), and every message says its rank;
`Session.attach` asks rank 0 how many ranks there are and follows them all.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from .wire import FeedMessage, SnapshotMessage

# 4: compact steps expanded by the client (mirror.py); ranks. 5: the state as wire.py's structs.
# 6: the other KV cache groups' tables as the model runner holds them (each group's slots).
SCHEMA_VERSION = 6
TOPIC = b"kvscope.feed"
DEFAULT_FEED = "tcp://127.0.0.1:5590"
ENV_FEED = "KVSCOPE_FEED"                 # the feed's address (rank 0's; rank r binds port + 2r)
ENV_SNAPSHOT = "KVSCOPE_FEED_SNAPSHOT"    # the snapshot endpoint (default: the feed's port + 1)
ENV_TOKENS = "KVSCOPE_FEED_TOKENS"        # "0": leave every token id out of the feed
ENV_HWM = "KVSCOPE_FEED_HWM"              # messages queued per subscriber before drops (default 100)
ENV_FINISHED = "KVSCOPE_FEED_FINISHED"    # finished requests a snapshot keeps (default 256)
ENV_SNDBUF = "KVSCOPE_FEED_SNDBUF"        # the kernel send buffer per subscriber, bytes (default: the OS's)
LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")
RANK_STRIDE = 2   # each rank takes two ports: its feed and its snapshot endpoint
NO_FEED = "kvscope recorder: no feed from this engine core"   # the log line of a recorder that could not start


class FeedError(ValueError):
    """A message that is not a kvscope feed message of this schema (kept as a reason)."""


def _with_port(address: str, port: int) -> str:
    parts = urlsplit(address)
    host = parts.hostname if ":" not in (parts.hostname or "") else f"[{parts.hostname}]"
    return f"tcp://{host}:{port}"


def _port(address: str, what: str) -> int:
    parts = urlsplit(address)
    if parts.scheme != "tcp" or parts.port is None:
        raise ValueError(f"{what} address must look like tcp://HOST:PORT, got {address!r}")
    return parts.port


def snapshot_address(feed: str) -> str:
    """The snapshot endpoint next to a feed address: the same host, port + 1."""
    return _with_port(feed, _port(feed, "feed") + 1)


def rank_addresses(feed: str, snapshot: str | None, rank: int) -> tuple[str, str]:
    """Data-parallel rank `rank`'s feed and snapshot endpoint, derived from rank 0's: both
    ports + 2 * rank (rank 0's own ports for rank 0), so the ranks never share a port."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"rank must be an integer >= 0, got {rank!r}")
    snapshot = snapshot or snapshot_address(feed)
    step = RANK_STRIDE * rank
    return (_with_port(feed, _port(feed, "feed") + step), _with_port(snapshot, _port(snapshot, "snapshot") + step))


def feed_settings(env: Mapping[str, str] | None = None, rank: int = 0) -> dict:
    """The recorder's settings from the environment (documented in docs/attach.md), for
    data-parallel rank `rank`."""
    env = os.environ if env is None else env
    feed = env.get(ENV_FEED) or DEFAULT_FEED
    feed, snapshot = rank_addresses(feed, env.get(ENV_SNAPSHOT) or None, rank)
    return {"feed": feed, "snapshot": snapshot, "rank": rank,
            "tokens": env.get(ENV_TOKENS, "1").strip().lower() not in ("0", "false", "no", "off"),
            "hwm": int(env.get(ENV_HWM) or 100), "finished": int(env.get(ENV_FINISHED) or 256),
            "sndbuf": int(env.get(ENV_SNDBUF) or -1)}


def is_loopback(address: str) -> bool:
    return (urlsplit(address).hostname or "") in LOOPBACK


def encode(message: object) -> bytes:
    """A message (a dict, or a wire.py struct) as msgpack."""
    import msgspec

    return msgspec.msgpack.encode(message)


def decode_feed(frames: list[bytes]) -> FeedMessage:
    """One feed message from its frames, decoded into wire.py's types (so a body that does not
    fit them is refused here, whole); FeedError says why it is refused."""
    from .wire import FeedMessage

    if len(frames) != 2 or frames[0] != TOPIC:
        raise FeedError(f"not a kvscope feed message ({len(frames)} frames, topic {frames[0][:32]!r})"
                        if frames else "an empty message")
    return _typed(frames[1], FeedMessage, "step")


def decode_snapshot(frames: list[bytes]) -> SnapshotMessage:
    """A snapshot endpoint's reply, decoded into wire.py's `SnapshotMessage` (the recorder's whole
    state); FeedError says why it is refused."""
    from .wire import SnapshotMessage

    if len(frames) != 1:
        raise FeedError(f"a snapshot reply has one frame, got {len(frames)}")
    return _typed(frames[0], SnapshotMessage, "snapshot")


_DECODERS: dict[object, Any] = {}   # one msgspec Decoder per message type, made once


def _typed(payload: bytes, kind: Any, want: str) -> Any:
    """`payload` decoded as `kind` (a wire.py message type) and of this schema; else FeedError: why
    it is no `want` message (a foreign one, another schema, the recorder's own words) or where it
    does not fit the types."""
    import msgspec

    if kind not in _DECODERS:
        _DECODERS[kind] = msgspec.msgpack.Decoder(kind)
    try:
        msg = _DECODERS[kind].decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        _refuse(payload, want)
        raise FeedError(f"a malformed {want} message ({exc})") from None
    if msg.schema != SCHEMA_VERSION:
        raise FeedError(_other_schema(msg.schema))
    return msg


def _other_schema(schema: object) -> str:
    return (f"schema {schema!r} from the server, this kvscope reads schema {SCHEMA_VERSION}: "
            "run the same kvscope version in the server and the notebook")


def _refuse(payload: bytes, want: str) -> dict:
    """`payload` read without types: FeedError with the reason it is not a `want` message of this
    schema (the recorder's own words where it sent some); the message where it is one."""
    import msgspec

    try:
        msg: Any = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError as exc:
        raise FeedError(f"malformed message (not msgpack: {exc})") from None
    if not isinstance(msg, dict) or "schema" not in msg:
        raise FeedError("a foreign message (no kvscope schema field)")
    if msg["schema"] != SCHEMA_VERSION:
        raise FeedError(_other_schema(msg["schema"]))
    if msg.get("kind") == "error" and isinstance(msg.get("error"), str):  # the recorder's own words
        raise FeedError(msg["error"])
    if msg.get("kind") != want or not isinstance(msg.get("run_id"), str) or not isinstance(msg.get("seq"), int):
        raise FeedError(f"a {msg.get('kind')!r} message where a {want!r} one with run_id and seq was expected")
    body = "state" if want == "snapshot" else "body"
    if not isinstance(msg.get(body), dict) or not isinstance(msg.get("rank"), int):
        raise FeedError(f"a {want} message without its {body} or its rank")
    return msg


def event_key(h: Any) -> str | None:
    """A block hash as vLLM's KV events carry it (an int: the low 64 bits of the hash, the
    default; or the hash's bytes), as 16 hex digits: the key both the recorder's pool and the
    prefix tree use, so the two can be compared."""
    if h is None:
        return None
    if isinstance(h, int):
        return f"{h & 0xFFFFFFFFFFFFFFFF:016x}"
    return bytes(h)[:8].hex()


def received_messages(zmq: Any, sock: Any, running: Callable[[], bool]) -> Iterator[list[bytes]]:
    """Each multipart message `sock` (a SUB socket) receives, looked for every 100 ms while
    `running()` holds; it ends when `running()` no longer holds or the socket closes (ZMQError)."""
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    while running():
        try:
            if not poller.poll(100):
                continue
            frames = sock.recv_multipart(zmq.NOBLOCK)
        except zmq.ZMQError:
            return
        yield frames
