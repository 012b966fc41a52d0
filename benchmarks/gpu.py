"""`python -m benchmarks.gpu`: the engine on an NVIDIA GPU with nano-vLLM's throughput
workload, eager against CUDA graphs, against transformers' generate, and against the GPU's
memory-bandwidth bound for decode.

Model: random weights in Qwen3-0.6B's shape, written here by transformers (no download),
loaded in bf16. Workload: 256 requests, input and output lengths uniform in 100-1024,
random token ids, ignore_eos. transformers' batched generate pads every prompt to the
longest and every output to the longest, so it runs a subset (--hf-requests) and the engine
runs the same subset too: that pair is the like-for-like ratio.

Decode is bound by memory: a decode step must read every weight once and each running
sequence's cached K/V. For each pure-decode step, (weight bytes + K/V bytes read) / step
time is the bandwidth it reached; its share of the GPU's peak is printed.

`--device cpu --shape tiny` runs the same code on a tiny model on a CPU: no figures worth
reading (no graphs there), but every line of the bench runs, which is how CI checks it
before a GPU machine is at hand.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

from engine import LLM, SamplingParams
from explorer.apps.machine import cpu_summary

PEAK_BANDWIDTH = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12}  # bytes/s, datasheet values


SHAPES = {  # write_tiny_qwen3 overrides
    "qwen3-0.6b": dict(hidden_size=1024, num_layers=28, num_heads=16, num_kv_heads=8, head_dim=128,
                       intermediate_size=3072, initializer_range=0.02),
    "tiny": {},
}


def random_checkpoint(folder: Path, shape: str) -> Path:
    """A random Qwen3 checkpoint of `shape` (written by transformers, as the tests' are)."""
    from .checkpoints import write_tiny_qwen3

    return write_tiny_qwen3(folder, **SHAPES[shape])


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def workload(n: int, lo: int, hi: int, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    rng = random.Random(seed)
    prompts = [[rng.randrange(100, 150_000) for _ in range(rng.randint(lo, hi))] for _ in range(n)]
    return prompts, [rng.randint(lo, hi) for _ in range(n)]


def run_engine(llm: LLM, prompts: list[list[int]], max_tokens: list[int]) -> dict:
    eng = llm.engine
    device = eng.runner.device.type
    runner = eng.runner
    weight_bytes = sum(p.numel() * p.element_size() for p in runner.model.parameters())
    kv_bytes_per_token = runner.bytes_per_block / runner.block_size
    ids = [eng.add_request(p, SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True))
           for p, m in zip(prompts, max_tokens)]
    decode_bw, buckets = [], {}
    _sync(device)
    t0 = time.perf_counter()
    while eng.has_unfinished_requests():
        rec = eng.step()
        t = rec.timings_ms
        if rec.scheduled and all(not s["is_prefill"] for s in rec.scheduled):
            context = sum(s["num_computed_before"] + 1 for s in rec.scheduled)
            decode_bw.append((weight_bytes + context * kv_bytes_per_token) / (t["forward"] / 1e3))
            buckets[t["forward_path"]] = buckets.get(t["forward_path"], 0) + 1
    _sync(device)
    seconds = time.perf_counter() - t0
    out_tokens = sum(len(eng.requests[i].output_token_ids) for i in ids)
    return {"seconds": seconds, "output_tokens": out_tokens, "tok_s": out_tokens / seconds,
            "decode_bandwidth": statistics.median(decode_bw) if decode_bw else 0.0, "decode_steps": buckets,
            "outputs": [list(eng.requests[i].output_token_ids) for i in ids]}


def run_hf(path: Path, prompts: list[list[int]], max_tokens: list[int], device: str) -> dict:
    from transformers import AutoModelForCausalLM, GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.bfloat16).to(device).eval()
    model.generation_config.eos_token_id = None  # ignore_eos
    width = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    gen = GenerationConfig(do_sample=False, max_new_tokens=max(max_tokens), eos_token_id=None, pad_token_id=0)
    _sync(device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        model.generate(ids.to(device), attention_mask=mask.to(device), generation_config=gen)
    _sync(device)
    seconds = time.perf_counter() - t0
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"seconds": seconds, "tok_s": sum(max_tokens) / seconds}


def engine_llm(path: Path, enforce_eager: bool, device: str) -> LLM:
    llm = LLM(model=str(path), device=device, dtype="bfloat16", enforce_eager=enforce_eager,
              max_num_batched_tokens=16384, max_num_seqs=256, gpu_memory_utilization=0.6, record_steps=False)
    # Warm-up: compile the Triton kernels for the prefill shapes before the clock starts.
    llm.generate([[1] * 300, [2] * 40], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    return llm


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--min-len", type=int, default=100)
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--hf-requests", type=int, default=32,
                    help="requests in the like-for-like run against transformers")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="cpu: a smoke run of the bench itself (with --shape tiny), not a measurement")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-0.6b")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("benchmarks.gpu needs a CUDA GPU (torch sees none); on a CPU use `python -m benchmarks bench`")
    name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    peak = next((v for k, v in PEAK_BANDWIDTH.items() if k in name), None)
    prompts, max_tokens = workload(args.requests, args.min_len, args.max_len)
    results: dict = {"gpu": name, "torch": torch.__version__, "requests": args.requests}
    with tempfile.TemporaryDirectory() as tmp:
        path = random_checkpoint(Path(tmp), args.shape)
        where = name if args.device == "cuda" else f"CPU {cpu_summary()}"   # the CPU's vector extensions
        print(f"{where}, torch {torch.__version__}; {args.shape}-shaped random Qwen3 weights, bf16; "
              f"{args.requests} requests, lengths {args.min_len}-{args.max_len}", flush=True)
        for label, eager in (("eager", True), ("cuda_graphs", False)):
            llm = engine_llm(path, eager, args.device)
            r = run_engine(llm, prompts, max_tokens)
            sub = run_engine(llm, prompts[:args.hf_requests], max_tokens[:args.hf_requests])
            results[label] = {k: v for k, v in r.items() if k != "outputs"} | {"subset_tok_s": sub["tok_s"]}
            share = f", {100 * r['decode_bandwidth'] / peak:.0f}% of {peak / 1e12:.1f} TB/s" if peak else ""
            print(f"engine {label:>11}: {r['tok_s']:8.0f} output tok/s "
                  f"({r['output_tokens']} tokens in {r['seconds']:.1f} s); decode steps {r['decode_steps']}; "
                  f"decode bandwidth {r['decode_bandwidth'] / 1e12:.2f} TB/s{share}",
                  flush=True)
            llm.shutdown()
            del llm
            if args.device == "cuda":
                torch.cuda.empty_cache()
        hf = run_hf(path, prompts[:args.hf_requests], max_tokens[:args.hf_requests], args.device)
        results["hf"] = hf
        ratio = results["cuda_graphs"]["subset_tok_s"] / hf["tok_s"]
        print(f"transformers generate on {args.hf_requests} requests: {hf['tok_s']:.0f} tok/s; engine (graphs) on the "
              f"same: {results['cuda_graphs']['subset_tok_s']:.0f} tok/s ({ratio:.1f}x)", flush=True)
        print(f"CUDA graphs / eager: {results['cuda_graphs']['tok_s'] / results['eager']['tok_s']:.2f}x", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
