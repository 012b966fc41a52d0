"""The operator's answer: the search for the cheapest setting that meets a target, checked
against a brute-force grid over the same recording; the charts' series and the sentences read
from them; vLLM's per-replay log kept out of the cell."""
from __future__ import annotations

import pytest

from explorer.apps.cli import main as cli_main
from explorer.whatif import sweep
from explorer.whatif.charts import trend
from explorer.whatif.target import bounds, parse_target

pytestmark = pytest.mark.slow


def test_a_target_is_parsed_with_its_units_and_a_bad_one_is_named():
    c = parse_target("ttft_p90<=300ms, preemptions==0,hit_rate>=20%")
    assert [(x.metric, x.op, x.value) for x in c] == [("ttft_p90", "<=", 0.3), ("preemptions", "==", 0.0),
                                                      ("hit_rate", ">=", 0.2)]
    assert c[0].text == "ttft_p90 <= 300 ms (predicted)" and c[0].holds({"ttft_p90": 0.25})
    assert not c[0].holds({"ttft_p90": None})   # an unmeasured latency meets nothing
    assert parse_target({"preemptions": ("<=", 1)})[0].holds({"preemptions": 1})
    for bad, says in (("ttft<=1", "unknown metric 'ttft'"), ("preemptions=0", "expected METRIC OP NUMBER"),
                      ("", "target is empty"), ("steps<=1e", "is not a number")):
        with pytest.raises(ValueError, match=says):
            parse_target(bad)


def _least_meeting(rows, knob, ok):
    """Brute force: per value of the other knob, the least `knob` whose row meets `ok`."""
    out = {}
    for r in sorted(rows, key=lambda r: r["settings"][knob]):
        other = r["settings"]["max_num_batched_tokens" if knob == "num_blocks" else "num_blocks"]
        if ok(r) and other not in out:
            out[other] = r["settings"][knob]
    return out


def test_the_cheapest_pool_is_the_brute_force_grids_least(kvscope_run):
    _, rec, _ = kvscope_run
    budgets = [16, 48]
    res = sweep(rec, arrivals="step", target="preemptions==0", max_num_batched_tokens=budgets, processes=2,
                progress=False)
    lo, hi = bounds(rec, "num_blocks", rec.settings)
    grid = sweep(rec, arrivals="step", num_blocks=list(range(lo, hi + 1)), max_num_batched_tokens=budgets,
                 processes=2, progress=False, include_recorded=False)
    brute = _least_meeting(grid.ok_rows, "num_blocks", lambda r: r["preemptions"] == 0)
    a = res.answer
    assert a is not None and len(a.found) == 2
    for f in a.found:   # each budget's boundary, its neighbour below replayed and missing
        budget = f.best["settings"]["max_num_batched_tokens"]
        assert f.best["settings"]["num_blocks"] == brute[budget]
        assert f.below["settings"]["num_blocks"] == brute[budget] - 1 and f.below["preemptions"] > 0
    assert len(set(brute.values())) == 2   # the two budgets' boundaries differ: the answer picks the cheaper
    cheapest = min(brute.values())
    best = a.best.best
    assert best["settings"]["num_blocks"] == cheapest and best["kv_tokens"] == cheapest * rec.settings.block_size
    assert a.replays < len(grid.ok_rows) / 3   # bisection, not the grid
    mib = best["kv_bytes"] / 2**20
    assert (f"The cheapest setting that meets preemptions == 0: {cheapest} blocks of 16 tokens" in a.sentence
            and f"= {mib:,.1f} MiB of KV; {cheapest - 1} blocks misses it (preemptions " in a.sentence)
    text = res.table()
    assert a.sentence in text and "searched" in text and "answer" in text and "KV memory" in text
    frame = res.to_frame()   # every row's full settings and memory, whether the search ran it
    assert {"block_size", "num_blocks", "max_num_batched_tokens", "max_num_seqs", "kv_bytes", "searched"} <= set(
        frame.columns) and frame["searched"].sum() == len([r for r in res.rows if r.get("searched")]) > 0


def test_the_least_budget_is_the_brute_force_grids_least(kvscope_run):
    _, rec, _ = kvscope_run
    as_recorded = sweep(rec, arrivals="step", processes=1, progress=False).rows[0]["steps"]
    limit = as_recorded + 2   # a step count the recorded budget meets and the smallest budgets miss
    res = sweep(rec, arrivals="step", target=f"steps<={limit}", search="max_num_batched_tokens",
                num_blocks=[17, 40], processes=2, progress=False)
    lo, hi = bounds(rec, "max_num_batched_tokens", rec.settings)
    grid = sweep(rec, arrivals="step", num_blocks=[17, 40], max_num_batched_tokens=list(range(lo, hi + 1)),
                 processes=2, progress=False, include_recorded=False)
    brute = _least_meeting(grid.ok_rows, "max_num_batched_tokens", lambda r: r["steps"] <= limit)
    found = {f.best["settings"]["num_blocks"]: f.best["settings"]["max_num_batched_tokens"] for f in res.answer.found}
    assert found == brute and brute[17] > lo and brute[40] > lo
    assert res.answer.best.best["settings"]["num_blocks"] == 17   # the least memory that meets it at some budget
    assert "a budget of" in res.answer.sentence and "misses it (steps " in res.answer.sentence


def test_a_target_no_setting_meets_says_so_and_a_predicted_one_is_marked(kvscope_run, capsys):
    _, rec, path = kvscope_run
    res = sweep(rec, target="ttft_p90<=1ms,preemptions==0", processes=2, progress=False)
    assert res.answer.best is None
    assert res.answer.sentence.startswith("No setting searched meets ttft_p90 <= 1 ms (predicted) and preemptions "
                                          "== 0") and "At the top of each range:" in res.answer.sentence
    assert cli_main(["whatif", str(path), "--target", "preemptions==0", "--arrivals", "step", "--processes", "1"]) == 0
    out = capsys.readouterr().out
    assert "The cheapest setting that meets preemptions == 0:" in out and "MiB of KV" in out
    assert cli_main(["whatif", str(path), "--target", "latency<=1"]) == 2
    assert "unknown metric 'latency'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="leave out kv_memory_fraction"):
        sweep(rec, target="preemptions==0", kv_memory_fraction=[0.5, 1.0], progress=False)


def test_the_charts_draw_one_series_per_fixed_knob_and_say_what_did_not_move(kvscope_run):
    _, rec, _ = kvscope_run
    res = sweep(rec, arrivals="step", num_blocks=[17, 19, 20, 40], max_num_batched_tokens=[16, 48], processes=2,
                progress=False)
    figs = res.charts()
    hits = {r["hit_tokens"] for r in res.ok_rows}
    rates = {r["hit_rate"] for r in res.ok_rows}
    title = figs["hit_rate"].layout.title.text
    assert ("the same at every setting" in title) == (len(rates) == 1)
    for trace in figs["ttft_p90"].data or figs["hit_rate"].data:
        assert len(set(trace.x)) == len(trace.x)   # a line never joins two points at one x
    names = [t.name for t in figs["hit_rate"].data]
    by_budget = {b: [r["hit_rate"] for r in sorted(res.ok_rows, key=lambda r: r["settings"]["num_blocks"])
                     if r["settings"]["max_num_batched_tokens"] == b] for b in (16, 48)}
    assert len(names) == (1 if by_budget[16] == by_budget[48] else 2)   # equal series are drawn once, named for both
    bars = figs["preemptions"].data[0]
    assert list(bars.text) == [str(r["preemptions"]) for r in res.ok_rows] and "0" in bars.text
    assert all("blocks" in x and "budget" in x for x in bars.x)   # every bar names its pool and its budget
    said = res.findings()
    pool_hits = next(s for s in said if "prefix-hit tokens" in s)
    if len(hits) == 1:   # a claim that a bigger pool caches more appears only where the rows show it
        assert "at every setting" in pool_hits and " up from " not in pool_hits
    pre = next(s for s in said if "preemptions:" in s)
    at16 = [r["preemptions"] for r in sorted(res.ok_rows, key=lambda r: r["settings"]["num_blocks"])
            if r["settings"]["max_num_batched_tokens"] == 16]
    assert f"down from {at16[0]} at 17 to {at16[-1]} at 40 blocks" in pre and at16[0] > at16[-1]
    assert [trend(p) for p in ([(1, 1), (2, 2)], [(1, 2), (2, 1)], [(1, 1), (2, 1)], [(1, 1), (2, 3), (3, 2)])] == [
        "rises", "falls", "flat", "both ways"]


def test_vllms_log_for_each_replay_is_kept_not_printed(kvscope_run, capfd):
    _, rec, _ = kvscope_run
    res = sweep(rec, arrivals="step", num_blocks=[19, 20], processes=2, progress=False)
    err = capfd.readouterr().err
    said = res.vllm_log()
    assert said and all(line.split(" ", 1)[1] not in err for line in said)   # vLLM's CPU notes, kept once each
    assert "vLLM's log as it built the replays' schedulers" in res.table()
