"""``batch_ensemble``: the rank-1 sharing layout, the members at the exact optimum, and what is shared."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ppl.core.curvature import site_offsets
from ppl.core.problem import compile_problem
from ppl.inference.batch_ensemble import sharing
from ppl.models import BNN
import ppl


def test_a_member_is_the_shared_matrix_times_its_rank_one_factors():
    """Member m's layer weights are W ∘ (r_m s_mᵀ) in the weight site's own (fan_in, fan_out) layout;
    biases and the noise scale are the member's own."""
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(20, 3)), rng.normal(size=20)
    problem = compile_problem(BNN(hidden=(4,)), (X, y))
    layout = sharing(problem)
    P = problem.num_params
    params = {
        "shared": jnp.asarray(rng.normal(size=P)), "own": jnp.asarray(rng.normal(size=(2, P))),
        "r": jnp.asarray(rng.normal(size=(2, layout.num_rows))), "s": jnp.asarray(rng.normal(size=(2, layout.num_cols))),
    }
    members = np.asarray(layout.members(params))
    layers = problem.layers()
    assert layout.num_rows == sum(layer.fan_in for layer in layers) == 3 + 4
    assert layout.num_cols == sum(layer.fan_out for layer in layers) == 4 + 1
    offsets = site_offsets(problem)
    row = col = 0
    covered = np.zeros(P, bool)
    for layer in layers:
        start, size = offsets[layer.weight]
        for m in range(2):
            W = np.asarray(params["shared"])[start : start + size].reshape(layer.fan_in, layer.fan_out)
            r = np.asarray(params["r"])[m, row : row + layer.fan_in]
            s = np.asarray(params["s"])[m, col : col + layer.fan_out]
            np.testing.assert_allclose(members[m, start : start + size], (W * np.outer(r, s)).ravel(), rtol=1e-12)
        covered[start : start + size] = True
        row, col = row + layer.fan_in, col + layer.fan_out
    np.testing.assert_array_equal(members[:, ~covered], np.asarray(params["own"])[:, ~covered])


def test_every_member_reaches_the_conjugate_optimum(linear_model, linear_data, linear_truth):
    """On conjugate linear regression the posterior is unimodal: every member's effective weights
    are its mode, which W ∘ (r sᵀ) can represent for one output. L-BFGS's tolerance bounds the gap."""
    post = ppl.fit(linear_model, linear_data.train, method="batch_ensemble", seed=0)
    members = np.asarray(post.flat_draws)[:, 0]
    sd = np.sqrt(np.diag(linear_truth["cov"]))
    assert np.all(np.abs(members - linear_truth["mean"]) <= 1e-4 * sd)
    assert post.status.converged and post.diagnostics().ok


def test_members_differ_on_a_network_and_share_their_layer_weights():
    data = ppl.datasets.load("two_moons", seed=0)
    model = BNN(hidden=(8,), likelihood="bernoulli")
    post = ppl.fit(model, data.train, method="batch_ensemble", seed=0, num_members=3)
    members = np.asarray(post.flat_draws)[:, 0]
    assert members.shape[0] == 3
    # separate optima: the members' predictions differ somewhere on the test inputs
    probs = np.stack([np.asarray(jax.nn.sigmoid(post.problem.apply(post.problem.constrain(jnp.asarray(u)), data.test.X)))
                      for u in members])
    assert np.max(np.abs(probs[0] - probs[1])) > 1e-3
    # within a layer the members' weights are rank-1 rescalings of one matrix: the ratio of two
    # members' weights is an outer product, so its matrix rank is 1
    problem = post.problem
    layer = problem.layers()[0]
    start, size = site_offsets(problem)[layer.weight]
    ratio = (members[1, start : start + size] / members[0, start : start + size]).reshape(layer.fan_in, layer.fan_out)
    singular = np.linalg.svd(ratio, compute_uv=False)
    assert singular[1] <= 1e-6 * singular[0]
    assert 0 < post.info["shared_fraction"] < 1
