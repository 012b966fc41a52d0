"""The model and tensor-parallel facts a snapshot carries (`model_info`)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.kv_cache_groups import FullAttentionSpec, SlidingWindowSpec, kv_cache_group
from ..dtypes import dtype_name
from ..parallel.sharding import rank_ranges, sharding_layout
from .schema import INFO, KVCacheGroupDict, ModelInfoDict

if TYPE_CHECKING:
    from ..config import EngineConfig
    from ..model import ModelSpec
    from ..runner.model_runner import ModelRunner


def model_info(config: EngineConfig, spec: ModelSpec, runner: ModelRunner, tp_facts: ModelInfoDict) -> ModelInfoDict:
    """What the explorer's header and panels say about the model, its dtype, device, attention
    backend, CUDA graphs and native decode; `tp_facts` from `tensor_parallel_facts` (built once)."""
    gemm = runner.model.gemm_dtype
    return {INFO.NAME: str(config.model).rstrip("/").split("/")[-1], INFO.ARCHITECTURE: spec.model_type,
            INFO.NUM_LAYERS: spec.num_layers, INFO.NUM_HEADS: spec.num_heads, INFO.NUM_KV_HEADS: spec.num_kv_heads,
            INFO.HEAD_DIM: spec.head_dim, INFO.HIDDEN_SIZE: spec.hidden_size, INFO.VOCAB_SIZE: spec.vocab_size,
            INFO.DTYPE: dtype_name(runner.dtype), INFO.COMPUTE_DTYPE: dtype_name(runner.compute_dtype),
            INFO.DEVICE: str(runner.device),
            INFO.MAX_MODEL_LEN: config.resolved_max_model_len(), INFO.ATTENTION_BACKEND: runner.backend.name,
            INFO.CUDA_GRAPHS: None if runner.graphs is None else runner.graphs.sizes,
            INFO.CUDA_GRAPHS_OFF: runner.graph_off_reason,
            INFO.NATIVE_DECODE: None if runner.native_decode is None else runner.native_decode.max_rows,
            INFO.NATIVE_DECODE_OFF: runner.native_decode_off_reason,
            INFO.NATIVE_LINEAR_ROWS: None if runner.crossover is None else runner.crossover.linear_max_rows,
            INFO.NATIVE_ROWS_SOURCE: None if runner.crossover is None else runner.crossover.describe(),
            # oneDNN's dtype for prefill-sized linears on a CPU (None: not packed, e.g. on a GPU).
            INFO.CPU_GEMM_DTYPE: None if gemm is None else dtype_name(gemm),
            INFO.KV_BYTES_PER_BLOCK: runner.bytes_per_block, INFO.KV_CACHE_GROUPS: kv_cache_groups(spec), **tp_facts}


def kv_cache_groups(spec: ModelSpec) -> list[KVCacheGroupDict]:
    """ModelInfoDict's kv_cache_groups: each group's kind, window and layers, in group order."""
    return [kv_cache_group(SlidingWindowSpec(spec.sliding_window) if spec.sliding_window is not None
                           and spec.is_sliding(layers[0]) else FullAttentionSpec(), layers)
            for layers in spec.kv_cache_group_layers()]


def tensor_parallel_facts(spec: ModelSpec, runner: ModelRunner) -> ModelInfoDict:
    """Per-rank facts: what each rank holds of the model and of the KV pool. Fixed for the
    engine's life, so built once and shared (read-only) by every snapshot."""
    n = runner.tp.size
    per_rank_kv = runner.num_blocks * runner.bytes_per_block_per_rank
    ranks = [d | {"device": str(runner.device if d["rank"] == 0 or runner.device.type == "cpu"
                                else f"cuda:{d['rank']}"), "kv_bytes": per_rank_kv}
             for d in rank_ranges(spec, n)]
    return {INFO.TENSOR_PARALLEL_SIZE: n, INFO.TP_BACKEND: runner.tp.backend,
            INFO.NUM_HEADS_PER_RANK: spec.num_heads // n, INFO.NUM_KV_HEADS_PER_RANK: spec.num_kv_heads // n,
            INFO.INTERMEDIATE_SIZE: spec.intermediate_size, INFO.TIE_WORD_EMBEDDINGS: spec.tie_word_embeddings,
            INFO.KV_BYTES_PER_BLOCK_PER_RANK: runner.bytes_per_block_per_rank, INFO.KV_BYTES_PER_RANK: per_rank_kv,
            INFO.TENSOR_PARALLEL: {"ranks": ranks, "weights": sharding_layout(spec, n)}}
