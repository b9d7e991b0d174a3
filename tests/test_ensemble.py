"""Deep ensembles: the members axis of the optimisation loop, and the declared posterior kind."""

from __future__ import annotations

import numpy as np
import pytest

from ppl.models import BNN
import ppl


@pytest.fixture(scope="module")
def cancer():
    return ppl.datasets.load("breast_cancer", seed=0)


def test_one_member_is_the_map_run_with_the_same_seed(linear_model, linear_data):
    # L-BFGS on a convex problem: the vmapped program retraces map's arithmetic up to rounding
    ensemble = ppl.fit(linear_model, linear_data.train, method="ensemble", seed=3, num_members=1)
    single = ppl.fit(linear_model, linear_data.train, method="map", seed=3)
    np.testing.assert_allclose(np.asarray(ensemble.flat_draws[0, 0]), np.asarray(single.flat_draws[0, 0]), atol=1e-10)
    assert ensemble.kind == "members" and single.kind == "point"


@pytest.mark.slow  # out of the default run to keep it near 15 minutes; CI runs it in the slow step
def test_members_do_not_depend_on_the_ensemble_size_and_member_zero_is_map(cancer):
    # Adam on minibatches: every step's arithmetic is the same, so member m agrees to rounding.
    # (A long L-BFGS run on a non-convex network amplifies last-bit differences between the batched
    # and the single program — 2e-16 after one step, 5e-13 after 30 — so it is not compared there.)
    model = BNN(hidden=(8,), likelihood="bernoulli")
    opts = dict(optimizer="adam", batch_size=64, steps=200, max_steps=200)
    three = ppl.fit(model, cancer.train, method="ensemble", seed=0, num_members=3, **opts)
    five = ppl.fit(model, cancer.train, method="ensemble", seed=0, num_members=5, **opts)
    np.testing.assert_allclose(np.asarray(three.flat_draws), np.asarray(five.flat_draws[:3]), atol=1e-12)
    single = ppl.fit(model, cancer.train, method="map", seed=0, **opts)
    np.testing.assert_allclose(np.asarray(five.flat_draws[0, 0]), np.asarray(single.flat_draws[0, 0]), atol=1e-12)
    # independent initialisations: distinct members
    assert np.min(np.ptp(np.asarray(five.flat_draws[:, 0]), axis=0).max()) > 1e-3
    assert five.trace.losses.shape == (5, 200)


@pytest.mark.slow  # out of the default run to keep it near 15 minutes; CI runs it in the slow step
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


def test_minibatch_indices_are_those_of_jax_random_choice():
    # The optimisation loop draws minibatches without jax.random.choice's two-operand sort; the
    # indices must be the very ones it returns (one round of shuffling up to 1625 rows, two above).
    import jax

    from ppl.inference.optimize import _stable_argsort, minibatch_indices

    for num_data, batch_size in ((1, 1), (7, 7), (455, 64), (512, 100), (1625, 32), (1626, 32), (5000, 256)):
        draw = jax.jit(lambda k, n=num_data, b=batch_size: minibatch_indices(k, n, b))
        for seed in range(10):
            key = jax.random.fold_in(jax.random.PRNGKey(seed), num_data)
            expected = np.asarray(jax.random.choice(key, num_data, (batch_size,), replace=False))
            np.testing.assert_array_equal(np.asarray(draw(key)), expected)
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    batched = jax.vmap(lambda k: minibatch_indices(k, 455, 64))(keys)
    np.testing.assert_array_equal(
        np.asarray(batched), np.stack([np.asarray(jax.random.choice(k, 455, (64,), replace=False)) for k in keys])
    )
    # ties among the random keys keep index order, as in a stable sort
    rng = np.random.default_rng(0)
    for n in (2, 455, 3000):
        few_values = rng.integers(0, 5, n).astype(np.uint32) * 0x01010101
        for tied in (rng.integers(0, 3, n).astype(np.uint32) << 30, few_values):
            order = np.asarray(_stable_argsort(jax.numpy.asarray(tied)))
            np.testing.assert_array_equal(order, np.argsort(tied, kind="stable"))


class _PlainSteps:
    """Plain gradient steps of length 1 (hashable, as OptimizerConfig needs): a parameter moves by
    −(the number of times its row was in a minibatch)."""

    def __hash__(self):
        return 0

    def __eq__(self, other):
        return isinstance(other, _PlainSteps)

    def build(self, rate):
        import optax

        return optax.sgd(1.0)


def test_minibatches_visit_every_row_once_per_epoch_in_a_fresh_order_per_member():
    # 23 rows in minibatches of 5: an epoch is 4 steps, visits 20 distinct rows and leaves 3 out
    # (other rows in other epochs); members shuffle on their own keys, member 0 as a single run does.
    import jax
    import jax.numpy as jnp

    from ppl.core.problem import compile_problem
    from ppl.inference.optimize import OptimizerConfig, minimize

    num_data, batch_size, epochs = 23, 5, 6
    X = np.c_[np.arange(num_data, dtype=float), np.zeros(num_data)]
    problem = compile_problem(BNN(hidden=(2,)), (X, np.zeros(num_data)))

    def visits(params, problem, key, batch, step=None):
        rows = batch[0][:, 0].astype(jnp.int32)
        return jnp.sum(params[rows])

    def counts(steps, key, members=None):
        config = OptimizerConfig(_PlainSteps(), steps, schedule="constant", batch_size=batch_size)
        start = jnp.zeros((num_data,) if members is None else (members, num_data))
        found = minimize(visits, config, problem, start, key, learning_rate=1.0, label="rows", members=members)
        return -np.asarray(found.params)

    key = jax.random.PRNGKey(3)
    totals = [np.zeros(num_data)] + [counts(4 * e, key) for e in range(1, epochs + 1)]
    per_epoch = np.diff(np.stack(totals), axis=0)
    assert np.all(np.isin(per_epoch, (0, 1))) and np.all(per_epoch.sum(axis=1) == 20)
    assert len({tuple(np.flatnonzero(e == 0)) for e in per_epoch}) > 1  # other rows left out each epoch
    # mid-epoch: the steps of an epoch never repeat a row (6 steps = one epoch and half of the next)
    assert np.all(counts(6, key) - totals[1] <= 1) and (counts(6, key) - totals[1]).sum() == 10
    keys = jnp.stack([key, jax.random.PRNGKey(4)])
    both = counts(8, keys, members=2)
    np.testing.assert_array_equal(both[0], totals[2])
    assert not np.array_equal(both[0], both[1]) and both[1].sum() == 40


@pytest.mark.slow  # moved out of the default run to keep it under 15 minutes; CI runs it in the slow step
def test_members_spread_over_several_devices_give_the_same_results(cancer):
    # With more than one device (here two CPU devices, set before JAX starts, so in a subprocess)
    # the members are split over them by shard_map; each member's arithmetic is unchanged.
    import json
    import subprocess
    import sys

    code = """
import json, jax
jax.config.update("jax_num_cpu_devices", 2)
jax.config.update("jax_enable_x64", True)
import numpy as np, ppl
from ppl.models import BNN
data = ppl.datasets.load("breast_cancer", seed=0)
out = {}
for name, opts in (("adam", dict(optimizer="adam", batch_size=64, steps=100)), ("lbfgs", dict(steps=30))):
    post = ppl.fit(BNN(hidden=(8,), likelihood="bernoulli"), data.train, method="ensemble", seed=0, num_members=3, **opts)
    out[name] = np.asarray(post.flat_draws).tolist()
print("RESULT" + json.dumps(out))
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT")]
    assert lines, run.stderr[-2000:]
    spread = json.loads(lines[0][len("RESULT"):])
    model = BNN(hidden=(8,), likelihood="bernoulli")
    for name, opts in (("adam", dict(optimizer="adam", batch_size=64, steps=100)), ("lbfgs", dict(steps=30))):
        here = ppl.fit(model, cancer.train, method="ensemble", seed=0, num_members=3, **opts)
        np.testing.assert_allclose(np.asarray(spread[name]), np.asarray(here.flat_draws), atol=1e-12)
