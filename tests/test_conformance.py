"""Conformance over the method registry (never a hand list): a method is tested once registered.

Every method runs with its default options on the conjugate linear-regression fixture, and once
more on the same model written as a user's ``Network`` (a plain apply function over a pytree).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import NOISE, PRIOR, flat_params

from ppl.core.problem import trace_count
from ppl.core.registry import METHODS
from ppl.diagnostics import _arviz
from ppl.models import Network
import ppl

FIT_CACHE: dict = {}


def _fit(name, model, data, seed):
    key = (name, seed, id(data), model)
    if key not in FIT_CACHE:
        FIT_CACHE[key] = ppl.fit(model, data, method=name, seed=seed)
    return FIT_CACHE[key]


@pytest.fixture(params=sorted(METHODS))
def method(request):
    return request.param


def test_returns_valid_posterior(method, linear_model, linear_data):
    post = _fit(method, linear_model, linear_data.train, 0)
    assert isinstance(post, ppl.Posterior)
    assert post.method == method
    D = linear_data.train.X.shape[1]
    assert post.draws["w"].shape == (post.num_chains, post.num_draws, D)
    assert post.draws["b"].shape == (post.num_chains, post.num_draws)
    assert all(np.all(np.isfinite(v)) for v in post.draws.values())
    assert post.wall_time_s > 0 and post.seed == 0
    assert set(post.options) == {f.name for f in dataclasses.fields(type(ppl.inference.get(method)()))}
    sample = post.sample(7, seed=3)
    assert sample["w"].shape == (7, D)


def test_same_seed_same_draws_different_seed_different(method, linear_model, linear_data):
    first = _fit(method, linear_model, linear_data.train, 0)
    again = ppl.fit(linear_model, linear_data.train, method=method, seed=0)
    for site in first.draws:
        np.testing.assert_array_equal(first.draws[site], again.draws[site])
    other = _fit(method, linear_model, linear_data.train, 1)
    assert not np.array_equal(first.draws["w"], other.draws["w"])


def test_diagnostics_compute(method, linear_model, linear_data):
    post = _fit(method, linear_model, linear_data.train, 0)
    diag = post.diagnostics()
    assert isinstance(diag, ppl.Diagnostics)
    assert diag.method == method and diag.num_chains == post.num_chains
    for field in dataclasses.fields(diag):
        if getattr(diag, field.name) is None:
            assert field.name in diag.notes, f"{field.name} is None without a note"
    assert "Diagnostics" in str(diag)
    assert isinstance(diag.ok, bool)
    assert diag.ok or diag.warnings, "a failed check must say why"
    # ok is the conjunction of structured checks, each failed one saying why among the warnings
    assert diag.ok == all(check.passed for check in diag.checks)
    assert all(check.message in diag.warnings for check in diag.failed)


def test_second_same_shaped_fit_does_not_recompile(method, linear_model, linear_data):
    X, y = linear_data.train
    _fit(method, linear_model, linear_data.train, 0).diagnostics()
    before = trace_count()
    shifted = ppl.fit(linear_model, (X, np.asarray(y) + 0.25), method=method, seed=0)
    shifted.diagnostics()
    assert trace_count() == before, "a same-shaped dataset retraced the log density"


@pytest.mark.slow  # a statistical check: out of the default run (15 minutes); CI runs it in the slow step
def test_lands_on_the_conjugate_posterior(method, linear_model, linear_data, linear_truth):
    _lands(_fit(method, linear_model, linear_data.train, 0), linear_truth)


def _lands(post, linear_truth):
    draws = flat_params(post.draws)
    sd_true = np.sqrt(np.diag(linear_truth["cov"]))
    mean = draws.mean(axis=(0, 1))
    if post.num_chains * post.num_draws == 1:
        mcse = np.zeros_like(mean)  # a point estimate: the Gaussian posterior's mode is its mean
    elif post.kind == "members":
        mcse = np.zeros_like(mean)  # separate optima of a unimodal posterior: each is its mode
    elif post.kind == "chains":
        mcse = draws.std(axis=(0, 1)) / np.sqrt(_arviz.ess(draws, "bulk"))
    else:
        mcse = draws.std(axis=(0, 1)) / np.sqrt(post.num_draws)
    assert np.all(np.abs(mean - linear_truth["mean"]) <= 0.1 * sd_true + 4 * mcse)


def _linear_network(D):
    """LinearRegression written as a Network over a plain apply function: the same sites w (D,), b ()."""
    return Network(_linear_apply, {"w": jnp.zeros(D), "b": jnp.zeros(())}, likelihood="gaussian",
                   prior_scale=PRIOR, noise_scale=NOISE, last_layer=("w", "b"))


def _linear_apply(params, X):
    return X @ params["w"] + params["b"]


@pytest.mark.slow  # out of the default run to keep it near 15 minutes; CI runs it in the slow step
def test_network_model_lands_on_the_conjugate_posterior(method, linear_data, linear_truth):
    """Every method on a user's Network (the linear model through a plain apply function): a valid
    Posterior with the template's sites whose diagnostics compute, on the conjugate posterior."""
    model = _linear_network(linear_data.train.X.shape[1])
    if method == "exact":
        with pytest.raises(ppl.OptionError, match="exact"):
            ppl.fit(model, linear_data.train, method=method, seed=0)
        return
    post = _fit(method, model, linear_data.train, 0)
    assert set(post.draws) == {"w", "b"}
    assert isinstance(post.diagnostics().ok, bool)
    _lands(post, linear_truth)


def test_tuning_numbers_do_not_recompile(linear_model, linear_data):
    # Tunable numbers are array arguments. Temperature, learning rate and target
    # acceptance change values, not compiled programs.
    runs = [
        ("svi", {"steps": 200}, {"learning_rate": 0.02}),
        ("map", {"optimizer": "adam", "steps": 100}, {"learning_rate": 0.05}),
        ("nuts", {"num_warmup": 50, "num_samples": 50, "num_chains": 1}, {"target_accept": 0.9}),
    ]
    for name, base, changed in runs:
        ppl.fit(linear_model, linear_data.train, method=name, seed=0, **base)
        before = trace_count()
        ppl.fit(linear_model, linear_data.train, method=name, seed=0, temperature=2.0, **base, **changed)
        assert trace_count() == before, f"{name} recompiled for {changed} or a new temperature"


@pytest.mark.slow  # out of the default run to keep it near 15 minutes; CI runs it in the slow step
def test_interrupt_and_resume_reproduce_the_uninterrupted_run(method, linear_model, linear_data, monkeypatch, tmp_path):
    """Every looping method stops on Ctrl-C at a chunk boundary with its state kept, and resuming
    from the saved state gives the uninterrupted run bit for bit. One-step methods refuse resume."""
    from ppl.core import interrupt, progress
    from ppl.core.registry import get

    full = _fit(method, linear_model, linear_data.train, 0)
    if not get(method).resumable:
        with pytest.raises(ppl.OptionError, match="nothing to checkpoint or resume"):
            ppl.fit(linear_model, linear_data.train, method=method, seed=0, resume=tmp_path / "none")
        return
    real, calls = progress.advance, {"n": 0}

    def advance(steps, phase=0):
        real(steps, phase)
        calls["n"] += 1
        if calls["n"] == 4:
            interrupt.request()

    monkeypatch.setattr(progress, "advance", advance)
    try:
        stopped = ppl.fit(linear_model, linear_data.train, method=method, seed=0)
        assert stopped.status.interrupted and stopped.resume_state is not None
        stopped.save(tmp_path / "partial")
    except ppl.Interrupted as error:
        error.save(tmp_path / "partial")
    monkeypatch.undo()
    resumed = ppl.fit(linear_model, linear_data.train, method=method, seed=0, resume=tmp_path / "partial")
    np.testing.assert_array_equal(resumed.flat_draws, full.flat_draws)
    assert not resumed.status.interrupted


def test_declared_kind_matches_the_diagnostics(method, linear_model, linear_data):
    """A method declares what its draws are; the diagnostics must treat them as that."""
    from ppl.core.results import POSTERIOR_KINDS
    from ppl.core.registry import get

    declared = get(method).kind
    assert declared in POSTERIOR_KINDS, f"{method} declares no posterior kind"
    post = _fit(method, linear_model, linear_data.train, 0)
    assert post.kind == declared
    diag = post.diagnostics()
    if declared == "chains":
        assert diag.ess_bulk_min is not None and (diag.rhat_max is not None or post.num_chains < 2)
        assert diag.khat is None and "samplers" in diag.notes["khat"]
    elif declared in ("independent", "mixture"):
        assert post.has_density and diag.khat is not None
        assert diag.rhat_max is None and "independent samples" in diag.notes["rhat_max"]
    elif declared == "point":
        assert not post.has_density and diag.khat is None and "point estimate" in diag.notes["rhat_max"]
    else:  # members
        assert diag.rhat_max is None and "separate optima" in diag.notes["rhat_max"]
        assert diag.khat is None and "ensemble" in diag.notes["khat"]
