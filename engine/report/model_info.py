"""The model and tensor-parallel facts a snapshot carries (`model_info`)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..dtypes import dtype_name
from ..parallel.sharding import rank_ranges, sharding_layout

if TYPE_CHECKING:
    from ..config import EngineConfig
    from ..model import ModelSpec
    from ..runner.model_runner import ModelRunner


def model_info(config: EngineConfig, spec: ModelSpec, runner: ModelRunner, tp_facts: dict) -> dict:
    """What the explorer's header and panels say about the model, its dtype, device, attention
    backend, CUDA graphs and native decode; `tp_facts` from `tensor_parallel_facts` (built once)."""
    return {"name": str(config.model).rstrip("/").split("/")[-1], "architecture": spec.model_type,
            "num_layers": spec.num_layers, "num_heads": spec.num_heads, "num_kv_heads": spec.num_kv_heads,
            "head_dim": spec.head_dim, "hidden_size": spec.hidden_size, "vocab_size": spec.vocab_size,
            "dtype": dtype_name(runner.dtype), "compute_dtype": dtype_name(runner.compute_dtype),
            "device": str(runner.device),
            "max_model_len": config.max_model_len, "attention_backend": runner.backend.name,
            "cuda_graphs": None if runner.graphs is None else runner.graphs.sizes,
            "cuda_graphs_off": runner.graph_off_reason,
            "native_decode": None if runner.native_decode is None else runner.native_decode.max_rows,
            "native_decode_off": runner.native_decode_off_reason,
            # oneDNN's dtype for prefill-sized linears on a CPU (None: not packed, e.g. on a GPU).
            "cpu_gemm_dtype": None if runner.model.gemm_dtype is None else dtype_name(runner.model.gemm_dtype),
            "kv_bytes_per_block": runner.bytes_per_block} | tp_facts


def tensor_parallel_facts(spec: ModelSpec, runner: ModelRunner) -> dict:
    """Per-rank facts: what each rank holds of the model and of the KV pool. Fixed for the
    engine's life, so built once and shared (read-only) by every snapshot."""
    n = runner.tp.size
    per_rank_kv = runner.num_blocks * runner.bytes_per_block_per_rank
    ranks = [d | {"device": str(runner.device if d["rank"] == 0 or runner.device.type == "cpu"
                                else f"cuda:{d['rank']}"), "kv_bytes": per_rank_kv}
             for d in rank_ranges(spec, n)]
    return {"tensor_parallel_size": n, "tp_backend": runner.tp.backend,
            "num_heads_per_rank": spec.num_heads // n, "num_kv_heads_per_rank": spec.num_kv_heads // n,
            "intermediate_size": spec.intermediate_size, "tie_word_embeddings": spec.tie_word_embeddings,
            "kv_bytes_per_block_per_rank": runner.bytes_per_block_per_rank, "kv_bytes_per_rank": per_rank_kv,
            "tensor_parallel": {"ranks": ranks, "weights": sharding_layout(spec, n)}}
