"""vLLM's step and state in kvscope's shapes: `step_record` turns one observed vLLM step
(explorer.drivers.vllm_capture) and its RequestOutputs into a StepRecord; `request_dict` and
`pool_dict` give the snapshot's queues and block pool from vLLM's Request objects, KV cache
manager and block pool. Functions of a VllmEngine (`eng`), whose state they read and keep."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from engine.report.records import StepRecord
from engine.report.schema import BATCH, BLOCK, BUDGET, POOL, REQ, SAMPLE, SCHED, TIME
from engine.request import RequestMetrics
from engine.sampling_params import SamplingParams


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
    text: dict = field(default_factory=dict)
    frozen: dict | None = None  # its snapshot dict once finished (it no longer changes)


def step_record(eng: Any, outputs: list, vllm_s: float, engine_start: float) -> StepRecord:
    """The StepRecord of the vLLM step that just ran: its capture, and vLLM's RequestOutputs."""
    cap, now_wall = eng.capture.now, time.time()
    rec = StepRecord(step=eng.step_count)
    out = cap.out
    ext = eng._external
    if out is not None:
        new = {d.req_id: d.num_computed_tokens for d in out.scheduled_new_reqs}
        cached = out.scheduled_cached_reqs
        before = new | dict(zip(cached.req_ids, cached.num_computed_tokens))
        admitted = set(new) | set(getattr(cached, "resumed_req_ids", None) or ())
        order = list(cap.batch_req_ids) if cap.batch is not None else []
        order += [i for i in out.num_scheduled_tokens if i not in order]  # the batch's row order first
        for iid in out.num_scheduled_tokens:  # vLLM's scheduling order: running, then admitted
            if iid in admitted:
                entry = eng.requests[ext[iid]]
                entry.num_prefill_chunks = 0
                entry.num_cached_tokens = int(before[iid])
                entry.metrics.record("first_scheduled_time", now_wall, engine_start)
                rec.new_requests.append(entry.request_id)
                eng.counters["prefix_cache_hits"] += before[iid]
                eng.counters["prefix_cache_queries"] += cap.counts[iid][0]
        for iid in order:
            entry = eng.requests[ext[iid]]
            n, b = int(out.num_scheduled_tokens[iid]), int(before[iid])
            num_tokens, num_prompt = cap.counts[iid]
            is_decode = n == 1 and b == num_tokens - 1 and b >= num_prompt
            rec.scheduled.append({SCHED.REQUEST_ID: entry.request_id, SCHED.NUM_TOKENS: n, SCHED.NUM_COMPUTED_BEFORE: b,
                                  SCHED.IS_PREFILL: not is_decode, SCHED.NUM_CACHED_TOKENS: b if iid in admitted else 0,
                                  SCHED.CHUNK_INDEX: None if is_decode else entry.num_prefill_chunks})
            if not is_decode:
                entry.num_prefill_chunks += 1
                eng.counters["num_prompt_tokens_computed"] += n
        for iid in sorted(out.preempted_req_ids or (), key=lambda i: ext[i]):
            entry = eng.requests[ext[iid]]
            entry.metrics.record("preempted_times", now_wall, engine_start)
            rec.preempted.append(entry.request_id)
        eng.counters["num_preemptions"] += len(rec.preempted)
    if cap.batch is not None:
        rec.batch = cap.batch
        qsl, pos = cap.batch[BATCH.QUERY_START_LOC], cap.batch[BATCH.POSITIONS]
        eng._last_rows = {iid: (qsl[i], qsl[i + 1], pos[qsl[i]:qsl[i + 1]])
                           for i, iid in enumerate(cap.batch_req_ids)}
    else:
        eng._last_rows = {}
    for o in outputs:
        entry = eng.requests.get(o.request_id)
        if entry is None or not o.outputs:
            continue
        c = o.outputs[0]
        if c.token_ids:
            rec.sampled[entry.request_id] = _sampled(eng, c, min(entry.params.logprobs_top, eng._max_logprobs))
            for _ in c.token_ids:
                entry.metrics.record("token_times", now_wall, eng.engine_time)
            eng.counters["num_generated_tokens"] += len(c.token_ids)
        if o.finished and entry.finish_reason is None:
            eng._finish(entry, c.finish_reason or "stop", now_wall)
            rec.finished.append(entry.request_id)
    for blk, tokens in cap.cached_tokens.items():
        h = eng.pool.blocks[blk].block_hash
        if h is not None:
            eng._block_tokens[blk] = (h, tokens)
    rec.blocks = {k: list(v) for k, v in cap.blocks.items()}
    rec.num_free_blocks = int(eng.pool.get_num_free_blocks())
    sec = cap.seconds
    if eng.runner is not None:  # vLLM's own runner in this process: its phases, timed
        forward, sample = max(0.0, sec["execute"] - sec["prepare"]), sec["sample"]
        update = max(0.0, vllm_s - sec["schedule"] - sec["execute"] - sec["sample"])
    else:  # workers in other processes: what rank 0 waited for, sampling included
        forward, sample = max(0.0, vllm_s - sec["schedule"] - sec["update"]), 0.0
        update = sec["update"]
    rec.timings_ms = {TIME.SCHEDULE: sec["schedule"] * 1e3, TIME.PREPARE: sec["prepare"] * 1e3,
                      TIME.FORWARD: forward * 1e3, TIME.SAMPLE: sample * 1e3, TIME.UPDATE: update * 1e3,
                      TIME.TOTAL: vllm_s * 1e3, TIME.COLLECTIVES: 0.0,
                      TIME.BACKEND: f"vLLM {eng._model_info.get('attention_backend') or ''}".strip(),
                      TIME.CUDA_GRAPH_BUCKET: None, TIME.FORWARD_PATH: "eager"}
    rec.engine_time_s = eng.engine_time
    rec.wall_time_s = now_wall
    rec.token_budget = cap.token_budget or int(eng.scheduler.max_num_scheduled_tokens)
    rec.budgets = budgets(eng, rec.token_budget)
    rec.num_running, rec.num_waiting = len(eng.scheduler.running), eng._num_waiting()
    return rec


def budgets(eng: Any, token_budget: int | None = None) -> dict:
    """The scheduler knobs as vLLM's own scheduler holds them (kvscope's knob names,
    engine.config.SCHEDULER_KNOBS): what the step just taken ran under."""
    s = eng.scheduler
    return {BUDGET.MAX_NUM_BATCHED_TOKENS: int(token_budget or s.max_num_scheduled_tokens),
            BUDGET.MAX_NUM_SEQS: int(s.max_num_running_reqs),
            BUDGET.ENABLE_CHUNKED_PREFILL: bool(s.scheduler_config.enable_chunked_prefill),
            BUDGET.ENABLE_PREFIX_CACHING: bool(s.cache_config.enable_prefix_caching),
            BUDGET.SCHEDULER_RESERVE_FULL_ISL: bool(getattr(s, "scheduler_reserve_full_isl",
                                                            eng.config.scheduler_reserve_full_isl)),
            BUDGET.SCHEDULING_POLICY: "unified"}  # vLLM v1 has one policy: prefill and decode under one budget

def _sampled(eng: Any, c: Any, k: int) -> dict:
    """The sampled token and vLLM's top-k candidates for its row (vLLM's logprobs, as
    probabilities; vLLM adds the sampled token with its own rank when it is not in the top k)."""
    token = int(c.token_ids[-1])
    lp = c.logprobs[-1] if c.logprobs else None
    top, text = [], None
    if lp:
        ranked = sorted((v.rank, t, v.logprob) for t, v in lp.items() if v.rank is not None and 0 < v.rank <= k)
        top = [[int(t), math.exp(logprob)] for _, t, logprob in ranked]
        if token in lp:
            text = lp[token].decoded_token
    return {SAMPLE.TOKEN_ID: token, SAMPLE.TEXT: text if text is not None else eng._text(token), SAMPLE.TOP: top}


def request_dict(eng: Any, e: RequestState, table: list[int]) -> dict:
    """One request as the snapshot shows it (kvscope's request dict), from vLLM's Request."""
    r = e.req
    prompt = list(r.prompt_token_ids or ())
    output = list(r.output_token_ids)
    return {REQ.REQUEST_ID: e.request_id, REQ.STATUS: status_name(r.status), REQ.PROMPT_TOKEN_IDS: prompt,
            REQ.OUTPUT_TOKEN_IDS: output,
            REQ.PROMPT_TEXT: e.prompt_text if e.prompt_text is not None else _decode(eng, e, "prompt", prompt),
            REQ.OUTPUT_TEXT: _decode(eng, e, "output", output), REQ.NUM_COMPUTED_TOKENS: int(r.num_computed_tokens),
            REQ.NUM_CACHED_TOKENS: e.num_cached_tokens, REQ.BLOCK_TABLE: table,
            REQ.NUM_PREEMPTIONS: int(r.num_preemptions), REQ.FINISH_REASON: e.finish_reason,
            REQ.MAX_TOKENS: e.params.max_tokens, REQ.SAMPLING_PARAMS: e.params.to_dict(),
            REQ.METRICS: e.metrics.to_dict()}

def finished_dict(eng: Any, e: RequestState) -> dict:
    if e.frozen is None:  # a finished request no longer changes: build its dict once
        e.frozen = request_dict(eng, e, []) | {REQ.STATUS: "finished"}
    return e.frozen

def _decode(eng: Any, e: RequestState, which: str, ids: list[int]) -> str:
    key, text = e.text.get(which, (None, ""))
    if key != len(ids):
        text = eng.tokenizer.decode(ids)
        e.text[which] = (len(ids), text)
    return text

def pool_dict(eng: Any, running: list, tables: dict[str, list[int]]) -> dict:
    """Every block of vLLM's pool: refcount, hash, free or not, owners and the tokens it holds."""
    bs, ext = eng.block_size, eng._external
    owners: dict[int, list[str]] = {}
    tokens: dict[int, list[int]] = {}
    for r in running:
        ids, n = r.all_token_ids, r.num_computed_tokens
        for i, b in enumerate(tables[r.request_id]):
            owners.setdefault(b, []).append(ext[r.request_id])
            if b not in tokens:
                tokens[b] = list(ids[i * bs:min((i + 1) * bs, n)])
    blocks = [block_dict(eng, blk, tokens.get(blk.block_id), owners.get(blk.block_id, [])) for blk in eng.pool.blocks]
    return {POOL.NUM_BLOCKS: int(eng.pool.num_gpu_blocks), POOL.BLOCK_SIZE: bs,
            POOL.NUM_FREE_BLOCKS: int(eng.pool.get_num_free_blocks()), POOL.BLOCKS: blocks}


def block_dict(eng: Any, blk: Any, held: list[int] | None, owners: list[str]) -> dict:
    """One of vLLM's KVCacheBlocks as the snapshot shows it. `held`: the tokens a running
    request keeps in it (None: no running request holds it, so the tokens it was cached with,
    while it keeps that hash). Free means in vLLM's free queue, where exactly the blocks with
    no reference are (the null block, never handed out, aside)."""
    b, h = blk.block_id, blk.block_hash
    if held is None:
        known = eng._block_tokens.get(b)
        held = known[1] if known is not None and h is not None and known[0] == h else []
    elif h is not None:
        eng._block_tokens[b] = (h, held)
    return {BLOCK.BLOCK_ID: b, BLOCK.REF_COUNT: int(blk.ref_cnt), BLOCK.HASH: None if h is None else bytes(h)[:8].hex(),
            BLOCK.TOKEN_IDS: held, BLOCK.OWNERS: owners, BLOCK.IS_NULL: bool(blk.is_null),
            BLOCK.IS_FREE: blk.ref_cnt == 0 and not blk.is_null}


def status_name(status: Any) -> str:
    name = getattr(status, "name", str(status))
    if name.startswith("FINISHED"):
        return "finished"
    return {"RUNNING": "running", "PREEMPTED": "preempted"}.get(name, "waiting")
