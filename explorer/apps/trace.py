"""`python -m explorer trace`: print, step by step, the tables the vLLM / nano-vLLM
articles draw by hand (input_ids, positions, query_start_loc, seq_lens,
logits_indices, block_table, slot_mapping, sampled token), from real StepRecords.
"""
from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any, Literal, TextIO

from engine.report.list_prefix import as_json as views_as_lists
from engine.report.schema import StepRecordDict

from ..core.session import Session

# The rows of one step's table, in the order the articles present them.
BATCH_ROWS: tuple[Literal["input_ids", "positions", "query_start_loc", "seq_lens", "logits_indices"], ...] = (
    "input_ids", "positions", "query_start_loc", "seq_lens", "logits_indices")
_ENDED: tuple[Literal["preempted", "finished"], ...] = ("preempted", "finished")   # the record's lists of ids
LABEL_WIDTH = 17


def fmt_list(values: Sequence[int], limit: int | None) -> str:
    """`[a, b, c]`, or its head and tail around an ellipsis when longer than `limit`."""
    values = list(values)
    if limit is None or len(values) <= limit:
        return "[" + ", ".join(map(str, values)) + "]"
    head, tail = values[: limit - 4], values[-4:]
    return ("[" + ", ".join(map(str, head)) + f", … {len(values) - len(head) - len(tail)} more …, "
            + ", ".join(map(str, tail)) + "]")


def _row(label: str, value: str) -> str:
    return f"  {label:<{LABEL_WIDTH}}{value}"


def describe_schedule(record: StepRecordDict) -> str:
    """`prefill 0[0:5]  decode 1[7]`: what each scheduled request computes in this step."""
    parts = []
    for s in record["scheduled"]:
        start, end = s["num_computed_before"], s["num_computed_before"] + s["num_tokens"]
        if s["is_prefill"]:
            chunk = f" chunk {s['chunk_index']}" if s.get("chunk_index") else ""
            cached = f" ({s['num_cached_tokens']} cached)" if s.get("num_cached_tokens") else ""
            parts.append(f"prefill {s['request_id']}[{start}:{end}]{chunk}{cached}")
        else:
            parts.append(f"decode {s['request_id']}[{start}]")
    return "  ".join(parts) or "nothing scheduled"


def format_step(record: StepRecordDict, limit: int | None = 64) -> str:
    """One step's table as text."""
    n_tokens = sum(s["num_tokens"] for s in record["scheduled"])
    lines = [f"step {record['step']}: {describe_schedule(record)}   "
             f"({n_tokens} token{'' if n_tokens == 1 else 's'}, budget {record.get('token_budget')})"]
    batch = record["batch"]
    for key in BATCH_ROWS:
        lines.append(_row(key, fmt_list(batch.get(key, []), limit)))
    ids = [s["request_id"] for s in record["scheduled"]]
    tables = "   ".join(f"{rid}: {fmt_list(bt, limit)}" for rid, bt in zip(ids, batch.get("block_tables", [])))
    lines.append(_row("block_table", tables or "[]"))
    lines.append(_row("slot_mapping", fmt_list(batch.get("slot_mapping", []), limit)))
    sampled = "   ".join(f"{rid}: {s['token_id']} {s['text']!r}" for rid, s in record["sampled"].items())
    lines.append(_row("sampled", sampled or "(none: no request finished its prompt)"))
    blocks = record.get("blocks", {})
    events = "  ".join(f"{k} {v}" for k, v in blocks.items() if v)
    if events:
        lines.append(_row("blocks", events))
    for ended in _ENDED:
        if record.get(ended):
            lines.append(_row(ended, ", ".join(record[ended])))
    return "\n".join(lines)


def format_header(session: Session) -> str:
    snap = session.current.snapshot
    info, cfg = snap["model_info"], snap["config"]
    return (f"model {info['name']} ({info['architecture']}, {info['num_layers']} layers, {info['dtype']}, "
            f"{info['device']})  block_size {cfg['block_size']}  num_kv_blocks {cfg['num_kv_blocks']} "
            f"(block 0 is the null block)  max_num_batched_tokens {cfg['max_num_batched_tokens']}  "
            f"policy {cfg['scheduling_policy']}")


def run_trace(prompts: Sequence[str], max_tokens: int, *, model: str | None = None, temperature: float = 0.0,
              chat: bool = False, limit: int | None = 64, as_json: bool = False, out: TextIO | None = None,
              **config_fields: Any) -> int:
    """Run `prompts` to completion, printing every step; returns a process exit code."""
    out = out or sys.stdout
    config_fields = {k: v for k, v in config_fields.items() if v is not None}
    session = Session(model, **config_fields)
    tok = session.source.tokenizer
    ids = []
    for prompt in prompts:
        if chat:
            prompt = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
        ids.append(session.add_request(prompt, max_tokens=max_tokens, temperature=temperature))
    if not as_json:
        print(format_header(session), file=out)
        for req in session.current.snapshot["queues"]["waiting"]:
            print(f"request {req['request_id']}: {req['prompt_text']!r} -> {len(req['prompt_token_ids'])} "
                  f"tokens {fmt_list(req['prompt_token_ids'], limit)}", file=out)
    for rec in session.run_until_idle():
        d = rec.to_dict()
        print(json.dumps(d, default=views_as_lists) if as_json else "\n" + format_step(d, limit), file=out,
              flush=True)
    if not as_json:
        print("", file=out)
        finished = {r["request_id"]: r for r in session.current.snapshot["queues"]["finished"]}
        for rid in ids:
            r = finished[rid]
            print(f"request {rid} finished ({r['finish_reason']}): {r['output_text']!r}", file=out)
        s = session.metrics["summary"]
        print(f"{s['num_steps']} steps, {s['num_generated_tokens']} tokens generated in "
              f"{s['engine_time_s']:.2f} s of engine time", file=out)
    return 0
