"""The Session's metrics: per-request rows and a summary, on the engine clock (vLLM's metric
names), from the latest snapshot and the step records."""
from __future__ import annotations

import statistics
from typing import Iterable

def _mean(xs: Iterable[float]) -> float | None:
    xs = list(xs)
    return statistics.fmean(xs) if xs else None


def _median(xs: Iterable[float]) -> float | None:
    xs = list(xs)
    return statistics.median(xs) if xs else None


def request_row(req: dict) -> dict:
    """One request's metrics on the engine clock (seconds; None where not known yet)."""
    m = req["metrics"]["engine"]
    itl = list(m.get("inter_token_latency") or [])
    return {
        "request_id": req["request_id"],
        "status": req["status"],
        "finish_reason": req.get("finish_reason"),
        # Counts where the token ids are left out (a live feed with KVSCOPE_FEED_TOKENS=0).
        "num_prompt_tokens": req.get("num_prompt_tokens", len(req["prompt_token_ids"])),
        "num_output_tokens": req.get("num_output_tokens", len(req["output_token_ids"])),
        "num_cached_tokens": req.get("num_cached_tokens", 0),
        "num_preemptions": req.get("num_preemptions", 0),
        "arrival_time": m.get("arrival_time"),
        "first_token_time": m.get("first_token_time"),
        "token_times": list(m.get("token_times") or []),
        # vLLM's per-request metric names (RequestMetrics / its Prometheus histograms).
        "time_to_first_token": m.get("time_to_first_token"),
        "inter_token_latency": itl,
        "mean_inter_token_latency": _mean(itl),
        "time_per_output_token": m.get("time_per_output_token"),
        "e2e_request_latency": m.get("e2e_request_latency"),
        "request_queue_time": m.get("request_queue_time"),
    }


def session_metrics(snapshot: dict, records: list[dict]) -> dict:
    """Per-request rows and a summary from the latest snapshot and the step records."""
    queues = snapshot["queues"]
    reqs = [*queues["finished"], *queues["running"], *queues["waiting"]]
    rows = sorted((request_row(r) for r in reqs), key=lambda r: (r["arrival_time"] is None, r["arrival_time"] or 0))
    em = snapshot.get("metrics", {})
    engine_time = records[-1]["engine_time_s"] if records else em.get("engine_time_s", 0.0)
    generated = sum(len(r["sampled"]) for r in records)
    processed = sum(s["num_tokens"] for r in records for s in r["scheduled"])
    ttfts = [r["time_to_first_token"] for r in rows if r["time_to_first_token"] is not None]
    itls = [x for r in rows for x in r["inter_token_latency"]]
    e2es = [r["e2e_request_latency"] for r in rows if r["e2e_request_latency"] is not None]
    hits, queries = em.get("prefix_cache_hits", 0), em.get("prefix_cache_queries", 0)
    summary = {
        "clock": "engine",
        "num_steps": len(records),
        "engine_time_s": engine_time,
        "num_requests": len(rows),
        "num_waiting": len(queues["waiting"]),
        "num_running": len(queues["running"]),
        "num_finished": len(queues["finished"]),
        "num_generated_tokens": generated,
        "num_processed_tokens": processed,
        "output_throughput_tok_s": generated / engine_time if engine_time > 0 else None,
        "total_throughput_tok_s": processed / engine_time if engine_time > 0 else None,
        "mean_ttft_s": _mean(ttfts), "median_ttft_s": _median(ttfts),
        "mean_itl_s": _mean(itls), "median_itl_s": _median(itls),
        "mean_e2e_s": _mean(e2es),
        "kv_cache_usage": em.get("kv_cache_usage"),
        "prefix_cache_hits": hits, "prefix_cache_queries": queries,
        "prefix_cache_hit_rate": hits / queries if queries else None,
        "num_preemptions": em.get("num_preemptions", 0),
    }
    return {"requests": rows, "summary": summary}
