"""Benchmarks and developer tools, apart from what the explorer ships:
`offline` (`python -m benchmarks bench`: kvscope against HF generate and vLLM's CPU build),
`ui` + `ui_page` + `ui_common` (`python -m benchmarks bench-ui`: click-to-panels latency),
`gpu` (`python -m benchmarks.gpu`), `history_cost` (what explorer history costs),
`checkpoints` (tiny random Qwen3 checkpoints and the default model's tokenizer for tests),
`triton_aot` (compiles the engine's Triton kernels for a GPU arch on any machine)."""
