"""`python -m benchmarks bench`: the engine against Hugging Face `generate` and vLLM's CPU build
on the same model, prompts and greedy settings, in one run (this machine is shared and noisy:
only ratios measured side by side, alternating the sides, mean anything). vLLM runs in a
process of its own (bench/vllm_side.py), loaded once.

Workloads (issue: CPU performance):
  offline  32 prompts of 20-400 tokens, 64-128 new tokens each, ignore_eos
  stream   1 prompt, 128 new tokens: per-token latency
  shared   a 300-token system prompt + 32 different questions (prefix caching matters)
Plus the cost of observation: StepRecords off / on / an explorer Session recording history.
"""
from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass, field

import torch

from engine import LLM, SamplingParams
from explorer.apps.machine import cpu_summary

BENCH_KV_BYTES = 2 * 2**30


@dataclass
class Workload:
    """A named list of token-id prompts with each one's max_tokens."""
    name: str
    prompts: list[list[int]]
    max_tokens: list[int]


@dataclass
class RunResult:
    """One timed run of a workload by one side (kvscope, HF generate or vLLM)."""
    seconds: float
    output_ids: list[list[int]]
    ttft: list[float] = field(default_factory=list)   # seconds, wall clock
    itl: list[float] = field(default_factory=list)
    prompt_tokens_computed: int | None = None

    @property
    def output_tokens(self) -> int:
        return sum(len(o) for o in self.output_ids)


def make_workloads(vocab_lo: int = 100, vocab_hi: int = 40_000, seed: int = 0, scale: float = 1.0) -> list[Workload]:
    """Deterministic token-id prompts (ordinary vocabulary ids, no special tokens)."""
    rng = random.Random(seed)

    def toks(n: int) -> list[int]:
        return [rng.randrange(vocab_lo, vocab_hi) for _ in range(n)]

    n = max(2, int(32 * scale))
    offline = Workload("offline", [toks(rng.randint(20, 400)) for _ in range(n)],
                       [max(4, int(rng.randint(64, 128) * scale)) for _ in range(n)])
    stream = Workload("stream", [toks(32)], [max(8, int(128 * scale))])
    system = toks(300)
    shared = Workload("shared", [system + toks(rng.randint(8, 24)) for _ in range(n)],
                      [max(4, int(32 * scale))] * n)
    return [offline, stream, shared]


# -- the two sides ------------------------------------------------------------------------
def run_engine(llm: LLM, wl: Workload, session=None) -> RunResult:
    """One run of the workload from an empty prefix cache (repetitions must not hit each other)."""
    eng = llm.engine
    eng.kv.pool.reset_prefix_cache()
    ids = []
    for p, m in zip(wl.prompts, wl.max_tokens):
        sp = SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True)
        ids.append(session.add_request(p, sp) if session is not None else eng.add_request(p, sp))
    computed_before = eng.num_computed_prompt_tokens
    t0 = time.perf_counter()
    if session is not None:
        session.run_until_idle()
    else:
        while eng.has_unfinished_requests():
            eng.step()
    seconds = time.perf_counter() - t0
    reqs = [eng.requests[i] for i in ids]
    ttft = [r.metrics.wall.first_token_time - t0_wall(r) for r in reqs]
    itl = [x for r in reqs for x in r.metrics.wall.derived()["inter_token_latency"]]
    return RunResult(seconds, [list(r.output_token_ids) for r in reqs], ttft, itl,
                     eng.num_computed_prompt_tokens - computed_before)


def _on_off(why_off: str | None) -> str:
    return "on" if why_off is None else f"off ({why_off})"


def t0_wall(req) -> float:
    return req.metrics.wall.arrival_time


def run_hf(model, wl: Workload, pad_id: int) -> RunResult:
    """transformers' batched greedy generate (left padding); one max_new_tokens per batch, so
    only the tokens each prompt asked for are counted (as vLLM's HF benchmark does)."""
    from transformers import GenerationConfig

    n = len(wl.prompts)
    width = max(len(p) for p in wl.prompts)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for i, p in enumerate(wl.prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    # ignore_eos on the HF side: a None in the passed config is filled from the model's own
    # generation_config, so the model's eos has to be cleared there.
    model.generation_config.eos_token_id = None
    gen = GenerationConfig(do_sample=False, max_new_tokens=max(wl.max_tokens), eos_token_id=None,
                           pad_token_id=pad_id)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=mask, generation_config=gen)
    seconds = time.perf_counter() - t0
    outputs = [out[i, width:width + m].tolist() for i, m in enumerate(wl.max_tokens)]
    return RunResult(seconds, outputs)


def hf_first_token_seconds(model, wl: Workload, pad_id: int) -> float:
    one = Workload(wl.name, wl.prompts, [1] * len(wl.prompts))
    return run_hf(model, one, pad_id).seconds


# -- reporting -----------------------------------------------------------------------------
def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def spread(xs: list[float]) -> str:
    return f"{min(xs):.3g}-{max(xs):.3g}" if xs else "-"


def matching(a: list[list[int]], b: list[list[int]]) -> str:
    same = sum(x == y for x, y in zip(a, b))
    return f"{same}/{len(a)}"


def bench(reps: int = 3, scale: float = 1.0, dtype: str = "float32", model: str | None = None,
          observation: bool = True, vllm: bool = True, vllm_eager: bool = False, out=print) -> dict:
    """Run every workload `reps` times, alternating engine, HF and vLLM; print and return the table."""
    from transformers import AutoModelForCausalLM

    from .bandwidth import read_bandwidth_gb_s, read_buffer, stream_steps_against_reads
    from .linears import kernel_variants_line

    # The KV pool holds the whole workload at once (HF's cache grows as it needs); the
    # default 256 MiB pool is sized for watching blocks in the explorer, not for throughput.
    t0 = time.perf_counter()
    llm = LLM(model=model, dtype=dtype, record_steps=True, kv_cache_memory_bytes=BENCH_KV_BYTES)
    load_s = time.perf_counter() - t0
    folder = llm.engine.config.model
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype)).eval()
    pad_id = llm.tokenizer.pad_token_id if llm.tokenizer.pad_token_id is not None else 0
    # CPU figures compare across machines only with the CPU named: its vector extensions
    # (AVX2 / AVX-512 / AVX512_BF16 / AMX) and the kernels torch picked for them.
    info = llm.engine.model_info
    out(f"CPU {cpu_summary()}; torch CPU kernels: {torch.backends.cpu.get_cpu_capability()}")
    # A bf16 CPU engine: bf16 values in and out of every linear, sums and activations in fp32.
    arithmetic = (f"activations in {info['compute_dtype']}, linears rounding to {dtype}"
                  if info["compute_dtype"] != dtype else f"arithmetic in {dtype}")
    out(f"model {info['name']} ({dtype}; {arithmetic}), torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, {reps} repetitions, scale {scale}; engine: "
        f"KV pool {BENCH_KV_BYTES / 2**30:.0f} GiB ({llm.engine.runner.num_blocks} blocks), loaded in {load_s:.1f} s, "
        f"attention backend {info['attention_backend']}, {kernel_variants_line()}, "
        f"native decode {_on_off(info['native_decode_off'])}, prefill linears in oneDNN {info['cpu_gemm_dtype']}")
    # One stream reads every weight once per token: weight bytes / read bandwidth is its floor.
    weight_bytes = hf.num_parameters() * getattr(torch, dtype).itemsize
    bandwidth = read_bandwidth_gb_s()
    floor_ms = weight_bytes / (bandwidth * 1e9) * 1e3
    out(f"memory read bandwidth {bandwidth:.1f} GB/s ({torch.get_num_threads()} threads, the best of 7 reads now); "
        f"weights {weight_bytes / 1e6:.0f} MB -> one-stream floor {floor_ms:.1f} ms/token at that bandwidth "
        f"(the stream is measured against reads of its weights' bytes step by step)")
    side = _start_vllm(folder, dtype, vllm_eager, out) if vllm else None
    results: dict = {"bandwidth_gb_s": bandwidth, "stream_floor_ms": floor_ms}
    try:
        for wl in make_workloads(scale=scale):
            eng_runs, hf_runs, hf_first, vllm_runs, floor_runs = [], [], [], [], []
            # The one stream's floor: its weights' bytes, on their pages, filled once for every repetition.
            weights_sized = read_buffer(weight_bytes) if wl.name == "stream" else None
            for _ in range(reps):
                eng_runs.append(run_engine(llm, wl))
                hf_runs.append(run_hf(hf, wl, pad_id))
                if wl.name == "stream":
                    hf_first.append(hf_first_token_seconds(hf, wl, pad_id))
                    floor_runs.append(stream_steps_against_reads(llm, wl.prompts[0], wl.max_tokens[0], weights_sized))
                if side is not None:
                    vllm_runs.append(RunResult(*side.run(wl.prompts, wl.max_tokens)))
            row = summarize(wl, eng_runs, hf_runs, hf_first, vllm_runs)
            if wl.name == "stream":
                row.update(stream_share_of_floor(floor_runs))
            results[wl.name] = row
            out(format_row(row))
    finally:
        if side is not None:
            side.close()
    if observation:
        results["observation"] = observation_overhead(model, dtype, reps, scale, out)
    return results


def _start_vllm(folder: str, dtype: str, eager: bool, out):
    """vLLM's CPU build in its own process, or None (with the reason printed) where it is absent."""
    from explorer.drivers.vllm.config import VllmUnavailable

    from .vllm_side import VllmBenchSide

    try:
        side = VllmBenchSide(str(folder), dtype, kv_gib=round(BENCH_KV_BYTES / 2**30), eager=eager)
    except VllmUnavailable as exc:
        out(f"vLLM baseline skipped: {exc}")
        return None
    out(f"vLLM {side.version} CPU build: defaults{' + enforce_eager' if eager else ' (torch.compile)'}, "
        f"prefix caching on, KV {BENCH_KV_BYTES / 2**30:.0f} GiB, loaded in {side.load_s:.0f} s "
        f"in its own process")
    return side


def summarize(wl: Workload, eng_runs: list[RunResult], hf_runs: list[RunResult], hf_first: list[float],
              vllm_runs: list[RunResult] = ()) -> dict:
    eng_tps = [r.output_tokens / r.seconds for r in eng_runs]
    hf_tps = [r.output_tokens / r.seconds for r in hf_runs]
    row = {"workload": wl.name, "requests": len(wl.prompts),
           "engine_tok_s": med(eng_tps), "hf_tok_s": med(hf_tps), "engine_tok_s_spread": spread(eng_tps),
           "hf_tok_s_spread": spread(hf_tps),
           "engine_req_s": med([len(wl.prompts) / r.seconds for r in eng_runs]),
           "hf_req_s": med([len(wl.prompts) / r.seconds for r in hf_runs]),
           "ratio": med(eng_tps) / med(hf_tps),
           "engine_ttft_ms": 1e3 * med([statistics.fmean(r.ttft) for r in eng_runs]),
           "engine_itl_ms": 1e3 * med([statistics.fmean(r.itl) for r in eng_runs if r.itl]),
           "same_tokens": matching(eng_runs[0].output_ids, hf_runs[0].output_ids),
           "prompt_tokens": sum(len(p) for p in wl.prompts),
           "prompt_tokens_computed": eng_runs[-1].prompt_tokens_computed}
    if vllm_runs:
        vllm_tps = [r.output_tokens / r.seconds for r in vllm_runs]
        row.update(vllm_tok_s=med(vllm_tps), vllm_tok_s_spread=spread(vllm_tps),
                   vllm_ratio=med(eng_tps) / med(vllm_tps),
                   same_tokens_vllm=matching(eng_runs[0].output_ids, vllm_runs[0].output_ids))
        if wl.name == "stream":  # one request: its seconds / tokens is vLLM's per-token time (TTFT included)
            row["vllm_ms_per_token"] = 1e3 * med([r.seconds / r.output_tokens for r in vllm_runs])
    if hf_first:
        # HF per-token latency: (whole generate - the first token's generate) / remaining tokens.
        n = wl.max_tokens[0]
        hf_itl = [(r.seconds - f) / (n - 1) for r, f in zip(hf_runs, hf_first)]
        row["hf_itl_ms"] = 1e3 * med(hf_itl)
        row["itl_ratio"] = row["engine_itl_ms"] / row["hf_itl_ms"]
    return row


def stream_share_of_floor(floor_runs: list[dict]) -> dict:
    """The one stream's share of its bandwidth floor: per repetition the median over its decode
    steps of (a read of the weights' bytes right after the step) / (the step); the median of
    the repetitions."""
    return {"share_of_floor": med([r["share"] for r in floor_runs]),
            "share_of_floor_per_rep": [r["share"] for r in floor_runs],
            "floor_step_ms": med([r["step_ms"] for r in floor_runs]),
            "floor_read_ms": med([r["read_ms"] for r in floor_runs]),
            "best_read_over_mean_step": med([r["best_read_over_mean_step"] for r in floor_runs])}


def format_row(r: dict) -> str:
    s = (f"{r['workload']:>8}: engine {r['engine_tok_s']:7.1f} tok/s ({r['engine_tok_s_spread']})  "
         f"HF {r['hf_tok_s']:7.1f} tok/s ({r['hf_tok_s_spread']})  ratio engine/HF {r['ratio']:.2f}x  "
         f"req/s {r['engine_req_s']:.2f} vs {r['hf_req_s']:.2f}  TTFT {r['engine_ttft_ms']:.0f} ms  "
         f"ITL {r['engine_itl_ms']:.1f} ms  same tokens {r['same_tokens']}")
    if "hf_itl_ms" in r:
        s += f"  HF per-token {r['hf_itl_ms']:.1f} ms (engine/HF {r['itl_ratio']:.2f}x)"
    if "vllm_tok_s" in r:
        s += (f"\n{'':>10}vLLM {r['vllm_tok_s']:7.1f} tok/s ({r['vllm_tok_s_spread']})  ratio engine/vLLM "
              f"{r['vllm_ratio']:.2f}x  same tokens {r['same_tokens_vllm']}")
        if "vllm_ms_per_token" in r:
            s += f"  vLLM {r['vllm_ms_per_token']:.1f} ms/token"
    if "share_of_floor" in r:
        per_rep = ", ".join(f"{100 * x:.0f}%" for x in r["share_of_floor_per_rep"])
        s += (f"\n{'':>10}one stream at {100 * r['share_of_floor']:.0f}% of the bandwidth floor (each decode step "
              f"against a read of the weights' bytes right after it, the faster of two readers; per repetition "
              f"{per_rep}; medians: step {r['floor_step_ms']:.1f} ms, read {r['floor_read_ms']:.1f} ms; the run's "
              f"best read against its mean step: {100 * r['best_read_over_mean_step']:.0f}%)")
    if r["workload"] == "shared":
        s += f"  prompt tokens computed {r['prompt_tokens_computed']}/{r['prompt_tokens']}"
    return s


def observation_overhead(model: str | None, dtype: str, reps: int, scale: float, out=print) -> dict:
    """The offline workload with StepRecords off, on, and inside an explorer Session."""
    from explorer.core.session import Session

    wl = make_workloads(scale=scale * 0.5)[0]
    lean = LLM(model=model, dtype=dtype, record_steps=False, kv_cache_memory_bytes=BENCH_KV_BYTES)
    full = LLM(model=model, dtype=dtype, record_steps=True, kv_cache_memory_bytes=BENCH_KV_BYTES)
    warm = Workload("warm-up", wl.prompts[:2], [4, 4])
    run_engine(lean, warm), run_engine(full, warm)  # first-run allocations are not observation
    times: dict[str, list[float]] = {"records_off": [], "records_on": [], "session_history": []}
    sides = {"records_off": lambda: run_engine(lean, wl).seconds,
             "records_on": lambda: run_engine(full, wl).seconds,
             "session_history": lambda: run_engine(full, wl, session=Session(full)).seconds}
    order = list(sides)
    for rep in range(reps):
        for name in order[rep % 3:] + order[:rep % 3]:  # rotate who goes first: drift hits all sides
            times[name].append(sides[name]())
    base = med(times["records_off"])
    row = {k: med(v) for k, v in times.items()}
    row["records_overhead"] = row["records_on"] / base - 1
    row["history_overhead"] = row["session_history"] / base - 1
    out(f"observation: records off {base:.2f} s, on {row['records_on']:.2f} s "
        f"({100 * row['records_overhead']:+.1f}%), Session with history {row['session_history']:.2f} s "
        f"({100 * row['history_overhead']:+.1f}%)")
    return row
