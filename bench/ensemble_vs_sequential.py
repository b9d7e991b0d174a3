"""``ensemble`` (M members as one vmapped program) against M sequential ``map`` fits, same process.

    python -m bench.ensemble_vs_sequential [--quick] [--members 5] [--repeats 3] [--cpu-devices N] [--out F.json]

A BNN (30 → 50 ReLU → 1 Bernoulli) on ``breast_cancer``, float32 (JAX's default), with two
optimisers: Adam on minibatches of 64 for 2000 steps, and full-batch L-BFGS (``map``'s default)
for 2000 steps (500 each with ``--quick``). Each configuration's first call (compilation
included) is reported apart from the median of ``--repeats`` warm runs (``_harness.timed``): one
``ensemble`` fit of M members against M ``map`` fits with the same options, seeds 0 to M − 1.
The ratio is ensemble / sequential (below 1: the one program is faster).

XLA:CPU runs a program's operations on one core. ``--cpu-devices N`` exposes the CPU as N JAX
devices (``jax_num_cpu_devices``, before JAX starts): the ensemble then splits its members over
them, so it can use N cores, while each ``map`` fit still runs on one.
"""

from __future__ import annotations

import argparse

import jax

import ppl
from bench import _harness
from ppl.models import BNN

CONFIGS = (
    ("adam, minibatch 64", dict(optimizer="adam", batch_size=64)),
    ("lbfgs, full batch", dict(optimizer="lbfgs")),
)


def run(quick: bool = False, repeats: int = 3, members: int = 5) -> dict:
    data = ppl.datasets.load("breast_cancer", seed=0)
    model = BNN(hidden=(50,), likelihood="bernoulli")
    steps = 500 if quick else 2000
    rows = []
    for label, options in CONFIGS:
        options = dict(options, steps=steps, progress_bar=False)
        ensemble = _harness.timed(
            lambda: ppl.fit(model, data.train, method="ensemble", seed=0, num_members=members, **options), repeats)
        sequential = _harness.timed(
            lambda: [ppl.fit(model, data.train, method="map", seed=m, **options) for m in range(members)], repeats)
        rows.append([label, steps, ensemble["first_s"], sequential["first_s"], ensemble["warm_s"],
                     sequential["warm_s"], ensemble["warm_s"] / sequential["warm_s"]])
        print(f"  {label}: ensemble {ensemble['warm_s']:.2f} s, {members} × map {sequential['warm_s']:.2f} s", flush=True)
    devices = jax.device_count()
    title = (f"ensemble of {members} members against {members} sequential map fits (BNN 30-50-1 on breast_cancer, "
             f"float32, {devices} JAX device{'s' if devices > 1 else ''}, median of {repeats} warm runs; "
             "ratio below 1: the ensemble is faster)")
    columns = ["optimiser", "steps", "ensemble first s", f"{members} × map first s", "ensemble warm s",
               f"{members} × map warm s", "ratio"]
    return {"name": "ensemble_vs_sequential", "members": members, "tables": [_harness.table(title, columns, rows)]}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="500 steps instead of 2000")
    parser.add_argument("--members", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cpu-devices", type=int, help="expose the CPU as this many JAX devices (default: JAX's own)")
    parser.add_argument("--out", help="write the result as JSON here")
    args = parser.parse_args(argv)
    if args.cpu_devices is not None:
        jax.config.update("jax_num_cpu_devices", args.cpu_devices)
    return _harness.report(run(args.quick, args.repeats, args.members), args.out)


if __name__ == "__main__":
    main()
