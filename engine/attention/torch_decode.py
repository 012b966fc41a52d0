"""Single-token decodes for the torch backend: every decode of a step in a few padded SDPA
calls, and cascade attention when the decodes share a cached prefix.

Padding. One padded call over all decodes pays for the longest sequence in every row; with
prompts of 20-400 tokens half the gathered keys can be padding. So the decodes are sorted by
length and split into groups of neighbours, one call each, as many as the padding saved
outweighs the extra call (GROUP_COST_TOKENS). Measured on the bench's offline workload (32
decodes of 20-530 tokens, 2-core CPU): one group 56 tok/s, up to 4 groups 60, up to 32 at
256 tokens a call 72.

Cascade (vLLM v1's cascade attention, FlashInfer's shared-prefix attention). Requests that hit
the same cached prefix hold the same physical blocks at the start of their block tables. The
shared keys are then attended once for all decodes, as one matrix product over every query
row, instead of being gathered into every row; the rest of each sequence (its suffix) is
attended as usual, and the two partial softmaxes are merged exactly through their
log-sum-exps: out = o1 * exp(lse1 - lse) + o2 * exp(lse2 - lse), lse = logaddexp(lse1, lse2).

Both plans are built once per step from the host lists and reused by every layer.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .metadata import AttentionMetadata

# A group costs one more gather + attention call per layer; in padded keys that is worth about:
GROUP_COST_TOKENS = 256
MAX_GROUPS = 32
# Cascade only pays once the shared part is long and read by several decodes.
CASCADE_MIN_SHARED_TOKENS = 64
CASCADE_MIN_DECODES = 4


@dataclass
class DecodeGroup:
    """Decodes of similar (suffix) length, attended in one padded call."""

    rows: torch.Tensor          # their query rows in the packed batch
    block_tables: torch.Tensor  # [n, max_blocks of the group] (after the shared blocks)
    mask: torch.Tensor          # [n, 1, 1, max_blocks * block_size]: key position < length


@dataclass
class DecodePlan:
    """How one step's decode rows are attended: groups of similar context length, and an optional
    shared prefix attended once for all of them (cascade)."""
    groups: list[DecodeGroup]
    shared_blocks: torch.Tensor | None = None  # blocks at the start of every decode's table
    shared_tokens: int = 0                     # the keys in them, attended once (cascade)
    rows: torch.Tensor | None = None           # all decode rows, in group order (cascade only)


def decode_plan(meta: AttentionMetadata) -> DecodePlan:
    """The step's decode plan, built once and reused by every layer."""
    return meta.derived(_build_plan)


def _build_plan(meta: AttentionMetadata) -> DecodePlan:
    bs = meta.block_size
    dev = meta.block_tables.device
    ids = sorted(meta.decode_seq_ids, key=lambda i: meta.seq_lens[i])
    tables = meta.block_tables.index_select(0, torch.tensor(ids, dtype=torch.long, device=dev))
    shared = _shared_block_count(tables, [meta.seq_lens[i] for i in ids], bs)
    if shared * bs < CASCADE_MIN_SHARED_TOKENS or len(ids) < CASCADE_MIN_DECODES:
        shared = 0
    lengths = [meta.seq_lens[i] - shared * bs for i in ids]
    blocks = [max(1, -(-n // bs)) for n in lengths]  # >= 1: padding rows of length 0
    groups = []
    for a, b in _split_by_length(blocks, bs):
        width = blocks[b - 1]
        lens = torch.tensor(lengths[a:b], device=dev)
        valid = torch.arange(width * bs, device=dev)[None, :] < lens[:, None]
        groups.append(DecodeGroup(
            rows=torch.tensor([meta.query_start_loc[i] for i in ids[a:b]], dtype=torch.long, device=dev),
            block_tables=tables[a:b, shared:shared + width].contiguous(),
            mask=valid[:, None, None, :]))
    if not shared:
        return DecodePlan(groups)
    return DecodePlan(groups, shared_blocks=tables[0, :shared].contiguous(), shared_tokens=shared * bs,
                      rows=torch.cat([g.rows for g in groups]))


def _shared_block_count(tables: torch.Tensor, lengths: list[int], bs: int) -> int:
    """Leading blocks identical in every table, leaving each sequence at least one key of its
    own (its newest token is never in a shared block: prefix hits stop short of it)."""
    if tables.shape[0] < 2:
        return 0
    same = (tables == tables[:1]).all(0).long().cumprod(0)
    return min(int(same.sum()), (min(lengths) - 1) // bs)


def _split_by_length(blocks: list[int], bs: int) -> list[tuple[int, int]]:
    """Cut the sorted decodes into 1..MAX_GROUPS runs of equal count, whichever pads least."""
    n = len(blocks)

    def cuts(g: int) -> list[int]:
        return [round(n * j / g) for j in range(g + 1)]

    def cost(g: int) -> int:  # padded keys, plus a fixed cost per group
        return sum((b - a) * blocks[b - 1] * bs for a, b in itertools.pairwise(cuts(g))) + g * GROUP_COST_TOKENS

    return list(itertools.pairwise(cuts(min(range(1, min(MAX_GROUPS, n) + 1), key=cost))))


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: DecodePlan,
                     out: torch.Tensor) -> None:
    """Writes the attention output of every decode row of q [T, H, D] into out."""
    shared, rows = plan.shared_blocks, plan.rows
    if shared is None or rows is None:  # no cascade (a plan sets both or neither)
        for g in plan.groups:
            # index_select / index_copy_, not q[rows] / out[rows] = ...: far cheaper on CPU.
            o = _padded_sdpa(q.index_select(0, g.rows), k_cache, v_cache, g)
            out.index_copy_(0, g.rows, o)
        return
    qd = q.index_select(0, rows)
    o1, lse1 = _shared_attention(qd, k_cache, v_cache, shared)
    start = 0
    for g in plan.groups:
        n = g.rows.shape[0]
        o2, lse2 = _padded_attention_lse(qd[start:start + n], k_cache, v_cache, g)
        a, la = o1[start:start + n], lse1[start:start + n]
        lse = torch.logaddexp(la, lse2)
        merged = a * torch.exp(la - lse).unsqueeze(-1) + o2 * torch.exp(lse2 - lse).unsqueeze(-1)
        out.index_copy_(0, g.rows, merged.to(q.dtype))
        start += n


def _gather(cache: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
    """[n, blocks * block_size, KVH, D]: each row's blocks, read through its table."""
    n, width = tables.shape
    return cache.index_select(0, tables.reshape(-1)).view(n, width * cache.shape[1], *cache.shape[2:])


def _padded_sdpa(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, g: DecodeGroup) -> torch.Tensor:
    """q [n, H, D], one query per sequence, over each sequence's gathered blocks."""
    n, h, d = q.shape
    ks, vs = _gather(k_cache, g.block_tables).to(q.dtype), _gather(v_cache, g.block_tables).to(q.dtype)
    kvh = ks.shape[2]
    # The query heads that share a KV head go in as that head's rows ([n, KVH, group, D]):
    # one attention unit per (sequence, KV head) instead of one per query head, which is
    # measurably faster on CPU than enable_gqa (head i reads KV head i // group, as there).
    o = F.scaled_dot_product_attention(q.view(n, kvh, h // kvh, d), ks.transpose(1, 2), vs.transpose(1, 2),
                                       attn_mask=g.mask)
    return o.reshape(q.shape)


def _padded_attention_lse(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          g: DecodeGroup) -> tuple[torch.Tensor, torch.Tensor]:
    """Like _padded_sdpa, in fp32 and with the log-sum-exp of each row's scores: ([n, H, D], [n, H])."""
    n, h, d = q.shape
    ks, vs = _gather(k_cache, g.block_tables).float(), _gather(v_cache, g.block_tables).float()
    kvh = ks.shape[2]
    qg = q.float().view(n, kvh, h // kvh, d)
    scores = torch.matmul(qg, ks.permute(0, 2, 3, 1)) * d ** -0.5           # [n, KVH, G, S]
    scores = scores.masked_fill(~g.mask, float("-inf"))
    lse = torch.logsumexp(scores, -1)
    o = torch.matmul(torch.exp(scores - lse.unsqueeze(-1)), vs.transpose(1, 2))  # [n, KVH, G, D]
    return o.reshape(n, h, d), lse.reshape(n, h)


def _shared_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      shared_blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Every query row of q [n, H, D] over the same shared keys, as one product per KV head
    (the keys read once, not once per row), in fp32: ([n, H, D], [n, H])."""
    n, h, d = q.shape
    kvh = k_cache.shape[2]
    g = h // kvh
    ks = k_cache.index_select(0, shared_blocks).flatten(0, 1).float().transpose(0, 1)  # [KVH, L, D]
    vs = v_cache.index_select(0, shared_blocks).flatten(0, 1).float().transpose(0, 1)
    qh = q.float().view(n, kvh, g, d).transpose(0, 1).reshape(kvh, n * g, d)          # [KVH, n*G, D]
    scores = torch.matmul(qh, ks.transpose(1, 2)) * d ** -0.5                          # [KVH, n*G, L]
    lse = torch.logsumexp(scores, -1)
    o = torch.matmul(torch.exp(scores - lse.unsqueeze(-1)), vs)                        # [KVH, n*G, D]
    o = o.view(kvh, n, g, d).transpose(0, 1).reshape(n, h, d)
    return o, lse.view(kvh, n, g).transpose(0, 1).reshape(n, h)
