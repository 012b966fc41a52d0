"""A recorded run of kvscope's engine (the tiny random Qwen3, greedy) shared by the what-if tests:
a shared prefix (prefix hits), prompts longer than the budget (chunks), a pool too small for every
request at once (preemptions), an abort, and requests added while others run."""
from __future__ import annotations

import pytest

from explorer.core.recording import Recording, save_recording

CONFIG = dict(block_size=16, num_kv_blocks=20, max_num_batched_tokens=48, max_num_seqs=4, max_model_len=256)
PREFIX = [101 + (i * 37) % 900 for i in range(40)]


def drive(session) -> None:
    """The workload, stepped: what arrives when is part of what the recording must keep."""
    for i in range(3):
        session.add_request(PREFIX + [200 + i * 13 + j for j in range(10 + 7 * i)], max_tokens=40, ignore_eos=True)
    session.step(3)
    session.add_request(PREFIX + [5] * 20, max_tokens=60, ignore_eos=True)
    session.step(2)
    victim = session.add_request([7] * 100, max_tokens=50, ignore_eos=True)
    session.step(4)
    session.abort(victim)
    session.add_request(PREFIX, max_tokens=60, ignore_eos=True)
    session.step(5)
    session.add_request([300 + j for j in range(70)], max_tokens=30, ignore_eos=True)
    session.run_until_idle()


@pytest.fixture(scope="package")
def kvscope_run(tiny_qwen3_path, tmp_path_factory):
    """(session, recording, path) of the workload on kvscope's engine."""
    from explorer import Session

    s = Session(str(tiny_qwen3_path), **CONFIG)
    drive(s)
    path = save_recording(s, tmp_path_factory.mktemp("rec") / "kvscope.kvrec.gz")
    return s, Recording.load(path), path
