"""Runs the why-view's tests share: kvscope's engine (the tiny random Qwen3, greedy) on seeded
random traffic with a small pool (evictions and preemptions happen)."""
from __future__ import annotations

import pytest

from tests.why.workloads import drive, random_workload

# 11 usable blocks of 16: a prompt and its output take up to 9, so the pool runs out often.
KVSCOPE = dict(block_size=16, num_kv_blocks=12, max_num_batched_tokens=64, max_num_seqs=4, max_model_len=160)
SEEDS = (1, 2, 3, 4)


@pytest.fixture(scope="package")
def kvscope_runs(tiny_qwen3_path):
    """[(seed, session)] of the random workloads on kvscope's engine, a fresh engine each."""
    from explorer import Session

    out = []
    for seed in SEEDS:
        s = Session(str(tiny_qwen3_path), **KVSCOPE)
        drive(s, random_workload(seed, block_size=KVSCOPE["block_size"]))
        out.append((seed, s))
    return out


@pytest.fixture
def plant_mislabel(monkeypatch):
    """`plant(true_cls, planted)`: for one test, the ledger calls `planted` every missed block it
    would call `true_cls` (a block it found nowhere, class None, counts as never_seen)."""
    from explorer.why import WhyLedger

    real = WhyLedger._missed_block

    def plant(true_cls: str, planted: str) -> None:
        def mislabel(self, seq, j):
            cls, detail, ev = real(self, seq, j)
            if cls == true_cls or (cls is None and true_cls == "never_seen"):
                return planted, "", None
            return cls, detail, ev

        monkeypatch.setattr(WhyLedger, "_missed_block", mislabel)

    return plant
