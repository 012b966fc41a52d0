"""A recording replayed through vLLM 0.32's own v1 Scheduler and KVCacheManager, with no model.

    result = replay(rec)                                  # its own settings, recorded arrival steps
    result = replay(rec, variant(rec, num_blocks=128), arrivals="timed", step_model=fit(rec))

Every decision (what to schedule, prefix hits, which block ids, preemptions) is vLLM's: the
scheduler is vLLM's class (explorer.drivers.vllm.bare builds it as EngineCore does, without
weights), and the model's place is taken by the recorded output tokens, fed back one per
sampled row, so the blocks of generated text hash and hit as they did. A request that ended by
itself (length, a stop token, EOS) gets max_tokens = its recorded output length, so it ends at
the same token in any what-if; one that ended outside a step (an abort, a stop string the API
server caught) is aborted where it was: before the same step (`arrivals="step"`), or as long
after its arrival as it was (`arrivals="timed"`). Past its recorded tokens (a what-if where it
lives longer before its abort) it is fed its last prompt token: those blocks are its own.

Arrivals:
- "step": each request is added before the schedule() of its recorded arrival step (the
  identity replay; after an idle gap the step numbers jump as the recording's did).
- "timed": a virtual clock starts at the first arrival; each step moves it by the step-time
  model's prediction for the work vLLM scheduled; a request is added to the first step that
  begins after its arrival (plus the model's admission delay). TTFT, ITL and end-to-end
  latency come from that clock, so they are predictions (with the model's held-out error);
  everything the scheduler decides is exact for those arrivals.
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from ..core.recording import DecisionsDict, Recording, decisions_digest
from ..drivers.vllm.groups import kvscope_order
from ..drivers.vllm.records import computed_before
from .settings import VLLM_TITLE, Variant
from .settings import variant as make_variant

if TYPE_CHECKING:  # numpy: a replay that is given no step model never loads it
    # vLLM's classes (mypy skips vLLM: to it they are Any)
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    from .step_model import StepTimeModel

ARRIVALS = ("step", "timed")


@dataclass
class Preemption:
    """vLLM preempted `victim` because `for_request` found no free block for its next tokens."""

    victim: str
    for_request: str | None
    lost_tokens: int           # the victim's computed tokens, freed


@dataclass
class StepDetail:
    """One replayed step as the what-if view shows it (kept with `keep_steps=True`)."""

    step: int
    decisions: DecisionsDict
    preemptions: list[Preemption]
    waiting: list[str]         # after the step, queue order
    free_blocks: int
    budget_left: int
    time: float | None


@dataclass
class RequestResult:
    """One request in a replay: the steps and virtual times of its milestones, hits and preemptions."""

    request_id: str
    arrival: float | None = None
    seen_step: int | None = None    # the step whose schedule() first saw it
    first_scheduled_step: int | None = None
    first_token_step: int | None = None
    finished_step: int | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    num_cached_tokens: int = 0      # prefix hits at its first admission
    num_preemptions: int = 0
    recomputed_tokens: int = 0
    lost_tokens: int = 0            # computed tokens freed by its latest preemption (not yet recomputed)


@dataclass
class ReplayResult:
    """A replay's per-step series (columnar), its requests and its totals."""

    variant: Variant
    arrivals: str
    steps: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)            # the virtual clock after each step (timed)
    scheduled_tokens: list[int] = field(default_factory=list)
    prefill_tokens: list[int] = field(default_factory=list)
    decode_requests: list[int] = field(default_factory=list)
    context_tokens: list[int] = field(default_factory=list)
    num_running: list[int] = field(default_factory=list)
    num_waiting: list[int] = field(default_factory=list)
    kv_usage: list[float] = field(default_factory=list)
    num_preempted: list[int] = field(default_factory=list)
    digests: list[str] = field(default_factory=list)
    details: list[StepDetail] = field(default_factory=list)
    requests: dict[str, RequestResult] = field(default_factory=dict)
    hit_tokens: int = 0               # prefix hits of requests at their first admission (vLLM's own
    query_tokens: int = 0             # prefix_cache_hits / queries count these, not re-admissions)
    resumed_hit_tokens: int = 0       # hits of requests re-admitted after a preemption
    preemptions: int = 0
    recomputed_tokens: int = 0
    seconds: float = 0.0              # the replay's own time here
    scheduler_seconds: float = 0.0    # of which inside vLLM's schedule() and update_from_output()
    step_model: StepTimeModel | None = None
    vllm_log: list[str] = field(default_factory=list)   # what vLLM logged while it built the scheduler

    @property
    def hit_rate(self) -> float | None:
        return self.hit_tokens / self.query_tokens if self.query_tokens else None

    @property
    def num_steps(self) -> int:
        return len(self.steps)


class ReplayError(RuntimeError):
    """The replay could not go on (a request that never fits, a runaway)."""


def _scheduler_class() -> type[Scheduler]:
    from vllm.v1.core.sched.scheduler import Scheduler

    class ReplayScheduler(Scheduler):
        """vLLM's Scheduler, unchanged in what it decides, noting for each preemption the
        request whose block allocation failed (the one the victim made room for)."""

        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)
            self.asking: str | None = None
            self.step_preemptions: list[Preemption] = []
            allocate = self.kv_cache_manager.allocate_slots

            def noted(request: Request, *a: object, **k: object) -> KVCacheBlocks | None:
                self.asking = request.request_id
                return allocate(request, *a, **k)

            self.kv_cache_manager.allocate_slots = noted

        def _preempt_request(self, request: Request, timestamp: float, drop_stale_output: bool = False) -> None:
            self.step_preemptions.append(Preemption(request.request_id, self.asking, int(request.num_computed_tokens)))
            super()._preempt_request(request, timestamp, drop_stale_output)

    return ReplayScheduler


_CLASS: list[type[Scheduler]] = []


def load_vllm() -> type[Scheduler]:
    """Import what a replay uses of vLLM (seconds, once per process: a sweep does it before it
    forks its workers, so they share it) and return the replay's Scheduler class. What vLLM
    prints while it imports folds into one line, its log one click away, as a vLLM start does."""
    if not _CLASS:
        from ..drivers.vllm.startup import first_vllm_import

        with first_vllm_import(VLLM_TITLE):
            from ..drivers.vllm import bare  # noqa: F401 - first: it sets vLLM's environment before vLLM reads it

            # isort: split
            import vllm.v1.outputs  # noqa: F401
            from vllm import SamplingParams  # noqa: F401

        _CLASS.append(_scheduler_class())
    return _CLASS[0]


@contextlib.contextmanager
def vllm_log() -> Iterator[list[str]]:
    """vLLM's log lines while the block runs, kept in a list instead of printed (a sweep builds
    a scheduler per replay in each worker, and each would print vLLM's config notes again)."""
    import logging

    logger = logging.getLogger("vllm")
    lines: list[str] = []

    class Keep(logging.Handler):
        """Each record's level and message, appended to `lines`."""

        def emit(self, record: logging.LogRecord) -> None:
            lines.append(f"{record.levelname} {record.getMessage()}")

    saved, propagate = logger.handlers[:], logger.propagate
    logger.handlers, logger.propagate = [Keep()], False
    try:
        yield lines
    finally:
        logger.handlers, logger.propagate = saved, propagate


def build_scheduler(rec: Recording, v: Variant) -> Scheduler:
    from ..drivers.vllm.bare import bare_scheduler

    load_vllm()
    s = v.settings
    try:
        return bare_scheduler(block_size=s.block_size, num_blocks=s.num_blocks, max_model_len=s.max_model_len,
                              max_num_batched_tokens=s.max_num_batched_tokens, max_num_seqs=s.max_num_seqs,
                              enable_chunked_prefill=s.enable_chunked_prefill,
                              enable_prefix_caching=s.enable_prefix_caching,
                              scheduler_reserve_full_isl=s.scheduler_reserve_full_isl,
                              long_prefill_token_threshold=s.long_prefill_token_threshold,
                              long_prefill_token_threshold_adaptive=s.long_prefill_token_threshold_adaptive,
                              policy=s.policy, watermark=s.watermark,
                              prefix_caching_hash_algo=s.prefix_caching_hash_algo, scheduler_cls=_CLASS[0],
                              sliding_window=s.sliding_window, kv_cache_groups=s.kv_cache_groups,
                              prefix_cache_retention_interval=s.prefix_cache_retention_interval)
    except ValueError as exc:  # vLLM's config validation (pydantic's errors are ValueErrors): its words, one line
        from .settings import SettingRejected

        raise SettingRejected(f"vLLM refuses {v.label}: {_one_line(exc)}") from None
    # Anything else is a bug (kvscope's or vLLM's), never a refusal: it propagates as itself.


def _one_line(exc: BaseException) -> str:
    lines = [ln.split(" [type=")[0].strip() for ln in str(exc).splitlines()]
    lines = [ln.replace("Value error, ", "") for ln in lines if ln and "errors.pydantic.dev" not in ln
             and "validation error" not in ln]
    return " ".join(lines) or type(exc).__name__


def replay(rec: Recording, v: Variant | None = None, *, arrivals: str = "step", step_model: StepTimeModel | None = None,
           keep_steps: bool = False, digests: bool = False, max_steps: int | None = None) -> ReplayResult:
    """Replay `rec` at `v` (default: its own settings). `keep_steps` keeps each step's decisions
    for the what-if view; `digests` each step's digest for the identity check."""
    if arrivals not in ARRIVALS:
        raise ValueError(f"arrivals must be one of {ARRIVALS}, got {arrivals!r}")
    if arrivals == "timed" and step_model is None:
        raise ValueError("timed arrivals need a step-time model (explorer.whatif.step_model.fit(recording))")
    if arrivals == "step" and any(r.arrival_step is None for r in rec.requests):
        raise ValueError("this recording (a trace) has no arrival steps: replay it with arrivals='timed'")
    return _Replay(rec, v or make_variant(rec), arrivals, step_model, keep_steps, digests, max_steps).run()


class _Replay:
    def __init__(self, rec: Recording, v: Variant, arrivals: str, model: StepTimeModel | None, keep: bool,
                 digests: bool, max_steps: int | None) -> None:
        load_vllm()   # first: vLLM's first import prints, and load_vllm folds that into one line
        from vllm import SamplingParams

        from ..drivers.vllm.bare import bare_request

        self.rec, self.v, self.arrivals, self.model = rec, v, arrivals, model
        self.keep, self.want_digests = keep, digests
        with vllm_log() as said:
            self.s = build_scheduler(rec, v)
        self._order = kvscope_order(self.s.kv_cache_config)   # the records' group order: full attention first
        self._first_full = self._order[0]
        self.result = ReplayResult(variant=v, arrivals=arrivals, step_model=model, vllm_log=said)
        self.outputs = {r.request_id: r.output_token_ids for r in rec.requests}
        self.filler = {r.request_id: r.prompt_token_ids[-1] for r in rec.requests}
        st = v.settings
        too_long = [r.request_id for r in rec.requests if len(r.prompt_token_ids) >= st.max_model_len]
        if too_long:
            raise ReplayError(f"request {too_long[0]!r}'s prompt does not fit max_model_len {st.max_model_len}")
        bs, algo = st.block_size, st.prefix_caching_hash_algo
        origin = min((r.arrival_time for r in rec.requests), default=0.0)
        self.origin = origin
        order = sorted(rec.requests, key=(lambda r: (r.arrival_step, r.arrival_seq)) if arrivals == "step"
                       else (lambda r: (r.arrival_time, r.arrival_seq)))
        self.pending: list[tuple[float, str, Request]] = []   # (when, request id, vLLM Request)
        self.aborts: list[tuple[float, str]] = []
        self.aborts_during: dict[int, list[str]] = {}     # step -> aborted after its schedule(), before its update
        delay = model.admission_delay if model is not None else 0.0
        for r in order:
            by_itself = r.ends_by_itself or r.finish_reason is None
            n_out = len(r.output_token_ids)
            max_tokens = max(1, n_out) if r.ends_by_itself else max(r.max_tokens, n_out + 1)
            params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
            req = bare_request(r.request_id, r.prompt_token_ids, params, bs, hash_algo=algo,
                               arrival_time=r.arrival_time, priority=r.priority, cache_salt=r.cache_salt,
                               lora_name=r.lora_name)
            if arrivals == "step":
                when = float(cast(int, r.arrival_step))  # replay() refuses step arrivals a request lacks
                # Not by itself: aborted outside a step, whose step the recording names.
                abort_step = cast(int, r.aborted_before_step)
                if not by_itself and r.aborted_during_step:
                    self.aborts_during.setdefault(abort_step, []).append(r.request_id)
                elif not by_itself:
                    self.aborts.append((float(abort_step), r.request_id))
            else:
                when = r.arrival_time - origin + delay
                if not by_itself and r.aborted_time is not None:
                    self.aborts.append((when + (r.aborted_time - r.arrival_time), r.request_id))
            self.pending.append((when, r.request_id, req))
            self.result.requests[r.request_id] = RequestResult(r.request_id, arrival=(
                r.arrival_time - origin if arrivals == "timed" else when))
        self.aborts.sort()
        self.aborted_before: dict[int, set[str]] = {}
        if arrivals == "step":
            for when, rid in self.aborts:
                self.aborted_before.setdefault(int(when), set()).add(rid)
        self.limit = max_steps or (20 * max(len(rec.steps), 1) + 20 * sum(
            len(r.prompt_token_ids) + len(r.output_token_ids) for r in rec.requests) + 1000)

    # -- the loop --------------------------------------------------------------------------------
    def run(self) -> ReplayResult:
        from vllm.v1.request import RequestStatus

        s, res = self.s, self.result
        t0 = time.perf_counter()
        pending, aborts = self.pending, self.aborts
        p = a = 0
        clock = 0.0 if self.arrivals == "timed" else float(self.rec.source.first_step)
        step = self.rec.source.first_step
        while p < len(pending) or s.has_unfinished_requests():
            step += 1
            idle = not s.has_unfinished_requests()
            if self.arrivals == "step":
                if idle:  # after an idle gap the recording's step numbers jump to the next arrival
                    step = max(step, int(pending[p][0]))
                now = clock = float(step)
            else:
                if idle:  # the clock jumps to the next arrival
                    clock = max(clock, pending[p][0])
                now = clock
            while p < len(pending) and pending[p][0] <= now + 1e-9:
                s.add_request(pending[p][2])
                res.requests[pending[p][1]].seen_step = step
                p += 1
            while a < len(aborts) and aborts[a][0] <= now + 1e-9:
                s.finish_requests(aborts[a][1], RequestStatus.FINISHED_ABORTED)
                a += 1
            if not s.has_unfinished_requests():
                continue
            if len(res.steps) >= self.limit:
                raise ReplayError(f"{self.v.label}: no end after {self.limit} steps ({s.get_num_unfinished_requests()} "
                                  "requests unfinished): a request may never fit this pool")
            clock = self._step(step, clock)
        res.seconds = time.perf_counter() - t0
        return res

    def _step(self, step: int, clock: float) -> float:
        s, res = self.s, self.result
        s.step_preemptions = []
        t0 = time.perf_counter()
        out = s.schedule()
        t1 = time.perf_counter()
        before, admitted = computed_before(out)
        prefill = decode = context = 0
        reqs = s.requests
        sampled: dict[str, int] = {}
        queried = 0
        for rid, n in out.num_scheduled_tokens.items():
            req = reqs[rid]
            b = before[rid]
            num_tokens = req.num_tokens
            if rid in admitted and res.requests[rid].first_scheduled_step is None:
                queried += num_tokens
            if n == 1 and b == num_tokens - 1 and b >= req.num_prompt_tokens:
                decode += 1
            else:
                prefill += n
            context += b + n
            if b + n >= num_tokens:  # every known token computed: this row samples
                i = len(req.output_token_ids)
                out_ids = self.outputs[rid]
                sampled[rid] = out_ids[i] if i < len(out_ids) else self.filler[rid]
        mro = _runner_output(out, sampled)
        during = self.aborts_during.get(step)
        if during:  # a server takes aborts while the model runs: after schedule(), before the update
            from vllm.v1.request import RequestStatus

            s.finish_requests(during, RequestStatus.FINISHED_ABORTED)
        t2 = time.perf_counter()
        eco = s.update_from_output(out, mro)
        t3 = time.perf_counter()
        res.scheduler_seconds += (t1 - t0) + (t3 - t2)
        now = clock + self.model.predict(prefill, decode, context) if self.model is not None and \
            self.arrivals == "timed" else clock
        finished = [o.request_id for outs in eco.values() for o in outs.outputs if o.finish_reason is not None]
        res.query_tokens += queried
        self._account(step, before, admitted, sampled, finished, now)
        res.steps.append(step)
        res.times.append(now)
        res.scheduled_tokens.append(out.total_num_scheduled_tokens)
        res.prefill_tokens.append(prefill)
        res.decode_requests.append(decode)
        res.context_tokens.append(context)
        res.num_running.append(len(s.running))
        res.num_waiting.append(len(s.waiting) + len(s.kv_holding_waiting))
        res.kv_usage.append(float(s.kv_cache_manager.usage))
        res.num_preempted.append(len(s.step_preemptions))
        if self.keep or self.want_digests:
            self._decisions(step, out, before, admitted, sampled, finished, now)
        return now

    def _account(self, step: int, before: dict[str, int], admitted: set[str], sampled: Iterable[str],
                 finished: list[str], now: float) -> None:
        account_step(self.result, step, self.s.step_preemptions, before, admitted, sampled, finished, now)

    def _decisions(self, step: int, out: SchedulerOutput, before: dict[str, int], admitted: set[str],
                   sampled: Collection[str], finished: list[str], now: float) -> None:
        s = self.s
        sched = sorted([rid, int(n), int(before[rid]), int(before[rid]) if rid in admitted else 0]
                       for rid, n in out.num_scheduled_tokens.items())
        new = sorted(admitted)  # new and resumed, as a record's new_requests lists them
        gone = self.aborted_before.get(step + 1, ())  # left out of the step's tables, as step_decisions does
        # The records' table is the full-attention group's, wherever vLLM put it; the others follow.
        blocks = {r.request_id: s.kv_cache_manager.coordinator.get_blocks(r.request_id)
                  for r in s.running if r.request_id not in gone}
        g, others = self._first_full, self._order[1:]
        dec: DecisionsDict = {"scheduled": sched, "new": new, "preempted": sorted(out.preempted_req_ids or ()),
                              "finished": sorted(r for r in finished if r in sampled),
                              "tables": sorted([rid, [b.block_id for b in by_group[g]]]
                                               for rid, by_group in blocks.items())}
        if others and blocks:   # as step_decisions: present where a running request has other groups
            dec["group_tables"] = sorted([rid, [[b.block_id for b in by_group[o]] for o in others]]
                                         for rid, by_group in blocks.items())
        if self.want_digests:
            self.result.digests.append(decisions_digest(dec))
        if self.keep:
            self.result.details.append(StepDetail(
                step=step, decisions=dec, preemptions=list(s.step_preemptions),
                waiting=[r.request_id for r in [*s.waiting, *s.kv_holding_waiting]],
                free_blocks=int(s.kv_cache_manager.block_pool.get_num_free_blocks()),
                budget_left=int(s.max_num_scheduled_tokens - out.total_num_scheduled_tokens),
                time=now if self.arrivals == "timed" else None))


def _runner_output(out: SchedulerOutput, sampled: dict[str, int]) -> ModelRunnerOutput:
    from vllm.v1.outputs import ModelRunnerOutput

    ids = list(out.num_scheduled_tokens)
    return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                             sampled_token_ids=[[sampled[r]] if r in sampled else [] for r in ids])


def account_step(res: ReplayResult, step: int, preemptions: list[Preemption], before: dict[str, int],
                 admitted: set[str], sampled: Iterable[str], finished: list[str], now: float) -> None:
    """Count one replayed step into `res`: its preemptions, the prefix hits of the requests it
    admitted (first admissions apart from re-admissions, whose lost tokens are recomputed), the
    requests that sampled and those that finished. `before`: each scheduled request's computed
    tokens before the step."""
    reqs = res.requests
    for p in preemptions:
        r = reqs[p.victim]
        r.num_preemptions += 1
        r.lost_tokens = p.lost_tokens
        res.preemptions += 1
    for rid in admitted:
        r = reqs[rid]
        b = int(before[rid])
        if r.first_scheduled_step is None:
            r.first_scheduled_step = step
            r.num_cached_tokens = b
            res.hit_tokens += b
            continue
        res.resumed_hit_tokens += b
        if r.lost_tokens:
            recomputed = max(0, r.lost_tokens - b)
            r.recomputed_tokens += recomputed
            res.recomputed_tokens += recomputed
            r.lost_tokens = 0
    for rid in sampled:
        r = reqs[rid]
        if r.first_token_step is None:
            r.first_token_step, r.first_token_time = step, now
        r.token_times.append(now)
    for rid in finished:
        reqs[rid].finished_step, reqs[rid].finished_time = step, now
