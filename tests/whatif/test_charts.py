"""The sweep's charts as figure objects, from rows built by hand (tests/whatif/sweep_rows.py):
the hit-rate axis shows tenths of a percent when the rates differ by a few points (at whole
percents 22.7% and 23.3% were one repeated tick, "23%"), whole percents otherwise."""
from __future__ import annotations

from explorer.whatif.charts import sweep_charts

from .sweep_rows import review_rows, row, sweep_result


def test_a_small_hit_rate_spread_gets_tenths_of_a_percent():
    fig = sweep_charts(sweep_result(review_rows()))["hit_rate"]
    assert fig.layout.yaxis.tickformat == ".1%"
    rates = sorted({y for t in fig.data for y in t.y})
    assert rates[0] == 0.227 and rates[-1] == 0.233
    assert len({f"{r:.1%}" for r in rates}) == len(rates) > 1 == len({f"{r:.0%}" for r in rates})


def test_a_wide_hit_rate_spread_keeps_whole_percents():
    rows = [row(b, 32, i, hit_rate=rate) for i, (b, rate) in enumerate(((34, 0.10), (40, 0.25), (80, 0.60)))]
    fig = sweep_charts(sweep_result(rows))["hit_rate"]
    assert fig.layout.yaxis.tickformat == ".0%"
    assert "the same at every setting" not in fig.layout.title.text


def test_one_rate_everywhere_is_said_in_the_title():
    rows = [row(b, 32, i) for i, b in enumerate((34, 40, 80))]
    fig = sweep_charts(sweep_result(rows))["hit_rate"]
    assert fig.layout.title.text.endswith(": the same at every setting (22.9%)"), fig.layout.title.text


def test_the_preemptions_axis_counts_in_whole_numbers():
    rows = review_rows()
    axis = sweep_charts(sweep_result(rows))["preemptions"].layout.yaxis
    top = max(r["preemptions"] for r in rows)
    assert axis.tick0 == 0 and isinstance(axis.dtick, int) and axis.dtick >= 1 and top >= 1
    assert top // axis.dtick <= 5   # a handful of whole-number ticks up to the highest bar
