"""Prediction and diagnostics over many inputs and draws, block by block.

``predict(..., keep_draws=False)``, PSIS-LOO and function-space R-hat reduce blocks of inputs
as they go instead of holding the (draws × inputs) array. Each block path must give what the
whole-array path gives; the tests force many blocks with a tiny block size.
"""

from __future__ import annotations

import arviz as az
import numpy as np
import pytest
import scipy.stats

from ppl.core import predict
from ppl.diagnostics import _arviz, function_rhat, psis_loo
from ppl.models import BNN
import ppl


@pytest.fixture(scope="module")
def cancer():
    return ppl.datasets.load("breast_cancer", seed=0)


@pytest.fixture(scope="module")
def chains(cancer):
    model = BNN(hidden=(4,), likelihood="bernoulli")
    return ppl.fit(model, cancer.train, method="sgld", seed=0, num_chains=3, num_samples=40, batch_size=64,
                   progress_bar=False, time_budget=0)


def test_summaries_block_by_block_equal_the_whole_prediction(chains, cancer, monkeypatch):
    whole = chains.predict(cancer.test.X, seed=0)
    monkeypatch.setattr(predict, "BLOCK_BYTES", 120 * 2 * 8 * 7)  # 7 rows a block: 17 blocks
    blocks = chains.predict(cancer.test.X, seed=0, keep_draws=False)
    for name in ("probs", "log_probs", "entropy", "aleatoric", "epistemic"):
        np.testing.assert_allclose(getattr(blocks, name), getattr(whole, name), rtol=1e-12, atol=1e-15)
    assert blocks.member_probs is None and blocks.member_log_probs is None
    np.testing.assert_allclose(blocks.log_prob(cancer.test.y), whole.log_prob(cancer.test.y), rtol=1e-12)


def test_regression_summaries_equal_and_what_needs_draws_says_so(linear_data, monkeypatch):
    post = ppl.fit(ppl.models.LinearRegression(noise_scale=0.5), linear_data.train, method="svi", seed=0,
                   steps=300, progress_bar=False)
    whole = post.predict(linear_data.test.X, seed=0)
    monkeypatch.setattr(predict, "BLOCK_BYTES", post.num_chains * post.num_draws * 2 * 8 * 3)
    blocks = post.predict(linear_data.test.X, seed=0, keep_draws=False)
    for name in ("mean", "variance", "epistemic_variance", "aleatoric_variance"):
        np.testing.assert_allclose(getattr(blocks, name), getattr(whole, name), rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(blocks.member_noise, whole.member_noise)
    with pytest.raises(ValueError, match="keep_draws=False.*keep_draws=True"):
        blocks.interval(0.9)
    with pytest.raises(ValueError, match="no per-draw means"):
        blocks.log_prob(linear_data.test.y)


def test_keep_draws_is_checked(chains, cancer):
    with pytest.raises(ppl.OptionError, match="keep_draws must be True or False"):
        chains.predict(cancer.test.X, seed=0, keep_draws="no")
    with pytest.raises(ppl.OptionError, match="keep_draws=False applies to mode='mc'"):
        chains.predict(cancer.test.X, seed=0, mode="probit", keep_draws=False)


def test_loo_block_by_block_equals_the_whole_array(chains):
    loglik = chains.pointwise_log_likelihood().reshape(chains.num_chains * chains.num_draws, -1)
    fresh = ppl.fit(chains.problem.model, chains.problem.data, method="sgld", seed=0, num_chains=3, num_samples=40,
                    batch_size=64, progress_bar=False, time_budget=0)  # nothing cached: the blocks are computed one by one
    blocks = list(fresh.pointwise_log_likelihood_chunks(max_bytes=120 * 8 * 50))
    assert [b.shape for b in blocks] == [(120, 50)] * 9 + [(120, 5)]
    # float32 network: the blocks' rows go through other matrix shapes than the whole data's
    np.testing.assert_allclose(np.concatenate(blocks, axis=1), loglik, rtol=1e-5, atol=1e-5)
    # PSIS smooths each observation on its own: blocks of the same array give the same LOO
    a = psis_loo(loglik, reff=0.7)
    b = psis_loo((loglik[:, i : i + 50] for i in range(0, loglik.shape[1], 50)), reff=0.7)
    assert a[0] == pytest.approx(b[0], rel=1e-12) and a[1] == pytest.approx(b[1], rel=1e-12)
    np.testing.assert_allclose(a[2], b[2], rtol=1e-12)
    np.testing.assert_allclose(a[3], b[3], rtol=1e-12)


def test_function_rhat_at_the_probe_inputs_is_the_diagnostics_figure(chains):
    probe = np.asarray(chains.problem.probe_inputs())
    per_input = function_rhat(chains, probe, max_bytes=120 * 8 * 5)  # 5 inputs a block
    assert per_input.shape == (probe.shape[0], 1)
    assert np.nanmax(per_input) == pytest.approx(chains.diagnostics().rhat_function_max, rel=1e-12)


def test_function_rhat_needs_chains(cancer):
    post = ppl.fit(BNN(hidden=(4,), likelihood="bernoulli"), cancer.train, method="map", seed=0, steps=20)
    with pytest.raises(ValueError, match="compares chains.*num_chains ≥ 2"):
        function_rhat(post, cancer.test.X)


def _arviz_rhat(array):
    with _arviz._quiet():
        return np.asarray(az.rhat(az.convert_to_dataset({"x": array}), method="rank")["x"].values)


def test_vectorised_rhat_is_arviz_rhat():
    rng = np.random.default_rng(0)
    edge = rng.standard_normal((4, 50, 6))
    edge[:, :, 0] = 1.0  # constant
    edge[1, 3, 1] = np.nan  # a NaN: R-hat undefined
    edge[0, 2, 2] = np.inf  # an infinity is ranked like any value
    edge[:, :, 3] = rng.integers(0, 2, (4, 50))  # heavy ties
    shifted = rng.standard_normal((4, 251, 3, 2)) + 0.3 * np.arange(4)[:, None, None, None]  # odd draws, stuck chains
    for array in (edge, shifted, rng.standard_normal((2, 10, 20)) ** 3, np.round(rng.standard_normal((3, 8, 4)))):
        ours, theirs = _arviz.rhat(array), _arviz_rhat(array)
        np.testing.assert_array_equal(np.isnan(ours), np.isnan(theirs))
        np.testing.assert_allclose(ours, theirs, rtol=1e-12)
    assert np.isnan(_arviz.rhat(rng.standard_normal((1, 100, 2)))).all()  # one chain


def _arviz_ess(array, method):
    with _arviz._quiet():
        return np.asarray(az.ess(az.convert_to_dataset({"x": array}), method=method)["x"].values)


def _autoregressive(rng, shape, phi):
    """Chains of an AR(1) process with coefficient ``phi`` along the draw axis."""
    noise = rng.standard_normal(shape)
    out = np.zeros(shape)
    for t in range(1, shape[1]):
        out[:, t] = phi * out[:, t - 1] + noise[:, t]
    return out


def test_vectorised_ess_is_arviz_ess():
    # every branch of Geyer's truncation: short chains (no pair looked at), sums that turn
    # negative, the pair bound reached, slow and alternating chains, ties, constants and NaN
    rng = np.random.default_rng(2)
    edge = rng.standard_normal((4, 50, 6))
    edge[:, :, 0] = 1.0  # constant: ESS = number of draws
    edge[1, 3, 1] = np.nan  # undefined
    edge[0, 2, 2] = np.inf
    edge[:, :, 3] = rng.integers(0, 2, (4, 50))  # heavy ties
    arrays = [edge, _autoregressive(rng, (4, 1000, 12), 0.9), _autoregressive(rng, (4, 1000, 6), 0.99),
              _autoregressive(rng, (2, 101, 5), 0.5), _autoregressive(rng, (4, 1000, 4), -0.7),
              _autoregressive(rng, (1, 999, 4), 0.999), _autoregressive(rng, (4, 9, 8), 0.95),
              rng.standard_normal((3, 4, 3)), rng.standard_normal((4, 5, 3)), np.round(rng.standard_normal((3, 8, 4))),
              rng.standard_normal((2, 3, 2))]
    for array in arrays:
        for method in ("bulk", "tail", "mean"):
            ours, theirs = _arviz.ess(array, method), _arviz_ess(array, method)
            np.testing.assert_array_equal(np.isnan(ours), np.isnan(theirs))
            np.testing.assert_allclose(ours, theirs, rtol=1e-10)


def test_average_ranks_are_scipys():
    rng = np.random.default_rng(1)
    for rows in (rng.standard_normal((5, 40)), rng.integers(0, 3, (6, 30)).astype(float), np.ones((2, 9))):
        np.testing.assert_array_equal(_arviz._average_ranks(rows), scipy.stats.rankdata(rows, method="average", axis=-1))


def test_function_rhat_refuses_inputs_of_the_wrong_width(chains, cancer):
    with pytest.raises(ppl.OptionError, match="X has 3 features but the model was fitted on 30"):
        function_rhat(chains, cancer.test.X[:, :3])
