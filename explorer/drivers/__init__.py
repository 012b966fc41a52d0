"""The engines a Session drives or follows, one module (or folder) each, imported only when
asked for:

- `kvscope.py`: kvscope's own LLMEngine, in this process;
- `vllm/`: vLLM's LLMEngine in this process, stepped one scheduler step at a time
  (`engine.py`, with `config`, `startup`, `capture`, `records`, `probe`), and vLLM's
  Scheduler alone without a model (`bare.py`: tests, benchmarks, replays);
- `vllm_live/`: a running vLLM server, followed through its recording scheduler's feed.

The bottom layer of explorer/: the drivers import the engine and vLLM, never the Session,
the UI, the export or the apps (tests/unit/test_import_layers.py).
"""
