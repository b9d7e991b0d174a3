"""Network.from_flax and Network.from_equinox (optional extras): the same MLP written in Flax or
Equinox is the same model as the ppl BNN, so the log densities agree to float64 rounding
(relative 1e-9, as in test_network.py). Skipped where the optional library is not installed."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppl._errors import OptionError
from ppl._problem import compile_problem
from ppl.models import BNN, Network
from ppl.models.priors import FanIn

HIDDEN = 5


def _data(n=40, d=3):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, d))
    return X, (X @ rng.normal(size=d) > 0).astype(int)


def _check_same_density(net, rename):
    X, y = _data()
    bnn = BNN(hidden=(HIDDEN,), activation="tanh", likelihood="bernoulli")
    pb, pn = compile_problem(bnn, (X, y)), compile_problem(net, (X, y))
    for seed in range(3):
        u = jax.random.normal(jax.random.PRNGKey(seed), (pb.num_params,))
        flat = pb.unravel(u)
        v = pn.ravel({name: transform(flat[site]) for name, (site, transform) in rename.items()})
        a, b = float(pb.logdensity_fn(u)), float(pn.logdensity_fn(v))
        assert abs(a - b) <= 1e-9 * abs(a), (a, b)


def test_flax_mlp_equals_the_bnn():
    linen = pytest.importorskip("flax.linen")

    class MLP(linen.Module):
        @linen.compact
        def __call__(self, x):
            hidden = jnp.tanh(linen.Dense(HIDDEN)(x))  # built first: Dense_0
            return linen.Dense(1)(hidden)

    X, _ = _data()
    net = Network.from_flax(MLP(), X[:2], likelihood="bernoulli", last_layer="Dense_1")
    # Flax names submodules in the order they are built: the hidden layer first here
    assert net.site_names == ("Dense_0.bias", "Dense_0.kernel", "Dense_1.bias", "Dense_1.kernel")
    same = lambda a: a  # noqa: E731  (Flax kernels are (in, out), as the BNN's)
    _check_same_density(net, {"Dense_0.kernel": ("w0", same), "Dense_0.bias": ("b0", same),
                               "Dense_1.kernel": ("w1", same), "Dense_1.bias": ("b1", same)})
    assert Network.from_flax(MLP(), X[:2], likelihood="bernoulli") == Network.from_flax(MLP(), X[:2], likelihood="bernoulli")

    class Normed(linen.Module):
        @linen.compact
        def __call__(self, x):
            return linen.Dense(1)(linen.BatchNorm(use_running_average=True)(x))

    with pytest.raises(OptionError, match=r"collections \['batch_stats'\] besides 'params'"):
        Network.from_flax(Normed(), X[:2], likelihood="bernoulli")


def test_flax_nnx_mlp_equals_the_bnn_and_its_state_is_checked():
    nnx = pytest.importorskip("flax.nnx")

    class MLP(nnx.Module):
        def __init__(self, rngs):
            self.layers = nnx.List([nnx.Linear(3, HIDDEN, rngs=rngs), nnx.Linear(HIDDEN, 1, rngs=rngs)])

        def __call__(self, x):
            return self.layers[1](jnp.tanh(self.layers[0](x)))

    net = Network.from_flax(MLP(nnx.Rngs(0)), likelihood="bernoulli", last_layer="layers.1")
    assert net.site_names == ("layers.0.bias", "layers.0.kernel", "layers.1.bias", "layers.1.kernel")
    same = lambda a: a  # noqa: E731  (NNX kernels are (in, out), as the BNN's)
    _check_same_density(net, {"layers.0.kernel": ("w0", same), "layers.0.bias": ("b0", same),
                              "layers.1.kernel": ("w1", same), "layers.1.bias": ("b1", same)})
    # built twice (other initial values), the same network: compiled programs are shared
    assert Network.from_flax(MLP(nnx.Rngs(1)), likelihood="bernoulli") == Network.from_flax(MLP(nnx.Rngs(2)), likelihood="bernoulli")

    class Normed(nnx.Module):
        def __init__(self, rngs):
            self.norm, self.out = nnx.BatchNorm(3, rngs=rngs), nnx.Linear(3, 1, rngs=rngs)

        def __call__(self, x):
            return self.out(self.norm(x, use_running_average=True))

    with pytest.raises(OptionError, match=r"state besides nnx.Param \(norm\.mean, norm\.var\)"):
        Network.from_flax(Normed(nnx.Rngs(0)), likelihood="bernoulli")


def test_equinox_mlp_equals_the_bnn():
    eqx = pytest.importorskip("equinox")
    mlp = eqx.nn.MLP(3, 1, HIDDEN, 1, activation=jnp.tanh, key=jax.random.PRNGKey(0))
    net = Network.from_equinox(mlp, likelihood="bernoulli", last_layer="layers.1")
    assert net.site_names == ("layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias")
    transpose = lambda a: a.T  # noqa: E731  (Equinox weights are (out, in))
    same = lambda a: a  # noqa: E731
    _check_same_density(net, {"layers.0.weight": ("w0", transpose), "layers.0.bias": ("b0", same),
                              "layers.1.weight": ("w1", transpose), "layers.1.bias": ("b1", same)})
    with pytest.raises(OptionError, match="Equinox weights are \\(out, in\\)"):
        Network.from_equinox(mlp, likelihood="bernoulli", prior=FanIn())
