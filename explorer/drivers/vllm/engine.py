"""vLLM itself behind the explorer: `VllmEngine` steps vLLM's own LLMEngine (in this process,
synchronous scheduling) and turns each step into kvscope's StepRecord / EngineSnapshot, so
every panel works unchanged; `VllmDriver` builds and rebuilds it for a Session.

    from explorer import Session
    s = Session(engine="vllm", block_size=32, num_kv_blocks=24, max_model_len=512)

Every number comes from vLLM's objects for that step (explorer.drivers.vllm.capture says how they are
observed, explorer.drivers.vllm.records how they become kvscope's dicts):
schedule and computed counts from its SchedulerOutput, block tables / refcounts / hashes
from its KV cache manager and block pool, the packed batch and slot mapping from its model
runner's buffers, sampler candidates from its logprobs of the sampled row, attention from
the queries its watched layer computed and the keys in its paged cache (explorer.drivers.vllm.probe).
What the adapter adds is bookkeeping vLLM does not keep: the engine clock (time inside
vLLM's step), per-request event times, the prefill chunk index, the finished queue, and each
step's changes (explorer.drivers.vllm.changes). Block hashes are shown as vLLM's KV events
name them (16 hex digits: RecordBuilder.hash_key).
"""
from __future__ import annotations

import copy
import gc
import itertools
import json
import logging
import re
import time
import traceback
import weakref
from pathlib import Path
from typing import Any, cast

from engine.config import with_live_knobs
from engine.dtypes import dtype_name
from engine.report.records import EngineSnapshot, StepRecord, gc_paused
from engine.report.schema import (
    CHANGES,
    INFO,
    TIME,
    BlockPoolDict,
    ChangesDict,
    EngineMetricsDict,
    ModelInfoDict,
    QueuesDict,
)
from engine.request import abortable, checked_request_args, token_id_list
from engine.sampling_params import SamplingParams

from .capture import StepCapture
from .changes import BlockTables, ChangeTracker
from .config import (
    CONFIG_FIELDS,
    LIVE_KNOBS,
    VllmConfig,
    VllmUnavailable,
    fit_max_num_seqs,
    prepare_environment,
    require_vllm,
    split_fields,
)
from .groups import KVGroups
from .probe import QueryCapture, VllmAttentionProbe, attention_weights
from .records import RecordBuilder, RequestState
from .startup import StartupLog

__all__ = ["VllmConfig", "VllmDriver", "VllmEngine", "VllmUnavailable"]

log = logging.getLogger(__name__)

# vLLM engines alive in this process. vLLM's own shutdown tears down the process-wide
# distributed state every engine's forward uses, so only the last one may do it.
_live = {"count": 0}
_POOL_SHAPE = {"block_size", "model", "dtype", "kv_cache_memory_bytes", "tensor_parallel_size"}


class VllmDriver:
    """Owns one VllmEngine for a Session (explorer.core.engine_protocol.EngineDriver)."""

    config_fields = CONFIG_FIELDS
    watch_only = ""

    def __init__(self, engine: VllmEngine) -> None:
        self.engine = engine
        self.source = self.controls = engine  # VllmEngine is both a Source and its Controls
        self.llm: Any = engine.llm  # vLLM's LLM
        self.name: str = engine.name

    @classmethod
    def create(cls, llm_or_config: Any, config_fields: dict[str, Any]) -> VllmDriver:
        require_vllm()
        fields = dict(config_fields)
        if fields.pop("check_invariants", False):
            raise ValueError("debug_invariants checks kvscope's own engine; it has no meaning for vLLM")
        ours, engine_args = split_fields(fields)
        if isinstance(llm_or_config, VllmConfig):
            config = llm_or_config.replace(**ours)
        elif llm_or_config is None or isinstance(llm_or_config, str) or hasattr(llm_or_config, "__fspath__"):
            if "model" in ours and llm_or_config is not None:
                raise ValueError("model given twice: as the first argument and as model=")
            model = ours.pop("model", llm_or_config)
            config = VllmConfig(model=None if model is None else str(model), **ours)
        else:
            raise ValueError(f"with engine='vllm', the first argument must be a VllmConfig, a model path or None, "
                             f"got {type(llm_or_config).__name__}")
        if engine_args:
            config = config.replace(engine_args={**config.engine_args, **engine_args})
        explicit = "max_num_seqs" in ours or isinstance(llm_or_config, VllmConfig)
        config, notice = fit_max_num_seqs(config, explicit=explicit)
        return cls(VllmEngine(config, notice=notice))

    def rebuild(self, **config_fields: Any) -> VllmDriver:
        ours, engine_args = split_fields(config_fields)
        config = self.engine.config.replace(**ours)
        if engine_args:
            config = config.replace(engine_args={**config.engine_args, **engine_args})
        if "num_kv_blocks" not in ours and _POOL_SHAPE & set(config_fields):
            config = config.replace(num_kv_blocks=self.engine.requested_num_kv_blocks)
        if "max_model_len" not in ours:
            config = config.replace(max_model_len=self.engine.requested_max_model_len)
        config, notice = fit_max_num_seqs(config, explicit="max_num_seqs" in ours)
        return VllmDriver(VllmEngine(config, notice=notice))  # the old engine keeps running if vLLM refuses

    def shutdown(self) -> None:
        self.engine.shutdown()


class VllmEngine:
    """vLLM's LLMEngine stepped one scheduler step at a time, seen through kvscope's records
    (explorer.core.engine_protocol.Engine). `name` ("vLLM 0.32.0") is shown by every panel."""

    def __init__(self, config: VllmConfig, notice: str = "") -> None:
        self.version: str = require_vllm()
        self.notice = notice  # a knob the explorer changed so vLLM would start (shown by the Dashboard)
        config.validate()
        prepare_environment()
        from engine.default_model import default_model_path, validate_model_folder

        # Any model type vLLM runs (a Gemma 3's sliding-window groups among them), not only kvscope's.
        folder = validate_model_folder(config.model if config.model is not None else default_model_path(),
                                       model_types=None)
        self.requested_num_kv_blocks: int | None = config.num_kv_blocks
        self.requested_max_model_len: int | None = config.max_model_len
        max_model_len = config.max_model_len or _default_max_model_len(folder, config)
        # vLLM's start-up output (logs, warnings, a weights bar) folds into one progress line.
        with StartupLog(f"vLLM {self.version}") as startup:
            startup.note = notice
            import vllm
            from vllm import LLM

            self.version = require_vllm(vllm.__version__)
            refused: Exception | None = None
            try:
                self.llm: Any = LLM(**config.llm_kwargs(str(folder), max_model_len))
            except Exception as exc:  # noqa: BLE001 - whatever vLLM refuses, the caller gets its message
                refused = exc
                traceback.print_exc()  # into the start-up log, not the caller's traceback
        self.startup_log = startup.log_text
        if refused is not None:
            # One line: vLLM's own traceback is in the start-up log (one click away), not chained here.
            error = ValueError(f"vLLM refused this configuration: {_message(refused)}")
            error.vllm_error = refused  # type: ignore[attr-defined]
            raise error from None
        self.name: str = f"vLLM {self.version}"
        # vLLM's own objects, reached through their (version-checked) internals: Any to mypy.
        self.vllm: Any = self.llm.llm_engine
        client = self.vllm.engine_core
        core = client.engine_core
        self.scheduler: Any = core.scheduler
        self.pool: Any = self.scheduler.kv_cache_manager.block_pool
        # vLLM's finaliser would run its full shutdown when this engine is collected; ours
        # knows whether another vLLM engine still needs the process-wide state.
        detach = getattr(getattr(client, "_finalizer", None), "detach", None)
        if detach is not None:
            detach()
        _live["count"] += 1
        self._finalizer = weakref.finalize(self, _release, client, core)
        worker = getattr(getattr(core.model_executor, "driver_worker", None), "worker", None)
        self.runner: Any = getattr(worker, "model_runner", None)  # None: the model runs in worker processes
        self.groups = KVGroups(self.scheduler)
        self.capture = StepCapture(self.scheduler, self.runner, core.model_executor, self.groups.order)
        self.queries: QueryCapture | None = QueryCapture(self.runner) if self.runner is not None else None
        self.tokenizer: Any = self.vllm.get_tokenizer()
        self.block_size = int(self.scheduler.cache_config.block_size)
        self.max_model_len = int(self.vllm.model_config.max_model_len)
        self.config: VllmConfig = config.replace(model=str(folder), max_model_len=self.max_model_len,
                                     num_kv_blocks=int(self.pool.num_gpu_blocks))
        self._built_budget = (config.max_num_batched_tokens, config.max_num_seqs)
        self._max_logprobs = int(getattr(self.vllm.model_config, "max_logprobs", 20))
        self.finished: list[RequestState] = []
        self._ids = itertools.count()
        # The explorer's own cost next to vLLM's: seconds summed over steps / snapshots.
        self.overhead = {"steps": 0, "vllm_step_s": 0.0, "record_s": 0.0, "snapshots": 0, "snapshot_s": 0.0}
        # RecordBuilder(model_info: dict) in records.py: a ModelInfoDict is not a `dict` to mypy until
        # records.py takes ModelInfoDict (mypy then reports this ignore as unused).
        info = self._read_model_info(folder)
        self.records: RecordBuilder = RecordBuilder(self.scheduler, model_info=info,  # type: ignore[arg-type]
                                                    groups=self.groups,
                                                    tokenizer=self.tokenizer, max_logprobs=self._max_logprobs,
                                                    runner_in_process=self.runner is not None,
                                                    reserve_full_isl=config.scheduler_reserve_full_isl)
        self.tracker: ChangeTracker = ChangeTracker(self.records, BlockTables(self.scheduler, self.groups.order[0]))
        self.last_capture: Any = None  # the latest step's capture (explorer.drivers.vllm.capture)
        self._finished_sent = 0         # self.finished[:n] went out in changes already
        self._config_changed = False

    # -- facts ----------------------------------------------------------------------------
    @property
    def model_info(self) -> ModelInfoDict:
        # RecordBuilder (records.py) keeps the dict _read_model_info built.
        return cast("ModelInfoDict", self.records.model_info)

    @property
    def requests(self) -> dict[str, RequestState]:
        return self.records.requests

    @property
    def step_count(self) -> int:
        return self.records.step_count

    @property
    def engine_time(self) -> float:
        return self.records.engine_time

    def _read_model_info(self, folder: Path) -> ModelInfoDict:
        mc = self.vllm.model_config
        hf = mc.hf_config
        heads = int(hf.num_attention_heads)
        kv_heads = int(getattr(hf, "num_key_value_heads", None) or heads)
        kv_bytes = backend = None
        if self.queries is not None:
            layers = list(self.queries.layers.values())
            backend = layers[0].attn_backend.get_name() if hasattr(layers[0], "attn_backend") else None
            kv_bytes = sum(_first_block_bytes(m.kv_cache) for m in layers)
        tp = int(self.vllm.vllm_config.parallel_config.tensor_parallel_size)
        tp_facts = self._tp_facts(tp)
        if kv_bytes is None and tp_facts:
            kv_bytes = sum(r["kv_bytes_per_block"] for r in tp_facts[INFO.TENSOR_PARALLEL]["ranks"])
        return {**tp_facts, INFO.ENGINE: self.name, INFO.ENGINE_VERSION: self.version, INFO.NAME: folder.name,
                INFO.ARCHITECTURE: getattr(hf, "model_type", None), INFO.NUM_LAYERS: int(hf.num_hidden_layers),
                INFO.NUM_HEADS: heads, INFO.NUM_KV_HEADS: kv_heads,
                INFO.HEAD_DIM: int(getattr(hf, "head_dim", None) or hf.hidden_size // heads),
                INFO.HIDDEN_SIZE: int(hf.hidden_size), INFO.VOCAB_SIZE: int(mc.get_vocab_size()),
                INFO.DTYPE: dtype_name(mc.dtype), INFO.COMPUTE_DTYPE: dtype_name(mc.dtype),
                INFO.DEVICE: "cpu" if self.config.on_cpu else "cuda",
                INFO.MAX_MODEL_LEN: self.max_model_len, INFO.ATTENTION_BACKEND: backend, INFO.CUDA_GRAPHS: None,
                INFO.CUDA_GRAPHS_OFF: "enforce_eager" if self.config.enforce_eager else None,
                INFO.NATIVE_DECODE: None, INFO.NATIVE_DECODE_OFF: "kvscope's own engine only",
                INFO.NATIVE_LINEAR_ROWS: None, INFO.NATIVE_ROWS_SOURCE: None,
                INFO.CPU_GEMM_DTYPE: None, INFO.KV_BYTES_PER_BLOCK: kv_bytes,
                INFO.INTERMEDIATE_SIZE: getattr(hf, "intermediate_size", None),
                INFO.TIE_WORD_EMBEDDINGS: getattr(hf, "tie_word_embeddings", None),
                INFO.TENSOR_PARALLEL_SIZE: tp,
                INFO.TP_BACKEND: None if tp == 1 else ("gloo" if self.config.on_cpu else "nccl"),
                INFO.KV_CACHE_GROUPS: self.groups.describe()}

    def _tp_facts(self, tp: int) -> ModelInfoDict:
        """With tensor parallelism: each rank's share, as its worker reports it (collective_rpc)."""
        if tp == 1:
            return {}
        from .capture import rank_facts

        ranks = self.vllm.engine_core.engine_core.model_executor.collective_rpc(rank_facts)
        first = ranks[0]
        return {INFO.TENSOR_PARALLEL: {"ranks": ranks, "weights": []},
                INFO.NUM_HEADS_PER_RANK: first["heads"][1] - first["heads"][0],
                INFO.NUM_KV_HEADS_PER_RANK: first["kv_heads"][1] - first["kv_heads"][0],
                INFO.KV_BYTES_PER_BLOCK_PER_RANK: first["kv_bytes_per_block"],
                INFO.KV_BYTES_PER_RANK: first["kv_bytes"]}

    def has_unfinished_requests(self) -> bool:
        return bool(self.vllm.has_unfinished_requests())

    def pending(self) -> int:
        """Steps ready to run now: 1 while a request is unfinished (a Session's Source protocol)."""
        return int(self.has_unfinished_requests())

    # -- requests -------------------------------------------------------------------------
    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None) -> str:
        """Queue a request in vLLM (which tokenizes a str prompt itself); returns its id.
        vLLM's own checks (too long, out of vocabulary, ...) raise ValueError with its message."""
        params = checked_request_args(params, request_id, self.requests)
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt must not be empty")
            vllm_prompt: Any = {"prompt": prompt}
        else:
            vllm_prompt = {"prompt_token_ids": token_id_list(prompt)}
        if request_id is None:
            request_id = next(i for i in (str(n) for n in self._ids) if i not in self.requests)
        try:  # vLLM's renderer tokenizes and validates, as LLM.generate does
            engine_input = self.vllm.renderer.render_cmpl([vllm_prompt])[0]
            internal = self.vllm.add_request(request_id, engine_input, self._sampling_params(params))
        except (ValueError, TypeError) as exc:
            raise ValueError(str(exc)) from exc
        entry = RequestState(request_id, internal, self.scheduler.requests[internal], params,
                             prompt if isinstance(prompt, str) else None)
        self.records.track(entry, time.time())
        self.tracker.note_request(internal)
        return request_id

    def _sampling_params(self, p: SamplingParams) -> Any:
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.sampling_params import RequestOutputKind

        k = min(p.logprobs_top, self._max_logprobs)
        return VllmSamplingParams(temperature=float(p.temperature), top_k=int(p.top_k), top_p=float(p.top_p),
                                  max_tokens=p.max_tokens, ignore_eos=p.ignore_eos,
                                  stop_token_ids=list(p.stop_token_ids), seed=p.seed, logprobs=k or None,
                                  output_kind=RequestOutputKind.DELTA)

    def abort_request(self, request_id: str) -> None:
        entry = abortable(self.requests, request_id)
        self.vllm.abort_request([request_id])
        self.records.finish(entry, "abort", time.time())
        self.finished.extend(self.records.take_finished())
        self.tracker.note_blocks(self.capture.now)  # its frees: in the next step's events too

    # -- budget ---------------------------------------------------------------------------
    def update_scheduler_config(self, **knobs: Any) -> VllmConfig:
        """Change the knobs vLLM's scheduler reads at every step. max_num_batched_tokens and
        max_num_seqs may go down to what vLLM sized its buffers for at start-up; the others
        need a new engine (Session.reset), as in vLLM."""
        new = with_live_knobs(self.config, knobs, LIVE_KNOBS, engine="vLLM engine")
        for name, built in zip(("max_num_batched_tokens", "max_num_seqs"), self._built_budget):
            if getattr(new, name) > built:
                raise ValueError(f"{name}={getattr(new, name)} is more than the {built} vLLM sized its buffers for "
                                 f"at start-up: lower it live, or Session.reset({name}=...) to raise it")
        s = self.scheduler
        if new.max_num_seqs < len(s.running):
            raise ValueError(f"max_num_seqs={new.max_num_seqs} is below the {len(s.running)} requests running now "
                             "(vLLM never preempts to honour it): lower it once fewer run")
        check = copy.copy(s.scheduler_config)
        check.max_num_batched_tokens, check.max_num_seqs = new.max_num_batched_tokens, new.max_num_seqs
        check.enable_chunked_prefill = new.enable_chunked_prefill
        check.verify_max_model_len(self.max_model_len)  # vLLM's own rules and messages
        sc = s.scheduler_config
        sc.max_num_batched_tokens, sc.max_num_seqs = new.max_num_batched_tokens, new.max_num_seqs
        sc.enable_chunked_prefill = new.enable_chunked_prefill
        sc.scheduler_reserve_full_isl = new.scheduler_reserve_full_isl
        if getattr(sc, "max_num_scheduled_tokens", None) is None:
            s.max_num_scheduled_tokens = new.max_num_batched_tokens
        s.max_num_running_reqs = new.max_num_seqs
        if getattr(sc, "max_num_active_seqs", None) is None:
            s.max_num_active_reqs = new.max_num_seqs
        s.scheduler_reserve_full_isl = new.scheduler_reserve_full_isl
        self.config = new
        self._config_changed = True
        return new

    # -- the step -------------------------------------------------------------------------
    def step(self) -> StepRecord:
        """One vLLM step (schedule, forward, sample, update), reported as a StepRecord."""
        self.capture.begin()
        if self.queries is not None:
            self.queries.begin(self.step_count + 1)
        t0 = time.perf_counter()
        outputs = self.vllm.step()
        vllm_s = time.perf_counter() - t0
        cap = self.last_capture = self.capture.end()
        t1 = time.perf_counter()
        rec = self.records.step_record(cap, outputs, vllm_s)
        rec.batch_source = "runner" if cap.batch is not None else None
        self.finished.extend(self.records.take_finished())
        self.tracker.note_step(cap)
        rec.changes = self.take_changes()
        record_s = time.perf_counter() - t1
        rec.timings_ms[TIME.EXPLORER_RECORD] = record_s * 1e3
        self.overhead["steps"] += 1
        self.overhead["vllm_step_s"] += vllm_s
        self.overhead["record_s"] += record_s
        return rec

    def take_changes(self) -> ChangesDict:
        """What changed since the last step or call (engine/report/changes.py): a Session applies
        it after each step, and after adding, aborting or re-budgeting between steps."""
        changes = self.tracker.changes(self.step_count, self.finished[self._finished_sent:])
        self._finished_sent = len(self.finished)
        if self._config_changed:
            changes[CHANGES.CONFIG] = self.config.to_dict()
            self._config_changed = False
        return changes

    # -- inspection -----------------------------------------------------------------------
    @property
    def metrics(self) -> EngineMetricsDict:
        return self.records.metrics

    def snapshot(self) -> EngineSnapshot:
        """vLLM's queues and every block of its pool, now."""
        t0 = time.perf_counter()
        kv, records = self.scheduler.kv_cache_manager, self.records
        with gc_paused():
            running = list(self.scheduler.running)
            if self.groups.several:   # each running request's table in every group, read once
                every = {r.request_id: self.groups.tables(r.request_id) for r in running}
            else:   # kvscope's group 0 alone
                first = self.groups.order[0]
                every = {r.request_id: [list(kv.get_block_ids(r.request_id)[first])] for r in running}
            # RecordBuilder's queues and pool_dict (records.py) are typed `dict`: QueuesDict and
            # BlockPoolDict as built.
            snap = EngineSnapshot(step=self.step_count, config=self.config.to_dict(), model_info=self.model_info,
                                  metrics=self.metrics,
                                  queues=cast("QueuesDict", records.queues(running, every, self.finished)),
                                  block_pool=cast("BlockPoolDict", records.pool_dict(running, every)))
        self.overhead["snapshots"] += 1
        self.overhead["snapshot_s"] += time.perf_counter() - t0
        return snap

    def attention_probe(self, request_id: str, layer: int = 0, head: int | None = None) -> VllmAttentionProbe:
        """Attention of the request's rows in the latest step: the queries vLLM's watched layer
        computed, over the keys in vLLM's paged cache. Another layer is watched from the next
        step on (a ValueError says so): vLLM computes queries only inside its step."""
        e = self.requests.get(request_id)
        if e is None:
            raise ValueError(f"request_id {request_id!r} does not exist")
        info = self.model_info
        num_layers, num_heads = info[INFO.NUM_LAYERS], info[INFO.NUM_HEADS]
        if not isinstance(layer, int) or not 0 <= layer < num_layers:
            raise ValueError(f"layer must be in [0, {num_layers}), got {layer!r}")
        if head is not None and (not isinstance(head, int) or not 0 <= head < num_heads):
            raise ValueError(f"head must be in [0, {num_heads}) or None, got {head!r}")
        if self.queries is None:
            raise ValueError(f"attention weights are not available from {self.name} here: its model runs in "
                             "worker processes (tensor_parallel_size > 1), where the explorer cannot hook a layer")
        if e.finish_reason is not None:
            raise ValueError(f"request_id {request_id!r} is finished ({e.finish_reason}); its KV blocks were "
                             "returned: attention can only be probed while it runs")
        if self.queries.layer != layer:
            old = self.queries.layer
            self.queries.watch(layer)
            raise ValueError(f"vLLM computes layer {layer}'s queries inside its step and the explorer was watching "
                             f"layer {old}: it captures layer {layer} from the next step on; step once and probe again")
        rows = self.records.last_rows.get(e.internal_id)
        if rows is None or self.queries.queries is None or self.queries.step != self.step_count:
            raise ValueError(f"request_id {request_id!r} was not in vLLM's latest step (step {self.step_count}): "
                             "vLLM computed no queries for it; step and probe again")
        start, end, positions = rows
        # The layer's own group's table (a sliding-window layer's holds the null block before its window).
        table = list(self.scheduler.kv_cache_manager.get_block_ids(e.internal_id)[self.groups.group_of_layer(layer)])
        module = self.queries.layers[layer]
        reader = self.queries.reader(layer, int(self.pool.num_gpu_blocks))
        probs = attention_weights(self.queries.queries[start:end], positions, reader, table, float(module.impl.scale))
        heads = list(range(num_heads)) if head is None else [head]
        group = num_heads // info[INFO.NUM_KV_HEADS]
        context = max(positions) + 1
        token_ids = list(e.req.all_token_ids[:context])
        return VllmAttentionProbe(
            request_id=request_id, layer=layer, heads=heads, kv_head_of_head=[h // group for h in heads],
            query_positions=list(positions), context_len=context, block_size=self.block_size, block_table=table,
            # text() is None only without a tokenizer, and vLLM's LLM always loads one here.
            token_ids=token_ids, tokens=[self.records.text(t) or "" for t in token_ids], probs=probs[heads],
            source=(f"{self.name}: layer {layer}'s queries as vLLM computed them in step {self.step_count}, keys from "
                    f"vLLM's paged KV cache (blocks {table}), softmax at vLLM's scale {float(module.impl.scale):g}"))

    def explorer_overhead(self) -> dict[str, float]:
        """The explorer's own cost per vLLM step: mean record and snapshot time next to vLLM's step."""
        o = self.overhead
        steps, snaps = max(1, o["steps"]), max(1, o["snapshots"])
        return {"steps": o["steps"], "vllm_step_ms": o["vllm_step_s"] / steps * 1e3,
                "record_ms": o["record_s"] / steps * 1e3, "snapshot_ms": o["snapshot_s"] / snaps * 1e3}

    def shutdown(self) -> None:
        """Let vLLM go (the process-wide state stays while another vLLM engine lives)."""
        self.capture.close()
        self.groups.close()
        if self.queries is not None:
            self.queries.close()
        self._finalizer()


def _release(client: Any, core: Any) -> None:
    """Free one vLLM engine; the last one alive also runs vLLM's full shutdown."""
    _live["count"] -= 1
    try:
        if _live["count"] <= 0:
            client.engine_core.shutdown()
        else:  # vLLM's shutdown minus cleanup_dist_env_and_memory, which the others still use
            core.structured_output_manager.clear_backend()
            core.model_executor.shutdown()
            core.scheduler.shutdown()
            gc.unfreeze()  # vLLM froze everything alive at start-up; let this engine's objects go
    except Exception:  # the engine is gone either way (logged, not raised)
        log.exception("releasing a vLLM engine failed")


def _first_block_bytes(kv_cache: Any) -> int:
    t = kv_cache[0] if isinstance(kv_cache, (list, tuple)) else kv_cache
    return int(t[0].numel() * t.element_size())


def _default_max_model_len(folder: Path, config: VllmConfig) -> int:
    """min(4096, the model's limit, what the pool holds): vLLM refuses a pool that cannot hold
    one request of max_model_len tokens, so a small pool gets a shorter limit, not an error."""
    limit = 4096
    try:
        limit = min(limit, int(json.loads((folder / "config.json").read_text())["max_position_embeddings"]))
    except (OSError, KeyError, ValueError, TypeError):
        pass
    if config.num_kv_blocks is not None:
        limit = min(limit, (config.num_kv_blocks - 1) * config.block_size)
    return max(1, limit)


def _message(exc: BaseException) -> str:
    """vLLM's message without pydantic's wrapping (the error count, the input repr, the link)."""
    lines = []
    for line in str(exc).strip().splitlines():
        line = line.split(" [type=")[0].strip()
        if not line or "errors.pydantic.dev" in line or re.match(r"\d+ validation errors? for ", line):
            continue
        lines.append(re.sub(r"^(Value|Assertion) error, ", "", line))
    text = " ".join(lines) or type(exc).__name__
    return text if len(text) <= 800 else text[:800] + " ..."
