"""Deep ensembles: the members axis of the optimisation loop, and the declared posterior kind."""

from __future__ import annotations

import numpy as np
import pytest

import ppl
from ppl.models import BNN


@pytest.fixture(scope="module")
def cancer():
    return ppl.datasets.load("breast_cancer", seed=0)


def test_one_member_is_the_map_run_with_the_same_seed(linear_model, linear_data):
    # L-BFGS on a convex problem: the vmapped program retraces map's arithmetic up to rounding
    ensemble = ppl.fit(linear_model, linear_data.train, method="ensemble", seed=3, num_members=1)
    single = ppl.fit(linear_model, linear_data.train, method="map", seed=3)
    np.testing.assert_allclose(np.asarray(ensemble.flat_draws[0, 0]), np.asarray(single.flat_draws[0, 0]), atol=1e-10)
    assert ensemble.kind == "members" and single.kind == "point"


def test_members_do_not_depend_on_the_ensemble_size_and_member_zero_is_map(cancer):
    # Adam on minibatches: every step's arithmetic is the same, so member m agrees to rounding.
    # (A long L-BFGS run on a non-convex network amplifies last-bit differences between the batched
    # and the single program — 2e-16 after one step, 5e-13 after 30 — so it is not compared there.)
    model = BNN(hidden=(8,), likelihood="bernoulli")
    opts = dict(optimizer="adam", batch_size=64, steps=200)
    three = ppl.fit(model, cancer.train, method="ensemble", seed=0, num_members=3, **opts)
    five = ppl.fit(model, cancer.train, method="ensemble", seed=0, num_members=5, **opts)
    np.testing.assert_allclose(np.asarray(three.flat_draws), np.asarray(five.flat_draws[:3]), atol=1e-12)
    single = ppl.fit(model, cancer.train, method="map", seed=0, **opts)
    np.testing.assert_allclose(np.asarray(five.flat_draws[0, 0]), np.asarray(single.flat_draws[0, 0]), atol=1e-12)
    # independent initialisations: distinct members
    assert np.min(np.ptp(np.asarray(five.flat_draws[:, 0]), axis=0).max()) > 1e-3
    assert five.trace.losses.shape == (5, 200)


def test_ensemble_diagnostics_read_the_kind_not_the_layout(cancer, tmp_path):
    model = BNN(hidden=(8,), likelihood="bernoulli")
    post = ppl.fit(model, cancer.train, method="ensemble", seed=0, num_members=4, steps=3000)
    diag = post.diagnostics()
    # members on the chain axis are not failed chains: no R-hat, no ESS, no stuck-chain failure
    assert diag.rhat_max is None and diag.rhat_function_max is None and diag.ess_bulk_min is None
    assert "separate optima" in diag.notes["rhat_max"]
    assert "between-mode disagreement" in diag.notes["rhat_function_max"]
    assert not any("R-hat" in w or "stuck" in w for w in diag.warnings)
    assert diag.ok == bool(post.status.converged), diag.warnings
    # predictions average the members
    probs = post.predict(cancer.test.X, seed=0).probs
    assert probs.shape == (len(cancer.test.X), 2)
    metrics = ppl.evaluate(post, cancer.test, seed=0)
    assert metrics["accuracy"] > 0.9
    post.save(tmp_path / "ens")
    loaded = ppl.load(tmp_path / "ens")
    assert loaded.kind == "members"
    np.testing.assert_allclose(loaded.predict(cancer.test.X, seed=0).probs, probs)
    assert loaded.diagnostics().notes["rhat_max"] == diag.notes["rhat_max"]


def test_a_diverging_member_is_named(cancer):
    model = BNN(hidden=(8,), likelihood="bernoulli", prior_scale=1e3)
    with pytest.raises(ppl.NonFiniteError, match=r"member \d+ at step \d+"):
        ppl.fit(model, cancer.train, method="ensemble", seed=0, num_members=3, optimizer="adam", learning_rate=1e200,
                steps=50)


def test_bad_options_are_refused():
    with pytest.raises(ppl.OptionError, match="num_members must be an integer ≥ 1"):
        ppl.fit(BNN(), (np.zeros((4, 1)), np.zeros(4)), method="ensemble", seed=0, num_members=0)
