"""Simulation-based calibration (Talts et al. 2018) and VSBC (Yao et al. 2018).

The fast tests check the mechanics (shapes, names, determinism, no recompilation, the plot, the
rank and χ² arithmetic against independent computations, argument errors). The slow tests check
the statistics: a correct sampler passes, an approximation known to be wrong fails.

Every statistical assertion is a Bonferroni-corrected test at α = 0.01 over the P scalar
parameters (``result.passed(ALPHA)``: every p-value above α/P), so a correct method fails it with
probability at most 1%; the seeds are fixed, so each outcome is reproducible.
"""

from __future__ import annotations

import itertools

import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from scipy.stats import chisquare, ks_2samp

from ppl._sbc import SBCResult, default_num_bins, ranks_of, sbc, symmetry_test
from ppl.core.problem import trace_count
import ppl

ALPHA = 0.01
SIGMA = np.array([1.0, 0.5, 2.0, 1.0])  # known observation scales of the 4 groups


def gaussian_groups(sigma, y=None):
    """mu ~ N(0, 1), theta_k ~ N(mu, 1), y_k ~ N(theta_k, sigma_k): a Gaussian posterior, which a
    full-rank Gaussian q can represent exactly."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("groups", sigma.shape[0]):
        theta = numpyro.sample("theta", dist.Normal(mu, 1.0))
        numpyro.sample("y", dist.Normal(theta, sigma), obs=y)


def hierarchical_noncentred(sigma, y=None):
    """Eight-schools-style hierarchy, non-centred: theta_k = mu + tau * eta_k."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    tau = numpyro.sample("tau", dist.HalfNormal(1.0))
    with numpyro.plate("groups", sigma.shape[0]):
        eta = numpyro.sample("eta", dist.Normal(0.0, 1.0))
        numpyro.sample("y", dist.Normal(mu + tau * eta, sigma), obs=y)


def hierarchical_centred(sigma, y=None):
    """The same hierarchy, centred: theta_k ~ N(mu, tau). Its posterior is a funnel in (log tau, theta)."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    tau = numpyro.sample("tau", dist.HalfNormal(1.0))
    with numpyro.plate("groups", sigma.shape[0]):
        theta = numpyro.sample("theta", dist.Normal(mu, tau))
        numpyro.sample("y", dist.Normal(theta, sigma), obs=y)


def correlated_regression(X, y=None):
    """w ~ N(0, I₂), y ~ N(X w, 0.5²) with nearly collinear columns of X: a Gaussian posterior whose
    two weights have correlation close to −1."""
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Normal(X @ w, 0.5), obs=y)


def _collinear_inputs() -> np.ndarray:
    rng = np.random.default_rng(0)
    base = rng.normal(size=20)
    return np.stack([base, base + 0.05 * rng.normal(size=20)], axis=1)


def _report(label: str, result: SBCResult) -> None:
    print(f"\n[{label}]\n{result}")


# -- fast: mechanics ---------------------------------------------------------------------------------

FAST_SVI = dict(data={"sigma": SIGMA}, num_ranks=19, method="svi", guide="full_rank", steps=300)


@pytest.fixture(scope="module")
def svi_result():
    return sbc(gaussian_groups, num_simulations=20, seed=3, **FAST_SVI)


@pytest.mark.slow  # a statistical check: out of the default run (15 minutes); CI runs it in the slow step
def test_density_method_result_layout(svi_result):
    result = svi_result
    assert result.method == "svi" and result.num_simulations == 20 and result.num_ranks == 19
    assert result.param_names == ("mu", "theta[0]", "theta[1]", "theta[2]", "theta[3]")
    assert result.ranks.shape == (20, 5) and result.ranks.dtype == np.int64
    assert result.ranks.min() >= 0 and result.ranks.max() <= 19
    # 20 rank values 0..19 and 20 simulations: the largest divisor of 20 with >= 10 expected is 2.
    assert result.num_bins == default_num_bins(20, 19) == 2
    assert result.counts().shape == (5, 2) and np.all(result.counts().sum(axis=1) == 20)
    assert result.vsbc_pvalues.shape == (5,) and result.vsbc_reason is None
    assert result.cdf_values.shape == (20, 5)
    assert np.all((result.cdf_values >= 0) & (result.cdf_values <= 1))
    assert result.min_ess is None  # independent draws from q: nothing to thin
    text = str(result)
    assert all(name in text for name in result.param_names) and "VSBC" in text


def test_chi_squared_matches_scipy(svi_result):
    counts = svi_result.counts()
    expected = chisquare(counts, axis=1)
    np.testing.assert_allclose(svi_result.chi2, expected.statistic, rtol=1e-12)
    np.testing.assert_allclose(svi_result.pvalues, expected.pvalue, rtol=1e-12)


def test_same_seed_same_ranks_without_recompiling(svi_result):
    before = trace_count()
    again = sbc(gaussian_groups, num_simulations=20, seed=3, **FAST_SVI)
    assert trace_count() == before, "a same-shaped simulated dataset retraced the log density"
    np.testing.assert_array_equal(again.ranks, svi_result.ranks)
    np.testing.assert_array_equal(again.cdf_values, svi_result.cdf_values)
    other = sbc(gaussian_groups, num_simulations=20, seed=4, **FAST_SVI)
    assert not np.array_equal(other.ranks, svi_result.ranks)


def test_plot_writes_a_png(svi_result, tmp_path):
    path = tmp_path / "ranks.png"
    svi_result.plot(path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ppl.OptionError, match="not among"):
        svi_result.plot(tmp_path / "other.png", params=["sigma"])


@pytest.mark.slow  # a statistical check: out of the default run (15 minutes); CI runs it in the slow step
def test_sampler_thins_and_records_ess():
    options = dict(num_chains=2, num_warmup=60, num_samples=30)
    result = sbc(hierarchical_noncentred, "nuts", 10, 0, data={"sigma": SIGMA}, num_ranks=59, num_bins=2, **options)
    assert result.ranks.shape == (10, 6) and result.ranks.max() <= 59
    assert result.param_names[:2] == ("mu", "tau")
    assert result.vsbc_pvalues is None and result.cdf_values is None and "sampler" in result.vsbc_reason
    assert result.min_ess.shape == (10,) and np.all(result.min_ess > 0)
    # 10 simulations in 2 bins expect 5 per bin: exactly the chi-squared threshold, no note.
    assert not any("rough" in note for note in result.notes)
    with pytest.raises(ppl.OptionError, match="stored 60 draws"):
        sbc(hierarchical_noncentred, "nuts", 10, 0, data={"sigma": SIGMA}, num_ranks=99, num_bins=2, **options)


def test_point_estimate_ranks_are_extreme_and_have_no_vsbc():
    # Every one of the L "draws" is the point estimate, so the truth ranks 0 or L, never between.
    result = sbc(gaussian_groups, "svi", 10, 0, data={"sigma": SIGMA}, num_ranks=9, num_bins=2, guide="delta", steps=50)
    assert set(np.unique(result.ranks)) <= {0, 9}
    assert result.vsbc_pvalues is None and "point estimate" in result.vsbc_reason


def test_ranks_count_draws_below_and_break_ties_uniformly():
    import jax

    draws = np.array([[0.0, 1.0], [1.0, 2.0], [2.0, 3.0]])
    np.testing.assert_array_equal(ranks_of(draws, np.array([1.5, -1.0]), jax.random.PRNGKey(0)), [2, 0])
    # Every draw ties with the truth: the rank must be uniform on 0..L (here L = 3).
    num_columns, num_draws = 40_000, 3
    tied = ranks_of(np.zeros((num_draws, num_columns)), np.zeros(num_columns), jax.random.PRNGKey(1))
    frequencies = np.bincount(tied, minlength=num_draws + 1) / num_columns
    # Each frequency is a binomial proportion with sd sqrt(p(1-p)/n) = 0.0022; 5 sd bounds it.
    tolerance = 5 * np.sqrt(0.25 * 0.75 / num_columns)
    np.testing.assert_allclose(frequencies, 0.25, atol=tolerance)


def test_symmetry_statistic_is_ks_and_its_pvalue_is_exact():
    rng = np.random.default_rng(0)
    # Ties with the mirror image (0 and 1, 0.3 and 0.7) and a value at 1/2 on purpose.
    values = np.concatenate([rng.uniform(size=40), [0.0, 0.0, 1.0, 0.3, 0.7, 0.7, 0.5]])
    statistic, _ = symmetry_test(values)
    assert statistic == pytest.approx(ks_2samp(values, 1.0 - values).statistic, abs=1e-12)
    # The p-value is P(D >= observed) over all 2^n sign patterns of the offsets from 1/2.
    distances = rng.choice([0.1, 0.25, 0.4, 0.5], size=11)
    for observed_signs in (rng.choice([-1.0, 1.0], size=11) for _ in range(4)):
        observed, pvalue = symmetry_test(0.5 + observed_signs * distances)
        extreme = sum(
            symmetry_test(0.5 + np.array(signs) * distances)[0] >= observed - 1e-12
            for signs in itertools.product([-1.0, 1.0], repeat=11)
        )
        assert pvalue == pytest.approx(extreme / 2**11, abs=1e-12)
    assert symmetry_test(np.full(5, 0.5)) == (0.0, 1.0)


@pytest.mark.parametrize(
    "arguments, match",
    [
        (dict(num_simulations=1), "num_simulations must be an integer >= 2"),
        (dict(num_ranks=0), "num_ranks must be an integer >= 1"),
        (dict(num_bins=3), "does not divide num_ranks"),
        (dict(num_simulations=5), "no bin count"),
        (dict(observed="z"), "not an argument of the program"),
        (dict(data={"sigma": SIGMA, "y": SIGMA}), "the site that sbc simulates"),
        (dict(observed=""), "observed must be the name"),
        (dict(vsbc_draws=0), "vsbc_draws must be an integer >= 1"),
    ],
)
def test_bad_arguments_raise_option_errors(arguments, match):
    call = dict(model_fn=gaussian_groups, method="svi", num_simulations=20, seed=0, data={"sigma": SIGMA})
    call.update(arguments)
    with pytest.raises(ppl.OptionError, match=match):
        sbc(**call)


def test_passed_rejects_bad_alpha(svi_result):
    with pytest.raises(ppl.OptionError, match="alpha"):
        svi_result.passed(alpha=1.5)


# -- slow: statistics ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_nuts_is_calibrated_on_a_hierarchical_model():
    """NUTS on the non-centred hierarchy: ranks uniform for every parameter (Bonferroni, α = 1%).

    Thinning 1000 stored draws to L = 99 is Talts et al.'s remedy for autocorrelation; the premise
    is that the typical fit has an ESS of at least L, which the test checks before trusting a pass.
    """
    result = sbc(
        hierarchical_noncentred, "nuts", 300, 0, data={"sigma": SIGMA},
        num_chains=1, num_warmup=300, num_samples=1000,
    )
    _report("nuts, non-centred hierarchy (positive)", result)
    assert result.num_bins == 25 and result.param_names == ("mu", "tau", "eta[0]", "eta[1]", "eta[2]", "eta[3]")
    assert np.median(result.min_ess) >= result.num_ranks
    assert result.passed(ALPHA), f"chi2 p-values {result.pvalues} (threshold {ALPHA / result.num_params:.3g})"


@pytest.mark.extended  # beyond CI's 90 minutes with the rest: pytest -m extended (README)
def test_mean_field_on_a_funnel_fails_ranks_and_vsbc():
    """Negative control: a mean-field Gaussian on the centred hierarchy's funnel.

    A Gaussian in (mu, log tau, theta) cannot follow the funnel, so q is wrong in tau both in width
    (ranks) and in location (VSBC: Pr_q(tau <= tau~) is not symmetric about 1/2, as Yao et al. 2018
    found for the eight-schools model). Both Bonferroni-corrected tests must reject, and both for tau.
    """
    result = sbc(hierarchical_centred, "svi", 200, 0, data={"sigma": SIGMA}, guide="mean_field")
    _report("svi mean_field, centred hierarchy (negative)", result)
    threshold = ALPHA / result.num_params
    tau = result.param_names.index("tau")
    assert not result.passed(ALPHA) and result.pvalues[tau] < threshold
    assert result.vsbc_passed(ALPHA) is False and result.vsbc_pvalues[tau] < threshold


@pytest.mark.slow
def test_mean_field_on_a_correlated_gaussian_fails_ranks_but_not_vsbc():
    """Negative control for the rank test, and VSBC's documented blind spot.

    On a Gaussian posterior with correlation near −1, the mean-field optimum has the exact mean and
    marginal variances 1/Λⱼⱼ far below the posterior's: ranks pile up at 0 and L (∪ shape) and the
    χ² test rejects. VSBC cannot see it: the model is invariant under (w, y) → (−w, −y) and so is
    the whole SVI run (a prior draw as starting point, Gaussian noise, Adam's sign-equivariant
    steps), so p = Pr_q(wⱼ ≤ w̃ⱼ) and 1 − p have exactly the same distribution, whatever the width
    of q or how far the optimiser got. The symmetry test is then at its null and, with its exact
    p-value, rejects with probability at most α.
    """
    result = sbc(correlated_regression, "svi", 200, 0, data={"X": _collinear_inputs()}, guide="mean_field")
    _report("svi mean_field, correlated regression (negative for ranks only)", result)
    assert result.param_names == ("w[0]", "w[1]")
    assert not result.passed(ALPHA)
    assert result.vsbc_passed(ALPHA) is True
