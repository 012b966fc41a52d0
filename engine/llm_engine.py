"""LLMEngine: the step loop, as in nano-vLLM's llm_engine.py. add_request queues a checked
Request; step() schedules, prepares the batch, runs the forward, samples, lets the scheduler
update, and returns a StepRecord. What it reports is built in engine/report/."""
from __future__ import annotations

import time
from typing import Any

from .config import EngineConfig, with_live_knobs
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
from .report.schema import TIME, ChangesDict, EngineMetricsDict, ModelInfoDict, TimingsDict
from .request import Request, abortable
from .runner.forward_timer import ForwardTimer
from .runner.model_runner import ModelRunner, resolve_device
from .runner.sampler import Sampler
from .sampling_params import SamplingParams
from .tokenizer import fast_decoder, load_tokenizer


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
        self.scheduler = Scheduler(self.config, self.kv, max_model_len)
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
        return self.scheduler.has_unfinished()

    def pending(self) -> int:
        """Steps ready to run now: 1 while a request is unfinished (a Session's Source protocol)."""
        return int(self.scheduler.has_unfinished())

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
        """Advance one scheduler step and report exactly what it did."""
        t0 = time.perf_counter()
        out = self.scheduler.schedule()
        t1 = t2 = time.perf_counter()
        self.step_count += 1
        for rid in out.new_requests:
            self.requests[rid].metrics.record("first_scheduled_time", time.time(), self.engine_time)
        for rid in out.preempted:
            self.requests[rid].metrics.record("preempted_times", time.time(), self.engine_time)
        batch, ran, rows, results = None, None, [], []
        if not out.is_empty:
            batch, meta, ids, pos = self.runner.prepare(out)
            t2 = time.perf_counter()
            self.forward_timer.start()
            ran = self.runner.forward(meta, ids, pos, batch.logits_indices)
            self.forward_timer.stop()
            rows = [s.request for s in out.scheduled if s.sample]
            results = self.sampler(ran.rank0_logits(), rows, with_top=self.config.record_steps)
        t3 = time.perf_counter()
        self.engine_time += t3 - t0
        token_of = {r.request_id: res.token_id for r, res in zip(rows, results)}
        finished = self.scheduler.update_from_output(out, token_of, time.time(), self.engine_time)
        t4 = time.perf_counter()
        self.engine_time += t4 - t3
        if self.config.check_invariants:
            check_invariants(self, out, batch)
        forward_s = self.forward_timer.seconds() if ran else 0.0
        ms: TimingsDict = {TIME.SCHEDULE: (t1 - t0) * 1e3, TIME.PREPARE: (t2 - t1) * 1e3, TIME.FORWARD: forward_s * 1e3,
                           # On a GPU the sampler's copy waits for the forward: not its own time.
                           TIME.SAMPLE: max(0.0, t3 - t2 - forward_s) * 1e3, TIME.UPDATE: (t4 - t3) * 1e3,
                           TIME.TOTAL: (t4 - t0) * 1e3,
                           # Part of 'forward': rank 0's wait in all-reduce / gather (0 at TP=1).
                           TIME.COLLECTIVES: ran.collective_ms if ran else 0.0}
        rec = step_record(self.step_count, out, batch, ran, rows, results, finished, ms,
                          scheduler=self.scheduler, config=self.config, backend=self.runner.backend.name,
                          engine_time=self.engine_time, decode=self.decode)
        rec.changes = self._step_changes(out)
        return rec

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
