"""Mean-field VI can overestimate predictive variance: conjugate linear regression, measured.

    python -m examples.mfvi_variance [--out runs/mfvi_variance] [--seed 0] [--quick]
                                     [--uci concrete] [--uci-root FOLDER]

For y ~ N(Xw, σ²) with w ~ N(0, α⁻¹ I) the posterior is N(m, Σ) with Σ⁻¹ = Λ = XᵀX/σ² + αI
(``method="exact"``), and the mean-field Gaussian closest in KL(q‖p) (``method="svi",
guide="mean_field"``) is N(m, S*) with S*_pp = d_p = 1/Λ_pp (Odgers, Riegler, Swaroop & Fortuin
2026). Each part below fits both with ppl and prints the closed form beside the fit:

1. d_p = 1/Λ_pp: a weighted harmonic mean of Σ's eigenvalues (weights: the squared eigenvector
   entries of coordinate p), never above Σ_pp; and Tr(Σ⁻¹S*) = P.
2. Test inputs drawn from the training inputs' empirical distribution: E[xᵀS*x] ≥ E[xᵀΣx], the gap
   growing with the prior's weight α and the inputs' correlation ρ; isotropic test inputs reverse
   the inequality; along the first principal component MFVI overestimates. Figure
   ``mfvi_variance_gap.png`` (closed forms over a grid of α and ρ; the fitted instance marked).
3. Rank-1 data, every row x = ε·1_P/√P: the information along u = 1_P/√P is fixed while P grows.
   The exact predictive variance at u stays 1/(α + Nε²/σ²); MFVI's, 1/(α + Nε²/(σ²P)), climbs to the
   prior's 1/α. Figure ``mfvi_variance_rank1.png``.
4. Cold posteriors N(m, T·S*) (an MFVI fit of p(w | D)^(1/T), ``tempering="cold"``): on inputs from
   a low-dimensional subspace, the T* < 1 that matches the exact predictive at in-distribution
   points, and test NLL against T at in-distribution points and at points orthogonal to the data
   (which prefer T > 1). Figure ``mfvi_variance_cold.png``.
5. The same on real data: RBF basis-function regression (Q Gaussian bumps) on a UCI set, with the
   temperature that minimises the forward KL, the reverse KL and the 2-Wasserstein distance between
   the T-MFVI and exact predictives of f(x), at training, in-distribution test and out-of-
   distribution test points (the OOD points are the rows with the largest values of one feature).
   Figure ``mfvi_variance_uci.png``; skipped, with a note, when the UCI folder is not found.

Writes the figures and ``mfvi_variance_table.md`` to ``--out``; every number is measured in the run.
It runs in float64 (``jax_enable_x64``): the RBF features of part 5 are nearly collinear, and the
closed forms are compared with the fits to more digits than float32 holds.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import jax
import numpy as np

import ppl
from examples._cli import parse, parser
from ppl.datasets import UCI_FOLDERS
from ppl.inference.exact import NotPositiveDefiniteError
from ppl.models import LinearRegression

UCI_ROOT = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "uci"  # the data folder beside the repository


# -- closed forms ----------------------------------------------------------------------------------


def posterior_precision(X, noise: float, alpha: float) -> np.ndarray:
    """Λ = XᵀX/σ² + αI."""
    return X.T @ X / noise**2 + alpha * np.eye(X.shape[1])


def mfvi_variances(precision: np.ndarray) -> np.ndarray:
    """d_p = 1/Λ_pp: the variances of the mean-field Gaussian closest to N(m, Λ⁻¹) in KL(q‖p)."""
    return 1.0 / np.diag(precision)


def harmonic_mean_form(precision: np.ndarray) -> np.ndarray:
    """d_p written as Σ_k (U_pk² / σ_k)⁻¹: the harmonic mean of Σ's eigenvalues σ_k weighted by the
    squared entries of coordinate p in Σ's eigenvectors (so min σ_k ≤ d_p ≤ Σ_pp)."""
    sigma_eig, U = np.linalg.eigh(np.linalg.inv(precision))
    return 1.0 / ((U**2) @ (1.0 / sigma_eig))


def equicorrelated_inputs(rng, n: int, dim: int, rho: float) -> np.ndarray:
    """Rows x ~ N(0, (1 − ρ) I + ρ 11ᵀ): every pair of inputs has correlation ρ."""
    common = rng.normal(size=(n, 1))
    return np.sqrt(1.0 - rho) * rng.normal(size=(n, dim)) + np.sqrt(rho) * common


def variance_ratios(X, noise: float, alpha: float) -> dict:
    """E[xᵀS*x] / E[xᵀΣx] for x from the training rows' empirical distribution, for isotropic x and
    along the first principal component of the training inputs."""
    precision = posterior_precision(X, noise, alpha)
    Sigma, S = np.linalg.inv(precision), np.diag(mfvi_variances(precision))
    second_moment = X.T @ X / X.shape[0]
    pc1 = np.linalg.eigh(second_moment)[1][:, -1]
    return {
        "train": np.trace(S @ second_moment) / np.trace(Sigma @ second_moment),
        "isotropic": np.trace(S) / np.trace(Sigma),
        "pc1": (pc1 @ S @ pc1) / (pc1 @ Sigma @ pc1),
    }


def gaussian_nll(y, mean, variance) -> np.ndarray:
    return 0.5 * (np.log(2 * np.pi * variance) + (y - mean) ** 2 / variance)


def best_temperatures(exact_var, mfvi_var) -> dict:
    """The T minimising each divergence between N(μ, v_i) (exact) and N(μ, T s_i) (T-MFVI), summed
    over points (equal means: MFVI's mean is the exact one):

    forward KL(p‖q_T): T = mean(v/s); reverse KL(q_T‖p): T = 1 / mean(s/v);
    W2²: (√v − √(T s))² summed, √T = Σ√(v s) / Σ s.
    """
    v, s = np.asarray(exact_var), np.asarray(mfvi_var)
    return {
        "forward_kl": float(np.mean(v / s)),
        "reverse_kl": float(1.0 / np.mean(s / v)),
        "w2": float((np.sum(np.sqrt(v * s)) / np.sum(s)) ** 2),
    }


def divergence_curves(exact_var, mfvi_var, temperatures) -> dict:
    """Mean forward KL, reverse KL and W2² per point, at each T (the curves the minimisers come from)."""
    v, s = np.asarray(exact_var)[None, :], np.asarray(mfvi_var)[None, :]
    T = np.asarray(temperatures)[:, None]
    r = T * s / v
    return {
        "forward_kl": np.mean(0.5 * (1.0 / r - 1.0 + np.log(r)), axis=1),
        "reverse_kl": np.mean(0.5 * (r - 1.0 - np.log(r)), axis=1),
        "w2": np.mean((np.sqrt(v) - np.sqrt(T * s)) ** 2, axis=1),
    }


# -- ppl fits --------------------------------------------------------------------------------------


def fit_pair(X, y, noise: float, alpha: float, seed: int, **svi_options) -> tuple:
    """(exact, mean-field svi) posteriors of LinearRegression without a bias, at the defaults."""
    model = LinearRegression(prior_scale=float(alpha ** -0.5), noise_scale=float(noise), bias=False)
    exact = ppl.fit(model, (X, y), method="exact", seed=seed)
    vi = ppl.fit(model, (X, y), method="svi", seed=seed, guide="mean_field", **svi_options)
    return exact, vi


def function_variance(post, X) -> np.ndarray:
    """Var f(x) = xᵀ Cov x at each row (the linearised predictive is exact for a linear model)."""
    return post.predict(X, seed=0, mode="linearized").epistemic_variance


# -- the parts -------------------------------------------------------------------------------------


def part_identities(rng, seed: int) -> dict:
    """Part 1 and the fitted instance of part 2: P = 8, N = 50, ρ = 0.8, α = 1, σ = 1."""
    noise, alpha = 1.0, 1.0
    X = equicorrelated_inputs(rng, 50, 8, 0.8)
    y = X @ rng.normal(size=8) / np.sqrt(alpha) + noise * rng.normal(size=50)
    exact, vi = fit_pair(X, y, noise, alpha, seed)
    precision = posterior_precision(X, noise, alpha)
    Sigma_fit = np.asarray(exact.approximation.covariance())
    d_fit = np.asarray(vi.approximation.variance())
    d_closed = mfvi_variances(precision)
    Sigma_inv_fit = np.linalg.inv(Sigma_fit)
    second = X.T @ X / X.shape[0]
    pc1 = np.linalg.eigh(second)[1][:, -1]
    iso = rng.normal(size=(4000, 8))
    fitted = {  # E[xᵀ·x] from the fitted posteriors' own predictives
        "train": (np.mean(function_variance(vi, X)), np.mean(function_variance(exact, X))),
        "isotropic": (np.mean(function_variance(vi, iso)), np.mean(function_variance(exact, iso))),
        "pc1": (float(function_variance(vi, pc1[None])[0]), float(function_variance(exact, pc1[None])[0])),
    }
    return {
        "exact": exact, "vi": vi, "X": X, "noise": noise, "alpha": alpha,
        "sigma_pp": np.diag(Sigma_fit), "d_fit": d_fit, "d_closed": d_closed,
        "d_harmonic": harmonic_mean_form(precision),
        "trace_closed": float(np.trace(precision @ np.diag(d_closed))),
        "trace_fit": float(np.trace(Sigma_inv_fit @ np.diag(d_fit))),
        "ratios_closed": variance_ratios(X, noise, alpha),
        "ratios_fit": {k: a / b for k, (a, b) in fitted.items()},
    }


def part_gap_grid(rng, quick: bool) -> dict:
    """Part 2's closed forms over prior precisions α and input correlations ρ (P = 10, N = 100, σ = 1)."""
    alphas = np.logspace(-2, 2, 9 if quick else 25)
    rhos = (0.0, 0.5, 0.9, 0.99)
    grid = {}
    for rho in rhos:
        X = equicorrelated_inputs(rng, 100, 10, rho)
        grid[rho] = [variance_ratios(X, 1.0, a) for a in alphas]
    return {"alphas": alphas, "rhos": rhos, "grid": grid}


def part_rank1(seed: int, quick: bool) -> dict:
    """Part 3: N = 20 identical rows ε·u, u = 1_P/√P, ε = 1, σ = 1, α = 1."""
    dims = (2, 64) if quick else (2, 8, 32, 128, 512, 1024)
    n, eps, noise, alpha = 20, 1.0, 1.0, 1.0
    rows = []
    rng = np.random.default_rng(seed)
    for P in dims:
        u = np.ones(P) / np.sqrt(P)
        X = np.tile(eps * u, (n, 1))
        y = X @ rng.normal(size=P) + noise * rng.normal(size=n)
        exact, vi = fit_pair(X, y, noise, alpha, seed)
        rows.append({
            "P": P,
            "exact": float(function_variance(exact, u[None])[0]),
            "mfvi": float(function_variance(vi, u[None])[0]),
            "exact_closed": 1.0 / (alpha + n * eps**2 / noise**2),
            "mfvi_closed": 1.0 / (alpha + n * eps**2 / (noise**2 * P)),
        })
    return {"rows": rows, "prior_variance": 1.0 / alpha, "information": n * eps**2 / noise**2}


def part_cold(rng, seed: int, quick: bool) -> dict:
    """Part 4: P = 40 weights, inputs in a 4-dimensional subspace (N = 60), σ = 0.5, α = 1; test
    points from the same subspace (in-distribution) and from its orthogonal complement, with the
    same expected squared norm; w drawn from the prior, so the exact predictive is the right one."""
    P, k, n, n_test, noise, alpha = 40, 4, 60, (2000 if quick else 20000), 0.5, 1.0
    basis = np.linalg.qr(rng.normal(size=(P, P)))[0]
    inside, outside = basis[:, :k], basis[:, k:]
    w = rng.normal(size=P) / np.sqrt(alpha)
    X = rng.normal(size=(n, k)) @ inside.T * np.sqrt(P / k)  # E|x|² = P
    y = X @ w + noise * rng.normal(size=n)
    X_in = rng.normal(size=(n_test, k)) @ inside.T * np.sqrt(P / k)
    X_out = rng.normal(size=(n_test, P - k)) @ outside.T * np.sqrt(P / (P - k))
    exact, vi = fit_pair(X, y, noise, alpha, seed)
    from scipy.optimize import minimize_scalar

    temperatures = np.logspace(-1.5, 2.5, 33 if quick else 81)
    curves, results = {}, {}
    for name, Xt in (("in-distribution", X_in), ("orthogonal", X_out)):
        yt = Xt @ w + noise * rng.normal(size=n_test)
        mean_vi = vi.predict(Xt, seed=0, mode="linearized").mean
        ex = exact.predict(Xt, seed=0, mode="linearized")
        s, v = function_variance(vi, Xt), ex.epistemic_variance
        def nll_at(T):
            return float(np.mean(gaussian_nll(yt, mean_vi, T * s + noise**2)))

        nll = np.array([nll_at(T) for T in temperatures])
        best = minimize_scalar(lambda log_t: nll_at(np.exp(log_t)), bounds=(np.log(1e-3), np.log(1e4)), method="bounded")
        curves[name] = nll
        results[name] = {
            "exact_nll": float(np.mean(gaussian_nll(yt, ex.mean, ex.variance))),
            "mfvi_nll": float(nll[np.argmin(np.abs(temperatures - 1.0))]),
            "best_T": float(np.exp(best.x)),
            "matching_T": float(np.mean(v) / np.mean(s)),  # T with E[T xᵀS*x] = E[xᵀΣx]
        }
    # the matching T* for the in-distribution points, fitted by ppl itself as a cold posterior
    T_star = results["in-distribution"]["matching_T"]
    model = LinearRegression(prior_scale=float(alpha ** -0.5), noise_scale=noise, bias=False)
    cold = ppl.fit(model, (X, y), method="svi", seed=seed, guide="mean_field", temperature=T_star, tempering="cold")
    scaled = np.asarray(cold.approximation.variance()) / (T_star * np.asarray(vi.approximation.variance()))
    return {"temperatures": temperatures, "curves": curves, "results": results, "T_star": T_star,
            "cold_fit_ratio": (float(scaled.min()), float(scaled.max()))}


def rbf_features(X, centres, lengthscale: float) -> np.ndarray:
    sq = np.sum((X[:, None, :] - centres[None, :, :]) ** 2, axis=-1)
    return np.exp(-0.5 * sq / lengthscale**2)


def part_uci(name: str, root: Path, seed: int, quick: bool) -> dict | None:
    """Part 5: RBF regression on ``name`` (split 0, train and test pooled): the 15% of rows with the
    largest value of the feature most correlated with the target are OOD; the rest split 80/20 into
    training and in-distribution test rows. Q centres are training rows (k-means++ seeding), the
    lengthscale the median distance between centres; σ and α maximise ppl's exact log evidence over
    a small grid."""
    from ppl.datasets import load

    if not Path(root).exists():
        return None
    data = load(name, split=0, root=root)
    X = np.concatenate([data.train.X, data.test.X])
    y = np.concatenate([data.train.y, data.test.y])
    feature = int(np.argmax(np.abs([np.corrcoef(X[:, j], y)[0, 1] for j in range(X.shape[1])])))
    order = np.argsort(X[:, feature], kind="stable")
    n_ood = int(0.15 * len(order))
    ood, rest = order[-n_ood:], order[:-n_ood]
    rng = np.random.default_rng(seed)
    rest = rng.permutation(rest)
    n_train = int(0.8 * len(rest))
    train, test = rest[:n_train], rest[n_train:]
    Q = 20 if quick else 50
    centres = [X[train[rng.integers(n_train)]]]
    for _ in range(Q - 1):  # k-means++ seeding: spread the centres over the training rows
        d2 = np.min(np.sum((X[train][:, None] - np.asarray(centres)[None]) ** 2, -1), axis=1)
        centres.append(X[train[rng.choice(n_train, p=d2 / d2.sum())]])
    centres = np.asarray(centres)
    pair = np.sqrt(np.sum((centres[:, None] - centres[None]) ** 2, -1))
    lengthscale = float(np.median(pair[np.triu_indices(Q, 1)]))
    Phi = {k: rbf_features(X[idx], centres, lengthscale) for k, idx in (("train", train), ("test", test), ("ood", ood))}
    best = None
    for noise in (0.3, 0.5) if quick else (0.15, 0.2, 0.3, 0.4, 0.6):
        for scale in (3.0,) if quick else (0.5, 1.0, 3.0, 10.0):
            model = LinearRegression(prior_scale=scale, noise_scale=noise, bias=False)
            try:
                evidence = ppl.fit(model, (Phi["train"], y[train]), method="exact", seed=seed).evidence.log_evidence
            except NotPositiveDefiniteError:  # singular to working precision: no trustworthy evidence there
                continue
            if best is None or evidence > best[0]:
                best = (evidence, noise, scale)
    _, noise, scale = best
    exact, vi = fit_pair(Phi["train"], y[train], noise, scale**-2, seed)
    temperatures = np.logspace(-2, 1, 61)
    parts = {}
    for split in ("train", "test", "ood"):
        v, s = function_variance(exact, Phi[split]), function_variance(vi, Phi[split])
        parts[split] = {
            "best": best_temperatures(v, s),
            "curves": divergence_curves(v, s, temperatures),
            "variance_ratio": float(np.mean(s) / np.mean(v)),
        }
    return {"name": name, "feature": feature, "Q": Q,
            "noise": noise, "prior_scale": scale, "lengthscale": lengthscale, "sizes": (len(train), len(test), len(ood)),
            "temperatures": temperatures, "parts": parts}


# -- output ----------------------------------------------------------------------------------------


def table(one, rank1, cold, uci) -> str:
    lines = ["## 1. MFVI variances are 1/Λ_pp (P = 8, N = 50, ρ = 0.8, α = σ = 1)", "",
             "| p | Σ_pp (exact) | d_p = 1/Λ_pp | weighted harmonic mean of eig(Σ) | svi mean-field variance | svi / closed form |",
             "|---|---|---|---|---|---|"]
    for p in range(len(one["d_closed"])):
        lines.append(f"| {p} | {one['sigma_pp'][p]:.5f} | {one['d_closed'][p]:.5f} | {one['d_harmonic'][p]:.5f} | "
                     f"{one['d_fit'][p]:.5f} | {one['d_fit'][p] / one['d_closed'][p]:.3f} |")
    lines += ["", f"Tr(Σ⁻¹S*) = {one['trace_closed']:.6f} (closed form), {one['trace_fit']:.4f} (ppl's exact Σ and svi's "
              f"variances); P = {len(one['d_closed'])}.", "",
              "## 2. E[xᵀS*x] / E[xᵀΣx] on the same instance", "",
              "| test inputs | closed form | ppl (svi / exact predictive variance) |", "|---|---|---|"]
    for key, label in (("train", "training rows' empirical distribution"), ("isotropic", "isotropic N(0, I)"),
                       ("pc1", "first principal component")):
        lines.append(f"| {label} | {one['ratios_closed'][key]:.4f} | {one['ratios_fit'][key]:.4f} |")
    lines += ["", "## 3. Rank-1 data: predictive variance of f at u = 1_P/√P (N = 20, ε = α = σ = 1; prior variance 1)", "",
              "| P | exact (ppl) | exact closed form | MFVI (ppl svi) | MFVI closed form |", "|---|---|---|---|---|"]
    for r in rank1["rows"]:
        lines.append(f"| {r['P']} | {r['exact']:.5f} | {r['exact_closed']:.5f} | {r['mfvi']:.5f} | {r['mfvi_closed']:.5f} |")
    lines += ["", "## 4. Cold posteriors N(m, T·S*) (P = 40, data in a 4-dimensional subspace, N = 60, σ = 0.5, α = 1)", "",
              "| test points | exact NLL | MFVI NLL (T = 1) | T minimising test NLL | T matching the exact variance on average |",
              "|---|---|---|---|---|"]
    for name, r in cold["results"].items():
        lines.append(f"| {name} | {r['exact_nll']:.4f} | {r['mfvi_nll']:.4f} | {r['best_T']:.3f} | {r['matching_T']:.3f} |")
    lo, hi = cold["cold_fit_ratio"]
    lines += ["", f"ppl's own cold fit (svi, temperature = {cold['T_star']:.3f}, tempering = \"cold\") has variances "
              f"{lo:.4f}–{hi:.4f} times T·S* of the T = 1 fit (same seed)."]
    if uci is None:
        lines += ["", "## 5. UCI: not run (the UCI data folder was not found; pass --uci-root)."]
        return "\n".join(lines) + "\n"
    n_tr, n_te, n_ood = uci["sizes"]
    lines += ["", f"## 5. RBF regression on {uci['name']} (Q = {uci['Q']}, lengthscale {uci['lengthscale']:.2f}; "
              f"σ = {uci['noise']}, prior sd {uci['prior_scale']} by the exact evidence; OOD: the largest 15% of "
              f"input column {uci['feature']}; {n_tr} train / {n_te} test / {n_ood} OOD rows)", "",
              "| points | mean MFVI var / mean exact var of f | T* forward KL | T* reverse KL | T* W2 |", "|---|---|---|---|---|"]
    for split, label in (("train", "training"), ("test", "in-distribution test"), ("ood", "OOD test")):
        part = uci["parts"][split]
        b = part["best"]
        lines.append(f"| {label} | {part['variance_ratio']:.3f} | {b['forward_kl']:.3f} | {b['reverse_kl']:.3f} | {b['w2']:.3f} |")
    return "\n".join(lines) + "\n"


def figures(one, grid, rank1, cold, uci, out: Path) -> list:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2), sharey=True, constrained_layout=True)
    for ax, key, title in zip(axes, ("train", "isotropic", "pc1"),
                              ("x from the training rows", "isotropic x", "x along the first principal component")):
        for rho in grid["rhos"]:
            ax.plot(grid["alphas"], [r[key] for r in grid["grid"][rho]], marker=".", label=f"ρ = {rho}")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.plot(one["alpha"], one["ratios_fit"][key], "k*", ms=12, label="ppl fit (ρ = 0.8, P = 8)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("prior precision α (noise σ = 1)")
        ax.set_title(title)
    axes[0].set_ylabel("E[xᵀS*x] / E[xᵀΣx]  (MFVI / exact)")
    axes[0].legend(fontsize=8)
    fig.suptitle("Mean-field predictive variance relative to the exact one: above 1 means MFVI overestimates")
    written.append(out / "mfvi_variance_gap.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.4, 4.4), constrained_layout=True)
    P = [r["P"] for r in rank1["rows"]]
    dense = np.geomspace(P[0], P[-1], 200)
    info, alpha = rank1["information"], 1.0 / rank1["prior_variance"]
    ax.plot(dense, 1.0 / (alpha + info / dense), "C1-", label="MFVI, closed form 1/(α + Nε²/(σ²P))")
    ax.plot(P, [r["mfvi"] for r in rank1["rows"]], "C1o", label="MFVI, ppl svi (mean_field)")
    ax.plot(dense, np.full_like(dense, 1.0 / (alpha + info)), "C0-", label="exact, closed form 1/(α + Nε²/σ²)")
    ax.plot(P, [r["exact"] for r in rank1["rows"]], "C0s", label="exact, ppl exact")
    ax.axhline(rank1["prior_variance"], color="gray", ls="--", label="prior variance 1/α")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("number of weights P (the data's information along u fixed)")
    ax.set_ylabel("Var f(u), u = 1_P/√P")
    ax.set_title("Rank-1 data: MFVI's variance climbs to the prior's")
    ax.legend(fontsize=8)
    written.append(out / "mfvi_variance_rank1.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4), constrained_layout=True)
    for ax, (name, nll) in zip(axes, cold["curves"].items()):
        r = cold["results"][name]
        ax.plot(cold["temperatures"], nll, "C1-", label="MFVI at temperature T: N(m, T·S*)")
        ax.axhline(r["exact_nll"], color="C0", label="exact posterior")
        ax.axvline(1.0, color="gray", lw=0.8)
        ax.axvline(r["best_T"], color="C1", ls=":", label=f"lowest NLL at T = {r['best_T']:.2f}")
        ax.axvline(r["matching_T"], color="C2", ls="--", label=f"variance-matching T = {r['matching_T']:.2f}")
        ax.set_xscale("log")
        ax.set_xlabel("temperature T")
        ax.set_ylabel("test NLL (mean per point)")
        ax.set_title(f"{name} test points")
        ax.legend(fontsize=8)
    fig.suptitle("Cold posteriors help in-distribution (T < 1) and hurt away from the data, which prefers T > 1")
    written.append(out / "mfvi_variance_cold.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    if uci is not None:
        fig, axes = plt.subplots(1, 3, figsize=(15, 4.3), sharey=True, constrained_layout=True)
        for ax, (split, label) in zip(axes, (("train", "training points"), ("test", "in-distribution test points"),
                                             ("ood", "OOD test points"))):
            part = uci["parts"][split]
            for i, (key, name) in enumerate((("forward_kl", "KL(exact ‖ T-MFVI)"), ("reverse_kl", "KL(T-MFVI ‖ exact)"),
                                             ("w2", "W2²"))):
                ax.plot(uci["temperatures"], part["curves"][key], f"C{i}-", label=f"{name}, min at T = {part['best'][key]:.2f}")
                ax.axvline(part["best"][key], color=f"C{i}", ls=":")
            ax.axvline(1.0, color="gray", lw=0.8)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("temperature T")
            ax.set_title(label)
            ax.legend(fontsize=8)
        axes[0].set_ylabel("mean divergence per point between predictives of f")
        fig.suptitle(f"{uci['name']}, RBF regression (Q = {uci['Q']}): the best temperature for the mean-field predictive")
        written.append(out / "mfvi_variance_uci.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    return written


def main(argv=None) -> dict:
    cli = parser(__doc__, "mfvi_variance", quick="a small instance of every part (for the tests)")
    cli.add_argument("--uci", default="concrete", choices=sorted(UCI_FOLDERS), help="the UCI set of part 5")
    cli.add_argument("--uci-root", default=os.environ.get("PPL_DATA_DIR", str(UCI_ROOT)),
                        help="the folder holding the UCI sets (default: $PPL_DATA_DIR or the shared data folder)")
    args = parse(cli, argv)
    jax.config.update("jax_enable_x64", True)
    start = time.perf_counter()
    out = args.out
    rng = np.random.default_rng(args.seed)
    one = part_identities(rng, args.seed)
    grid = part_gap_grid(rng, args.quick)
    rank1 = part_rank1(args.seed, args.quick)
    cold = part_cold(rng, args.seed, args.quick)
    uci = part_uci(args.uci, Path(args.uci_root), args.seed, args.quick)
    text = table(one, rank1, cold, uci)
    (out / "mfvi_variance_table.md").write_text(text)
    written = figures(one, grid, rank1, cold, uci, out)
    print(text)
    print("wrote " + ", ".join(str(p) for p in written + [out / "mfvi_variance_table.md"]))
    elapsed = time.perf_counter() - start
    print(f"total wall time: {elapsed:.0f} s")
    return {"identities": one, "grid": grid, "rank1": rank1, "cold": cold, "uci": uci, "seconds": elapsed}


if __name__ == "__main__":
    main()
