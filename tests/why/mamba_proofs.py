"""The why-ledger's Mamba causes, proven on random workloads: each of tests/oracle/workloads.py's
"full+mamba" workloads (prompts that resend, extend or cut earlier ones at any length, small pools
that evict and preempt, chunked prompts, each retention interval) runs through kvscope's core
with a full-attention and a Mamba group in align mode (core_replay, no model); the ledger reads
the run and `prove` replays it through vLLM 0.32's scheduler built with the same two groups.

Every workload must reproduce (vLLM makes each of the core's decisions again), every request's
classes must sum to its prompt, and every Mamba state the ledger names as the closest must be
resumed from when the request's prompt shares its tokens (unless, sharing more, it is admitted at
another step, which the proof says and the counts show). A token classed as without a Mamba
checkpoint is proven where it misses at the recorded settings and in a pool that evicts nothing,
and hits with one KV cache group; where the larger pool hits it too (the recorded pool's pressure
kept a state from being cached: a request preempted before its chunk ended there), it stays
unproven, counted and printed, not a difference (tests/why/test_mamba.py holds its seeds to 0).
Workloads whose pool vLLM refuses to start with are skipped and counted.

    python -m tests.why.mamba_proofs [--workloads 30] [--seed 0] [--plant NAME]

`--plant evicted-states-ignored` classes a cut behind an evicted Mamba state as without a
checkpoint (as if no state had been cached): the proof must leave such tokens unproven (a pool
that evicts nothing keeps the state), and the first seed where it does is printed. The last line
is JSON counts; exit status 1 on a difference.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field

from explorer.core.recording import RecordedRequest, Recording, Settings, Source
from explorer.whatif.core_replay import core_replay
from explorer.whatif.settings import SettingRejected
from explorer.why import WhyLedger
from explorer.why.proof import prove, recording_of
from tests.oracle.outcome import print_outcome
from tests.oracle.workloads import Workload, random_workload

CLS = "no_mamba_checkpoint"
PLANTS = ("evicted-states-ignored",)


@dataclass
class Counts:
    workloads: int = 0
    refused: int = 0           # vLLM refuses the workload's pool (a request longer than it)
    requests: int = 0
    cut_tokens: int = 0        # classed as without a Mamba checkpoint
    evicted_state_tokens: int = 0   # cut behind a Mamba state that was evicted
    proven: int = 0
    unproven: int = 0          # a pool that evicts nothing hits them too: the pool kept the state from being cached
    named: int = 0             # requests whose closest cached state was named ...
    named_resumed: int = 0     # ... and resumed from in the replay
    named_moved: int = 0       # ... or admitted at another step there (sharing more, it needed fewer blocks)
    differences: int = 0
    failures: list[str] = field(default_factory=list)

    def fail(self, text: str) -> None:
        self.differences += 1
        self.failures.append(text)

    def summary(self) -> dict:
        return {k: v for k, v in vars(self).items() if k != "failures"}


def recording(w: Workload) -> Recording:
    """The workload as a recording of a full-attention and a Mamba group, each request given the
    workload's output tokens and its arrival step (tests/oracle's step before it is its arrival)."""
    s = Settings(block_size=w.block_size, num_blocks=w.num_blocks, max_num_batched_tokens=w.max_num_batched_tokens,
                 max_num_seqs=w.max_num_seqs, max_model_len=w.max_model_len,
                 enable_prefix_caching=w.enable_prefix_caching, enable_chunked_prefill=w.enable_chunked_prefill,
                 scheduler_reserve_full_isl=w.scheduler_reserve_full_isl,
                 prefix_cache_retention_interval=w.prefix_cache_retention_interval, kv_cache_groups="full,mamba")
    ordered = sorted(w.requests, key=lambda r: r.arrival_step)
    requests = [RecordedRequest(r.request_id, list(r.prompt), [w.sampled_token(r.request_id, i)
                                                               for i in range(r.max_tokens)],
                                r.arrival_step + 1, float(r.arrival_step + 1), i, r.max_tokens, ignore_eos=True,
                                finish_reason="length") for i, r in enumerate(ordered)]
    return Recording(s, Source(engine="kvscope's core (tests/oracle workload)"), requests)


def check_workload(seed: int, total: Counts) -> None:
    run = core_replay(recording(random_workload(seed, "full+mamba")))
    ledger = WhyLedger().feed(run.entries)
    ledger.check()
    firsts = {rid: why.first for rid, why in ledger.requests.items() if why.first is not None}
    cut = sum(a.classes.get(CLS, 0) for a in firsts.values())
    try:
        report = prove(ledger, recording_of(run.entries))
    except SettingRejected:
        total.refused += 1
        return
    total.workloads += 1
    total.requests += len(firsts)
    total.cut_tokens += cut
    total.evicted_state_tokens += sum(sp.end - sp.start for a in firsts.values() for sp in a.spans
                                      if sp.cls == "evicted" and "its state after" in sp.detail)
    assert report.replays is not None
    if not report.replays.reproduces:
        total.fail(f"seed {seed}: vLLM's scheduler parts from kvscope's core at step {report.replays.first_difference}")
    total.proven += report.proven.get(CLS, 0)
    total.unproven += report.unproven.get(CLS, 0)
    for rid, a in firsts.items():
        proof = ledger.requests[rid].proofs.get(CLS)
        if proof is None:
            continue
        if proof["verdict"] != "proven":
            print(f"seed {seed}, request {rid}: {proof['tokens']} tokens without a Mamba checkpoint, "
                  f"{proof['verdict']}: {proof['says']}", file=sys.stderr)
        if a.checkpoint is not None:
            total.named += 1
            total.named_resumed += "it resumed from that state" in proof["says"]
            total.named_moved += "another pool" in proof["says"]
            if proof.get("resumed") is not None and "not the" in proof["says"]:
                total.fail(f"seed {seed}, request {rid}: the named state was not resumed from: {proof['says']}")


@contextlib.contextmanager
def planted(name: str | None) -> Iterator[None]:
    if name is None:
        yield
        return
    from explorer.why.mamba import MambaCheckpoints

    saved = MambaCheckpoints.evicted_within
    MambaCheckpoints.evicted_within = lambda self, *args: None   # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        MambaCheckpoints.evicted_within = saved   # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plant", choices=PLANTS)
    args = ap.parse_args(argv)
    total = Counts()
    with planted(args.plant):
        for seed in range(args.seed, args.seed + args.workloads):
            check_workload(seed, total)
            if args.plant and (total.differences or total.unproven):
                print(json.dumps({"plant": args.plant, "first_seed": seed}))
                return 0
    if args.plant:
        print(json.dumps({"plant": args.plant, "first_seed": None}))
        return 1
    return print_outcome(total, f"the why-ledger's Mamba causes on {args.workloads} workloads "
                                f"from seed {args.seed}, proven on vLLM 0.32's scheduler")


if __name__ == "__main__":
    sys.exit(main())
