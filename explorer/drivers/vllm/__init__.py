"""vLLM 0.32 in this process, stepped one scheduler step at a time (engine.py, with config,
startup, capture, records, probe), and its scheduler alone without a model (bare.py).
Importing this package imports no vLLM: the modules do, when asked for."""
