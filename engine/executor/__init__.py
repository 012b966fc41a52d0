"""Tensor-parallel ranks 1..N-1 as worker processes: `executor.WorkerGroup` starts them and
sends each step's inputs, `worker.main` runs a model shard with its KV shard. Workers import
the runner; the runner never imports the executor."""
