"""The tensor-parallel panel: its state from a snapshot's model_info and a StepRecord's
collective time, its binding to a Session, and its JavaScript (parsed; drawn in chromium)."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from engine.model import ModelSpec
from engine.parallel.sharding import rank_ranges, sharding_layout
from explorer.ui.tp_view import tensor_parallel_panel, tensor_parallel_state
from widgets import Panel
from widgets.tensor_parallel import TensorParallelPanel


def tp_snapshot(spec: ModelSpec, size: int) -> dict:
    """A snapshot as a size-rank engine reports it (model_info built by the engine's own rules)."""
    per_block = 2 * spec.num_layers * 16 * spec.num_kv_heads * spec.head_dim * 4 // size
    ranks = [r | {"device": "cpu", "kv_bytes": 64 * per_block} for r in rank_ranges(spec, size)]
    return {"config": {"num_kv_blocks": 64}, "model_info": {
        "name": "smol", "num_layers": spec.num_layers, "num_heads": spec.num_heads, "num_kv_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim, "hidden_size": spec.hidden_size, "vocab_size": spec.vocab_size,
        "intermediate_size": spec.intermediate_size, "dtype": "float32", "tensor_parallel_size": size,
        "tp_backend": "gloo", "kv_bytes_per_rank": 64 * per_block, "kv_bytes_per_block_per_rank": per_block,
        "tensor_parallel": {"ranks": ranks, "weights": sharding_layout(spec, size)}}}


@pytest.fixture(scope="module")
def smol_like(tiny_qwen3_path: Path) -> ModelSpec:
    # SmolLM2-135M's shape (9 heads, 3 KV heads): 3 ranks is its smallest split.
    return dataclasses.replace(ModelSpec.from_folder(tiny_qwen3_path), num_heads=9, num_kv_heads=3, vocab_size=49152,
                               intermediate_size=1536, hidden_size=576, head_dim=64, num_layers=30, qk_norm=False)


def test_state_reports_each_ranks_share_and_the_last_steps_collectives(smol_like: ModelSpec) -> None:
    record = {"step": 7, "scheduled": [{"request_id": "0"}],
              "timings_ms": {"forward": 140.0, "collectives": 95.5, "total": 150.0}}
    history = [{"record": {"step": s, "scheduled": [{}], "timings_ms": {"forward": 100.0 + s, "collectives": 50.0}}}
               for s in range(1, 8)]
    state = tensor_parallel_state(record, tp_snapshot(smol_like, 3), history)
    assert state["info"]["size"] == 3 and state["info"]["backend"] == "gloo" and state["info"]["num_blocks"] == 64
    assert [r["heads"] for r in state["ranks"]] == [[0, 3], [3, 6], [6, 9]]
    assert [r["kv_heads"] for r in state["ranks"]] == [[0, 1], [1, 2], [2, 3]]
    assert state["last_step"] == {"step": 7, "collectives_ms": 95.5, "forward_ms": 140.0, "total_ms": 150.0}
    assert state["recent"][-1] == [7, 50.0, 107.0] and len(state["recent"]) == 7
    assert "not for speed" in state["note"]
    after = {w["name"]: w["after"] for w in state["weights"]}
    assert after == {"embed_tokens": "all_reduce", "input_layernorm": None, "q_proj": None, "k_proj": None,
                     "v_proj": None, "o_proj": "all_reduce", "post_attention_layernorm": None, "gate_proj": None,
                     "up_proj": None, "down_proj": "all_reduce", "norm": None, "lm_head": "gather"}


def test_panel_follows_a_session_step_by_step(fresh_session: Any) -> None:
    s = fresh_session
    panel = tensor_parallel_panel(s)
    try:
        assert panel.info["size"] == 1 and "tensor_parallel_size=1" in panel.note and panel.last_step == {}
        s.add_request("Hello", max_tokens=2, temperature=0.0)
        s.step(1)
        assert panel.step == 1 and panel.last_step["step"] == 1
        assert panel.last_step["collectives_ms"] == 0.0 and panel.last_step["forward_ms"] > 0
        assert [r["rank"] for r in panel.ranks] == [0] and panel.ranks[0]["heads"] == [0, 4]
    finally:
        panel.unbind()


def test_panel_esm_parses_imports_nothing_and_keeps_the_conventions(assert_node_parses) -> None:
    esm = str(TensorParallelPanel._esm)
    # The SVG namespace (_common.js's kvsSvg) is an identifier, not a URL anything fetches.
    no_namespace = esm.replace('"http://www.w3.org/2000/svg"', "")
    assert not re.search(r"^\s*import\s", esm, re.M) and "fetch(" not in esm and "http" not in no_namespace
    assert "export default { render }" in esm and 'kvsRoot(el, model, "kvs-tensor-parallel")' in esm
    assert ".kvs-panel" in str(TensorParallelPanel._css)
    assert issubclass(TensorParallelPanel, Panel) and "_handle_custom_msg" not in vars(TensorParallelPanel)
    assert_node_parses(esm, "tp.mjs")


@pytest.mark.slow
def test_panel_draws_one_stripe_per_rank_and_the_collectives(smol_like: ModelSpec, tmp_path: Path,
                                                             browser: Any) -> None:
    from .minifrontend import MiniFrontend

    panel = TensorParallelPanel()
    record = {"step": 3, "scheduled": [{}], "timings_ms": {"forward": 140.0, "collectives": 95.5, "total": 150.0}}
    panel.show(tensor_parallel_state(record, tp_snapshot(smol_like, 3), [{"record": record}] * 5))
    page = browser.new_page(viewport={"width": 900, "height": 900})
    try:
        front = MiniFrontend(page, {"tensor_parallel": panel})
        root = '[data-testid="kvs-tensor-parallel"]'
        assert page.locator(f"{root} .kvs-title").inner_text().startswith("Tensor parallel")
        assert page.locator('[data-testid="kvs-tp-ranks"] tbody tr').count() == 3
        assert page.locator('[data-name="o_proj"] .kvs-tp-columns .kvs-tp-stripe').count() == 3
        assert page.locator('[data-name="q_proj"] .kvs-tp-rows .kvs-tp-stripe').count() == 3
        assert page.locator('[data-name="norm"] .kvs-tp-stripe').count() == 1  # replicated
        colls = page.locator('[data-testid="kvs-tp-collective"]').all_inner_texts()
        assert len(colls) == 4 and "rank 0" in colls[-1]  # embedding, o_proj, down_proj, gather
        assert "95.5 ms" in page.inner_text('[data-testid="kvs-tp-last"]')
        assert "not for speed" in page.inner_text('[data-testid="kvs-tp-note"]')
        page.screenshot(path=str(tmp_path / "tp.png"), full_page=True)
        assert front.errors() == []
    finally:
        page.close()


def test_dashboard_shows_the_sharding_panel_only_with_tensor_parallelism(tiny_qwen3_path: Path,
                                                                         fresh_session: Any) -> None:
    from explorer import Dashboard, Session

    assert not hasattr(Dashboard(fresh_session), "tensor_parallel")
    s = Session(str(tiny_qwen3_path), tensor_parallel_size=2, num_kv_blocks=32)
    try:
        dash = Dashboard(s)
        s.add_request([1, 2, 3], max_tokens=2, temperature=0.0)
        s.step()
        assert dash.tensor_parallel.step == 1
        dash.close_binding()
    finally:
        s.llm.shutdown()
