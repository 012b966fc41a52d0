"""The Dashboard over a real Session: actions in, panel states out, errors inline."""
from __future__ import annotations

from array import array
from collections.abc import Iterator
from typing import Any

import ipywidgets as W
import pytest

from engine.config import SCHEDULER_KNOBS
from explorer import Dashboard
from explorer.ui import dashboard as dash_mod
from explorer.ui import views, why_view
from widgets import (
    AttentionPanel,
    BlockPoolPanel,
    ControlsPanel,
    LatencyPanel,
    Panel,
    QueuesPanel,
    SamplerPanel,
    SlotMappingPanel,
    TimelinePanel,
)

from .conftest import BASE_CONFIG, send


@pytest.fixture
def dash(fresh_session: Any) -> Iterator[Dashboard]:
    d = Dashboard(fresh_session)
    yield d
    d.close_binding()  # later tests' steps must not redraw this one


def _steps_shown(d: Dashboard) -> set[int]:
    panels = (d.controls, d.queues, d.blocks, d.slots, d.attention, d.sampler, d.timeline, d.latency)
    return {p.step for p in panels}


def test_dashboard_is_a_vbox_with_every_panel(dash: Dashboard) -> None:
    assert isinstance(dash, W.VBox) and "kvs-dashboard" in dash._dom_classes
    for name, cls in [("controls", ControlsPanel), ("queues", QueuesPanel), ("blocks", BlockPoolPanel),
                      ("slots", SlotMappingPanel), ("attention", AttentionPanel), ("sampler", SamplerPanel),
                      ("timeline", TimelinePanel), ("latency", LatencyPanel)]:
        assert isinstance(getattr(dash, name), cls)
    assert _steps_shown(dash) == {0}
    c = dash.controls
    assert c.history_len == 1 and c.view_index == -1 and not c.has_work and c.error == ""
    assert c.budget == {k: BASE_CONFIG[k] for k in SCHEDULER_KNOBS}
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
    (row,) = dash.latency.rows
    assert row["request_id"] == "0" and row["time_to_first_token"] > 0 and dash.latency.clock == "engine clock"
    assert "step 1" in dash.controls.info


def test_a_panel_sends_its_step_with_what_it_shows_of_that_step(dash: Dashboard) -> None:
    """One comm message per panel carries the new step and that step's content: a browser (or
    a test) that waits for data-step N never reads step N-1's cards under it."""
    sent: dict[str, list[dict]] = {}
    panels = dash.binder.panels
    for name, panel in panels.items():
        if isinstance(panel, Panel):
            panel._send = lambda msg, buffers=None, name=name: sent.setdefault(name, []).append(msg["state"])
    try:
        send(dash.controls, action="add", prompt="The capital of France is", max_tokens=3, temperature=0,
             top_k=0, top_p=1, ignore_eos=False, seed=None, seq="v:1")
        sent.clear()
        send(dash.controls, action="step", n=1)
    finally:
        for panel in panels.values():
            panel.__dict__.pop("_send", None)
    content = {"queues": "queues", "blocks": "counts", "slots": "slot_mapping", "timeline": "steps",
               "controls": "history_len"}
    for name, key in content.items():
        with_step = [state for state in sent[name] if "step" in state]
        assert len(with_step) == 1 and with_step[0]["step"] == 1, (name, sent[name])
        assert key in with_step[0], (name, sorted(with_step[0]))


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
    why = why_view.why_rows(dash.binder.why.ledger, e.step)   # requests admitted by then, with their why
    assert dash.queues.queues == views.queues_state(e.record, e.snapshot, why=why)["queues"]
    assert dash.slots.input_ids == e.record["batch"]["input_ids"]
    assert dash.blocks.status == views.block_pool_state(e.record, e.snapshot)["status"]
    assert dash.sampler.sample["step"] == 2
    # Attention shows the weights captured live at step 2 (its decode query, position 5),
    # not the live cache's latest step.
    assert dash.attention.probe_step == 2 and dash.attention.row_positions == [5] and dash.attention.probs
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
    assert dash.attention.message == "no request yet: add one and step"


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
    assert labels == ["prefill chunk 1: 32 tokens", "prefill chunk 2: 32 tokens", "prefill chunk 3: 16 tokens"]


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
    # The queues' choice cleared: the sampler follows the step again, attention keeps its request.
    default = views.sampler_state(s.history, s.current.snapshot, "", dash.binder.token_text)["request_id"]
    send(dash.sampler, action="select", request_id="1" if default == "0" else "0")
    send(dash.queues, action="select", request_id="")
    assert dash.attention.request_id == "1" and dash.sampler.sample["request_id"] == default


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


def test_attention_shows_only_the_step_it_says_and_says_when_a_step_was_not_captured(dash: Dashboard) -> None:
    s = dash.session
    s.add_request("The capital of France is", max_tokens=12, temperature=0.0, ignore_eos=True)
    send(dash.controls, action="step", n=1)        # probed live: step 1 captured
    send(dash.controls, action="step", n=4)        # a run probes once, at its end: step 5
    assert dash.attention.probe_step == 5 and dash.attention.row_positions == [8]
    live_probs = dash.attention.probs
    for index, step, query in ((1, 1, [0, 1, 2, 3, 4]), (5, 5, [8])):
        send(dash.controls, action="scrub", index=index)
        assert dash.attention.probe_step == step and dash.attention.row_positions == query
    send(dash.controls, action="scrub", index=3)   # inside the run: never probed
    att = dash.attention
    assert att.step == 3 and att.probs == b"" and att.probe_step == -1
    assert att.message.startswith("weights for step 3 not captured") and "step live to capture" in att.message
    send(dash.attention, action="refresh")         # a probe now would read step 5's cache: refused
    assert att.probs == b"" and "step 3 not captured" in att.message
    send(dash.attention, action="select", head=3)  # only the heads captured at that step
    send(dash.controls, action="scrub", index=1)
    assert att.probe_step == 1 and att.head == 3 and att.thumb_heads == [0, 1, 2, 3]
    send(dash.controls, action="scrub", index=0)   # before its prefill: the chosen request had no KV
    assert att.probs == b"" and att.message == "#0 holds no KV at step 0: it was waiting, its prompt not computed yet"
    send(dash.controls, action="live")
    assert att.probe_step == 5 and att.head == 3 and att.probs != live_probs  # head 3 now


def test_attention_with_only_finished_requests_says_they_finished(dash: Dashboard) -> None:
    s = dash.session
    s.add_request("Hello", max_tokens=2, temperature=0.0)
    send(dash.controls, action="step", n=5)
    assert not s.engine.has_unfinished_requests()
    msg = dash.attention.message
    assert "no running request" not in msg and "the request has finished" in msg and "freed" in msg


def test_panels_of_one_dashboard_share_a_link_group_and_a_still_is_frozen(fresh_session: Any) -> None:
    s = fresh_session
    a, b = Dashboard(s), Dashboard(s)
    try:
        groups = {name: p.link_group for name, p in a.binder.panels.items() if hasattr(p, "link_group")}
        assert len(set(groups.values())) == 1 and next(iter(groups.values())).startswith("kvs-")
        assert b.queues.link_group != a.queues.link_group  # another dashboard lights up on its own
        # The pool and the slots sit side by side.
        (pair,) = [c for c in a.children if isinstance(c, W.HBox) and a.blocks in c.children]
        assert list(pair.children) == [a.blocks, a.slots]
        s.add_request("Hello there", max_tokens=3, temperature=0.0)
        s.step(1)
        b.close_binding()  # b is now a still: frozen, and deaf to clicks
        assert all(p.frozen for p in b.binder.panels.values() if hasattr(p, "frozen"))
        assert not any(p.frozen for p in a.binder.panels.values() if hasattr(p, "frozen"))
        send(b.queues, action="select", request_id="0")
        send(b.blocks, action="select_block", block_id=1)
        send(b.attention, action="select", head=2)
        assert (b.queues.selected, b.blocks.selected, b.attention.head) == ("", -1, 0)
        send(b.blocks, action="block_detail", block_id=1)   # hover look-ups still answer
        assert b.blocks.detail["block_id"] == 1 and b.blocks.detail["owners"] == ["0"]
        send(a.queues, action="select", request_id="0")     # the live one still listens
        assert a.queues.selected == "0" and b.queues.selected == ""
    finally:
        a.close_binding()


# -- a learner understands each step at a glance (issue 18) ---------------------------------------
def test_scrubbed_knobs_show_the_budgets_the_shown_step_ran_under(dash: Dashboard) -> None:
    s = dash.session
    s.add_request(list(range(1000, 1100)), max_tokens=2, temperature=0.0)
    send(dash.controls, action="set_budget", max_num_batched_tokens=32)
    send(dash.controls, action="step", n=1)
    send(dash.controls, action="set_budget", max_num_batched_tokens=16, enable_prefix_caching=False)
    send(dash.controls, action="step", n=1)
    assert s.history[1].record["budgets"] == {**{k: BASE_CONFIG[k] for k in SCHEDULER_KNOBS},
                                              "max_num_batched_tokens": 32}
    send(dash.controls, action="scrub", index=1)
    assert dash.controls.budget["max_num_batched_tokens"] == 32 and dash.controls.budget["enable_prefix_caching"]
    assert dash.controls.caption.startswith(
        "#0 prefill 32 of 100 prompt tokens (chunked: token budget 32)")
    send(dash.controls, action="live")
    assert dash.controls.budget["max_num_batched_tokens"] == 16 and not dash.controls.budget["enable_prefix_caching"]
    assert dash.controls.caption.startswith("#0 prefill tokens 33-48 of 100 (chunk 2; chunked: token budget 16)")


def test_every_step_has_its_caption_in_the_controls_and_the_timeline(dash: Dashboard) -> None:
    from explorer.ui.captions import history_captions

    assert dash.controls.caption == "no steps yet: add a request and press Step"
    s = dash.session
    s.add_request("The capital of France is", max_tokens=2, temperature=0.0)
    s.step(2)
    captions = history_captions(s.history)
    assert dash.timeline.steps["caption"] == captions[1:]
    assert dash.controls.caption == captions[2] and "#0 finished (max_tokens=2 reached)" in captions[2]
    send(dash.timeline, action="scrub_step", step=1)
    assert dash.controls.caption == captions[1] and captions[1].startswith("#0 prefill all 5 prompt tokens")


def test_step_with_nothing_to_do_says_so_instead_of_doing_nothing(dash: Dashboard) -> None:
    send(dash.controls, action="step", n=1)
    assert dash.controls.notice == dash_mod.NOTHING_TO_STEP and "add a request" in dash.controls.notice
    assert dash.controls.error == "" and len(dash.session.history) == 1
    send(dash.controls, action="add", prompt="Hi", max_tokens=1, temperature=0)
    assert dash.controls.notice == ""
    send(dash.controls, action="step", n=5)  # runs the one step there is: no notice
    assert dash.controls.notice == "" and len(dash.session.history) == 2
    send(dash.controls, action="step", n=5)
    assert dash.controls.notice == dash_mod.NOTHING_TO_STEP


@pytest.mark.parametrize("content, field", [
    ({"action": "add", "prompt": ""}, "prompt"),
    ({"action": "add", "prompt": "Hi", "top_p": 1.5}, "top_p"),
    ({"action": "add", "prompt": "Hi", "max_tokens": "lots"}, "max_tokens"),
    ({"action": "add", "prompt": "Hi", "seed": -1}, "seed"),
    ({"action": "add", "prompt": [10**7]}, "prompt"),
    ({"action": "set_budget", "max_num_seqs": 0}, "max_num_seqs"),
    ({"action": "reset", "num_kv_blocks": 1}, "num_kv_blocks"),
    ({"action": "step", "n": 0}, "n"),
])
def test_the_input_an_error_is_about_is_named_for_its_outline(dash: Dashboard, content: dict, field: str) -> None:
    send(dash.controls, **content)
    assert dash.controls.error and dash.controls.error_field == field
    send(dash.controls, action="clear_error")
    assert dash.controls.error == dash.controls.error_field == ""


def test_error_field_picks_the_earliest_field_the_message_names() -> None:
    assert dash_mod.error_field("add", "prompt (5000 tokens) is longer than max_model_len=4096") == "prompt"
    assert dash_mod.error_field("add", "max_tokens must be an integer >= 1, got 0") == "max_tokens"
    assert dash_mod.error_field("add", "token id 5 at index 0 is outside the vocabulary") == "prompt"
    assert dash_mod.error_field("set_budget", "max_num_batched_tokens must be an integer >= 1") == \
        "max_num_batched_tokens"
    assert dash_mod.error_field("step", "n must be an integer >= 1, got 0") == "n"
    assert dash_mod.error_field("abort", "request_id 'x' does not exist") == ""


def test_the_chat_template_switch_wraps_the_prompt_as_one_user_turn(dash: Dashboard) -> None:
    s = dash.session
    assert dash.controls.chat_template_available  # Qwen's tokenizer carries one
    send(dash.controls, action="add", prompt="What is a KV cache?", max_tokens=2, temperature=0, chat_template=True)
    send(dash.controls, action="add", prompt="What is a KV cache?", max_tokens=2, temperature=0, chat_template=False)
    templated, plain = (r["prompt_text"] for r in s.current.snapshot["queues"]["waiting"])
    expected = s.engine.tokenizer.apply_chat_template([{"role": "user", "content": "What is a KV cache?"}],
                                                      tokenize=False, add_generation_prompt=True)
    assert templated == expected and "<|im_start|>user\nWhat is a KV cache?<|im_end|>" in templated
    assert plain == "What is a KV cache?"
    send(dash.controls, action="add", prompt="", chat_template=True)  # the engine's own message, unchanged
    assert "prompt must not be empty" in dash.controls.error and dash.controls.error_field == "prompt"


def test_the_latency_panel_follows_the_shown_step_on_the_engine_clock(dash: Dashboard) -> None:
    lat = dash.latency
    assert lat.rows == [] and lat.clock == "engine clock" and "only while a step executes" in lat.clock_note
    dash.session.add_request("Hi there", max_tokens=3, temperature=0.0,
                             request_id="a-very-long-request-id-from-a-script")
    dash.session.step(3)
    (row,) = lat.rows
    assert row["request_id"] == "a-very-long-request-id-from-a-script" and len(row["inter_token_latency"]) == 2
    send(dash.controls, action="scrub", index=1)  # step 1: the first token, no gap yet
    assert lat.step == 1 and lat.rows[0]["inter_token_latency"] == [] and lat.rows[0]["time_to_first_token"]


def test_presets_follow_the_chat_template_switch_and_say_that_they_stepped(dash: Dashboard) -> None:
    s = dash.session
    send(dash.controls, action="preset", name="shared_prefix", max_tokens=4, temperature=0, chat_template=True)
    assert dash.controls.error == ""
    reqs = {r["request_id"]: r for r in views.all_requests(s.current.snapshot)}
    first, second = reqs["0"]["prompt_text"], reqs["1"]["prompt_text"]
    assert first.startswith("<|im_start|>system\n") and "<|im_start|>user\nQuestion: the capital of France?" in first
    assert "capital of Italy?" in second and second.endswith("<|im_start|>assistant\n")
    stepped = s.current.step
    assert stepped >= 1
    note = dash.controls.notice
    assert f"ran {stepped} step" in note and "by itself" in note and "#1" in note, note
    send(dash.controls, action="step", n=1)
    assert s.current.record["blocks"]["hits"], "the templated pair still shares its system turn's blocks"
    send(dash.controls, action="preset", name="burst", n=3, max_tokens=2, temperature=0, chat_template=True)
    waiting = s.current.snapshot["queues"]["waiting"]
    assert len(waiting) == 3
    assert all(r["prompt_text"].startswith("<|im_start|>user\nWrite a long story") for r in waiting)
    assert "no step run" in dash.controls.notice
    send(dash.controls, action="preset", name="burst", n=1, max_tokens=2, temperature=0, chat_template=False)
    assert s.current.snapshot["queues"]["waiting"][-1]["prompt_text"].startswith("Write a long story")


def test_an_empty_required_field_is_an_error_naming_it_not_a_default(dash: Dashboard) -> None:
    s = dash.session
    send(dash.controls, action="add", prompt="Hi", max_tokens="", temperature=0, top_k=0, top_p=1)
    assert "max_tokens is empty" in dash.controls.error and dash.controls.error_field == "max_tokens"
    assert views.all_requests(s.current.snapshot) == []
    send(dash.controls, action="preset", name="burst", n=2, max_tokens="", temperature=0)
    assert dash.controls.error_field == "max_tokens" and views.all_requests(s.current.snapshot) == []
    send(dash.controls, action="add", prompt="Hi", max_tokens=2, temperature="  ")
    assert "temperature is empty" in dash.controls.error and dash.controls.error_field == "temperature"
    send(dash.controls, action="add", prompt="Hi", max_tokens=2, temperature=0)
    assert dash.controls.error == "" and len(views.all_requests(s.current.snapshot)) == 1
    assert dash.controls.engine == "kvscope"


def test_attention_at_a_preemption_step_says_the_request_was_preempted_then(dash: Dashboard) -> None:
    """Pinned to a request preempted in the shown step, the attention panel says so, with the
    tokens it had computed (the previous step's count), never that its prompt was not computed."""
    s = dash.session
    s.reset(num_kv_blocks=12, block_size=16, max_num_batched_tokens=64)
    for i in range(4):   # four 40-token prompts that grow past the 11 usable blocks together
        s.add_request([300 + 9 * i + k for k in range(40)], max_tokens=30, temperature=0.0, ignore_eos=True)
    send(dash.controls, action="step", n=40)
    index = next(i for i, e in enumerate(s.history) if e.record and e.record["preempted"])
    rid = s.history[index].record["preempted"][0]
    had = next(r["num_computed_tokens"] for r in s.history[index - 1].snapshot["queues"]["running"]
               if r["request_id"] == rid)
    send(dash.queues, action="select", request_id=rid)
    send(dash.controls, action="scrub", index=index)
    step = s.history[index].step
    assert dash.attention.probs == b"" and dash.attention.message.startswith(
        f"#{rid} holds no KV at step {step}: it was preempted in this step, its {had} computed tokens freed")
    after = next(r for r in views.all_requests(s.history[index + 1].snapshot) if r["request_id"] == rid)
    if not after["num_computed_tokens"] and rid not in s.history[index + 1].record["preempted"]:
        send(dash.controls, action="scrub", index=index + 1)   # still waiting a step later
        assert "it was preempted earlier (its KV freed) and waits to be re-admitted" in dash.attention.message
