"""How the cost of a training step grows with the problem: data rows N, hidden width W, SVI
particles K, ensemble members M and SG-MCMC chains C, each with the slope of its log-log curve
against the slope the arithmetic predicts.

    python -m bench.scaling [--quick] [--out FILE.json] [--figures DIR]
    python -m bench.scaling --plot FILE.json --figures DIR    # redraw the figures of a result

Every curve times a warm training step the way ``bench.hardware`` does: the difference between two
warm fits of different lengths over their difference in steps, so that what a fit does once
(setting up, drawing, the diagnostics) cancels (``_harness.per_step``). float32 throughout.

- ``rows``: MAP (Adam, full batch) of a 64-128-10 ReLU BNN on N rows made from the digits: the
  1438 training rows repeated, each copy with Gaussian noise (σ = 0.1) added to its standardised
  inputs. A full-batch gradient costs 6·N·P operations, so slope 1 once N is large enough that
  the step's fixed costs (the optimiser's update of the P weights, the loop) are small beside it.
- ``width``: MAP (Adam, full batch) of a 64-W-W-10 ReLU BNN on the 1438 digits rows. The W × W
  layer's W² weights dominate P, so slope 2 at widths where the matrix products are compute-bound;
  at small W the step is bound by fixed costs and the slope is lower.
- ``particles``: mean-field SVI of the 64-128-10 BNN, minibatches of 256 rows, K particles.
  Everything per particle (drawing P normal numbers, the network, the prior) is done K times;
  the optimiser's update of the 2·P variational parameters once: slope 1 at large K.
- ``members``: ``ensemble`` of M members of the 64-128-10 BNN (Adam, full batch), one vmapped
  program. XLA:CPU runs an operation on one core and the vmapped members share it, so the work is
  M times one member's: slope 1. Below 1 means a fixed cost per step shared by the members.
- ``chains``: SGLD with C chains of the 64-128-10 BNN, minibatches of 256 rows per chain. Chains
  are vmapped as members are: slope 1. The per-step time comes from two fits of the same 20 draws
  at different thinning (the diagnostics then cost the same), as in ``bench.overhead``.

The slope is a least-squares line through log(seconds per step) against log(size), over all
points and over the largest three, where the expectation applies. The figures show the points,
the line through all of them, and a dashed line of the expected slope through the largest point.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

import ppl
from bench import _harness
from ppl.models import BNN

HIDDEN = 128
BATCH = 256
SHORT = 16  # steps of the shorter fit
DRAWS = 20  # SGLD: draws kept by both fits; the step count grows with the thinning

# name: (what varies, its unit on the axis, the model and method, expected slope, full sizes, quick sizes)
CURVES = {
    "rows": ("data rows N", "rows", f"MAP (Adam, full batch), BNN 64-{HIDDEN}-10 ReLU, digits repeated with noise",
             1.0, (500, 2000, 8000, 32000), (1000, 8000)),
    "width": ("hidden width W", "units per layer", "MAP (Adam, full batch), BNN 64-W-W-10 ReLU, 1438 digits rows",
              2.0, (64, 128, 256, 512, 1024), (64, 512)),
    "particles": ("SVI particles K", "particles", f"mean-field SVI, minibatch {BATCH}, BNN 64-{HIDDEN}-10 ReLU, digits",
                  1.0, (1, 4, 16, 64, 128), (1, 32)),
    "members": ("ensemble members M", "members", f"ensemble (Adam, full batch), BNN 64-{HIDDEN}-10 ReLU, digits",
                1.0, (1, 4, 16, 32), (1, 16)),
    "chains": ("SGLD chains C", "chains", f"SGLD, minibatch {BATCH} per chain, BNN 64-{HIDDEN}-10 ReLU, digits",
               1.0, (1, 2, 4, 8, 16), (1, 8)),
}


def _digits():
    data = ppl.datasets.load("digits", seed=0)
    return np.asarray(data.train.X, np.float32), np.asarray(data.train.y)


def rows_data(n: int, seed: int = 0) -> tuple:
    """``n`` rows made from the digits' training rows: repeated, each copy beyond the first with
    Gaussian noise (σ = 0.1 on standardised inputs), so that no two rows are the same."""
    X, y = _digits()
    copies = -(-n // len(X))
    noise = np.random.default_rng(seed).normal(0.0, 0.1, (copies, *X.shape)).astype(np.float32)
    noise[0] = 0.0
    return (X[None] + noise).reshape(-1, X.shape[1])[:n], np.tile(y, copies)[:n]


def _network(width: int = HIDDEN, layers: int = 1) -> BNN:
    return BNN(hidden=(width,) * layers, activation="relu", likelihood="categorical")


def _common(steps: int) -> dict:
    return dict(seed=0, init="prior", steps=steps, max_steps=steps, progress_bar=False)


def _fitter(curve: str, size: int):
    """(``fit(length)`` running one whole fit, the ``short`` length, the most extra length, the
    steps that one unit of ``length`` stands for) for the curve's point ``size``."""
    digits, model = _digits(), _network()
    if curve == "rows":
        data = rows_data(size)
        return (lambda n: ppl.fit(model, data, method="map", optimizer="adam", **_common(n))), SHORT, 200000, 1
    if curve == "width":
        wide = _network(size, 2)
        return (lambda n: ppl.fit(wide, digits, method="map", optimizer="adam", **_common(n))), SHORT, 200000, 1
    if curve == "particles":
        return (lambda n: ppl.fit(model, digits, method="svi", guide="mean_field", num_particles=size,
                                  batch_size=BATCH, num_draws=8, **_common(n))), SHORT, 200000, 1
    if curve == "members":
        return (lambda n: ppl.fit(model, digits, method="ensemble", optimizer="adam", num_members=size,
                                  **_common(n))), SHORT, 200000, 1
    if curve == "chains":
        return (lambda thin: ppl.fit(model, digits, method="sgld", seed=0, num_chains=size, batch_size=BATCH,
                                     num_warmup=50, num_samples=DRAWS, thinning=thin, step_size=1e-4,
                                     progress_bar=False)), 1, 5000, DRAWS
    raise ValueError(curve)


def slope(x, seconds) -> float:
    """The least-squares slope of log(seconds) against log(x)."""
    return float(np.polyfit(np.log(np.asarray(x, float)), np.log(np.asarray(seconds, float)), 1)[0])


def measure(curve: str, sizes, repeats: int, target_s: float) -> dict:
    points = []
    for size in sizes:
        fit, short, most, steps_per_unit = _fitter(curve, size)
        timing = _harness.per_step(fit, short, repeats, target_s, most)
        seconds = timing["per_step_s"] / steps_per_unit
        points.append({"size": size, "per_step_s": seconds, "compile_s": timing["compile_s"]})
        print(f"  {curve} {size}: {seconds * 1e3:.3f} ms/step (compile {timing['compile_s']:.1f} s)", flush=True)
    x = [p["size"] for p in points]
    y = [p["per_step_s"] for p in points]
    label, unit, title, expected = CURVES[curve][:4]
    return {"curve": curve, "label": label, "unit": unit, "title": title, "expected_slope": expected,
            "points": points, "slope_all": slope(x, y), "slope_top": slope(x[-3:], y[-3:])}


def tables(curves: list) -> list:
    summary = _harness.table(
        "scaling: slope of log(seconds per step) against log(size), float32, one CPU device",
        ["curve", "model and method", "sizes", "slope, all points", "slope, largest 3", "expected"],
        [[c["curve"], c["title"], f"{c['points'][0]['size']}–{c['points'][-1]['size']}", c["slope_all"],
          c["slope_top"], c["expected_slope"]] for c in curves])
    out = [summary]
    for c in curves:
        first = c["points"][0]
        rows = [[p["size"], p["per_step_s"] * 1e3, p["per_step_s"] / first["per_step_s"], p["size"] / first["size"],
                 p["compile_s"]] for p in c["points"]]
        out.append(_harness.table(f"{c['curve']}: {c['title']}",
                                  [c["label"], "ms/step", "time × smallest", "size × smallest", "compile s"], rows))
    return out


def plot(curve: dict, path: Path) -> Path:
    """The curve's points, the line fitted through them and the expected slope through the largest."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator

    x = np.array([p["size"] for p in curve["points"]], float)
    y = np.array([p["per_step_s"] for p in curve["points"]]) * 1e3
    grid = np.geomspace(x[0], x[-1], 50)
    fitted = np.exp(np.polyval(np.polyfit(np.log(x), np.log(y), 1), np.log(grid)))
    expected = y[-1] * (grid / x[-1]) ** curve["expected_slope"]
    fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=110)
    ax.loglog(x, y, "o", color="C0", markersize=7, label="measured (warm, per step)", zorder=3)
    ax.loglog(grid, fitted, "-", color="C0", alpha=0.7, label=f"fit through all points: slope {curve['slope_all']:.2f}")
    ax.loglog(grid, expected, "--", color="C3", label=f"expected slope {curve['expected_slope']:g} through the largest")
    ax.set_xticks(x)
    ax.set_xticklabels([f"{v:g}" for v in x])
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.minorticks_off()
    ax.set_xlabel(f"{curve['label']} ({curve['unit']}, log scale)")
    ax.set_ylabel("time per training step (ms, log scale)")
    ax.set_title(f"{curve['title']}\nslope of the largest 3 points: {curve['slope_top']:.2f}", fontsize=9.5)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8.5, loc="upper left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def figures(result: dict, folder) -> list:
    return [plot(c, Path(folder) / f"scaling-{c['curve']}.png") for c in result["curves"]]


def run(quick: bool = False, repeats: int = 3, names=None) -> dict:
    target_s = 0.5 if quick else 1.5
    curves = [measure(name, CURVES[name][5 if quick else 4], repeats, target_s) for name in names or CURVES]
    return {"name": "scaling", "curves": curves, "tables": tables(curves)}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two sizes per curve, shorter timings")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--curves", nargs="+", choices=tuple(CURVES), help="these curves only")
    parser.add_argument("--out", help="write the result as JSON here")
    parser.add_argument("--figures", help="write one PNG per curve into this folder (scaling-<curve>.png)")
    parser.add_argument("--plot", help="draw the figures of this JSON result instead of measuring")
    args = parser.parse_args(argv)
    if args.plot:
        result = json.loads(Path(args.plot).read_text())
    else:
        result = {"environment": _harness.environment(), **run(args.quick, args.repeats, args.curves)}
        if args.out:
            _harness.write(result, args.out)
    print(_harness.render(result["tables"]))
    if args.figures:
        for path in figures(result, args.figures):
            print(f"written {path}")
    return result


if __name__ == "__main__":
    main()
