"""Re-runs recorded workloads through kvscope's core (explorer.export.rerun) at given settings, and
returns what must be the same byte for byte in CPython and in Pyodide: every step's record and
snapshot without their clocks, where the re-run parts from the recorded run, why it stopped, and
the totals. The standard library and the project only: its source also runs in Pyodide
(tests/docs/pyodide_run.cjs), called as `compare_runs(INPUT)`."""
from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

CLOCKS = frozenset({"timings_ms", "engine_time_s", "wall_time_s"})


def without_clocks(obj: Any) -> Any:
    """`obj` without what a clock measured: the records' timings and times, the snapshots' engine
    time and each request's clock events (its `metrics`)."""
    if isinstance(obj, dict):
        return {k: without_clocks(v) for k, v in obj.items()
                if k not in CLOCKS and not (k == "metrics" and "engine" in v)}
    if isinstance(obj, Sequence) and not isinstance(obj, str):   # lists, and a record's views of lists
        return [without_clocks(v) for v in obj]
    return obj


def compare_runs(text: str) -> str:
    """INPUT: {"workloads": [workload, ...], "settings": [settings, ...]}: each workload at each
    settings. OUTPUT: the JSON both interpreters must agree on (a refused setting: its message)."""
    from explorer.export.rerun import rerun
    from explorer.whatif.parting import first_parting
    from explorer.whatif.settings import SettingRejected

    data = json.loads(text)
    out = []
    for workload in data["workloads"]:
        for settings in data["settings"]:
            try:
                rec, base, run = rerun(workload, settings)
            except SettingRejected as exc:
                out.append({"refused": str(exc)})
                continue
            parting = first_parting(rec, base.result, run.result)
            out.append({"label": run.result.variant.label, "stopped": run.stopped,
                        "parting": parting.text if parting else None, "digests": run.result.digests,
                        "entries": [without_clocks([e.step, e.record, e.snapshot]) for e in run.entries]})
    return json.dumps(out, sort_keys=True)
