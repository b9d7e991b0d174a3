"""How near the hardware ppl's training steps run: SVI and MAP steps per second and achieved FLOP/s
against the float32 matrix-product peak measured in the same process.

    python -m bench.hardware [--quick] [--out FILE.json]

The network is a 64-W-W-10 ReLU BNN on the digits (1438 training rows, 10 classes), W from 64 to
1024, at minibatch sizes 64 and 256 and the full batch. One training step of one weight draw costs
about 6·B·P floating-point operations (forward 2·B·P, backward 4·B·P, for B rows and P weights);
SVI takes 8 draws (particles) per step, MAP one; ``svi-local`` is SVI with ``local_reparam=True``.
The time per step is the difference between two warm fits of different lengths divided by their
difference in steps, so that what a fit does once (setting up, drawing from q, the diagnostics)
cancels.
"""

from __future__ import annotations

import argparse

import jax

import ppl
from bench import _harness
from ppl.core.problem import compile_problem
from ppl.models import BNN

PARTICLES = 8
SHORT = 16  # steps of the shorter fit
TARGET_S = 3.0  # the longer fit's extra steps take about this long


def _fit(method: str, model, data, steps: int, batch):
    options = dict(seed=0, init="prior", steps=steps, max_steps=steps, batch_size=batch, progress_bar=False)
    if method in ("svi", "svi-local"):
        options.update(num_particles=PARTICLES, num_draws=8, guide="mean_field", local_reparam=method == "svi-local")
        method = "svi"
    else:
        options.update(optimizer="adam")
    return ppl.fit(model, data, method=method, **options)


def step_time(method: str, model, data, batch, repeats: int) -> dict:
    """Seconds per training step (warm); see ``_harness.per_step``."""
    return _harness.per_step(lambda steps: _fit(method, model, data, steps, batch), SHORT, repeats, TARGET_S)


def run(quick: bool = False, repeats: int = 3, methods=("svi", "map"), widths=None, batches=None) -> dict:
    data = ppl.datasets.load("digits", seed=0)
    n = data.train.X.shape[0]
    widths = widths or ((64, 512) if quick else (64, 128, 256, 512, 1024))
    batches = batches or ((256, None) if quick else (64, 256, None))
    peak = _harness.matmul_peak()
    rows = []
    for method in methods:
        for width in widths:
            model = BNN(hidden=(width, width), activation="relu", likelihood="categorical")
            params = compile_problem(model, data.train).num_params
            for batch in batches:
                rows_per_step = n if batch is None else batch
                timing = step_time(method, model, data.train, batch, repeats)
                draws = 1 if method == "map" else PARTICLES
                flops = 6.0 * rows_per_step * params * draws
                rate = flops / timing["per_step_s"]
                rows.append([method, f"64-{width}-{width}-10", params, "full" if batch is None else batch,
                             1.0 / timing["per_step_s"], rate / 1e9, rate / peak, timing["compile_s"],
                             timing["fit_fixed_s"]])
                print(f"  {method} width {width} batch {rows[-1][3]}: {rows[-1][4]:.0f} steps/s, "
                      f"{rows[-1][5]:.1f} GFLOP/s, {100 * rows[-1][6]:.0f}% of peak", flush=True)
    columns = ["method", "network", "P", "batch", "steps/s", "GFLOP/s", "of peak", "compile s", "fit fixed s"]
    title = (f"training steps against the float32 matmul peak ({peak / 1e9:.0f} GFLOP/s measured in this "
             f"process; svi: {PARTICLES} particles, 6·B·P FLOPs per particle)")
    return {"name": "hardware", "peak_flops": peak, "tables": [_harness.table(title, columns, rows)]}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two widths and two batch sizes")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--methods", nargs="+", choices=("svi", "svi-local", "map"), default=("svi", "map"),
                        help="svi-local: svi with local_reparam=True (pre-activations drawn, the weights' KL side "
                             "in closed form)")
    parser.add_argument("--widths", nargs="+", type=int, help="hidden widths W (default 64 to 1024)")
    parser.add_argument("--batches", nargs="+", help="minibatch sizes, 'full' for the whole data")
    parser.add_argument("--out", help="write the result as JSON here")
    args = parser.parse_args(argv)
    batches = None if args.batches is None else tuple(None if b == "full" else int(b) for b in args.batches)
    widths = args.widths and tuple(args.widths)
    return _harness.report(run(args.quick, args.repeats, tuple(args.methods), widths, batches), args.out)


if __name__ == "__main__":
    jax.config.update("jax_enable_x64", False)
    main()
