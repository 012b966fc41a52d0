"""Why each prompt token hit or missed the prefix cache, why requests waited or were preempted,
and each cause proven by a replay through vLLM's own scheduler.

    from explorer.why import WhyLedger, prove
    ledger = WhyLedger().feed(session.history)         # kvscope's engine, vLLM in process, a live server
    ledger.requests["3"].first.classes                  # {'hit': 64, 'evicted': 32, 'below_block': 7}
    print(ledger.summary().text())                      # "62% of missed prompt tokens were evicted; ..."
    proofs = prove(ledger, recording)                   # each cause confirmed by a counterfactual replay

The layer sits between explorer.whatif (the replays) and explorer.ui (the why column, the request
panel, the prefix tree).
"""
from __future__ import annotations

from .ledger import WhyLedger
from .model import CLASS_KEYS, CLASSES, LABELS, Admission, Eviction, Node, PreemptionWhy, RequestWhy
from .summary import RunSummary

__all__ = [
           "CLASSES",
           "CLASS_KEYS",
           "LABELS",
           "Admission",
           "Eviction",
           "Node",
           "PreemptionWhy",
           "RequestWhy",
           "RunSummary",
           "WhyLedger",
]
