"""One-file export, the compact history behind it, workloads, and app mode's launch
(no browser here: tests/e2e/test_export_browser.py and test_app_mode.py drive chromium)."""
from __future__ import annotations

import gzip
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.report.list_prefix import as_json
from explorer import Dashboard
from explorer.apps import app, cli
from explorer.core import history
from explorer.export import delta
from explorer.export import page as export
from explorer.export import workloads as recording
from explorer.ui import views

SHARED = list(range(1000, 1032))  # two full blocks both prompts start with: prefix hits
CONFIG = {"num_kv_blocks": 24, "block_size": 16, "max_num_batched_tokens": 32}
# Ids "10" and "2": JSON.parse would order them "2", "10"; the export must keep "10" first.
SPEC = {
    "title": "test workload",
    "config": CONFIG,
    "requests": [
        {"prompt": SHARED + list(range(2000, 2008)), "max_tokens": 5, "request_id": "a"},
        {"prompt": SHARED + list(range(3000, 3010)), "max_tokens": 4, "at_step": 2, "request_id": "b",
         "caption": "b arrives and shares a's first two blocks"},
        {"prompt": "The capital of France is", "max_tokens": 3, "at_step": 3, "request_id": "10"},
        {"prompt": "Hello there, how are you", "max_tokens": 3, "at_step": 3, "request_id": "2"},
    ],
    "budget": [{"at_step": 6, "max_num_batched_tokens": 64, "caption": "a bigger budget"}],
    "captions": {"0": "a arrives alone"},
}


@pytest.fixture(scope="module")
def recorded(tiny_qwen3_path: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict]:
    """(session, captions) after SPEC ran on the tiny Qwen3 (one model load per module)."""
    path = tmp_path_factory.mktemp("workload") / "spec.json"
    path.write_text(json.dumps(SPEC))
    session, captions, title = recording.record_workload(path, model=str(tiny_qwen3_path))
    assert title == "test workload"
    return session, captions


def plain(entries) -> list[dict]:
    """Entries as JSON would carry them (what a file or a browser gets back)."""
    return json.loads(json.dumps([{"step": e.step, "record": e.record, "snapshot": e.snapshot} for e in entries],
                                 default=as_json))


# -- the JSON workload ------------------------------------------------------------------------------
def test_json_workload_arrivals_budget_and_captions(recorded) -> None:
    s, captions = recorded
    h = s.history
    added = {rid: e.step for e in h for rid in (e.record or {}).get("new_requests", [])}
    assert added == {"a": 1, "b": 3, "10": 4, "2": 4}  # at_step k: added after k steps, scheduled in step k+1
    hit = next(x for x in s.entry(3).record["scheduled"] if x["request_id"] == "b")
    assert hit["num_cached_tokens"] == 32  # b's first two blocks came from the prefix cache
    assert s.entry(6).snapshot["config"]["max_num_batched_tokens"] == 64
    assert s.entry(5).snapshot["config"]["max_num_batched_tokens"] == 32
    assert captions == {0: "a arrives alone", 2: "b arrives and shares a's first two blocks", 6: "a bigger budget"}
    assert not s.engine.has_unfinished_requests()
    orders = [list(e.record["sampled"]) for e in h[1:] if {"10", "2"} <= set(e.record["sampled"])]
    assert orders and all(o.index("10") < o.index("2") for o in orders)  # scheduled order, not numeric


@pytest.mark.parametrize(("spec", "needle"), [
    ({"requests": []}, "requests"),
    ({"requests": [{"max_tokens": 3}]}, "requests[0]: each request needs a prompt"),
    ({"requests": [{"prompt": "x", "max_token": 3}]}, "unknown field(s) ['max_token']"),
    ({"requests": [{"prompt": "x", "at_step": -1}]}, "request[0].at_step"),
    ({"requests": [{"prompt": "x"}], "budget": {"max_num_seqs": 2}}, "budget"),
])
def test_json_workload_bad_fields_are_named(recorded, spec: dict, needle: str) -> None:
    s, _ = recorded
    with pytest.raises(ValueError) as info:
        recording.run_json_workload(s, spec, lambda _text: None)
    assert needle in str(info.value)


# -- 1. the compact history in memory -------------------------------------------------------------
def test_history_snapshots_share_what_their_step_did_not_change(recorded) -> None:
    # Each entry is the one before with the step's changes applied (engine.report.changes.apply):
    # what a step left alone is the same object, so the history costs what the steps changed.
    s, _ = recorded
    entries = s.history
    for prev, cur in zip((e.snapshot for e in entries), (e.snapshot for e in entries[1:])):
        assert cur["model_info"] is prev["model_info"]
        assert cur["config"] is prev["config"] or cur["config"] != prev["config"]  # new only when a knob moved
        old_reqs = {r["request_id"]: r for q in prev["queues"].values() for r in q}
        for q in cur["queues"].values():
            for r in q:
                if r["request_id"] in old_reqs:  # a prompt is never copied again
                    assert r["prompt_token_ids"] is old_reqs[r["request_id"]]["prompt_token_ids"]
        untouched = [i for i, (a, b) in enumerate(zip(prev["block_pool"]["blocks"], cur["block_pool"]["blocks"]))
                     if a == b]
        assert untouched and all(cur["block_pool"]["blocks"][i] is prev["block_pool"]["blocks"][i] for i in untouched)
    copies = plain(entries)  # the same history with every snapshot its own copy
    assert (history.history_bytes({"snapshot": e.snapshot} for e in entries)
            < history.history_bytes({"snapshot": e["snapshot"]} for e in copies) / 2)


# -- 2. deltas on the wire -----------------------------------------------------------------------
# -0.0 == 0.0 is the one equality JSON tells apart; no snapshot holds a negative zero.
_scalars = st.none() | st.booleans() | st.integers(-5, 300) | st.text(max_size=12) \
    | st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: x != 0 or math.copysign(1.0, x) > 0)
_json = st.recursive(_scalars,
                     lambda kids: st.lists(kids, max_size=5) | st.dictionaries(st.text(max_size=4), kids, max_size=5),
                     max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(_json, _json)
def test_patch_of_diff_gives_the_new_value_with_its_types(old: Any, new: Any) -> None:
    d = delta.diff(old, new)
    out = delta.patch(old, d)
    assert json.dumps(out, sort_keys=True) == json.dumps(new, sort_keys=True)  # 1 and True differ here
    if json.dumps(old, sort_keys=True) == json.dumps(new, sort_keys=True):
        assert d is None
    # and the delta survives JSON
    assert json.dumps(delta.patch(old, json.loads(json.dumps(d))), sort_keys=True) == json.dumps(new, sort_keys=True)


# -- the page ------------------------------------------------------------------------------------
def test_export_is_one_self_contained_file_that_loads_back(recorded, tmp_path: Path) -> None:
    s, captions = recorded
    result = export.export_html(s, tmp_path / "run.html", captions=captions)
    page = result.path.read_text(encoding="utf-8")
    assert result.bytes == len(page.encode()) and result.steps_included == len(s.history) and result.notice == ""
    # Nothing outside the file: no src= or href= to load, no URL but the SVG namespace.
    assert not re.search(r"<(script|link|img|iframe)[^>]*\s(src|href)=", page, re.I)
    urls = set(re.findall(r"https?://[^\s\"'`)<]+", page))
    assert urls <= {"http://www.w3.org/2000/svg"}, urls
    assert "Content-Security-Policy" in page and "connect-src 'none'" in page
    for name in ("controls", "queues", "sampler", "blocks", "slots", "attention", "timeline"):
        assert f'data-kvs-esm="{name}"' in page and f'data-panel="{name}"' in page
    assert "make lab" in page  # how to run it live
    data = export.load_export(result.path)
    assert [v["step"] for v in data["views"]] == [e.step for e in s.history]
    assert data["captions"] == [[0, "a arrives alone"], [2, "b arrives and shares a's first two blocks"],
                                [6, "a bigger budget"]]
    # Panel states, not the history: no record or snapshot, no view code in the host.
    assert set(data) == {"format", "version", "meta", "timeline", "captions", "views", "why"}
    assert set(data["why"]) == {"summary", "requests", "default"} and data["why"]["summary"][-1][1]["prompt_tokens"] > 0
    assert "function queuesState" not in page and "function blockPoolState" not in page
    shared = next(d for d in data["views"][-1]["block_details"] if d["token_ids"][:1] == SHARED[:1])
    assert shared["tokens"][0] == s.engine.tokenizer.decode([SHARED[0]])


def at_step(changes: list, step: int, before: Any) -> Any:
    """What the page's host.js atStep picks: the last [step, state] item at or before `step`."""
    out = before
    for at, state in changes:
        if at > step:
            break
        out = state
    return out


def _shown(panel: Any, state: dict) -> dict:
    """`panel`'s traits named by `state`."""
    return {k: getattr(panel, k) for k in state}


def test_the_page_embeds_what_the_dashboard_shows_at_every_step(recorded, tmp_path: Path) -> None:
    """Decoded, the page's states of every step are what the live Dashboard's panels hold with
    that step on display; the sampler's for every request, and every block's hover detail."""
    s, captions = recorded
    data = export.load_export(export.export_html(s, tmp_path / "run.html", captions=captions).path)
    texts = views.token_texts(s.engine.tokenizer)
    dash = Dashboard(s)
    dash.binder.auto_probe = False  # a probe reads the engine's KV: not what is compared here
    try:
        assert len(data["views"]) == len(s.history)
        for i, (got, entry) in enumerate(zip(data["views"], s.history)):
            # Every step of a recording is history (its controls show the budgets it ran under), as
            # a step scrubbed to in the Dashboard is: the last one too, not live.
            dash.binder.view_index = i
            dash.binder.render()
            assert got["step"] == entry.step == dash.queues.step, i
            assert got["queues"] == _shown(dash.queues, got["queues"]), i
            assert got["tree"] == _shown(dash.tree, got["tree"]), i   # the prefix tree at that step
            assert got["blocks"] == _shown(dash.blocks, got["blocks"]), i
            assert got["slots"] == _shown(dash.slots, got["slots"]), i
            assert got["attention"] == _shown(dash.attention, got["attention"]), i
            assert got["controls"] == _shown(dash.controls, got["controls"]), i
            assert got["latency"] == views.latency_state(entry.snapshot), i
            # The why panel as it stood after this step: what the page picks from its change lists.
            why = data["why"]
            rid = at_step(why["default"], entry.step, "")
            assert at_step(why["summary"], entry.step, {}) == json.loads(json.dumps(dash.why.summary)), i
            want_request = at_step(why["requests"].get(rid, []), entry.step, {"request_id": rid, "known": False})
            assert (want_request if rid else {}) == json.loads(json.dumps(dash.why.request)), i
            details = [dash.blocks.block_detail(b) for b in range(dash.blocks.num_blocks)]
            assert [{**d, "step": got["step"]} for d in got["block_details"]] == details, i
            sampler = got["sampler"]
            assert {"requests": sampler["requests"], "request_id": sampler["default"],
                    "sample": sampler["samples"][sampler["default"]]} == _shown(dash.sampler, {
                        "requests": 0, "request_id": 0, "sample": 0}), i
            every = {r["request_id"] for e in s.history for r in views.all_requests(e.snapshot)}
            assert set(sampler["samples"]) >= every
            for rid in every:
                want = views.sampler_state(s.history[: i + 1], entry.snapshot, rid, texts)
                assert sampler["samples"][rid] == want["sample"] and sampler["requests"] == want["requests"], (i, rid)
        assert data["timeline"] == _shown(dash.timeline, data["timeline"])
        # It moves with the step: the first step's summary knows fewer requests than the run's.
        assert at_step(data["why"]["summary"], s.history[0].step, {})["requests"] < data["why"]["summary"][-1][1][
            "requests"]
    finally:
        dash.close_binding()


def test_export_bounds_a_long_history_and_says_so(recorded, tmp_path: Path) -> None:
    s, _ = recorded
    n = s.current.step
    for keep, steps in (("last", list(range(n - 3, n + 1))), ("first", [0, 1, 2, 3])):
        result = export.export_html(s, tmp_path / f"{keep}.html", max_steps=3, keep=keep)
        data = export.load_export(result.path)
        assert [v["step"] for v in data["views"]] == steps
        assert f"the {keep} 3 steps" in result.notice and f"of the recorded 0\u2013{n}" in result.notice
        assert result.notice in result.path.read_text(encoding="utf-8")
        assert data["timeline"]["steps"]["step"] == [x for x in steps if x > 0]
    even = export.export_html(s, tmp_path / "even.html", max_steps=4, keep="even")
    steps = [v["step"] for v in export.load_export(even.path)["views"]]
    assert steps[0] == 0 and steps[-1] == n and len(steps) == 5 and "evenly spaced" in even.notice
    whole = export.export_html(s, tmp_path / "whole.html").bytes
    small = export.export_html(s, tmp_path / "small.html", max_bytes=whole - 1)
    assert small.bytes < whole and small.steps_included < len(s.history)
    assert "export size limit" in small.notice and small.notice in small.path.read_text(encoding="utf-8")
    with pytest.raises(ValueError, match="keep"):
        export.export_html(s, tmp_path / "x.html", keep="middle")
    with pytest.raises(ValueError, match="max_steps"):
        export.export_html(s, tmp_path / "x.html", max_steps=0)


# -- the command line ----------------------------------------------------------------------------
PY_WORKLOAD = '''
CONFIG = {"num_kv_blocks": 16, "block_size": 16}
TITLE = "from a Python file"

def run(session, caption):
    caption("one request")
    session.add_request([7, 8, 9, 10], max_tokens=3, temperature=0.0)
    session.run_until_idle()
'''


def test_cli_export_records_a_python_workload(tiny_qwen3_path: Path, tmp_path: Path, capsys) -> None:
    work = tmp_path / "work.py"
    work.write_text(PY_WORKLOAD)
    out = tmp_path / "out.html"
    rc = cli.main(["export", str(out), "--workload", str(work), "--model", str(tiny_qwen3_path), "--max-steps", "50"])
    captured = capsys.readouterr()
    printed = captured.out
    assert rc == 0 and out.is_file()
    assert "Loading weights" not in captured.err   # the CLI's own line says the load; no bar draws over it
    assert re.search(r"wrote .*out\.html \(\d+\.\d\d MB, 3 steps\)", printed), printed
    data = export.load_export(out)
    assert data["meta"]["title"] == "from a Python file" and data["captions"] == [[0, "one request"]]
    assert data["views"][0]["controls"]["pool"]["num_kv_blocks"] == 16 == data["views"][0]["blocks"]["num_blocks"]


# README.md's "Sharing a run" says what the walkthrough's export weighs ("The walkthrough's run
# (59 steps) weighs X MB (Y KB gzipped)"): the CLI's own export must weigh that, within 10%.
README_EXPORT_SIZE = re.compile(r"walkthrough's run \((\d+) steps\)\s+weighs (\d+\.\d+) MB \((\d+) KB gzipped\)")


@pytest.mark.slow
def test_cli_export_of_the_walkthrough_weighs_what_the_readme_says(default_model_path: Path, tmp_path: Path,
                                                                    capsys) -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    said = README_EXPORT_SIZE.search(readme)
    assert said, "README.md no longer says what the walkthrough's export weighs"
    steps, mb, kb = int(said[1]), float(said[2]), int(said[3])
    out = tmp_path / "walkthrough.html"
    assert cli.main(["export", str(out)]) == 0   # the default workload: the walkthrough's story
    printed = capsys.readouterr().out
    data = out.read_bytes()
    size, zipped = len(data) / 1e6, len(gzip.compress(data, compresslevel=6)) / 1e3   # gzip's default level
    print(f"walkthrough export: {size:.2f} MB, {zipped:.0f} KB gzipped (README: {mb} MB, {kb} KB)")
    assert f"({size:.2f} MB, {steps} steps)" in printed, printed   # the CLI says the size and steps README gives
    assert abs(size / mb - 1) <= 0.10, f"README says {mb} MB, the export weighs {size:.2f} MB"
    assert abs(zipped / kb - 1) <= 0.10, f"README says {kb} KB gzipped, the export is {zipped:.0f} KB gzipped"


@pytest.mark.parametrize(("argv", "needle"), [
    (["--workload", "absent.json"], "error: workload: no such file"),
    (["--workload", "README.md"], "error: workload: expected a .json or .py file"),
])
def test_cli_export_bad_workload_is_one_line(tmp_path: Path, capsys, argv: list[str], needle: str) -> None:
    if argv[1] == "README.md":
        argv = ["--workload", str(Path(__file__).resolve().parents[2] / "README.md")]
    rc = cli.main(["export", str(tmp_path / "x.html"), *argv])
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and "Traceback" not in err


def test_help_names_export_and_app(capsys) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "export" in out and "app" in out
    for sub, needles in (("export", ["--workload", "--max-steps", "walkthrough"]),
                         ("app", ["--port", "127.0.0.1", "Voila"])):
        with pytest.raises(SystemExit):
            cli.main([sub, "--help"])
        text = capsys.readouterr().out
        assert all(n in text for n in needles), text


# -- app mode, without a server -----------------------------------------------------------------
def test_app_launch_binds_localhost_with_a_token_outside_argv(tmp_path: Path) -> None:
    nb = app.write_app_notebook("/models/x", {"num_kv_blocks": 48}, folder=tmp_path)
    cell = json.loads(nb.read_text())["cells"][0]["source"]
    assert "loading_dashboard(model='/models/x', config={'num_kv_blocks': 48})" in cell
    assert app.write_app_notebook("/models/x", {"num_kv_blocks": 48}, folder=tmp_path) == nb  # same settings, same file
    assert app.write_app_notebook(None, {}, folder=tmp_path) != nb
    launch = app.app_launch(nb, 8123, env={"PATH": "/bin", "JUPYTER_PATH": "/x"})
    assert "--Voila.ip=127.0.0.1" in launch.argv and "--port=8123" in launch.argv and "--token" in launch.argv
    assert "--Voila.port_retries=0" in launch.argv and "--template=kvscope" in launch.argv
    assert launch.token not in " ".join(launch.argv) and launch.env["JUPYTER_TOKEN"] == launch.token
    assert launch.url == f"http://127.0.0.1:8123/?token={launch.token}"
    root = Path(launch.env["JUPYTER_PATH"].split(":")[0])
    assert (root / "voila" / "templates" / "kvscope" / "conf.json").is_file()
    assert launch.env["JUPYTER_PATH"].endswith(":/x")


def test_loading_dashboard_outside_a_kernel_loop_builds_in_place(recorded) -> None:
    s, _ = recorded
    box = app.loading_dashboard(session_factory=lambda: s)
    try:
        assert box.session is s and box.children == (box.dashboard,)
        assert box.dashboard.controls.history_len == len(s.history)
    finally:
        box.dashboard.close_binding()

    def broken():
        raise ValueError("model: no such folder '/nowhere'")

    failed = app.loading_dashboard(session_factory=broken)
    assert "kvs-app-error" in failed.children[0].value and "no such folder" in failed.children[0].value


def test_app_without_a_model_folder_says_so(capsys, tmp_path: Path) -> None:
    rc = cli.main(["app", "--no-browser", "--model", str(tmp_path / "absent")])
    assert rc == 2 and "error: model: no such folder" in capsys.readouterr().err


def test_export_host_parses_as_a_module_and_fetches_nothing(assert_node_parses) -> None:
    source = export.HOST_JS.read_text()
    assert "fetch(" not in source and "XMLHttpRequest" not in source and "WebSocket" not in source
    assert not re.search(r"^\s*import\s", source, re.M)  # only the panels' own ESM, from blob: / data: URLs
    assert_node_parses(source, "export_host.mjs")
