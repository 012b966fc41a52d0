"""Sliding-window layers in kvscope's engine (issue 60): a model mixing them with full-attention
layers runs two KV cache groups, each with its own block table, slots and window, and gives
transformers' own tokens; the native CPU kernels and the torch path honour the window."""
import json
import random
from itertools import pairwise
from pathlib import Path

import pytest
import torch

from engine import LLM
from engine.attention import get_attention_backend
from engine.cpu_kernels import native
from engine.model import ModelSpec

from .helpers import greedy, hf_greedy, run_all

WINDOW = 20  # tokens a sliding layer attends to (its own included): not a multiple of the block size
LAYER_TYPES = ("full_attention", "sliding_attention", "sliding_attention", "full_attention")
kernels = native()
needs_kernels = pytest.mark.skipif(kernels is None, reason="native CPU kernels need gcc and an AVX2 CPU")


@pytest.fixture(scope="module")
def mixed_model(tiny_checkpoint) -> Path:
    """A random Qwen3 of 4 layers, the middle two with a 20-token sliding window, written by transformers."""
    return tiny_checkpoint("qwen3", num_layers=4, sliding_window=WINDOW, layer_types=LAYER_TYPES)


def _prompts(vocab: int = 151_000) -> list[list[int]]:
    rng = random.Random(3)
    # Longer than the window (blocks leave it during the prompt and the decode), a chunk's
    # worth and less, and one shorter than the window.
    return [[rng.randrange(vocab) for _ in range(n)] for n in (70, 45, 9, 130, 21)]


# -- the model's layers and groups ---------------------------------------------------------------
def _spec(tmp_path: Path, **cfg) -> ModelSpec:
    base = {"model_type": "qwen3", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2}
    (tmp_path / "config.json").write_text(json.dumps(base | cfg))
    return ModelSpec.from_folder(tmp_path)


def test_layer_types_are_read_as_transformers_reads_them(tmp_path):
    # Qwen3-0.6B's config: a window named but not used.
    off = _spec(tmp_path, use_sliding_window=False, sliding_window=4096, max_window_layers=2)
    assert off.sliding_window is None and off.kv_cache_group_layers() == [[0, 1, 2, 3]]
    # No layer_types: the layers from max_window_layers on slide.
    on = _spec(tmp_path, use_sliding_window=True, sliding_window=64, max_window_layers=2)
    assert on.layer_types == ("full_attention",) * 2 + ("sliding_attention",) * 2
    assert on.kv_cache_group_layers() == [[0, 1], [2, 3]] and on.sliding_window == 64
    mixed = _spec(tmp_path, use_sliding_window=True, sliding_window=8, layer_types=list(LAYER_TYPES))
    assert mixed.kv_cache_group_layers() == [[0, 3], [1, 2]]


def test_a_retention_interval_off_the_block_grid_is_refused():
    from engine.config import EngineConfig

    with pytest.raises(ValueError, match=r"prefix_cache_retention_interval must be 0, None or a multiple of "
                                         r"block_size 16, got 24"):
        EngineConfig(prefix_cache_retention_interval=24)
    with pytest.raises(ValueError, match=r"prefix_cache_retention_interval must be an integer >= 0, got -16"):
        EngineConfig(prefix_cache_retention_interval=-16)


@pytest.mark.parametrize("cfg,message", [
    ({"layer_types": ["full_attention"] * 3}, r"layer_types .* must name 4 layers"),
    ({"layer_types": ["full_attention", "chunked_attention"] * 2}, r"layer_types .*one of full_attention"),
    ({"sliding_window": 0}, r"sliding_window .* must be a positive number of tokens, got 0"),
    ({"layer_types": ["sliding_attention"] * 4}, r"needs at least one full_attention layer"),
])
def test_bad_layer_types_name_the_field(tmp_path, cfg, message):
    with pytest.raises(ValueError, match=message):
        _spec(tmp_path, **({"use_sliding_window": True, "sliding_window": 8} | cfg))


def test_flash_attn_refuses_a_sliding_model():
    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match=r"attention_backend 'flash_attn' does not honour sliding windows"):
        get_attention_backend("flash_attn", cpu, 256, torch.bfloat16, sliding_window=WINDOW)
    assert get_attention_backend("torch", cpu, 16, torch.float32, sliding_window=WINDOW).name == "torch"


# -- the kernels ------------------------------------------------------------------------------------
def _cache(lengths: list[int], h_kv: int, d: int, dtype: torch.dtype, seed: int, bs: int = 16):
    """Random K/V of sequences on shuffled blocks (block 0, the null block, never used)."""
    g = torch.Generator().manual_seed(seed)
    counts = [-(-n // bs) for n in lengths]
    blocks = (torch.randperm(sum(counts), generator=g) + 1).tolist()
    tables, at = [], 0
    for c in counts:
        tables.append(blocks[at:at + c] + [0] * (max(counts) - c))
        at += c
    shape = (sum(counts) + 1, bs, h_kv, d)
    return (torch.randn(shape, generator=g).to(dtype), torch.randn(shape, generator=g).to(dtype),
            torch.tensor(tables))


def _windowed_attention(q, k_cache, v_cache, table, ctx, window, bs=16):
    """float64 attention of queries at positions ctx.. over the keys of their window."""
    n, h, d = q.shape
    length = ctx + n
    slots = torch.tensor([int(table[t // bs]) * bs + t % bs for t in range(length)])
    group = h // k_cache.shape[2]
    keys = k_cache.flatten(0, 1)[slots].double().repeat_interleave(group, dim=1)
    values = v_cache.flatten(0, 1)[slots].double().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), keys) * d ** -0.5
    q_pos, k_pos = torch.arange(ctx, length)[:, None], torch.arange(length)[None, :]
    seen = (k_pos <= q_pos) & (k_pos > q_pos - window)
    return torch.einsum("hqk,khd->qhd", scores.masked_fill(~seen, float("-inf")).softmax(-1), values).float()


def _prefill(q, k_cache, v_cache, tables, q_lens, ctx_lens, window, threads=None):
    starts = [0, *torch.tensor(q_lens[:-1]).cumsum(0).tolist()]
    out, before = torch.full(q.shape, float("nan")), torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        kernels.paged_prefill_attention(q, k_cache, v_cache, torch.tensor(starts), torch.tensor(q_lens),
                                        torch.tensor(ctx_lens), tables, out, window)
    finally:
        torch.set_num_threads(before)
    return out


@needs_kernels
@pytest.mark.parametrize("window", [1, 5, 16, 20, 37])
@pytest.mark.parametrize("h,kvh,d", [(9, 3, 64), (12, 2, 32)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_prefill_attention_reads_only_the_window(window, h, kvh, d, dtype):
    """Fresh prompts, a chunk after cached tokens and a 1-row tail: each query row attends to its
    last `window` positions only (lanes of one tile whose windows start in different chunks)."""
    q_lens, ctx_lens = [5, 40, 1, 150], [0, 37, 16, 0]
    k_cache, v_cache, tables = _cache([c + n for c, n in zip(ctx_lens, q_lens)], kvh, d, dtype, seed=window)
    q = torch.randn(sum(q_lens), h, d, generator=torch.Generator().manual_seed(d))
    out = _prefill(q, k_cache, v_cache, tables, q_lens, ctx_lens, window)
    at = 0
    for i, (n, ctx) in enumerate(zip(q_lens, ctx_lens)):
        want = _windowed_attention(q[at:at + n], k_cache, v_cache, tables[i], ctx, window)
        torch.testing.assert_close(out[at:at + n], want, rtol=1e-5, atol=1e-5)
        at += n


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_windowed_row_gets_the_same_bits_in_any_chunk(dtype):
    """The chunked-prefill promise under a window: a 200-token prompt whole and in chunks cut
    anywhere, on 1 or 3 threads, gives every row the same bits."""
    h, kvh, d = 9, 3, 64
    k_cache, v_cache, tables = _cache([200], kvh, d, dtype, seed=7)
    q = torch.randn(200, h, d, generator=torch.Generator().manual_seed(8))
    whole = _prefill(q, k_cache, v_cache, tables, [200], [0], WINDOW)
    for cuts in ([0, 24, 77, 200], [0, 1, 17, 199, 200], [0, 160, 200]):
        chunks = [_prefill(q[a:b], k_cache, v_cache, tables, [b - a], [a], WINDOW, threads=3)
                  for a, b in pairwise(cuts)]
        assert torch.equal(torch.cat(chunks), whole), cuts


@needs_kernels
@pytest.mark.parametrize("lengths", [[1], [250], [5, 16, 17, 40], [33, 2, 100, 64, 7, 9, 128, 250]])
@pytest.mark.parametrize("window", [1, 16, 20, 100])
def test_paged_decode_attention_reads_only_the_window(lengths, window):
    """One query per sequence at its last position over its window: one task per decode, and
    (fewer decodes than threads) the window split between the threads."""
    h, kvh, d = 8, 2, 32
    k_cache, v_cache, tables = _cache(lengths, kvh, d, torch.float32, seed=len(lengths))
    q = torch.randn(len(lengths), h, d, generator=torch.Generator().manual_seed(window))
    out = torch.zeros(q.shape)
    kernels.paged_decode_attention(q, k_cache, v_cache, torch.arange(len(lengths)), torch.tensor(lengths), tables,
                                   out, window)
    for i, n in enumerate(lengths):
        want = _windowed_attention(q[i:i + 1], k_cache, v_cache, tables[i], n - 1, window)
        torch.testing.assert_close(out[i:i + 1], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window", [1, 20])
def test_the_triton_kernels_read_only_the_window(window):
    """The Triton decode and prefill kernels (under Triton's interpreter on a CPU) over a window:
    a chunk after cached tokens and decodes longer and shorter than the window."""
    pytest.importorskip("triton", reason="the triton package is not installed")
    from engine.attention.triton_kernels import paged_decode_attention, paged_prefill_attention

    h, kvh, d = 4, 2, 16
    q_lens, ctx_lens = [7, 30], [0, 37]
    lengths = [c + n for c, n in zip(ctx_lens, q_lens)]
    k_cache, v_cache, tables = _cache(lengths, kvh, d, torch.float32, seed=window)
    q = torch.randn(sum(q_lens), h, d, generator=torch.Generator().manual_seed(1))
    qsl = torch.tensor([0, q_lens[0]], dtype=torch.int32)
    out = paged_prefill_attention(q, k_cache, v_cache, qsl, torch.tensor(lengths, dtype=torch.int32),
                                  torch.tensor(ctx_lens, dtype=torch.int32), tables, d ** -0.5, window=window)
    at = 0
    for i, (n, ctx) in enumerate(zip(q_lens, ctx_lens)):
        want = _windowed_attention(q[at:at + n], k_cache, v_cache, tables[i], ctx, window)
        torch.testing.assert_close(out[at:at + n], want, rtol=1e-4, atol=1e-4)
        at += n
    dec = paged_decode_attention(q[:2], k_cache, v_cache, tables, torch.tensor(lengths), d ** -0.5, window=window)
    for i, n in enumerate(lengths):
        want = _windowed_attention(q[i:i + 1], k_cache, v_cache, tables[i], n - 1, window)
        torch.testing.assert_close(dec[i:i + 1], want, rtol=1e-4, atol=1e-4)


# -- the engine against transformers --------------------------------------------------------------
BACKENDS = ["torch", pytest.param("cpu", marks=needs_kernels)]
try:
    import triton  # noqa: F401
    BACKENDS_WITH_TRITON = [*BACKENDS, "triton"]   # under Triton's interpreter on a CPU (tests/conftest.py)
except ImportError:
    BACKENDS_WITH_TRITON = BACKENDS


@pytest.mark.parametrize("backend", BACKENDS_WITH_TRITON)
def test_a_mixed_model_gives_transformers_tokens_alone_batched_and_chunked(mixed_model, backend):
    """Greedy tokens equal transformers' generate, one prompt at a time and all together in 48-token
    steps (chunked prompts), while the sliding group frees the blocks that leave its window. Under
    Triton's interpreter (a CPU's), one prompt alone: each of its steps takes seconds there."""
    prompts = _prompts()
    expected = hf_greedy(mixed_model, prompts, 24)
    alone_llm = LLM(model=str(mixed_model), check_invariants=True, attention_backend=backend)
    alone = prompts[:1] if backend == "triton" else prompts
    assert [run_all(alone_llm, [p], greedy(24))[0] for p in alone] == expected[:len(alone)]
    llm = LLM(model=str(mixed_model), check_invariants=True, attention_backend=backend, max_num_batched_tokens=48)
    assert run_all(llm, prompts, greedy(24)) == expected
    engine = llm.engine
    assert engine.kv.hybrid is not None and engine.kv.hybrid.num_blocks_left_window > 0
    # The native decode takes both groups (tests/engine/test_native_decode.py: the same bits); only
    # another backend, or this machine's crossover, turns it off.
    off = engine.model_info["native_decode_off"]
    assert (off is None or "crossover" in off or "slower" in off) if backend == "cpu" else backend in off


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_resent_prompt_hits_in_both_groups_and_keeps_its_tokens(mixed_model, backend):
    """The same 70-token prompt twice: the second time 64 tokens hit (full group and window both
    cached up to the last whole block), and its tokens are still transformers'."""
    prompt = _prompts()[0]
    expected = hf_greedy(mixed_model, [prompt], 12)[0]
    llm = LLM(model=str(mixed_model), check_invariants=True, attention_backend=backend)
    assert run_all(llm, [prompt], greedy(12))[0] == expected
    rid = llm.engine.add_request(prompt, greedy(12))
    while llm.engine.has_unfinished_requests():
        llm.engine.step()
    req = llm.engine.requests[rid]
    assert req.num_cached_tokens == 64
    assert list(req.output_token_ids) == expected


def test_sliding_layers_share_the_pool_tensors_and_keep_their_own_tables(mixed_model):
    """Layer i of each group shares pool tensor i (a block is one group's at a time), so a block
    costs two layers' K/V, not four; a running request holds a table per group, the sliding one
    with the null block where blocks left the window, and its step's slots follow that table."""
    llm = LLM(model=str(mixed_model), check_invariants=True, attention_backend="torch")
    runner = llm.engine.runner
    caches = runner.kv_caches
    assert caches[0] is caches[1] and caches[3] is caches[2] and caches[0] is not caches[3]
    assert runner.bytes_per_block == 2 * 2 * 16 * 2 * 16 * 4  # K and V, 2 tensors, block 16, 2 KV heads, d 16, fp32
    rid = llm.engine.add_request(_prompts()[3], greedy(4))
    llm.engine.step()  # the 130-token prompt
    record = llm.engine.step()  # its first decode: scheduling it freed what left the window
    req = llm.engine.requests[rid]
    sliding = req.extra_block_tables[0]
    left = (130 - WINDOW + 1) // 16  # whole blocks before the window of token 130, the one decoded
    assert len(sliding) == len(req.block_table) and left == 6
    assert sliding[:left] == [0] * left and 0 not in sliding[left:]
    assert not set(sliding) & set(req.block_table)
    owners = {b["block_id"]: b["owners"] for b in llm.engine.snapshot().block_pool["blocks"] if b["owners"]}
    assert all(owners[b] == [rid] for b in [*req.block_table, *sliding] if b)  # every group's blocks are its
    assert record.batch is not None


def test_the_probe_of_a_sliding_layer_sees_only_the_window(mixed_model):
    llm = LLM(model=str(mixed_model), attention_backend="torch")
    engine = llm.engine
    rid = engine.add_request(_prompts()[0], greedy(8))
    for _ in range(3):
        engine.step()
    probe = engine.attention_probe(rid, 1, None)
    probs = torch.tensor(probe.probs)  # [heads, queries, keys]
    end = probe.context_len
    for j, pos in enumerate(probe.query_positions):
        assert probs[:, j, :max(0, pos - WINDOW + 1)].abs().max() == 0 if pos >= WINDOW else True
        assert probs[:, j, pos - WINDOW + 1 if pos >= WINDOW else 0:pos + 1].min() > 0
        torch.testing.assert_close(probs[:, j].sum(-1), torch.ones(probs.shape[0]))
    assert probe.block_table == engine.requests[rid].extra_block_tables[0] and end == probe.query_positions[-1] + 1


# -- what the explorer reads --------------------------------------------------------------------
def test_the_history_built_from_changes_equals_the_snapshots_with_both_groups(mixed_model):
    """Chunks, shared prefixes, preemption, an abort and a budget change on a pool of 21 blocks:
    every entry the Session builds from the records' changes equals the engine's whole snapshot,
    the sliding group's tables and each group's hits included, and fits the record schema."""
    from engine.report import schema
    from explorer import Session
    from tests.explorer.test_history_changes import busy_workload

    s = Session(LLM(model=str(mixed_model), num_kv_blocks=21, block_size=16, max_num_batched_tokens=96,
                    max_num_seqs=4, attention_backend="torch"))
    problems: list[str] = []
    seen_tables = 0

    def check() -> None:
        nonlocal seen_tables
        full = s.engine.snapshot().to_dict()
        assert s.current.snapshot == full, f"step {s.current.step}"
        record = s.current.record
        problems.extend(schema.snapshot_problems(full) + ([] if record is None else schema.record_problems(record)))
        running = full["queues"]["running"]
        assert all(len(r["group_block_tables"]) == 1 and len(r["group_hit_tokens"]) == 2 for r in running)
        seen_tables += sum(1 for r in running if 0 in r["group_block_tables"][0])  # a block left the window

    seen = busy_workload(s, check)
    assert seen["chunks"] and seen["preempted"] and seen["finished"] == 5
    assert seen_tables and problems == []
    info = s.engine.model_info["kv_cache_groups"]
    assert info == [{"kind": "full_attention", "sliding_window": None, "layers": [0, 3]},
                    {"kind": "sliding_window", "sliding_window": WINDOW, "layers": [1, 2]}]


@pytest.mark.parametrize("interval,second_hits", [(0, [96, 0]), (16, [96, 96]), (None, [96, 96])])
def test_each_groups_hit_is_recorded_and_the_sliding_one_cuts_a_sibling(mixed_model, interval, second_hits):
    """A 100-token shared prefix: after a request that went 60 tokens past it, a sibling hits 96
    tokens in the full group. With vLLM's default prefix_cache_retention_interval (0) the sliding
    group cached only the run ending at the first prompt's end, so the sibling's hit is cut to 0,
    and the sibling after it hits 96 in both; keeping a run every 16 tokens (or every block) lets
    the first sibling hit it all."""
    rng = random.Random(9)
    shared = [rng.randrange(200, 20000) for _ in range(100)]
    llm = LLM(model=str(mixed_model), check_invariants=True, attention_backend="torch",
              prefix_cache_retention_interval=interval)

    def run(prompt: list[int]) -> dict:
        rid = llm.engine.add_request(prompt, greedy(2))
        while llm.engine.has_unfinished_requests():
            llm.engine.step()
        return next(r for r in llm.engine.snapshot().to_dict()["queues"]["finished"] if r["request_id"] == rid)

    run(shared + [rng.randrange(200, 20000) for _ in range(60)])
    second = run([*shared, 5, 6, 7])
    assert second["group_hit_tokens"] == second_hits and second["num_cached_tokens"] == min(second_hits)
    third = run([*shared, 8, 9])
    assert third["group_hit_tokens"] == [96, 96] and third["num_cached_tokens"] == 96
