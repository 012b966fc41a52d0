"""Panels on their own: message handling, acks, and the Python side of each state."""
from __future__ import annotations

from array import array

import pytest

import widgets
from explorer.ui import views
from widgets.attention import _thin

from .conftest import send


def test_every_action_with_a_seq_is_acknowledged_even_when_a_handler_fails() -> None:
    panel = widgets.QueuesPanel()
    seen: list[dict] = []
    panel.on_action(seen.append)
    assert send(panel, action="select", request_id="7", seq="v1:3") == {"type": "ack", "seq": "v1:3", "error": None}
    assert panel.selected == "7" and seen[-1]["request_id"] == "7"

    def broken(_content: dict) -> None:
        raise RuntimeError("boom")

    panel.on_action(broken)
    ack = send(panel, action="abort", request_id="7", seq="v1:4")
    assert ack["seq"] == "v1:4" and "boom" in ack["error"]  # the browser is never left waiting


def test_messages_without_an_action_are_ignored() -> None:
    panel = widgets.ControlsPanel()
    seen: list[dict] = []
    panel.on_action(seen.append)
    assert send(panel, something="else") is None
    assert seen == []


def test_unsubscribed_handlers_hear_nothing() -> None:
    panel = widgets.SamplerPanel()
    seen: list[dict] = []
    off = panel.on_action(seen.append)
    off()
    send(panel, action="select", request_id="1")
    assert seen == [] and panel.request_id == "1"


def test_controls_clear_error_is_handled_in_the_panel() -> None:
    panel = widgets.ControlsPanel(error="prompt must not be empty")
    seen: list[dict] = []
    panel.on_action(seen.append)
    send(panel, action="clear_error")
    assert panel.error == "" and seen == []


def test_block_detail_comes_from_the_displayed_snapshot(fresh_session) -> None:
    s = fresh_session
    s.add_request("The capital of France is a city with a long and famous history", max_tokens=2, temperature=0.0)
    s.step(1)
    e = s.current
    texts = views.token_texts(s.engine.tokenizer)
    panel = widgets.BlockPoolPanel(token_text=texts)
    panel.show(views.block_pool_state(e.record, e.snapshot))
    block = e.snapshot["queues"]["running"][0]["block_table"][0]
    send(panel, action="block_detail", block_id=block)
    d = panel.detail
    assert d["block_id"] == block and d["owners"] == ["0"] and d["ref_count"] == 1
    assert d["token_ids"] == e.snapshot["block_pool"]["blocks"][block]["token_ids"]
    assert d["tokens"] == texts(d["token_ids"]) and "".join(d["tokens"]).startswith("The capital")
    assert panel.selected == -1  # hovering does not pin
    send(panel, action="select_block", block_id=0)
    assert panel.selected == 0 and panel.detail["is_null"] and panel.detail["token_ids"] == []
    send(panel, action="block_detail", block_id=10_000)
    assert panel.detail == {}


def test_block_pool_state_is_compact_at_4096_blocks(fresh_session) -> None:
    s = fresh_session
    s.reset(num_kv_blocks=4096)
    s.add_request("Hello there", max_tokens=2, temperature=0.0)
    s.step(1)
    e = s.current
    state = views.block_pool_state(e.record, e.snapshot)
    panel = widgets.BlockPoolPanel()
    panel.show(state)
    assert panel.num_blocks == 4096
    # One byte of status and events, two of refcount and owner per block: ~24 KiB in all.
    assert (len(panel.status), len(panel.events), len(panel.ref_count), len(panel.owner)) == (4096, 4096, 8192, 8192)
    assert "blocks" not in panel.trait_names() and len(panel._blocks) == 4096
    assert list(array("B", panel.status)).count(1) == e.snapshot["block_pool"]["num_free_blocks"]


def test_attention_panel_shows_the_chosen_head_as_float32_rows(fresh_session) -> None:
    s = fresh_session
    s.add_request("The capital of France is a city", max_tokens=2, temperature=0.0)
    s.step(1)
    probe = s.probe("0", layer=1, head=None)
    panel = widgets.AttentionPanel(head=3)
    panel.show_probe(probe, step=1)
    n = probe["context_len"]
    flat = list(array("f", panel.probs))
    assert len(flat) == len(probe["query_positions"]) * n
    assert flat[-n:] == pytest.approx(probe["probs"][3][-1], rel=1e-6)
    assert panel.kv_head_of_head == probe["kv_head_of_head"] == [0, 0, 1, 1]
    assert panel.block_table == probe["block_table"] and panel.tokens == probe["tokens"]
    assert panel.layer == 1 and panel.request_id == "0" and panel.probe_step == 1
    # A single-head probe keeps the full GQA map it already had.
    panel.show_probe(s.probe("0", layer=0, head=2), step=1)
    assert panel.head == 2 and panel.kv_head_of_head == [0, 0, 1, 1]
    panel.clear("request finished")
    assert panel.probs == b"" and panel.message == "request finished"


def test_attention_thumbnails_are_one_small_picture_per_head_each_scaled_to_its_max(fresh_session) -> None:
    s = fresh_session
    s.add_request(list(range(1000, 1070)), max_tokens=2, temperature=0.0)  # 70 keys, 70 queries
    s.step(1)
    panel = widgets.AttentionPanel()
    panel.show_probe(s.probe("0", layer=0, head=None), step=1)
    th, tw = panel.thumb_shape
    assert (th, tw) == (24, 48) and panel.thumb_heads == [0, 1, 2, 3]
    pics = [panel.thumbs[k * th * tw:(k + 1) * th * tw] for k in range(4)]
    assert len(panel.thumbs) == 4 * th * tw and all(max(p) == 255 for p in pics)
    assert len({bytes(p) for p in pics}) == 4  # four heads, four different pictures
    # The causal mask: the top right of each thumbnail (early queries, late keys) is empty.
    assert all(p[tw - 1] == 0 for p in pics)
    panel.show_probe(s.probe("0", layer=0, head=1), step=1)  # one head: nothing to pick from
    assert panel.thumbs == b"" and panel.thumb_heads == [] and panel.head == 1


def test_attention_thins_long_contexts_to_max_rows_keeping_the_last() -> None:
    assert _thin(5, 10) == [0, 1, 2, 3, 4]
    rows = _thin(1000, 256)
    assert len(rows) == 256 and rows[0] == 0 and rows[-1] == 999 and rows == sorted(set(rows))


def test_attention_select_updates_its_own_traits_and_reaches_the_dashboard() -> None:
    panel = widgets.AttentionPanel()
    seen: list[dict] = []
    panel.on_action(seen.append)
    send(panel, action="select", layer=1, head=3)
    assert (panel.layer, panel.head) == (1, 3) and seen[-1]["action"] == "select"


def test_latency_panel_takes_rows_and_says_its_clock(fresh_session) -> None:
    s = fresh_session
    s.add_request("Hello", max_tokens=3, temperature=0.0, ignore_eos=True)
    s.step(3)
    panel = widgets.LatencyPanel()
    panel.show(views.latency_state(s.current.snapshot))
    (row,) = panel.rows
    assert row["time_to_first_token"] > 0 and len(row["inter_token_latency"]) == 2
    assert panel.clock == "engine clock" and "only while a step executes" in panel.clock_note
    # A live server's snapshot (its model info says `live`) is read on the server's own clock.
    live = {**s.current.snapshot, "model_info": {**s.current.snapshot["model_info"], "live": True}}
    state = views.latency_state(live)
    assert state["clock"] == "server clock" and "request times" in state["clock_note"]
    assert state["rows"] == views.latency_rows(s.current.snapshot, "wall") != panel.rows
