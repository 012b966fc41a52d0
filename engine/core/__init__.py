"""The decisions, in plain Python (no torch): block hashing, the block pool, the KV cache
manager and the scheduler with its post-step update, layered as vLLM v1's are (Scheduler,
then KVCacheManager, then BlockPool). tests/oracle drives exactly these against vLLM 0.32."""
