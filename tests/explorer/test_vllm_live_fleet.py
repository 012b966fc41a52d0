"""A fleet of engine cores in one notebook: two vLLM schedulers (two replicas) with kvscope's
recorder in this process, without a model (tests/oracle/vllm_side.py), followed by one
Session.attach of both feeds; where each request went and what its routing cost it; the
Fleet panel's JavaScript and the Dashboard of a fleet (the real data-parallel server:
test_vllm_live_dp.py; in a browser: tests/e2e/test_fleet_browser.py)."""
from __future__ import annotations

import re
import time

import pytest

from tests.oracle.vllm_available import require_vllm

BLOCK = 4
PROMPT = tuple(range(1, 42))   # 41 tokens: 10 full blocks a later request can hit


@pytest.fixture
def replicas(monkeypatch):
    """Two vLLM schedulers, each with its recorder on its own feed, and a Fleet of both."""
    require_vllm()
    from explorer import Session
    from explorer.drivers.vllm_live import protocol
    from explorer.drivers.vllm_live.recorder import RecordingScheduler
    from explorer.drivers.vllm_live.server import free_port_run
    from tests.oracle.vllm_side import VllmScheduler
    from tests.oracle.workloads import Workload

    w = Workload(block_size=BLOCK, num_blocks=64, max_num_batched_tokens=256, max_num_seqs=4, max_model_len=128,
                 enable_prefix_caching=True, enable_chunked_prefill=True, scheduler_reserve_full_isl=True)
    sides, feeds = [], []
    for _ in range(2):
        base = free_port_run(2)
        feeds.append(f"tcp://127.0.0.1:{base}")
        monkeypatch.setenv(protocol.ENV_FEED, feeds[-1])
        monkeypatch.delenv(protocol.ENV_SNAPSHOT, raising=False)
        sides.append(VllmScheduler(w, RecordingScheduler))
    fleet = Session.attach(feeds)
    try:
        for side in sides:
            pub = side.scheduler._rec.publisher
            while not pub.subscribers:
                pub.wake.set()
                time.sleep(0.005)
        yield sides, fleet
    finally:
        fleet.close()
        for side in sides:
            side.scheduler.shutdown()


def _serve(side, rid: str, prompt: tuple, max_tokens: int = 3) -> None:
    from tests.oracle.workloads import OracleRequest

    side.add(OracleRequest(rid, prompt, max_tokens, 0))
    while side.scheduler.has_requests():
        side.step()


def test_a_request_routed_away_from_its_cached_prefix_shows_the_tokens_it_lost(replicas):
    from explorer.core.fleet import Fleet

    (one, two), fleet = replicas
    assert isinstance(fleet, Fleet) and fleet.labels == ["server 0 rank 0", "server 1 rank 0"]
    _serve(one, "a", PROMPT)              # server 0 caches the prompt's blocks
    _serve(two, "b", PROMPT)              # the same prompt sent to server 1: nothing cached there
    _serve(one, "c", PROMPT)              # and to server 0 again: a hit
    for side in (one, two):
        assert side.scheduler._rec.publisher.flush()
    assert fleet.wait_for(lambda f: sum(r["status"] == "finished" for _, r in f.requests()) == 3, timeout=10)
    rows = {r["request_id"]: r for r in fleet.routing()}
    full = (len(PROMPT) - 1) // BLOCK * BLOCK   # vLLM computes a prompt's last token itself
    assert [rows[r]["rank"] for r in "abc"] == [0, 1, 0]
    assert (rows["a"]["hit_tokens"], rows["a"]["would_hit"], rows["a"]["loss_tokens"]) == (0, [0, 0], 0)
    assert (rows["b"]["hit_tokens"], rows["b"]["would_hit"], rows["b"]["loss_tokens"]) == (0, [full, 0], full)
    assert rows["b"]["best_rank"] == 0 and rows["b"]["best_tokens"] == full
    assert (rows["c"]["hit_tokens"], rows["c"]["would_hit"], rows["c"]["loss_tokens"]) == (full, [full, full], 0)
    assert rows["c"]["best_rank"] == 0   # a tie goes to where it ran: no loss
    summary = fleet.routing_summary()
    assert summary == {"requests": 3, "per_rank": [2, 1], "measured": 3, "hit_tokens": full, "best_tokens": 2 * full,
                       "loss_tokens": full, "requests_with_loss": 1}


def test_the_dashboard_of_a_fleet_shows_each_engine_core_beside_the_others(replicas):
    from explorer import Dashboard
    from explorer.ui.fleet_view import FleetDashboard

    (one, two), fleet = replicas
    _serve(one, "a", PROMPT)
    _serve(two, "b", PROMPT)
    for side in (one, two):
        assert side.scheduler._rec.publisher.flush()
    assert fleet.wait_for(lambda f: sum(r["status"] == "finished" for _, r in f.requests()) == 2, timeout=10)
    dash = Dashboard(fleet)
    assert isinstance(dash, FleetDashboard) and len(dash.columns) == 2
    panel = dash.fleet_panel
    assert [r["label"] for r in panel.ranks] == fleet.labels and [r["requests"] for r in panel.ranks] == [1, 1]
    full = (len(PROMPT) - 1) // BLOCK * BLOCK
    assert {r["request_id"]: r["loss_tokens"] for r in panel.rows} == {"a": 0, "b": full}
    assert panel.summary["loss_tokens"] == full and panel.summary["per_rank"] == [1, 1]
    for col, s in zip(dash.columns, fleet.sessions):   # each column: that core's own panels, at its step
        queues = col.children[1]
        assert queues.step == s.current.step and len(queues.queues["finished"]) == 1
    assert panel.dispatch({"action": "follow"}) is None and fleet.following and panel.following
    assert panel.dispatch({"action": "pause"}) is None and not fleet.following and not panel.following


def test_the_fleet_panels_javascript_parses_and_loads_nothing(assert_node_parses):
    from widgets.fleet import FleetPanel

    esm = str(FleetPanel._esm)
    assert not re.search(r"^\s*import\s", esm.replace('"http://www.w3.org/2000/svg"', ""), re.M)
    assert "fetch(" not in esm and "export default { render }" in esm and "kvsRoot(el, model," in esm
    for testid in ("kvs-fleet", "kvs-fleet-toggle", "kvs-fleet-ranks", "kvs-fleet-routing", "kvs-fleet-loss"):
        assert f'"{testid}"' in esm
    assert ".kvs-panel" in str(FleetPanel._css)
    assert_node_parses(esm, "fleet.mjs")
