"""vLLM's step and state in kvscope's shapes. `RecordBuilder` keeps what kvscope shows of one
vLLM scheduler and vLLM does not keep itself: per-request state (`RequestState`), the counters,
the engine clock, the tokens each hashed block was cached with. From one observed step
(explorer.drivers.vllm.capture) and its outputs it builds the StepRecord; from vLLM's Request
objects, KV cache manager and block pool it builds the snapshot's request and block dicts.
The in-process adapter (vllm_engine.VllmEngine) and the live server's recorder
(vllm_live/recorder.py) each own one."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, cast

from engine.core.block_pool import BlockEventsDict
from engine.report.changes import hold_tokens
from engine.report.records import StepRecord, group_fields_of
from engine.report.schema import (
    BATCH,
    BLOCK,
    BUDGET,
    POOL,
    REQ,
    SAMPLE,
    SCHED,
    TIME,
    BlockDict,
    BudgetsDict,
    EngineMetricsDict,
    RequestDict,
    RequestFieldsDict,
    SampledDict,
    TimingsDict,
)
from engine.request import RequestMetrics
from engine.sampling_params import SamplingParams
from engine.tokenizer import OutputText, fast_decoder

from .groups import KVGroups


class ShownAsIs(dict):
    """Request ids shown as vLLM has them (a server's: no internal/external split)."""

    def __missing__(self, key: str) -> str:
        return key


COUNTERS = ("prefix_cache_hits", "prefix_cache_queries", "num_preemptions", "num_generated_tokens",
            "num_prompt_tokens_computed")


@dataclass
class RequestState:
    """What the adapter keeps per request: vLLM's Request object (alive after vLLM drops it,
    so a finished request still shows its tokens) and the events vLLM does not time."""

    request_id: str
    internal_id: str
    req: Any
    params: SamplingParams
    prompt_text: str | None
    metrics: RequestMetrics = field(default_factory=RequestMetrics)
    finish_reason: str | None = None
    num_prefill_chunks: int = 0
    num_cached_tokens: int = 0  # prefix-cache hits at its latest admission (vLLM's num_computed_tokens then)
    group_hits: list[int] | None = None  # several KV cache groups: each one's own hit at that admission
    prompt_decoded: str | None = None   # its prompt's text, decoded once where vLLM had none
    output: OutputText | None = None    # its output's text, decoded as the tokens arrive
    frozen: RequestDict | None = None  # its snapshot dict once finished (it no longer changes)


class RecordBuilder:
    """kvscope's records of one vLLM scheduler (see the module doc).

    `external` maps vLLM's request ids to the ones shown: the in-process adapter's vLLM ids
    carry a suffix (`track` notes each); a server's are shown as they are. `tokenizer` None: no token texts (the
    server's feed leaves them to the client). `runner_in_process`: vLLM's model runner runs in
    this process, so the step's phases are timed apart (else rank 0 only waits for workers).
    `groups`: the scheduler's KV cache groups (a request's plain table is kvscope's group 0).
    """

    def __init__(self, scheduler: Any, *, model_info: dict, groups: KVGroups, tokenizer: Any = None,
                 max_logprobs: int = 0, runner_in_process: bool = False,
                 reserve_full_isl: bool = True) -> None:
        self.scheduler = scheduler
        self.groups = groups
        self.pool = scheduler.kv_cache_manager.block_pool
        self.block_size = int(scheduler.cache_config.block_size)
        self.model_info = model_info
        self.tokenizer = tokenizer
        self._decoder = fast_decoder(tokenizer) if tokenizer is not None else None
        self.max_logprobs = max_logprobs
        self.external: dict[str, str] = ShownAsIs()
        self.runner_in_process = runner_in_process
        self.reserve_full_isl = reserve_full_isl
        self.requests: dict[str, RequestState] = {}
        self.finished_now: list[RequestState] = []  # finished since the owner last took them
        self.step_count = 0
        self.engine_time = 0.0  # seconds inside vLLM's steps
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.last_rows: dict[str, tuple[int, int, list[int]]] = {}  # vLLM id -> rows of the latest batch
        self._block_tokens: dict[int, tuple[bytes, list[int]]] = {}  # hashed block -> what it holds
        self._int_hashes = kv_events_use_int_hashes()

    def hash_key(self, block_hash: Any) -> str:
        """A pool block's hash as vLLM's KV events name it, 16 hex digits: the low 64 bits of its
        block hash (vLLM's default; its first 8 bytes with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0).
        The pool, the prefix tree and the panels show this one id for a block."""
        h = bytes(block_hash)[:-4]  # BlockHashWithGroupId: the hash, then 4 bytes of KV cache group
        return (h[-8:] if self._int_hashes else h[:8]).hex()

    # -- requests --------------------------------------------------------------------------------
    def track(self, entry: RequestState, arrival_wall: float) -> None:
        entry.metrics.record("arrival_time", arrival_wall, self.engine_time)
        self.requests[entry.request_id] = entry
        if entry.internal_id != entry.request_id:
            self.external[entry.internal_id] = entry.request_id

    def finish(self, entry: RequestState, reason: str, wall: float) -> None:
        entry.finish_reason = reason
        entry.metrics.record("finished_time", wall, self.engine_time)
        self.groups.hits.pop(entry.internal_id, None)
        self.finished_now.append(entry)

    def take_finished(self) -> list[RequestState]:
        done, self.finished_now = self.finished_now, []
        return done

    def waiting(self) -> list:
        """vLLM's waiting requests in queue order (those holding KV while they wait last)."""
        s = self.scheduler
        return [*s.waiting, *(getattr(s, "kv_holding_waiting", ()) or ())]

    @property
    def metrics(self) -> EngineMetricsDict:
        # COUNTERS are the rest of EngineMetricsDict's keys (a dict mypy cannot follow key by key).
        return cast(EngineMetricsDict, {"num_steps": self.step_count, "engine_time_s": self.engine_time,
                                        "kv_cache_usage": float(self.pool.get_usage()), **self.counters})

    # -- the step --------------------------------------------------------------------------------
    def step_record(self, cap: Any, outputs: list, vllm_s: float) -> StepRecord:
        """The StepRecord of the vLLM step that just ran (it moves the step count and the engine
        clock on by `vllm_s`): its capture `cap`, and vLLM's RequestOutputs."""
        engine_start = self.engine_time
        self.step_count += 1
        self.engine_time += vllm_s
        rec, now_wall = StepRecord(step=self.step_count), time.time()
        if cap.out is not None:
            self._scheduled(rec, cap, now_wall, engine_start)
        self._batch(rec, cap)
        self._outputs(rec, outputs, now_wall)
        for blk, tokens in cap.cached_tokens.items():
            h = self.pool.blocks[blk].block_hash
            if h is not None:
                self._block_tokens[blk] = (h, tokens)
        # Capture.blocks starts with every block event's key (BLOCK_EVENTS): a BlockEventsDict's.
        rec.blocks = cast(BlockEventsDict, {k: list(v) for k, v in cap.blocks.items()})
        rec.num_free_blocks = int(self.pool.get_num_free_blocks())
        rec.timings_ms = self._timings_ms(cap.seconds, vllm_s)
        rec.engine_time_s = self.engine_time
        rec.wall_time_s = now_wall
        rec.token_budget = cap.token_budget or int(self.scheduler.max_num_scheduled_tokens)
        rec.budgets = self.budgets(rec.token_budget)
        rec.num_running, rec.num_waiting = len(self.scheduler.running), len(self.waiting())
        return rec

    def _scheduled(self, rec: StepRecord, cap: Any, now_wall: float, engine_start: float) -> None:
        out, ext = cap.out, self.external
        before, admitted = computed_before(out)
        order = list(cap.batch_req_ids) if cap.batch is not None else []
        order += [i for i in out.num_scheduled_tokens if i not in order]  # the batch's row order first
        for iid in out.num_scheduled_tokens:  # vLLM's scheduling order: running, then admitted
            if iid in admitted:
                entry = self.requests[ext[iid]]
                entry.num_prefill_chunks = 0
                entry.num_cached_tokens = int(before[iid])
                entry.group_hits = self.groups.hits.pop(iid, None)
                entry.metrics.record("first_scheduled_time", now_wall, engine_start)
                rec.new_requests.append(entry.request_id)
                self.counters["prefix_cache_hits"] += before[iid]
                self.counters["prefix_cache_queries"] += cap.counts[iid][0]
        for iid in order:
            entry = self.requests[ext[iid]]
            n, b = int(out.num_scheduled_tokens[iid]), int(before[iid])
            num_tokens, num_prompt = cap.counts[iid]
            is_decode = n == 1 and b == num_tokens - 1 and b >= num_prompt
            rec.scheduled.append({SCHED.REQUEST_ID: entry.request_id, SCHED.NUM_TOKENS: n, SCHED.NUM_COMPUTED_BEFORE: b,
                                  SCHED.IS_PREFILL: not is_decode, SCHED.NUM_CACHED_TOKENS: b if iid in admitted else 0,
                                  SCHED.CHUNK_INDEX: None if is_decode else entry.num_prefill_chunks})
            if not is_decode:
                entry.num_prefill_chunks += 1
                self.counters["num_prompt_tokens_computed"] += n
        for iid in sorted(out.preempted_req_ids or (), key=lambda i: ext[i]):
            entry = self.requests[ext[iid]]
            entry.metrics.record("preempted_times", now_wall, engine_start)
            rec.preempted.append(entry.request_id)
        self.counters["num_preemptions"] += len(rec.preempted)

    def _batch(self, rec: StepRecord, cap: Any) -> None:
        self.last_rows = {}
        if cap.batch is not None:
            rec.batch = cap.batch
            qsl, pos = cap.batch[BATCH.QUERY_START_LOC], cap.batch[BATCH.POSITIONS]
            self.last_rows = {iid: (qsl[i], qsl[i + 1], pos[qsl[i]:qsl[i + 1]])
                              for i, iid in enumerate(cap.batch_req_ids)}

    def _outputs(self, rec: StepRecord, outputs: list, now_wall: float) -> None:
        for o in outputs:
            entry = self.requests.get(o.request_id)  # vLLM's outputs carry the id it was given
            if entry is None or not o.outputs:
                continue
            c = o.outputs[0]
            if c.token_ids:
                rec.sampled[entry.request_id] = self._sampled(c, min(entry.params.logprobs_top, self.max_logprobs))
                for _ in c.token_ids:
                    entry.metrics.record("token_times", now_wall, self.engine_time)
                self.counters["num_generated_tokens"] += len(c.token_ids)
            if o.finished and entry.finish_reason is None:
                self.finish(entry, c.finish_reason or "stop", now_wall)
                rec.finished.append(entry.request_id)

    def _timings_ms(self, sec: dict, vllm_s: float) -> TimingsDict:
        if self.runner_in_process:  # vLLM's own runner in this process: its phases, timed
            forward, sample = max(0.0, sec["execute"] - sec["prepare"]), sec["sample"]
            update = max(0.0, vllm_s - sec["schedule"] - sec["execute"] - sec["sample"])
        else:  # workers in other processes: what rank 0 waited for, sampling included
            forward, sample = max(0.0, vllm_s - sec["schedule"] - sec["update"]), 0.0
            update = sec["update"]
        return {TIME.SCHEDULE: sec["schedule"] * 1e3, TIME.PREPARE: sec["prepare"] * 1e3,
                TIME.FORWARD: forward * 1e3, TIME.SAMPLE: sample * 1e3, TIME.UPDATE: update * 1e3,
                TIME.TOTAL: vllm_s * 1e3, TIME.COLLECTIVES: 0.0,
                TIME.BACKEND: f"vLLM {self.model_info.get('attention_backend') or ''}".strip(),
                TIME.CUDA_GRAPH_BUCKET: None, TIME.FORWARD_PATH: "eager"}

    def budgets(self, token_budget: int | None = None) -> BudgetsDict:
        """The scheduler knobs as vLLM's own scheduler holds them (kvscope's knob names,
        engine.config.SCHEDULER_KNOBS): what the step just taken ran under."""
        s = self.scheduler
        return {BUDGET.MAX_NUM_BATCHED_TOKENS: int(token_budget or s.max_num_scheduled_tokens),
                BUDGET.MAX_NUM_SEQS: int(s.max_num_running_reqs),
                BUDGET.ENABLE_CHUNKED_PREFILL: bool(s.scheduler_config.enable_chunked_prefill),
                BUDGET.ENABLE_PREFIX_CACHING: bool(s.cache_config.enable_prefix_caching),
                BUDGET.SCHEDULER_RESERVE_FULL_ISL: bool(getattr(s, "scheduler_reserve_full_isl",
                                                                self.reserve_full_isl)),
                BUDGET.SCHEDULING_POLICY: "unified"}  # vLLM v1 has one policy: prefill and decode under one budget

    def _sampled(self, c: Any, k: int) -> SampledDict:
        """The sampled token and vLLM's top-k candidates for its row (vLLM's logprobs, as
        probabilities; vLLM adds the sampled token with its own rank when it is not in the top k)."""
        token = int(c.token_ids[-1])
        lp = c.logprobs[-1] if c.logprobs else None
        top, text = [], None
        if lp:
            ranked = sorted((v.rank, t, v.logprob) for t, v in lp.items() if v.rank is not None and 0 < v.rank <= k)
            top = [(int(t), math.exp(logprob)) for _, t, logprob in ranked]
            if token in lp:
                text = lp[token].decoded_token
        return {SAMPLE.TOKEN_ID: token, SAMPLE.TEXT: text if text is not None else self.text(token), SAMPLE.TOP: top}

    def text(self, token: int) -> str | None:
        """One token's text (None without a tokenizer)."""
        return self._decoder([token]) if self._decoder is not None else None   # the Decoder keeps each token's

    # -- the snapshot's dicts ----------------------------------------------------------------------
    def request_dict(self, e: RequestState, table: list[int], others: list[list[int]] | None = None) -> RequestDict:
        """One request as the snapshot shows it (kvscope's request dict), from vLLM's Request.
        `others`: its tables in the KV cache groups past kvscope's first, where the caller read them."""
        r = e.req
        # first_seen's open dict holds the prompt's fields and the hash domain's.
        return cast(RequestDict, {REQ.REQUEST_ID: e.request_id, REQ.STATUS: status_name(r.status), **self.first_seen(e),
                REQ.OUTPUT_TOKEN_IDS: list(r.output_token_ids), REQ.OUTPUT_TEXT: self.output_text(e),
                REQ.NUM_COMPUTED_TOKENS: int(r.num_computed_tokens),
                REQ.NUM_CACHED_TOKENS: e.num_cached_tokens, REQ.BLOCK_TABLE: table,
                REQ.NUM_PREEMPTIONS: int(r.num_preemptions), REQ.FINISH_REASON: e.finish_reason,
                REQ.METRICS: e.metrics.to_dict(), **self.group_fields(e, bool(table), others)})

    def group_fields(self, e: RequestState, holds_blocks: bool,
                     others: list[list[int]] | None = None) -> RequestFieldsDict:
        """With several KV cache groups: the request's table in each group past kvscope's first
        (`others`, else read from vLLM, only while it holds blocks) and each group's own hit at its
        admission."""
        g = self.groups
        if not g.several:
            return cast(RequestFieldsDict, {})
        if holds_blocks and others is None:
            others = g.tables(e.internal_id)[1:]
        return group_fields_of(len(g.order), others if holds_blocks else None, e.group_hits)

    def first_seen(self, e: RequestState) -> dict:
        """What never changes in a request's dict: its prompt, the prompt's text, max_tokens and
        sampling parameters, and its hash domain where it has one (a change carries them once)."""
        prompt = list(e.req.prompt_token_ids or ())
        seen = {REQ.PROMPT_TOKEN_IDS: prompt,
                REQ.PROMPT_TEXT: e.prompt_text if e.prompt_text is not None else self._prompt_text(e, prompt),
                REQ.MAX_TOKENS: e.params.max_tokens, REQ.SAMPLING_PARAMS: e.params.to_dict(), **hash_domain(e.req)}
        return seen

    def output_text(self, e: RequestState) -> str:
        """The output's text as vLLM returns it (without special tokens, as kvscope's engine
        shows it), decoded as its tokens arrive, as vLLM's detokenizer does."""
        if self._decoder is None:
            return ""
        if e.output is None:
            e.output = self._decoder.output_text()
        return e.output(e.req.output_token_ids)

    def finished_dict(self, e: RequestState) -> RequestDict:
        if e.frozen is None:  # a finished request no longer changes: build its dict once
            e.frozen = self.request_dict(e, []) | {REQ.STATUS: "finished"}
        return e.frozen

    def _prompt_text(self, e: RequestState, ids: list[int]) -> str:
        if self._decoder is None:
            return ""
        if e.prompt_decoded is None:
            e.prompt_decoded = self._decoder(ids)
        return e.prompt_decoded

    def queues(self, running: list, tables: dict[str, list[list[int]]], finished: list[RequestState]) -> dict:
        """The snapshot's queues: vLLM's waiting and running requests (those it tracks), and `finished`.
        `tables`: each running request's tables, kvscope's group order (its first group's alone
        for a model of one group)."""
        ext, requests = self.external, self.requests
        waiting = [requests.get(ext[r.request_id]) for r in self.waiting()]
        running_entries = [(requests.get(ext[r.request_id]), tables[r.request_id]) for r in running]
        return {"waiting": [self.request_dict(e, []) for e in waiting if e is not None],
                "running": [self.request_dict(e, every[0], every[1:]) for e, every in running_entries
                            if e is not None],
                "finished": [self.finished_dict(e) for e in finished]}

    def pool_dict(self, running: list, tables: dict[str, list[list[int]]]) -> dict:
        """Every block of vLLM's pool: refcount, hash, free or not, owners and the tokens it holds."""
        bs, ext = self.block_size, self.external
        owners: dict[int, list[str]] = {}
        tokens: dict[int, list[int]] = {}
        null = self.pool.null_block.block_id
        for r in running:
            ids, n = r.all_token_ids, r.num_computed_tokens
            for table in tables[r.request_id]:  # every KV cache group's blocks: one pool holds them all
                hold_tokens(tokens, table, 0, bs, ids, n, null)
                for b in table:
                    if b != null:
                        owners.setdefault(b, []).append(ext[r.request_id])
        blocks = [self.block_dict(blk, tokens.get(blk.block_id), owners.get(blk.block_id, []))
                  for blk in self.pool.blocks]
        return {POOL.NUM_BLOCKS: int(self.pool.num_gpu_blocks), POOL.BLOCK_SIZE: bs,
                POOL.NUM_FREE_BLOCKS: int(self.pool.get_num_free_blocks()), POOL.BLOCKS: blocks}

    def block_dict(self, blk: Any, held: list[int] | None, owners: list[str]) -> BlockDict:
        """One of vLLM's KVCacheBlocks as the snapshot shows it. `held`: the tokens a running
        request keeps in it (None: no running request holds it, so the tokens it was cached with,
        while it keeps that hash). Free means in vLLM's free queue, where exactly the blocks with
        no reference are (the null block, never handed out, aside)."""
        b, h = blk.block_id, blk.block_hash
        if held is None:
            known = self._block_tokens.get(b)
            held = known[1] if known is not None and h is not None and known[0] == h else []
        elif h is not None:
            self._block_tokens[b] = (h, held)
        # vLLM does not keep the null block's ref_cnt (sliding-window groups drive it below 0): 0.
        return {BLOCK.BLOCK_ID: b, BLOCK.REF_COUNT: 0 if blk.is_null else int(blk.ref_cnt),
                BLOCK.HASH: None if h is None else self.hash_key(h), BLOCK.TOKEN_IDS: held, BLOCK.OWNERS: owners,
                BLOCK.IS_NULL: bool(blk.is_null), BLOCK.IS_FREE: blk.ref_cnt == 0 and not blk.is_null}


def kv_events_use_int_hashes() -> bool:
    """Whether vLLM's KV events carry block hashes as ints (the low 64 bits), read once."""
    try:
        import vllm.envs as envs

        return bool(envs.VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES)
    except Exception:  # noqa: BLE001 - an older vLLM without the switch sends ints
        return True


def computed_before(out: Any) -> tuple[dict[str, int], set[str]]:
    """From vLLM's SchedulerOutput: each scheduled request's computed tokens before this step
    (its first scheduled position), and the requests admitted in it (new, or resumed after a
    preemption)."""
    new = {d.req_id: d.num_computed_tokens for d in out.scheduled_new_reqs}
    cached = out.scheduled_cached_reqs
    before = new | dict(zip(cached.req_ids, cached.num_computed_tokens))
    return before, set(new) | set(getattr(cached, "resumed_req_ids", None) or ())


def status_name(status: Any) -> str:
    name = getattr(status, "name", str(status))
    if name.startswith("FINISHED"):
        return "finished"
    return {"RUNNING": "running", "PREEMPTED": "preempted"}.get(name, "waiting")


def hash_domain(req: Any) -> dict[str, Any]:
    """What of a vLLM Request's scheduling and block hashing a RequestDict carries once: its
    priority, and its cache_salt and LoRA adapter's name where it has them (they make its block
    hashes differ from the same tokens' without)."""
    out: dict[str, Any] = {REQ.PRIORITY: int(getattr(req, "priority", 0) or 0)}
    salt, lora = getattr(req, "cache_salt", None), getattr(req, "lora_request", None)
    if salt:
        out[REQ.CACHE_SALT] = str(salt)
    if lora is not None:
        out[REQ.LORA_NAME] = str(lora.lora_name)
    return out
