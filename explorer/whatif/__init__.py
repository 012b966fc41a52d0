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

from typing import TYPE_CHECKING

from engine.lazy_names import lazy_names

if TYPE_CHECKING:
    from .identity import IdentityReport, identity
    from .mooncake import load_trace
    from .parting import Parting, first_parting
    from .replay import ReplayError, ReplayResult, replay
    from .settings import SettingRejected, Variant, variant
    from .step_model import NoStepTimings, StepTimeModel, fit
    from .sweep import SweepResult, sweep

# The names below load on first use: the step model and the sweep need numpy, and the replay
# through kvscope's own core (core_replay.py) runs where only Python does (a docs page's Pyodide).
_WHERE = {"IdentityReport": ".identity", "identity": ".identity", "load_trace": ".mooncake", "Parting": ".parting",
          "first_parting": ".parting", "ReplayError": ".replay", "ReplayResult": ".replay", "replay": ".replay",
          "SettingRejected": ".settings", "Variant": ".settings", "variant": ".settings",
          "NoStepTimings": ".step_model", "StepTimeModel": ".step_model", "fit": ".step_model",
          "SweepResult": ".sweep", "sweep": ".sweep"}

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


__getattr__ = lazy_names(__name__, _WHERE)
