"""SG-MCMC (sgld, sghmc, cyclical_sgld) against the conjugate linear-regression posterior.

With default options every method must land its means within 0.15 posterior sd and its sds within
25% (the issue's bar; the measured values are quoted inline). The Monte Carlo error of a mean with
bulk ESS ≥ 300 is below 0.06 sd, so these bounds test the samplers, not the noise."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import flat_params

from ppl.diagnostics import _arviz
from ppl.inference.sgmcmc import whitening
import ppl

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
from make_malicious_run import reseal  # noqa: E402


@pytest.fixture(scope="module")
def fits(linear_model, linear_data):
    return {m: ppl.fit(linear_model, linear_data.train, method=m, seed=0) for m in ("sgld", "sghmc", "cyclical_sgld")}


@pytest.mark.slow  # a statistical check: out of the default run (15 minutes); CI runs it in the slow step
@pytest.mark.parametrize("method", ["sgld", "sghmc", "cyclical_sgld"])
def test_defaults_land_on_the_conjugate_posterior(method, fits, linear_truth):
    # measured 2026-12-05 (max mean error / sd, sd ratios, bulk ESS): sgld 0.011 / 1.01-1.03 / 3880 (50 steps a draw);
    # sghmc 0.053 / 0.98-1.02 / 3854; cyclical 0.069 / 0.98-0.99 / 830 (one round, since its cycles keep their
    # noise and end every 5 draws; 0.085 / 0.98-1.02 / 950 after 15 rounds with 4 noise-free cycles a round)
    post = fits[method]
    draws = flat_params(post.draws).reshape(-1, linear_truth["mean"].size)
    sd = np.sqrt(np.diag(linear_truth["cov"]))
    bound = 0.15 * sd  # the bar for sgld and sghmc, whose bulk ESS here is several hundred
    if method == "cyclical_sgld":
        # draws within a cycle are correlated (bulk ESS 830 of 4 × 1000): its mean's Monte Carlo error
        # alone is ~sd/√ESS, so it is held to 4 of those where that is wider
        ess = np.asarray(_arviz.ess(flat_params(post.draws), "bulk"))
        bound = np.maximum(bound, 4 * sd / np.sqrt(ess))
    assert np.all(np.abs(draws.mean(axis=0) - linear_truth["mean"]) <= bound)
    # sds: the step's predicted inflation (about 1.05 in variance for the Langevin steps, 1 for
    # SGHMC's BAOAB, exact on a Gaussian) within 4 Monte Carlo errors of an sd, ≈ 1/√(2 ESS). The old
    # SGHMC kernel's 1.12-1.15 failed this with its ESS of 1437 (bound 0.075).
    ess = float(np.min(_arviz.ess(flat_params(post.draws), "bulk")))
    expected = np.sqrt(post.chain_stats.variance_inflation)
    assert np.all(np.abs(draws.std(axis=0) / sd - expected) <= 4.0 / np.sqrt(2.0 * ess))
    assert post.chain_stats.temperature <= 1.25
    # a run whose ESS falls short continues in rounds of num_samples = 1000 draws per chain
    rounds, discarded = post.info["extension_rounds"], post.info["draws_discarded"]
    assert post.kind == "chains" and post.num_chains == 4 and post.num_draws == 1000 * rounds - discarded
    diag = post.diagnostics()
    assert diag.rhat_max is not None and diag.ess_bulk_min is not None and diag.khat is None


def test_the_predicted_variance_inflation_is_measured_and_fails_the_diagnostics(linear_model, linear_data, linear_truth):
    # ε = 1.5 (whitened units, λ = 1) predicts a stationary variance 1/(1 − ε/2) = 4× the posterior's:
    # the automatic batch takes all 80 rows here (their per-row gradient noise exceeds the curvature),
    # so there is no minibatch noise term
    post = ppl.fit(linear_model, linear_data.train, method="sgld", seed=0, step_size=1.5)
    predicted = post.chain_stats.variance_inflation
    measured = flat_params(post.draws).reshape(-1, 4).var(axis=0) / np.diag(linear_truth["cov"])
    assert post.info["batch_size"] == 80
    assert predicted == pytest.approx(4.0, rel=1e-6)
    # ESS > 1000 here: the variance ratio's MC error is a few percent
    np.testing.assert_allclose(measured, predicted, rtol=0.2)
    diag = post.diagnostics()
    assert not diag.ok and any("inflate the stationary variance" in w for w in diag.warnings)
    # the temperature measured at the draws sees the same excess without the Gaussian theory:
    # Σ cᵢλᵢ² / Σ λᵢ with every cᵢ ≈ 4 here (measured 3.6)
    assert post.chain_stats.temperature == pytest.approx(float(np.mean(measured)), rel=0.3)
    assert any("configurational temperature" in w for w in diag.warnings)
    default = ppl.fit(linear_model, linear_data.train, method="sgld", seed=0)
    assert default.chain_stats.variance_inflation < 1.06  # the automatic step's design value, 1/(1 − 0.05)


def test_whitening_inverts_the_curvature(linear_model, linear_data, linear_truth):
    import jax

    problem = ppl.fit(linear_model, linear_data.train, method="map", seed=0).problem
    white = whitening(problem, [problem.init_params], jax.random.PRNGKey(0))
    L = np.asarray(white.L)
    np.testing.assert_allclose(L @ L.T, linear_truth["cov"], rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(np.asarray(white.inverse) @ L, np.eye(4), atol=1e-10)


def test_a_diverging_step_stays_finite_and_fails_the_verdict(linear_model, linear_data):
    # ε λ = 50 ≫ 2: uncapped, the chains overflowed within a few steps; the drift cap keeps them
    # finite, and the predicted inflation (unbounded for ε λ ≥ 2) fails the run
    post = ppl.fit(linear_model, linear_data.train, method="sgld", seed=0, step_size=50.0, time_budget=0)
    assert np.all(np.isfinite(post.flat_draws)) and post.chain_stats.variance_inflation == float("inf")
    diag = post.diagnostics()
    assert not diag.ok and any("inflate the stationary variance" in w for w in diag.warnings)


def test_a_step_too_small_to_mix_is_told_in_time_covered_not_told_to_shrink(linear_model, linear_data):
    # 100 draws × 50 steps of ε = 1e-5 span 0.05 units of whitened time, where the posterior relaxes
    # in about one: the chains stay where they started. The advice was "lower step_size", which
    # would slow them further.
    post = ppl.fit(linear_model, linear_data.train, method="sgld", seed=0, step_size=1e-5, num_warmup=100,
                   num_samples=100, time_budget=0)
    diag = post.diagnostics()
    mixing = [w for w in diag.warnings if "chains disagree" in w or "effective draws" in w or "noisy" in w]
    assert not diag.ok and mixing
    for warning in mixing:
        assert "5,000 steps of ε = 1e-05, 0.05 units of time" in warning and "lower step_size" not in warning
        assert "method='sghmc'" in warning


def test_cold_chains_are_flagged_and_the_default_cycles_keep_their_noise(linear_model, linear_data, linear_truth):
    # the paper's cyclical SGLD descends without noise in each cycle's first 80%: its draws sat nearer
    # the mode (sd ratios 0.85-0.86 against the exact posterior, temperature 0.74 measured 2026-12-06)
    # and the verdict said ok while the temperature had only an upper bound
    sd = np.sqrt(np.diag(linear_truth["cov"]))
    cold = ppl.fit(linear_model, linear_data.train, method="cyclical_sgld", seed=0, exploration_noise=False, time_budget=0)
    ratios = flat_params(cold.draws).reshape(-1, 4).std(axis=0) / sd
    assert np.all(ratios < 0.9)  # 1 less 4 Monte Carlo errors of an sd ratio, 1/√(2 ESS) ≈ 0.025 at ESS ≈ 850
    assert cold.chain_stats.temperature < 0.8
    diag = cold.diagnostics()
    assert not diag.ok and any("too concentrated" in w and "exploration_noise=True" in w for w in diag.warnings)
    # with the noise kept through the large steps (the default) the same cycles land on the posterior:
    # sd ratios 0.98-0.99, temperature 0.97
    warm = ppl.fit(linear_model, linear_data.train, method="cyclical_sgld", seed=0, time_budget=0)
    ratios = flat_params(warm.draws).reshape(-1, 4).std(axis=0) / sd
    assert np.all(np.abs(ratios - 1.0) < 0.1) and 0.8 <= warm.chain_stats.temperature <= 1.25
    assert warm.diagnostics().ok


def test_bad_options_are_refused(linear_model, linear_data):
    with pytest.raises(ppl.OptionError, match="multiple of num_cycles"):
        ppl.fit(linear_model, linear_data.train, method="cyclical_sgld", seed=0, num_samples=10, num_cycles=3)
    with pytest.raises(ppl.DataError, match=r"batch_size must be an integer in 1..80"):
        ppl.fit(linear_model, linear_data.train, method="sgld", seed=0, batch_size=100)
    with pytest.raises(ppl.OptionError, match="step_size must be a positive"):
        ppl.fit(linear_model, linear_data.train, method="sghmc", seed=0, step_size=-1.0)
    # control variates need minibatches: on full batches they would cost MAP runs and buy nothing
    for batch in (None, 80):
        with pytest.raises(ppl.OptionError, match="control_variate=True corrects minibatch gradients"):
            ppl.fit(linear_model, linear_data.train, method="sgld", seed=0, control_variate=True, batch_size=batch)


def test_ctrl_c_keeps_the_draws_so_far_and_never_looks_complete(monkeypatch, linear_model, linear_data, tmp_path):
    from test_faults import _interrupt_after

    _interrupt_after(monkeypatch, 6)  # after warmup's five windows and the first chunk of draws
    post = ppl.fit(linear_model, linear_data.train, method="sgld", seed=0)
    assert post.status.interrupted and 0 < post.num_draws < 1000
    diag = post.diagnostics()
    assert not diag.ok and any("interrupted" in w for w in diag.warnings)
    monkeypatch.undo()
    _interrupt_after(monkeypatch, 1)  # during warmup: no draws yet, the warmed-up chains are kept
    with pytest.raises(ppl.Interrupted, match="before the first draw") as caught:
        ppl.fit(linear_model, linear_data.train, method="sgld", seed=0)
    caught.value.save(tmp_path / "warm")
    monkeypatch.undo()
    resumed = ppl.fit(linear_model, linear_data.train, method="sgld", seed=0, resume=tmp_path / "warm")
    full = ppl.fit(linear_model, linear_data.train, method="sgld", seed=0)
    np.testing.assert_array_equal(resumed.flat_draws, full.flat_draws)
    assert not resumed.status.interrupted and resumed.diagnostics().ok


def test_checkpoints_resume_mh_exactly_with_its_acceptance_count(linear_model, linear_data, tmp_path):
    options = dict(num_warmup=200, num_samples=450, num_chains=2, time_budget=0)
    full = ppl.fit(linear_model, linear_data.train, method="mh", seed=0, **options)
    ppl.fit(linear_model, linear_data.train, method="mh", seed=0, checkpoint=tmp_path / "ck", checkpoint_every=200,
            **options)
    partial = ppl.load(tmp_path / "ck")  # the last checkpoint written: after 400 of 450 draws
    assert partial.status.interrupted and partial.num_draws == 400 and not partial.diagnostics().ok
    resumed = ppl.fit(linear_model, linear_data.train, method="mh", seed=0, resume=tmp_path / "ck", **options)
    np.testing.assert_array_equal(resumed.flat_draws, full.flat_draws)
    np.testing.assert_array_equal(resumed.chain_stats.accept_prob, full.chain_stats.accept_prob)
    with pytest.raises(ppl.ResumeError, match="does not fit a run of 2 chains × 300 draws|another run"):
        ppl.fit(linear_model, linear_data.train, method="mh", seed=0, resume=tmp_path / "ck",
                **{**options, "num_samples": 300})


@pytest.mark.parametrize("method", ["sgld", "sghmc"])
def test_an_outlier_s_gradient_noise_is_measured_not_assumed(method, linear_model, linear_data):
    # One target at 1e12 makes the minibatch gradients scatter ~1e20 times more than the Fisher
    # information predicts. Found by the broken-input property test: without the measured scatter
    # the run reported ok with a mean 8e7 posterior sd off. Now the diagnostics fail it.
    X, y = (np.array(a, dtype=float) for a in linear_data.train)
    y[0] = 1e12
    # a minibatch of 16 (the automatic batch takes all 80 rows of so small a data set: no noise at all)
    post = ppl.fit(linear_model, (X, y), method=method, seed=0, num_warmup=0, batch_size=16)
    assert post.chain_stats.variance_inflation > 1e10
    diag = post.diagnostics()
    assert not diag.ok and any("check the data for outliers" in w for w in diag.warnings)
    clean = ppl.fit(linear_model, linear_data.train, method=method, seed=0)
    assert clean.chain_stats.variance_inflation < 1.06  # the automatic step's design value, 1/(1 − 0.05)


def test_an_extended_run_resumes_exactly_from_a_checkpoint_in_its_extension(linear_model, linear_data, tmp_path):
    # 150 draws per chain are too few for mh here: the run extends in rounds of 150 (R-hat fails at
    # first, so from the second round on the first half of the rounds is left out as warmup); a
    # checkpoint written during an extension round resumes to the same draws and the same verdict
    options = dict(num_warmup=200, num_samples=150, num_chains=2)
    full = ppl.fit(linear_model, linear_data.train, method="mh", seed=0, **options)
    rounds, discarded = full.info["extension_rounds"], full.info["draws_discarded"]
    assert rounds > 2 and discarded == 150 * (rounds // 2) and full.num_draws == 150 * rounds - discarded
    ppl.fit(linear_model, linear_data.train, method="mh", seed=0, checkpoint=tmp_path / "ck", checkpoint_every=200,
            **options)
    partial = ppl.load(tmp_path / "ck")
    # the last checkpoint was written inside the extension, before the run's end
    assert 150 < partial.status.steps_done < full.status.steps_done
    resumed = ppl.fit(linear_model, linear_data.train, method="mh", seed=0, resume=tmp_path / "ck", **options)
    np.testing.assert_array_equal(resumed.flat_draws, full.flat_draws)
    assert resumed.info["extension_stop"] == full.info["extension_stop"]
    assert resumed.diagnostics().ok == full.diagnostics().ok


def test_the_configurational_temperature_of_exact_and_widened_draws(linear_model, linear_data, linear_truth):
    # draws from the conjugate posterior itself give T = 1, and the same draws moved twice as far
    # from the mean (variance 4×, in every direction) give T = 4; each within 4 standard errors of
    # the ratio of means (delta method over the draws measured)
    from ppl.inference.sgmcmc import TEMPERATURE_DRAWS, _temperature_terms, configurational_temperature

    problem = ppl.fit(linear_model, linear_data.train, method="exact", seed=0).problem
    rng = np.random.default_rng(3)
    exact = rng.multivariate_normal(linear_truth["mean"], linear_truth["cov"], size=(4, 500))
    key = jax.random.PRNGKey(0)
    for scale, truth in ((1.0, 1.0), (2.0, 4.0)):
        draws = linear_truth["mean"] + scale * (exact - linear_truth["mean"])
        value = configurational_temperature(problem, draws, key)
        picks = np.unique(np.linspace(0, 499, TEMPERATURE_DRAWS // 4).astype(int))
        a, b = (np.asarray(t, dtype=float) for t in _temperature_terms(problem, jnp.asarray(draws[:, picks].reshape(-1, 4)), key))
        se = np.std(a - value * b) / np.sqrt(a.size) / np.mean(b)
        assert abs(value - truth) <= 4.0 * se, (scale, value, se)


def test_sghmc_keeps_its_momentum_and_lands_its_variances(linear_model, linear_data, linear_truth):
    # BAOAB with a persistent momentum: sds within 4 Monte Carlo errors of the exact ones (the
    # BlackJAX kernel it replaced gave 1.12-1.15 here, at a bound of 0.075)
    post = ppl.fit(linear_model, linear_data.train, method="sghmc", seed=0, time_budget=0)
    draws = flat_params(post.draws).reshape(-1, linear_truth["mean"].size)
    sd = np.sqrt(np.diag(linear_truth["cov"]))
    ess = float(np.min(_arviz.ess(flat_params(post.draws), "bulk")))
    assert np.all(np.abs(draws.std(axis=0) / sd - 1.0) <= 4.0 / np.sqrt(2.0 * ess))
    assert post.diagnostics().ok and post.chain_stats.temperature <= 1.25


def test_an_extension_after_a_failed_r_hat_leaves_the_start_out(linear_model, linear_data, linear_truth):
    # mh without warmup starts 60-90 posterior sds away. Rank-normalised R-hat barely sees those few
    # extreme draws once the run is long: before the first half of the rounds was left out, this run
    # passed R-hat after two rounds with the intercept's mean 0.88 sd off. Now the first round,
    # whose R-hat failed, counts as warmup.
    post = ppl.fit(linear_model, linear_data.train, method="mh", seed=0, num_warmup=0)
    assert post.info["extension_rounds"] >= 2 and post.info["draws_discarded"] >= 1000
    assert post.num_draws == 1000 * post.info["extension_rounds"] - post.info["draws_discarded"]
    draws = flat_params(post.draws).reshape(-1, linear_truth["mean"].size)
    sd = np.sqrt(np.diag(linear_truth["cov"]))
    # bulk ESS ≥ 400 bounds the mean's Monte Carlo error by 0.05 sd; 0.3 sd is the broken-input
    # property test's bar for a result marked ok
    assert post.diagnostics().ok and np.all(np.abs(draws.mean(axis=0) - linear_truth["mean"]) <= 0.3 * sd)


def test_the_frame_holds_the_noise_scales_curvature():
    # The GGN covers the network's outputs only; a regression's log σ has likelihood curvature
    # 2 Σ r²/σ² ≈ 2N, which the frame must carry (without it, the whitened curvature on UCI boston
    # was 43,000 along log σ alone, and every step that small)
    from ppl.core.curvature import network_mask
    from ppl.inference.sgmcmc import _curvature_at
    from ppl.models import BNN

    data = ppl.datasets.load("sinusoid", seed=0)
    problem = ppl.fit(BNN(hidden=(4,)), data.train, method="map", seed=0, steps=50, prior_precision=None).problem
    u = problem.init_position(jax.random.PRNGKey(1), "prior")
    noise = np.flatnonzero(~network_mask(problem))
    assert noise.size == 1
    exact = -np.asarray(jax.jit(jax.hessian(problem.logdensity_fn))(u))
    frame = np.asarray(_curvature_at(problem, u, jax.random.PRNGKey(0), True))
    j = int(noise[0])
    assert frame[j, j] == pytest.approx(exact[j, j], rel=1e-4) and exact[j, j] > 10.0
    # the network's block is still the GGN's (unchanged)
    weights = np.flatnonzero(network_mask(problem))
    assert np.all(np.diag(frame)[weights] > 0)


def test_a_loaded_run_measures_its_temperature_again(linear_model, linear_data, tmp_path):
    # the configurational temperature decides the verdict (ε = 1.5 spreads the draws about 4× in
    # variance: T ≈ 3.6 > 1.25); a saved run whose stored temperature was edited to 1.0 loads with
    # the value measured again at its draws with its own key, bit for bit the fit's, and still fails
    post = ppl.fit(linear_model, linear_data.train, method="sgld", seed=0, step_size=1.5, num_samples=200,
                   num_warmup=200, time_budget=0)
    assert post.chain_stats.temperature > 2.0 and not post.diagnostics().ok
    post.save(tmp_path / "run")
    meta_path = tmp_path / "run" / "posterior.json"
    meta = json.loads(meta_path.read_text())
    assert meta["records"]["chain_stats"]["temperature"] == pytest.approx(post.chain_stats.temperature)
    meta["records"]["chain_stats"]["temperature"] = 1.0
    meta_path.write_text(json.dumps(meta))
    reseal(tmp_path / "run")
    loaded = ppl.load(tmp_path / "run")
    assert loaded.chain_stats.temperature == post.chain_stats.temperature
    assert not loaded.diagnostics().ok
    assert any("configurational temperature" in w for w in loaded.diagnostics().warnings)


def test_control_variates_remove_most_of_the_minibatch_noise_and_resume(linear_model, linear_data, linear_truth,
                                                                        tmp_path):
    # sgld at a fixed whitened step 0.1 on minibatches of 8 of the 80 rows, one round of 4 × 1000
    # draws. The step alone makes the stationary variance 1/(1 − 0.05) = 1.053 times the posterior's
    # (sd 1.026); the plain minibatch gradient's noise adds to it (measured: sd ratios 1.17–1.21),
    # the control variate anchored at each chain's MAP removes most of it (measured 1.02–1.05).
    # Each sd ratio is held to 4 Monte Carlo errors, 1/√(2 ESS) of an sd.
    options = dict(step_size=0.1, batch_size=8, time_budget=0)
    sd = np.sqrt(np.diag(linear_truth["cov"]))
    step_alone = np.sqrt(1.0 / (1.0 - 0.05))
    runs = {cv: ppl.fit(linear_model, linear_data.train, method="sgld", seed=0, control_variate=cv, **options)
            for cv in (False, True)}
    for cv, post in runs.items():
        draws = flat_params(post.draws)
        ratio = draws.reshape(-1, 4).std(axis=0) / sd
        error = 4.0 / np.sqrt(2.0 * np.asarray(_arviz.ess(draws, "bulk")))
        if cv:
            assert np.all(np.abs(ratio - step_alone) <= error), (ratio, error)
            assert post.info["anchor_converged"] and post.diagnostics().ok
        else:
            assert np.all(ratio - step_alone > error), (ratio, error)
    # the noise the step and the verdict are built on is the control variate's, a fraction of the plain one's
    assert runs[True].info["gradient_noise"] < 0.5 * runs[False].info["gradient_noise"]
    # a run with control variates resumes from a checkpoint to the same draws (its anchors are in it)
    ppl.fit(linear_model, linear_data.train, method="sgld", seed=0, control_variate=True, checkpoint=tmp_path / "ck",
            checkpoint_every=600, **options)
    partial = ppl.load(tmp_path / "ck")
    assert 0 < partial.status.steps_done < 1000
    resumed = ppl.fit(linear_model, linear_data.train, method="sgld", seed=0, control_variate=True,
                      resume=tmp_path / "ck", **options)
    np.testing.assert_array_equal(resumed.flat_draws, runs[True].flat_draws)
    assert resumed.info["anchor_converged"] == runs[True].info["anchor_converged"]
    assert resumed.info["anchor_steps"] == runs[True].info["anchor_steps"]


def test_ctrl_c_while_the_anchors_are_found_keeps_their_state_and_resumes(monkeypatch, linear_model, linear_data,
                                                                          tmp_path):
    # the anchors' MAP runs are a phase of their own: a Ctrl-C there keeps the optimiser's state,
    # and resuming finds the same anchors and then the same draws as an uninterrupted run
    from test_faults import _interrupt_after

    options = dict(method="sgld", seed=0, control_variate=True, batch_size=8, time_budget=0, num_samples=200)
    full = ppl.fit(linear_model, linear_data.train, **options)
    for chunks in (1, 3):  # before the first step finished, and a few chunks in
        _interrupt_after(monkeypatch, chunks)
        with pytest.raises(ppl.Interrupted) as caught:
            ppl.fit(linear_model, linear_data.train, **options)
        monkeypatch.undo()
        caught.value.save(tmp_path / f"cut{chunks}")
        resumed = ppl.fit(linear_model, linear_data.train, resume=tmp_path / f"cut{chunks}", **options)
        np.testing.assert_array_equal(resumed.flat_draws, full.flat_draws)
        assert resumed.info["anchor_steps"] == full.info["anchor_steps"]
