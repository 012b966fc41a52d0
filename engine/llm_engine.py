"""LLMEngine: the step loop, as in nano-vLLM's llm_engine.py. add_request queues a checked
Request; step() schedules, prepares the batch, runs the forward, samples, lets the scheduler
update, and returns a StepRecord. What it reports is built in engine/report/."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from .config import EngineConfig, with_live_knobs
from .core.async_scheduler import AsyncScheduler
from .core.kv_cache_groups import attention_group_specs
from .core.kv_cache_manager import KVCacheManager
from .core.scheduler import Scheduler, SchedulerOutput
from .executor.executor import WorkerGroup
from .input_processor import InputProcessor
from .model import ModelSpec
from .parallel import check_tensor_parallel
from .report.change_notes import ChangeNotes
from .report.invariants import check_invariants
from .report.model_info import model_info, tensor_parallel_facts
from .report.probe import AttentionProbe, probe_attention
from .report.records import (
    EngineSnapshot,
    StepRecord,
    changes_to_come,
    engine_metrics,
    engine_snapshot,
    gc_paused,
    step_record,
)
from .report.schema import AHEAD, TIME, ChangesDict, EngineMetricsDict, ModelInfoDict, TimingsDict
from .request import Request, abortable
from .runner.batch import Batch, SampleResult, fill_placeholders
from .runner.forward_timer import ForwardTimer
from .runner.model_runner import BuiltBatch, ModelRunner, ModelRunnerOutput, resolve_device
from .runner.sampler import Sampler
from .sampling_params import SamplingParams
from .tokenizer import fast_decoder, load_tokenizer


@dataclass
class _Step:
    """One step from its schedule to its record: what each phase made, and its times (ms)."""
    number: int
    out: SchedulerOutput
    in_flight: int | None     # async scheduling: the step in flight when this one was scheduled
    ms: dict[str, float]
    batch: Batch | None = None
    ran: ModelRunnerOutput | None = None
    rows: list[Request] = field(default_factory=list)
    results: list[SampleResult] = field(default_factory=list)
    sampling: Callable[[], list[SampleResult]] | None = None   # gives `results` (Sampler.launch)
    launch_s: float = 0.0   # the host's time in the forward's call and the sampler's launch
    placeholders: dict[str, int] = field(default_factory=dict)   # what its placeholder inputs held


class LLMEngine:
    """A paged-KV inference engine that advances one scheduler step per `step()` call."""

    def __init__(self, config: EngineConfig, share_model_with: LLMEngine | None = None) -> None:
        """`share_model_with`: an engine whose loaded weights and tokenizer this one reuses when
        the model, dtype, device and max_model_len agree (a pool-only reset then takes no reload)."""
        from .default_model import default_model_path, validate_model_folder

        folder = validate_model_folder(config.model if config.model is not None else default_model_path())
        spec = ModelSpec.from_folder(folder)
        max_model_len = config.max_model_len or min(4096, spec.max_position_embeddings)
        config = config.replace(model=str(folder), max_model_len=max_model_len)
        check_tensor_parallel(spec, config.tensor_parallel_size)  # before any worker starts
        self.spec = spec
        donor = share_model_with if share_model_with is not None and share_model_with._can_share(config) else None
        same_folder = share_model_with if share_model_with is not None and \
            str(share_model_with.config.model) == str(folder) else None
        # Tensor parallel: the workers start (and load their shards) while rank 0 loads its own
        # and the tokenizer; wait_ready() then joins them.
        workers = None
        if config.tensor_parallel_size > 1:
            workers = WorkerGroup(config, spec, max_model_len, resolve_device(config.device))
        self.runner: ModelRunner = ModelRunner(config, spec, max_model_len,
                                               model=donor.runner.model if donor else None, workers=workers)
        try:  # a transformers tokenizer (or tokenizers' own, from a bare tokenizer.json)
            self.tokenizer: Any = same_folder.tokenizer if same_folder else load_tokenizer(folder)
            self.runner.wait_ready()
        except BaseException:
            self.runner.shutdown()
            raise
        self.decode = fast_decoder(self.tokenizer)
        self.config: EngineConfig = config.replace(num_kv_blocks=self.runner.num_blocks)
        self.kv = KVCacheManager(self.runner.num_blocks, config.block_size, config.enable_prefix_caching,
                                 max_model_len, kv_cache_groups=attention_group_specs(spec.sliding_window),
                                 max_in_flight_tokens=config.max_num_batched_tokens,
                                 prefix_cache_retention_interval=config.prefix_cache_retention_interval)
        # vLLM's default: async scheduling on a GPU, off on a CPU (where nothing runs beside the forward).
        self.async_scheduling = config.async_scheduling if config.async_scheduling is not None \
            else self.runner.device.type == "cuda"
        self.config = self.config.replace(async_scheduling=self.async_scheduling)
        self.scheduler = (AsyncScheduler if self.async_scheduling else Scheduler)(self.config, self.kv, max_model_len)
        self._in_flight: _Step | None = None   # async scheduling: the step launched and not landed yet
        self._num_scheduled = 0
        self.sampler = Sampler(config.seed)
        self.forward_timer = ForwardTimer(self.runner.device)
        self.input_processor = InputProcessor(self.tokenizer, spec)
        self.requests: dict[str, Request] = {}
        self.step_count = 0
        self.engine_time = 0.0
        self._tp_facts = tensor_parallel_facts(spec, self.runner)
        self.notes = ChangeNotes()  # what changed since the last step / take_changes()

    def _can_share(self, config: EngineConfig) -> bool:
        mine = self.config
        return (str(mine.model) == str(config.model) and mine.max_model_len == config.max_model_len
                and mine.dtype == config.dtype and mine.device == config.device
                and mine.tensor_parallel_size == config.tensor_parallel_size == 1)

    # -- public facts -------------------------------------------------------------------
    @property
    def model_info(self) -> ModelInfoDict:
        return model_info(self.config, self.spec, self.runner, self._tp_facts)

    @property
    def num_generated_tokens(self) -> int:
        return self.scheduler.num_generated_tokens

    @property
    def num_computed_prompt_tokens(self) -> int:
        return self.scheduler.num_computed_prompt_tokens

    @property
    def waiting(self) -> list[Request]:
        return list(self.scheduler.waiting)

    @property
    def running(self) -> list[Request]:
        return list(self.scheduler.running)

    @property
    def finished(self) -> list[Request]:
        return list(self.scheduler.finished)

    def has_unfinished_requests(self) -> bool:
        """A request unfinished, or a step still in flight (async scheduling) to land."""
        return self.scheduler.has_unfinished() or self._in_flight is not None

    def pending(self) -> int:
        """Steps ready to run now: 1 while a request is unfinished or a step is in flight (a
        Session's Source protocol)."""
        return int(self.has_unfinished_requests())

    # -- requests -----------------------------------------------------------------------
    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None) -> str:
        """Validate and queue a request; returns its id. Bad input raises ValueError naming the field."""
        req = self.input_processor.process(prompt, params, request_id, self.requests, self.config,
                                           self.runner.num_blocks)
        req.metrics.record("arrival_time", time.time(), self.engine_time)
        if self.kv.hybrid is not None:  # records show each group's hit (set again at admission)
            req.group_hit_tokens = [0] * len(self.kv.hybrid.specs)
        self.requests[req.request_id] = req
        self.scheduler.add(req)
        self.notes.requests.add(req.request_id)
        return req.request_id

    def abort_request(self, request_id: str) -> None:
        """Stop a request wherever it is; its blocks are freed at once (finish_reason 'abort')."""
        req = abortable(self.requests, request_id)
        self.scheduler.finish(req, "abort")
        req.metrics.record("finished_time", time.time(), self.engine_time)
        self.notes.requests.add(request_id)

    def update_scheduler_config(self, **knobs) -> EngineConfig:
        """Change scheduler knobs between steps (validated; pool and model knobs need a new engine)."""
        new = with_live_knobs(self.config, knobs)  # every scheduler knob is live here
        if not new.enable_chunked_prefill:
            for req in [*self.scheduler.waiting, *self.scheduler.running]:
                if req.num_prompt_tokens > new.max_num_batched_tokens:
                    raise ValueError(f"max_num_batched_tokens={new.max_num_batched_tokens} with chunked prefill off "
                                     f"cannot hold request {req.request_id!r} ({req.num_prompt_tokens} prompt tokens)")
        self.kv.set_prefix_caching(new.enable_prefix_caching)
        self.config = new
        self.scheduler.config = new
        self.notes.config_changed = True
        return new

    # -- the step -----------------------------------------------------------------------
    @gc_paused()   # a step makes many small containers and no cycle: no collection walks the heap mid-step
    def step(self) -> StepRecord:
        """Advance one scheduler step and report exactly what it did.

        With async scheduling (engine/core/async_scheduler.py) one step stays in flight between
        calls, as in vLLM's engine core: a call schedules the next step before the one in flight
        lands, lands that one (its sampled tokens fill the next step's placeholder inputs),
        launches the next, and reports the one that landed. Its record's state includes the next
        step's schedule (`StepRecord.scheduled_ahead` marks a step scheduled that way)."""
        if not self.async_scheduling:
            step = self._launch_now(self._schedule(None))
            return self._record(step, self._land(step))
        step = self._in_flight or self._launch_now(self._schedule(None))
        self._in_flight = None
        ahead = self._schedule(step.number) if self.scheduler.has_unfinished() else None
        inputs = self._build(ahead) if ahead is not None else None   # while `step` runs
        finished = self._land(step)
        if ahead is not None:   # an empty one too: the scheduler lands every step it made, in order
            self._in_flight = self._launch(ahead, inputs)
        return self._record(step, finished)   # on a GPU, while `ahead` runs

    def _schedule(self, in_flight: int | None) -> _Step:
        t0 = time.perf_counter()
        out = self.scheduler.schedule()
        schedule_s = time.perf_counter() - t0
        self.engine_time += schedule_s
        self._num_scheduled += 1
        for rid in out.new_requests:
            self.requests[rid].metrics.record("first_scheduled_time", time.time(), self.engine_time)
        for rid in out.preempted:
            self.requests[rid].metrics.record("preempted_times", time.time(), self.engine_time)
        self.notes.scheduled(out)
        return _Step(self._num_scheduled, out, in_flight, {TIME.SCHEDULE: schedule_s * 1e3})

    def _build(self, step: _Step) -> BuiltBatch | None:
        """The step's packed inputs as lists (None: nothing scheduled)."""
        if step.out.is_empty:
            return None
        t0 = time.perf_counter()
        built = self.runner.build(step.out)
        step.batch = built[0]
        self._add_ms(step, TIME.PREPARE, t0)
        return built

    def _launch(self, step: _Step, built: BuiltBatch | None) -> _Step:
        """Run the step's forward and sampler on `built`, its inputs (placeholders filled first)."""
        if built is None:
            return step
        t0 = time.perf_counter()
        if step.in_flight is not None:
            step.placeholders = fill_placeholders(built[0], step.out)
        meta, ids, pos = self.runner.tensors(*built)
        t1 = self._add_ms(step, TIME.PREPARE, t0)
        self.forward_timer.start()
        step.ran = self.runner.forward(meta, ids, pos, built[0].logits_indices)
        self.forward_timer.stop()
        step.rows = [s.request for s in step.out.scheduled if s.sample]
        step.sampling = self.sampler.launch(step.ran.rank0_logits(), step.rows, with_top=self.config.record_steps)
        t2 = time.perf_counter()
        self.engine_time += t2 - t1
        step.launch_s = t2 - t1
        # Part of 'forward': rank 0's wait in all-reduce / gather (0 at TP=1).
        step.ms[TIME.COLLECTIVES] = step.ran.collective_ms
        return step

    def _launch_now(self, step: _Step) -> _Step:
        return self._launch(step, self._build(step))

    def _land(self, step: _Step) -> list[str]:
        """Take the step's sampled tokens (on a GPU: wait for its forward) and hand them to the
        scheduler; the requests it finished."""
        t0 = time.perf_counter()
        if step.sampling is not None:
            step.results = step.sampling()
            forward_s = self.forward_timer.seconds()
            t1 = time.perf_counter()
            self.engine_time += t1 - t0
            # What the launch and the tokens' copy took besides the forward is the sampler's (on
            # a GPU the copy waits for the forward: not its own time).
            step.ms[TIME.FORWARD] = forward_s * 1e3
            step.ms[TIME.SAMPLE] = max(0.0, step.launch_s + t1 - t0 - forward_s) * 1e3
            t0 = t1
        token_of = {r.request_id: res.token_id for r, res in zip(step.rows, step.results)}
        finished = self.scheduler.update_from_output(step.out, token_of, time.time(), self.engine_time)
        self._add_ms(step, TIME.UPDATE, t0)
        if self.config.check_invariants:
            check_invariants(self, step.out, step.batch)
        return finished

    def _record(self, step: _Step, finished: list[str]) -> StepRecord:
        self.step_count = step.number
        ms = step.ms
        for name in (TIME.PREPARE, TIME.FORWARD, TIME.SAMPLE, TIME.UPDATE, TIME.COLLECTIVES):
            ms.setdefault(name, 0.0)
        ms[TIME.TOTAL] = sum(ms[k] for k in (TIME.SCHEDULE, TIME.PREPARE, TIME.FORWARD, TIME.SAMPLE, TIME.UPDATE))
        rec = step_record(step.number, step.out, step.batch, step.ran, step.rows, step.results, finished,
                          cast("TimingsDict", ms),
                          scheduler=self.scheduler, config=self.config, backend=self.runner.backend.name,
                          engine_time=self.engine_time, decode=self.decode)
        if step.in_flight is not None:
            rec.scheduled_ahead = {AHEAD.IN_FLIGHT_STEP: step.in_flight, AHEAD.PLACEHOLDERS: step.placeholders}
        rec.changes = self._step_changes(step.out)
        return rec

    def _add_ms(self, step: _Step, name: str, t0: float) -> float:
        """Add the time since `t0` to the step's phase `name` and the engine clock; returns now."""
        now = time.perf_counter()
        self.engine_time += now - t0
        step.ms[name] = step.ms.get(name, 0.0) + (now - t0) * 1e3
        return now

    def take_changes(self) -> ChangesDict:
        """What actions changed since the last step or call (engine/report/changes.py): a
        Session applies it to its latest snapshot after adding, aborting or re-budgeting."""
        return self._take_changes(None)

    def _step_changes(self, out: SchedulerOutput) -> ChangesDict:
        if self.config.record_steps:
            return self._take_changes(out)
        # A lean record's: none (each request's text, clocks and table tail are observation).
        self.notes.skip(self.scheduler)
        return changes_to_come()

    def _take_changes(self, out: SchedulerOutput | None) -> ChangesDict:
        return self.notes.take(self.step_count, out, requests=self.requests, scheduler=self.scheduler,
                               config=self.config, metrics=self.metrics, decode=self.decode)

    def shutdown(self) -> None:
        """Stop the tensor-parallel worker processes (a no-op for a single-process engine)."""
        self.runner.shutdown()

    # -- inspection ---------------------------------------------------------------------
    @property
    def metrics(self) -> EngineMetricsDict:
        return engine_metrics(self.step_count, self.engine_time, self.scheduler)

    def snapshot(self) -> EngineSnapshot:
        return engine_snapshot(self.step_count, self.config, self.model_info, self.metrics, self.scheduler,
                               self.decode)

    def attention_probe(self, request_id: str, layer: int = 0, head: int | None = None) -> AttentionProbe:
        """Attention weights of the request's last computed positions, read from the paged cache."""
        return probe_attention(self.requests, request_id, layer, head, spec=self.spec, runner=self.runner,
                               decode=self.decode)
