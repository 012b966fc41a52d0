"""The host work around the forward (benchmarks/host_path.py measures it): no cyclic collection
inside a step, and a step's many-row logits in one workspace."""
import gc

import pytest

from engine import LLM

from .helpers import greedy


def test_the_collector_stays_out_of_a_steps_work(tiny_qwen3_path):
    """A step with records makes thousands of small containers and no cycle: the cyclic collector
    used to run inside it every few hundred of them and walk the whole heap now and then (~18 ms
    a step at 256 requests, docs/performance.md). It is off while the step schedules, runs the
    model and builds its record, and what is pending runs once as the step returns."""
    llm = LLM(model=str(tiny_qwen3_path), num_kv_blocks=400, max_num_seqs=64)
    eng = llm.engine
    for i in range(64):
        eng.add_request([5 + i] * 40, greedy(12, ignore_eos=True))
    seen = []

    def noting(fn):
        def call(*args, **kwargs):
            seen.append(gc.isenabled())
            return fn(*args, **kwargs)
        return call
    eng.scheduler.schedule = noting(eng.scheduler.schedule)
    eng._step_changes = noting(eng._step_changes)
    while eng.has_unfinished_requests():
        eng.step()
    assert len(seen) > 20 and not any(seen) and gc.isenabled()


def test_many_row_logits_are_written_into_one_workspace_each_step(tiny_qwen3_path):
    """A batch past the panels' rows: the logits come from the head's workspace, the same memory
    every step (a fresh 100+ MB tensor a step was mapped and unmapped: logits_head.py)."""
    llm = LLM(model=str(tiny_qwen3_path), num_kv_blocks=300, max_num_seqs=256)
    eng = llm.engine
    head = eng.runner.model.packed_lm_head
    if head is None:
        pytest.skip("a GPU engine: torch's caching allocator reuses the logits' memory already")
    rows = head.native_max_rows + 8   # the measured crossover, past which the GEMM takes the rows
    if rows > 256:
        pytest.skip(f"the panels take up to {head.native_max_rows} rows here: no step is that large")
    for i in range(rows):
        eng.add_request([5 + i, 6, 7], greedy(6, ignore_eos=True))
    seen = set()
    while eng.has_unfinished_requests():
        eng.step()
        seen.add(head._workspace.data_ptr())
    assert len(seen) == 1 and head._workspace.shape[0] == rows


def test_padded_block_tables_reuse_one_buffer_and_pad_with_zeros():
    """Each step's block tables go into one buffer kept across steps (padded_tables.py); a row
    shorter than the one written there before is padded with zeros, not left with stale ids."""
    from engine.runner.padded_tables import PaddedTables

    padded = PaddedTables()
    first = padded([[5, 6, 7, 8], [9]], 4)
    assert first.tolist() == [[5, 6, 7, 8], [9, 0, 0, 0]]
    address = first.data_ptr()
    second = padded([[1], [2, 3, 4]], 3)
    assert second.tolist() == [[1, 0, 0], [2, 3, 4]] and second.is_contiguous() and second.data_ptr() == address
    assert padded([[1, 2, 3, 4, 5, 6]] * 3, 6).tolist() == [[1, 2, 3, 4, 5, 6]] * 3   # grows past its size


def test_a_row_holding_the_same_growing_table_writes_only_its_new_blocks():
    """A decode step's block tables are the step before's, a block longer now and then: a row that
    holds the same list as before writes only what was appended (grows_only: the requests' own
    full-attention tables). Tables that grow, are replaced by new lists (a preempted or finished
    request's), move between rows and leave, at changing widths: always the padded tables."""
    import random

    import torch

    from engine.runner.padded_tables import PaddedTables

    padded = PaddedTables(grows_only=True)
    grown, other = [1, 2, 3], [4]
    padded([grown, other], 4)
    padded._flat[0] = -1   # a mark in the buffer where row 0's first block is
    grown.append(5)
    assert padded([grown, other], 4)[0].tolist() == [-1, 2, 3, 5]   # only the appended block was written
    assert padded([[1, 2, 3, 5], other], 4)[0].tolist() == [1, 2, 3, 5]   # another list: written whole
    assert PaddedTables()([grown], 4).tolist() == [[1, 2, 3, 5]]

    rng = random.Random(0)
    tables = [[rng.randrange(1, 999) for _ in range(rng.randint(1, 9))] for _ in range(12)]
    for step in range(800):
        for t in tables:
            if rng.random() < 0.3:
                t.append(rng.randrange(1, 999))
        if rng.random() < 0.1:
            tables[rng.randrange(len(tables))] = [rng.randrange(1, 999) for _ in range(rng.randint(0, 5))]
        if rng.random() < 0.05:
            rng.shuffle(tables)
        if rng.random() < 0.05 and len(tables) > 2:
            tables.pop(rng.randrange(len(tables)))
        if rng.random() < 0.05:
            tables.append([rng.randrange(1, 999)])
        rows = tables[:rng.randint(1, len(tables))]
        width = max(1, *map(len, rows)) + (rng.random() < 0.2)
        got = padded(rows, width)
        assert torch.equal(got, torch.tensor([t + [0] * (width - len(t)) for t in rows])), step
