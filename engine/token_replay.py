"""TokenReplayEngine: kvscope's scheduler, KV cache manager and block pool stepped with given
output tokens in the model's place (a recording's), reporting the StepRecords and snapshots
LLMEngine reports. No torch, numpy or tokenizer: it runs where only Python does (a docs page's
Pyodide), and every scheduling and caching decision is the engine's own.

    eng = TokenReplayEngine(config, model_info)
    eng.add_request(prompt_ids, SamplingParams(max_tokens=3), "a", tokens=[11, 12, 13])
    rec = eng.step()          # schedule, pack the batch, "sample" each row's next given token, update

A step in which a request would sample past its given tokens raises TokensUsedUp after its
schedule() (the engine is then mid-step and cannot step on): a replay ends before that step.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from .config import EngineConfig, with_live_knobs
from .core.kv_cache_groups import KVCacheSpec, MambaSpec, kv_cache_group
from .core.kv_cache_manager import KVCacheManager
from .core.mamba_scheduler import MambaAlignedScheduler
from .core.scheduler import Scheduler
from .report.keys import INFO
from .report.records import EngineSnapshot, StepRecord, engine_metrics, engine_snapshot, step_record
from .report.schema import TIME, EngineMetricsDict, ModelInfoDict, TimingsDict
from .request import Request, abortable, check_fits, checked_request_args, token_id_list
from .runner.batch import SampleResult, build_batch
from .sampling_params import SamplingParams

BACKEND = "replay (given tokens, no model)"


class TokensUsedUp(LookupError):
    """A step would sample request `request_id` past its given tokens."""

    def __init__(self, request_id: str, num_given: int) -> None:
        super().__init__(f"request {request_id!r} has no given token left ({num_given} given)")
        self.request_id = request_id
        self.num_given = num_given


class TokenReplayEngine:
    """kvscope's engine with its model's place taken by each request's given tokens."""

    def __init__(self, config: EngineConfig, model_info: ModelInfoDict, *,
                 kv_cache_groups: Sequence[KVCacheSpec] | None = None,
                 decode: Callable[[Sequence[int]], str] | None = None) -> None:
        """`config` must name num_kv_blocks and max_model_len (the pool and the length a model
        would have set); `model_info` is what the snapshots say of the model (a recording's; the
        groups' kinds are added where it names none); `kv_cache_groups`: the KV cache groups,
        the full-attention one first (None: that one alone; a sliding-window group as
        attention_group_specs builds it; a Mamba group is cached in vLLM's align mode, and the
        prompts are chunked where it keeps a state); `decode`: token ids -> text (None: no text)."""
        if config.num_kv_blocks is None or config.max_model_len is None:
            raise ValueError("TokenReplayEngine needs num_kv_blocks and max_model_len in its config "
                             "(no model sizes them)")
        self.config = config
        self.decode: Callable[[Sequence[int]], str] = decode or (lambda ids: "")
        groups = list(kv_cache_groups) if kv_cache_groups is not None else None
        self.kv = KVCacheManager(config.num_kv_blocks, config.block_size, config.enable_prefix_caching,
                                 config.max_model_len, kv_cache_groups=groups,
                                 max_in_flight_tokens=config.max_num_batched_tokens,
                                 prefix_cache_retention_interval=config.prefix_cache_retention_interval)
        self.num_groups = 1 if groups is None else len(groups)
        self.info = model_info
        if groups is not None and not model_info.get(INFO.KV_CACHE_GROUPS):
            self.info = {**model_info, INFO.KV_CACHE_GROUPS: [kv_cache_group(g, []) for g in groups]}
        mamba = groups is not None and any(isinstance(g, MambaSpec) for g in groups)
        self.scheduler = (MambaAlignedScheduler if mamba else Scheduler)(config, self.kv, config.max_model_len)
        self.requests: dict[str, Request] = {}
        self.tokens: dict[str, list[int]] = {}
        self.step_count = 0
        self.engine_time = 0.0
        self.preempted_for: dict[str, str] = {}   # the latest step's: victim -> the request it made room for

    # -- requests -----------------------------------------------------------------------------
    def add_request(self, prompt_token_ids: Sequence[int], params: SamplingParams, request_id: str,
                    tokens: Sequence[int], eos_token_id: int | None = None) -> str:
        """Queue a request whose outputs will be `tokens`, in order (checked as LLMEngine checks
        a request: a ValueError names the field or the limit)."""
        params = checked_request_args(params, request_id, self.requests)
        prompt = token_id_list(prompt_token_ids)
        check_fits(prompt, params, self.config, self.kv.pool.num_blocks)
        req = Request(request_id, prompt, params, eos_token_id)
        req.metrics.record("arrival_time", time.time(), self.engine_time)
        if self.kv.hybrid is not None:
            req.group_hit_tokens = [0] * len(self.kv.hybrid.specs)
        self.requests[request_id] = req
        self.tokens[request_id] = [int(t) for t in tokens]
        self.scheduler.add(req)
        return request_id

    def abort_request(self, request_id: str) -> None:
        req = abortable(self.requests, request_id)
        self.scheduler.finish(req, "abort")
        req.metrics.record("finished_time", time.time(), self.engine_time)

    def update_scheduler_config(self, **knobs: object) -> EngineConfig:
        """Change scheduler knobs between steps, as LLMEngine.update_scheduler_config does."""
        new = with_live_knobs(self.config, knobs)
        self.kv.set_prefix_caching(new.enable_prefix_caching)
        self.config = self.scheduler.config = new
        return new

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- the step -----------------------------------------------------------------------------
    def step(self) -> StepRecord:
        """One scheduler step: schedule, pack the batch, take each sampled row's next given
        token, update (TokensUsedUp: a sampled request has none left; see the module doc)."""
        t0 = time.perf_counter()
        out = self.scheduler.schedule()
        t1 = time.perf_counter()
        self.step_count += 1
        self.preempted_for = out.preempted_for
        now = time.time()
        for rid in out.new_requests:
            self.requests[rid].metrics.record("first_scheduled_time", now, self.engine_time)
        for rid in out.preempted:
            self.requests[rid].metrics.record("preempted_times", now, self.engine_time)
        batch, rows = None, []
        if not out.is_empty:
            batch = build_batch(out, self.config.block_size, self.num_groups)[0]
            rows = [s.request for s in out.scheduled if s.sample]
        token_of = {}
        for r in rows:
            given = self.tokens[r.request_id]
            if len(r.output_token_ids) >= len(given):
                raise TokensUsedUp(r.request_id, len(given))
            token_of[r.request_id] = given[len(r.output_token_ids)]
        t2 = time.perf_counter()
        self.engine_time += t2 - t0
        finished = self.scheduler.update_from_output(out, token_of, time.time(), self.engine_time)
        t3 = time.perf_counter()
        self.engine_time += t3 - t2
        ms: TimingsDict = {TIME.SCHEDULE: (t1 - t0) * 1e3, TIME.PREPARE: (t2 - t1) * 1e3, TIME.FORWARD: 0.0,
                           TIME.SAMPLE: 0.0, TIME.UPDATE: (t3 - t2) * 1e3, TIME.TOTAL: (t3 - t0) * 1e3,
                           TIME.COLLECTIVES: 0.0}
        results = [SampleResult(token_of[r.request_id], []) for r in rows]
        rec = step_record(self.step_count, out, batch, None, rows, results, finished, ms, scheduler=self.scheduler,
                          config=self.config, backend=BACKEND, engine_time=self.engine_time, decode=self.decode)
        if batch is not None:
            rec.batch_source = "replay"   # the runner's packing, with no runner (explorer.ui.captions says so)
        return rec

    # -- inspection ---------------------------------------------------------------------------
    @property
    def metrics(self) -> EngineMetricsDict:
        return engine_metrics(self.step_count, self.engine_time, self.scheduler)

    def snapshot(self) -> EngineSnapshot:
        return engine_snapshot(self.step_count, self.config, self.info, self.metrics, self.scheduler, self.decode)
