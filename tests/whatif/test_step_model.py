"""The step-time model (explorer/whatif/step_model.py) on recordings whose step times are known:
it recovers the coefficients they were made with, its held-out error comes from contiguous
folds, and a model scored on another run's steps reports that run's error."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from explorer.whatif import NoStepTimings, fit
from explorer.whatif.step_model import score, step_costs

pytestmark = pytest.mark.slow  # the shared recording runs the tiny model (a few seconds)

TRUE = (0.004, 40e-6, 150e-6, 0.5e-6)  # intercept, per prefill token, per decode request, per context token


def timed_as(rec, coefficients, noise=0.0, seed=0):
    """`rec` with every step's own time made from `coefficients` (times a lognormal noise)."""
    x, _ = step_costs(rec)
    y = x @ np.asarray(coefficients)
    if noise:
        y = y * np.random.default_rng(seed).lognormal(0.0, noise, len(y))
    return dataclasses.replace(rec, steps=dataclasses.replace(rec.steps, own_s=[float(v) for v in y]))


def test_the_coefficients_a_recording_was_made_with_come_back(kvscope_run):
    _, rec, _ = kvscope_run
    exact = fit(timed_as(rec, TRUE))
    np.testing.assert_allclose(exact.coefficients, TRUE, rtol=1e-6, atol=1e-12)
    assert exact.step_error < 1e-9 and exact.total_error < 1e-9 and exact.num_steps == len(rec.steps)
    noisy = fit(timed_as(rec, TRUE, noise=0.05))
    # 5% noise per step over the run's steps: each weight within a quarter of its true value.
    np.testing.assert_allclose(noisy.coefficients, TRUE, rtol=0.25)
    assert 0.01 < noisy.step_error < 0.10


def test_a_weight_that_would_come_out_negative_is_dropped_not_kept(kvscope_run):
    _, rec, _ = kvscope_run
    model = fit(timed_as(rec, (0.004, 40e-6, 0.0, 0.0), noise=0.02))
    assert all(c >= 0 for c in model.coefficients)
    assert model.predict(0, 10, 1000) >= model.predict(0, 0, 0)  # more work is never faster


def test_the_held_out_error_comes_from_contiguous_folds(kvscope_run):
    """A run whose second half is twice as slow for the same work: folds of every 5th step see
    both halves in training and call the model good; contiguous folds hold out a whole stretch
    and report the change."""
    _, rec, _ = kvscope_run
    base = timed_as(rec, TRUE)
    own = list(base.steps.own_s)
    half = len(own) // 2
    drifting = dataclasses.replace(base, steps=dataclasses.replace(base.steps, own_s=own[:half] + [2 * v for v in
                                                                                                  own[half:]]))
    assert fit(drifting).total_error > 0.3


def test_a_model_scored_on_another_runs_steps(kvscope_run):
    _, rec, _ = kvscope_run
    model = fit(timed_as(rec, TRUE))
    assert score(model, timed_as(rec, TRUE)) == pytest.approx((0.0, 0.0), abs=1e-9)
    step_error, total_error = score(model, timed_as(rec, tuple(1.5 * c for c in TRUE)))
    assert step_error == pytest.approx(1 / 3) and total_error == pytest.approx(1 / 3)  # 1 - 1/1.5
    untimed = dataclasses.replace(rec, steps=dataclasses.replace(rec.steps, own_s=[0.0] * len(rec.steps)))
    with pytest.raises(NoStepTimings, match="no timed steps"):
        score(model, untimed)
