"""What-if: the same recording at other settings, vLLM's refusals as one line each, the sweep
(other settings still run), the CLI, and a Mooncake trace."""
from __future__ import annotations

import dataclasses
import json

import pytest

from explorer.apps.cli import main as cli_main
from explorer.core.recording import RecordingError
from explorer.whatif import SettingRejected, first_parting, fit, load_trace, replay, sweep, variant
from explorer.whatif.mooncake import unit_tokens

pytestmark = pytest.mark.slow


def test_a_smaller_pool_preempts_more_and_prefix_caching_off_hits_nothing(kvscope_run):
    _, rec, _ = kvscope_run
    base = replay(rec)
    small = replay(rec, variant(rec, num_blocks=17))
    off = replay(rec, variant(rec, enable_prefix_caching=False))
    assert small.preemptions > base.preemptions
    assert off.hit_tokens == 0 and base.hit_tokens > 0
    assert small.query_tokens == base.query_tokens   # hits and queries of first admissions, as vLLM counts them
    assert small.resumed_hit_tokens > 0 and small.hit_tokens <= base.hit_tokens
    assert small.recomputed_tokens > 0
    assert all(0 <= u <= 1 for u in small.kv_usage) and max(small.kv_usage) == 1.0


def test_a_new_block_size_keeps_the_recorded_memory(kvscope_run):
    _, rec, _ = kvscope_run
    v = variant(rec, block_size=32)
    assert v.settings.num_blocks == rec.settings.num_blocks * 16 // 32 and "same memory" in v.label
    double = variant(rec, kv_memory_fraction=2.0, block_size=32)
    assert double.settings.num_blocks == rec.settings.num_blocks * 16 * 2 // 32


def test_timed_arrivals_predict_latencies_with_the_models_error(kvscope_run):
    _, rec, _ = kvscope_run
    model = fit(rec)
    assert model.num_steps >= 10 and 0 <= model.step_error and 0 <= model.total_error
    res = replay(rec, variant(rec, max_num_batched_tokens=16), arrivals="timed", step_model=model)
    assert res.times == sorted(res.times) and res.times[-1] > 0
    first = [r.first_token_time - r.arrival for r in res.requests.values() if r.first_token_time is not None]
    assert first and min(first) > 0
    with pytest.raises(ValueError, match="step-time model"):
        replay(rec, arrivals="timed")


def test_the_first_parting_is_found_and_said_in_words(kvscope_run):
    _, rec, _ = kvscope_run
    a = replay(rec, keep_steps=True)
    b = replay(rec, variant(rec, num_blocks=17), keep_steps=True)
    p = first_parting(rec, a, b)
    assert p is not None and a.details[p.index].decisions != b.details[p.index].decisions
    assert all(a.details[i].decisions["scheduled"] == b.details[i].decisions["scheduled"] for i in range(p.index))
    assert p.text.startswith(f"step {p.step_b}: with num_blocks=17, req ") and "preempted" in p.text
    assert first_parting(rec, a, replay(rec, keep_steps=True)) is None


@pytest.mark.parametrize("changes, says", [
    ({"num_blocks": 10}, "num_blocks 10 is too small: 9 usable blocks of 16 hold 144 tokens, less than one request "
                         "of max_model_len 256"),
    ({"max_num_seqs": 64}, "max_num_seqs 64 must not exceed max_num_batched_tokens 48"),
    ({"block_size": 0}, "block_size must be an integer >= 1"),
    ({"policy": "lifo"}, "policy must be one of"),
    ({"enable_chunked_prefill": False}, "below max_model_len 256 with chunked prefill off"),
    ({"num_blocks": 20, "kv_memory_fraction": 0.5}, "give the pool once"),
    ({"kv_cache_memory_bytes": 40_000}, "num_blocks 4 is too small"),
    ({"bogus": 1}, "unknown what-if setting"),
])
def test_settings_vllm_refuses_get_one_clear_line(kvscope_run, changes, says):
    _, rec, _ = kvscope_run
    with pytest.raises(SettingRejected, match=says) as err:
        variant(rec, **changes)
    assert "\n" not in str(err.value)


def test_a_bug_building_the_scheduler_is_an_error_never_a_refusal(kvscope_run, monkeypatch):
    """Only vLLM's config validation (a ValueError) is a refusal; anything else propagates as
    itself, so a sweep cannot show a bug as 'rejected'."""
    from explorer.drivers.vllm import bare

    _, rec, _ = kvscope_run

    def broken(**kwargs):
        raise TypeError("planted: a bug, not a setting")

    monkeypatch.setattr(bare, "bare_scheduler", broken)
    with pytest.raises(TypeError, match="planted"):
        replay(rec, variant(rec, num_blocks=17))


def test_a_block_size_vllms_cpu_attention_cannot_use(kvscope_run):
    _, rec, _ = kvscope_run
    as_vllm = dataclasses.replace(rec, source=dataclasses.replace(rec.source, engine="vLLM 0.32.0", device="cpu"))
    with pytest.raises(SettingRejected, match="block_size 48 is not one vLLM's CPU_ATTN attention backend can use on "
                                              "cpu \\(block sizes: multiples of 32\\)"):
        variant(as_vllm, block_size=48, num_blocks=64)
    assert variant(rec, block_size=48, num_blocks=64).settings.block_size == 48   # kvscope's engine takes any


def test_a_sweep_runs_every_setting_and_refuses_the_bad_ones_alone(kvscope_run):
    _, rec, _ = kvscope_run
    res = sweep(rec, num_blocks=[10, 17, 20], max_num_batched_tokens=[16, 48], processes=2, progress=False)
    by = {r["label"]: r for r in res.rows}
    assert by["as recorded"]["status"] == "ok"
    refused = [r for r in res.rows if r["status"] == "rejected"]
    assert len(refused) == 2 and all("num_blocks 10 is too small" in r["error"] for r in refused)
    ok = res.ok_rows
    assert len(ok) == 4   # (20, 48) is the recorded setting: run once
    assert by["num_blocks=17"]["preemptions"] > by["as recorded"]["preemptions"]
    for r in ok:
        assert r["ttft_p50"] <= r["ttft_p90"] and r["steps"] == len(replay(rec, variant(rec, **r["changes"]))
                                                                   .steps)
    text = res.table()
    assert text.count("num_blocks 10 is too small") == 1 and "held-out error" in text   # one line per reason
    assert "rejected (num_blocks=10, budget=16; num_blocks=10, budget=48): num_blocks 10 is too small" in text
    assert "vLLM's scheduler alone:" in text and "steps/s" in text
    figs = res.charts()
    assert set(figs) == {"hit_rate", "ttft_p90", "preemptions"}
    assert len(figs["preemptions"].data[0].x) == 4
    frame = res.to_frame()  # the notebook's table: one row per setting, the changed knobs as columns
    assert list(frame["setting"]) == [r["label"] for r in res.rows]
    assert {"num_blocks", "max_num_batched_tokens", "preemptions", "ttft_p90"} <= set(frame.columns)
    assert frame.loc[frame["setting"] == "num_blocks=17", "preemptions"].item() == by["num_blocks=17"]["preemptions"]


def test_the_cli_prints_the_table_and_refuses_a_damaged_file(kvscope_run, tmp_path, capsys):
    _, _, path = kvscope_run
    out = tmp_path / "rows.json"
    assert cli_main(["whatif", str(path), "--num-blocks", "10,17", "--processes", "1", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "as recorded" in text and "rejected (num_blocks=10): num_blocks 10 is too small" in text
    lines = text.splitlines()   # every row names its block size and pool (then budget, max_num_seqs)
    assert lines[1].split()[:6] == ["as", "recorded", "16", "20", "48", "4"] and lines[2].split()[:4] == [
        "16", "17", "48", "4"]
    assert json.loads(out.read_text())["rows"][0]["label"] == "as recorded"
    assert cli_main(["whatif", str(path), "--identity"]) == 0
    assert "0 differences" in capsys.readouterr().out
    bad = tmp_path / "bad.kvrec"
    bad.write_text("not a recording\n")
    assert cli_main(["whatif", str(bad)]) == 2
    assert "error:" in capsys.readouterr().err


# -- a Mooncake trace -------------------------------------------------------------------------------
def _trace(tmp_path, lines):
    p = tmp_path / "trace.jsonl"
    p.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return p


def test_a_mooncake_trace_hits_exactly_its_shared_units(kvscope_run, tmp_path):
    _, rec, _ = kvscope_run
    model = fit(rec)   # a trace has no timings: a real recording's model drives the clock
    path = _trace(tmp_path, [
        {"timestamp": 0, "input_length": 1200, "output_length": 8, "hash_ids": [1, 2, 3]},
        {"timestamp": 10000, "input_length": 1100, "output_length": 8, "hash_ids": [1, 2, 4]},
        {"timestamp": 20000, "input_length": 600, "output_length": 8, "hash_ids": [5, 6]},
    ])
    trace = load_trace(path, block_size=16, num_blocks=1024, max_num_batched_tokens=2048, max_model_len=2048)
    assert len(trace.requests[0].prompt_token_ids) == 1200 and trace.source.hash_unit == 512
    assert unit_tokens(1, 512)[:2] != unit_tokens(2, 512)[:2]
    for bs in (16, 64, 512):
        res = replay(trace, variant(trace, block_size=bs, num_blocks=1024 * 16 // bs), arrivals="timed",
                     step_model=model)
        assert res.hit_tokens == 2 * 512, (bs, res.hit_tokens)   # request 1 shares units 1 and 2, no more
    with pytest.raises(SettingRejected, match="block_size 48 does not divide the trace's hash unit of 512"):
        variant(trace, block_size=48)
    res = sweep(trace, block_size=[16, 48], step_model=model, processes=1, progress=False)
    assert [r["status"] for r in res.rows] == ["ok", "rejected"]


@pytest.mark.parametrize("line, says", [
    ({"timestamp": 0, "input_length": 1200, "output_length": 8, "hash_ids": [1, 2]}, "hash_ids has 2 ids for 1200"),
    ({"timestamp": 0, "input_length": 100, "output_length": 8}, "lacks \\['hash_ids'\\]"),
    ({"timestamp": -1, "input_length": 100, "output_length": 8, "hash_ids": [1]}, "timestamp must be"),
])
def test_a_bad_trace_line_is_named(tmp_path, line, says):
    with pytest.raises(RecordingError, match=says):
        load_trace(_trace(tmp_path, [line]))
