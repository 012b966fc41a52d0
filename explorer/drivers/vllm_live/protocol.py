"""The feed's wire format, shared by the recorder (in vLLM's engine-core process) and the
client (in the notebook). One place, so both sides agree on it.

Two sockets, both bound by the recorder:
- the feed (`KVSCOPE_FEED`, default tcp://127.0.0.1:5590): an XPUB socket. Each message is
  two frames, TOPIC and a msgpack map {schema, kind: "step", run_id, seq, record, counters}:
  the framing around a StepRecord dict, whose `changes` hold what the step changed in the
  state of the message before it (engine/report/changes.py): a step costs the server what it
  did, not the size of its pool.
- the snapshot endpoint (the feed's port + 1, or `KVSCOPE_FEED_SNAPSHOT`): a REP socket. A
  client sends {schema, want: "snapshot"} and gets {schema, kind: "snapshot", run_id, seq,
  snapshot, counters} with the whole state (the latest finished requests included), then
  follows the feed from seq + 1.
"""
from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit

SCHEMA_VERSION = 3   # 3: the changes travel inside the record (engine/report/changes.py)
TOPIC = b"kvscope.feed"
DEFAULT_FEED = "tcp://127.0.0.1:5590"
ENV_FEED = "KVSCOPE_FEED"                 # the feed's address (the recorder binds it)
ENV_SNAPSHOT = "KVSCOPE_FEED_SNAPSHOT"    # the snapshot endpoint (default: the feed's port + 1)
ENV_TOKENS = "KVSCOPE_FEED_TOKENS"        # "0": leave every token id out of the feed
ENV_HWM = "KVSCOPE_FEED_HWM"              # messages queued per subscriber before drops (default 100)
ENV_FINISHED = "KVSCOPE_FEED_FINISHED"    # finished requests a snapshot keeps (default 256)
ENV_SNDBUF = "KVSCOPE_FEED_SNDBUF"        # the kernel send buffer per subscriber, bytes (default: the OS's)
LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


class FeedError(ValueError):
    """A message that is not a kvscope feed message of this schema (kept as a reason)."""


def snapshot_address(feed: str) -> str:
    """The snapshot endpoint next to a feed address: the same host, port + 1."""
    parts = urlsplit(feed)
    if parts.scheme != "tcp" or parts.port is None:
        raise ValueError(f"feed address must look like tcp://HOST:PORT, got {feed!r}")
    host = parts.hostname if ":" not in (parts.hostname or "") else f"[{parts.hostname}]"
    return f"tcp://{host}:{parts.port + 1}"


def feed_settings(env: dict | None = None) -> dict:
    """The recorder's settings from the environment (documented in README)."""
    env = os.environ if env is None else env
    feed = env.get(ENV_FEED) or DEFAULT_FEED
    return {"feed": feed, "snapshot": env.get(ENV_SNAPSHOT) or snapshot_address(feed),
            "tokens": env.get(ENV_TOKENS, "1").strip().lower() not in ("0", "false", "no", "off"),
            "hwm": int(env.get(ENV_HWM) or 100), "finished": int(env.get(ENV_FINISHED) or 256),
            "sndbuf": int(env.get(ENV_SNDBUF) or -1)}


def is_loopback(address: str) -> bool:
    return (urlsplit(address).hostname or "") in LOOPBACK


def encode(message: dict) -> bytes:
    import msgspec

    return msgspec.msgpack.encode(message)


def decode(frames: list[bytes], kind: str | None = None) -> dict:
    """One feed message from its frames; FeedError says why it is refused."""
    import msgspec

    if kind != "snapshot":
        if len(frames) != 2 or frames[0] != TOPIC:
            raise FeedError(f"not a kvscope feed message ({len(frames)} frames, topic {frames[0][:32]!r})"
                            if frames else "an empty message")
        payload = frames[1]
    else:
        if len(frames) != 1:
            raise FeedError(f"a snapshot reply has one frame, got {len(frames)}")
        payload = frames[0]
    try:
        msg: Any = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError as exc:
        raise FeedError(f"malformed message (not msgpack: {exc})") from None
    if not isinstance(msg, dict) or "schema" not in msg:
        raise FeedError("a foreign message (no kvscope schema field)")
    if msg["schema"] != SCHEMA_VERSION:
        raise FeedError(f"schema {msg['schema']!r} from the server, this kvscope reads schema {SCHEMA_VERSION}: "
                        "run the same kvscope version in the server and the notebook")
    want = kind or "step"
    if msg.get("kind") != want or not isinstance(msg.get("run_id"), str) or not isinstance(msg.get("seq"), int):
        raise FeedError(f"a {msg.get('kind')!r} message where a {want!r} one with run_id and seq was expected")
    if want == "step" and not (isinstance(msg.get("record"), dict) and isinstance(msg["record"].get("changes"), dict)):
        raise FeedError("a step message without its record and the record's changes")
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


def strip_tokens(msg: dict) -> None:
    """KVSCOPE_FEED_TOKENS=0: the feed keeps counts and block ids, never a token id. The dicts
    in `msg` are replaced by stripped copies (the recorder keeps some of them for later)."""
    snap = msg.get("snapshot") or {}
    for q in (snap.get("queues") or {}).values():
        q[:] = [_request_without_tokens(r) for r in q]
    pool = snap.get("block_pool") or {}
    changes = (msg.get("record") or {}).get("changes") or {}
    for blocks in (pool.get("blocks"), changes.get("blocks")):
        if blocks:
            blocks[:] = [{**b, "token_ids": []} for b in blocks]
    for rid, r in list(changes.get("requests", {}).items()):
        r = changes["requests"][rid] = {**r, "num_output_tokens": r["output_from"] + len(r["output_tail"]),
                                        "output_from": 0, "output_tail": []}
        if "prompt_token_ids" in r:
            r["num_prompt_tokens"], r["prompt_token_ids"] = len(r["prompt_token_ids"]), []
    if "finished" in changes:
        changes["finished"] = [_request_without_tokens(r) for r in changes["finished"]]
    rec = msg.get("record")
    if rec:
        rec["batch"]["input_ids"] = []
        for s in rec["sampled"].values():
            s["token_id"], s["top"] = None, []
    msg["tokens_left_out"] = True


def _request_without_tokens(r: dict) -> dict:
    return {**r, "num_prompt_tokens": len(r["prompt_token_ids"]), "num_output_tokens": len(r["output_token_ids"]),
            "prompt_token_ids": [], "output_token_ids": []}
