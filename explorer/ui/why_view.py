"""The why-view's panel states (widgets.why, widgets.prefix_tree) from a why-ledger
(explorer.why): pure functions of the ledger, the shown step's snapshot and the token speller,
plus `WhyView`, the ledger a SessionBinder keeps fed and the proofs it runs on request.

The prefix tree is the ledger's: one node per cached prefix, named by the engine's own block
hash (the 16 hex digits the pool shows), with its blocks at the shown step, the requests that
stored and hit it, its hits and evictions over the run, and whether it was evicted unused. A
live server's Session with vLLM's KV events says whether vLLM's own tree agrees with it.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Container, Iterable, Mapping
from typing import TYPE_CHECKING

from ..why import CLASSES, WhyLedger
from ..why.model import Node, RequestWhy
from .views import TokenText

if TYPE_CHECKING:   # names only: the proofs load when one runs, a live server's KV event reader where there is one
    from engine.report.schema import EngineSnapshotDict
    from widgets.prefix_tree import KvEventsAgreementDict, PrefixTreeDict, TreeNodeDict
    from widgets.queues import WhyRowDict
    from widgets.why import (
        ClassLookDict,
        WhyAdmissionDict,
        WhyDivergenceDict,
        WhyPreemptionDict,
        WhyRequestDict,
        WhySummaryDict,
    )

    from ..core.history import HistoryEntry
    from ..core.session_view import SessionView
    from ..drivers.vllm_live.kv_events import KvEventSubscriber
    from ..why.chains import Domain
    from ..why.proof import ProofReport

# A node costs ~0.7 KB of JSON per redraw, its lifeline most (bench-ui in docs/performance.md).
MAX_TREE_NODES = 150     # the panel draws at most this many nodes (the rest are counted)
LIFELINE_BINS = 60       # hits per node over the run, in this many bins
MAX_PROMPT_TOKENS = 2048  # a request's prompt drawn token by token up to this many tokens


CLASS_LOOKS: list[ClassLookDict] = [{"key": k, "label": label, "tip": tip} for k, label, tip in CLASSES]


def _ids(rids: Iterable[str], limit: int = 8) -> list[str]:
    out = list(dict.fromkeys(rids))
    return out[:limit]


def tree_state(ledger: WhyLedger, step: int, snapshot: EngineSnapshotDict, token_text: TokenText, *,
               max_nodes: int = MAX_TREE_NODES, bins: int = LIFELINE_BINS,
               kv_events: KvEventSubscriber | None = None) -> PrefixTreeDict:
    """The prefix tree at `step` (nodes cached by then; those evicted since, marked), each node's
    blocks at that step from `snapshot` (the shown entry's), its hits per bin of the run."""
    first = ledger.first_step if ledger.first_step is not None else step
    last = max(ledger.last_step if ledger.last_step is not None else step, step)
    span = max(1, last - first)
    holders: dict[str, list[int]] = {}
    owners: dict[str, list[str]] = {}
    for b in (snapshot.get("block_pool") or {}).get("blocks") or ():
        h = b.get("hash")
        if h is not None and not b.get("is_null"):
            holders.setdefault(h, []).append(b["block_id"])
            owners.setdefault(h, []).extend(b.get("owners") or ())
    shown = [n for n in ledger.nodes.values() if n.stored and n.stored[0] <= step]
    present = {n.key: n.present_at(step) for n in shown}
    # Present prefixes first, then the evicted ones, each oldest first; an ancestor comes along.
    shown.sort(key=lambda n: (not present[n.key], n.stored[0], n.depth))
    keep: dict[bytes, Node] = {}
    for n in shown:
        if len(keep) >= max_nodes:
            break
        chain = []
        x: Node | None = n
        while x is not None and x.key not in keep:
            chain.append(x)
            x = ledger.nodes.get(x.parent) if x.parent is not None else None
        for y in reversed(chain):
            if len(keep) < max_nodes and y.stored and y.stored[0] <= step:
                keep[y.key] = y
    rows: list[TreeNodeDict] = []
    ordered, holds = _depth_first(keep, ledger, present)
    for n in ordered:
        hits = [(s, rid) for s, rid in n.hits if s <= step]
        evictions = [e for e in n.evictions if e.step <= step]
        lifeline = [0] * bins
        for s, _ in hits:
            lifeline[min(bins - 1, max(0, (s - first) * bins // (span + 1)))] += 1
        last_evicted = evictions[-1].step if evictions else None
        unused = bool(evictions) and not any(s <= last_evicted for s, _ in hits) if last_evicted else False
        node_id = n.hash or n.key.hex()
        rows.append({
            "id": node_id, "parent": _parent_id(n, ledger, keep), "depth": n.depth, "num_tokens": len(n.tokens),
            "text": "".join(token_text(list(n.tokens)))[:64], "present": present.get(n.key, False),
            "blocks": holders.get(n.hash, []) if n.hash else [],
            "owners": _ids(owners.get(n.hash, []) if n.hash else []),
            "users": _ids([n.first_by, *(rid for _, rid in hits)]), "first_by": n.first_by,
            "hits": len(hits), "stored": [s for s in n.stored if s <= step],
            "evictions": [{"step": e.step, "by": e.by, "block": e.block, "age_steps": e.lru_age_steps,
                           "age_s": e.lru_age_s} for e in evictions],
            "unused": unused, "lifeline": lifeline,
            # Evicted, and nothing under it cached at the shown step: folded under the panel's toggle.
            "folded": not holds.get(n.key, False),
            "domain": _domain_words(n.domain),
        })
    out: PrefixTreeDict = {"step": step, "first_step": first, "last_step": last, "bins": bins, "nodes": rows,
                           "hidden": max(0, len(shown) - len(rows)), "num_present": sum(present.values()),
                           "num_evicted": sum(1 for n in shown if not present[n.key]),
                           "num_hits": sum(r["hits"] for r in rows), "block_size": ledger.block_size or 0,
                           "unmapped": ledger.unmapped, "notes": list(ledger.notes[-3:]), "kv_events": None}
    if kv_events is not None and step == ledger.last_step:
        out["kv_events"] = kv_events_agreement(kv_events, {r["id"] for r in rows if r["present"]},
                                               out["num_present"] - sum(1 for r in rows if r["present"]))
    return out


def kv_events_agreement(kv: KvEventSubscriber, present: set[str], not_drawn: int) -> KvEventsAgreementDict:
    """vLLM's own prefix tree (from its KV events) against the ledger's present nodes, by key."""
    with kv.lock:
        theirs = set(kv.tree.keys())
    ours_only = sorted(present - theirs)
    theirs_only = sorted(theirs - present)
    return {"blocks": len(theirs), "agree": not ours_only and (not theirs_only or not_drawn > 0),
            "only_here": ours_only[:5], "only_in_events": theirs_only[:5], "counters": dict(kv.counters)}


def _depth_first(keep: Mapping[bytes, Node], ledger: WhyLedger,
                 present: Mapping[bytes, bool]) -> tuple[list[Node], dict[bytes, bool]]:
    """The kept nodes in tree order, at every level the subtrees that hold a cached prefix at the
    shown step first (then the oldest first): the cache as it is leads, what it lost follows."""
    children: dict[bytes | None, list[Node]] = {}
    for n in keep.values():
        parent = n.parent if n.parent in keep else None
        children.setdefault(parent, []).append(n)
    cached = dict.fromkeys(keep, False)   # the node or a descendant is cached at the shown step
    for n in keep.values():
        x: Node | None = n if present.get(n.key) else None
        while x is not None and not cached[x.key]:
            cached[x.key] = True
            x = keep.get(x.parent) if x.parent is not None else None

    def order(nodes: list[Node]) -> list[Node]:   # reversed: the stack pops the first one first
        return sorted(nodes, key=lambda n: (not cached[n.key], n.stored[0]), reverse=True)

    out: list[Node] = []
    stack = order(children.get(None, []))
    while stack:
        n = stack.pop()
        out.append(n)
        stack.extend(order(children.get(n.key, [])))
    return out, cached


def _parent_id(n: Node, ledger: WhyLedger, keep: Container[bytes]) -> str | None:
    if n.parent is None or n.parent not in keep:
        return None
    p = ledger.nodes[n.parent]
    return p.hash or p.key.hex()


def _domain_words(domain: Domain) -> str:
    salt, lora = domain
    return " ".join(x for x in (f"salt {salt}" if salt else "", f"LoRA {lora}" if lora else "") if x)


# -- the selected request ---------------------------------------------------------------------------
def why_rows(ledger: WhyLedger, step: int | None = None) -> dict[str, WhyRowDict]:
    """The why column of the queue cards: request -> {text, cls} (the biggest miss class), for
    the requests admitted by `step` (all: None)."""
    out: dict[str, WhyRowDict] = {}
    for rid, why in ledger.requests.items():
        a = why.first
        cls = ""
        if a is not None and step is not None and a.step > step:
            continue
        if a is not None:
            misses = [(n, k) for k, n in a.classes.items() if k != "hit" and n]
            cls = max(misses)[1] if misses else "hit"
        out[rid] = {"text": why.why(), "cls": cls}
    return out


def latest_admitted(ledger: WhyLedger, step: int | None = None) -> str:
    """The request the why panel shows when none is chosen: the latest admitted by `step`."""
    admitted = [(w.admissions[0].step, n, rid) for n, (rid, w) in enumerate(ledger.requests.items())
                if w.admissions and (step is None or w.admissions[0].step <= step)]
    return max(admitted)[2] if admitted else ""


def change_steps(ledger: WhyLedger, rid: str | None = None) -> list[int]:
    """The steps at which the why panel's summary (or request `rid`'s state) changes: its
    admissions and preemptions."""
    whys = [ledger.requests[rid]] if rid is not None else list(ledger.requests.values())
    return sorted({a.step for w in whys for a in w.admissions} | {p.step for w in whys for p in w.preemptions})


def request_state(ledger: WhyLedger, rid: str, snapshot: EngineSnapshotDict, token_text: TokenText,
                  step: int | None = None) -> WhyRequestDict:
    """The why panel's request: its prompt token by token with each token's class, each
    admission's counts, where it leaves the longest shared prefix, evictions, preemptions, proofs;
    as it stood after `step` when given (a request not admitted by then is not known yet)."""
    why: RequestWhy | None = ledger.requests.get(rid)
    admitted = [a for a in why.admissions if step is None or a.step <= step] if why is not None else []
    if why is None or not admitted:
        return {"request_id": rid, "known": False}
    seq = ledger.seqs[rid]
    prompt = seq.tokens[:seq.prompt_len]
    shown = prompt[:MAX_PROMPT_TOKENS]
    admissions: list[WhyAdmissionDict] = []
    for a in admitted:
        div: WhyDivergenceDict | None = None
        if a.divergence is not None:
            d = a.divergence
            other = ledger.seqs.get(d.other_request) if d.other_request is not None else None
            div = {"position": d.position, "text": token_text([d.token])[0], "other_request": d.other_request,
                   "other_text": None if d.other_token is None else token_text([d.other_token])[0],
                   "before": "".join(token_text(seq.tokens[max(0, d.position - 12):d.position])),
                   "other_known": other is not None}
        admissions.append({"step": a.step, "tokens": a.tokens, "hit": a.hit, "resumed": a.resumed,
                           "classes": a.classes, "spans": [s.to_list() for s in a.spans], "divergence": div,
                           "evictions": [e.text() for e in a.evictions], "lost": a.lost, "notes": a.notes,
                           "seen": a.seen, "seen_by": a.seen_by})
    preemptions: list[WhyPreemptionDict] = [{"text": p.text(at=step), "proof": p.proof} for p in why.preemptions
                                            if step is None or p.step <= step]
    return {"request_id": rid, "known": True, "prompt_len": why.prompt_len, "why": why.why(),
            "domain": _domain_words(why.domain), "tokens": token_text(shown), "tokens_cut": len(prompt) - len(shown),
            "admissions": admissions, "preemptions": preemptions, "proofs": why.proofs}


def summary_state(ledger: WhyLedger, proof: ProofReport | None = None, engine: str | None = None,
                  step: int | None = None) -> WhySummaryDict:
    """The run's summary for the why panel (as it stood after `step`, when given), with the
    proofs' findings where they were made."""
    s = ledger.summary(step)
    return {**s.to_dict(), "rows": s.rows(), "classes_known": CLASS_LOOKS,
            "engine_note": ("kvscope's engine has no cache_salt or LoRA: 'another hash domain' never happens there"
                            if (engine or ledger.engine or "kvscope") == "kvscope" else ""),
            "proof": proof.to_dict() if proof is not None else None}


class WhyView:
    """The ledger a binder keeps fed from its Session, and the proofs it runs on request (in a
    thread: a replay takes seconds; the panel says "proving" meanwhile)."""

    def __init__(self) -> None:
        self.ledger = WhyLedger()
        self.lock = threading.RLock()
        self.proof: ProofReport | None = None
        self.proving = ""
        self.proved_at: int | None = None

    def reset(self) -> None:
        with self.lock:
            self.ledger, self.proof, self.proving, self.proved_at = WhyLedger(), None, "", None

    def feed(self, history: Iterable[HistoryEntry]) -> WhyLedger:
        with self.lock:
            self.ledger.feed(history)
        return self.ledger

    def prove(self, session: SessionView, done: Callable[[], None]) -> None:
        """Record the session's history, replay it and prove each cause; `done()` after."""
        if self.proving.startswith("proving"):
            return
        self.proving = "proving: replaying the run through vLLM's scheduler (seconds) \u2026"

        def run() -> None:
            from ..why.proof import prove, recording_of, run_replays

            try:
                with self.lock:
                    entries = list(session.history)
                    self.ledger.feed(entries)
                rec = recording_of(entries)
                replays = None if not rec.source.pristine else run_replays(rec)   # seconds: outside the lock
                with self.lock:
                    self.proof = prove(self.ledger, rec, replays)
                    self.proved_at = int(entries[-1].step)
                self.proving = ""
            except Exception as exc:  # noqa: BLE001 - a replay that fails is said in the panel, never raised in a thread
                self.proving = f"could not prove: {type(exc).__name__}: {exc}"
            done()

        threading.Thread(target=run, name="kvscope-why-prove", daemon=True).start()
