"""kvscope's whole engine against vLLM 0.32's LLM, both run in this process on the default
model (fp32, greedy, block_size 32), stepped together: each step must schedule the same
tokens per request from the same computed counts, preempt and finish the same requests,
leave every running request with the same block ids, and sample the same tokens.

    python -m tests.oracle.engine_differential [--workloads 20]

One engine of each kind serves every workload in turn (vLLM takes ~30 s to start), so the
prefix cache carries over from one workload to the next on both sides alike. The last line
is JSON counts; exit status 1 on any difference.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

# One configuration for both: a small budget chunks prompts, a small pool preempts.
BLOCK_SIZE = 32
NUM_BLOCKS = 10          # including the null block 0
BUDGET = 96
MAX_NUM_SEQS = 6
MAX_MODEL_LEN = 256     # vLLM refuses a max_model_len the pool cannot hold (9 blocks of 32 here)


def workloads(n: int, seed: int = 0) -> list[list[dict]]:
    """Requests as {id, prompt (token ids), max_tokens, arrival_step}. Every workload mixes
    a 70-token system prompt shared by most requests (two full blocks: hits, and same-step
    hits when two arrive together) with fresh prompts long enough to be chunked."""
    rng = random.Random(seed)
    out = []
    for w in range(n):
        # A new system prompt per workload: the engines serve one workload after another, and
        # a prefix cached by an earlier one would turn every same-step hit into a plain hit.
        system = [rng.randrange(200, 20000) for _ in range(70)]
        reqs = []
        for i in range(rng.randint(2, 6)):
            # Short questions after the system prompt leave budget for a second request in the
            # same step (a same-step hit); long ones are chunked.
            own_len = rng.choice([rng.randint(3, 24), rng.randint(3, 150)])
            own = [rng.randrange(200, 20000) for _ in range(own_len)]
            prompt = (system + own) if rng.random() < 0.7 else own
            reqs.append({"id": f"w{w}-{i}", "prompt": prompt, "max_tokens": rng.randint(1, 20),
                         "arrival_step": rng.choice([0, 0, rng.randint(0, 8)])})
        out.append(reqs)
    return out


class KvscopeSide:
    def __init__(self, model: str) -> None:
        from engine import LLM

        self.engine = LLM(model=model, dtype="float32", block_size=BLOCK_SIZE, num_kv_blocks=NUM_BLOCKS,
                          max_num_batched_tokens=BUDGET, max_num_seqs=MAX_NUM_SEQS, max_model_len=MAX_MODEL_LEN,
                          check_invariants=True).engine

    def add(self, r: dict) -> None:
        from engine import SamplingParams

        self.engine.add_request(r["prompt"], SamplingParams(temperature=0.0, max_tokens=r["max_tokens"],
                                                             ignore_eos=True), request_id=r["id"])

    def step(self) -> dict:
        rec = self.engine.step()
        self.blocks = rec.blocks
        return {"scheduled": {s["request_id"]: s["num_tokens"] for s in rec.scheduled},
                "computed_before": {s["request_id"]: s["num_computed_before"] for s in rec.scheduled},
                "preempted": sorted(rec.preempted), "finished": sorted(rec.finished),
                "sampled": {rid: s["token_id"] for rid, s in rec.sampled.items()},
                "block_tables": {r.request_id: list(r.block_table) for r in self.engine.scheduler.running},
                "num_free_blocks": rec.num_free_blocks}

    def busy(self) -> bool:
        return self.engine.has_unfinished_requests()


class VllmSide:
    def __init__(self, model: str) -> None:
        from vllm import LLM

        llm = LLM(model=model, dtype="float32", enforce_eager=True, block_size=BLOCK_SIZE,
                  num_gpu_blocks_override=NUM_BLOCKS, max_num_batched_tokens=BUDGET, max_num_seqs=MAX_NUM_SEQS,
                  max_model_len=MAX_MODEL_LEN, enable_prefix_caching=True, async_scheduling=False, seed=0,
                  # On CPU this is the share of RAM vLLM may claim; the pool is set by the override.
                  gpu_memory_utilization=0.2)
        self.engine = llm.llm_engine
        self.scheduler = self.engine.engine_core.engine_core.scheduler
        # Keep each step's SchedulerOutput: what vLLM decided, read before the model runs.
        schedule, self.last = self.scheduler.schedule, None

        def recording_schedule(*args, **kwargs):
            self.last = schedule(*args, **kwargs)
            return self.last

        self.scheduler.schedule = recording_schedule

    def add(self, r: dict) -> None:
        from vllm import SamplingParams

        self.engine.add_request(r["id"], {"prompt_token_ids": r["prompt"]},
                                SamplingParams(temperature=0.0, max_tokens=r["max_tokens"], ignore_eos=True))

    @staticmethod
    def external_id(internal: str) -> str:
        """vLLM's engine core runs a request as '<its id>-<8 random hex digits>'."""
        rid, suffix = internal.rsplit("-", 1)
        assert len(suffix) == 8 and int(suffix, 16) >= 0, internal
        return rid

    def step(self) -> dict:
        self.last = None
        ext = self.external_id
        before = {ext(rid): len(r.output_token_ids) for rid, r in self.scheduler.requests.items()}
        outputs = self.engine.step()
        out, sch = self.last, self.scheduler
        if out is None:
            raise RuntimeError("vLLM's step did not schedule")
        new = {d.req_id: d.num_computed_tokens for d in out.scheduled_new_reqs}
        cached = out.scheduled_cached_reqs
        computed = new | dict(zip(cached.req_ids, cached.num_computed_tokens))
        scheduled = {ext(r): n for r, n in out.num_scheduled_tokens.items()}
        sampled = {}
        for o in outputs:  # cumulative outputs: the newest token is the last one
            toks = o.outputs[0].token_ids
            if toks and len(toks) > before.get(o.request_id, 0) and o.request_id in scheduled:
                sampled[o.request_id] = toks[-1]
        kv = sch.kv_cache_manager
        return {"scheduled": scheduled,
                "computed_before": {ext(r): computed[r] for r in out.num_scheduled_tokens},
                "preempted": sorted(ext(r) for r in out.preempted_req_ids or ()),
                "finished": sorted(o.request_id for o in outputs if o.finished),
                "sampled": sampled,
                "block_tables": {ext(r.request_id): list(kv.get_block_ids(r.request_id)[0]) for r in sch.running},
                "num_free_blocks": kv.block_pool.get_num_free_blocks()}

    def busy(self) -> bool:
        return self.engine.has_unfinished_requests()


def run_workload(ours: KvscopeSide, theirs: VllmSide, reqs: list[dict], counts: dict) -> str | None:
    """Step both engines through one workload; a description of the first difference, or None."""
    step = 0
    while step == 0 or ours.busy() or theirs.busy() or any(r["arrival_step"] >= step for r in reqs):
        for r in reqs:
            if r["arrival_step"] == step:
                ours.add(r)
                theirs.add(r)
        step += 1
        mine, other = ours.step(), theirs.step()
        key = next((k for k in mine if mine[k] != other[k]), None)
        if key is not None:
            shape = [(r["id"], len(r["prompt"]), r["max_tokens"], r["arrival_step"]) for r in reqs]
            return f"step {step}: {key} differs\n  kvscope: {mine[key]}\n  vllm:    {other[key]}\n  requests: {shape}"
        counts["steps"] += 1
        counts["tokens"] += len(mine["sampled"])
        counts["preemptions"] += len(mine["preempted"])
        counts["prefill_chunks_not_sampled"] += sum(1 for r in mine["scheduled"] if r not in mine["sampled"])
        counts["same_step_hit_blocks"] += len(ours.blocks["same_step_hits"])
    counts["workloads"] += 1
    counts["requests"] += len(reqs)
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", type=int, default=20)
    ap.add_argument("--model", default=None, help="HF folder (default: the default model)")
    args = ap.parse_args(argv)
    from engine.default_model import default_model_path

    model = args.model or str(default_model_path())
    t0 = time.monotonic()
    ours, theirs = KvscopeSide(model), VllmSide(model)
    load_s = time.monotonic() - t0
    counts = dict.fromkeys(("workloads", "steps", "requests", "tokens", "prefill_chunks_not_sampled", "preemptions",
                            "same_step_hit_blocks"), 0)
    difference = None
    for w, reqs in enumerate(workloads(args.workloads)):
        difference = run_workload(ours, theirs, reqs, counts)
        if difference:
            print(f"workload {w}, {difference}", file=sys.stderr)
            break
    counts["hit_tokens"] = ours.engine.kv.prefix_cache_hits
    counts["differences"] = int(difference is not None)
    print(f"engine differential vs vLLM 0.32 on the default model: load {load_s:.0f} s, "
          f"run {time.monotonic() - t0 - load_s:.0f} s")
    print(json.dumps(counts))
    return 1 if difference else 0


if __name__ == "__main__":
    sys.exit(main())
