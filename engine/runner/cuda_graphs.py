"""CUDA graphs for decode steps, as vLLM and nano-vLLM do it.

A decode step launches hundreds of small kernels whose launch cost, not their work, bounds
the step at small batch sizes. A CUDA graph records the whole decode forward once per batch
size and replays it with one launch. Graphs have fixed shapes and fixed addresses, so:
  - the forward reads its inputs from static buffers that every replay overwrites;
  - a batch of n decodes replays the smallest captured size >= n (its bucket), the extra
    rows padded with slot -1 (nothing written to the cache) and context length 0 (the
    decode kernel returns zeros there), and only the first n rows are used;
  - prefills, mixed steps and batches above the largest bucket run eagerly.

Captured sizes: 1, 2, 4, 8, then every 16 up to min(max_num_seqs, 512). The attention
backend must be launchable inside a capture (no host sync, no shape-dependent allocation):
the triton and flash_attn backends' decode paths are (GRAPH_BACKENDS); the torch reference
is not (it builds masks from host lists), so with it the engine runs eager and says why.
"""
from __future__ import annotations

import torch

from ..attention import AttentionMetadata

MAX_GRAPH_BATCH = 512
GRAPH_BACKENDS = ("triton", "flash_attn")


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """The batch sizes captured for max_num_seqs (1, 2, 4, 8, 16, 32, 48, ...)."""
    top = min(max_num_seqs, MAX_GRAPH_BATCH)
    return [b for b in (1, 2, 4, 8) if b <= top] + list(range(16, top + 1, 16))


def why_no_graphs(enforce_eager: bool, device: torch.device, backend_name: str, tp_size: int) -> str | None:
    """None when decode steps can use CUDA graphs here, else the reason they run eager."""
    if enforce_eager:
        return "enforce_eager=True"
    if device.type != "cuda":
        return f"device is {device.type}: CUDA graphs need a GPU"
    if backend_name not in GRAPH_BACKENDS:
        return f"attention backend {backend_name!r} cannot be captured (use one of {GRAPH_BACKENDS})"
    if tp_size > 1:
        return "tensor parallel steps run eager"
    return None


class DecodeGraphs:
    """One captured decode forward per bucket, sharing one memory pool and one set of static
    input buffers (sliced per bucket).

    `capture=False` keeps everything but the graphs: each replay runs the forward eagerly on
    the padded static buffers. That is how the bucketing and padding are tested on a CPU."""

    def __init__(self, model, kv_caches, backend, *, max_num_seqs: int, max_model_len: int,
                 block_size: int, device: torch.device, capture: bool = True) -> None:
        self.model, self.kv_caches, self.backend = model, kv_caches, backend
        self.sizes = graph_batch_sizes(max_num_seqs)
        self.block_size = block_size
        self.device = device
        self.use_graphs = capture
        top = self.sizes[-1]
        max_blocks = -(-max_model_len // block_size)
        self.input_ids = torch.zeros(top, dtype=torch.long, device=device)
        self.positions = torch.zeros(top, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((top,), -1, dtype=torch.long, device=device)
        self.seq_lens = torch.zeros(top, dtype=torch.long, device=device)
        self.block_tables = torch.zeros((top, max_blocks), dtype=torch.long, device=device)
        self.rows = torch.arange(top, dtype=torch.long, device=device)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        if capture:
            self._capture_all()

    @property
    def max_batch(self) -> int:
        return self.sizes[-1]

    def bucket(self, n: int) -> int | None:
        """The captured size that serves a decode batch of n (None: run eager)."""
        return next((b for b in self.sizes if b >= n), None)

    def _meta(self, b: int, seq_lens: list[int] | None = None) -> AttentionMetadata:
        """Metadata over the first b rows of the static buffers (a pure-decode step). A captured
        graph reads only the tensors; `seq_lens` gives the host lists an eager run needs."""
        tables = self.block_tables[:b]
        seq_lens = seq_lens or [1] * b
        return AttentionMetadata(
            query_start_loc=list(range(b + 1)), seq_lens=seq_lens, context_lens=[max(n - 1, 0) for n in seq_lens],
            slot_mapping=self.slot_mapping[:b], block_tables=tables, block_size=self.block_size,
            decode_seq_ids=list(range(b)), decode_block_tables=tables,
            decode_seq_lens=self.seq_lens[:b], decode_rows=self.rows[:b])

    def _forward(self, b: int, seq_lens: list[int] | None = None) -> torch.Tensor:
        return self.model(self.input_ids[:b], self.positions[:b], self.kv_caches, self.backend,
                          self._meta(b, seq_lens))

    @torch.inference_mode()
    def _capture_all(self) -> None:
        pool = None
        # Largest first: the pool is sized by it and every smaller graph fits inside.
        for b in reversed(self.sizes):
            self._forward(b)  # warm-up: compiles the kernels for this shape outside the capture
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                out = self._forward(b)
            pool = graph.pool() if pool is None else pool
            self.graphs[b] = (graph, out)
        torch.cuda.synchronize(self.device)

    @torch.inference_mode()
    def run(self, input_ids: torch.Tensor, positions: torch.Tensor,
            meta: AttentionMetadata) -> tuple[torch.Tensor, int]:
        """Hidden states [n, hidden] of a pure-decode batch of n, and the bucket that ran it."""
        n = input_ids.shape[0]
        b = self.bucket(n)
        if b is None:
            raise ValueError(f"a decode batch of {n} exceeds the largest captured size {self.max_batch}")
        tables, lens, _ = meta.decode_inputs()
        width = tables.shape[1]
        if width > self.block_tables.shape[1]:
            raise ValueError(f"block tables of {width} blocks exceed max_model_len's "
                             f"{self.block_tables.shape[1]}")
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(meta.slot_mapping)
        self.seq_lens[:n].copy_(lens)
        self.block_tables[:n, :width].copy_(tables)
        if b > n:  # padding rows: write nothing, attend to nothing
            self.input_ids[n:b].zero_()
            self.positions[n:b].zero_()
            self.slot_mapping[n:b].fill_(-1)
            self.seq_lens[n:b].zero_()
        self.block_tables[:b, width:].zero_()
        self.block_tables[n:b, :width].zero_()
        if not self.use_graphs:
            return self._forward(b, list(meta.seq_lens) + [0] * (b - n))[:n], b
        graph, out = self.graphs[b]
        graph.replay()
        return out[:n], b
