"""Tensor parallelism over torch.distributed: gloo on CPU, NCCL on CUDA.

Rank 0 lives in the caller's process (scheduler, block manager, sampler); ranks
1..N-1 are worker processes (fresh interpreters that import only the engine), each with
its model shard and KV shard, driven step by step over a socket (`executor.WorkerGroup`,
`worker.main`).
"""
from .parallel_state import SINGLE, TensorParallel, TensorParallelError, check_tensor_parallel

__all__ = ["SINGLE", "TensorParallel", "TensorParallelError", "check_tensor_parallel"]
