"""The mean-field ELBO's training step alone: plain reparameterisation against ``local_reparam=True``.

    python -m bench.elbo_step [--widths 512] [--batches 64 256] [--repeats 5] [--out F.json]

A 64-W-W-10 ReLU BNN on the digits (1438 rows, 10 classes), float32, a mean-field guide at a
fixed point (means N(0, 0.05²), sds e⁻³), 8 particles. The compiled program draws a minibatch
and returns the ELBO's value and gradient, the part of a step that depends on the estimator
(the optimiser's update and the run loop are the same for both, and ``bench.hardware`` times
whole fits). Median over ``repeats`` blocks of 20 calls; the ratio is plain / local (above 1:
the local estimator's step is faster). Rates count 6·B·P floating-point operations per draw
against the float32 matrix-product peak measured in the same process; a locally
reparameterised layer multiplies twice per draw (mean and variance), so its own arithmetic is
about twice that count.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import ppl
from bench import _harness
from ppl.core.objectives import ELBO
from ppl.core.problem import compile_problem
from ppl.inference.guides import MeanField
from ppl.inference.optimize import minibatch_indices
from ppl.models import BNN

PARTICLES = 8
CALLS = 20


def step_seconds(problem, local: bool, batch: int, repeats: int) -> float:
    guide = MeanField()
    size = problem.num_params
    shift = jnp.asarray(0.05 * np.random.default_rng(0).normal(size=size), jnp.float32)
    params = {"shift": shift, "frame_scale": jnp.ones(size, jnp.float32), "loc": jnp.zeros(size, jnp.float32),
              "log_scale": jnp.full(size, -3.0, jnp.float32)}
    objective = ELBO(num_particles=PARTICLES, local_reparam=local)

    @jax.jit
    def step(params, key):
        rows = problem.batch(minibatch_indices(jax.random.fold_in(key, 1), problem.num_data, batch))
        return jax.value_and_grad(lambda p: objective.loss(guide, p, problem, key, rows))(params)

    key = jax.random.PRNGKey(0)
    jax.block_until_ready(step(params, key))
    blocks = []
    for r in range(repeats):
        start = time.perf_counter()
        for i in range(CALLS):
            out = step(params, jax.random.fold_in(key, r * CALLS + i))
        jax.block_until_ready(out)
        blocks.append((time.perf_counter() - start) / CALLS)
    return statistics.median(blocks)


def run(quick: bool = False, repeats: int = 5, widths=(512,), batches=(64, 256)) -> dict:
    data = ppl.datasets.load("digits", seed=0)
    peak = _harness.matmul_peak()
    rows = []
    for width in widths:
        problem = compile_problem(BNN(hidden=(width, width), activation="relu", likelihood="categorical"), data.train)
        for batch in (batches[:1] if quick else batches):
            plain = step_seconds(problem, False, batch, repeats)
            local = step_seconds(problem, True, batch, repeats)
            flops = 6.0 * batch * problem.num_params * PARTICLES
            rows.append([f"64-{width}-{width}-10", problem.num_params, batch, 1e3 * plain, 1e3 * local,
                         flops / plain / peak, flops / local / peak, plain / local])
            print(f"  width {width} batch {batch}: plain {1e3 * plain:.1f} ms, local {1e3 * local:.1f} ms", flush=True)
    columns = ["network", "P", "batch", "plain ms", "local ms", "plain of peak", "local of peak", "plain / local"]
    title = (f"mean-field ELBO value and gradient per step, {PARTICLES} particles ({peak / 1e9:.0f} GFLOP/s peak "
             "measured in this process; 6·B·P FLOPs per draw)")
    return {"name": "elbo_step", "tables": [_harness.table(title, columns, rows)]}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the first batch size only")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--widths", nargs="+", type=int, default=[512])
    parser.add_argument("--batches", nargs="+", type=int, default=[64, 256])
    parser.add_argument("--out", help="write the result as JSON here")
    args = parser.parse_args(argv)
    return _harness.report(run(args.quick, args.repeats, tuple(args.widths), tuple(args.batches)), args.out)


if __name__ == "__main__":
    jax.config.update("jax_enable_x64", False)
    main()
