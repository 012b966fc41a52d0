"""What the engine reports about itself, built from its state after a step: the StepRecord
and EngineSnapshot dicts, the model and tensor-parallel facts, attention probes, and the
bookkeeping invariants. Nothing here decides anything; the step loop only calls it."""
