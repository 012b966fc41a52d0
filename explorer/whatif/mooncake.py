"""Mooncake's public trace format as a recording: one JSON object a line,

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, ...]}

(timestamp in milliseconds; each hash id names one unit of `hash_unit` prompt tokens, 512 in
Mooncake's traces, chained: two requests share a unit's id only when they share the whole prefix
up to its end). There are no tokens, so each unit gets token ids of its own: the first two spell
its id (two different ids never give the same block), the rest follow from it. A block of a
size that divides the unit then lies inside one unit, and two requests' blocks are equal
exactly when the trace says their units are; at a block size that does not divide the unit a
block would straddle two units, and whether it hits would depend on invented tokens, so those
block sizes are refused (explorer.whatif.settings.check). Within a unit whose id differs, real
prompts may still share the unit's first tokens; the trace does not say, so at block sizes
below the unit the hit tokens are a lower bound.

A trace has no server settings and no step timings: `load_trace` takes the settings to start
from, and a timed replay needs a step-time model fitted on a recording of a real server.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TypeAlias

from ..core.recording import RecordedRequest, Recording, RecordingError, Settings, Source

HASH_UNIT = 512
VOCAB = 32000

# A parsed JSON value, before `_request` checks it is a Mooncake request.
JSONValue: TypeAlias = str | int | float | bool | list["JSONValue"] | dict[str, "JSONValue"] | None


def unit_tokens(hash_id: int, unit: int, vocab: int = VOCAB) -> list[int]:
    """The token ids standing for one hashed unit: its id in the first two, then a walk from it."""
    base = vocab - 1
    out = [1 + hash_id % base, 1 + (hash_id // base) % base]
    x = (hash_id * 2654435761 + 12345) & 0xFFFFFFFF
    for _ in range(unit - 2):
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        out.append(1 + x % base)
    return out


def load_trace(path: str | Path, *, block_size: int = 16, num_blocks: int = 4096, max_num_batched_tokens: int = 2048,
               max_num_seqs: int = 256, max_model_len: int | None = None, hash_unit: int = HASH_UNIT,
               enable_prefix_caching: bool = True, kv_bytes_per_block: int | None = None, device: str | None = None,
               limit: int | None = None) -> Recording:
    """A Mooncake trace as a Recording (no steps; arrivals on the wall clock), at these settings.
    `limit`: the first requests only. RecordingError names the line and the field of bad input."""
    path = Path(path)
    requests: list[RecordedRequest] = []
    cache: dict[int, list[int]] = {}
    try:
        f = open(path, encoding="utf-8")
    except OSError as exc:
        raise RecordingError(f"{path}: {exc.strerror or exc}") from None
    with f:
        for n, line in enumerate(f, 1):
            if limit is not None and len(requests) >= limit:
                break
            if not line.strip():
                continue
            requests.append(_request(path, n, line, len(requests), hash_unit, cache))
    if not requests:
        raise RecordingError(f"{path}: no requests (a Mooncake trace has one JSON object per line)")
    longest = max(len(r.prompt_token_ids) + len(r.output_token_ids) for r in requests)
    settings = Settings(block_size=block_size, num_blocks=num_blocks, max_num_batched_tokens=max_num_batched_tokens,
                        max_num_seqs=max_num_seqs, max_model_len=max_model_len or longest,
                        enable_prefix_caching=enable_prefix_caching)
    source = Source(engine="Mooncake trace", model=path.name, device=device, clock="wall",
                    kv_bytes_per_block=kv_bytes_per_block, hash_unit=hash_unit,
                    notes=[f"a trace of block hashes ({hash_unit} tokens a unit): tokens are made up per unit, so "
                           "hits inside a unit whose hash differs are not counted (a lower bound below the unit)"])
    return Recording(settings=settings, source=source, requests=requests)


def _request(path: Path, n: int, line: str, index: int, unit: int, cache: dict[int, list[int]]) -> RecordedRequest:
    try:
        obj: JSONValue = json.loads(line)
    except json.JSONDecodeError as exc:
        raise RecordingError(f"{path}, line {n}: not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise RecordingError(f"{path}, line {n}: a Mooncake request is an object, got {type(obj).__name__}")
    missing = [k for k in ("timestamp", "input_length", "output_length", "hash_ids") if k not in obj]
    if missing:
        raise RecordingError(f"{path}, line {n}: lacks {missing} (Mooncake's fields: timestamp, input_length, "
                             "output_length, hash_ids)")
    ts = obj["timestamp"]
    if not isinstance(ts, (int, float)) or isinstance(ts, bool) or ts < 0:
        raise RecordingError(f"{path}, line {n}: timestamp must be milliseconds >= 0, got {ts!r}")
    n_in = _length(path, n, "input_length", obj["input_length"])
    n_out = _length(path, n, "output_length", obj["output_length"])
    raw = obj["hash_ids"]
    ids = [h for h in raw if isinstance(h, int) and not isinstance(h, bool) and h >= 0] if isinstance(raw, list) else []
    if not isinstance(raw, list) or len(ids) != len(raw):
        raise RecordingError(f"{path}, line {n}: hash_ids must be a list of integers >= 0")
    if len(ids) != -(-n_in // unit):
        raise RecordingError(f"{path}, line {n}: hash_ids has {len(ids)} ids for {n_in} input tokens; at {unit} tokens "
                             f"a unit that is {-(-n_in // unit)} (is the trace's hash unit {unit}?)")
    prompt: list[int] = []
    for h in ids:
        if h not in cache:
            cache[h] = unit_tokens(h, unit)
        prompt.extend(cache[h])
    del prompt[n_in:]
    # Output tokens of its own: a request's generated blocks never match another's.
    x = (index * 2246822519 + 7) & 0x7FFFFFFF
    output = []
    for _ in range(n_out):
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        output.append(1 + x % (VOCAB - 1))
    return RecordedRequest(request_id=str(index), prompt_token_ids=prompt, output_token_ids=output, arrival_step=None,
                           arrival_time=float(ts) / 1000.0, arrival_seq=index, max_tokens=n_out, ignore_eos=True,
                           finish_reason="length")


def _length(path: Path, n: int, name: str, v: JSONValue) -> int:
    """A request's `name` field, checked: an integer >= 1."""
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise RecordingError(f"{path}, line {n}: {name} must be an integer >= 1, got {v!r}")
    return v
