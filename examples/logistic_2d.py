"""2-D Bayesian logistic regression: MAP, Laplace and Metropolis side by side.

    python -m examples.logistic_2d [--out runs/logistic_2d] [--seed 0]

Writes ``logistic_2d.png`` (the predictive probability P(y = 1 | x) of each method over the input
plane, with the data and the 0.5 decision boundary) and ``logistic_2d_table.md`` (the comparison table,
every number measured in this run) to ``--out``.

- MAP: ``method="map"`` (L-BFGS to the mode, where Newton's method would also stop; the table
  reports the gradient norm there) and plug-in prediction σ(xᵀŵ);
- Laplace: ``method="laplace"``, N(ŵ, −H⁻¹) with the exact Hessian (the GGN of a logistic model is
  its Hessian), probit predictive σ(m / √(1 + π v / 8));
- Metropolis: ``method="mh"``, 4 chains × 1000 draws, Monte Carlo predictive.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

import ppl
from examples._cli import parse, parser
from ppl.models import LogisticRegression

GRID = 120


def make_data(n: int = 60, seed: int = 0):
    """Two overlapping classes in the plane, few points: the posterior is wide."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    logits = 2.0 * X[:, 0] - 1.0 * X[:, 1] + 0.5
    y = (rng.uniform(size=n) < 1.0 / (1.0 + np.exp(-logits))).astype(int)
    Xt = rng.normal(size=(2000, 2))
    yt = (rng.uniform(size=2000) < 1.0 / (1.0 + np.exp(-(2.0 * Xt[:, 0] - Xt[:, 1] + 0.5)))).astype(int)
    return (X, y), (Xt, yt)


def fit_all(train, seed: int) -> dict:
    model = LogisticRegression(prior_scale=2.0)
    runs = {}
    for label, method, mode, options in (
        ("MAP", "map", "mc", {}),
        ("Laplace", "laplace", "probit", {}),
        ("Metropolis", "mh", "mc", {}),
    ):
        start = time.perf_counter()
        post = ppl.fit(model, train, method=method, seed=seed, **options)
        runs[label] = {"post": post, "mode": mode, "seconds": time.perf_counter() - start}
    return runs


FAR = np.array([[3.0, 6.0]])  # outside the data (inputs are standard normal), near the boundary's far end


def far_point_confidence(post, mode) -> float:
    """max(p, 1 − p) at ``FAR``: a plug-in MAP stays as sure there as its logit says, a posterior
    that keeps the weights' uncertainty is less sure."""
    return float(post.predict(FAR, seed=1, mode=mode).probs.max())


def table(runs: dict, test) -> str:
    rows = [
        "| method | estimate of w (mean) | uncertainty kept | cost (wall s, with compilation) | test NLL | test ECE | confidence at x = (3, 6) |",
        "|---|---|---|---|---|---|---|",
    ]
    kept = {
        "MAP": "none (a point)",
        "Laplace": "Gaussian at the mode (−H⁻¹)",
        "Metropolis": "the whole posterior, up to MC error",
    }
    for label, run in runs.items():
        post, mode = run["post"], run["mode"]
        metrics = ppl.evaluate(post, test, seed=1, mode=mode)
        w = post.draws["w"].reshape(-1, 2).mean(axis=0)
        rows.append(
            f"| {label} | ({w[0]:.2f}, {w[1]:.2f}) | {kept[label]} | {run['seconds']:.1f} | {metrics['nll']:.4f} | "
            f"{metrics['ece']:.4f} | {far_point_confidence(post, mode):.4f} |"
        )
    return "\n".join(rows)


def figure(runs: dict, train, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    X, y = train
    lo = np.minimum(X.min(axis=0), FAR[0]) - 1.5
    hi = np.maximum(X.max(axis=0), FAR[0]) + 1.5
    g0, g1 = np.meshgrid(np.linspace(lo[0], hi[0], GRID), np.linspace(lo[1], hi[1], GRID))
    grid = np.c_[g0.ravel(), g1.ravel()]
    fig, axes = plt.subplots(1, len(runs), figsize=(4.6 * len(runs), 4.4), sharey=True, constrained_layout=True)
    for ax, (label, run) in zip(axes, runs.items()):
        p = run["post"].predict(grid, seed=1, mode=run["mode"]).probs[:, 1].reshape(g0.shape)
        filled = ax.contourf(g0, g1, p, levels=np.linspace(0, 1, 11), cmap="RdBu_r", vmin=0, vmax=1)
        ax.contour(g0, g1, p, levels=[0.5], colors="k", linewidths=1.5)
        ax.scatter(X[y == 0, 0], X[y == 0, 1], c="tab:blue", edgecolors="k", s=22, label="y = 0")
        ax.scatter(X[y == 1, 0], X[y == 1, 1], c="tab:red", edgecolors="k", s=22, label="y = 1")
        ax.scatter(*FAR[0], marker="*", s=160, c="gold", edgecolors="k", zorder=3, label="x = (3, 6)")
        ax.set_title(f"{label} ({run['mode']} predictive)")
        ax.set_xlabel("x₁")
    axes[0].set_ylabel("x₂")
    axes[0].legend(loc="lower left", fontsize=8)
    fig.colorbar(filled, ax=axes, label="P(y = 1 | x, D)", shrink=0.9)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> dict:
    args = parse(parser(__doc__, "logistic_2d"), argv)
    out = args.out
    train, test = make_data(seed=args.seed)
    runs = fit_all(train, args.seed)
    text = table(runs, test)
    grad = runs["MAP"]["post"].trace.grad_norm
    note = f"\n\nMAP gradient norm at the returned point: {grad:.2e} (a stationary point, where Newton's method stops).\n"
    (out / "logistic_2d_table.md").write_text(text + note)
    figure(runs, train, out / "logistic_2d.png")
    print(text + note)
    print(f"wrote {out / 'logistic_2d.png'} and {out / 'logistic_2d_table.md'}")
    return runs


if __name__ == "__main__":
    main()
