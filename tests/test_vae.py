"""VAEs: local latents, the amortised guide, closed-form checks (probabilistic PCA) and the VAE API."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import multivariate_normal

from ppl.core.registry import METHODS
from ppl.models import VAE
import ppl

PPCA_NOISE = 0.3


@pytest.fixture(scope="module")
def ppca_data():
    """Data from a probabilistic PCA model: x = W z + b + σ ε, z ∈ R², x ∈ R⁵."""
    rng = np.random.default_rng(0)
    W = rng.normal(size=(5, 2)) * np.array([2.0, 1.0])
    b = rng.normal(size=5)
    def draw(n):
        return rng.normal(size=(n, 2)) @ W.T + b + PPCA_NOISE * rng.normal(size=(n, 5))
    return draw(600), draw(300)


@pytest.fixture(scope="module")
def ppca_fit(ppca_data):
    train, _ = ppca_data
    model = VAE(latent_dim=2, hidden=(32,), decoder_hidden=(), likelihood="gaussian", noise_scale=PPCA_NOISE)
    return ppl.fit(model, train, method="svi", seed=0, steps=4000, batch_size=100, learning_rate=0.01)


def _marginal(post):
    """The fitted linear decoder's exact marginal N(b, W Wᵀ + σ² I)."""
    params = post.problem.constrain(post.approximation.mean)
    W, b = np.asarray(params["w0"]).T, np.asarray(params["b0"])
    return multivariate_normal(b, W @ W.T + PPCA_NOISE**2 * np.eye(W.shape[0]))


def test_log_marginal_equals_the_linear_decoders_closed_form(ppca_fit, ppca_data):
    from ppl.core.vae import importance_weights

    _, test = ppca_data
    X = test[:100]
    log_w, _, _ = importance_weights(ppca_fit, X, 500, seed=1)
    estimate = np.logaddexp.reduce(log_w, axis=0) - math.log(log_w.shape[0])
    np.testing.assert_allclose(estimate, ppca_fit.log_marginal(X, 500, seed=1))
    exact = _marginal(ppca_fit).logpdf(X)
    # Delta-method standard error of each log-mean-exp: sd(w) / (√K mean(w)).
    w = np.exp(log_w - log_w.max(axis=0))
    se = w.std(axis=0, ddof=1) / (math.sqrt(w.shape[0]) * w.mean(axis=0))
    total_se = math.sqrt(np.sum(se**2))
    assert abs(np.sum(estimate - exact)) <= 3 * total_se + 1e-9, (np.sum(estimate - exact), total_se)


@pytest.mark.slow  # out of the default run to keep it near 15 minutes; CI runs it in the slow step
def test_trained_ppca_vae_is_within_a_nat_of_maximum_likelihood_ppca(ppca_fit, ppca_data):
    """Tipping & Bishop (1999): with σ fixed, the ML solution is b = mean, W = U_q (Λ_q − σ² I)^½."""
    train, test = ppca_data
    mean = train.mean(axis=0)
    evals, evecs = np.linalg.eigh(np.cov(train, rowvar=False, bias=True))
    order = np.argsort(evals)[::-1][:2]
    W = evecs[:, order] * np.sqrt(np.maximum(evals[order] - PPCA_NOISE**2, 0.0))
    ml = multivariate_normal(mean, W @ W.T + PPCA_NOISE**2 * np.eye(train.shape[1])).logpdf(test).mean()
    fitted = _marginal(ppca_fit).logpdf(test).mean()
    assert fitted >= ml - 1.0, (fitted, ml)
    held_out = ppca_fit.log_marginal(test, 500, seed=2).mean()
    assert held_out >= ml - 1.0, (held_out, ml)


@pytest.fixture(scope="module")
def digits():
    return ppl.datasets.load("digits_binary", seed=0)


def _small_vae(digits, seed=0, **options):
    model_options = {k: options.pop(k) for k in ("beta", "latent_dim", "likelihood", "bayesian_decoder") if k in options}
    model = VAE(latent_dim=model_options.pop("latent_dim", 4), hidden=(64,), **model_options)
    options = {"steps": 1500, "batch_size": 128, "learning_rate": 0.003, **options}
    return ppl.fit(model, digits.train.X, method="svi", seed=seed, **options)


@pytest.mark.extended  # about 2 minutes; beyond CI's 90 minutes with the rest: pytest -m extended (README)
def test_beta_trades_rate_for_distortion(digits):

    reports = {beta: ppl.vae_report(_small_vae(digits, beta=beta), digits.test.X, seed=1, gap_points=0)
               for beta in (0.5, 1.0, 4.0)}
    rates = [reports[b].rate for b in (0.5, 1.0, 4.0)]
    distortions = [reports[b].distortion for b in (0.5, 1.0, 4.0)]
    assert rates[0] > rates[1] > rates[2], rates
    assert distortions[0] < distortions[1] < distortions[2], distortions


@pytest.mark.slow  # moved out of the default run to keep it under 15 minutes; CI runs it in the slow step
def test_vae_api_save_load_and_show(digits, tmp_path, capsys):
    post = _small_vae(digits, latent_dim=2, steps=600)
    X = digits.test.X[:6]
    loc, scale = post.encode(X)
    assert loc.shape == scale.shape == (6, 2) and np.all(scale > 0)
    assert post.decode(loc).shape == (6, 64) and np.all((post.decode(loc) >= 0) & (post.decode(loc) <= 1))
    generated = post.generate(5, seed=0)
    assert generated.shape == (5, 64) and set(np.unique(generated)) <= {0.0, 1.0}
    assert post.reconstruct(X, seed=0).shape == (6, 64)
    diag = post.diagnostics()
    assert diag.elbo is not None and diag.iwae is not None and diag.elbo <= diag.iwae
    post.save(tmp_path / "vae")
    again = ppl.load(tmp_path / "vae")
    np.testing.assert_allclose(again.encode(X)[0], loc)
    np.testing.assert_allclose(again.log_marginal(X, 100, seed=3), post.log_marginal(X, 100, seed=3))
    assert again.diagnostics().elbo == pytest.approx(diag.elbo)
    # A linear model's Posterior has no encoder.
    lin = ppl.fit(ppl.models.LinearRegression(), ppl.datasets.load("linear", seed=0).train, method="map", seed=0)
    with pytest.raises(TypeError, match="local latents"):
        lin.encode(X)


@pytest.mark.slow  # out of the default run to keep it near 15 minutes; CI runs it in the slow step
def test_learned_gaussian_noise_never_collapses(digits):
    from ppl.models.vae import SIGMA_FLOOR

    post = _small_vae(digits, likelihood="gaussian", steps=400)
    sigma = float(post.draws["sigma"].reshape(-1)[0])
    assert sigma >= SIGMA_FLOOR and np.isfinite(sigma)


@pytest.mark.slow  # out of the default run to keep it near 15 minutes; CI runs it in the slow step
def test_bayesian_decoder_has_a_distribution_over_its_weights(digits):
    post = _small_vae(digits, bayesian_decoder=True, steps=400, num_draws=50)
    assert post.info["guide"] == "mean_field" and post.num_draws == 50
    assert float(np.std(post.draws["w0"], axis=(0, 1)).min()) > 0


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_serves_the_vae_or_points_to_the_local_model(method, digits):
    """Conformance over the registry: a method fits a VAE as a whole, or refuses before compiling and
    says how to fit the local posterior with it instead."""
    cls = ppl.core.registry.get(method)
    model = VAE(latent_dim=2, hidden=(16,))
    if cls.supports_local:
        post = ppl.fit(model, digits.train.X, method=method, seed=0, steps=200, batch_size=128)
        assert np.all(np.isfinite(post.encode(digits.test.X[:3])[0]))
    else:
        with pytest.raises(ppl.OptionError, match="local_model"):
            ppl.fit(model, digits.train.X, method=method, seed=0)


@pytest.mark.slow  # moved out of the default run to keep it under 15 minutes; CI runs it in the slow step
def test_local_posterior_by_nuts_agrees_with_the_encoder_roughly(digits):
    post = _small_vae(digits, latent_dim=2)
    X = digits.test.X[:5]
    exact = ppl.fit(post.local_model(X), method="nuts", seed=0, num_chains=2, num_warmup=300, num_samples=300)
    assert exact.diagnostics().rhat_max < 1.05
    z = exact.draws["z"].reshape(-1, 5, 2)
    loc, scale = post.encode(X)
    # An amortised Gaussian is not the exact posterior, but it must be in the right place.
    assert np.all(np.abs(loc - z.mean(axis=0)) <= 3 * z.std(axis=0)), (loc, z.mean(axis=0), z.std(axis=0))


@pytest.mark.parametrize(
    "data, message",
    [
        (lambda d: (d.train.X, d.train.y), "data array X alone"),
        (lambda d: d.train.X * 3.0, r"outside \[0, 1\]"),
        (lambda d: {"X": d.train.X}, "not a dict"),
    ],
)
def test_bad_vae_data_is_refused(digits, data, message):
    with pytest.raises(ppl.DataError, match=message):
        ppl.fit(VAE(latent_dim=2), data(digits), method="svi", seed=0)


def test_point_estimated_decoder_refuses_a_weight_posterior(digits):
    with pytest.raises(ppl.OptionError, match="bayesian_decoder=True"):
        ppl.fit(VAE(latent_dim=2), digits.train.X, method="svi", seed=0, guide="mean_field")


def test_vae_config_is_validated():
    with pytest.raises(ValueError, match="latent_dim"):
        VAE(latent_dim=0)
    with pytest.raises(ValueError, match="noise_scale applies only"):
        VAE(noise_scale=0.1)
    assert VAE(hidden=(32, 16)).decoder_widths == (16, 32)
    assert VAE(decoder_hidden=()).decoder_widths == ()


@pytest.mark.slow
def test_vae_report_measures_the_amortisation_gap(digits):

    post = _small_vae(digits, latent_dim=2)
    report = ppl.vae_report(post, digits.test.X, seed=0, gap_points=5)
    assert report.elbo <= report.iwae <= report.log_px + 0.05
    assert report.amortization_gap >= -0.05  # the best per-datum Gaussian is at least as good as the encoder
    assert 0 <= report.khat_frac_above_0_7 <= 1 and report.active_units <= 2
    assert report.encoder_mean_error is not None and report.encoder_sd_ratio > 0
