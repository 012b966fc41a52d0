"""One workload on kvscope's engine and on vLLM, stepped together and aligned step by step.

    from explorer.apps.side_by_side import compare
    cmp = compare([{"id": "a", "prompt": "The capital of France is", "max_tokens": 4}],
                  block_size=32, num_kv_blocks=14, max_num_batched_tokens=96)
    cmp                    # an HTML table: both schedules and block tables, differing steps marked
    cmp.differing_steps    # [] under the default settings
    cmp.rerun_kvscope(scheduler_reserve_full_isl=False).differing_steps   # the older admission rule

A workload is a list of requests {"id", "prompt" (str or token ids), "max_tokens",
"arrival_step" (0: before step 1), "ignore_eos" (True)}, sampled greedily. Both engines start
fresh with the same settings (vLLM's block count is given to kvscope), so block ids can be
compared one for one: a vLLM Session that has already run something is rebuilt first.
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from engine import SamplingParams

if TYPE_CHECKING:
    import ipywidgets as W

    from engine.report.schema import EngineSnapshotDict, StepRecordDict

    from ..core.session import Session
    from ..core.session_view import SessionView


class _WorkloadRequestFields(TypedDict):
    """The keys every workload request has."""
    id: str
    prompt: str | list[int]


class WorkloadRequestDict(_WorkloadRequestFields, total=False):
    """One request of a workload (sampled greedily)."""
    max_tokens: int        # 16 when not given
    arrival_step: int      # added before this step (0: before step 1)
    ignore_eos: bool       # True when not given


class StepViewDict(TypedDict):
    """The comparable part of one step (`step_view`), each map by request id."""
    scheduled: dict[str, int]          # tokens computed in the step
    computed_before: dict[str, int]
    preempted: list[str]
    finished: list[str]
    sampled: dict[str, int | None]     # the token sampled
    block_tables: dict[str, list[int]]  # the running requests' block tables after the step
    num_free_blocks: int | None


class EngineSessionsDict(TypedDict, total=False):
    """The two engines' Sessions (a re-run of kvscope's side alone steps only "kvscope")."""
    kvscope: SessionView
    vllm: SessionView


class EngineStepsDict(TypedDict, total=False):
    """Each engine's steps in `_run`: `step_view`s, None where the engine idled while the other worked."""
    kvscope: list[StepViewDict | None]
    vllm: list[StepViewDict | None]


class EngineNamesDict(TypedDict, total=False):
    """What each engine calls itself."""
    kvscope: str
    vllm: str


Side = Literal["kvscope", "vllm"]
SIDES: tuple[Side, ...] = ("kvscope", "vllm")
StepKey = Literal["scheduled", "computed_before", "preempted", "finished", "sampled", "block_tables",
                  "num_free_blocks"]
KEYS: tuple[StepKey, ...] = ("scheduled", "computed_before", "preempted", "finished", "sampled", "block_tables",
                             "num_free_blocks")
IDLE: StepViewDict = {"scheduled": {}, "computed_before": {}, "preempted": [], "finished": [], "sampled": {},
                      "block_tables": {}, "num_free_blocks": None}
_SHARED = ("model", "block_size", "num_kv_blocks", "max_num_batched_tokens", "max_num_seqs", "max_model_len",
           "enable_prefix_caching", "enable_chunked_prefill", "scheduler_reserve_full_isl", "seed")


def step_view(record: StepRecordDict | None, snapshot: EngineSnapshotDict | None) -> StepViewDict | None:
    """The comparable part of one step: from its StepRecord dict and the snapshot after it."""
    if record is None:
        return None
    running = snapshot.get("queues", {}).get("running", []) if snapshot else []
    return {"scheduled": {s["request_id"]: s["num_tokens"] for s in record["scheduled"]},
            "computed_before": {s["request_id"]: s["num_computed_before"] for s in record["scheduled"]},
            "preempted": sorted(record["preempted"]), "finished": sorted(record["finished"]),
            "sampled": {rid: s["token_id"] for rid, s in record["sampled"].items()},
            "block_tables": {r["request_id"]: list(r["block_table"]) for r in running},
            "num_free_blocks": record["num_free_blocks"]}


class ComparisonRowDict(TypedDict):
    """One step of a Comparison: both sides (None where that engine had already finished) and what differs."""
    step: int
    kvscope: StepViewDict | None
    vllm: StepViewDict | None
    differs: list[str]   # StepViewDict's keys


@dataclass
class Comparison:
    """Both engines' steps, aligned: `kvscope[i]` and `vllm[i]` are step i + 1 (None where that
    engine had already finished). `sessions` are the two Sessions (their histories feed the
    timelines); `names` what each engine calls itself."""

    workload: list[WorkloadRequestDict]
    kvscope: list[StepViewDict | None]
    vllm: list[StepViewDict | None]
    sessions: EngineSessionsDict = field(repr=False)
    names: EngineNamesDict = field(default_factory=EngineNamesDict)

    @property
    def num_steps(self) -> int:
        return max(len(self.kvscope), len(self.vllm))

    def side(self, name: str, step: int) -> StepViewDict | None:
        steps = self.kvscope if name == "kvscope" else self.vllm
        return steps[step - 1] if 0 < step <= len(steps) else None

    def differences(self, step: int) -> list[str]:
        """The keys of step `step` on which the engines differ (all of them when one did not step)."""
        a, b = self.side("kvscope", step), self.side("vllm", step)
        if a is None or b is None:
            return list(KEYS) if a is not b else []
        return [k for k in KEYS if a[k] != b[k]]

    @property
    def differing_steps(self) -> list[int]:
        return [s for s in range(1, self.num_steps + 1) if self.differences(s)]

    def rows(self) -> list[ComparisonRowDict]:
        """One row per step: both sides' schedules and block tables, and what differs."""
        return [{"step": s, "kvscope": self.side("kvscope", s), "vllm": self.side("vllm", s),
                 "differs": self.differences(s)} for s in range(1, self.num_steps + 1)]

    def rerun_kvscope(self, **config_changes: Any) -> Comparison:
        """The same workload on a fresh kvscope engine with `config_changes`, against this
        comparison's vLLM steps (vLLM is not run again)."""
        from ..core.session import Session

        old = self.sessions["kvscope"]
        fields = {k: getattr(old.config, k) for k in _SHARED} | config_changes
        ours = Session(**fields)
        steps = _run(self.workload, {"kvscope": ours})["kvscope"]
        return Comparison(self.workload, steps, self.vllm, {"kvscope": ours, "vllm": self.sessions["vllm"]},
                          self.names.copy())

    def timelines(self) -> W.VBox:
        """Both engines' timeline panels, one above the other, on the same steps."""
        import ipywidgets as W

        import widgets

        from ..ui import views

        boxes = []
        for key in SIDES:
            panel = widgets.TimelinePanel()
            panel.show(views.timeline_state(self.sessions[key].history))
            boxes.append(W.VBox([W.HTML(f"<b>{html.escape(self.names.get(key, key))}</b>"), panel]))
        return W.VBox(boxes)

    def _repr_html_(self) -> str:
        a, b = (html.escape(self.names.get(k, k)) for k in SIDES)
        diff = self.differing_steps
        head = (f"<p><b>{a}</b> vs <b>{b}</b>: {self.num_steps} steps, "
                + (f"<span style='color:#c62828'>{len(diff)} differ: {diff}</span>" if diff
                   else "no step differs") + "</p>")
        cells = ["<tr><th>step</th><th>" + a + ": scheduled</th><th>" + a + ": block tables</th><th>" + b
                 + ": scheduled</th><th>" + b + ": block tables</th><th>differs</th></tr>"]
        for row in self.rows():
            style = " style='background:#ffebee'" if row["differs"] else ""
            sides = []
            for key in SIDES:
                v = row[key]
                sides += ["&mdash;", "&mdash;"] if v is None else [_fmt(v["scheduled"], v["preempted"]),
                                                                   _fmt(v["block_tables"])]
            cells.append(f"<tr{style}><td>{row['step']}</td>" + "".join(f"<td>{c}</td>" for c in sides)
                         + f"<td>{html.escape(', '.join(row['differs']))}</td></tr>")
        return head + "<table class='kvs-side-by-side'>" + "".join(cells) + "</table>"


def _fmt(d: dict[str, int] | dict[str, list[int]], preempted: list[str] | None = None) -> str:
    text = " ".join(f"{k}:{v}" for k, v in d.items())
    if preempted:
        text += " | preempted " + " ".join(preempted)
    return html.escape(text)


def compare(workload: list[WorkloadRequestDict], vllm: Session | None = None, *,
            kvscope: dict[str, Any] | None = None, **config: Any) -> Comparison:
    """Run `workload` on vLLM and on kvscope's engine, step by step, and align the steps.

    `vllm`: a Session(engine="vllm") to use (rebuilt first if it has run anything), else one
    is built from `config` (VllmConfig fields). kvscope's engine gets the same settings and
    vLLM's block count; `kvscope` holds changes for kvscope's side only (a switch that should
    make differences appear, e.g. {"scheduler_reserve_full_isl": False})."""
    from ..core.session import Session

    _check_workload(workload)
    if vllm is None:
        vllm = Session(engine="vllm", **config)
    elif config:
        raise ValueError("give either a vLLM Session or config fields, not both")
    elif vllm.engine.step_count or vllm.engine.requests:
        vllm.reset()  # a fresh pool: free-block order and prefix cache as kvscope's start
    fields = {k: getattr(vllm.config, k) for k in _SHARED} | dict(kvscope or {})
    ours = Session(**fields)
    steps = _run(workload, {"kvscope": ours, "vllm": vllm})
    return Comparison(workload, steps["kvscope"], steps["vllm"], {"kvscope": ours, "vllm": vllm},
                      {"kvscope": ours.engine_name, "vllm": vllm.engine_name})


def _check_workload(workload: list[WorkloadRequestDict]) -> None:
    if not workload:
        raise ValueError("workload must hold at least one request")
    ids = [r.get("id") for r in workload]
    if any(not isinstance(i, str) or not i for i in ids) or len(set(ids)) != len(ids):
        raise ValueError(f"every request needs a unique non-empty str 'id', got {ids}")
    for r in workload:
        if "prompt" not in r:
            raise ValueError(f"request {r['id']!r} has no 'prompt'")


def _run(workload: list[WorkloadRequestDict], sessions: EngineSessionsDict,
         max_steps: int = 10_000) -> EngineStepsDict:
    """Step every session through the workload together (arrivals before their step)."""
    running = [(key, sessions[key]) for key in SIDES if key in sessions]
    steps: EngineStepsDict = {}
    for key, _ in running:
        steps[key] = []
    last_arrival = max(int(r.get("arrival_step", 0)) for r in workload)
    for step in range(max_steps):
        for r in workload:
            if int(r.get("arrival_step", 0)) == step:
                params = SamplingParams(temperature=0.0, max_tokens=int(r.get("max_tokens", 16)),
                                        ignore_eos=bool(r.get("ignore_eos", True)))
                for _, s in running:
                    s.add_request(r["prompt"], params, request_id=r["id"])
        busy = {k: bool(s.source.pending()) for k, s in running}
        if not any(busy.values()) and step >= last_arrival:
            break
        for key, s in running:
            if busy[key]:
                s.step()
                entry = s.current
                steps[key].append(step_view(entry.record, entry.snapshot))
            else:  # idle while the other works: a difference; both idle (waiting for arrivals): equal
                steps[key].append(None if any(busy.values()) else IDLE.copy())
    return steps
