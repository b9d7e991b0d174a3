"""ppl's ``laplace`` method against laplace-torch on the same MAP network, in the same run.

    python -m bench.laplace_vs_laplace_torch [--repeats 3] [--out results.json]

It is also part of ``python -m bench.run_all``; where torch or laplace-torch is not installed (they
are optional, never dependencies of ppl) it reports "not measured" and how to install them.

A BNN (64 → 50 ReLU → 10 softmax, N(0, 1) prior on every weight and bias, i.e. prior precision 1)
is fitted by ppl's MAP (L-BFGS) on ``digits``; its weights are copied into a torch
``nn.Sequential(Linear(64, 50), ReLU(), Linear(50, 10))`` (transposed: torch keeps (out, in)). Both
libraries then fit a GGN Laplace approximation at those weights, with prior precision 1 and the
whole training set as one batch, in three configurations:

    ppl subset="last_layer", hessian="full"   vs  laplace-torch "last_layer", "full"
    ppl subset="all",        hessian="kfac"   vs  laplace-torch "all",        "kron"
    ppl subset="all",        hessian="diag"   vs  laplace-torch "all",        "diag"

Everything runs in float64 (``jax.enable_x64`` around the run, ``torch.set_default_dtype(torch.float64)``),
so differences are about the methods, not rounding. Reported per configuration:

* agreement of the probit predictive probabilities on the test set (max and mean |Δp|), of the
  linearised output variances diag(J Σ Jᵀ) (max relative difference; ppl's from its private
  ``linearized_outputs``, laplace-torch's from ``_glm_predictive_distribution``), and of the
  MAP logits (a check of the weight copy);
* fit and predict times: for ppl the first call (with JAX compilation) and the median of
  ``--repeats`` warm calls of the same fit/predict; for laplace-torch the median of ``--repeats``
  calls (a fresh ``Laplace`` object each time); and the ratio ppl warm / laplace-torch.
* for K-FAC, the per-layer Kronecker factors of both libraries side by side (see the note below).

Definition difference in K-FAC (traced with the factor check this script prints): ppl treats a
layer's bias as a homogeneous coordinate, one Kronecker block Ã ⊗ G over the augmented [W; b]
with Ã = (1/N) Σ_n [a_n; 1][a_n; 1]ᵀ. laplace-torch (its default Curvlinops backend, which calls
``KFACLinearOperator(..., separate_weight_and_bias=True)``) keeps two blocks per layer, B ⊗ A for
W with A = (1/N) Σ_n a_n a_nᵀ, and B alone for b. G and B are the same matrix (Σ_n Σ_c g_nc g_ncᵀ
from the output-Hessian square root, no expectation, summed over N), A is the top-left block of Ã
and the bias blocks agree (Ã's corner is 1), so the two differ only by the weight–bias cross
block Ã[:fan_in, fan_in] ⊗ G = mean(a_n) ⊗ G, which laplace-torch drops. It is small for the first
layer (standardised inputs, mean ≈ 0) and not for the second (ReLU features have a positive mean),
so kfac/kron predictions agree less closely than full and diag, which are exact GGNs in both. A
check row refits laplace-torch's kron on the same network with each bias folded into a bias-free
Linear over [input, 1] (ppl's homogeneous coordinate): it then agrees with ppl to rounding.

Batches: K-FAC is not additive over batches (laplace-torch sums (M/N) B_batch ⊗ A_batch), so kron
gets the whole training set as one batch, as ppl does. full and diag are exact sums over batches
and get ``--batch-size`` (128): laplace-torch's default (Curvlinops) diag goes through per-sample
Jacobians and ``einsum("bcp,bck,bkp->p")``, which on the whole set as one batch took ~140 s and
~20 GB (one run was OOM-killed on the 24 GB machine); at 128 it takes seconds (its BackPACK
backend, ``backend=BackPackGGN``, not used here, takes ~0.05 s).

Timing caveat: seen on a 2-core machine; JAX and torch both use every core, and another process
sharing the cores makes single timings vary by several times (laplace-torch's diag fit most).

ppl's fit also checks the MAP's stationarity (one full-batch gradient) and stores 1000 posterior
draws (its default ``num_draws``); laplace-torch's fit does neither. Both predict with the GLM
(linearised) predictive and MacKay's probit link, σ(f / √(1 + π v / 8)) per class.

Setup: laplace-torch is an optional benchmark dependency, never a runtime one, and pulls a torch
of its own choosing (a multi-GB CUDA build) unless installed without dependencies. On the
project's machines (Python 3.11, a CPU wheel of torch 2.13.0 on local disk) these commands worked:

    python -m venv /work/venv-bench
    /work/venv-bench/bin/pip install torch==2.13.0
    /work/venv-bench/bin/pip install -e /work/main
    /work/venv-bench/bin/pip install --no-deps laplace-torch==0.3
    /work/venv-bench/bin/pip install --no-deps "asdfghjkl==0.1a4" backpack-for-pytorch==1.7.1 \\
        curvlinops-for-pytorch==3.0.1 torchmetrics==1.9.0 einconv==0.1.0 linear_operator==0.6.1 unfoldNd==0.2.3
    /work/venv-bench/bin/pip install "einops>=0.3,<1" "opt-einsum>=3.4" "lightning-utilities>=0.15.3" \\
        "scipy>=1.12" "tqdm>=4.66" packaging typing_extensions

torchvision, which laplace-torch and backpack declare, is left out: neither imports it on this
path, and PyPI's torchvision does not import beside that torch wheel (``pip check`` reports it
missing; that is expected). Then, from /work/main:

    /work/venv-bench/bin/python -m bench.laplace_vs_laplace_torch --out /tmp/laplace_bench.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import ppl
from bench import _harness
from ppl.core import curvature
from ppl.core.predict import linearized_outputs
from ppl.models import BNN

INSTALL = """laplace-torch is not importable in this Python ({exe}): {error}

It is an optional benchmark dependency. Install it into a separate virtualenv, keeping the CPU torch:

    python -m venv /work/venv-bench
    /work/venv-bench/bin/pip install torch==2.13.0
    /work/venv-bench/bin/pip install -e /work/main
    /work/venv-bench/bin/pip install --no-deps laplace-torch==0.3
    /work/venv-bench/bin/pip install --no-deps "asdfghjkl==0.1a4" backpack-for-pytorch==1.7.1 \\
        curvlinops-for-pytorch==3.0.1 torchmetrics==1.9.0 einconv==0.1.0 linear_operator==0.6.1 unfoldNd==0.2.3
    /work/venv-bench/bin/pip install "einops>=0.3,<1" "opt-einsum>=3.4" "lightning-utilities>=0.15.3" \\
        "scipy>=1.12" "tqdm>=4.66" packaging typing_extensions

then run: /work/venv-bench/bin/python -m bench.laplace_vs_laplace_torch
(see this file's docstring)."""

CONFIGS = (
    # (label, ppl subset, ppl hessian, laplace-torch subset_of_weights, hessian_structure)
    ("last-layer full", "last_layer", "full", "last_layer", "full"),
    ("all-layer kfac/kron", "all", "kfac", "all", "kron"),
    ("all-layer diag", "all", "diag", "all", "diag"),
)
PRIOR_PRECISION = 1.0


def import_torch():
    """(torch, laplace.Laplace); ImportError where torch, laplace-torch or one of their dependencies is missing."""
    import torch
    from laplace import Laplace

    return torch, Laplace


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def torch_mlp(torch, draws: dict):
    """nn.Sequential(Linear(64, 50), ReLU(), Linear(50, 10)) holding ppl's MAP weights."""
    w0, b0, w1, b1 = (np.array(draws[k][0, 0], np.float64) for k in ("w0", "b0", "w1", "b1"))
    net = torch.nn.Sequential(
        torch.nn.Linear(w0.shape[0], w0.shape[1]), torch.nn.ReLU(), torch.nn.Linear(w1.shape[0], w1.shape[1])
    ).double()
    with torch.no_grad():
        net[0].weight.copy_(torch.from_numpy(np.ascontiguousarray(w0.T)))
        net[0].bias.copy_(torch.from_numpy(b0))
        net[2].weight.copy_(torch.from_numpy(np.ascontiguousarray(w1.T)))
        net[2].bias.copy_(torch.from_numpy(b1))
    return net.eval()


def kfac_factor_check(torch, la_ppl, la_torch) -> list:
    """Per layer: ppl's (Ã, G) against laplace-torch's (A, B) and the cross block that differs."""
    problem = la_ppl.problem
    u = jnp.asarray(la_ppl.approximation.loc)
    layers = curvature.layer_slices(problem)
    rows = curvature.chunk_rows(problem.model.output_dim(), max(r * c for _, r, c in layers))
    factors = curvature.kfac_factors(problem, u, rows)
    kfacs = la_torch.H_facs.kfacs  # [[B, A] weight, [B] bias] per Linear (before decomposition)
    out = []
    for i, (A_aug, G) in enumerate(factors):
        A_aug, G = np.asarray(A_aug), np.asarray(G)
        (B, A), (B_bias,) = (np.asarray(f.detach().cpu().numpy()) for f in kfacs[2 * i]), kfacs[2 * i + 1]
        fan_in = A.shape[0]
        scale = lambda m: max(float(np.abs(m).max()), 1e-300)  # noqa: E731
        out.append({
            "layer": i,
            "A_rel_diff": float(np.abs(A_aug[:fan_in, :fan_in] - A).max() / scale(A)),
            "G_rel_diff": float(np.abs(G - B).max() / scale(B)),
            "bias_block_rel_diff": float(np.abs(A_aug[fan_in, fan_in] * G - B_bias.detach().cpu().numpy()).max() / scale(B)),
            "cross_block_max_abs_mean_input": float(np.abs(A_aug[:fan_in, fan_in]).max()),
            "A_diag_max": float(np.abs(np.diag(A)).max()),
        })
    return out


class AppendOne:
    """Factory of a torch module appending a constant 1 to its input (a homogeneous bias)."""

    @staticmethod
    def make(torch):
        class _AppendOne(torch.nn.Module):
            def forward(self, x):
                return torch.cat([x, x.new_ones(x.shape[0], 1)], dim=1)

        return _AppendOne()


def torch_mlp_homogeneous(torch, draws: dict):
    """The same network with each bias folded into a bias-free Linear over [input, 1], so that
    laplace-torch's K-FAC takes ppl's augmented factor Ã (ppl's definition, for the check row)."""
    w0, b0, w1, b1 = (np.array(draws[k][0, 0], np.float64) for k in ("w0", "b0", "w1", "b1"))
    first = torch.nn.Linear(w0.shape[0] + 1, w0.shape[1], bias=False).double()
    second = torch.nn.Linear(w1.shape[0] + 1, w1.shape[1], bias=False).double()
    with torch.no_grad():
        first.weight.copy_(torch.from_numpy(np.ascontiguousarray(np.vstack([w0, b0]).T)))
        second.weight.copy_(torch.from_numpy(np.ascontiguousarray(np.vstack([w1, b1]).T)))
    return torch.nn.Sequential(
        AppendOne.make(torch), first, torch.nn.ReLU(), AppendOne.make(torch), second
    ).eval()


def run_ppl(data, model, mp, subset, hessian, repeats) -> dict:
    """ppl's fit and probit predict: first call (compiles), then warm repeats of the same calls."""
    X_test = data.test.X
    fit = lambda: ppl.fit(model, data.train, method="laplace", seed=0, init=mp, subset=subset, hessian=hessian)  # noqa: E731
    la, fit_first = timed(fit)
    predict = lambda: la.predict(X_test, seed=1, mode="probit")  # noqa: E731
    pred, pred_first = timed(predict)
    fit_warm = statistics.median(timed(fit)[1] for _ in range(repeats))
    pred_warm = statistics.median(timed(predict)[1] for _ in range(repeats))
    mean, cov = linearized_outputs(la.problem, la.approximation, jnp.asarray(X_test, jnp.float64))
    return {
        "la": la, "probs": np.asarray(pred.probs), "mean": np.asarray(mean),
        "var": np.diagonal(np.asarray(cov), axis1=-2, axis2=-1),
        "time": {"fit_first": fit_first, "predict_first": pred_first, "fit_warm": fit_warm,
                 "predict_warm": pred_warm},
    }


def run_torch(torch, Laplace, data, net, subset, hessian, batch_size, repeats) -> dict:
    """laplace-torch's fit (a fresh Laplace object each time) and GLM probit predict, median of repeats."""
    Xt_test = torch.from_numpy(np.array(data.test.X, np.float64))
    Xt_train = torch.from_numpy(np.array(data.train.X, np.float64))
    yt_train = torch.from_numpy(np.array(data.train.y, np.int64))
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(Xt_train, yt_train), batch_size=batch_size, shuffle=False
    )

    def fit():
        la = Laplace(net, "classification", subset_of_weights=subset, hessian_structure=hessian,
                     prior_precision=PRIOR_PRECISION)
        la.fit(loader)
        return la

    fits = [timed(fit) for _ in range(repeats)]
    la = fits[-1][0]
    predict = lambda: la(Xt_test, pred_type="glm", link_approx="probit")  # noqa: E731
    preds = [timed(predict) for _ in range(repeats)]
    f_mu, f_var = la._glm_predictive_distribution(Xt_test)
    return {
        "la": la, "probs": preds[-1][0].detach().numpy(), "mean": f_mu.numpy(),
        "var": np.diagonal(f_var.numpy(), axis1=-2, axis2=-1), "batch_size": batch_size,
        "time": {"fit": statistics.median(t for _, t in fits), "predict": statistics.median(t for _, t in preds)},
    }


def agreement(label, data, p, t, subset, hessian, t_subset, t_hessian) -> dict:
    diff = np.abs(p["probs"] - t["probs"])
    var_rel = np.abs(p["var"] - t["var"]) / np.maximum(np.abs(t["var"]), 1e-300)
    return {
        "config": label,
        "ppl": {"subset": subset, "hessian": hessian, "num_free": int(p["la"].info["num_free"])},
        "laplace_torch": {"subset_of_weights": t_subset, "hessian_structure": t_hessian,
                          "num_params": int(t["la"].n_params), "batch_size": t["batch_size"]},
        "probs_max_abs_diff": float(diff.max()),
        "probs_mean_abs_diff": float(diff.mean()),
        "variance_max_rel_diff": float(var_rel.max()),
        "variance_median_rel_diff": float(np.median(var_rel)),
        "variance_mean_ppl": float(p["var"].mean()),
        "variance_mean_torch": float(t["var"].mean()),
        "map_logits_max_abs_diff": float(np.abs(p["mean"] - t["mean"]).max()),
        "accuracy_ppl": float((p["probs"].argmax(1) == data.test.y).mean()),
        "accuracy_torch": float((t["probs"].argmax(1) == data.test.y).mean()),
    }


def compare(torch, Laplace, data, model, mp, net, net_homogeneous, batch_size, repeats) -> list:
    results = []
    n = len(data.train.y)
    for label, subset, hessian, t_subset, t_hessian in CONFIGS:
        p = run_ppl(data, model, mp, subset, hessian, repeats)
        # K-FAC is not additive over batches (laplace-torch sums (M/N) B_batch ⊗ A_batch), so kron
        # takes the whole training set as one batch, as ppl does; full and diag are exact sums.
        t = run_torch(torch, Laplace, data, net, t_subset, t_hessian, n if t_hessian == "kron" else batch_size, repeats)
        row = agreement(label, data, p, t, subset, hessian, t_subset, t_hessian)
        tp, tt = p["time"], t["time"]
        row["time_s"] = {
            "ppl_fit_first": tp["fit_first"], "ppl_predict_first": tp["predict_first"],
            "ppl_fit_warm": tp["fit_warm"], "ppl_predict_warm": tp["predict_warm"],
            "torch_fit": tt["fit"], "torch_predict": tt["predict"],
            "ratio_warm_fit_plus_predict": (tp["fit_warm"] + tp["predict_warm"]) / (tt["fit"] + tt["predict"]),
        }
        results.append(row)
        if hessian == "kfac":
            row["kfac_factors"] = kfac_factor_check(torch, p["la"], t["la"])
            # the check row: laplace-torch's kron on the homogeneous-bias network has ppl's definition
            th = run_torch(torch, Laplace, data, net_homogeneous, t_subset, t_hessian, n, 1)
            check = agreement(label + " (homog. bias)", data, p, th, subset, hessian, t_subset, t_hessian)
            check["note"] = ("laplace-torch on Sequential(AppendOne, Linear(65, 50, bias=False), ReLU, AppendOne, "
                             "Linear(51, 10, bias=False)): its K-FAC then has ppl's augmented factor; agreement only")
            results.append(check)
    return results


def tables(results: list, header: dict) -> list:
    setup = (f"digits: {header['n_train']} training and {header['n_test']} test rows; BNN 64-50(relu)-10, prior "
             f"precision 1, float64; ppl MAP by L-BFGS {header['map_s']:.1f} s (first call), test accuracy "
             f"{header['map_accuracy']:.4f}; torch {header['torch']}, laplace-torch {header['laplace_torch']}, "
             f"{header['threads']} torch threads")
    agree = _harness.table(
        f"agreement on the test set ({setup}; dp: probit probabilities, dvar: diag(J Σ Jᵀ) of the logits, "
        "relative, dlogit: MAP logits, a check of the weight copy)",
        ["configuration", "params", "max |dp|", "mean |dp|", "max rel dvar", "median rel dvar", "max |dlogit|",
         "torch batch"],
        [[r["config"], r["ppl"]["num_free"], r["probs_max_abs_diff"], r["probs_mean_abs_diff"],
          r["variance_max_rel_diff"], r["variance_median_rel_diff"], r["map_logits_max_abs_diff"],
          r["laplace_torch"]["batch_size"]] for r in results])
    times = _harness.table(
        f"seconds: ppl's first call (compilation included) and median of {header['repeats']} warm calls; "
        "laplace-torch's median of as many calls; ratio of ppl warm to laplace-torch, fit + predict",
        ["configuration", "ppl fit first", "ppl predict first", "ppl fit warm", "ppl predict warm", "torch fit",
         "torch predict", "ratio"],
        [[r["config"], t["ppl_fit_first"], t["ppl_predict_first"], t["ppl_fit_warm"], t["ppl_predict_warm"],
          t["torch_fit"], t["torch_predict"], t["ratio_warm_fit_plus_predict"]]
         for r in results if (t := r.get("time_s")) is not None])
    factors = _harness.table(
        "K-FAC factors per layer, relative differences: ppl's Ã[:in, :in] against laplace-torch's A, G against B, "
        "the bias blocks; the weight-bias cross block mean(a) that ppl keeps and laplace-torch drops",
        ["layer", "A", "G", "bias block", "max |mean(a)|", "max A diagonal"],
        [[f["layer"], f["A_rel_diff"], f["G_rel_diff"], f["bias_block_rel_diff"],
          f["cross_block_max_abs_mean_input"], f["A_diag_max"]] for r in results for f in r.get("kfac_factors", [])])
    return [agree, times, factors]


def not_measured(error: Exception) -> dict:
    """The suite's result where torch or laplace-torch cannot be imported."""
    note = (f"not measured: laplace-torch not installed ({type(error).__name__}: {error}); it is optional, "
            "see bench/laplace_vs_laplace_torch.py for the install commands (pip install torch==2.13.0 and "
            "pip install --no-deps laplace-torch==0.3 with its small dependencies, in a separate virtualenv)")
    return {"name": "laplace_vs_laplace_torch", "skipped": str(error),
            "tables": [_harness.table(note, ["reason"], [[f"{type(error).__name__}: {error}"]])]}


def run(quick: bool = False, repeats: int = 3, batch_size: int = 128) -> dict:
    """The comparison in float64 (JAX's x64 switched on for its duration only); ``quick`` is the
    same comparison (it takes about a minute)."""
    try:
        torch, Laplace = import_torch()
        import laplace
    except ImportError as error:
        return not_measured(error)
    with jax.enable_x64(True):
        torch.set_default_dtype(torch.float64)
        torch.manual_seed(0)
        data = ppl.datasets.load("digits", seed=0)
        model = BNN(hidden=(50,), activation="relu", likelihood="categorical", prior_scale=1.0)
        mp, map_s = timed(lambda: ppl.fit(model, data.train, method="map", seed=0, progress_bar=False))
        net = torch_mlp(torch, mp.draws)
        map_pred = mp.predict(data.test.X, seed=1, mode="mc")
        header = {
            "n_train": int(len(data.train.y)), "n_test": int(len(data.test.y)), "map_s": map_s,
            "map_accuracy": float((np.asarray(map_pred.probs).argmax(1) == data.test.y).mean()),
            "torch": torch.__version__, "laplace_torch": getattr(laplace, "__version__", "0.3"),
            "jax": jax.__version__, "threads": torch.get_num_threads(), "repeats": repeats,
            "torch_batch_size_full_diag": batch_size, "dtype": "float64", "prior_precision": PRIOR_PRECISION,
        }
        # the prior the ppl model carries must be the one laplace-torch is given
        prior_diag = np.asarray(curvature.prior_precision_diagonal(mp.problem, jnp.asarray(mp.approximation.loc)))
        if not np.allclose(prior_diag, PRIOR_PRECISION):
            raise ValueError(f"ppl's prior precision is not {PRIOR_PRECISION} everywhere: {np.unique(prior_diag)}")
        net_homogeneous = torch_mlp_homogeneous(torch, mp.draws)
        results = compare(torch, Laplace, data, model, mp, net, net_homogeneous, batch_size, repeats)
    return {"name": "laplace_vs_laplace_torch", "setup": header, "results": results,
            "tables": tables(results, header)}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="warm repeats (median) per timing, >= 3 recommended")
    parser.add_argument("--batch-size", type=int, default=128,
                        help="laplace-torch's batch for full and diag (exact sums); kron always takes the whole set")
    parser.add_argument("--out", default=None, help="write the result as JSON here (default: print only)")
    args = parser.parse_args(argv)
    try:
        import_torch()
    except ImportError as error:
        sys.exit(INSTALL.format(exe=sys.executable, error=error))
    return _harness.report(run(False, args.repeats, args.batch_size), args.out)


if __name__ == "__main__":
    main()
