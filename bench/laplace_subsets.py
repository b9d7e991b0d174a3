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
"""

from __future__ import annotations

import sys
import time

import numpy as np

import ppl
from ppl._problem import compile_problem
from ppl.diagnostics.metrics import classification_metrics, ood_auroc
from ppl.inference.laplace import Laplace
from ppl.models import CNN

SUBSETS = {
    "last layer": {"subset": "last_layer"},
    "last block ['dense_0', 'out']": {"subset": ["dense_0", "out"], "hessian": "kfac"},
    "last block, marglik": {"subset": ["dense_0", "out"], "hessian": "kfac", "prior_precision": "marglik"},
    "inner layer 'conv_1'": {"subset": "conv_1", "hessian": "kfac"},
}


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
    print(f"{'':40s} {'free':>6} {'memory':>9} {'time s':>7} {'NLL':>7} {'probit':>7} {'acc':>6} {'ECE':>6} {'AUROC':>6} "
          f"{'k-hat':>6} {'ok':>5}")
    print(_row("map", mode, data, map_seconds))
    for name, options in SUBSETS.items():
        method = Laplace(init=mode, **options)
        memory = method.memory_needed(problem)
        started = time.perf_counter()
        post = ppl.fit(model, train, method="laplace", seed=0, init=mode, **options)
        seconds = time.perf_counter() - started
        label = f"{name} ({post.info['hessian']})"
        print(_row(label, post, data, seconds, post.info["num_free"], f"{memory / 2**20:.0f} MiB"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
