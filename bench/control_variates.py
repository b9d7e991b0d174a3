"""SG-MCMC with and without control variates (``control_variate=True``), measured side by side.

    python -m bench.control_variates [--quick]

1. Conjugate linear regression (the ``linear`` set, 80 rows, known noise): ``sgld`` at a fixed
   whitened step 0.1 on minibatches of 8 rows, one round of 4 × 1000 draws. The exact posterior
   is known, so the stationary sd's error is measured directly; the step alone inflates the
   variance by 1/(1 − ε/2) = 1.053 (sd 1.026), the rest is the minibatch gradient noise.
2. The main job's BNN (two_moons, 50 ReLU units, 400 rows) on minibatches of 32 rows: ``sgld`` at
   its automatic step, one round (``time_budget=0``), against NUTS's predictive. Reported: the
   function-space bulk ESS per 1000 row-gradient evaluations (a control-variate step evaluates two
   minibatch gradients; its anchors' MAP runs are counted at N rows per full-batch step), the
   step the chains could take, total variation from NUTS, and wall time.

Every number is measured in the run; the ratio column is with / without.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402

import ppl  # noqa: E402
from ppl.models import BNN, LinearRegression  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from conftest import closed_form  # noqa: E402


def linear(quick: bool) -> None:
    data = ppl.datasets.load("linear", seed=0)
    X, y = data.train
    truth = closed_form(np.asarray(X), np.asarray(y, dtype=float))
    sd = np.sqrt(np.diag(truth["cov"]))
    model = LinearRegression(prior_scale=1.0, noise_scale=0.5)
    print("1. conjugate linear regression, sgld step 0.1 (whitened), batch 8 of 80 rows, 4 x 1000 draws")
    rows = {}
    for cv in (False, True):
        began = time.perf_counter()
        post = ppl.fit(model, data.train, method="sgld", seed=0, step_size=0.1, batch_size=8, control_variate=cv,
                       time_budget=0, num_samples=400 if quick else 1000, progress_bar=False)
        draws = np.asarray(post.flat_draws).reshape(-1, sd.size)
        rows[cv] = {
            "sd ratio": draws.std(axis=0) / sd,
            "mean error / sd": np.abs(draws.mean(axis=0) - truth["mean"]) / sd,
            "temperature": post.chain_stats.temperature,
            "noise r": post.info["gradient_noise"],
            "ok": post.diagnostics().ok,
            "wall s": time.perf_counter() - began,
        }
    for label, row in (("without", rows[False]), ("with", rows[True])):
        print(f"  {label:>7}: sd ratio {np.round(row['sd ratio'], 3)} (step alone: 1.026), max mean error "
              f"{row['mean error / sd'].max():.3f} sd, temperature {row['temperature']:.3f}, gradient noise r "
              f"{row['noise r']:.2f}, ok {row['ok']}, {row['wall s']:.1f} s")
    excess = [np.abs(rows[cv]["sd ratio"] ** 2 / (1 / (1 - 0.05)) - 1).max() for cv in (False, True)]
    print(f"  largest variance excess over the step's own: {excess[0]:.3f} without, {excess[1]:.3f} with "
          f"(ratio with/without {excess[1] / excess[0]:.2f})")


def bnn(quick: bool) -> None:
    data = ppl.datasets.load("two_moons", seed=0)
    model = BNN(hidden=(50,), likelihood="bernoulli")
    n, batch = data.train.X.shape[0], 32
    print(f"2. the main job's BNN, {n} rows, sgld on minibatches of {batch}, one round at the automatic step")
    reference = ppl.fit(model, data.train, method="nuts", seed=0, progress_bar=False)
    nuts = reference.predict(data.test.X, seed=1).probs[:, 1]
    out = {}
    for cv in (False, True):
        began = time.perf_counter()
        post = ppl.fit(model, data.train, method="sgld", seed=0, batch_size=batch, control_variate=cv, time_budget=0,
                       num_samples=300 if quick else 1000, progress_bar=False)
        seconds = time.perf_counter() - began
        d = post.diagnostics()
        ess = next(c.value for c in d.checks if c.field == "function_ess_bulk_min")
        rhat = d.rhat_function_max
        steps = post.num_chains * (post.options["num_warmup"] + post.num_draws * post.options["thinning"])
        rows_evaluated = steps * batch * (2 if cv else 1)
        if cv:
            rows_evaluated += post.num_chains * post.info["anchor_steps"] * n
        probs = post.predict(data.test.X, seed=1).probs[:, 1]
        tv = float(np.mean(np.abs(probs - nuts)))
        out[cv] = ess / rows_evaluated * 1000
        print(f"  {'with' if cv else 'without':>7}: step {float(np.max(post.chain_stats.step_size)):.3g}, gradient noise r "
              f"{post.info['gradient_noise']:.1f}, function R-hat {rhat:.3f}, bulk ESS {ess:.0f}, "
              f"{rows_evaluated / 1e6:.1f} M row gradients -> {out[cv]:.3f} ESS per 1000, TV to NUTS {tv:.4f}, "
              f"temperature {post.chain_stats.temperature:.2f}, ok {d.ok}, {seconds:.0f} s")
    print(f"  ESS per row gradient, with / without: {out[True] / out[False]:.2f}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer draws (a smoke run)")
    args = parser.parse_args(argv)
    linear(args.quick)
    bnn(args.quick)


if __name__ == "__main__":
    main()
