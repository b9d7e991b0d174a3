"""The report of a comparison: ``report.html`` with its PNG figures, in one folder.

Figures (each only where it applies):

* ``reliability.png`` — a reliability diagram per method (classification);
* ``predictive.png`` — per method, the predictive over the inputs: for 1-D regression the mean with
  50% and 90% bands over the data and beyond it; for 2-D classification the predictive entropy
  over the input plane with the decision boundary;
* ``selective.png`` — accuracy against coverage when abstaining on the most uncertain inputs;
* ``shift.png`` — accuracy and ECE against the shift intensity (datasets with shifted test sets);
* ``khat.png`` — PSIS k-hat per method against its threshold;
* ``trace_<method>.png``, ``rank_<method>.png`` for samplers (ArviZ), ``loss_<method>.png`` for
  optimisers.

Every figure is checked before it is saved: an axes without data is a bug, never a blank panel.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path

import numpy as np

from ppl.diagnostics import _arviz
from ppl.diagnostics.metrics import selective_prediction
from ppl.diagnostics.plots import new_figure, first_coordinates, loss_figure, traced

__all__ = ["write_report", "RELIABILITY_BINS"]

RELIABILITY_BINS = 10
# The decision-surface figure predicts a 6,400-point grid: with at most this many of each method's
# draws (drawn without replacement) its probabilities carry a Monte Carlo error of at most
# 0.5/√1000 = 0.016, below what the figure's colour steps (0.035 nats) show. With every draw the
# main job's figure took 26 s (SGLD alone, 16,000 draws, 10.7 s); with 1,000, 4.7 s.
SURFACE_DRAWS = 1000
REPORT = "report.html"


def write_report(comparison, folder) -> Path:
    """Write the figures and ``report.html`` into ``folder`` (created if absent); returns the page."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    sections = []  # (title, [(file, caption)])
    methods = [m for m in comparison.posteriors if m in comparison.predictions]
    overview = []
    if comparison.task == "classification" and methods:
        overview.append(_reliability(comparison, methods, folder / "reliability.png"))
        curves = [m for m in methods if comparison.predictions[m].member_probs is not None]
        if curves:
            overview.append(_selective(comparison, curves, folder / "selective.png"))
    predictive = _predictive(comparison, methods, folder / "predictive.png") if methods else None
    if predictive is not None:
        overview.insert(0, predictive)
    if comparison.shifts:
        overview.append(_shift(comparison, folder / "shift.png"))
    khat = _khat(comparison, folder / "khat.png")
    if khat is not None:
        overview.append(khat)
    sections.append(("Predictions and calibration", overview))
    runs = []
    for method, posterior in comparison.posteriors.items():
        figures = _run_figures(method, posterior, folder)
        if figures:
            runs.extend([method, *figures])
    if runs:
        sections.append(("Convergence of each run", runs))
    page = folder / REPORT
    page.write_text(_page(comparison, sections), encoding="utf-8")
    (folder / "comparison.json").write_text(json.dumps(_jsonable(comparison.to_dict()), indent=1), encoding="utf-8")
    return page


# -- figures -----------------------------------------------------------------------------------------

def _grid_of(count: int, width: float = 3.3, height: float = 3.0, columns: int = 4):
    cols = min(columns, count)
    rows = -(-count // cols)
    figure = new_figure(width * cols, height * rows + 0.4)
    return figure, rows, cols


def _save_checked(figure, path: Path) -> Path:
    """Save after checking that no visible axes is empty (a bug in the report, not a picture)."""
    for axes in figure.axes:
        if not axes.get_visible() or axes.get_label() == "<colorbar>":
            continue
        if not (axes.lines or axes.collections or axes.images or axes.patches or axes.containers):
            raise RuntimeError(f"{path.name}: the panel {axes.get_title()!r} has nothing drawn in it")
    figure.tight_layout()
    figure.savefig(path)
    return path


def _colours(count: int) -> list:
    """Distinct line colours: matplotlib's ten-colour cycle repeats beyond ten methods."""
    from matplotlib import colormaps

    cmap = colormaps["tab10" if count <= 10 else "tab20"]
    return [cmap(i) for i in range(count)]


def _reliability(comparison, methods, path: Path):
    y = np.asarray(comparison.test[1]).astype(int)
    figure, rows, cols = _grid_of(len(methods))
    edges = np.linspace(0.0, 1.0, RELIABILITY_BINS + 1)
    for k, method in enumerate(methods):
        probs = comparison.predictions[method].probs
        confidence, correct = probs.max(axis=1), probs.argmax(axis=1) == y
        bins = np.clip(np.ceil(confidence * RELIABILITY_BINS).astype(int) - 1, 0, RELIABILITY_BINS - 1)
        axes = figure.add_subplot(rows, cols, k + 1)
        centres = 0.5 * (edges[:-1] + edges[1:])
        accuracy = np.array([correct[bins == b].mean() if np.any(bins == b) else np.nan for b in range(RELIABILITY_BINS)])
        mean_conf = np.array([confidence[bins == b].mean() if np.any(bins == b) else np.nan for b in range(RELIABILITY_BINS)])
        filled = ~np.isnan(accuracy)
        share = np.array([np.mean(bins == b) for b in range(RELIABILITY_BINS)])
        axes.bar(centres[filled], accuracy[filled], width=1.0 / RELIABILITY_BINS, color="tab:blue", alpha=0.75,
                 edgecolor="white", label="accuracy")
        axes.scatter(centres[filled], mean_conf[filled], color="tab:red", s=14, zorder=3, label="mean confidence")
        axes.bar(centres, share, width=1.0 / RELIABILITY_BINS, color="grey", alpha=0.35, label="share of points")
        axes.plot([0, 1], [0, 1], color="black", lw=0.8, ls="--")
        row = comparison.row(method)
        axes.set_title(f"{method}  ECE {row['ece']:.3f}", fontsize=9)
        axes.set_xlim(0, 1), axes.set_ylim(0, 1)
        axes.set_xlabel("confidence", fontsize=8)
        if k % cols == 0:
            axes.set_ylabel("accuracy", fontsize=8)
        axes.tick_params(labelsize=7)
        if k == 0:
            axes.legend(fontsize=7, loc="upper left")
    figure.suptitle(f"Reliability on the test set ({RELIABILITY_BINS} confidence bins)", fontsize=10)
    return _save_checked(figure, path), (
        "Reliability diagrams: the accuracy of the test predictions in each confidence bin (blue bars), the bin's "
        "mean confidence (red dots) and the share of the test points that fall in it (grey). A red dot above its "
        "bar is overconfidence; ECE is that gap averaged over the points."
    )


def _selective(comparison, methods, path: Path):
    y = np.asarray(comparison.test[1]).astype(int)
    figure = new_figure(9.0, 3.6)
    for k, score in enumerate(("entropy", "epistemic")):
        axes = figure.add_subplot(1, 2, k + 1)
        for method, colour in zip(methods, _colours(len(methods))):
            curve = selective_prediction(comparison.predictions[method], y, score=score)
            axes.plot(curve.coverage, curve.accuracy, lw=1.2, color=colour, label=f"{method} ({curve.area:.3f})")
        axes.set_xlabel("coverage (fraction of test inputs kept)", fontsize=8)
        axes.set_ylabel("accuracy on the kept inputs", fontsize=8)
        axes.set_title("abstain by predictive entropy" if score == "entropy" else "abstain by mutual information",
                       fontsize=9)
        axes.set_xlim(0, 1.02)
        axes.tick_params(labelsize=7)
        axes.legend(fontsize=7, loc="lower left", title="method (area)", title_fontsize=7)
    return _save_checked(figure, path), (
        "Selective prediction: accuracy on the test inputs kept when the most uncertain ones are set aside first. "
        "A higher curve means the method's uncertainty points at its errors; the area is the mean accuracy over "
        "the curve."
    )


def _predictive(comparison, methods, path: Path):
    posterior = comparison.posteriors[methods[0]]
    problem = posterior.problem
    if problem is None or not problem.is_declarative:
        return None
    X, y = (np.asarray(a, dtype=float) for a in problem.data)
    if X.shape[1] == 1 and comparison.task == "regression" and not getattr(problem.model, "multi_output", False):
        return _bands(comparison, methods, X, y, path)
    if X.shape[1] == 2 and comparison.task == "classification":
        return _surfaces(comparison, methods, X, y, path)
    return None


def _bands(comparison, methods, X, y, path: Path):
    low, high = X[:, 0].min(), X[:, 0].max()
    margin = 0.3 * (high - low)
    grid = np.linspace(low - margin, high + margin, 200)[:, None]
    figure, rows, cols = _grid_of(len(methods), 3.6, 2.9, 3)
    shared = None
    for k, method in enumerate(methods):
        prediction = comparison.posteriors[method].predict(grid, seed=comparison.seed)
        axes = figure.add_subplot(rows, cols, k + 1, sharey=shared)
        shared = shared or axes
        for level, alpha in ((0.9, 0.18), (0.5, 0.3)):
            lower, upper = prediction.interval(level)
            axes.fill_between(grid[:, 0], lower, upper, color="tab:blue", alpha=alpha, lw=0,
                              label=f"{round(level * 100)}% predictive")
        axes.plot(grid[:, 0], prediction.mean, color="tab:blue", lw=1.2, label="mean")
        axes.scatter(X[:, 0], y, s=5, color="black", alpha=0.6, zorder=3, label="training data")
        axes.set_title(method, fontsize=9)
        axes.tick_params(labelsize=7)
        if k == 0:
            axes.legend(fontsize=6, loc="best")
    figure.suptitle("Posterior predictive over the inputs (as the model sees them); gaps in the data show "
                    "whether uncertainty grows where there is none", fontsize=9)
    return _save_checked(figure, path), (
        "The predictive mean with its 50% and 90% bands per method, over the training inputs and a margin "
        "beyond them. Where the data has a gap, a faithful posterior widens its bands."
    )


def _surfaces(comparison, methods, X, y, path: Path):
    (x0, y0), (x1, y1) = X.min(axis=0), X.max(axis=0)
    mx, my = 0.25 * (x1 - x0), 0.25 * (y1 - y0)
    gx, gy = np.meshgrid(np.linspace(x0 - mx, x1 + mx, 80), np.linspace(y0 - my, y1 + my, 80))
    grid = np.c_[gx.ravel(), gy.ravel()]
    figure, rows, cols = _grid_of(len(methods), 3.3, 3.0, 4)
    # Only per-input summaries are drawn: keep_draws=False reduces each block of rows as it goes, so
    # a 6,400-point grid under NUTS's 4,000 draws does not hold 4000 × 6400 class probabilities per
    # method (with them kept, the main job's report peaked at 6.6 GB).
    predictions = {}
    for m in methods:
        posterior = comparison.posteriors[m]
        draws = min(SURFACE_DRAWS, posterior.num_chains * posterior.num_draws)
        predictions[m] = posterior.predict(grid, seed=comparison.seed, num_samples=draws, keep_draws=False)
    top = max(float(np.log(p.probs.shape[1])) for p in predictions.values())
    for k, method in enumerate(methods):
        prediction = predictions[method]
        axes = figure.add_subplot(rows, cols, k + 1)
        image = axes.contourf(gx, gy, prediction.entropy.reshape(gx.shape), levels=np.linspace(0.0, top, 21),
                              cmap="viridis")
        if prediction.probs.shape[1] == 2:
            axes.contour(gx, gy, prediction.probs[:, 1].reshape(gx.shape), levels=[0.5], colors="white",
                         linewidths=1.0)
        axes.scatter(X[:, 0], X[:, 1], c=y, cmap="coolwarm", s=5, edgecolors="black", linewidths=0.2)
        axes.set_title(method, fontsize=9)
        axes.set_xticks([]), axes.set_yticks([])
    figure.colorbar(image, ax=figure.axes, shrink=0.8, label="predictive entropy (nats)")
    figure.suptitle("Predictive entropy over the input plane; white: the decision boundary", fontsize=10)
    for axes in figure.axes:
        if axes.get_label() != "<colorbar>" and not axes.collections:
            raise RuntimeError(f"{path.name}: the panel {axes.get_title()!r} has nothing drawn in it")
    figure.savefig(path)  # tight_layout does not combine with a colorbar shared by all panels
    return path, (
        "Decision surfaces: the predictive entropy of each method over the input plane (yellow: uncertain), its "
        "decision boundary in white, the training points on top. A method that knows where it has seen no data "
        f"grows uncertain away from the points. Each surface uses at most {SURFACE_DRAWS:,} of the method's draws."
    )


def _shift(comparison, path: Path):
    figure = new_figure(9.0, 3.4)
    name = comparison.shift_name or "shift intensity"
    for k, metric in enumerate(("accuracy", "ece") if comparison.task == "classification" else ("rmse", "nll")):
        axes = figure.add_subplot(1, 2, k + 1)
        for (method, entries), colour in zip(comparison.shifts.items(), _colours(len(comparison.shifts))):
            axes.plot([e["shift"] for e in entries], [e[metric] for e in entries], marker="o", ms=3, lw=1.2,
                      color=colour, label=method)
        axes.set_xlabel(name, fontsize=8)
        axes.set_ylabel(metric.upper() if metric in ("ece", "rmse", "nll") else metric, fontsize=8)
        axes.tick_params(labelsize=7)
        axes.legend(fontsize=7)
    figure.suptitle("Under distribution shift", fontsize=10)
    return _save_checked(figure, path), (
        f"Test accuracy and calibration as the inputs shift ({name}). A method whose uncertainty is honest keeps "
        "its ECE low even as its accuracy falls."
    )


def _khat(comparison, path: Path):
    rows = [r for r in comparison.rows if r["khat"] is not None and not math.isnan(r["khat"])]
    if not rows:
        return None
    figure = new_figure(max(4.0, 0.9 * len(rows) + 2.0), 3.2)
    axes = figure.add_subplot()
    finite = [r["khat"] for r in rows if math.isfinite(r["khat"])]
    # an infinite k-hat (a handful of draws carry all the weight) is drawn at the top, hatched
    top = max([1.5, *[1.1 * v for v in finite]])
    values = [min(max(r["khat"], -0.5), top) for r in rows]
    colours = ["tab:green" if r["khat"] <= r["khat_threshold"] else "tab:red" for r in rows]
    bars = axes.bar(range(len(rows)), values, color=colours)
    for bar, row in zip(bars, rows):
        if not math.isfinite(row["khat"]):
            bar.set_hatch("//")
            axes.annotate("inf", (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom",
                          fontsize=8)
    axes.axhline(rows[0]["khat_threshold"], color="black", lw=0.8, ls="--", label="threshold")
    axes.set_xticks(range(len(rows)), [r["method"] for r in rows], fontsize=8, rotation=30, ha="right")
    axes.set_ylim(min(0.0, *values) - 0.05, top * 1.12)
    axes.set_ylabel("PSIS k-hat", fontsize=8)
    axes.set_title("How far each fitted q is from the posterior (PSIS k-hat)", fontsize=9)
    axes.legend(fontsize=7)
    return _save_checked(figure, path), (
        "PSIS k-hat of each method with a density, against the posterior it approximates: above the dashed "
        "threshold (red) importance sampling cannot repair q, and its uncertainty is not to be trusted. A hatched "
        "bar is an infinite k-hat: a few draws carry all the importance weight."
    )


def _run_figures(method: str, posterior, folder: Path) -> list:
    """(path, caption) of the convergence figures of one run, the first caption naming the method."""
    out = []
    if posterior.kind == "chains" and posterior.num_draws >= 4:
        draws = first_coordinates(traced(posterior))
        out.append((_arviz.plot_chains(draws, folder / f"trace_{method}.png", kind="trace"),
                    f"{method}: trace plots of the first outputs at the probe inputs (networks) or parameters."))
        if posterior.num_chains >= 2:
            out.append((_arviz.plot_chains(draws, folder / f"rank_{method}.png", kind="rank"),
                        f"{method}: rank plots; uniform histograms mean the chains mix."))
    if posterior.trace is not None and np.size(posterior.trace.losses):
        out.append((loss_figure(posterior, folder / f"loss_{method}.png"), f"{method}: the loss per step."))
    return out


# -- the page ----------------------------------------------------------------------------------------

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
table { border-collapse: collapse; margin: 0.6em 0 1.2em; font-size: 0.86em; }
th, td { padding: 0.25em 0.6em; border-bottom: 1px solid #ddd; text-align: right; }
th { background: #f3f3f3; } td:first-child, th:first-child { text-align: left; }
tr.bad td { color: #a00; } .note { color: #555; font-size: 0.9em; }
figure { margin: 1.2em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #444; font-size: 0.9em; max-width: 900px; }
"""


def _cell(value, spec: str = ".3f") -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return format(value, spec) if math.isfinite(value) else str(value)
    return html.escape(str(value))


def _page(comparison, sections) -> str:
    record = comparison.to_dict()
    ok_rows = [r for r in record["rows"] if not r["error"]]
    fit_header = ["method", "time (s)", "R-hat (weights)", "R-hat (function)", "bulk ESS (weights)",
                  "bulk ESS (function)", "divergences", "k-hat",
                  "elpd_loo", "± SE", "Δelpd", "± SE", "ok"]
    fit_rows = [[_cell(r["method"] + (" (reference)" if r["method"] == record["reference"] else "")),
                 _cell(r["wall_time_s"], ".1f"), _cell(r["rhat_max"]), _cell(r["rhat_function_max"]),
                 _cell(r["ess_bulk_min"], ".0f"), _cell(r.get("function_ess_bulk_min"), ".0f"),
                 _cell(r["divergences"]), _cell(r["khat"], ".2f"),
                 _cell(r["elpd_loo"], ".1f"), _cell(r["elpd_loo_se"], ".1f"),
                 _cell(None if r["elpd_diff"] is None else -r["elpd_diff"] + 0.0, ".1f"), _cell(r["elpd_diff_se"], ".1f"),
                 _cell(r["ok"])] for r in ok_rows]
    if record["task"] == "classification":
        keys = [("nll", "NLL"), ("accuracy", "accuracy"), ("ece", "ECE"), ("brier", "Brier"),
                ("auroc_entropy", "OOD AUROC (entropy)"), ("auroc_mi", "OOD AUROC (MI)"),
                ("selective_area", "selective area"), ("agreement", "agreement"), ("total_variation", "TV")]
    else:
        keys = [("nll", "NLL"), ("rmse", "RMSE"), ("coverage_90", "90% coverage"),
                ("auroc_entropy", "OOD AUROC (variance)"), ("auroc_mi", "OOD AUROC (epistemic)"),
                ("wasserstein1", "W1")]
    predict_rows = [[_cell(r["method"])] + [_cell(r[k]) for k, _ in keys] for r in ok_rows]
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>ppl compare — {html.escape(record['model'])} on {html.escape(record['data'])}</title>",
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(record['model'])} on {html.escape(record['data'])}: {len(record['rows'])} methods compared</h1>",
        f"<p class='note'>{html.escape(record['task'])}, seed {record['seed']}"
        + (f", reference: {html.escape(record['reference'])}" if record["reference"] else "") + "</p>",
        "<h2>Fit and diagnostics</h2>", _table(fit_header, fit_rows, ok_rows),
        "<h2>Test predictions</h2>", _table(["method"] + [label for _, label in keys], predict_rows, ok_rows),
    ]
    failed = [r for r in record["rows"] if r["error"]]
    if failed:
        parts.append("<h2>Failed</h2><ul>" + "".join(
            f"<li><b>{html.escape(r['method'])}</b>: {html.escape(r['error'])}</li>" for r in failed) + "</ul>")
    untrusted = [r for r in ok_rows if r["ok"] is False]
    if untrusted:
        parts.append("<h2>Did not pass their own diagnostics</h2><ul>" + "".join(
            f"<li><b>{html.escape(r['method'])}</b>:<ul>"
            + "".join(f"<li>{html.escape(problem)}</li>" for problem in r["problems"]) + "</ul></li>"
            for r in untrusted) + "</ul>")
    parts.append("<div class='note'>" + "".join(f"<p>{html.escape(n)}</p>" for n in record["notes"]) + "</div>")
    for title, figures in sections:
        if not figures:
            continue
        parts.append(f"<h2>{html.escape(title)}</h2>")
        for entry in figures:
            if isinstance(entry, str):
                parts.append(f"<h3>{html.escape(entry)}</h3>")
                continue
            path, caption = entry
            parts.append(f"<figure><img src='{html.escape(Path(path).name)}' alt='{html.escape(caption)}'>"
                         f"<figcaption>{html.escape(caption)}</figcaption></figure>")
    # Marks each figure loaded or broken once the page has loaded: what a browser check reads back.
    parts.append("<script>window.addEventListener('load', function () { var n = 0; "
                 "for (var i = 0; i < document.images.length; i++) { var img = document.images[i]; "
                 "var ok = img.complete && img.naturalWidth > 0; img.dataset.state = ok ? 'loaded' : 'broken'; "
                 "n += ok ? 1 : 0; } document.body.dataset.figuresLoaded = n; });</script>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _table(header, rows, records) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        f"<tr{' class=bad' if record['ok'] is False else ''}>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>"
        for row, record in zip(rows, records)
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _jsonable(value):
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.floating, float)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value
