"""The engines a Session drives, one module (or folder) each, imported only when asked for:

- `kvscope.py`: kvscope's own LLMEngine, in this process;
- `vllm_engine.py` (+ `vllm_config`, `vllm_startup`, `vllm_capture`, `vllm_records`,
  `vllm_probe`): vLLM's LLMEngine in this process, stepped one scheduler step at a time;
- `vllm_live/`: a running vLLM server, followed through its recording scheduler's feed;
- `vllm_bare.py`: vLLM's Scheduler alone, without a model (tests and benchmarks).

Each implements explorer/engine_protocol.py's Engine and EngineDriver (the live one is
read-only); explorer/engine_protocol.ENGINES names the in-process ones.
"""
