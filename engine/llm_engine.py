"""LLMEngine: the step loop. add_request -> step() (schedule, prepare, forward, sample,
update) -> StepRecord; snapshot() and attention_probe() expose the state for the explorer."""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import torch

from .config import SCHEDULER_KNOBS, EngineConfig
from .core.kv_cache_manager import KVCacheManager, cdiv
from .core.scheduler import Scheduler, SchedulerOutput
from .distributed import check_tensor_parallel
from .distributed.executor import WorkerGroup
from .distributed.sharding import rank_ranges, sharding_layout
from .forward_timer import ForwardTimer
from .model import ModelSpec
from .model_runner import ModelRunner, resolve_device
from .records import EngineSnapshot, StepRecord, block_pool_dict, gc_paused, request_dict
from .request import Request, RequestStatus, checked_request_args, token_id_list
from .sampler import Sampler
from .sampling_params import SamplingParams
from .tokenizer import fast_decoder, load_tokenizer


@dataclass
class AttentionProbe:
    """Attention weights of a request's last computed query positions over its whole context,
    recomputed from the paged KV cache. probs: [len(heads), num_queries, context_len]."""

    request_id: str
    layer: int
    heads: list[int]
    kv_head_of_head: list[int]
    query_positions: list[int]
    context_len: int
    block_size: int
    block_table: list[int]
    token_ids: list[int]
    tokens: list[str]
    probs: torch.Tensor

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in (
            "request_id", "layer", "heads", "kv_head_of_head", "query_positions", "context_len",
            "block_size", "block_table", "token_ids", "tokens")} | {"probs": self.probs.tolist()}


class LLMEngine:
    """A paged-KV inference engine that advances one scheduler step per `step()` call."""

    def __init__(self, config: EngineConfig, share_model_with: "LLMEngine | None" = None) -> None:
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
        same_folder = share_model_with is not None and str(share_model_with.config.model) == str(folder)
        # Tensor parallel: the workers start (and load their shards) while rank 0 loads its own
        # and the tokenizer; wait_ready() then joins them.
        workers = None
        if config.tensor_parallel_size > 1:
            workers = WorkerGroup(config, spec, max_model_len, resolve_device(config.device))
        self.runner = ModelRunner(config, spec, max_model_len, model=donor.runner.model if donor else None,
                                  workers=workers)
        try:
            self.tokenizer = share_model_with.tokenizer if same_folder else load_tokenizer(folder)
            self.runner.wait_ready()
        except BaseException:
            self.runner.shutdown()
            raise
        self.decode = fast_decoder(self.tokenizer)
        self.config = config.replace(num_kv_blocks=self.runner.num_blocks)
        self.kv = KVCacheManager(self.runner.num_blocks, config.block_size, config.enable_prefix_caching,
                                 max_model_len)
        self.scheduler = Scheduler(self.config, self.kv, max_model_len)
        self.sampler = Sampler(config.seed)
        self.forward_timer = ForwardTimer(self.runner.device)
        self.requests: dict[str, Request] = {}
        self.step_count = 0
        self.engine_time = 0.0
        self._ids = itertools.count()
        eos = spec.eos_token_ids or ((self.tokenizer.eos_token_id,) if self.tokenizer.eos_token_id is not None else ())
        self.eos_token_id = eos[0] if eos else None
        self.extra_stop_ids = list(eos[1:])
        self._tp_facts = self._tp_info()

    def _can_share(self, config: EngineConfig) -> bool:
        mine = self.config
        return (str(mine.model) == str(config.model) and mine.max_model_len == config.max_model_len
                and mine.dtype == config.dtype and mine.device == config.device
                and mine.tensor_parallel_size == config.tensor_parallel_size == 1)

    # -- public facts -------------------------------------------------------------------
    @property
    def model_info(self) -> dict:
        s, r = self.spec, self.runner
        return {"name": str(self.config.model).rstrip("/").split("/")[-1], "architecture": s.model_type,
                "num_layers": s.num_layers, "num_heads": s.num_heads, "num_kv_heads": s.num_kv_heads,
                "head_dim": s.head_dim, "hidden_size": s.hidden_size, "vocab_size": s.vocab_size,
                "dtype": str(self.runner.dtype).replace("torch.", ""), "device": str(self.runner.device),
                "max_model_len": self.config.max_model_len, "attention_backend": self.runner.backend.name,
                "cuda_graphs": None if r.graphs is None else r.graphs.sizes, "cuda_graphs_off": r.graph_off_reason,
                "kv_bytes_per_block": self.runner.bytes_per_block} | self._tp_facts

    def _tp_info(self) -> dict:
        """Per-rank facts: what each rank holds of the model and of the KV pool (fixed for the
        engine's life: built once, shared by every snapshot, read-only)."""
        s, r = self.spec, self.runner
        n = r.tp.size
        per_rank_kv = r.num_blocks * r.bytes_per_block_per_rank
        ranks = [d | {"device": str(r.device if d["rank"] == 0 or r.device.type == "cpu"
                                    else f"cuda:{d['rank']}"), "kv_bytes": per_rank_kv}
                 for d in rank_ranges(s, n)]
        return {"tensor_parallel_size": n, "tp_backend": r.tp.backend,
                "num_heads_per_rank": s.num_heads // n, "num_kv_heads_per_rank": s.num_kv_heads // n,
                "intermediate_size": s.intermediate_size, "tie_word_embeddings": s.tie_word_embeddings,
                "kv_bytes_per_block_per_rank": r.bytes_per_block_per_rank, "kv_bytes_per_rank": per_rank_kv,
                "tensor_parallel": {"ranks": ranks, "weights": sharding_layout(s, n)}}

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

    # -- requests -----------------------------------------------------------------------
    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None) -> str:
        """Validate and queue a request; returns its id. Bad input raises ValueError naming the field."""
        params = checked_request_args(params, request_id, self.requests)
        token_ids, text = self._tokenize(prompt)
        self._check_fits(token_ids, params)
        if request_id is None:  # only a valid request takes the next id
            request_id = next(i for i in (str(n) for n in self._ids) if i not in self.requests)
        req = Request(request_id, token_ids, params, self.eos_token_id, prompt_text=text)
        if self.extra_stop_ids:
            req.params = SamplingParams(**{**params.to_dict(),
                                           "stop_token_ids": params.stop_token_ids + self.extra_stop_ids})
        if params.seed is not None:
            req.generator = torch.Generator().manual_seed(params.seed)
        req.metrics.record("arrival_time", time.time(), self.engine_time)
        self.requests[request_id] = req
        self.scheduler.add(req)
        return request_id

    def _tokenize(self, prompt: str | list[int]) -> tuple[list[int], str | None]:
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt must not be empty")
            return list(self.tokenizer(prompt)["input_ids"]), prompt
        token_ids = token_id_list(prompt)
        vocab = self.spec.vocab_size
        for i, t in enumerate(token_ids):
            if not 0 <= t < vocab:
                raise ValueError(f"token id {t} at index {i} is outside the vocabulary [0, {vocab})")
        return token_ids, None

    def _check_fits(self, token_ids: list[int], params: SamplingParams) -> None:
        cfg, n = self.config, len(token_ids)
        if n > cfg.max_model_len:
            raise ValueError(f"prompt has {n} tokens, more than max_model_len={cfg.max_model_len}")
        if not cfg.enable_chunked_prefill and n > cfg.max_num_batched_tokens:
            raise ValueError(f"prompt has {n} tokens, more than max_num_batched_tokens="
                             f"{cfg.max_num_batched_tokens} (chunked prefill is off)")
        longest = min(n + params.max_tokens, cfg.max_model_len)
        need = cdiv(longest, cfg.block_size)
        if need > self.runner.num_blocks - 1:
            raise ValueError(f"a request of {longest} tokens (prompt + max_tokens, capped at max_model_len) "
                             f"needs {need} KV blocks; num_kv_blocks={self.runner.num_blocks} leaves only "
                             f"{self.runner.num_blocks - 1} usable")

    def abort_request(self, request_id: str) -> None:
        """Stop a request wherever it is; its blocks are freed at once (finish_reason 'abort')."""
        req = self.requests.get(request_id)
        if req is None:
            raise ValueError(f"request_id {request_id!r} does not exist")
        if req.is_finished:
            raise ValueError(f"request_id {request_id!r} already finished ({req.finish_reason})")
        self.scheduler.finish(req, "abort")
        req.metrics.record("finished_time", time.time(), self.engine_time)

    def update_scheduler_config(self, **knobs) -> EngineConfig:
        """Change scheduler knobs between steps (validated; pool and model knobs need a new engine)."""
        bad = set(knobs) - set(SCHEDULER_KNOBS)
        if bad:
            raise ValueError(f"{sorted(bad)} cannot change on a live engine; live knobs: {list(SCHEDULER_KNOBS)}")
        new = self.config.replace(**knobs)
        if not new.enable_chunked_prefill:
            for req in [*self.scheduler.waiting, *self.scheduler.running]:
                if req.num_prompt_tokens > new.max_num_batched_tokens:
                    raise ValueError(f"max_num_batched_tokens={new.max_num_batched_tokens} with chunked prefill off "
                                     f"cannot hold request {req.request_id!r} ({req.num_prompt_tokens} prompt tokens)")
        self.kv.set_prefix_caching(new.enable_prefix_caching)
        self.config = new
        self.scheduler.config = new
        return new

    # -- the step -----------------------------------------------------------------------
    def step(self) -> StepRecord:
        """Advance one scheduler step and report exactly what it did."""
        t0 = time.perf_counter()
        self.kv.pool.begin_step()
        out = self.scheduler.schedule()
        t1 = time.perf_counter()
        self.step_count += 1
        engine_start = self.engine_time
        for rid in out.new_requests:
            req = self.requests[rid]
            req.metrics.record("first_scheduled_time", time.time(), engine_start)
        for rid in out.preempted:
            self.requests[rid].metrics.record("preempted_times", time.time(), engine_start)
        batch, sampled_rows = None, []
        t2 = t1
        forward_s = 0.0
        if not out.is_empty:
            batch, meta, ids, pos = self.runner.prepare(out)
            t2 = time.perf_counter()
            self.forward_timer.start()
            logits = self.runner.forward(meta, ids, pos, batch.logits_indices)
            self.forward_timer.stop()
            sampled_rows = [s.request for s in out.scheduled if s.sample]
            results = self.sampler(logits, sampled_rows, with_top=self.config.record_steps)
            forward_s = self.forward_timer.seconds()
        else:
            results = []
        t4 = time.perf_counter()
        self.engine_time += t4 - t0
        finished = self._update(out, sampled_rows, results)
        t5 = time.perf_counter()
        self.engine_time += t5 - t4
        if self.config.check_invariants:
            from .invariants import check_invariants
            check_invariants(self, out, batch)
        # Collectives are part of 'forward': rank 0's wait in all-reduce / gather (0 at TP=1).
        return self._record(out, batch, sampled_rows, results, finished,
                            {"schedule": t1 - t0, "prepare": t2 - t1, "forward": forward_s,
                             # On a GPU the sampler's copy waits for the forward: not its own time.
                             "sample": max(0.0, t4 - t2 - forward_s), "update": t5 - t4, "total": t5 - t0,
                             "collectives": self.runner.take_collective_ms() / 1e3 if batch is not None else 0.0})

    def _update(self, out: SchedulerOutput, sampled_rows: list[Request], results) -> list[str]:
        token_of = {r.request_id: res.token_id for r, res in zip(sampled_rows, results)}
        return self.scheduler.update_from_output(out, token_of, time.time(), self.engine_time)

    def _record(self, out, batch, sampled_rows, results, finished, seconds: dict) -> StepRecord:
        decode = self.decode
        rec = StepRecord(step=self.step_count)
        rec.scheduled = [{"request_id": s.request.request_id, "num_tokens": s.num_tokens,
                          "num_computed_before": s.num_computed_before, "is_prefill": s.is_prefill,
                          "num_cached_tokens": s.num_cached_tokens, "chunk_index": s.chunk_index}
                         for s in out.scheduled]
        lean = not self.config.record_steps
        if batch is not None and not lean:
            rec.batch = batch.to_dict()
        rec.sampled = {r.request_id: {"token_id": res.token_id, "text": None if lean else decode([res.token_id]),
                                      "top": [[t, p] for t, p in res.top]}
                       for r, res in zip(sampled_rows, results)}
        rec.preempted, rec.finished, rec.new_requests = list(out.preempted), finished, list(out.new_requests)
        rec.blocks = self.kv.pool.events.to_dict()
        rec.num_free_blocks = self.kv.pool.num_free_blocks
        rec.timings_ms = {k: v * 1e3 for k, v in seconds.items()}
        bucket = self.runner.last_graph_bucket if batch is not None else None
        rec.timings_ms.update(backend=self.runner.backend.name, cuda_graph_bucket=bucket,
                              forward_path="eager" if bucket is None else "cuda_graph")
        rec.engine_time_s = self.engine_time
        rec.wall_time_s = time.time()
        rec.token_budget = out.token_budget
        rec.num_running, rec.num_waiting = len(self.scheduler.running), len(self.scheduler.waiting)
        return rec

    def shutdown(self) -> None:
        """Stop the tensor-parallel worker processes (a no-op for a single-process engine)."""
        self.runner.shutdown()

    # -- inspection ---------------------------------------------------------------------
    @property
    def metrics(self) -> dict:
        return {"num_steps": self.step_count, "engine_time_s": self.engine_time,
                "prefix_cache_hits": self.kv.prefix_cache_hits, "prefix_cache_queries": self.kv.prefix_cache_queries,
                "kv_cache_usage": self.kv.pool.usage, "num_preemptions": self.scheduler.num_preemptions,
                "num_generated_tokens": self.num_generated_tokens,
                "num_prompt_tokens_computed": self.num_computed_prompt_tokens}

    def snapshot(self) -> EngineSnapshot:
        decode = self.decode
        sch = self.scheduler
        with gc_paused():
            return EngineSnapshot(
                step=self.step_count, config=self.config.to_dict(), model_info=self.model_info, metrics=self.metrics,
                queues={"waiting": [request_dict(r, decode) for r in sch.waiting],
                        "running": [request_dict(r, decode) for r in sch.running],
                        "finished": [request_dict(r, decode) for r in sch.finished]},
                block_pool=block_pool_dict(self.kv.pool, self.config.block_size, list(sch.running)))

    def attention_probe(self, request_id: str, layer: int = 0, head: int | None = None) -> AttentionProbe:
        """Attention weights of the request's last computed positions, read from the paged cache."""
        req = self.requests.get(request_id)
        if req is None:
            raise ValueError(f"request_id {request_id!r} does not exist")
        if not isinstance(layer, int) or not 0 <= layer < self.spec.num_layers:
            raise ValueError(f"layer must be in [0, {self.spec.num_layers}), got {layer!r}")
        if head is not None and (not isinstance(head, int) or not 0 <= head < self.spec.num_heads):
            raise ValueError(f"head must be in [0, {self.spec.num_heads}) or None, got {head!r}")
        if req.status != RequestStatus.RUNNING or req.last_scheduled is None:
            state = f"finished ({req.finish_reason}); its KV blocks were returned" if req.is_finished else \
                "not holding computed KV (waiting or preempted)"
            raise ValueError(f"request_id {request_id!r} is {state}: attention can only be probed while it runs")
        start, end = req.last_scheduled
        probs = self.runner.probe(req.all_token_ids, start, end, req.block_table, layer)
        heads = list(range(self.spec.num_heads)) if head is None else [head]
        group = self.spec.num_heads // self.spec.num_kv_heads
        decode = self.decode
        return AttentionProbe(
            request_id=request_id, layer=layer, heads=heads, kv_head_of_head=[h // group for h in heads],
            query_positions=list(range(start, end)), context_len=end, block_size=self.config.block_size,
            block_table=list(req.block_table), token_ids=req.all_token_ids[:end],
            tokens=[decode([t]) for t in req.all_token_ids[:end]], probs=probs[heads].cpu())
