"""ppl's NUTS against NumPyro's MCMC on the same model and settings: effective sample size of the
network's outputs per gradient evaluation and per second.

    python -m bench.nuts_vs_numpyro [--quick] [--hidden 16] [--repeats 3] [--out FILE.json]

Both run NumPyro's NUTS kernel (target acceptance 0.8, diagonal mass matrix, maximum tree depth
10, starts uniform in (−2, 2)) with 4 sequential chains of 500 warmup and 1000 kept draws
(200 and 400 with ``--quick``), on breast_cancer (455 training rows, 30 inputs) with a BNN of one
hidden layer of 16 tanh units (``--hidden 0``: logistic regression), float32. Seeds 0 to
repeats − 1, the same for both; every number is the median over the repeats.

- ESS: bulk ESS (rank-normalised, over the 4 chains) of each of the network's outputs on a probe
  batch of the first 64 training rows, computed the same way for both; the minimum and the median
  over the 64 outputs.
- gradient evaluations: the leapfrog steps of the kept transitions, summed over the chains (one
  gradient of the log density each: ppl's ``chain_stats.num_steps``, NumPyro's ``num_steps``
  extra field). Warmup is not in this count, because ppl's result records the kept transitions
  only; NumPyro's warmup count is reported beside it (``mcmc.warmup(collect_warmup=True)``, then
  ``mcmc.run`` from its end, as one run).
- seconds: the wall time of the whole run (warmup, sampling and, for ppl, its diagnostics),
  compilation included: ppl keeps its compiled sampler across fits of the same shapes, NumPyro
  compiles for each new ``MCMC`` object, so repeats after the first favour ppl.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import ppl
from bench import _harness
from ppl.diagnostics import _arviz
from ppl.models import BNN

CHAINS = 4
PROBE = 64


def function_ess(model, draws: dict, X) -> tuple:
    """(min, median) bulk ESS over the network's outputs at ``X``, from draws of shape (chains, draws, ...)."""
    chains, num = next(iter(draws.values())).shape[:2]
    flat = {k: jnp.reshape(v, (chains * num, *v.shape[2:])) for k, v in draws.items()}
    f = jax.vmap(lambda p: model.apply(p, X))(flat)
    ess = np.asarray(_arviz.ess(np.asarray(f).reshape(chains, num, -1), "bulk"))
    return float(ess.min()), float(np.median(ess))


def ppl_run(model, data, probe, seed: int, warmup: int, samples: int) -> dict:
    start = time.perf_counter()
    post = ppl.fit(model, data, method="nuts", seed=seed, num_warmup=warmup, num_samples=samples, num_chains=CHAINS,
                   progress_bar=False)
    seconds = time.perf_counter() - start
    low, mid = function_ess(model, post.draws, probe)
    return {"seconds": seconds, "ess_min": low, "ess_median": mid,
            "gradients": int(np.sum(post.chain_stats.num_steps)), "warmup_gradients": None,
            "divergences": post.chain_stats.divergences}


def numpyro_run(model, X, y, probe, seed: int, warmup: int, samples: int) -> dict:
    from numpyro.infer import MCMC
    from numpyro.infer import NUTS as NumPyroNUTS

    start = time.perf_counter()
    mcmc = MCMC(NumPyroNUTS(model), num_warmup=warmup, num_samples=samples, num_chains=CHAINS,
                chain_method="sequential", progress_bar=False)
    mcmc.warmup(jax.random.PRNGKey(seed), X, y, extra_fields=("num_steps",), collect_warmup=True)
    warmup_gradients = int(np.sum(mcmc.get_extra_fields()["num_steps"]))
    mcmc.run(mcmc.post_warmup_state.rng_key, X, y, extra_fields=("num_steps", "diverging"))
    seconds = time.perf_counter() - start
    samples_ = mcmc.get_samples(group_by_chain=True)
    low, mid = function_ess(model, {k: v for k, v in samples_.items() if k != "y"}, probe)
    extra = mcmc.get_extra_fields()
    return {"seconds": seconds, "ess_min": low, "ess_median": mid, "gradients": int(np.sum(extra["num_steps"])),
            "warmup_gradients": warmup_gradients, "divergences": int(np.sum(extra["diverging"]))}


def _rates(r: dict) -> dict:
    """The run's ESS per 1000 gradient evaluations and per second, added to it."""
    for which in ("min", "median"):
        r[f"{which}_per_grad"] = 1e3 * r[f"ess_{which}"] / r["gradients"]
        r[f"{which}_per_s"] = r[f"ess_{which}"] / r["seconds"]
    return r


def _median(runs: list, key: str):
    values = [r[key] for r in runs if r[key] is not None]
    return float(np.median(values)) if values else None


def run(quick: bool = False, repeats: int = 3, hidden: int = 16) -> dict:
    warmup, samples = (200, 400) if quick else (500, 1000)
    data = ppl.datasets.load("breast_cancer", seed=0)
    model = BNN(hidden=(hidden,) if hidden else (), activation="tanh", likelihood="bernoulli")
    X, y = jnp.asarray(data.train.X, jnp.float32), jnp.asarray(data.train.y)
    probe = X[:PROBE]
    runs = {"ppl": [], "NumPyro": []}
    for seed in range(repeats):
        runs["ppl"].append(_rates(ppl_run(model, data.train, probe, seed, warmup, samples)))
        runs["NumPyro"].append(_rates(numpyro_run(model, X, y, probe, seed, warmup, samples)))
        for name, r in runs.items():
            r = r[-1]
            print(f"  seed {seed} {name}: {r['seconds']:.1f} s, min ESS {r['ess_min']:.0f}, "
                  f"{r['gradients']} gradients", flush=True)
    rows, summary = [], {}
    for name, rs in runs.items():
        m = {key: _median(rs, key) for key in rs[0]}
        m["first_s"] = rs[0]["seconds"]
        summary[name] = m
        rows.append([name, m["first_s"], m["seconds"], m["gradients"], m["warmup_gradients"], m["divergences"],
                     m["ess_min"], m["ess_median"], m["min_per_grad"], m["median_per_grad"], m["min_per_s"],
                     m["median_per_s"]])
    a, b = summary["ppl"], summary["NumPyro"]
    rows.append(["ratio ppl / NumPyro", a["first_s"] / b["first_s"], a["seconds"] / b["seconds"],
                 a["gradients"] / b["gradients"], None, None, a["ess_min"] / b["ess_min"],
                 a["ess_median"] / b["ess_median"], a["min_per_grad"] / b["min_per_grad"],
                 a["median_per_grad"] / b["median_per_grad"], a["min_per_s"] / b["min_per_s"],
                 a["median_per_s"] / b["median_per_s"]])
    network = f"30-{hidden}-1 tanh BNN" if hidden else "logistic regression"
    title = (f"NUTS, {CHAINS} sequential chains × ({warmup} warmup + {samples} draws), {network} on breast_cancer, "
             f"float32; ESS: bulk, of the outputs on {PROBE} probe rows; gradients: leapfrog steps of the kept "
             f"draws (warmup apart); median of {repeats} seeds")
    columns = ["library", "first run s", "run s", "gradients", "warmup gradients", "divergences", "min ESS",
               "median ESS", "min ESS / 1000 grad", "median ESS / 1000 grad", "min ESS / s", "median ESS / s"]
    return {"name": "nuts_vs_numpyro", "runs": runs, "tables": [_harness.table(title, columns, rows)]}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 warmup and 400 draws per chain")
    parser.add_argument("--hidden", type=int, default=16, help="hidden units (0: logistic regression)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", help="write the result as JSON here")
    args = parser.parse_args(argv)
    return _harness.report(run(args.quick, args.repeats, args.hidden), args.out)


if __name__ == "__main__":
    main()
