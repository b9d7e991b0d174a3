"""``ensemble`` (M members as one vmapped program) against M sequential ``map`` fits, same process.

    python -m bench.ensemble_vs_sequential [--members 5] [--repeats 3] [--cpu-devices N] [--out results.json]

A BNN (30 → 50 ReLU → 1 Bernoulli) on ``breast_cancer``, float32 (JAX's default), with two
optimisers: Adam on minibatches of 64 for 2000 steps, and full-batch L-BFGS (``map``'s default)
for 2000 steps. Each configuration is compiled once first (a short run of each, timed and
reported as "first call"), then timed as the median of ``--repeats`` warm runs: one
``ensemble`` fit of M members against M ``map`` fits with the same options. The ratio is
ensemble / sequential (below 1: the one program is faster).

XLA:CPU runs a program's operations on one core. ``--cpu-devices N`` exposes the CPU as N JAX
devices (``jax_num_cpu_devices``, before JAX starts): the ensemble then splits its members over
them, so it can use N cores, while each ``map`` fit still runs on one.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import numpy as np

import ppl
from ppl.models import BNN


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cpu-devices", type=int, help="expose the CPU as this many JAX devices (default: JAX's own)")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    if args.cpu_devices is not None:
        jax.config.update("jax_num_cpu_devices", args.cpu_devices)
    data = ppl.datasets.load("breast_cancer", seed=0)
    model = BNN(hidden=(50,), likelihood="bernoulli")
    M = args.members
    results = {"jax": jax.__version__, "device": str(jax.devices()[0]), "devices": len(jax.devices()), "members": M,
               "configs": {}}
    for label, opts in (
        ("adam, minibatch 64", dict(optimizer="adam", batch_size=64, steps=2000)),
        ("lbfgs, full batch", dict(optimizer="lbfgs", steps=2000)),
    ):
        first_ens = _timed(lambda: ppl.fit(model, data.train, method="ensemble", seed=0, num_members=M, **opts))
        first_map = _timed(lambda: ppl.fit(model, data.train, method="map", seed=0, **opts))
        ensemble, sequential = [], []
        for r in range(args.repeats):
            ensemble.append(_timed(lambda: ppl.fit(model, data.train, method="ensemble", seed=r, num_members=M, **opts)))
            sequential.append(_timed(lambda: [ppl.fit(model, data.train, method="map", seed=r * M + m, **opts) for m in range(M)]))
        row = {
            "first_call_ensemble_s": first_ens, "first_call_map_s": first_map,
            "ensemble_s": float(np.median(ensemble)), "sequential_s": float(np.median(sequential)),
        }
        row["ratio"] = row["ensemble_s"] / row["sequential_s"]
        results["configs"][label] = row
        print(f"{label:22s} ensemble {row['ensemble_s']:.2f} s   {M} × map {row['sequential_s']:.2f} s   "
              f"ratio {row['ratio']:.2f}   (first calls {first_ens:.1f} s / {first_map:.1f} s)")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(results, handle, indent=2)
    return results


if __name__ == "__main__":
    main()
