"""The Session's metrics: per-request rows and a summary, on the engine clock (vLLM's metric
names), from the latest snapshot and the step records."""
from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import TypedDict

from engine.report.schema import (
    CLOCK,
    METRICS,
    QUEUE,
    REC,
    REQ,
    RMETRICS,
    SCHED,
    SNAP,
    EngineSnapshotDict,
    RequestDict,
    StepRecordDict,
)


class RequestRowDict(TypedDict):
    """One request's metrics on the engine clock (seconds; None where not known yet)."""
    request_id: str
    status: str
    finish_reason: str | None
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int
    num_preemptions: int
    arrival_time: float | None
    first_token_time: float | None
    token_times: list[float]
    # vLLM's per-request metric names (RequestMetrics / its Prometheus histograms).
    time_to_first_token: float | None
    inter_token_latency: list[float]
    mean_inter_token_latency: float | None
    time_per_output_token: float | None
    e2e_request_latency: float | None
    request_queue_time: float | None


class SummaryDict(TypedDict):
    """The whole session on the engine clock: counts, throughput, latency means and medians."""
    clock: str
    num_steps: int
    engine_time_s: float
    num_requests: int
    num_waiting: int
    num_running: int
    num_finished: int
    num_generated_tokens: int
    num_processed_tokens: int
    output_throughput_tok_s: float | None
    total_throughput_tok_s: float | None
    mean_ttft_s: float | None
    median_ttft_s: float | None
    mean_itl_s: float | None
    median_itl_s: float | None
    mean_e2e_s: float | None
    kv_cache_usage: float | None
    prefix_cache_hits: int
    prefix_cache_queries: int
    prefix_cache_hit_rate: float | None
    num_preemptions: int


class SessionMetricsDict(TypedDict):
    """Session.metrics: a row per request (arrival order) and the summary."""
    requests: list[RequestRowDict]
    summary: SummaryDict


def _mean(xs: Iterable[float]) -> float | None:
    xs = list(xs)
    return statistics.fmean(xs) if xs else None


def _median(xs: Iterable[float]) -> float | None:
    xs = list(xs)
    return statistics.median(xs) if xs else None


def request_row(req: RequestDict) -> RequestRowDict:
    """One request's metrics on the engine clock (seconds; None where not known yet)."""
    m = req[REQ.METRICS][RMETRICS.ENGINE]
    itl = list(m.get(CLOCK.INTER_TOKEN_LATENCY) or [])
    return {
        "request_id": req[REQ.REQUEST_ID],
        "status": req[REQ.STATUS],
        "finish_reason": req.get(REQ.FINISH_REASON),
        # Counts where the token ids are left out (a live feed with KVSCOPE_FEED_TOKENS=0).
        "num_prompt_tokens": req.get(REQ.NUM_PROMPT_TOKENS, len(req[REQ.PROMPT_TOKEN_IDS])),
        "num_output_tokens": req.get(REQ.NUM_OUTPUT_TOKENS, len(req[REQ.OUTPUT_TOKEN_IDS])),
        "num_cached_tokens": req.get(REQ.NUM_CACHED_TOKENS, 0),
        "num_preemptions": req.get(REQ.NUM_PREEMPTIONS, 0),
        "arrival_time": m.get(CLOCK.ARRIVAL_TIME),
        "first_token_time": m.get(CLOCK.FIRST_TOKEN_TIME),
        "token_times": list(m.get(CLOCK.TOKEN_TIMES) or []),
        "time_to_first_token": m.get(CLOCK.TIME_TO_FIRST_TOKEN),
        "inter_token_latency": itl,
        "mean_inter_token_latency": _mean(itl),
        "time_per_output_token": m.get(CLOCK.TIME_PER_OUTPUT_TOKEN),
        "e2e_request_latency": m.get(CLOCK.E2E_REQUEST_LATENCY),
        "request_queue_time": m.get(CLOCK.REQUEST_QUEUE_TIME),
    }


def session_metrics(snapshot: EngineSnapshotDict, records: list[StepRecordDict]) -> SessionMetricsDict:
    """Per-request rows and a summary from the latest snapshot and the step records."""
    queues = snapshot[SNAP.QUEUES]
    reqs = [*queues[QUEUE.FINISHED], *queues[QUEUE.RUNNING], *queues[QUEUE.WAITING]]
    rows = sorted((request_row(r) for r in reqs), key=lambda r: (r["arrival_time"] is None, r["arrival_time"] or 0))
    em = snapshot.get(SNAP.METRICS)
    engine_time = records[-1][REC.ENGINE_TIME_S] if records else em[METRICS.ENGINE_TIME_S] if em else 0.0
    generated = sum(len(r[REC.SAMPLED]) for r in records)
    processed = sum(s[SCHED.NUM_TOKENS] for r in records for s in r[REC.SCHEDULED])
    ttfts = [t for r in rows if (t := r["time_to_first_token"]) is not None]
    itls = [x for r in rows for x in r["inter_token_latency"]]
    e2es = [t for r in rows if (t := r["e2e_request_latency"]) is not None]
    hits, queries = (em[METRICS.PREFIX_CACHE_HITS], em[METRICS.PREFIX_CACHE_QUERIES]) if em else (0, 0)
    summary: SummaryDict = {
        "clock": "engine",
        "num_steps": len(records),
        "engine_time_s": engine_time,
        "num_requests": len(rows),
        "num_waiting": len(queues[QUEUE.WAITING]),
        "num_running": len(queues[QUEUE.RUNNING]),
        "num_finished": len(queues[QUEUE.FINISHED]),
        "num_generated_tokens": generated,
        "num_processed_tokens": processed,
        "output_throughput_tok_s": generated / engine_time if engine_time > 0 else None,
        "total_throughput_tok_s": processed / engine_time if engine_time > 0 else None,
        "mean_ttft_s": _mean(ttfts), "median_ttft_s": _median(ttfts),
        "mean_itl_s": _mean(itls), "median_itl_s": _median(itls),
        "mean_e2e_s": _mean(e2es),
        "kv_cache_usage": em[METRICS.KV_CACHE_USAGE] if em else None,
        "prefix_cache_hits": hits, "prefix_cache_queries": queries,
        "prefix_cache_hit_rate": hits / queries if queries else None,
        "num_preemptions": em[METRICS.NUM_PREEMPTIONS] if em else 0,
    }
    return {"requests": rows, "summary": summary}
