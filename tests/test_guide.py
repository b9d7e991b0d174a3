"""Posterior.as_numpyro_guide: a fitted density used as a NumPyro guide gives NumPyro's ELBO equal
to ppl's, within the Monte Carlo error of both estimates."""

from __future__ import annotations

import jax
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro import handlers
from numpyro.infer import Predictive, Trace_ELBO

from ppl.models import LinearRegression
import ppl

NUMPYRO_PARTICLES = 4000


def _elbo_agrees(post, model, *args):
    guide = post.as_numpyro_guide()
    ours = post.log_density_ratios()
    theirs = -float(Trace_ELBO(num_particles=NUMPYRO_PARTICLES).loss(jax.random.PRNGKey(2), {}, model, guide, *args))
    # ppl's ELBO is the mean over its stored draws, NumPyro's over fresh ones: the difference has
    # variance var(ratios) (1/S + 1/NUMPYRO_PARTICLES)
    se = ours.std(ddof=1) * np.sqrt(1 / ours.size + 1 / NUMPYRO_PARTICLES)
    assert abs(theirs - post.diagnostics().elbo) <= 4 * se + 1e-9 * abs(theirs), (theirs, post.diagnostics().elbo, se)


@pytest.mark.slow  # out of the default run to keep it near 15 minutes; CI runs it in the slow step
@pytest.mark.parametrize("method, options", [("svi", {"guide": "full_rank", "steps": 1500}), ("swag", {})])
def test_numpyro_elbo_and_predictive_through_the_guide(method, options, linear_data):
    model = LinearRegression(noise_scale=None)  # a constrained site (sigma): the Jacobian matters
    X, y = linear_data.train
    post = ppl.fit(model, (X, y), method=method, seed=0, **options)
    _elbo_agrees(post, model, X, y)
    samples = Predictive(model, guide=post.as_numpyro_guide(), num_samples=4000, return_sites=["w", "sigma"])(
        jax.random.PRNGKey(1), X
    )
    # the guide's draws have q's moments: means within 4 standard errors of the stored draws' means
    for site in ("w", "sigma"):
        stored = post.draws[site].reshape(post.num_draws, -1)
        se = stored.std(axis=0) * np.sqrt(1 / stored.shape[0] + 1 / 4000)
        assert np.all(np.abs(samples[site].reshape(4000, -1).mean(axis=0) - stored.mean(axis=0)) <= 4 * se + 1e-12)
    assert np.all(samples["sigma"] > 0)


def test_a_plain_program_guide_and_its_sites():
    def program(y=None):
        mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
        s = numpyro.sample("s", dist.HalfNormal(1.0))
        with numpyro.plate("data", 50):
            numpyro.sample("y", dist.Normal(mu, s), obs=y)

    y = np.random.default_rng(0).normal(size=50)
    post = ppl.fit(program, {"y": y}, method="laplace", seed=0)
    _elbo_agrees(post, program, y)
    # the guide records only its own sites: the model it runs internally to constrain u is blocked
    tr = handlers.trace(handlers.seed(post.as_numpyro_guide(), 0)).get_trace(y)
    assert set(tr) == {"_ppl_u", "mu", "s"}


def test_methods_without_a_density_are_refused(linear_model, linear_data):
    for method, options in (("map", {}), ("nuts", {"num_warmup": 20, "num_samples": 20, "num_chains": 1})):
        post = ppl.fit(linear_model, linear_data.train, method=method, seed=0, **options)
        with pytest.raises(TypeError, match="no density"):
            post.as_numpyro_guide()


@pytest.mark.slow  # out of the default run to keep it near 15 minutes; CI runs it in the slow step
def test_svi_starts_from_a_given_posterior(linear_model, linear_data, linear_truth):
    exact = ppl.fit(linear_model, linear_data.train, method="exact", seed=0)
    # The guide is written in the given posterior's frame (units of its sds) and starts there; Adam's
    # first step moves each frame coordinate by exactly learning_rate = 0.01, so after one step the
    # mean is within ~0.01 sd per coordinate (0.02 allows for the frame's rotation) and the sds within
    # e^0.01 plus the off-diagonal moves (3%).
    post = ppl.fit(linear_model, linear_data.train, method="svi", seed=0, init=exact, guide="full_rank", steps=1,
                   max_steps=1)
    assert post.info["start"] == "started at the given exact Gaussian"
    sd = np.sqrt(np.diag(linear_truth["cov"]))
    q = post.approximation
    assert np.all(np.abs(np.asarray(q.mean) - linear_truth["mean"]) < 0.02 * sd)
    np.testing.assert_allclose(np.sqrt(np.diag(np.asarray(q.covariance()))), sd, rtol=0.03)
    assert "exact posterior (seed 0" in post.options["init"]
    # from a sampler: the draws' mean and covariance
    nuts = ppl.fit(linear_model, linear_data.train, method="nuts", seed=0, num_warmup=200, num_samples=200,
                    time_budget=0)
    again = ppl.fit(linear_model, linear_data.train, method="svi", seed=0, init=nuts, steps=50)
    assert again.info["start"].startswith("started at the mean and covariance of the given nuts run's 800 draws")
    with pytest.raises(ppl.OptionError, match="init must be a fitted Posterior of this model"):
        ppl.fit(LinearRegression(bias=False), linear_data.train, method="svi", seed=0, init=exact)


def test_a_networks_unsettled_map_start_keeps_where_the_climb_stopped(monkeypatch):
    """A network's MAP climb that does not settle within its iterations still ends nearer the
    posterior than its prior-draw start (a network's priors have fixed scales: no funnel to run
    down), so the guide starts where it stopped; it used to start back at the climb's beginning."""
    from ppl.core.problem import compile_problem
    from ppl.inference import svi
    from ppl.models import BNN

    monkeypatch.setattr(svi, "MAP_INIT_STEPS", 3)
    data = ppl.datasets.load("breast_cancer", seed=0)
    problem = compile_problem(BNN(hidden=(8,), likelihood="bernoulli"), data.train)
    key = jax.random.PRNGKey(0)
    frame, note = svi.starting_frame(problem, key, "map", None, 0.01)
    assert "did not settle" in note and "where it stopped" in note, note
    start = problem.init_position(key, "prior")
    assert float(problem.log_joint(frame.shift)) > float(problem.log_joint(start)) + 1.0
