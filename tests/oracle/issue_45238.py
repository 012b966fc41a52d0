"""vLLM issue 45238 on a scheduler, without weights: with a Mamba group in align mode (and vLLM's
default prefix_cache_retention_interval 0), a request caches its Mamba state only at its prompt's
last block boundary. A sibling sharing the prompt's prefix resumes from that state only if it lies
inside the shared tokens; 100 tokens less of shared prefix put it among the first request's own
tokens, and the sibling's hit drops to 0 though full attention has most of its blocks cached.

Block size 16, a first request of shared prefix + 5 tokens of its own, a sibling of the shared
prefix + its own tokens up to 1024 (64 blocks):
- prefix 832 tokens: the first request's last boundary is (837 - 1) // 16 * 16 = 832, the prefix's
  end: the sibling hits all 52 blocks of the prefix;
- prefix 732 tokens: the boundary is (737 - 1) // 16 * 16 = 736, 4 tokens past the prefix: no state
  the sibling shares, so it hits 0 blocks (full attention alone: 732 // 16 = 45).

    python -m tests.oracle.issue_45238 --engine vllm|kvscope   # prints the hits as JSON
"""
from __future__ import annotations

import argparse
import json

from .workloads import OracleRequest, Workload

BLOCK_SIZE = 16
SIBLING_TOKENS = 1024  # 64 blocks
OWN_TOKENS = 5  # the first request's tokens after the shared prefix


def workload(shared_prefix_tokens: int) -> Workload:
    """The first request runs alone; the sibling arrives once it has finished."""
    shared = tuple(1 + i % 97 for i in range(shared_prefix_tokens))
    first = shared + (101,) * OWN_TOKENS
    sibling = shared + (103,) * (SIBLING_TOKENS - shared_prefix_tokens)
    return Workload(block_size=BLOCK_SIZE, num_blocks=200, max_num_batched_tokens=2048, max_num_seqs=4,
                    max_model_len=SIBLING_TOKENS + 16, enable_prefix_caching=True, enable_chunked_prefill=True,
                    scheduler_reserve_full_isl=True, mamba_align=True, prefix_cache_retention_interval=0,
                    requests=(OracleRequest("first", first, 1, 0), OracleRequest("sibling", sibling, 1, 3)))


def sibling_hit(engine: str, shared_prefix_tokens: int) -> dict:
    """The blocks the sibling hits on admission, out of its prompt's, on one engine's scheduler."""
    w = workload(shared_prefix_tokens)
    if engine == "vllm":
        from .vllm_side import VllmScheduler
        side: object = VllmScheduler(w)
    else:
        from .kvscope_side import KvscopeScheduler
        side = KvscopeScheduler(w)
    for step in range(1, 20):
        for r in w.requests:
            if r.arrival_step == step - 1:
                side.add(r)  # type: ignore[attr-defined]
        record = side.step()  # type: ignore[attr-defined]
        if "sibling" in record["scheduled"]:
            return {"hit_blocks": record["computed_before"]["sibling"] // BLOCK_SIZE,
                    "prompt_blocks": SIBLING_TOKENS // BLOCK_SIZE,
                    "first_chunk": record["scheduled"]["sibling"]}
    raise RuntimeError("the sibling was never admitted")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", choices=("vllm", "kvscope"), required=True)
    args = ap.parse_args(argv)
    print(json.dumps({n: sibling_hit(args.engine, n) for n in (832, 732)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
