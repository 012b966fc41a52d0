"""A recording: what a server did, kept as a file a user can share and replay (explorer.whatif).

    save_recording(session_or_entries, "run.kvrec.gz")      # or Session.save_recording(path)
    rec = Recording.load("run.kvrec.gz")

It holds what vLLM's scheduler needs to make the same decisions again, and no step's state:
- the server's settings (`Settings`: block size, blocks, budgets, max_num_seqs, prefix caching,
  chunked prefill, the long-prefill threshold, policy, hash algorithm, max_model_len);
- per request (`RecordedRequest`): the step whose `schedule()` first saw it and its arrival on
  the recording's clock, the prompt and output token ids, the sampling settings the scheduler
  reads, how it ended (and before which step an abort came), and what it measured (prefix
  hits, preemptions, token times);
- per step (`RecordedSteps`), a few numbers only: when it ended, how long it ran, the work it
  did (prefill tokens, decode requests, context tokens: what the step-time model is fitted on)
  and a 64-bit digest of its decisions (`step_decisions`), so an identity replay can be checked
  from the file alone.
So its size grows with the requests' tokens; a step adds about 60 bytes.

Which step first saw a request: its arrival on the engine clock (which advances only inside
steps) equals the clock after the step before, on every engine (kvscope's, vLLM in process, a
live server's recorder), so `arrival_step` is the step after the last one that ended at or
before it; a request that waited several steps still arrives where it was added. An abort
(finish reason 'abort', or any end outside a step) is timed the same way; one that finds the
request scheduled in that step came while the step's model ran (a server takes aborts then,
between schedule() and update), which `aborted_during_step` says.

The file is JSON lines (gzip when the name ends in .gz): a header line (format, schema version,
settings, source), then request lines and step chunks in the order they were written, then an
end line with the counts. `RecordingWriter.add(entry)` writes it incrementally from history
entries as they come (a request when it ends, steps in chunks), so a Session can write its old
steps out and keep a bounded window.
"""
from __future__ import annotations

import bisect
import dataclasses
import gzip
import hashlib
import io
import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict, cast

from engine.core.kv_cache_groups import RECORDED_GROUP_KIND, parse_group_kinds
from engine.report.schema import (
    BLOCK,
    CLOCK,
    INFO,
    METRICS,
    POOL,
    QUEUE,
    REC,
    REQ,
    RMETRICS,
    SCHED,
    SNAP,
    EngineSnapshotDict,
    KVCacheGroupDict,
    ModelInfoDict,
    RequestDict,
    StepRecordDict,
)

from .history import HistoryEntry

FORMAT = "kvscope-recording"
SCHEMA_VERSION = 1
STEP_CHUNK = 512   # steps per step line
CLOCKS = ("wall", "engine")
# kvscope's scheduling policy names -> vLLM's (vLLM's v1 scheduler mixes prefill and decode
# under one budget: kvscope's 'unified'; kvscope's 'prefill_first' has no vLLM counterpart).
KVSCOPE_POLICIES = {"unified": "fcfs"}


class RecordingError(ValueError):
    """A file that is not a recording, a damaged one, or one of another schema version."""


# -- settings --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Settings:
    """The scheduler and pool settings a run had, with vLLM's names (kvscope's where vLLM has
    none: `num_blocks` is vLLM's num_gpu_blocks, the null block included)."""

    block_size: int
    num_blocks: int
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    scheduler_reserve_full_isl: bool = True
    long_prefill_token_threshold: int = 0
    long_prefill_token_threshold_adaptive: bool = False
    policy: str = "fcfs"
    watermark: float = 0.0
    prefix_caching_hash_algo: str = "sha256"
    # A model with sliding-window layers: the window (tokens) of the KV cache group they form
    # beside the full-attention one (None: every layer attends to everything).
    sliding_window: int | None = None
    prefix_cache_retention_interval: int | None = 0   # vLLM's: which sliding-window blocks stay cached
    # A vLLM model's KV cache groups in the order vLLM allocates them ("sliding,sliding,sliding,full":
    # a 4-layer Gemma 3's); None: the full-attention group, then the sliding one where there is one.
    kv_cache_groups: str | None = None

    def replace(self, **changes: Any) -> Settings:
        unknown = set(changes) - SETTINGS_FIELDS
        if unknown:
            raise ValueError(f"unknown setting(s) {sorted(unknown)}; known: {sorted(SETTINGS_FIELDS)}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> SettingsDict:
        return cast(SettingsDict, dataclasses.asdict(self))   # its keys are the fields (checked below)


class SettingsDict(TypedDict):
    """`Settings.to_dict()`: a run's scheduler and pool settings by name."""
    block_size: int
    num_blocks: int
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    enable_prefix_caching: bool
    enable_chunked_prefill: bool
    scheduler_reserve_full_isl: bool
    long_prefill_token_threshold: int
    long_prefill_token_threshold_adaptive: bool
    policy: str
    watermark: float
    prefix_caching_hash_algo: str
    sliding_window: int | None
    prefix_cache_retention_interval: int | None
    kv_cache_groups: str | None


SETTINGS_FIELDS = frozenset(f.name for f in dataclasses.fields(Settings))
assert set(SettingsDict.__annotations__) == SETTINGS_FIELDS
_SETTING_TYPES = {f.name: str(f.type) for f in dataclasses.fields(Settings)}  # "int", "bool", ...


def settings_from_snapshot(snapshot: EngineSnapshotDict) -> tuple[Settings, list[str]]:
    """The Settings of the engine a snapshot came from (kvscope's engine, vLLM in process or a
    live server's recorder), and notes on what a vLLM replay cannot take over as it was."""
    config = snapshot.get(SNAP.CONFIG) or {}
    info: ModelInfoDict = snapshot.get(SNAP.MODEL_INFO) or {}
    pool = snapshot[SNAP.BLOCK_POOL]
    extra = dict(config.get("engine_args") or {})  # vLLM in process: engine arguments passed through
    notes = []
    policy = config.get("policy") or extra.get("policy")
    if policy is None:
        kv_policy = config.get("scheduling_policy", "unified")
        policy = KVSCOPE_POLICIES.get(kv_policy)
        if policy is None:
            notes.append(f"kvscope's scheduling_policy {kv_policy!r} has no vLLM counterpart: replayed as vLLM's "
                         "'fcfs' (prefill and decode under one budget), so steps will differ")
            policy = "fcfs"

    def pick(name: str, default: Any) -> Any:
        value = config.get(name, extra.get(name))
        return default if value is None else value

    settings = Settings(
        block_size=int(pool[POOL.BLOCK_SIZE]), num_blocks=int(pool[POOL.NUM_BLOCKS]),
        max_num_batched_tokens=int(config["max_num_batched_tokens"]), max_num_seqs=int(config["max_num_seqs"]),
        max_model_len=int(config.get("max_model_len") or info[INFO.MAX_MODEL_LEN]),
        enable_prefix_caching=bool(pick("enable_prefix_caching", True)),
        enable_chunked_prefill=bool(pick("enable_chunked_prefill", True)),
        scheduler_reserve_full_isl=bool(pick("scheduler_reserve_full_isl", True)),
        long_prefill_token_threshold=int(pick("long_prefill_token_threshold", 0)),
        long_prefill_token_threshold_adaptive=bool(pick("long_prefill_token_threshold_adaptive", False)),
        policy=str(policy), watermark=float(pick("watermark", 0.0)),
        prefix_caching_hash_algo=str(pick("prefix_caching_hash_algo", "sha256")),
        sliding_window=next((int(w) for g in info.get(INFO.KV_CACHE_GROUPS) or () if (w := g.get("sliding_window"))),
                            None),
        prefix_cache_retention_interval=config.get("prefix_cache_retention_interval",
                                                   extra.get("prefix_cache_retention_interval", 0)),
        kv_cache_groups=vllm_group_order(info.get(INFO.KV_CACHE_GROUPS) or []))
    if config.get("async_scheduling") or info.get(INFO.ASYNC_SCHEDULING):
        notes.append("the server scheduled asynchronously (each step scheduled before the previous one's update): "
                     "a replay schedules synchronously, so steps may differ from the recorded ones")
    return settings, notes


def vllm_group_order(groups: list[KVCacheGroupDict]) -> str | None:
    """model_info's kv_cache_groups as vLLM allocated them (their `vllm_group`, which vLLM's
    drivers give), for Settings.kv_cache_groups; None for one group or kvscope's full and
    sliding-window ones (`sliding_window` says those); kvscope's full and Mamba groups in
    kvscope's order, which is vLLM's."""
    if len(groups) < 2:
        return None
    if any("vllm_group" not in g for g in groups):
        kinds = [g["kind"] for g in groups]
        return "full,mamba" if kinds == ["full_attention", "mamba"] else None
    kinds = [g["kind"] for g in sorted(groups, key=lambda g: g.get("vllm_group", 0))]
    return ",".join(RECORDED_GROUP_KIND[k] for k in kinds)


# -- what a recording holds ------------------------------------------------------------------------
@dataclass
class Source:
    """Where a recording came from and what it can promise."""

    engine: str                    # "kvscope", "vLLM 0.32.0", "vLLM 0.32.0 (live server)", "Mooncake trace"
    model: str | None = None
    device: str | None = None      # 'cpu' | 'cuda': which block sizes the server's attention can use
    clock: str = "engine"          # the clock of every time below: 'wall' (a live server) or 'engine'
    kv_bytes_per_block: int | None = None   # at the recorded block size (all layers, K and V)
    first_step: int = 0            # the step before the first recorded one (0: from the engine's start)
    pristine: bool = True          # the pool was empty and nothing ran when recording began
    hash_unit: int | None = None   # a trace of block hashes: tokens per hashed unit
    created: str | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class RecordedRequest:
    """One request as the scheduler saw it. Times are seconds on the recording's clock."""

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    arrival_step: int | None        # the step whose schedule() first saw it (None: a trace has no steps)
    arrival_time: float
    arrival_seq: int                # the order the scheduler got requests in (ties of one step or instant)
    max_tokens: int                 # what the request asked for
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    priority: int = 0
    cache_salt: str | None = None      # its hash domain (vLLM's cache_salt, LoRA adapter): blocks of the same
    lora_name: str | None = None       # tokens hash apart under another domain
    finish_reason: str | None = None   # 'stop' | 'length' | 'abort' | ...; None: unfinished when recording ended
    aborted_before_step: int | None = None   # ended outside a step: before this step's update ...
    aborted_during_step: bool = False        # ... and after its schedule() (vLLM takes aborts while the model runs)
    aborted_time: float | None = None
    # What the run measured (None where not known: a trace).
    num_cached_tokens: int | None = None
    num_preemptions: int | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    token_times: list[float] = field(default_factory=list)

    @property
    def ends_by_itself(self) -> bool:
        """Finished inside a step (length, a stop token, EOS): a replay fed its output tokens
        finishes it at the same token count."""
        return self.finish_reason is not None and self.aborted_before_step is None and self.aborted_time is None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class RecordedSteps:
    """Per step, columnar: the step number, the clock when it ended, its own duration (engine
    seconds), whether the engine had work waiting when it began (`busy`: it began right after
    the previous step), the work it did, and the digest of its decisions."""

    step: list[int] = field(default_factory=list)
    end: list[float] = field(default_factory=list)
    own_s: list[float] = field(default_factory=list)
    busy: list[bool] = field(default_factory=list)
    prefill_tokens: list[int] = field(default_factory=list)
    decode_requests: list[int] = field(default_factory=list)
    context_tokens: list[int] = field(default_factory=list)
    digest: list[str] = field(default_factory=list)

    COLUMNS = ("step", "end", "own_s", "busy", "prefill_tokens", "decode_requests", "context_tokens", "digest")

    def __len__(self) -> int:
        return len(self.step)

    def extend(self, chunk: dict[str, list[Any]]) -> None:
        for name in self.COLUMNS:
            getattr(self, name).extend(chunk[name])

    def chunks(self, size: int = STEP_CHUNK) -> Iterator[dict[str, list[Any]]]:
        for lo in range(0, len(self.step), size):
            yield {name: getattr(self, name)[lo:lo + size] for name in self.COLUMNS}


@dataclass
class Recording:
    """A recording read back (Recording.load) or built whole: the settings, where it came from,
    every request and the steps' columns."""

    settings: Settings
    source: Source
    requests: list[RecordedRequest]
    steps: RecordedSteps = field(default_factory=RecordedSteps)

    @property
    def last_step(self) -> int:
        return self.steps.step[-1] if self.steps.step else self.source.first_step

    def aborted_before(self) -> dict[int, set[str]]:
        """Step -> the requests aborted just before its schedule() (step_decisions leaves them out
        of the block tables of the step before)."""
        out: dict[int, set[str]] = {}
        for r in self.requests:
            if r.aborted_before_step is not None and not r.aborted_during_step:
                out.setdefault(r.aborted_before_step, set()).add(r.request_id)
        return out

    def request(self, request_id: str) -> RecordedRequest:
        for r in self.requests:
            if r.request_id == request_id:
                return r
        raise KeyError(request_id)

    def save(self, path: str | Path) -> Path:
        """Write the whole recording (the same file RecordingWriter writes)."""
        with _open_write(Path(path)) as f:
            f.write(_line(_header(self.settings, self.source)))
            for r in self.requests:
                f.write(_line({"kind": "request", **r.to_dict()}))
            for chunk in self.steps.chunks():
                f.write(_line({"kind": "steps", **chunk}))
            f.write(_line(_end(len(self.requests), len(self.steps))))
        return Path(path)

    @classmethod
    def load(cls, path: str | Path, *, partial: bool = False) -> Recording:
        """Read and check a recording; RecordingError names the file, the line and the field.
        `partial=True` reads a file whose writer never finished (a crash, or still recording)."""
        return _read(Path(path), partial)

    def summary(self) -> str:
        s, src = self.settings, self.source
        tokens = sum(len(r.prompt_token_ids) + len(r.output_token_ids) for r in self.requests)
        return (f"{src.engine} ({src.model or 'no model named'}): {len(self.requests)} requests, {tokens} tokens, "
                f"{len(self.steps)} steps; {s.num_blocks} blocks of {s.block_size}, budget {s.max_num_batched_tokens} "
                f"tokens, {s.max_num_seqs} seqs, prefix caching {'on' if s.enable_prefix_caching else 'off'}; "
                f"clock: {src.clock}")


# -- one step's decisions, and their digest --------------------------------------------------------
class _Decisions(TypedDict):
    scheduled: list[list[Any]]   # [request id, tokens, computed before, prefix hits] per scheduled request
    new: list[str]               # admitted in the step (new, or resumed after a preemption)
    preempted: list[str]
    finished: list[str]          # finished by the step itself (they sampled in it; not an abort)
    tables: list[list[Any]]      # [request id, its block ids] per running request after the step
    # (rows are mixed lists, not tuples: they are compared with JSON's and hashed as JSON)


class DecisionsDict(_Decisions, total=False):
    """One step's decisions, each list sorted: what `step_decisions` reads from a
    step's record and a replay makes again (an identity replay compares them field by field)."""
    # Several KV cache groups: [request id, its block ids in each group past the first] per running
    # request after the step (the null block where tokens left a sliding window). Absent with one
    # group, so a one-group step's digest is what it always was.
    group_tables: list[list[Any]]


def step_decisions(record: StepRecordDict, running: Iterable[RequestDict],
                   aborted_next: Iterable[str] = ()) -> DecisionsDict:
    """What vLLM's scheduler decided in one step, in a form both a history entry and a replay
    produce: tokens scheduled per request with the computed count each started from and its
    prefix hits, admissions, preemptions, the requests the step itself finished (those that
    sampled in it: an abort is not the step's decision), and every running request's block ids
    after the step, but those aborted before the next step (a Session shows the step's entry as
    it is after such an abort, a live server's feed as it was before it)."""
    sampled = record.get(REC.SAMPLED) or {}
    gone = set(aborted_next)
    kept = [r for r in running if r[REQ.REQUEST_ID] not in gone]
    decisions: DecisionsDict = {
        "scheduled": sorted([s[SCHED.REQUEST_ID], int(s[SCHED.NUM_TOKENS]), int(s[SCHED.NUM_COMPUTED_BEFORE]),
                             int(s[SCHED.NUM_CACHED_TOKENS])] for s in record[REC.SCHEDULED]),
        "new": sorted(record.get(REC.NEW_REQUESTS) or ()),
        "preempted": sorted(record.get(REC.PREEMPTED) or ()),
        "finished": sorted(r for r in record.get(REC.FINISHED) or () if r in sampled),
        "tables": sorted([r[REQ.REQUEST_ID], [int(b) for b in r[REQ.BLOCK_TABLE]]] for r in kept)}
    if any(r.get(REQ.GROUP_BLOCK_TABLES) for r in kept):
        decisions["group_tables"] = sorted([r[REQ.REQUEST_ID], [[int(b) for b in t] for t in
                                                                 r.get(REQ.GROUP_BLOCK_TABLES) or ()]] for r in kept)
    return decisions


def decisions_digest(decisions: DecisionsDict) -> str:
    """64 bits of blake2b over the decisions' canonical JSON."""
    text = json.dumps(decisions, separators=(",", ":"), sort_keys=True)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def step_work(record: StepRecordDict) -> tuple[int, int, int]:
    """(prefill tokens, decode requests, context tokens) of a step: what its time depends on.
    Context tokens: every scheduled request's KV after the step (what attention reads)."""
    prefill = decode = context = 0
    for s in record[REC.SCHEDULED]:
        n = int(s[SCHED.NUM_TOKENS])
        if s[SCHED.IS_PREFILL]:
            prefill += n
        else:
            decode += 1
        context += int(s[SCHED.NUM_COMPUTED_BEFORE]) + n
    return prefill, decode, context


# -- writing ---------------------------------------------------------------------------------------
class RecordingWriter:
    """Writes a recording from history entries as they come (`add`), oldest first. A request is
    written once it has ended, steps in chunks of STEP_CHUNK; `close()` writes the requests still
    in flight (finish_reason None) and the end line. Holds per request only what it has not
    written yet, so memory stays bounded by the requests in flight, not by the steps."""

    def __init__(self, path: str | Path, *, notes: Iterable[str] = ()) -> None:
        self.path = Path(path)
        self._f: Any = None
        self._notes = list(notes)
        self._source: Source | None = None
        self._steps = RecordedSteps()
        self._num_steps = 0
        self._num_requests = 0
        self._clock_steps: list[int] = []     # every step number seen (the first entry's too) ...
        self._clock_times: list[float] = []   # ... and the engine clock after it
        self._last_step: int | None = None
        self._last_end: float | None = None
        self._engine_time: float = 0.0
        self._had_work = False
        self._before: set[str] = set()         # finished before recording began: not ours
        self._written: set[str] = set()
        self._open: dict[str, RequestDict] = {}  # request id -> its latest request dict
        self._in_step_finish: set[str] = set()
        self._last_scheduled: dict[str, int] = {}  # request id -> the latest step that scheduled it
        self._seq: dict[str, int] = {}         # request id -> the order the scheduler got it in
        # Steps whose digest waits for the next entry's aborts: (index, record, running requests).
        self._held: list[tuple[int, StepRecordDict, list[RequestDict]]] = []
        self._aborted_before: dict[int, set[str]] = {}     # step -> requests aborted just before it
        self._gaps: list[list[int]] = []
        self._closed = False

    # -- entries ---------------------------------------------------------------------------------
    def add(self, entry: HistoryEntry) -> None:
        """One history entry (the step-0 entry first, then each step's, in order)."""
        if self._closed:
            raise ValueError(f"the recording {self.path} is closed")
        snap = entry.snapshot
        if self._f is None:
            self._start(entry)
        elif entry.record is not None:
            self._add_step(entry.step, entry.record, snap)
        elif self._numbering_jumped(entry):
            # No step ran (the engine clock stands still), yet the step numbers moved on: a replay
            # jumping an idle gap as its recording's numbering did. Not a gap in the history; a
            # request added now is seen by the step after this number.
            self._last_step = int(entry.step)
            self._clock_steps.append(int(entry.step))
            self._clock_times.append(self._engine_time)
        self._note_requests(snap, entry.record)
        self._settle_held(before=entry.step)

    def _numbering_jumped(self, entry: HistoryEntry) -> bool:
        """A step-less entry numbered past the last step, with the engine clock where that step
        left it (a live feed's clock is the wall's: its later snapshots may follow lost steps)."""
        metrics = entry.snapshot.get(SNAP.METRICS)
        if self._last_step is None or int(entry.step) <= self._last_step or self._clock != "engine" or not metrics:
            return False
        return abs(float(metrics[METRICS.ENGINE_TIME_S] or 0.0) - self._engine_time) < 1e-12

    def _start(self, entry: HistoryEntry) -> None:
        snap = entry.snapshot
        settings, notes = settings_from_snapshot(snap)
        info: ModelInfoDict = snap.get(SNAP.MODEL_INFO) or {}
        queues = snap[SNAP.QUEUES]
        live = bool(info.get(INFO.LIVE))
        blocks = snap[SNAP.BLOCK_POOL][POOL.BLOCKS]
        pristine = not queues[QUEUE.RUNNING] and not queues[QUEUE.FINISHED] and not any(
            b[BLOCK.HASH] is not None or b[BLOCK.REF_COUNT] for b in blocks if not b[BLOCK.IS_NULL])
        if entry.record is not None:   # a history that does not begin with its step-0 entry
            pristine = False
        if not pristine:
            notes.append(f"recording began at step {entry.step}, after the engine had run: its pool held cached "
                         "blocks or requests in flight, so a replay (which starts from an empty pool) is not "
                         "claimed to reproduce the steps")
        import datetime as dt

        self._source = Source(
            engine=str(info.get(INFO.ENGINE) or "kvscope"), model=info.get(INFO.NAME),
            device=info.get(INFO.DEVICE) or (snap.get(SNAP.CONFIG) or {}).get("device"),
            clock="wall" if live else "engine", kv_bytes_per_block=info.get(INFO.KV_BYTES_PER_BLOCK),
            first_step=int(entry.step), pristine=pristine,
            created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), notes=notes + self._notes)
        self._before = {r[REQ.REQUEST_ID] for r in queues[QUEUE.FINISHED]}
        metrics = snap.get(SNAP.METRICS)
        self._engine_time = float(metrics[METRICS.ENGINE_TIME_S] or 0.0) if metrics else 0.0
        self._clock_steps.append(int(entry.step))
        self._clock_times.append(self._engine_time)
        self._last_step = int(entry.step)
        self._had_work = bool(queues[QUEUE.RUNNING] or queues[QUEUE.WAITING])
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = _open_write(self.path)
        self._f.write(_line(_header(settings, self._source)))
        if entry.record is not None:
            self._add_step(entry.step, entry.record, snap)

    def _add_step(self, step: int, record: StepRecordDict, snap: EngineSnapshotDict) -> None:
        if self._last_step is not None and step != self._last_step + 1:
            self._gaps.append([self._last_step + 1, step - 1])   # steps the history does not hold (a feed's drops)
        engine_end = float(record[REC.ENGINE_TIME_S])
        own = max(0.0, engine_end - self._engine_time)
        self._engine_time = engine_end
        end = float(record[REC.WALL_TIME_S]) if self._clock == "wall" else engine_end
        prefill, decode, context = step_work(record)
        s = self._steps
        s.step.append(int(step))
        s.end.append(end)
        s.own_s.append(own)
        s.busy.append(self._had_work and self._last_step == step - 1)
        s.prefill_tokens.append(prefill)
        s.decode_requests.append(decode)
        s.context_tokens.append(context)
        s.digest.append("")  # settled once the next entry shows which requests were aborted before it
        self._held.append((len(s) - 1, record, snap[SNAP.QUEUES][QUEUE.RUNNING]))
        self._had_work = bool(record.get(REC.NUM_RUNNING) or record.get(REC.NUM_WAITING))
        self._last_step = int(step)
        self._clock_steps.append(int(step))
        self._clock_times.append(engine_end)
        sampled = record.get(REC.SAMPLED) or {}
        self._in_step_finish.update(r for r in record.get(REC.FINISHED) or () if r in sampled)
        for x in record[REC.SCHEDULED]:
            self._last_scheduled[x[SCHED.REQUEST_ID]] = int(step)
        self._num_steps += 1

    def _settle_held(self, before: int | None = None) -> None:
        """Digest the held steps before step `before` (all: None): the entries after them have
        shown every request aborted right after them."""
        st = self._steps
        while self._held and (before is None or st.step[self._held[0][0]] < before):
            i, record, running = self._held.pop(0)
            gone = self._aborted_before.pop(st.step[i] + 1, ())
            st.digest[i] = decisions_digest(step_decisions(record, running, gone))
        if len(st) >= STEP_CHUNK:
            self._flush_steps()

    def _note_requests(self, snap: EngineSnapshotDict, record: StepRecordDict | None) -> None:
        queues = snap[SNAP.QUEUES]
        # The scheduler's order among requests first seen together: those a step admitted left the
        # head of the waiting queue in that order, the rest still wait in theirs.
        admitted = (record.get(REC.NEW_REQUESTS) or []) if record is not None else []
        for rid in [*admitted, *(r[REQ.REQUEST_ID] for r in queues[QUEUE.WAITING]),
                    *(r[REQ.REQUEST_ID] for r in queues[QUEUE.RUNNING])]:
            if rid not in self._seq and rid not in self._before:
                self._seq[rid] = len(self._seq)
        for r in (*queues[QUEUE.WAITING], *queues[QUEUE.RUNNING]):
            if r[REQ.REQUEST_ID] not in self._before:
                self._open[r[REQ.REQUEST_ID]] = r
        # By id: a Session keeping its latest max_finished requests holds the queue's length
        # still while requests keep finishing (each is in the entry of its step: Session).
        for r in queues[QUEUE.FINISHED]:
            rid = r[REQ.REQUEST_ID]
            if rid not in self._written and rid not in self._before:
                self._seq.setdefault(rid, len(self._seq))
                self._write_request(r)

    def _write_request(self, r: RequestDict) -> None:
        rid = r[REQ.REQUEST_ID]
        self._open.pop(rid, None)
        self._written.add(rid)
        req = self._request(r)
        self._last_scheduled.pop(rid, None)
        if req.aborted_before_step is not None and not req.aborted_during_step:
            self._aborted_before.setdefault(req.aborted_before_step, set()).add(rid)
        self._f.write(_line({"kind": "request", **req.to_dict()}))
        self._num_requests += 1

    def _step_after(self, engine_time: float | None) -> int | None:
        """The step whose schedule() came first after the engine clock read `engine_time`."""
        if engine_time is None:
            return None
        i = bisect.bisect_right(self._clock_times, float(engine_time) + 1e-12)
        if i == 0:
            return self._clock_steps[0] + 1
        return self._clock_steps[i - 1] + 1

    @property
    def _clock(self) -> str:
        """The recording's clock ('wall' for a live server), known from the first entry on."""
        if self._source is None:
            raise ValueError(f"nothing was added to the recording {self.path} yet: the step-0 entry comes first")
        return self._source.clock

    def _request(self, r: RequestDict) -> RecordedRequest:
        rid, metrics = r[REQ.REQUEST_ID], r[REQ.METRICS]
        m_engine, m = metrics[RMETRICS.ENGINE], metrics[RMETRICS.WALL if self._clock == "wall" else RMETRICS.ENGINE]
        params = r.get(REQ.SAMPLING_PARAMS) or {}
        arrival = m[CLOCK.ARRIVAL_TIME]
        if arrival is None:
            raise ValueError(f"request {rid!r} has no arrival time on the {self._clock} clock")
        reason = r.get(REQ.FINISH_REASON)
        outside = reason is not None and (reason == "abort" or rid not in self._in_step_finish)
        abort_step = self._step_after(m_engine.get(CLOCK.FINISHED_TIME)) if outside else None
        return RecordedRequest(
            request_id=rid, prompt_token_ids=[int(t) for t in r[REQ.PROMPT_TOKEN_IDS]],
            output_token_ids=[int(t) for t in r[REQ.OUTPUT_TOKEN_IDS]],
            arrival_step=self._step_after(m_engine.get(CLOCK.ARRIVAL_TIME)),
            arrival_time=float(arrival), arrival_seq=self._seq[rid],
            max_tokens=int(r.get(REQ.MAX_TOKENS) or params.get("max_tokens") or 1),
            ignore_eos=bool(params.get("ignore_eos", False)),
            stop_token_ids=[int(t) for t in params.get("stop_token_ids") or ()],
            finish_reason=reason,
            aborted_before_step=abort_step,
            # Scheduled in the step the abort came before: it came while that step's model ran.
            aborted_during_step=abort_step is not None and self._last_scheduled.get(rid) == abort_step,
            aborted_time=m.get(CLOCK.FINISHED_TIME) if outside else None,
            num_cached_tokens=int(r.get(REQ.NUM_CACHED_TOKENS) or 0),
            num_preemptions=int(r.get(REQ.NUM_PREEMPTIONS) or 0),
            priority=int(r.get(REQ.PRIORITY) or 0), cache_salt=r.get(REQ.CACHE_SALT), lora_name=r.get(REQ.LORA_NAME),
            first_token_time=m.get(CLOCK.FIRST_TOKEN_TIME), finished_time=m.get(CLOCK.FINISHED_TIME),
            token_times=[float(t) for t in m.get(CLOCK.TOKEN_TIMES) or ()])

    def _flush_steps(self) -> None:
        """Write the settled steps (a held one stays, with the ones after it)."""
        st = self._steps
        n = self._held[0][0] if self._held else len(st)
        if not n:
            return
        done = RecordedSteps()
        done.extend({c: getattr(st, c)[:n] for c in RecordedSteps.COLUMNS})
        for chunk in done.chunks(STEP_CHUNK):
            self._f.write(_line({"kind": "steps", **chunk}))
        rest = RecordedSteps()
        rest.extend({c: getattr(st, c)[n:] for c in RecordedSteps.COLUMNS})
        self._steps = rest
        self._held = [(i - n, rec, run) for i, rec, run in self._held]
        self._f.flush()

    # -- the end ---------------------------------------------------------------------------------
    def close(self) -> Path:
        """Write what is left (requests in flight as unfinished) and the end line."""
        if self._closed:
            return self.path
        if self._f is None:
            raise ValueError(f"nothing was added to the recording {self.path}: add the session's history entries "
                             "(the step-0 entry first)")
        for r in list(self._open.values()):
            self._write_request({**r, REQ.FINISH_REASON: None})
        self._settle_held()
        self._flush_steps()
        self._f.write(_line(_end(self._num_requests, self._num_steps, self._gaps)))
        self._f.close()
        self._closed = True
        return self.path

    def follow(self, session: Any) -> Any:
        """Write `session`'s entries as they come: its history so far now, then every new entry
        after each of its 'step' events (a live session announces one per poll, however many
        steps it applied). Returns the unsubscribe function."""
        def catch_up(event: str = "step", s: Any = session) -> None:
            if self._closed:
                return
            if event == "abort" and self._f is not None:
                # The latest entry brought up to date between steps (a live server's abort while
                # nothing ran): the request is written now, not only if another step comes.
                self._note_requests(s.current.snapshot, None)
                return
            if event != "step":
                return
            history = s.history
            i = len(history)
            while i > 0 and (self._last_step is None or history[i - 1].step > self._last_step):
                i -= 1
            for entry in history[i:]:
                if entry.record is not None or self._f is None:
                    self.add(entry)

        catch_up()
        return session.subscribe(catch_up)

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> RecordingWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._f is not None:
            self.close()


def save_recording(entries_or_session: Any, path: str | Path, *, notes: Iterable[str] = ()) -> Path:
    """Write a Session's history (or any history entries, step-0 entry first) as a recording."""
    entries = getattr(entries_or_session, "history", entries_or_session)
    writer = RecordingWriter(path, notes=notes)
    for entry in entries:
        writer.add(entry)
    return writer.close()


# -- the file --------------------------------------------------------------------------------------
def _open_write(path: Path) -> Any:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "wb"), encoding="utf-8")
    return open(path, "w", encoding="utf-8")


def _line(obj: dict[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False) + "\n"


def _header(settings: Settings, source: Source) -> dict[str, Any]:
    return {"format": FORMAT, "schema": SCHEMA_VERSION, "settings": settings.to_dict(), "source": source.to_dict()}


def _end(num_requests: int, num_steps: int, missing: list[list[int]] | None = None) -> dict[str, Any]:
    end = {"kind": "end", "num_requests": num_requests, "num_steps": num_steps}
    if missing:
        end["missing_steps"] = missing
    return end


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    try:
        with open(path, "rb") as raw:
            gz = raw.read(2) == b"\x1f\x8b"
        f = io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8") if gz else open(path, encoding="utf-8")
        with f:
            yield from enumerate(f, 1)
    except FileNotFoundError:
        raise RecordingError(f"{path}: no such file") from None
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise RecordingError(f"{path}: damaged (cannot be read as text: {exc})") from None


def _read(path: Path, partial: bool) -> Recording:
    lines = _lines(path)
    try:
        n, first = next(lines)
    except StopIteration:
        raise RecordingError(f"{path}: empty file, not a kvscope recording") from None
    header = _json(path, n, first)
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise RecordingError(f"{path}: not a kvscope recording (its first line has no \"format\": \"{FORMAT}\")")
    if header.get("schema") != SCHEMA_VERSION:
        raise RecordingError(f"{path}: a kvscope recording of schema {header.get('schema')!r}; this kvscope reads "
                             f"schema {SCHEMA_VERSION}")
    settings = _build(path, n, "settings", Settings, header.get("settings"))
    source = _build(path, n, "source", Source, header.get("source"))
    if source.clock not in CLOCKS:
        raise RecordingError(f"{path}, line {n}: source.clock must be one of {CLOCKS}, got {source.clock!r}")
    _check_settings(path, n, settings)
    rec = Recording(settings=settings, source=source, requests=[])
    end = None
    for n, text in lines:
        obj = _json(path, n, text)
        kind = obj.get("kind") if isinstance(obj, dict) else None
        if end is not None:
            raise RecordingError(f"{path}, line {n}: data after the end line")
        if kind == "request":
            rec.requests.append(_request(path, n, obj))
        elif kind == "steps":
            _steps(path, n, obj, rec.steps)
        elif kind == "end":
            end = obj
        else:
            raise RecordingError(f"{path}, line {n}: unknown line kind {kind!r} (request, steps or end)")
    if end is None and not partial:
        raise RecordingError(f"{path}: ends without its end line after {len(rec.requests)} requests and "
                             f"{len(rec.steps)} steps: the writer did not finish (it crashed, or is still "
                             "recording); Recording.load(path, partial=True) reads what is there")
    if end is not None and (end.get("num_requests"), end.get("num_steps")) != (len(rec.requests), len(rec.steps)):
        raise RecordingError(f"{path}: the end line counts {end.get('num_requests')} requests and "
                             f"{end.get('num_steps')} steps, the file holds {len(rec.requests)} and {len(rec.steps)}: "
                             "lines are missing")
    if end is not None and end.get("missing_steps"):
        spans = ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in end["missing_steps"])
        rec.source.notes.append(f"steps {spans} are missing (the feed dropped them while recording): a replay is "
                                "not claimed to reproduce the steps after them")
    ids = [r.request_id for r in rec.requests]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise RecordingError(f"{path}: request {dup!r} is recorded twice")
    return rec


def _json(path: Path, n: int, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecordingError(f"{path}, line {n}: damaged (not JSON: {exc.msg} at column {exc.colno})") from None


def _build(path: Path, n: int, what: str, cls: type, data: Any) -> Any:
    if not isinstance(data, dict):
        raise RecordingError(f"{path}, line {n}: {what} must be an object, got {type(data).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise RecordingError(f"{path}, line {n}: unknown {what} field(s) {sorted(unknown)}")
    try:
        return cls(**data)
    except TypeError as exc:
        raise RecordingError(f"{path}, line {n}: {what}: {exc}") from None


def _check_settings(path: Path, n: int, s: Settings) -> None:
    for name, kind in _SETTING_TYPES.items():
        value = getattr(s, name)
        ok = {"int": isinstance(value, int) and not isinstance(value, bool),
              "bool": isinstance(value, bool), "str": isinstance(value, str),
              "float": isinstance(value, (int, float)) and not isinstance(value, bool),
              "int | None": value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0),
              "str | None": value is None or isinstance(value, str),
              }[kind]
        if not ok:
            raise RecordingError(f"{path}, line {n}: settings.{name} must be a {kind}, got {value!r}")
    if s.kv_cache_groups is not None:
        try:
            parse_group_kinds(s.kv_cache_groups)
        except ValueError as exc:
            raise RecordingError(f"{path}, line {n}: settings.{exc}") from None
    for name in ("block_size", "num_blocks", "max_num_batched_tokens", "max_num_seqs", "max_model_len",
                 *(("sliding_window",) if s.sliding_window is not None else ())):
        if getattr(s, name) < 1:
            raise RecordingError(f"{path}, line {n}: settings.{name} must be >= 1, got {getattr(s, name)}")


def _int_list(path: Path, n: int, rid: str, name: str, value: Any, allow_empty: bool = True) -> None:
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value):
        raise RecordingError(f"{path}, line {n}: request {rid!r}: {name} must be a list of token ids (ints >= 0)")
    if not allow_empty and not value:
        raise RecordingError(f"{path}, line {n}: request {rid!r}: {name} is empty")


def _request(path: Path, n: int, obj: dict[str, Any]) -> RecordedRequest:
    obj = dict(obj)
    obj.pop("kind")
    r = _build(path, n, "request", RecordedRequest, obj)
    rid = r.request_id
    if not isinstance(rid, str) or not rid:
        raise RecordingError(f"{path}, line {n}: request_id must be a non-empty string, got {rid!r}")
    _int_list(path, n, rid, "prompt_token_ids", r.prompt_token_ids, allow_empty=False)
    _int_list(path, n, rid, "output_token_ids", r.output_token_ids)
    if not isinstance(r.arrival_time, (int, float)) or not math.isfinite(r.arrival_time):
        raise RecordingError(f"{path}, line {n}: request {rid!r}: arrival_time must be a number")
    for name in ("arrival_step", "aborted_before_step"):
        v = getattr(r, name)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise RecordingError(f"{path}, line {n}: request {rid!r}: {name} must be a step number >= 1 or null")
    if not isinstance(r.arrival_seq, int) or isinstance(r.arrival_seq, bool):
        raise RecordingError(f"{path}, line {n}: request {rid!r}: arrival_seq must be an integer")
    if not isinstance(r.max_tokens, int) or r.max_tokens < 1:
        raise RecordingError(f"{path}, line {n}: request {rid!r}: max_tokens must be an integer >= 1")
    for name in ("cache_salt", "lora_name"):
        if getattr(r, name) is not None and (not isinstance(getattr(r, name), str) or not getattr(r, name)):
            raise RecordingError(f"{path}, line {n}: request {rid!r}: {name} must be a non-empty string or null")
    return r


def _steps(path: Path, n: int, obj: dict[str, Any], into: RecordedSteps) -> None:
    cols: dict[str, list[Any]] = {k: v for k in RecordedSteps.COLUMNS if isinstance(v := obj.get(k), list)}
    missing = [k for k in RecordedSteps.COLUMNS if k not in cols]
    if missing:
        raise RecordingError(f"{path}, line {n}: a steps line lacks the list(s) {missing}")
    if len({len(v) for v in cols.values()}) != 1:
        raise RecordingError(f"{path}, line {n}: a steps line's lists differ in length")
    steps = cols["step"]
    previous = into.step[-1] if into.step else None
    for s in steps:
        if not isinstance(s, int) or (previous is not None and s <= previous):
            raise RecordingError(f"{path}, line {n}: step numbers must be increasing integers (got {s!r} after "
                                 f"{previous!r})")
        previous = s
    into.extend(cols)
