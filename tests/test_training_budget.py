"""Optimisers train until their convergence test passes, in rounds of ``steps``, within ``max_steps``."""

from __future__ import annotations

import numpy as np
import pytest

from ppl.core import interrupt, progress
from ppl.models import BNN
import ppl

# L-BFGS on this small network (seed 6, float64) settles after four rounds of 40 steps. (Seeds 0
# and 2 need more than ten.)
NET = BNN(hidden=(8,), likelihood="bernoulli")
ROUND = 40


@pytest.fixture(scope="module")
def cancer():
    return ppl.datasets.load("breast_cancer", seed=0)


SEED = 6


@pytest.fixture(scope="module")
def rounds(cancer):
    return ppl.fit(NET, cancer.train, method="map", seed=SEED, steps=ROUND)


def test_an_unsettled_run_goes_on_for_another_round_and_stops_once_settled(rounds):
    assert rounds.status.converged and not rounds.status.interrupted
    assert rounds.status.steps_done == 4 * ROUND and rounds.trace.losses.shape == (4 * ROUND,)


def test_max_steps_caps_the_budget_and_the_verdict_says_so(cancer, rounds):
    exact = ppl.fit(NET, cancer.train, method="map", seed=SEED, steps=ROUND, max_steps=ROUND)
    assert exact.status.steps_done == ROUND and not exact.status.converged and not exact.status.interrupted
    # the first round is the same arithmetic either way
    np.testing.assert_array_equal(exact.trace.losses, rounds.trace.losses[:ROUND])
    capped = ppl.fit(NET, cancer.train, method="map", seed=0, steps=ROUND, max_steps=3 * ROUND)
    assert capped.status.steps_done == 3 * ROUND and not capped.status.converged
    assert "max_steps budget" in capped.status.convergence and "3 rounds of 40" in capped.status.convergence
    with pytest.raises(ppl.OptionError, match=r"max_steps=10 is below steps=40"):
        ppl.fit(NET, cancer.train, method="map", seed=SEED, steps=ROUND, max_steps=10)
    with pytest.raises(ppl.OptionError, match=r"max_steps=10 is below steps=40"):
        ppl.fit(NET, cancer.train, method="svi", seed=SEED, steps=ROUND, max_steps=10)


def test_a_run_interrupted_in_its_second_round_resumes_to_the_uninterrupted_result(cancer, rounds, monkeypatch,
                                                                                  tmp_path):
    monkeypatch.setattr(interrupt.ChunkPace, "next_chunk", lambda self: 10)
    real, calls = progress.advance, {"n": 0}

    def advance(steps, phase=0):
        real(steps, phase)
        calls["n"] += 1
        if calls["n"] == 6:  # one report where the bar starts, then one per chunk of 10: step 50
            interrupt.request()

    monkeypatch.setattr(progress, "advance", advance)
    part = ppl.fit(NET, cancer.train, method="map", seed=SEED, steps=ROUND)
    monkeypatch.undo()
    assert part.status.interrupted and part.status.steps_done == 50 and part.resume_state is not None
    part.save(tmp_path / "p")
    resumed = ppl.fit(NET, cancer.train, method="map", seed=SEED, steps=ROUND, resume=tmp_path / "p")
    np.testing.assert_array_equal(resumed.flat_draws, rounds.flat_draws)
    np.testing.assert_array_equal(resumed.trace.losses, rounds.trace.losses)
    assert resumed.status.converged and not resumed.status.interrupted


def test_an_ensemble_member_that_settles_is_frozen_while_the_others_train_on(cancer):
    budget = 10 * ROUND
    # Seed 1: members 0 and 2 settle (after 200 and 80 steps), members 1 and 3 use the whole budget.
    ensemble = ppl.fit(NET, cancer.train, method="ensemble", seed=1, num_members=4, steps=ROUND, max_steps=budget)
    losses = np.asarray(ensemble.trace.losses)
    assert losses.shape == (4, budget)
    unsettled = [m for m in range(4) if f"member {m}:" in ensemble.status.convergence]
    settled = [m for m in range(4) if m not in unsettled]
    assert settled and unsettled  # the seed gives both kinds, so the test shows something
    for m in range(4):
        last_change = int(np.flatnonzero(np.diff(losses[m]) != 0).max()) + 1
        if m in settled:
            # frozen at the end of the round that settled: its loss stays constant from there on
            assert last_change < budget - ROUND, (m, last_change)
        else:
            assert last_change > budget - ROUND, (m, last_change)
    # A member does not depend on the others: member 0 is the map run with the same seed (the same
    # L-BFGS arithmetic, member by member, up to rounding).
    single = ppl.fit(NET, cancer.train, method="map", seed=1, steps=ROUND, max_steps=budget)
    np.testing.assert_allclose(np.asarray(ensemble.flat_draws[0, 0]), np.asarray(single.flat_draws[0, 0]), atol=1e-9)
    assert single.status.converged == (0 in settled)


def test_svi_goes_on_in_rounds_and_keeps_its_schedule_per_round(linear_model, linear_data):
    # From the prior median with sd 0.1, 200 steps do not reach the optimum; restarted rounds do.
    exact = ppl.fit(linear_model, linear_data.train, method="svi", seed=0, steps=200, max_steps=200, init="median")
    longer = ppl.fit(linear_model, linear_data.train, method="svi", seed=0, steps=200, init="median")
    assert exact.status.steps_done == 200 and not exact.status.converged
    assert longer.status.steps_done > 200 and longer.status.steps_done % 200 == 0 and longer.status.converged
    np.testing.assert_array_equal(longer.trace.losses[:200], exact.trace.losses)


def test_a_round_that_ends_no_lower_than_the_one_before_has_settled():
    # Each round of a restarted schedule lowers a noisy loss as its steps shrink (here: noise that
    # decays within the round around a level 10 above the floor, ending near the floor). Judged
    # alone, every round's last window still falls; judged against the round before, a round that
    # ends at the same level bought nothing. A loss whose rounds keep ending lower is not settled.
    from ppl.inference.optimize import round_convergence

    rng = np.random.default_rng(0)
    steps = 1000
    within = np.linspace(10.0, 0.0, steps)  # the schedule's excess loss, falling within each round

    def run(levels):
        return np.concatenate([40.0 + level + within + rng.normal(0.0, 1.0, steps) for level in levels])

    flat = run([0.0, 0.0, 0.0])
    alone, _ = round_convergence(flat[-steps:], steps, 10 * steps, stochastic=True)
    assert not alone.converged and "still fell" in alone.convergence  # one round, nothing to compare with
    settled, _ = round_convergence(flat, steps, 10 * steps, stochastic=True)
    assert settled.converged, settled.convergence
    improving, _ = round_convergence(run([4.0, 2.0, 0.0]), steps, 10 * steps, stochastic=True)
    assert not improving.converged and "below the same steps of the round before" in improving.convergence


def test_a_non_finite_final_gradient_is_never_a_kink():
    # The descent test's trials are NaN when the gradient is; "no step descends" must not then read
    # as a kink and pass the run.
    from ppl.inference.optimize import loss_convergence

    losses = np.full(100, 3.0)
    status, _ = loss_convergence(losses, gradient=(10.0, float("nan")), stochastic=False, descends=False)
    assert not status.converged and "gradient norm nan" in status.convergence
    status, _ = loss_convergence(losses, gradient=(10.0, 5.0), stochastic=False, descends=False)
    assert status.converged and "kink" in status.convergence
