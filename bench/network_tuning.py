"""Which curvature the evidence tuning of a regression network should use, measured on UCI.

    python -m bench.network_tuning [--sets boston yacht] [--splits 2] [--variants bnn:kfac network:diag]

The point methods tune a Gaussian network's prior precisions and noise scale σ by the Laplace
evidence before they run (``prior_precision="auto"``). The evidence needs a curvature: K-FAC
where the network's layers are known, and for a network whose layers are not (a plain JAX
function, an Equinox module) either the exact GGN or its diagonal. Each variant fits ``map`` at
its defaults (seed 0) on the canonical splits, with the same one-hidden-layer network of 50 ReLU
units written four ways — ``bnn`` (ppl's BNN), ``network`` (a plain function), ``flax`` (a Linen
module; K-FAC reads its layers) and ``eqx`` (an Equinox MLP) — and the tuning's curvature forced
to the variant's (``:kfac``, ``:full``, ``:diag``) or left to the default (``:auto``). It prints
the test log-likelihood per split in the target's units, the mean 90% coverage, the tuned σ
(standardised units) and whether the verdict, with the test split held out, says ok.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from contextlib import contextmanager

import numpy as np

import ppl
from bench.uci import default_root
from ppl.core.cache import release_compiled
from ppl.inference import _empirical_bayes
from ppl.models import BNN, Network

VARIANTS = ["bnn:auto", "bnn:full", "network:full", "network:diag", "flax:auto", "eqx:auto"]
SETS = ["boston", "concrete", "energy", "wine_quality", "yacht"]
HIDDEN = 50


def _mlp(params, X):
    import jax

    hidden = jax.nn.relu(X @ params["hidden"]["w"] + params["hidden"]["b"][None, :])
    return hidden @ params["out"]["w"] + params["out"]["b"][None, :]


def model_for(kind: str, inputs: int):
    """The same network (inputs → 50 ReLU → 1, Gaussian likelihood, σ learned) in each form."""
    import jax
    import jax.numpy as jnp

    if kind == "bnn":
        return BNN(hidden=(HIDDEN,))
    if kind == "network":
        template = {"hidden": {"w": np.zeros((inputs, HIDDEN)), "b": np.zeros(HIDDEN)},
                    "out": {"w": np.zeros((HIDDEN, 1)), "b": np.zeros(1)}}
        return Network(_mlp, template, likelihood="gaussian")
    if kind == "flax":
        import flax.linen as linen

        class MLP(linen.Module):
            @linen.compact
            def __call__(self, x):
                return linen.Dense(1)(jax.nn.relu(linen.Dense(HIDDEN)(x)))

        return Network.from_flax(MLP(), jnp.zeros((2, inputs)), likelihood="gaussian")
    if kind == "eqx":
        import equinox as eqx

        mlp = eqx.nn.MLP(inputs, "scalar", HIDDEN, 1, activation=jax.nn.relu, key=jax.random.PRNGKey(0))
        return Network.from_equinox(mlp, likelihood="gaussian")
    raise SystemExit(f"unknown network form {kind!r}: use bnn, network, flax or eqx")


@contextmanager
def curvature(name: str):
    """The tuning's curvature forced to ``name`` ("auto": the library's choice) for the block."""
    chosen = _empirical_bayes.tuning_structure
    if name != "auto":
        _empirical_bayes.tuning_structure = lambda problem: name
    try:
        yield
    finally:
        _empirical_bayes.tuning_structure = chosen


def fit_one(name: str, split: int, variant: str, root) -> dict:
    kind, _, structure = variant.partition(":")
    data = ppl.datasets.load(name, split=split, root=root)
    model = model_for(kind, data.train[0].shape[1])
    started = time.perf_counter()
    with curvature(structure or "auto"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        post = ppl.fit(model, data.train, method="map", seed=0)
        used = _empirical_bayes.tuning_structure(post.problem)
    wall = time.perf_counter() - started
    metrics = data.in_target_units(ppl.evaluate(post, data.test, seed=1))
    record = post.with_heldout(*data.test).diagnostics()
    return {"set": name, "split": split, "variant": variant, "structure": used, "test_ll": -metrics["nll"],
            "rmse": metrics["rmse"], "coverage_90": metrics["coverage_90"], "ok": bool(record.ok),
            "noise_scale": post.info.get("noise_scale"), "prior_precision": post.info.get("prior_precision"),
            "wall_s": wall}


def table(rows: list, sets: list, variants: list) -> str:
    lines = ["| variant | " + " | ".join(sets) + " | mean 90% coverage (range) | ok |", "|---" * (len(sets) + 3) + "|"]
    for variant in variants:
        mine = [r for r in rows if r["variant"] == variant]
        if not mine:
            continue
        cells = [" / ".join(f"{r['test_ll']:.2f}" for r in sorted(mine, key=lambda r: r["split"]) if r["set"] == s) for s in sets]
        cover = np.array([r["coverage_90"] for r in mine])
        lines.append(f"| {variant} | " + " | ".join(cells) + f" | {cover.mean():.3f} ({cover.min():.2f}–{cover.max():.2f}) | "
                     f"{sum(r['ok'] for r in mine)} of {len(mine)} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=None, help="folder holding the UCI set folders")
    parser.add_argument("--sets", nargs="+", default=SETS)
    parser.add_argument("--splits", type=int, default=2, help="the first N canonical splits")
    parser.add_argument("--variants", nargs="+", default=VARIANTS)
    parser.add_argument("--results", default=None, help="also append each fit to this JSON-lines file")
    args = parser.parse_args(argv)
    root = args.root or default_root()
    rows = []
    for name in args.sets:
        for split in range(args.splits):
            for variant in args.variants:
                row = fit_one(name, split, variant, root)
                rows.append(row)
                if args.results:
                    with open(args.results, "a") as handle:
                        handle.write(json.dumps(row) + "\n")
                print(f"{name} split {split} {variant:<14} ({row['structure']}) test LL {row['test_ll']:8.3f}  "
                      f"cover {row['coverage_90']:.2f}  σ {row['noise_scale']:.3f}  ok {row['ok']}  ({row['wall_s']:.0f} s)",
                      flush=True)
            release_compiled()  # each fit compiles its own tuned model's programs (see bench.uci)
    print(table(rows, args.sets, args.variants))
    return 0


if __name__ == "__main__":
    sys.exit(main())
