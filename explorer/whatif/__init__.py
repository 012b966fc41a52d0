"""What-if: a recorded run replayed through vLLM 0.32's own scheduler, at its settings and others.

    from explorer.core.recording import Recording
    from explorer.whatif import identity, replay, sweep, variant, fit

    rec = Recording.load("run.kvrec.gz")
    print(identity(rec).text())                     # its own settings: 0 differences
    res = sweep(rec, num_blocks=[128, 256], max_num_batched_tokens=[256, 2048])
    print(res.table())

The layer sits between explorer.core (the recording) and explorer.ui (the what-if view): it
imports vLLM (through explorer.drivers.vllm.bare) only when a replay runs.
"""
from __future__ import annotations

from .identity import IdentityReport, identity
from .mooncake import load_trace
from .parting import Parting, first_parting
from .replay import ReplayError, ReplayResult, replay
from .settings import SettingRejected, Variant, variant
from .step_model import NoStepTimings, StepTimeModel, fit
from .sweep import SweepResult, sweep

__all__ = [
    "IdentityReport",
    "NoStepTimings",
    "Parting",
    "ReplayError",
    "ReplayResult",
    "SettingRejected",
    "StepTimeModel",
    "SweepResult",
    "Variant",
    "first_parting",
    "fit",
    "identity",
    "load_trace",
    "replay",
    "sweep",
    "variant",
]
