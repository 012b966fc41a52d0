"""`python -m benchmarks bench-ui`: the benchmark reports every phase of a step and the bytes
sent to the browser, and leaves the objects it timed as it found them. Figures are only
checked for presence and sign: timings are never asserted (the machine is shared)."""
from __future__ import annotations

import json

import ipywidgets
import pytest

from benchmarks import ui as bench_ui
from benchmarks.__main__ import main
from benchmarks.ui import StepTimer, bench_python, prepare_session

WATCHED = ("QueuesPanel", "BlockPoolPanel", "SlotMappingPanel")


@pytest.fixture(scope="module")
def measured(tiny_qwen3_path) -> tuple[dict, list[str], object]:
    """(result, printed lines, the Session measured): 8 decoding requests, 512 blocks, 2 steps."""
    session = prepare_session(str(tiny_qwen3_path), num_requests=8, num_kv_blocks=512, steps=3, prompt_len=(16, 64))
    lines: list[str] = []
    res = bench_python(session=session, steps=2, out=lines.append)
    return res, lines, session


@pytest.fixture
def python_result(measured) -> tuple[dict, list[str]]:
    return measured[0], measured[1]


def test_every_measured_step_is_a_pure_decode_of_all_requests(python_result):
    res, _ = python_result
    assert res["setup"]["all_decode"] is True
    assert [r["num_decode"] for r in res["steps"]] == [8, 8]
    assert all(r["num_preempted"] == 0 for r in res["steps"])


@pytest.mark.parametrize("key", ["engine_ms", "engine_wall_ms", "history_ms", "snapshot_ms", "view_ms",
                                 "views_ms", "probe_ms", "sync_ms", "pack_ms", "session_step_ms"])
def test_each_phase_of_a_step_is_measured(python_result, key):
    res, _ = python_result
    assert all(r[key] > 0 for r in res["steps"]), [r[key] for r in res["steps"]]
    s = res["summary"][key]
    assert s["n"] == 2 and 0 < s["min"] <= s["median"] <= s["max"]


def test_the_phases_add_up_to_the_session_step(python_result):
    res, _ = python_result
    for r in res["steps"]:
        assert r["engine_wall_ms"] + r["history_ms"] + r["view_ms"] <= r["session_step_ms"]
        assert r["views_ms"] + r["probe_ms"] <= r["view_ms"]
        assert r["snapshot_ms"] <= r["history_ms"]


def test_payload_sizes_are_reported_per_step_and_per_widget(python_result):
    res, lines = python_result
    su = res["summary"]
    assert su["messages"]["min"] > 0 and su["json_bytes"]["min"] > 0
    # Only changed traits travel; each step changes the block pool's byte columns (its events at least).
    assert su["buffer_bytes"]["min"] > 0
    for name in WATCHED:
        assert res["widgets"][name]["json_bytes"]["median"] > 0, name
    assert res["widgets"]["BlockPoolPanel"]["buffer_bytes"]["median"] > 0
    assert su["snapshot_bytes"]["min"] > su["record_bytes"]["min"] > 0
    text = "\n".join(lines)
    for needle in ("payload per step: JSON (KiB)", "binary buffers", "view update", "history", "BlockPoolPanel",
                   "block_pool_state", "8 running requests", "512 KV blocks"):
        assert needle in text, needle


def test_timing_hooks_are_put_back(measured):
    res, _, session = measured
    assert ipywidgets.Widget.__dict__["_send"].__qualname__ == "Widget._send"
    assert not {"step", "snapshot"} & set(vars(session.engine))
    assert "probe" not in vars(session)
    steps_before = len(res["steps"])
    timer = StepTimer(session)
    assert "step" in vars(session.engine)
    timer.close()
    assert not {"step", "snapshot"} & set(vars(session.engine))
    assert session.step(1)  # the engine still steps, untimed
    assert len(res["steps"]) == steps_before and timer.steps == []


def test_browser_table_from_clicks_joined_with_the_kernel_log():
    clicks = [{"target": 5 + i, "timedOut": False, "step_attr_ms": 300.0 + i, "panels_ms": 700.0 + i,
               "painted_ms": 720.0 + i, "ack_ms": 900.0, "quiet_ms": 900.0, "long_tasks": 2, "long_task_ms": 150.0,
               "per_panel_last_ms": {p: 600.0 for p in bench_ui.WATCHED_PANELS},
               "kernel": {"step": 5 + i, "engine_ms": 200.0, "engine_wall_ms": 210.0, "history_ms": 20.0,
                          "view_ms": 70.0, "num_decode": 64}} for i in range(3)]
    su = bench_ui.summarize_clicks(clicks)
    assert su["step_attr_ms"]["median"] == 301.0
    assert su["overhead_ms"]["median"] == 501.0        # panels - the engine's own figure, per click
    assert su["rest_ms"]["median"] == 401.0            # panels - (engine wall + history + view)
    assert su["last_kvs-block-pool_ms"]["median"] == 600.0
    res = {"setup": {"num_requests": 64, "num_kv_blocks": 4096, "clicks": 3, "warmup_clicks": 1,
                     "all_decode": True, "jupyterlab": "4", "browser_version": "1"}, "summary": su}
    text = "\n".join(bench_ui.format_browser(res))
    assert "click -> queues, block pool, slot mapping show new data-step" in text and "301.0" in text


def test_cli_runs_the_python_part_and_writes_json(tiny_qwen3_path, tmp_path, capsys):
    out = tmp_path / "ui.json"
    rc = main(["bench-ui", "--model", str(tiny_qwen3_path), "--no-browser", "--steps", "1", "--requests", "3",
               "--blocks", "256", "--json", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    assert "bench-ui, Python side" in printed and "3 running requests" in printed
    data = json.loads(out.read_text())
    assert set(data) == {"python"} and data["python"]["summary"]["view_ms"]["n"] == 1


def test_a_pool_too_small_for_the_requests_is_refused_naming_the_knob(tiny_qwen3_path, capsys):
    rc = main(["bench-ui", "--model", str(tiny_qwen3_path), "--no-browser", "--requests", "64", "--blocks", "32"])
    assert rc == 2
    assert "num_kv_blocks" in capsys.readouterr().err


def test_browser_part_without_chromium_says_how_to_skip_it(monkeypatch):
    from benchmarks import ui_page as ui_bench_page

    monkeypatch.setattr(ui_bench_page, "find_chromium", lambda: None)
    with pytest.raises(bench_ui.BenchUnavailable, match="--no-browser"):
        bench_ui.bench_browser("unused", steps=1, out=lambda line: None)


def test_the_browser_notebook_imports_this_checkout_from_the_kernels_folder(tmp_path):
    # Lab runs the bench's notebook in a temporary folder, where benchmarks/ is in no install (an
    # editable one maps engine, explorer and widgets only): its first line must reach this checkout.
    import os
    import subprocess
    import sys

    import nbformat

    from benchmarks import ui_page as ui_bench_page

    path = tmp_path / "bench_ui.ipynb"
    ui_bench_page.build_notebook(path, model=None, num_requests=1, num_kv_blocks=8, block_size=16, steps=1,
                                 prompt_len=(4, 8), kernel_log=tmp_path / "kernel.log")
    first = nbformat.read(str(path), as_version=4).cells[0].source.splitlines()[0]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", f"{first}\nimport benchmarks.ui, explorer\nprint(explorer.__file__)"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(ui_bench_page.REPO / "explorer" / "__init__.py")
