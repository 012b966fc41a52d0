"""The what-if parting line names a request with a long vLLM id by its short label ("req #2"),
the order the recording saw it arrive, never the 33-character id (the review saw two of those in
one line); short ids keep their own names ("req 3"). The steps are built by hand: the sentence
is a function of the two runs' step details, no vLLM needed."""
from __future__ import annotations

from types import SimpleNamespace

from explorer.whatif.parting import first_parting
from explorer.whatif.replay import Preemption, StepDetail

LONG = ["cmpl-ae5d185520b8dfff-0-8d04f5d6", "cmpl-b34451f36abe0dee-0-a94bb563", "cmpl-c0ffee0123456789-0-deadbeef"]


def _detail(step: int, scheduled: list[tuple[str, int, int, int]], preemptions: list[Preemption]) -> StepDetail:
    return StepDetail(step=step, decisions={"scheduled": scheduled, "preempted": [p.victim for p in preemptions],
                                            "finished": [], "tables": {}},
                      preemptions=preemptions, waiting=[p.victim for p in preemptions], free_blocks=0, budget_left=0,
                      time=None)


def _runs(ids: list[str]):
    """Three requests of 40-token prompts (arriving in `ids` order); both runs schedule the same
    first step, then the variant preempts the last for the first one's decode."""
    rec = SimpleNamespace(requests=[SimpleNamespace(request_id=rid, prompt_token_ids=[1] * 40, arrival_seq=seq)
                                    for seq, rid in enumerate(ids)])
    first = [(rid, 40, 0, 0) for rid in ids]
    decode = [(rid, 1, 40, 0) for rid in ids]
    a = SimpleNamespace(details=[_detail(1, first, []), _detail(2, decode, [])],
                        variant=SimpleNamespace(label="as recorded"))
    b = SimpleNamespace(details=[_detail(1, first, []),
                                 _detail(2, decode[:2], [Preemption(victim=ids[2], for_request=ids[0],
                                                                    lost_tokens=40)])],
                        variant=SimpleNamespace(label="num_blocks=17"))
    return rec, a, b


def test_long_vllm_ids_are_named_by_their_short_labels():
    rec, a, b = _runs(LONG)
    p = first_parting(rec, a, b)
    assert p is not None and p.index == 1
    assert p.text == ("step 2: with num_blocks=17, req #3 is preempted to make room for req #1's decode "
                      "(as recorded it kept its blocks)"), p.text
    assert not any(rid in p.text for rid in LONG) and "cmpl-" not in p.text
    assert p.requests == [LONG[2]]   # the full id stays with the parting, for the view's hover


def test_short_ids_keep_their_own_names():
    rec, a, b = _runs(["7", "3", "12"])
    p = first_parting(rec, a, b)
    assert p is not None and "req 12 is preempted to make room for req 7's decode" in p.text, p.text
