"""A sweep's rows built by hand in the shape `sweep()` gives them (explorer/whatif/sweep.py's
summarize: settings, metrics, status, label), for checks of the charts without vLLM. The default
grid is the one the browser review read in notebooks/whatif.ipynb: pools of 34, 40 and 80 blocks
against budgets of 16 to 64 tokens, 256 hit tokens in every row, the hit rate spread from 22.7%
to 23.3% by the budget alone, TTFT p90 the same at 40 and 80 blocks, and settings with 0
preemptions beside ones that preempt."""
from __future__ import annotations

from typing import Any

BLOCKS = (34, 40, 80)
BUDGETS = (16, 32, 48, 64)
# The recorded run's settings, every knob a what-if may change (explorer/whatif/settings.py KNOBS).
RECORDED = {"block_size": 16, "num_blocks": 40, "max_num_batched_tokens": 32, "max_num_seqs": 8,
            "enable_prefix_caching": True, "enable_chunked_prefill": True, "long_prefill_token_threshold": 0,
            "long_prefill_token_threshold_adaptive": False, "policy": "fcfs", "scheduler_reserve_full_isl": False,
            "watermark": 0.0}
HIT_RATE = {16: 0.227, 32: 0.229, 48: 0.231, 64: 0.233}   # set by the budget: the same at every pool
PREEMPTIONS = {34: {16: 3, 32: 2, 48: 2, 64: 1}, 40: {16: 1, 32: 0, 48: 0, 64: 0}, 80: dict.fromkeys(BUDGETS, 0)}
TTFT_P90 = {16: 0.41, 32: 0.30, 48: 0.26, 64: 0.25}        # at 40 and 80 blocks; 34 blocks preempts and waits


def row(num_blocks: int, budget: int, index: int, **metrics: Any) -> dict:
    settings = {**RECORDED, "num_blocks": num_blocks, "max_num_batched_tokens": budget}
    changes = {k: v for k, v in settings.items() if v != RECORDED[k]}
    preemptions = PREEMPTIONS[num_blocks][budget]
    out = {"index": index, "changes": changes, "status": "ok", "settings": settings,
           "label": ", ".join(f"{k}={v}" for k, v in changes.items()) or "as recorded",
           "steps": 120 + 3 * preemptions, "hit_tokens": 256, "query_tokens": round(256 / HIT_RATE[budget]),
           "resumed_hit_tokens": 0, "hit_rate": HIT_RATE[budget], "preemptions": preemptions,
           "recomputed_tokens": 300 + 7 * index if preemptions else 0,
           "max_waiting": 4, "mean_waiting": 1.5, "max_kv_usage": 1.0, "mean_kv_usage": 0.7,
           "ttft_p50": 0.1, "ttft_p90": TTFT_P90[budget] * (1.4 if num_blocks == 34 else 1.0),
           "itl_p50": 0.02, "itl_p90": 0.03, "e2e_p50": 1.0, "e2e_p90": 2.0,
           "replay_seconds": 0.1, "scheduler_seconds": 0.05, "kv_tokens": num_blocks * 16,
           "kv_bytes": num_blocks * 16 * 1024}
    out.update(metrics)
    return out


def review_rows() -> list[dict]:
    return [row(b, t, i) for i, (b, t) in enumerate((b, t) for b in BLOCKS for t in BUDGETS)]


def sweep_result(rows: list[dict]) -> Any:
    """A SweepResult over `rows`, as `sweep()` returns it, with a step-time model for the
    predicted latencies (its error goes into the TTFT chart's title)."""
    from explorer.whatif.step_model import StepTimeModel
    from explorer.whatif.sweep import SweepResult

    model = StepTimeModel(coefficients=(0.01, 1e-4, 1e-3, 1e-6), step_error=0.08, total_error=0.04, num_steps=120,
                          clock="wall")
    return SweepResult(rows=rows, recording=None, step_model=model, arrivals="timed")  # type: ignore[arg-type]
