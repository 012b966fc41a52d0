"""A brute-force check of the why-ledger against the raw history, sharing none of its code.

For each request's first admission, every missed token's class is derived again from what the
other requests had computed before its lookup (every scheduled chunk of every earlier step, and
of this step those the scheduler served before it: running requests, then earlier admissions):
- a token in a full block whose whole prefix another request of the same domain had computed:
  that block was cached (every computed full block is), so it was evicted since: 'evicted';
- the same for a request of another domain only: 'other_domain';
- else, a token inside the longest prefix a same-domain request had computed: 'below_block';
- else 'never_seen'.
Each named eviction is checked in the records: the block was evicted in that step, held that
hash before it, and the named request holds it after (or the step's batch gives it to it).
`pool_problems` checks the same classes a second way, from the pool alone (which hashes it held
before each lookup), so the two rules do not simply restate the ledger's.
"""
from __future__ import annotations


def _tokens(history) -> tuple[dict, dict]:
    seqs, domains = {}, {}
    for e in history:
        q = e.snapshot["queues"]
        for r in (*q["running"], *q["waiting"], *q["finished"]):
            t = list(r["prompt_token_ids"]) + list(r["output_token_ids"])
            if len(t) > len(seqs.get(r["request_id"], ())):
                seqs[r["request_id"]] = t
            domains[r["request_id"]] = (r.get("cache_salt"), r.get("lora_name"))
    return seqs, domains


def _common(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def expected_classes(history, block_size: int) -> dict[str, list[str]]:
    """Request id -> the class of each prompt token at its first admission."""
    seqs, domains = _tokens(history)
    log = []   # (step, rank, request, computed up to)
    admitted = {}
    for e in history:
        rec = e.record
        if rec is None:
            continue
        rank = {rid: i + 1 for i, rid in enumerate(rec["new_requests"])}
        for x in rec["scheduled"]:
            rid = x["request_id"]
            log.append((e.step, rank.get(rid, 0), rid, x["num_computed_before"] + x["num_tokens"]))
            if rid in rank and rid not in admitted:
                admitted[rid] = (e.step, rank[rid], x["num_computed_before"])
    out = {}
    bs = block_size
    for rid, (step, rank, hit) in admitted.items():
        prompt = seqs[rid][:len(_prompt(history, rid))]
        n = len(prompt)
        done: dict[str, int] = {}
        for s, k, other, upto in log:
            if (s, k) < (step, rank) and other != rid:
                done[other] = max(done.get(other, 0), upto)
        same = {o: seqs[o][:u] for o, u in done.items() if domains[o] == domains[rid]}
        apart = {o: seqs[o][:u] for o, u in done.items() if domains[o] != domains[rid]}
        shared = max((_common(prompt, t) for t in same.values()), default=0)
        classes = []
        for p in range(n):
            j = p // bs
            full = j < (n - 1) // bs   # a block the lookup may hit (vLLM leaves the last token's block out)
            want = prompt[:(j + 1) * bs]
            if p < hit:
                classes.append("hit")
            elif full and any(len(t) >= (j + 1) * bs and t[:(j + 1) * bs] == want for t in same.values()):
                classes.append("evicted")
            elif full and any(len(t) >= (j + 1) * bs and t[:(j + 1) * bs] == want for t in apart.values()):
                classes.append("other_domain")
            elif p < shared:
                classes.append("below_block")
            else:
                classes.append("never_seen")
        out[rid] = classes
    return out


def _prompt(history, rid):
    for e in history:
        q = e.snapshot["queues"]
        for r in (*q["running"], *q["waiting"], *q["finished"]):
            if r["request_id"] == rid:
                return r["prompt_token_ids"]
    raise KeyError(rid)


def ledger_classes(ledger) -> dict[str, list[str]]:
    out = {}
    for rid, why in ledger.requests.items():
        a = why.first
        if a is None:
            continue
        classes = []
        for s in a.spans:
            classes += [s.cls] * (s.end - s.start)
        out[rid] = classes
    return out


def check(ledger, history) -> list[str]:
    """Every disagreement, in words (empty: the ledger agrees with the brute force)."""
    problems = []
    bs = ledger.block_size
    want, got = expected_classes(history, bs), ledger_classes(ledger)
    if set(want) != set(got):
        problems.append(f"admitted requests differ: oracle {sorted(want)}, ledger {sorted(got)}")
    for rid in sorted(set(want) & set(got), key=lambda r: (len(r), r)):
        if want[rid] != got[rid]:
            p = next(i for i, (a, b) in enumerate(zip(want[rid], got[rid])) if a != b) \
                if len(want[rid]) == len(got[rid]) else min(len(want[rid]), len(got[rid]))
            problems.append(f"request {rid}, token {p}: oracle {want[rid][p] if p < len(want[rid]) else None}, "
                            f"ledger {got[rid][p] if p < len(got[rid]) else None}")
    by_step = {e.step: e for e in history}
    for rid, why in ledger.requests.items():
        for a in why.admissions:
            for ev in a.evictions:
                e, before = by_step[ev.step], by_step.get(ev.step - 1)
                if ev.block not in e.record["blocks"]["evicted"]:
                    problems.append(f"request {rid}: block {ev.block} was not evicted at step {ev.step}")
                if before is not None and before.snapshot["block_pool"]["blocks"][ev.block]["hash"] != ev.hash:
                    problems.append(f"request {rid}: block {ev.block} did not hold {ev.hash} before step {ev.step}")
                holders = {r["request_id"] for r in e.snapshot["queues"]["running"] if ev.block in r["block_table"]}
                rows = e.record["batch"]["block_tables"]
                if len(rows) == len(e.record["scheduled"]):
                    holders |= {x["request_id"] for x, t in zip(e.record["scheduled"], rows) if ev.block in t}
                if ev.by not in holders:
                    problems.append(f"request {rid}: block {ev.block} evicted at step {ev.step} is not held by "
                                    f"#{ev.by} after it (held by {sorted(holders)})")
    return problems


def pool_problems(ledger, history, hash_block) -> list[str]:
    """Each first admission's 'evicted' and 'never seen' blocks against the pool itself, read at
    each lookup (no use of who computed what): a block called evicted had its hash in the pool
    in some entry before the lookup, and the chain of its prefix was broken then (a block of it
    not cached before the step, or evicted in it); a block called never seen had its hash in no
    pool before the lookup. `hash_block(parent, tokens)` is the engine's block hash (hex: 16
    digits), for the full blocks the lookup covers (vLLM leaves the last token's block out)."""
    problems = []
    firsts: dict[int, list] = {}
    for rid, why in ledger.requests.items():
        if why.first is not None:
            firsts.setdefault(why.first.step, []).append((rid, why.first))
    ever: set[str] = set()
    before = None
    bs = ledger.block_size
    for e in history:
        if before is not None and e.record is not None:
            pool = before.snapshot["block_pool"]["blocks"]
            cached = {b["hash"] for b in pool if b["hash"] is not None}
            evicted_now = {pool[b]["hash"] for b in e.record["blocks"]["evicted"]}
            for rid, a in firsts.get(e.step, ()):
                prompt = list(_prompt(history, rid))
                hashes, parent = [], None
                for j in range((len(prompt) - 1) // bs):
                    parent = hash_block(parent, prompt[j * bs:(j + 1) * bs])
                    hashes.append(f"{parent:016x}")
                for s in a.spans:
                    for j in range(s.start // bs, min(len(hashes), (s.end - 1) // bs + 1)):
                        if s.cls == "evicted":
                            if hashes[j] not in ever:
                                problems.append(f"request {rid}, block {j}: called evicted at step {e.step}, but its "
                                                "hash was in no pool before")
                            elif all(h in cached and h not in evicted_now for h in hashes[:j + 1]):
                                problems.append(f"request {rid}, block {j}: called evicted at step {e.step}, but its "
                                                "whole prefix was cached at the lookup")
                        elif s.cls == "never_seen" and hashes[j] in ever:
                            problems.append(f"request {rid}, block {j}: called never seen at step {e.step}, but its "
                                            "hash was in the pool before")
        ever.update(b["hash"] for b in e.snapshot["block_pool"]["blocks"] if b["hash"] is not None)
        before = e
    return problems
