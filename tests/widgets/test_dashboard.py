"""The Dashboard over a real Session: actions in, panel states out, errors inline."""
from __future__ import annotations

from array import array
from typing import Any, Iterator

import ipywidgets as W
import pytest

from explorer import Dashboard, views
from explorer import dashboard as dash_mod
from widgets import (AttentionPanel, BlockPoolPanel, ControlsPanel, QueuesPanel, SamplerPanel,
                     SlotMappingPanel, TimelinePanel)

from .conftest import BASE_CONFIG, send


@pytest.fixture
def dash(fresh_session: Any) -> Iterator[Dashboard]:
    d = Dashboard(fresh_session)
    yield d
    d.close_binding()  # later tests' steps must not redraw this one


def _steps_shown(d: Dashboard) -> set[int]:
    panels = (d.controls, d.queues, d.blocks, d.slots, d.attention, d.sampler, d.timeline)
    return {p.step for p in panels} | {d.latency.step}


def test_dashboard_is_a_vbox_with_every_panel(dash: Dashboard) -> None:
    assert isinstance(dash, W.VBox) and "kvs-dashboard" in dash._dom_classes
    for name, cls in [("controls", ControlsPanel), ("queues", QueuesPanel), ("blocks", BlockPoolPanel),
                      ("slots", SlotMappingPanel), ("attention", AttentionPanel), ("sampler", SamplerPanel),
                      ("timeline", TimelinePanel)]:
        assert isinstance(getattr(dash, name), cls)
    assert dash.latency.figure is not None
    assert _steps_shown(dash) == {0}
    c = dash.controls
    assert c.history_len == 1 and c.view_index == -1 and not c.has_work and c.error == ""
    assert c.budget == {k: BASE_CONFIG[k] for k in dash_mod.BUDGET_KEYS}
    assert c.pool == {"num_kv_blocks": 48, "block_size": 16}
    assert dash.blocks.num_blocks == 48


def test_add_then_step_updates_every_panel(dash: Dashboard) -> None:
    s = dash.session
    ack = send(dash.controls, action="add", prompt="The capital of France is", max_tokens=3, temperature=0,
               top_k=0, top_p=1, ignore_eos=False, seed=None, seq="v:1")
    assert ack == {"type": "ack", "seq": "v:1", "error": None}
    assert [r["request_id"] for r in dash.queues.queues["waiting"]] == ["0"]
    assert dash.controls.has_work
    send(dash.controls, action="step", n=1)
    rec = s.current.record
    assert _steps_shown(dash) == {1} and dash.controls.history_len == 2
    running = dash.queues.queues["running"]
    assert running[0]["scheduled"]["is_prefill"] and running[0]["num_computed_tokens"] == 5
    status = list(array("B", dash.blocks.status))
    assert status[1] == 3 and dash.blocks.counts["allocated"] == 1  # block 1: the first block handed out
    assert dash.slots.input_ids == rec["batch"]["input_ids"] == [785, 6722, 315, 9625, 374]
    assert dash.slots.logits_indices == [4]
    assert dash.sampler.sample["token_id"] == rec["sampled"]["0"]["token_id"]
    assert dash.timeline.steps["prefill"] == [5]
    assert dash.attention.request_id == "0" and dash.attention.context_len == 5 and dash.attention.probs
    assert dash.attention.kv_head_of_head == [0, 0, 1, 1] and dash.attention.num_layers == 2
    assert "1 with a first token" in dash.latency.header.value
    assert "step 1" in dash.controls.info


def test_run_n_and_rapid_clicks_each_run_in_order(dash: Dashboard) -> None:
    s = dash.session
    s.add_request("Hello", max_tokens=20, temperature=0.0, ignore_eos=True)
    acks = [send(dash.controls, action="step", n=1, seq=f"v:{i}") for i in range(3)]
    assert [a["seq"] for a in acks] == ["v:0", "v:1", "v:2"]
    assert len(s.history) == 4 and dash.controls.step == 3
    send(dash.controls, action="step", n=5)
    assert len(s.history) == 9 and _steps_shown(dash) == {8}
    assert dash.attention.probe_step == 8  # probed once the run ended
    assert not dash.controls.busy


def test_bad_input_is_shown_inline_and_the_session_keeps_working(dash: Dashboard) -> None:
    s = dash.session
    send(dash.controls, action="add", prompt="", max_tokens=3)
    assert "prompt" in dash.controls.error
    send(dash.controls, action="add", prompt="Hi", top_p=1.5)
    assert "top_p" in dash.controls.error
    send(dash.controls, action="add", prompt="Hi", max_tokens="lots")
    assert "max_tokens" in dash.controls.error
    send(dash.controls, action="set_budget", max_num_batched_tokens=0)
    assert "max_num_batched_tokens" in dash.controls.error
    send(dash.controls, action="step", n=0)
    assert "n must be" in dash.controls.error
    send(dash.controls, action="reset", num_kv_blocks=1)
    assert "num_kv_blocks" in dash.controls.error
    assert s.engine.config.num_kv_blocks == 48  # the failed reset kept the engine
    # ... and everything still works, the error line clears on the next good action.
    send(dash.controls, action="add", prompt="Hi there", max_tokens=2, temperature=0)
    assert dash.controls.error == ""
    send(dash.controls, action="step", n=2)
    assert dash.queues.queues["finished"][0]["finish_reason"] == "length"
    assert dash.controls.step == 2


def test_an_engine_error_raised_outside_the_dashboard_shows_too(dash: Dashboard) -> None:
    with pytest.raises(ValueError):
        dash.session.add_request("", max_tokens=2)
    assert "prompt" in dash.controls.error


def test_budget_knobs_apply_live(dash: Dashboard) -> None:
    send(dash.controls, action="set_budget", max_num_batched_tokens=16, scheduling_policy="prefill_first")
    assert dash.session.engine.config.max_num_batched_tokens == 16
    assert dash.controls.budget["max_num_batched_tokens"] == 16
    assert dash.controls.budget["scheduling_policy"] == "prefill_first"
    send(dash.controls, action="set_budget", enable_prefix_caching=False)
    assert dash.controls.budget["enable_prefix_caching"] is False
    send(dash.controls, action="set_budget", scheduler_reserve_full_isl=False)   # the "reserve whole sequence" box
    assert dash.controls.budget["scheduler_reserve_full_isl"] is False
    assert dash.session.engine.config.scheduler_reserve_full_isl is False


def test_scrubbing_moves_every_panel_and_live_returns(dash: Dashboard) -> None:
    s = dash.session
    s.add_request("The capital of France is", max_tokens=6, temperature=0.0)
    s.step(4)
    send(dash.controls, action="scrub", index=2)
    e = s.history[2]
    assert _steps_shown(dash) == {2}
    assert not dash.queues.live and dash.controls.view_index == 2
    assert dash.queues.queues == views.queues_state(e.record, e.snapshot)["queues"]
    assert dash.slots.input_ids == e.record["batch"]["input_ids"]
    assert dash.blocks.status == views.block_pool_state(e.record, e.snapshot)["status"]
    assert dash.sampler.sample["step"] == 2
    assert "history step 2" in dash.attention.message
    # A step made meanwhile (e.g. from a notebook cell) only grows the slider.
    s.step(1)
    assert dash.controls.history_len == 6 and dash.queues.step == 2
    send(dash.timeline, action="scrub_step", step=1)
    assert _steps_shown(dash) == {1}
    send(dash.controls, action="live")
    assert _steps_shown(dash) == {5} and dash.queues.live and dash.controls.view_index == -1
    # Scrubbing to the last entry is live; a Step while scrubbed returns to live.
    send(dash.controls, action="scrub", index=0)
    assert _steps_shown(dash) == {0}
    send(dash.controls, action="step", n=1)
    assert dash.controls.view_index == -1 and dash.queues.step == 6


def test_reset_from_the_controls_starts_a_new_engine(dash: Dashboard) -> None:
    s = dash.session
    s.add_request("Hello", max_tokens=2)
    s.step(1)
    send(dash.controls, action="reset", num_kv_blocks=20, block_size=None)
    assert s.engine.config.num_kv_blocks == 20 and len(s.history) == 1
    assert _steps_shown(dash) == {0}
    assert dash.blocks.num_blocks == 20 and dash.controls.pool["num_kv_blocks"] == 20
    assert dash.queues.queues == {"waiting": [], "running": [], "finished": []}
    assert dash.timeline.steps["step"] == []
    assert "no running request" in dash.attention.message


def test_shared_prefix_preset_shows_prefix_cache_hits(dash: Dashboard) -> None:
    s = dash.session
    send(dash.controls, action="preset", name="shared_prefix", max_tokens=4)
    assert dash.controls.error == ""
    send(dash.controls, action="step", n=1)
    rec = s.current.record
    assert rec["blocks"]["hits"], "the second request reuses the first one's full prefix blocks"
    events = list(array("B", dash.blocks.events))
    assert all(events[b] & 2 for b in rec["blocks"]["hits"]) and dash.blocks.counts["hits"] > 0
    second = next(r for r in dash.queues.queues["running"] if r["request_id"] == "1")
    assert second["num_cached_tokens"] >= 16
    assert "prefix hits" in dash.controls.info


def test_long_prompt_preset_is_prefilled_in_chunks(dash: Dashboard) -> None:
    send(dash.controls, action="set_budget", max_num_batched_tokens=32)
    send(dash.controls, action="preset", name="long_prompt", max_tokens=2)
    (req,) = dash.queues.queues["waiting"]
    assert req["num_prompt_tokens"] == 80  # 2.5 x the token budget
    for chunk in range(3):
        send(dash.controls, action="step", n=1)
        (row,) = dash.queues.queues["running"]
        assert row["scheduled"]["is_prefill"] and row["scheduled"]["chunk_index"] == chunk
    assert [g["chunk_index"] for g in dash.slots.segments] == [2]
    labels = [seg[4] for seg in dash.timeline.gantt["segments"] if seg[3] == "prefill"]
    assert labels == ["prefill chunk 0: 32 tokens", "prefill chunk 1: 32 tokens", "prefill chunk 2: 16 tokens"]


def test_burst_preset_with_a_small_pool_shows_preemption(dash: Dashboard) -> None:
    send(dash.controls, action="reset", num_kv_blocks=16)
    send(dash.controls, action="preset", name="burst", n=6, max_tokens=40)
    assert len(dash.queues.queues["waiting"]) == 6
    send(dash.controls, action="step", n=200)
    assert not dash.controls.has_work and dash.controls.error == ""
    finished = dash.queues.queues["finished"]
    assert len(finished) == 6 and sum(r["num_preemptions"] for r in finished) > 0
    assert sum(dash.timeline.steps["preempted"]) > 0
    assert any(seg[3] == "preempted" for seg in dash.timeline.gantt["segments"])


def test_abort_from_the_queues_panel(dash: Dashboard) -> None:
    s = dash.session
    s.add_request("Hello", max_tokens=50, temperature=0.0)
    s.step(1)
    send(dash.queues, action="abort", request_id="0")
    (row,) = dash.queues.queues["finished"]
    assert row["finish_reason"] == "abort"
    assert dash.blocks.counts["in_use"] == 0
    send(dash.queues, action="abort", request_id="nope")
    assert "nope" in dash.controls.error


def test_selecting_a_request_points_sampler_and_attention_at_it(dash: Dashboard) -> None:
    s = dash.session
    s.add_request("The capital of France is", max_tokens=30, temperature=0.0)
    s.add_request("Hello there, how are you?", max_tokens=30, temperature=0.5, seed=7)
    s.step(2)
    send(dash.queues, action="select", request_id="1")
    assert dash.sampler.request_id == "1" and dash.sampler.sample["params"]["seed"] == 7
    assert dash.attention.request_id == "1"
    send(dash.attention, action="select", layer=1, head=3)
    assert (dash.attention.layer, dash.attention.head) == (1, 3) and dash.attention.context_len > 0
    s.step(1)  # the choices stick across steps
    assert dash.sampler.sample["request_id"] == "1" and dash.attention.request_id == "1"
    assert dash.attention.probe_step == 3
    send(dash.sampler, action="select", request_id="0")
    assert dash.sampler.sample["request_id"] == "0"


def test_attention_of_a_finished_request_says_why_it_is_empty(dash: Dashboard) -> None:
    s = dash.session
    s.add_request("Hello", max_tokens=2, temperature=0.0)
    s.add_request("Hello there friend", max_tokens=30, temperature=0.0)
    s.step(1)
    send(dash.attention, action="select", request_id="0")
    s.step(2)  # request 0 has finished, its blocks are back in the pool
    assert dash.attention.probs == b"" and "finished" in dash.attention.message
    send(dash.attention, action="refresh")
    assert "finished" in dash.attention.message


def test_standalone_panels_follow_the_session_and_scrub_together(fresh_session: Any) -> None:
    s = fresh_session
    queues = dash_mod.queues_panel(s)
    controls = dash_mod.controls_panel(s)
    assert isinstance(queues, QueuesPanel) and dash_mod.queues_panel(s) is queues
    assert queues.binder is controls.binder
    send(controls, action="add", prompt="Hello", max_tokens=3, temperature=0)
    send(controls, action="step", n=2)
    assert queues.step == 2 and queues.queues["running"][0]["num_output_tokens"] == 2
    send(controls, action="scrub", index=1)
    assert queues.step == 1 and not queues.live
    blocks = dash_mod.block_pool_panel(s)
    assert blocks.step == 1  # joins the shared view
    send(controls, action="live")
    queues.binder.close()


def test_unknown_panel_and_preset_names_are_errors(dash: Dashboard) -> None:
    with pytest.raises(ValueError, match="unknown panel"):
        dash_mod.panel(dash.session, "nope")
    send(dash.controls, action="preset", name="nope")
    assert "unknown preset" in dash.controls.error


def test_a_closed_binder_ignores_clicks_on_its_frozen_panels(fresh_session: Any) -> None:
    s = fresh_session
    frozen = dash_mod.SessionBinder(s, ("controls", "queues"))
    frozen.close()
    send(frozen.panels["controls"], action="add", prompt="Hello", max_tokens=2, temperature=0)
    send(frozen.panels["controls"], action="step", n=1)
    assert s.engine.step_count == 0 and not s.engine.requests   # the live session was not touched
