"""notebooks/hybrid.ipynb executed headless: kvscope's engine on a model with sliding-window layers
(a random Qwen3 written by transformers): two KV cache groups, blocks freed as they leave the
window, a shared prefix that hits in the full group and misses in the sliding one, the sibling
after it that hits in both, vLLM's prefix_cache_retention_interval keeping more of the window's
blocks, the Dashboard's rows per group, and the same cut on vLLM itself (a random Gemma 3 with four
groups, stepped in process) with the what-if that cures it; then vLLM issue 45238 on a full-attention
and a Mamba group (kvscope's core, no model): the flip, its cause and the state it missed, proven on
vLLM's scheduler, and a what-if that hits again. Every chapter ends with a check."""
from __future__ import annotations

import pytest

from .headless import NOTEBOOKS, assert_stored_clean_with_checks, read_notebook
from .run_notebook import run_every_cell

NOTEBOOK = NOTEBOOKS / "hybrid.ipynb"
CHAPTERS = ["1. A model with sliding-window layers", "2. Blocks leave the window",
            "3. A shared prefix that misses in one group", "4. The sibling after it hits in both",
            "5. Keep more of the sliding group's blocks", "6. The same in the Dashboard",
            "7. vLLM itself, on a Gemma 3", "8. Mamba layers: 100 tokens less of shared prefix, and no hit at all"]


def test_hybrid_notebook_is_stored_without_outputs_and_each_chapter_ends_with_a_check():
    assert_stored_clean_with_checks(read_notebook(NOTEBOOK), CHAPTERS)


@pytest.mark.slow
def test_hybrid_notebook_shows_a_prefix_cut_by_the_sliding_group(tmp_path_factory):
    from tests.oracle.vllm_available import require_vllm

    require_vllm()   # chapter 7 steps vLLM in process
    _, text = run_every_cell(NOTEBOOK, tmp_path_factory, cell_timeout_s=600)
    assert "group 1: sliding_window  window 48  layers [1, 2]" in text["1. A model with sliding-window layers"]
    assert "sliding window : [0, 0, 0, 0," in text["2. Blocks leave the window"]
    cut = text["3. A shared prefix that misses in one group"]
    assert "full attention hits 96 tokens, sliding window 0" in cut and "'left_window': 96" in cut
    assert "full attention hits 96 tokens, sliding window 96" in text["4. The sibling after it hits in both"]
    assert "full attention hits 96 tokens, sliding window 96" in text["5. Keep more of the sliding group's blocks"]
    on_vllm = text["7. vLLM itself, on a Gemma 3"]
    assert "group 0: full_attention  window None  layers [3]  (vLLM's group 3)" in on_vllm
    assert "each group's own hit [96, 0, 0, 0], the hit taken 0" in on_vllm and "'left_window': 96" in on_vllm
    assert "at prefix_cache_retention_interval=32 the question hits 96 tokens" in on_vllm
    mamba = text["8. Mamba layers: 100 tokens less of shared prefix, and no hit at all"]
    assert "shared prefix 832 tokens: full attention hits 52 blocks, Mamba 52: the sibling hits 52 of 64" in mamba
    assert "shared prefix 732 tokens: full attention hits 45 blocks, Mamba 0: the sibling hits 0 of 64" in mamba
    assert "'no_mamba_checkpoint': 720" in mamba and "#first's state after 736 tokens is cached" in mamba
    assert "the replay at the recorded settings hit 736" in mamba and "the sibling hits 512 tokens" in mamba
