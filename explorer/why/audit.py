"""vLLM's own prefix-cache counters against the recorder's truth, over the same interval.

A server's `/metrics` has `vllm:prefix_cache_queries` and `vllm:prefix_cache_hits` (tokens).
vLLM 0.32 counts a lookup when it admits a request: queries += the request's tokens, hits += the
tokens found; a re-admission after a preemption goes to its separate preempted counters instead,
which /metrics do not export. kvscope's own snapshot counters (`metrics.prefix_cache_*`, both
engines) count every admission, re-admissions included. And vLLM counts every queried token,
while only whole blocks can hit, never the block of the last prompt token: a ceiling below 100%.

    before = read_metrics(server.http)
    ...  # traffic, followed by a Session attached before it
    after = read_metrics(server.http)
    print(audit(ledger, before, after, session.history).text())
"""
from __future__ import annotations

import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypedDict

from ..core.history import HistoryEntry
from .ledger import WhyLedger

QUERIES, HITS = "vllm:prefix_cache_queries", "vllm:prefix_cache_hits"


class CountsDict(TypedDict):
    """Prefix-cache lookups over an interval: tokens queried, tokens hit."""
    queries: int
    hits: int


class CounterAuditDict(TypedDict):
    """`CounterAudit.to_dict()`."""
    server: CountsDict
    first: CountsDict
    readmitted: CountsDict
    recorder: CountsDict | None
    hittable: int
    agrees: bool
    findings: list[str]


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text: each sample's value summed over its labels, by metric name (a counter's
    `_total` suffix dropped; `_created` samples left out)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name.endswith("_created"):
            continue
        try:
            value = float(line.rsplit(" ", 1)[1])
        except (IndexError, ValueError):
            continue
        name = name[:-len("_total")] if name.endswith("_total") else name
        out[name] = out.get(name, 0.0) + value
    return out


def read_metrics(http: str, timeout: float = 10.0) -> dict[str, float]:
    """A vLLM server's /metrics (its OpenAI base URL without /v1), parsed."""
    with urllib.request.urlopen(f"{http.rstrip('/')}/metrics", timeout=timeout) as r:
        return parse_metrics(r.read().decode())


@dataclass
class CounterAudit:
    """vLLM's /metrics prefix-cache counters against the recorder's truth over one interval, and
    each difference named (findings)."""

    server: CountsDict                # /metrics over the interval: queries, hits
    first: CountsDict                 # the recorder's first admissions: prompt tokens, hits
    readmitted: CountsDict            # re-admissions after preemptions: tokens looked up, hits
    recorder: CountsDict | None       # kvscope's snapshot counters over the interval
    hittable: int                     # first admissions' tokens in blocks a lookup may hit
    agrees: bool
    findings: list[str] = field(default_factory=list)

    def text(self) -> str:
        return "\n".join(self.findings)

    def to_dict(self) -> CounterAuditDict:
        return {"server": self.server, "first": self.first, "readmitted": self.readmitted, "recorder": self.recorder,
                "hittable": self.hittable, "agrees": self.agrees, "findings": self.findings}


def audit(ledger: WhyLedger, before: dict[str, float], after: dict[str, float],
          history: Sequence[HistoryEntry] | None = None) -> CounterAudit:
    """Compare /metrics read `before` and `after` some traffic with what the ledger (fed the same
    interval's history) says; `history` adds kvscope's own snapshot counters to the comparison."""
    server: CountsDict = {"queries": int(after.get(QUERIES, 0) - before.get(QUERIES, 0)),
              "hits": int(after.get(HITS, 0) - before.get(HITS, 0))}
    first: CountsDict = {"queries": 0, "hits": 0}
    again: CountsDict = {"queries": 0, "hits": 0}
    hittable = 0
    bs = ledger.block_size or 1
    for request in ledger.requests.values():
        for a in request.admissions:
            into = again if a.resumed else first
            into["queries"] += a.tokens
            into["hits"] += a.hit
            if not a.resumed:
                hittable += (a.tokens - 1) // bs * bs
    recorder: CountsDict | None = None
    if history:
        m0, m1 = history[0].snapshot.get("metrics") or {}, history[-1].snapshot.get("metrics") or {}
        recorder = {"queries": int(m1.get("prefix_cache_queries", 0) - m0.get("prefix_cache_queries", 0)),
                    "hits": int(m1.get("prefix_cache_hits", 0) - m0.get("prefix_cache_hits", 0))}
    agrees = server == first
    f: list[str] = []
    if agrees:
        f.append(f"vLLM's /metrics agree with the recorder: {server['queries']} prompt tokens queried, "
                 f"{server['hits']} hit, over the same requests' first admissions")
    else:
        d_q, d_h = server["queries"] - first["queries"], server["hits"] - first["hits"]
        if (d_q, d_h) == (again["queries"], again["hits"]) and any(again.values()):
            cause = "vLLM counted the re-admissions after preemptions as prefix-cache lookups"
        elif ledger.notes:
            cause = "the recorder's history misses part of the interval: " + "; ".join(ledger.notes)
        else:
            cause = "unexplained: no admission the recorder saw accounts for it"
        f.append(f"vLLM's /metrics differ from the recorder: {server['queries']} queried and {server['hits']} hit "
                 f"against {first['queries']} and {first['hits']} at first admissions ({d_q:+d} queried, {d_h:+d} "
                 f"hit): {cause}")
    if any(again.values()):
        f.append(f"preemption recompute: {ledger.summary().readmissions} re-admissions looked up {again['queries']} "
                 f"tokens again and found {again['hits']} still cached; vLLM's /metrics leave them out (its "
                 "preempted_queries and preempted_hits hold them), so they are not hits of the prefix cache there")
    if recorder is not None and recorder != server:
        f.append(f"kvscope's own counters (the snapshot's prefix_cache_*) count {recorder['queries']} queried and "
                 f"{recorder['hits']} hit: every admission, re-admissions included "
                 f"({recorder['queries'] - server['queries']:+d} and {recorder['hits'] - server['hits']:+d} against "
                 "/metrics)")
    if first["queries"]:
        never = first["queries"] - hittable
        f.append(f"tokens versus blocks: vLLM counts all {first['queries']} prompt tokens as queried, but only whole "
                 f"blocks of {bs} can hit and never the block of a prompt's last token: {never} of them could not hit "
                 f"at all, so the hit rate's ceiling here is {100 * hittable / first['queries']:.1f}% "
                 f"(measured {100 * first['hits'] / first['queries']:.1f}%)")
    return CounterAudit(server=server, first=first, readmitted=again, recorder=recorder, hittable=hittable,
                        agrees=agrees, findings=f)
