"""Mixtures of Laplace approximations (Eschenhagen et al. 2021) on rotated digits.

    python -m examples.mola_digits [--out runs/mola_digits] [--seed 0] [--quick]

A ReLU ``BNN`` on ``ppl.datasets.load("rotated_digits", seed=seed)`` (the 8×8 digits 0–7 are the
classes, the digits 8 and 9 are held out as out-of-distribution inputs, and the test images are
rotated by 0, 15, …, 180 degrees), fitted by ``ppl.compare`` with four methods, each with its
default options:

- MAP: ``method="map"`` (full-batch L-BFGS), plug-in prediction;
- Laplace: ``method="laplace"``; its defaults resolve to ``subset="last_layer"`` and
  ``hessian="full"`` (the exact GGN of the last layer's 808 weights) for a BNN, with the model's own N(0, 1) prior as the prior precision;
- deep ensemble: ``method="ensemble"`` (5 MAPs from 5 prior draws);
- MoLA: ``method="mola"`` (a uniform mixture of 5 last-layer Laplace approximations, one
  around each of 5 MAPs).

``ppl.compare`` predicts every method with ``mode="mc"`` (the stored draws pushed through the
network). Laplace and MoLA are also scored with ``mode="probit"`` (the linearised network's
probit approximation, as the paper predicts), through the library's own ``ppl.evaluate``,
``shift_metrics`` and ``ood_auroc``.

Writes to ``--out``:

- ``mola_digits_shift.png``: NLL and ECE against the rotation angle, and the AUROC with which
  each method tells the held-out digits 8 and 9 from the test digits;
- ``mola_digits_confidence.png``: the mean max-class probability on the test inputs scaled by
  δ ∈ [1, 10⁴] (Kristiadi et al. 2020: a ReLU MAP goes to 1, a last-layer Gaussian stays below);
- ``mola_digits_table.md``: the comparison table.

Every number is measured in this run. ``--quick`` is a small instance (one hidden layer of 32,
500 optimiser steps, 3 members, 200 draws) for the test; the full size is two hidden layers of 100
with every option at its default. The script prints its total wall time at the end.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

import ppl
from examples._cli import parse, parser
from ppl.diagnostics import metrics as M
from ppl.models import BNN

METHODS = ("map", "laplace", "ensemble", "mola")
# (label, method, predictive mode): the mc rows are scored by ppl.compare, the probit ones here
VARIANTS = (
    ("MAP (plug-in)", "map", "mc"),
    ("Laplace (mc)", "laplace", "mc"),
    ("Laplace (probit)", "laplace", "probit"),
    ("Ensemble (mc)", "ensemble", "mc"),
    ("MoLA (mc)", "mola", "mc"),
    ("MoLA (probit)", "mola", "probit"),
    ("Laplace, tuned prior (probit)", "laplace_marglik", "probit"),
)
DELTAS = np.logspace(0, 4, 9)  # 1, 3.2, 10, …, 10⁴
COLOURS = {"map": "tab:red", "laplace": "tab:blue", "ensemble": "tab:green", "mola": "tab:purple",
           "laplace_marglik": "tab:orange"}
GAP_FLOOR = 1e-12  # 1 − confidence is drawn no lower than this on the log axis


def settings(quick: bool) -> dict:
    if not quick:
        return {"hidden": (100, 100), "options": {}}
    return {
        "hidden": (32,),
        "options": {
            "map": {"steps": 500},
            "laplace": {"steps": 500, "num_draws": 200},
            "ensemble": {"steps": 500, "num_members": 3},
            "mola": {"steps": 500, "num_members": 3, "num_draws": 200},
        },
    }


def fit_all(data, seed: int, quick: bool):
    """The four methods through ``ppl.compare`` (mc predictive, shift metrics and OOD AUROC)."""
    config = settings(quick)
    model = BNN(hidden=config["hidden"], activation="relu", likelihood="categorical")
    result = ppl.compare(model, data, methods=list(METHODS), reference=None, seed=seed, options=config["options"],
                         log=lambda line: print(line, flush=True))
    failed = [f"{row['method']}: {row['error']}" for row in result.rows if row["error"]]
    if failed:
        raise RuntimeError("methods failed in ppl.compare — " + "; ".join(failed))
    # the paper tunes the prior precision; the same last-layer Laplace with it chosen by the evidence
    tuned = ppl.fit(model, data.train, method="laplace", seed=seed, prior_precision="marglik",
                    **config["options"].get("laplace", {}))
    return model, result, {**result.posteriors, "laplace_marglik": tuned}


def score(result, posteriors: dict, data, seed: int) -> dict:
    """label -> the numbers of one (method, predictive mode): test metrics at 0°, the shift curve,
    the OOD AUROCs and the fit's wall time."""
    rows = {}
    compared = {row["method"] for row in result.rows}
    for label, method, mode in VARIANTS:
        post = posteriors[method]
        if method in compared:
            khat, threshold = result.row(method)["khat"], result.row(method)["khat_threshold"]
        else:
            khat, threshold = post.diagnostics().khat, post.diagnostics().khat_threshold
        if mode == "mc":  # as ppl.compare scored it
            row = result.row(method)
            test = {key: row[key] for key in ("nll", "accuracy", "ece")}
            auroc = {"auroc_entropy": row["auroc_entropy"], "auroc_mi": row["auroc_mi"]}
            shifts = result.shifts[method]
        else:
            test = ppl.evaluate(post, data.test, seed=seed, mode=mode)
            inside = post.predict(data.test.X, seed=seed, mode=mode)
            outside = post.predict(data.ood.X, seed=seed, mode=mode)
            auroc = M.ood_auroc(inside, outside)  # auroc_mi is None: probit has no per-draw probabilities
            shifts = M.shift_metrics(post, data, seed=seed, mode=mode)
        rows[label] = {
            "method": method, "mode": mode, **test, **auroc, "shifts": shifts,
            "mean_shift_nll": float(np.mean([s["nll"] for s in shifts])),
            "mean_shift_ece": float(np.mean([s["ece"] for s in shifts])),
            "seconds": post.wall_time_s, "khat": khat, "khat_threshold": threshold,
        }
    return rows


def confidence(post, X, mode: str, seed: int) -> np.ndarray:
    """Mean max-class probability on δ·X for each δ in ``DELTAS``."""
    return np.array([float(post.predict(X * delta, seed=seed, mode=mode).probs.max(axis=1).mean()) for delta in DELTAS])


def table(rows: dict, result, posteriors: dict) -> str:
    lines = [
        "| method (predictive) | test NLL at 0° | test ECE at 0° | accuracy at 0° | mean NLL over rotations | "
        "mean ECE over rotations | OOD AUROC, entropy | OOD AUROC, MI | confidence at δ = 1 | "
        f"confidence at δ = {DELTAS[-1]:.0e} | fit wall s (with compilation) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, r in rows.items():
        mi = "—" if r["auroc_mi"] is None else f"{r['auroc_mi']:.3f}"
        lines.append(
            f"| {label} | {r['nll']:.3f} | {r['ece']:.3f} | {r['accuracy']:.3f} | {r['mean_shift_nll']:.3f} | "
            f"{r['mean_shift_ece']:.3f} | {r['auroc_entropy']:.3f} | {mi} | {r['confidence'][0]:.4f} | "
            f"{r['confidence'][-1]:.4f} | {r['seconds']:.1f} |"
        )
    laplace, mola = result.posteriors["laplace"], result.posteriors["mola"]
    members = result.posteriors["ensemble"].flat_draws.shape[0]
    angles = ", ".join(format(s["shift"], ".0f") for s in rows["MAP (plug-in)"]["shifts"])
    notes = [
        "",
        f"Rotations: {angles} degrees (the means are over all "
        f"{len(rows['MAP (plug-in)']['shifts'])}); OOD: the held-out digits 8 and 9. MI: mutual information between label and "
        "weights (— for probit, which has no per-draw probabilities; 0.5 for MAP, a point). The probit rows reuse the "
        "mc rows' fits.",
        f"Laplace: subset={laplace.info['subset']!r}, hessian={laplace.info['hessian']!r} "
        f"({laplace.info['num_free']} free weights), {laplace.flat_draws.shape[1]} draws; MoLA: "
        f"{len(mola.approximation.components)} components, subset={mola.info['subset']!r}, "
        f"hessian={mola.info['hessian']!r}; ensemble: {members} members. Tuned prior: precision "
        f"{', '.join(format(v, '.3g') for v in np.ravel(posteriors['laplace_marglik'].info['prior_precision']))} "
        "(per layer, by the Laplace evidence; the default is the model's N(0, 1) prior, precision 1).",
        f"PSIS k-hat of q against the posterior (ppl's own check; it fails above "
        f"{rows['Laplace (mc)']['khat_threshold']:.2f}): Laplace {rows['Laplace (mc)']['khat']:.2f}, "
        f"MoLA {rows['MoLA (mc)']['khat']:.2f}, Laplace with the tuned prior "
        f"{rows['Laplace, tuned prior (probit)']['khat']:.2f}.",
    ]
    return "\n".join(lines + notes) + "\n"


def _style(r) -> dict:
    return {"color": COLOURS[r["method"]], "linestyle": "--" if r["mode"] == "probit" else "-",
            "marker": "s" if r["mode"] == "probit" else "o", "markersize": 4,
            # Laplace and MoLA nearly coincide: Laplace is drawn wider, so it shows under MoLA
            "linewidth": 3.5 if r["method"] == "laplace" else 1.5}


def shift_figure(rows: dict, shift_name: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6), constrained_layout=True,
                             gridspec_kw={"width_ratios": [1, 1, 1.1]})
    for label, r in rows.items():
        angles = [s["shift"] for s in r["shifts"]]
        axes[0].plot(angles, [s["nll"] for s in r["shifts"]], label=label, **_style(r))
        axes[1].plot(angles, [s["ece"] for s in r["shifts"]], label=label, **_style(r))
    axes[0].set_yscale("log")
    axes[0].set_ylabel("test NLL (log scale)")
    axes[0].set_title("negative log-likelihood under rotation")
    axes[1].set_ylabel("test ECE")
    axes[1].set_title("expected calibration error under rotation")
    for ax in axes[:2]:
        ax.set_xlabel(shift_name)
        ax.set_xticks(np.arange(0, 181, 30))
        ax.grid(alpha=0.3)
    handles, labels = axes[1].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="outside lower left", ncol=4)

    labels = list(rows)
    x = np.arange(len(labels))
    width = 0.38
    entropy = [rows[k]["auroc_entropy"] for k in labels]
    mi = [rows[k]["auroc_mi"] for k in labels]
    ax = axes[2]
    bars = ax.bar(x - width / 2, entropy, width, color=[COLOURS[rows[k]["method"]] for k in labels],
                  edgecolor="k")
    ax.bar(x[[m is not None for m in mi]] + width / 2, [m for m in mi if m is not None], width,
           color=[COLOURS[rows[k]["method"]] for k, m in zip(labels, mi) if m is not None],
           edgecolor="k", hatch="//", alpha=0.6)
    for bar, value in zip(bars, entropy):
        ax.text(bar.get_x() + bar.get_width() / 2, value + 0.004, f"{value:.3f}", ha="center", fontsize=7)
    low = max(0.0, min(entropy + [m for m in mi if m is not None]) - 0.05)
    for k, m in zip(x, mi):
        ax.text(k + width / 2, (low + 0.01 if m is None else m + 0.004), "n/a" if m is None else f"{m:.3f}",
                ha="center", fontsize=7)
    ax.set_xticks(x)
    ax.set_xticklabels([k.replace(", ", ",\n").replace(" (", "\n(") for k in labels], fontsize=8)
    ax.set_ylim(low, 1.01)
    ax.set_ylabel("AUROC")
    ax.set_title("held-out digits 8 and 9 vs test digits")
    from matplotlib.patches import Patch

    keys = [Patch(facecolor="lightgrey", edgecolor="k", label="scored by predictive entropy"),
            Patch(facecolor="lightgrey", edgecolor="k", hatch="//", label="scored by mutual information")]
    ax.legend(handles=keys, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    ax.grid(alpha=0.3, axis="y")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def confidence_figure(rows: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6), constrained_layout=True)
    for label, r in rows.items():
        axes[0].plot(DELTAS, r["confidence"], label=label, **_style(r))
        axes[1].plot(DELTAS, np.maximum(1.0 - r["confidence"], GAP_FLOOR), label=label, **_style(r))
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("δ (test inputs scaled by δ)")
        ax.grid(alpha=0.3, which="both")
    axes[0].axhline(1.0, color="k", linewidth=0.8)
    axes[0].set_ylabel("mean max-class probability")
    axes[0].set_title("confidence far from the data")
    axes[0].legend(fontsize=8, loc="center right", bbox_to_anchor=(1.0, 0.42))
    axes[1].set_yscale("log")
    axes[1].set_ylabel(f"1 − mean max-class probability (floor {GAP_FLOOR:.0e})")
    axes[1].set_title("the same, as the gap to certainty")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> dict:
    args = parse(parser(__doc__, "mola_digits", quick="a small instance (for the test)"), argv)
    start = time.perf_counter()
    out = args.out
    data = ppl.datasets.load("rotated_digits", seed=args.seed)
    model, result, posteriors = fit_all(data, args.seed, args.quick)
    rows = score(result, posteriors, data, args.seed)
    for label, r in rows.items():
        r["confidence"] = confidence(posteriors[r["method"]], data.test.X, r["mode"], args.seed)
    text = table(rows, result, posteriors)
    (out / "mola_digits_table.md").write_text(text)
    shift_figure(rows, data.shift_name, out / "mola_digits_shift.png")
    confidence_figure(rows, out / "mola_digits_confidence.png")
    print(text)
    print(f"wrote {out / 'mola_digits_shift.png'}, {out / 'mola_digits_confidence.png'} and {out / 'mola_digits_table.md'}")
    seconds = time.perf_counter() - start
    print(f"total wall time: {seconds:.1f} s")
    return {"model": model, "result": result, "posteriors": posteriors, "rows": rows, "deltas": DELTAS,
            "seconds": seconds}


if __name__ == "__main__":
    main()
