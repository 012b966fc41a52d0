"""Turns the scheduler's decision into the packed batch (vLLM v1 names), owns the model and
the per-layer KV pools, and runs the forward pass.

With tensor_parallel_size > 1 the runner in the caller's process is rank 0: it starts the
worker processes (`engine.executor.WorkerGroup`), sends each step's inputs to them,
and runs its own shard; each worker runs the same runner class on its shard."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..attention import AttentionMetadata, get_attention_backend
from ..config import EngineConfig
from ..core.scheduler import SchedulerOutput
from ..dtypes import compute_dtype, resolve_dtype
from ..model import CausalLM, ModelSpec, load_weights
from ..model.cpu_linear import cpu_packing_available
from ..parallel.parallel_state import SINGLE, TensorParallel
from . import crossover
from .batch import Batch, BuiltBatch, build_batch
from .cuda_graphs import DecodeGraphs, why_no_graphs
from .native_decode import NativeDecode, why_no_native_decode
from .padded_tables import PaddedTables


@dataclass
class ModelRunnerOutput:
    """What one forward returns (vLLM's name): the sampled rows' logits and how the step ran,
    returned rather than kept on the runner so nothing of a step outlives it."""

    # [rows, vocab] fp32; None on a worker rank. After a native decode, a view of the runner's
    # workspace that the next step overwrites: the step's sampler reads it, nothing keeps it.
    logits: torch.Tensor | None
    cuda_graph_bucket: int | None = None  # the captured size replayed; None: eager
    forward_path: str = "eager"           # 'eager' (layer by layer), 'cuda_graph' or 'native_decode'
    collective_ms: float = 0.0            # rank 0's time in collectives (0 without tensor parallel)

    def rank0_logits(self) -> torch.Tensor:
        """The logits the sampler takes: rank 0 always has them (a worker rank's are None)."""
        if self.logits is None:
            raise RuntimeError("no logits: this forward ran on a worker rank, and only rank 0 samples")
        return self.logits


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but torch sees no CUDA GPU; use device='cpu'")
    return torch.device(device)


def build_model(config: EngineConfig, spec: ModelSpec, max_model_len: int, device: torch.device,
                dtype: torch.dtype, tp: TensorParallel = SINGLE) -> CausalLM:
    """The model (this rank's shard of it) with the checkpoint's weights, in eval mode."""
    if config.model is None:
        raise ValueError("config.model must name the model folder (LLMEngine resolves the default model's)")
    with torch.device(device):
        model = CausalLM(spec, max_positions=max(max_model_len, 1), tp=tp)
    load_weights(model, config.model)
    arithmetic = compute_dtype(dtype, device, config.attention_backend)
    model = model.to(arithmetic).eval()
    if arithmetic != dtype:  # bf16 on a CPU: bf16 weights, held in fp32 for the arithmetic
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(dtype))
    if device.type == "cpu" and arithmetic == torch.float32 and cpu_packing_available():
        model.pack_for_cpu(panel_dtype=dtype)
    return model


class ModelRunner:
    """Model + KV pools. `kv_caches[layer] = (k, v)`, each [num_blocks, block_size, KVH, D]
    (KVH: this rank's KV heads). `tp`/`num_blocks` are given on worker ranks; on rank 0 of a
    tensor-parallel engine, `workers` is the started WorkerGroup (its `tp` is rank 0's), and
    the runner sends each step to it and stops it with itself. The runner never starts
    workers: the workers import the runner, not the reverse."""

    def __init__(self, config: EngineConfig, spec: ModelSpec, max_model_len: int,
                 model: CausalLM | None = None, *, tp: TensorParallel | None = None,
                 num_blocks: int | None = None, workers: Any = None) -> None:
        if workers is not None:
            tp = workers.tp
        self.workers, self.tp = workers, tp or SINGLE
        self.config = config
        self.spec = spec
        try:  # a failure stops the workers
            self.device = resolve_device(config.device) if tp is None else tp.device
            self.dtype = resolve_dtype(config.dtype, self.device)
            self.block_size = config.block_size
            # Each step's block tables, in one buffer kept across steps; group 0's are the requests'
            # own full-attention tables (runner/batch.py), which only grow: a step writes their new blocks.
            self._padded_tables = PaddedTables(grows_only=True)
            # KV cache groups (vLLM's kv_cache_groups): full-attention layers, then sliding-window
            # ones. Layer i of every group shares pool tensor i (a block belongs to one group at a
            # time, so the groups never write the same slot), as vLLM lays its pools out.
            self.kv_groups = spec.kv_cache_group_layers()
            self.sliding_window = spec.sliding_window
            # CUDA graphs capture one group's tables (the native decode on a CPU takes both).
            self.groups_off_reason = None if len(self.kv_groups) == 1 else \
                "the sliding-window layers' own block tables take the layer-by-layer path"
            self._padded_group_tables = [PaddedTables() for _ in self.kv_groups[1:]]
            if len(self.kv_groups) > 1 and self.tp.size > 1:
                raise ValueError("tensor_parallel_size > 1 is not supported for a model with sliding-window layers; "
                                 "use tensor_parallel_size=1")
            self.backend = get_attention_backend(config.attention_backend, self.device, self.block_size, self.dtype,
                                                 sliding_window=spec.sliding_window)
            if model is None:  # else: weights shared with an earlier engine (read-only at inference)
                model = build_model(config, spec, max_model_len, self.device, self.dtype, self.tp)
            self.model = model
            # The weights' and the KV cache's dtype is self.dtype; the activations' is the model's
            # own, which build_model chose (wider for bf16 on a CPU: dtypes.py).
            self.compute_dtype = model.norm.weight.dtype
            self.num_blocks = num_blocks or config.num_kv_blocks or self._blocks_from_memory()
            self.kv_caches = self._kv_pools(self.num_blocks)
            # Decode steps replay CUDA graphs where they can; why not is shown in model_info.
            self.graph_off_reason = self.groups_off_reason or why_no_graphs(
                config.enforce_eager, self.device, self.backend.name, self.tp.size)
            self.graphs = None if self.graph_off_reason else DecodeGraphs(
                self.model, self.kv_caches, self.backend, max_num_seqs=config.max_num_seqs,
                max_model_len=max_model_len, block_size=self.block_size, device=self.device)
            # On a CPU, decode steps run as one native call where they can (native_decode.py).
            self.native_decode_off_reason = why_no_native_decode(
                config.enforce_eager, self.device, self.dtype, self.backend.name, self.tp.size, self.model)
            # Where this machine's panels stop being faster than oneDNN (crossover.py): measured
            # once per CPU, model and dtype; None where nothing runs on the panels.
            self.crossover = crossover.resolve(self)
            if self.crossover is not None:
                crossover.apply(self, self.crossover)
                if self.native_decode_off_reason is None and self.crossover.decode_max_rows == 0:
                    self.native_decode_off_reason = (
                        f"{crossover.ENV_VAR} sets no decode rows" if self.crossover.source == crossover.ENV_VAR else
                        f"slower than layer by layer at every batch size on this CPU ({self.crossover.source})")
            self.native_decode = None if self.native_decode_off_reason or self.crossover is None else NativeDecode(
                self.model, self.kv_caches, self.block_size, max_model_len, self.crossover.decode_max_rows)
        except BaseException:
            self.shutdown()
            raise

    def wait_ready(self) -> None:
        """Tensor parallel: wait for the workers' shards, join the process group and size their
        KV pools like this one (a separate call so the caller can load the tokenizer while the
        workers start). Nothing to wait for in a single-process engine."""
        if self.workers is not None:
            self.workers.connect(self.num_blocks)

    @property
    def num_pool_tensors(self) -> int:
        """K and V tensors pairs in the pool: one per layer of the largest KV cache group."""
        return max(len(layers) for layers in self.kv_groups)

    def _kv_pools(self, num_blocks: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's (K, V) pool tensors, [num_blocks, block_size, KVH, D]: layer i of each
        KV cache group gets pair i."""
        shape = (num_blocks, self.block_size, self.spec.num_kv_heads // self.tp.size, self.spec.head_dim)
        pairs = [(torch.zeros(shape, dtype=self.dtype, device=self.device),
                  torch.zeros(shape, dtype=self.dtype, device=self.device)) for _ in range(self.num_pool_tensors)]
        caches = [pairs[0]] * self.spec.num_layers
        for layers in self.kv_groups:
            for i, layer in enumerate(layers):
                caches[layer] = pairs[i]
        return caches

    @property
    def bytes_per_block(self) -> int:
        """KV bytes of one block over all layers and all ranks (of one group: a block holds the
        K/V of one group's layers)."""
        s = self.spec
        return 2 * self.num_pool_tensors * self.block_size * s.num_kv_heads * s.head_dim * self.dtype.itemsize

    @property
    def bytes_per_block_per_rank(self) -> int:
        """KV bytes of one block that each rank holds (its KV heads only)."""
        return self.bytes_per_block // self.tp.size

    def _blocks_from_memory(self) -> int:
        # The budget is per rank (as gpu_memory_utilization is per GPU): more ranks, more blocks.
        if self.device.type != "cuda":
            budget = self.config.kv_cache_memory_bytes
        elif self.tp.size == 1:
            budget = self._cuda_kv_budget()
        else:
            # The workers are not in a forward yet (a warm-up here would wait on their
            # collectives forever): size from free memory, leaving them the same headroom.
            free, _total = torch.cuda.mem_get_info(self.device)
            budget = int(free * self.config.gpu_memory_utilization * 0.9)
        return max(2, budget // self.bytes_per_block_per_rank)

    def _cuda_kv_budget(self) -> int:
        """Bytes left for the KV pool on this GPU (vLLM / nano-vLLM): run the largest step the
        scheduler can send, read the activation peak, and give the pool what remains of
        gpu_memory_utilization * total once weights, activations and other processes are
        counted."""
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        self.warmup_forward()
        torch.cuda.synchronize(self.device)
        stats = torch.cuda.memory_stats(self.device)
        peak, current = stats["allocated_bytes.all.peak"], stats["allocated_bytes.all.current"]
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(self.device)
        used = total - free  # weights, allocator state, other processes (the driver's view)
        budget = int(total * self.config.gpu_memory_utilization) - used - (peak - current)
        if budget < 2 * self.bytes_per_block_per_rank:
            # As in vLLM, the fraction covers everything on the GPU: another engine's pool counts.
            raise ValueError(f"gpu_memory_utilization={self.config.gpu_memory_utilization} leaves no room for "
                             f"the KV pool on {self.device}: {(used + peak - current) / 2**30:.1f} GiB of "
                             f"{total / 2**30:.1f} GiB are taken (this engine's weights and activations, and "
                             "anything else on the GPU: other engines in this process, other processes); raise "
                             "it, or lower max_num_batched_tokens")
        return budget

    @torch.inference_mode()
    def warmup_forward(self) -> torch.Tensor | None:
        """One forward of fresh prefills filling max_num_batched_tokens (the scheduler's
        largest step), with logits for up to max_num_seqs rows, through a throwaway pool of
        just enough blocks. Returns the logits (its shapes say what ran; None on a worker rank)."""
        cfg, bs = self.config, self.block_size
        num_tokens = max(1, cfg.max_num_batched_tokens)
        seq_len = min(num_tokens, cfg.max_model_len or num_tokens)
        lens = [seq_len] * (num_tokens // seq_len) + ([num_tokens % seq_len] if num_tokens % seq_len else [])
        blocks_per_seq = [-(-n // bs) for n in lens]
        caches = self._kv_pools(1 + len(self.kv_groups) * sum(blocks_per_seq))
        group_tables, next_block = [], 1
        for _ in self.kv_groups:  # each group its own blocks
            tables = []
            for nb in blocks_per_seq:
                tables.append(list(range(next_block, next_block + nb)))
                next_block += nb
            group_tables.append(tables)
        qsl = [0]
        for n in lens:
            qsl.append(qsl[-1] + n)
        positions = [p for n in lens for p in range(n)]
        group_slots = [[t[p // bs] * bs + p % bs for t, n in zip(tables, lens) for p in range(n)]
                       for tables in group_tables]
        batch = Batch([0] * num_tokens, positions, qsl, list(lens), group_slots[0], group_tables[0], [],
                      group_slots[1:], group_tables[1:])
        meta = self.metadata(batch, [0] * len(lens), [])
        ids = torch.zeros(num_tokens, dtype=torch.long, device=self.device)
        pos = torch.tensor(positions, dtype=torch.long, device=self.device)
        hidden = self.model(ids, pos, caches, self.backend, meta)
        rows = hidden[-1:].expand(min(cfg.max_num_seqs, num_tokens), -1)
        return self.model.compute_logits(rows)

    def shutdown(self) -> None:
        """Stop the tensor-parallel workers (nothing to do in a single-process engine)."""
        if self.workers is not None:
            self.workers.shutdown()

    # -- one step -----------------------------------------------------------------------
    def build(self, out: SchedulerOutput) -> BuiltBatch:
        """The step's packed inputs as lists (`build_batch`): the part of prepare that needs no
        input token, so async scheduling builds it while the step before still runs."""
        return build_batch(out, self.block_size, len(self.kv_groups))

    def tensors(self, batch: Batch, ctx_lens: list[int], decode_ids: list[int],
                ) -> tuple[AttentionMetadata | None, torch.Tensor | None, torch.Tensor | None]:
        """The built batch as the forward takes it: attention metadata, input ids and positions
        as tensors; or, where the native decode takes the step, loaded into it (then None)."""
        input_ids, positions = batch.input_ids, batch.positions
        if self.native_decode is not None and self.native_decode.takes(
                len(input_ids), len(decode_ids), len(batch.logits_indices), batch.block_tables,
                *batch.group_block_tables):
            # A pure-decode step runs as one native call reading the lists above (forward with
            # meta None): no tensors to build. A sliding-window group's slots and tables go too.
            sliding = bool(batch.group_block_tables)
            self.native_decode.load(input_ids, positions, batch.slot_mapping, batch.seq_lens, batch.block_tables,
                                    batch.group_slot_mappings[0] if sliding else None,
                                    batch.group_block_tables[0] if sliding else None)
            return None, None, None
        meta = self.metadata(batch, ctx_lens, decode_ids)
        dev = self.device
        return (meta, torch.tensor(input_ids, dtype=torch.long, device=dev),
                torch.tensor(positions, dtype=torch.long, device=dev))

    def metadata(self, batch: Batch, ctx_lens: list[int], decode_ids: list[int]) -> AttentionMetadata:
        """Attention metadata (tensors on this runner's device) for a packed batch: group 0's,
        with every other KV cache group's in `other_groups`."""
        if len(batch.group_block_tables) != len(self.kv_groups) - 1:
            raise ValueError(f"a batch for {len(self.kv_groups)} KV cache groups carries the block tables of "
                             f"{1 + len(batch.group_block_tables)}")
        meta = self._group_metadata(batch, batch.slot_mapping, batch.block_tables, ctx_lens, decode_ids,
                                    self._padded_tables)
        meta.other_groups = [
            self._group_metadata(batch, slots, tables, ctx_lens, decode_ids, padder, self.sliding_window)
            for slots, tables, padder in zip(batch.group_slot_mappings, batch.group_block_tables,
                                             self._padded_group_tables)]
        return meta

    def _group_metadata(self, batch: Batch, slot_mapping: list[int], block_tables: list[list[int]],
                        ctx_lens: list[int], decode_ids: list[int], padder: PaddedTables,
                        sliding_window: int | None = None) -> AttentionMetadata:
        dev = self.device
        max_blocks = max((len(t) for t in block_tables), default=1) or 1
        # Padded on the host and copied once: a copy per sequence costs a host-to-device
        # transfer each on a GPU (hundreds per step at large batches).
        padded = padder(block_tables, max_blocks).to(dev)
        meta = AttentionMetadata(
            query_start_loc=batch.query_start_loc, seq_lens=batch.seq_lens, context_lens=ctx_lens,
            slot_mapping=torch.tensor(slot_mapping, dtype=torch.long, device=dev),
            block_tables=padded, block_size=self.block_size, decode_seq_ids=decode_ids, sliding_window=sliding_window)
        if decode_ids:
            # decode_ids ascend, so all of them are 0..n-1 (a pure-decode step): no index needed.
            every = len(decode_ids) == len(block_tables)
            meta.decode_block_tables = padded if every else \
                padded[torch.tensor(decode_ids, dtype=torch.long, device=dev)]
            meta.decode_seq_lens = torch.tensor([batch.seq_lens[i] for i in decode_ids], device=dev)
            meta.decode_rows = torch.tensor([batch.query_start_loc[i] for i in decode_ids], device=dev)
        return meta

    def forward(self, meta: AttentionMetadata | None, input_ids: torch.Tensor | None, positions: torch.Tensor | None,
                logits_indices: list[int]) -> ModelRunnerOutput:
        """Runs every layer (writing K/V into the pools) and returns fp32 logits of the sampled
        rows (None on a worker rank: the logits are gathered on rank 0), with how it ran. With
        meta None, the pure-decode step that prepare loaded into the native decode."""
        if meta is None:  # every row of a pure-decode step samples: one call to the logits
            if self.native_decode is None:
                raise ValueError("a forward without attention metadata runs the native decode, which is off here")
            return ModelRunnerOutput(self.native_decode.run(), forward_path="native_decode")
        if input_ids is None or positions is None:
            raise ValueError("a forward with attention metadata needs the step's input ids and positions")
        return self._forward_layers(meta, input_ids, positions, logits_indices)

    @torch.inference_mode()
    def _forward_layers(self, meta: AttentionMetadata, input_ids: torch.Tensor, positions: torch.Tensor,
                        logits_indices: list[int]) -> ModelRunnerOutput:
        if self.workers is None:
            return self._forward(meta, input_ids, positions, logits_indices)
        self.tp.reset_timer()  # the step's collectives only (not a probe's in between)
        self.workers.send_forward(meta, input_ids, positions, logits_indices)
        with self.workers.guard():
            out = self._forward(meta, input_ids, positions, logits_indices)
        out.collective_ms = self.tp.collective_ms()
        return out

    def _forward(self, meta: AttentionMetadata, input_ids: torch.Tensor, positions: torch.Tensor,
                 logits_indices: list[int]) -> ModelRunnerOutput:
        bucket, path = None, "eager"
        graphs = self.graphs if self._graph_can_run(meta, input_ids.shape[0]) else None
        if graphs is not None:
            (hidden, bucket), path = graphs.run(input_ids, positions, meta), "cuda_graph"
        else:
            hidden = self.model(input_ids, positions, self.kv_caches, self.backend, meta)
        if not logits_indices:
            return ModelRunnerOutput(torch.empty((0, self.spec.vocab_size)), bucket, forward_path=path)
        rows = hidden[torch.tensor(logits_indices, dtype=torch.long, device=self.device)]
        logits = self.model.compute_logits(rows)
        if logits is not None and self.workers is not None and self.device.type == "cuda":
            self.workers.wait_until_done(logits)  # a dead NCCL peer never completes: poll, do not hang
        return ModelRunnerOutput(None if logits is None else logits.float(), bucket, forward_path=path)

    def _graph_can_run(self, meta: AttentionMetadata, num_tokens: int) -> bool:
        """A pure-decode step (every row a one-token decode) that fits a captured bucket."""
        return (self.graphs is not None and meta.probe_layer is None
                and len(meta.decode_seq_ids) == meta.num_seqs == num_tokens
                and num_tokens <= self.graphs.max_batch)

    @torch.inference_mode()
    def probe(self, token_ids: list[int], start: int, end: int, block_table: list[int],
              layer: int, group_tables: Sequence[list[int]] = ()) -> torch.Tensor | None:
        """Attention probabilities [H, end-start, end] of layer `layer` for query positions
        start..end-1 of one sequence whose K/V (positions 0..end-1) are already in the pools.
        Re-runs layers 0..layer for those positions, reading all context from the paged cache
        and writing nothing, so the numbers are those the step itself computed. With tensor
        parallelism every rank re-runs its heads and rank 0 gathers all of them. `group_tables`:
        the sequence's block tables in the other KV cache groups (sliding-window layers')."""
        if self.workers is not None:
            self.workers.send("probe", (list(token_ids[:end]), start, end, list(block_table), layer))
            with self.workers.guard():
                return self._probe(token_ids, start, end, block_table, layer, group_tables)
        return self._probe(token_ids, start, end, block_table, layer, group_tables)

    def _probe(self, token_ids: list[int], start: int, end: int, block_table: list[int],
               layer: int, group_tables: Sequence[list[int]] = ()) -> torch.Tensor | None:
        nothing = [-1] * (end - start)
        batch = Batch(token_ids[start:end], list(range(start, end)), [0, end - start], [end], nothing,
                      [list(block_table)], [], [nothing for _ in group_tables], [[list(t)] for t in group_tables])
        meta = self.metadata(batch, [start], [])
        for group in (meta, *meta.other_groups):
            group.probe_layer = layer
        ids = torch.tensor(batch.input_ids, dtype=torch.long, device=self.device)
        pos = torch.tensor(batch.positions, dtype=torch.long, device=self.device)
        self.model(ids, pos, self.kv_caches, self.backend, meta, num_layers=layer + 1)
        meta = meta.group(1 if self.spec.is_sliding(layer) else 0)
        if meta.probe_probs is None:
            raise RuntimeError(f"attention backend {self.backend.name!r} kept no probabilities for layer {layer}")
        return self.tp.gather_to_first(meta.probe_probs, dim=0)
