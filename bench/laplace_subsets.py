"""Laplace over a parameter subset chosen by path pattern, on a CNN trained on digits.

    python -m bench.laplace_subsets

The recipe for a pretrained network: train it once (``map``), then put a Gaussian over the
parameters a pattern names, the rest frozen at their trained values (``init=`` the map run, so
every row shares the same network). Rows: the MAP itself; ``subset="last_layer"`` (the ``out``
layer); the last block by pattern, ``["dense_0", "out"]`` (whole layers, so K-FAC applies); and
``"conv_1"``, an inner layer alone (K-FAC over its patches). For each: the number of
free weights, the curvature's memory as estimated before fitting (``Laplace.memory_needed``),
the wall time of the Laplace step (the MAP's is given once), test NLL (Monte Carlo predictive, the
default, and probit), accuracy and ECE on the digits 0-7, the out-of-distribution AUROC by
predictive entropy against the digits 8 and 9, PSIS k-hat and the verdict. The last block also runs
with its prior precision tuned by the evidence (``prior_precision="marglik"``).

The second table starts from weights trained outside ppl, the way a pretrained model arrives: a
Flax Linen CNN of the same shape trained with optax (Adam with weight decay, cross-entropy, 300
full-batch steps), wrapped as ``Network.from_flax(module, X[:2], params=trained)``. Its first row is
the trained network itself; the Laplace rows cover the last layer, the last block and the second
convolution by pattern, every other weight held at its trained value, the prior tuned by the
evidence over the covered weights (``prior_precision="auto"`` for a pretrained network).
"""

from __future__ import annotations

import sys
import time

import jax
import numpy as np
import optax
from scipy.special import log_softmax

from ppl.core.predict import classification_prediction
from ppl.core.problem import compile_problem
from ppl.diagnostics.metrics import classification_metrics, ood_auroc
from ppl.inference.laplace import Laplace
from ppl.models import CNN, Network
import ppl

SUBSETS = {
    "last layer": {"subset": "last_layer"},
    "last block ['dense_0', 'out']": {"subset": ["dense_0", "out"], "hessian": "kfac"},
    "last block, marglik": {"subset": ["dense_0", "out"], "hessian": "kfac", "prior_precision": "marglik"},
    "inner layer 'conv_1'": {"subset": "conv_1", "hessian": "kfac"},
}


PRETRAINED = {
    "last layer 'Dense_1'": {"subset": "last_layer"},
    "last block ['Dense_0', 'Dense_1/*']": {"subset": ["Dense_0", "Dense_1/*"], "hessian": "kfac"},
    "inner layer 'Conv_1'": {"subset": "Conv_1", "hessian": "kfac"},
}
TRAIN_STEPS = 300


def _flax_cnn():
    import flax.linen as nn

    class SmallCNN(nn.Module):
        """Two 3×3 'SAME' convolutions of 16 and 32 channels with 2×2 max-pooling, a dense layer of 64,
        8 logits: the shape of ppl's CNN(), written in Flax."""

        @nn.compact
        def __call__(self, x):
            for width in (16, 32):
                x = nn.max_pool(nn.relu(nn.Conv(width, (3, 3), padding="SAME")(x)), (2, 2), (2, 2))
            x = nn.relu(nn.Dense(64)(x.reshape((x.shape[0], -1))))
            return nn.Dense(8)(x)

    return SmallCNN()


def _train_outside(module, X, y):
    """Trained params of ``module`` by optax alone (what a user brings from elsewhere)."""
    params = module.init(jax.random.PRNGKey(0), X[:2])["params"]
    optimizer = optax.adamw(3e-3, weight_decay=1e-4)
    state = optimizer.init(params)

    @jax.jit
    def step(params, state):
        def loss(p):
            return optax.softmax_cross_entropy_with_integer_labels(module.apply({"params": p}, X), y).mean()

        value, grad = jax.value_and_grad(loss)(params)
        updates, state = optimizer.update(grad, state, params)
        return optax.apply_updates(params, updates), state, value

    for _ in range(TRAIN_STEPS):
        params, state, value = step(params, state)
    return params, float(value)


def _point_row(name, logits_test, logits_ood, data, seconds) -> str:
    def prediction(logits):  # one draw: the trained network's own softmax
        return classification_prediction(log_softmax(np.asarray(logits, np.float64), axis=-1)[None])

    test = prediction(logits_test)
    metrics = classification_metrics(test, np.asarray(data.test.y))
    ood = ood_auroc(test, prediction(logits_ood))
    return (f"{name:40s} {'—':>6} {'—':>9} {seconds:7.1f} {metrics['nll']:7.4f} {'—':>7} {metrics['accuracy']:6.3f} "
            f"{metrics['ece']:6.3f} {ood['auroc_entropy']:6.3f} {'—':>6} {'—':>5}")


def pretrained(data, train) -> None:
    module = _flax_cnn()
    started = time.perf_counter()
    params, loss = _train_outside(module, *train)
    seconds = time.perf_counter() - started
    net = Network.from_flax(module, train[0][:2], params=params, likelihood="categorical", last_layer="Dense_1")
    problem = compile_problem(net, train)
    print(f"\nA Flax Linen CNN trained outside ppl (optax adamw, {TRAIN_STEPS} steps, {seconds:.1f} s, final training "
          f"loss {loss:.2e}), {problem.num_params} weights, wrapped by Network.from_flax(module, X[:2], params=trained)\n")
    _header()
    apply = jax.jit(lambda X: module.apply({"params": params}, X))
    print(_point_row("the trained network", apply(_images(data.test.X)), apply(_images(data.ood.X)), data, seconds))
    for name, options in PRETRAINED.items():
        memory = Laplace(**options).memory_needed(problem)
        started = time.perf_counter()
        post = ppl.fit(net, train, method="laplace", seed=0, **options)
        seconds = time.perf_counter() - started
        label = f"{name} ({post.info['hessian']})"
        print(_row(label, post, data, seconds, post.info["num_free"], f"{memory / 2**20:.0f} MiB"))


def _header() -> None:
    print(f"{'':40s} {'free':>6} {'memory':>9} {'time s':>7} {'NLL':>7} {'probit':>7} {'acc':>6} {'ECE':>6} {'AUROC':>6} "
          f"{'k-hat':>6} {'ok':>5}")


def _images(X) -> np.ndarray:
    return np.asarray(X).reshape(-1, 8, 8, 1)


def _row(name, post, data, seconds, free="—", memory="—") -> str:
    test = post.predict(_images(data.test.X), seed=1)
    metrics = classification_metrics(test, np.asarray(data.test.y))
    ood = ood_auroc(test, post.predict(_images(data.ood.X), seed=1))
    probit = "—"
    if post.method == "laplace":
        probit = f"{classification_metrics(post.predict(_images(data.test.X), seed=1, mode='probit'), np.asarray(data.test.y))['nll']:.4f}"
    diag = post.diagnostics()
    khat = "—" if diag.khat is None else f"{diag.khat:.2f}"
    return (f"{name:40s} {free:>6} {memory:>9} {seconds:7.1f} {metrics['nll']:7.4f} {probit:>7} {metrics['accuracy']:6.3f} "
            f"{metrics['ece']:6.3f} {ood['auroc_entropy']:6.3f} {khat:>6} {str(diag.ok):>5}")


def main() -> int:
    data = ppl.datasets.load("rotated_digits", seed=0)  # the digits 0-7; ood: the digits 8 and 9
    train = (_images(data.train.X), np.asarray(data.train.y))
    model = CNN()
    started = time.perf_counter()
    mode = ppl.fit(model, train, method="map", seed=0)
    map_seconds = time.perf_counter() - started
    problem = compile_problem(model, train)
    print(f"CNN {model.channels} conv, {model.dense} dense on digits 0-7 ({len(train[1])} training images), "
          f"{problem.num_params} weights; MAP {map_seconds:.1f} s (converged: {mode.status.converged})\n")
    _header()
    print(_row("map", mode, data, map_seconds))
    for name, options in SUBSETS.items():
        method = Laplace(init=mode, **options)
        memory = method.memory_needed(problem)
        started = time.perf_counter()
        post = ppl.fit(model, train, method="laplace", seed=0, init=mode, **options)
        seconds = time.perf_counter() - started
        label = f"{name} ({post.info['hessian']})"
        print(_row(label, post, data, seconds, post.info["num_free"], f"{memory / 2**20:.0f} MiB"))
    pretrained(data, train)
    return 0


if __name__ == "__main__":
    sys.exit(main())
