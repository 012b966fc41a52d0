"""Paged KV cases shared by the kernel and backend tests: random block tables and caches,
AttentionMetadata built as engine.runner.model_runner builds it, and one step's attention run
through several backends on the same inputs."""
from __future__ import annotations

import torch

from engine.attention.metadata import AttentionMetadata
from engine.attention.torch_backend import TorchAttentionBackend

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def random_tables(gen: torch.Generator, lens: list[int], block_size: int, num_blocks: int) -> torch.Tensor:
    """Block tables [num_seqs, max_blocks] over distinct, shuffled blocks (never the null
    block 0), padded with 0 like the engine's."""
    need = [-(-n // block_size) for n in lens]
    perm = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    assert sum(need) <= len(perm)
    tables = torch.zeros((len(lens), max(need)), dtype=torch.long)
    at = 0
    for i, n in enumerate(need):
        tables[i, :n] = torch.tensor(perm[at:at + n])
        at += n
    return tables.to(DEVICE)


def caches(gen: torch.Generator, num_blocks: int, block_size: int, kvh: int, d: int,
            dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (num_blocks, block_size, kvh, d)
    return (torch.randn(shape, generator=gen).to(DEVICE, dtype),
            torch.randn(shape, generator=gen).to(DEVICE, dtype))


def metadata(seqs: list[tuple[int, int]], tables: torch.Tensor, block_size: int,
              write: bool = True) -> AttentionMetadata:
    """AttentionMetadata as engine.runner.model_runner builds it for sequences (context_len, num_queries)."""
    qsl, seq_lens, slots, decode_ids = [0], [], [], []
    for i, (c, n) in enumerate(seqs):
        qsl.append(qsl[-1] + n)
        seq_lens.append(c + n)
        row = tables[i].tolist()
        slots.extend(row[p // block_size] * block_size + p % block_size for p in range(c, c + n))
        if n == 1 and c > 0:
            decode_ids.append(i)
    meta = AttentionMetadata(
        query_start_loc=qsl, seq_lens=seq_lens, context_lens=[c for c, _ in seqs],
        slot_mapping=torch.tensor(slots if write else [-1] * len(slots), dtype=torch.long, device=DEVICE),
        block_tables=tables, block_size=block_size, decode_seq_ids=decode_ids)
    if decode_ids:
        idx = torch.tensor(decode_ids, dtype=torch.long, device=DEVICE)
        meta.decode_block_tables = tables[idx]
        meta.decode_seq_lens = torch.tensor([seq_lens[i] for i in decode_ids], device=DEVICE)
        meta.decode_rows = torch.tensor([qsl[i] for i in decode_ids], device=DEVICE)
    return meta


def run_backends(seqs, backend_cls, block_size=8, h=6, kvh=2, d=16, layer=0, probe_layer=None, seed=0,
                 dtype=torch.float32):
    """The torch reference and backend_cls on one step of sequences (context_len, num_queries):
    [(out, k_cache, v_cache, probe_probs)] for each, and the caches before the step."""
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [c + n for c, n in seqs]
    num_blocks = 1 + sum(-(-n // block_size) for n in seq_lens) + 1
    k_cache, v_cache = caches(gen, num_blocks, block_size, kvh, d, dtype)
    tables = random_tables(gen, seq_lens, block_size, num_blocks)
    t = sum(n for _, n in seqs)
    q = torch.randn(t, h, d, generator=gen).to(DEVICE, dtype)
    k = torch.randn(t, kvh, d, generator=gen).to(DEVICE, dtype)
    v = torch.randn(t, kvh, d, generator=gen).to(DEVICE, dtype)
    results = []
    for backend in (TorchAttentionBackend(), backend_cls()):
        kc, vc = k_cache.clone(), v_cache.clone()
        meta = metadata(seqs, tables, block_size, write=probe_layer is None)
        meta.probe_layer = probe_layer
        # Two calls on one metadata, as two layers of a step would (the second reuses cached inputs).
        outs = [backend.forward(layer, q, k, v, kc, vc, meta) for _ in range(2)]
        torch.testing.assert_close(outs[0], outs[1], atol=0, rtol=0)
        results.append((outs[0], kc, vc, meta.probe_probs))
    return results, (k_cache, v_cache)
