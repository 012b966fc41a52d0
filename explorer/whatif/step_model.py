"""How long a step takes, fitted on a recording's own steps:

    seconds = c0 + c_prefill * prefill tokens + c_decode * decode requests + c_context * context tokens

(context tokens: the KV every scheduled request attends over after the step). Least squares with
the coefficients kept >= 0 (a feature whose weight comes out negative is dropped and the rest
refitted), so a step never gets faster for doing more.

What a step costs on the recording's clock: on the wall clock (a live server), the time from the
end of the previous step to the end of this one when the engine went straight on (`busy`: the
server's own overhead between steps included), else the step's own time; on the engine clock,
the step's own time. `admission_delay` is, on the wall clock, how long after its arrival a
request reaching an idle server is first scheduled (the API server's tokenizing and hand-off).

The held-out error is measured on 5 contiguous folds (each fifth of the run held out in turn,
fitted on the other four): neighbouring steps do nearly the same work, so holding out every
5th step would score the model on steps it had all but seen. `step_error` is the median
relative error of one held-out step, `total_error` the largest relative error of a fold's
summed time (what a TTFT, a sum of steps, inherits). Both are printed beside every prediction
made with the model. `score` measures the same two errors of a fitted model on another
recording's steps: a model fitted at setting A scored on a real run at setting B is the error a
what-if inherits when it predicts B from A (benchmarks/whatif_reality.py prints it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

import numpy as np
import numpy.typing as npt

from ..core.recording import Recording

FloatArray = npt.NDArray[np.float64]   # the step features, seconds and coefficients

FEATURES = ("intercept", "prefill_tokens", "decode_requests", "context_tokens")
FOLDS = 5
MIN_STEPS = 10


class CoefficientsDict(TypedDict):
    """A StepTimeModel's coefficients by feature, FEATURES' names in their order: seconds per unit of each."""
    intercept: float
    prefill_tokens: float
    decode_requests: float
    context_tokens: float


class StepTimeModelDict(TypedDict):
    """`StepTimeModel.to_dict()`."""
    coefficients: CoefficientsDict
    step_error: float
    total_error: float
    num_steps: int
    clock: str
    admission_delay: float
    source: str


class NoStepTimings(ValueError):
    """A recording without (enough) step timings to fit a model on."""


@dataclass(frozen=True)
class StepTimeModel:
    """A step's duration as a linear function of its work, fitted on a recording's step timings,
    with its held-out error."""

    coefficients: tuple[float, float, float, float]
    step_error: float         # median |relative error| of a held-out step
    total_error: float        # largest |relative error| of a held-out fold's total time
    num_steps: int            # the steps it was fitted on
    clock: str
    admission_delay: float = 0.0
    source: str = ""

    def predict(self, prefill_tokens: int, decode_requests: int, context_tokens: int) -> float:
        c0, cp, cd, cc = self.coefficients
        return c0 + cp * prefill_tokens + cd * decode_requests + cc * context_tokens

    def error_text(self) -> str:
        return (f"step-time model: held-out error {self.step_error:.0%} per step, {self.total_error:.0%} on a "
                f"fold's total ({self.num_steps} steps, {self.clock} clock)")

    def to_dict(self) -> StepTimeModelDict:
        c0, cp, cd, cc = self.coefficients
        return {"coefficients": {"intercept": c0, "prefill_tokens": cp, "decode_requests": cd, "context_tokens": cc},
                "step_error": self.step_error, "total_error": self.total_error, "num_steps": self.num_steps,
                "clock": self.clock, "admission_delay": self.admission_delay, "source": self.source}


def step_costs(rec: Recording) -> tuple[FloatArray, FloatArray]:
    """(features [n, 4], seconds [n]) of the recording's steps on its clock."""
    st = rec.steps
    n = len(st)
    x = np.ones((n, 4))
    x[:, 1] = st.prefill_tokens
    x[:, 2] = st.decode_requests
    x[:, 3] = st.context_tokens
    end = np.asarray(st.end, dtype=float)
    own = np.asarray(st.own_s, dtype=float)
    y = own.copy()
    if rec.source.clock == "wall" and n > 1:
        steps = np.asarray(st.step)
        gap = np.diff(end)
        after = (np.asarray(st.busy[1:], dtype=bool)) & (np.diff(steps) == 1)
        y[1:][after] = gap[after]
    return x, y


def fit(rec: Recording) -> StepTimeModel:
    """The model of `rec`'s steps; NoStepTimings when it has fewer than MIN_STEPS timed ones."""
    x, y = _timed(rec)
    if len(y) < MIN_STEPS:
        raise NoStepTimings(f"this recording ({rec.source.engine}) has {len(y)} timed steps; a step-time model needs "
                            f"at least {MIN_STEPS}: give one fitted on another recording of the same server "
                            "(step_model=fit(Recording.load(...)), or --step-times-from FILE)")
    coef = _nonnegative_fit(x, y)
    step_errors: list[float] = []
    total_errors: list[float] = []
    fold = np.arange(len(y)) * FOLDS // len(y)  # 0 for the first fifth of the steps, ... 4 for the last
    for k in range(FOLDS):
        test = fold == k
        c = _nonnegative_fit(x[~test], y[~test])
        errors, total = _errors(x[test] @ c, y[test])
        step_errors.extend(errors)
        total_errors.append(total)
    c0, cp, cd, cc = (float(c) for c in coef)  # one weight per feature column (step_costs: four)
    return StepTimeModel(coefficients=(c0, cp, cd, cc), step_error=float(np.median(step_errors)),
                         total_error=float(max(total_errors)), num_steps=len(y), clock=rec.source.clock,
                         admission_delay=admission_delay(rec), source=rec.source.engine)


def score(model: StepTimeModel, rec: Recording) -> tuple[float, float]:
    """(median |relative error| of a step, |relative error| of the summed time) of `model` on
    `rec`'s timed steps: a model fitted on one run scored on another (another setting, another
    day) says how far its predictions there can be trusted."""
    x, y = _timed(rec)
    if not len(y):
        raise NoStepTimings(f"this recording ({rec.source.engine}) has no timed steps to score a model on")
    errors, total = _errors(x @ np.asarray(model.coefficients), y)
    return float(np.median(errors)), total


def _timed(rec: Recording) -> tuple[FloatArray, FloatArray]:
    x, y = step_costs(rec)
    keep = np.isfinite(y) & (y > 0)
    return x[keep], y[keep]


def _errors(pred: FloatArray, y: FloatArray) -> tuple[FloatArray, float]:
    return np.abs(pred - y) / y, float(abs(pred.sum() - y.sum()) / y.sum())


def _nonnegative_fit(x: FloatArray, y: FloatArray) -> FloatArray:
    active = list(range(x.shape[1]))
    while True:
        c, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
        if (c >= 0).all() or len(active) == 1:
            out = np.zeros(x.shape[1])
            out[active] = np.maximum(c, 0.0)
            return out
        active.pop(int(np.argmin(c)))


def admission_delay(rec: Recording) -> float:
    """On the wall clock: the median time from a request's arrival to the start of its first
    step, over requests that found the server idle (0 on the engine clock)."""
    if rec.source.clock != "wall" or not len(rec.steps):
        return 0.0
    st = rec.steps
    at: dict[int | None, int] = {s: i for i, s in enumerate(st.step)}  # a trace's arrival_step: None
    delays = []
    for r in rec.requests:
        i = at.get(r.arrival_step)
        if i is not None and not st.busy[i]:
            delays.append(st.end[i] - st.own_s[i] - r.arrival_time)
    return max(0.0, float(np.median(delays))) if delays else 0.0

