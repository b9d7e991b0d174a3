"""Figures of a fitted run, as PNG files: what ``ppl show RUN --plots`` writes.

* samplers (kind ``chains``): trace and rank plots of the first parameters, or for a network with
  hidden layers of its outputs at the probe inputs, which decide its convergence (ArviZ);
* optimisers (a training trace): the loss curve, one line per ensemble member;
* a model from ``ppl.models`` on 1-D regression data: the predictive mean with its 50% and 90%
  bands over the inputs, the training points on top; on 2-D classification data: the predicted
  probability of a class over the input plane with the predictive entropy beside it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ppl.diagnostics import _arviz

__all__ = ["write_plots"]

MAX_TRACED = 6  # parameters shown in the trace and rank plots (the first ones of the layout)


def write_plots(posterior, folder) -> list[Path]:
    """Write every figure that applies to ``posterior`` into ``folder``; returns their paths."""
    folder = Path(folder)
    written = []
    if posterior.kind == "chains" and posterior.num_draws >= 4:
        draws = first_coordinates(traced(posterior))
        written.append(_arviz.plot_chains(draws, folder / "trace.png", kind="trace"))
        if posterior.num_chains >= 2:
            written.append(_arviz.plot_chains(draws, folder / "rank.png", kind="rank"))
    if posterior.trace is not None and np.size(posterior.trace.losses):
        written.append(loss_figure(posterior, folder / "loss.png"))
    problem = posterior.problem
    if problem is not None and problem.is_declarative and problem.spec.kind != "unsupervised":
        X = np.asarray(problem.data[0])
        if X.shape[1] == 1 and posterior.problem.likelihood in ("gaussian", "heteroscedastic", None) \
                and not getattr(problem.model, "multi_output", False):
            written.append(_regression_figure(posterior, folder / "predictive.png"))
        elif X.shape[1] == 2 and problem.likelihood in ("bernoulli", "categorical", "logistic"):
            written.append(_classification_figure(posterior, folder / "predictive.png"))
    return written


def traced(posterior) -> dict:
    """What the chain plots show: for a network with hidden layers its outputs at the probe inputs
    (the weights themselves are unidentifiable: chains in relabelled modes are not a failure), else
    the parameters."""
    problem = posterior.problem
    if problem is not None and problem.is_declarative and len(problem.parameter_groups()) > 1:
        functions = np.asarray(posterior.function_draws(), dtype=float)
        return {"f(probe)": functions.reshape(functions.shape[0], functions.shape[1], -1)}
    return posterior.draws


def first_coordinates(draws: dict) -> dict:
    """Up to ``MAX_TRACED`` scalar series (chain, draw), named site[i, j], in the layout's order."""
    out = {}
    for name, value in draws.items():
        value = np.asarray(value, dtype=float)
        flat = value.reshape(value.shape[0], value.shape[1], -1)
        for k in range(flat.shape[-1]):
            if len(out) == MAX_TRACED:
                return out
            index = np.unravel_index(k, value.shape[2:]) if value.ndim > 2 else ()
            out[f"{name}[{', '.join(map(str, index))}]" if index else name] = flat[..., k]
    return out


def new_figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(figure)
    return figure


def _save(figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path)
    return path


def loss_figure(posterior, path: Path) -> Path:
    """The whole descent, readable at every scale: each curve's loss above the lowest value it
    reached, on a log axis (offset notation and a clipped start hid both), labelled with what the
    loss is; dotted lines where a run continued for another round of ``steps``."""
    losses = np.atleast_2d(np.asarray(posterior.trace.losses, dtype=float))
    figure = new_figure(6.4, 3.6)
    axes = figure.add_subplot()
    steps = np.arange(1, losses.shape[1] + 1)
    finite = losses[np.isfinite(losses)]
    lowest = float(finite.min()) if finite.size else 0.0
    for m, row in enumerate(losses):
        floor = float(np.nanmin(np.where(np.isfinite(row), row, np.nan))) if np.isfinite(row).any() else lowest
        gap = row - floor
        # a curve at its own minimum would be −∞ on the log axis: floor it at the loss's rounding
        tiny = max(1e-7 * max(1.0, abs(floor)), float(np.min(gap[gap > 0])) if np.any(gap > 0) else 1e-12)
        axes.plot(steps, np.maximum(gap, tiny), lw=0.8, label=f"member {m}" if losses.shape[0] > 1 else None)
    axes.set_yscale("log")
    per_round = posterior.round_length
    if isinstance(per_round, int) and 0 < per_round < losses.shape[1]:
        for edge in range(per_round, losses.shape[1], per_round):
            axes.axvline(edge + 0.5, color="grey", lw=0.6, ls=":")
        axes.text(0.99, 0.97, f"dotted: a new round of {per_round} steps", transform=axes.transAxes, ha="right",
                  va="top", fontsize=7, color="grey")
    label = posterior.loss_label
    axes.set_xlabel("step")
    axes.set_ylabel("loss − its lowest value (log scale)", fontsize=8)
    converged = posterior.status.converged
    verdict = "" if converged is None else (" — settled" if converged else " — NOT settled")
    axes.set_title(f"{posterior.method}: {label}\nlowest {lowest:.6g}{verdict}", fontsize=9)
    if losses.shape[0] > 1:
        axes.legend(fontsize=7, ncol=2)
    return _save(figure, path)


def _regression_figure(posterior, path: Path) -> Path:
    X, y = (np.asarray(a, dtype=float) for a in posterior.problem.data)
    low, high = X[:, 0].min(), X[:, 0].max()
    margin = 0.25 * (high - low)
    grid = np.linspace(low - margin, high + margin, 200)[:, None]
    prediction = posterior.predict(grid, seed=0)
    lower90, upper90 = prediction.interval(0.9)
    lower50, upper50 = prediction.interval(0.5)
    figure = new_figure(6.4, 4.0)
    axes = figure.add_subplot()
    axes.fill_between(grid[:, 0], lower90, upper90, color="tab:blue", alpha=0.18, lw=0, label="90% predictive")
    axes.fill_between(grid[:, 0], lower50, upper50, color="tab:blue", alpha=0.3, lw=0, label="50% predictive")
    axes.plot(grid[:, 0], prediction.mean, color="tab:blue", lw=1.5, label="predictive mean")
    axes.scatter(X[:, 0], y, s=8, color="black", alpha=0.7, label="training data", zorder=3)
    axes.set_xlabel("x (as the model sees it)")
    axes.set_ylabel("y (as the model sees it)")
    axes.set_title(f"{posterior.method}: posterior predictive")
    axes.legend(fontsize=8, loc="best")
    return _save(figure, path)


def _classification_figure(posterior, path: Path) -> Path:
    X, y = (np.asarray(a) for a in posterior.problem.data)
    (x0, y0), (x1, y1) = X.min(axis=0), X.max(axis=0)
    mx, my = 0.2 * (x1 - x0), 0.2 * (y1 - y0)
    gx, gy = np.meshgrid(np.linspace(x0 - mx, x1 + mx, 90), np.linspace(y0 - my, y1 + my, 90))
    grid = np.c_[gx.ravel(), gy.ravel()]
    prediction = posterior.predict(grid, seed=0, keep_draws=False)  # summaries only: no per-draw arrays
    probability = prediction.probs[:, -1].reshape(gx.shape)
    entropy = prediction.entropy.reshape(gx.shape)
    figure = new_figure(10.0, 4.2)
    for k, (values, title, cmap) in enumerate((
        (probability, f"P(class {prediction.probs.shape[1] - 1}) — predictive mean", "RdBu_r"),
        (entropy, "predictive entropy (nats)", "viridis"),
    )):
        axes = figure.add_subplot(1, 2, k + 1)
        image = axes.contourf(gx, gy, values, levels=20, cmap=cmap)
        figure.colorbar(image, ax=axes, shrink=0.9)
        if k == 0:
            axes.contour(gx, gy, probability, levels=[0.5], colors="black", linewidths=1.0)
        axes.scatter(X[:, 0], X[:, 1], c=np.asarray(y, dtype=float), cmap="coolwarm", s=9, edgecolors="white",
                     linewidths=0.3)
        axes.set_title(title, fontsize=10)
        axes.set_xlabel("x₁")
        axes.set_ylabel("x₂")
    figure.suptitle(f"{posterior.method}: posterior predictive over the input plane", fontsize=11)
    return _save(figure, path)
