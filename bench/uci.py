"""UCI regression benchmark: a 50-unit BNN at default options on the canonical splits.

    python bench/uci.py [--root DIR] [--sets concrete yacht] [--splits 5] \
        [--methods map svi laplace swag ensemble] [--results FILE]

For each set, split and method: fit ``BNN(hidden=(50,))`` (ReLU, N(0, 1) weights, learned noise
sigma) with every option at its default and seed 0, on inputs and target standardised with the
training split's statistics, and score the test split in the target's own units: test
log-likelihood per point (the standardised one minus log of the target's sd) and RMSE. The
table prints mean ± standard error over the splits next to the published MC-dropout anchors
(Gal & Ghahramani 2016, one hidden layer of 50 units on the same splits) and says how many fits
reported that their optimisation did not settle (for ``nuts``: whose diagnostics were not ok).

The data folder is ``--root``, else ``$PPL_DATA_DIR``, else the ``shared/data/uci`` folder beside
the repository. Each fit is appended to ``--results`` (JSON lines) as it ends; a rerun skips the
fits already there, so an interrupted benchmark continues where it stopped. ``nuts`` may be
added to ``--methods`` (500 warmup and 1000 draws, 4 chains at its defaults: minutes per split).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

import ppl
from ppl.models import BNN

# MC dropout on these splits (Gal & Ghahramani 2016; grid-searched / as published), mean over splits.
ANCHORS = {
    "concrete": {"ll_grid": -2.93, "ll_published": -2.97, "rmse": 4.82},
    "yacht": {"ll_grid": -1.25, "ll_published": -1.38, "rmse": 0.67},
    "boston": {"ll_grid": -2.40, "ll_published": -2.40, "rmse": 2.90},
    "energy": {"ll_grid": -1.21, "ll_published": -1.72, "rmse": 0.54},
    "kin8nm": {"ll_grid": 1.14, "ll_published": 0.97, "rmse": 0.08},
    "naval": {"ll_grid": 4.45, "ll_published": 3.91, "rmse": 0.00},
    "power": {"ll_grid": -2.80, "ll_published": -2.79, "rmse": 4.01},
    "protein": {"ll_grid": -2.87, "ll_published": -2.87, "rmse": 4.27},
    "wine_quality": {"ll_grid": -0.93, "ll_published": -0.92, "rmse": 0.62},
}


def default_root() -> Path:
    if os.environ.get(ppl.datasets.DATA_DIR_VARIABLE):
        return Path(os.environ[ppl.datasets.DATA_DIR_VARIABLE])
    return Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "uci"


def fit_one(name: str, split: int, method: str, root: Path) -> dict:
    data = ppl.datasets.load(name, split=split, root=root)
    model = BNN(hidden=(50,))
    started = time.perf_counter()
    posterior = ppl.fit(model, data.train, method=method, seed=0)
    wall = time.perf_counter() - started
    metrics = data.in_target_units(ppl.evaluate(posterior, data.test, seed=1))
    status = posterior.status
    converged, convergence = status.converged, status.convergence
    if "map_converged" in posterior.info:
        # SWAG's SGD phase explores at a constant rate and carries no verdict; its MAP pre-training does.
        converged, convergence = posterior.info["map_converged"], f"MAP pre-training: {posterior.info['map_convergence']}"
    elif not convergence:
        # A sampler has no optimisation verdict: report its diagnostics' (R-hat, ESS, divergences).
        diagnostics = posterior.diagnostics()
        converged, convergence = diagnostics.ok, "diagnostics: " + ("ok" if diagnostics.ok else "; ".join(diagnostics.warnings))
    return {
        "set": name, "split": split, "method": method, "test_ll": -metrics["nll"], "rmse": metrics["rmse"],
        "coverage_90": metrics["coverage_90"], "converged": bool(converged), "convergence": convergence,
        "steps_done": status.steps_done, "wall_s": wall,
    }


def mean_se(values) -> str:
    values = np.asarray(values, dtype=float)
    if values.size < 2:
        return f"{values.mean():.2f}" if values.size else "—"
    return f"{values.mean():.2f} ± {values.std(ddof=1) / math.sqrt(values.size):.2f}"


def table(rows: list[dict]) -> str:
    lines = [f"{'set':<10} {'method':<9} {'splits':>6}  {'test LL':>14}  {'RMSE':>14}  {'not settled/ok':>14}  {'s/fit':>6}"]
    for name in dict.fromkeys(row["set"] for row in rows):
        anchor = ANCHORS.get(name)
        for method in dict.fromkeys(row["method"] for row in rows if row["set"] == name):
            mine = [row for row in rows if row["set"] == name and row["method"] == method]
            unsettled = sum(not row["converged"] for row in mine)
            lines.append(
                f"{name:<10} {method:<9} {len(mine):>6}  {mean_se([r['test_ll'] for r in mine]):>14}  "
                f"{mean_se([r['rmse'] for r in mine]):>14}  {f'{unsettled} of {len(mine)}':>14}  "
                f"{np.mean([r['wall_s'] for r in mine]):>6.0f}"
            )
        if anchor:
            lines.append(
                f"{name:<10} {'MC drop.':<9} {'':>6}  {anchor['ll_grid']:>6.2f} / {anchor['ll_published']:<5.2f}  "
                f"{anchor['rmse']:>14.2f}  (grid-searched / published LL)"
            )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=None, help="folder holding the UCI set folders")
    parser.add_argument("--sets", nargs="+", default=["concrete", "yacht"])
    parser.add_argument("--splits", type=int, default=5, help="the first N canonical splits")
    parser.add_argument("--methods", nargs="+", default=["map", "svi", "laplace", "swag", "ensemble"])
    parser.add_argument("--results", type=Path, default=Path("uci_results.jsonl"), help="JSON lines, appended")
    args = parser.parse_args(argv)
    root = args.root or default_root()
    done = []
    if args.results.is_file():
        done = [json.loads(line) for line in args.results.read_text().splitlines() if line.strip()]
    have = {(row["set"], row["split"], row["method"]) for row in done}
    for name in args.sets:
        for split in range(args.splits):
            for method in args.methods:
                if (name, split, method) in have:
                    continue
                row = fit_one(name, split, method, root)
                with args.results.open("a") as handle:
                    handle.write(json.dumps(row) + "\n")
                done.append(row)
                print(f"{name} split {split} {method:<9} test LL {row['test_ll']:7.3f}  RMSE {row['rmse']:6.3f}  "
                      f"{'settled' if row['converged'] else 'DID NOT SETTLE: ' + row['convergence'][:160]}  "
                      f"({row['steps_done']} steps, {row['wall_s']:.0f} s)", flush=True)
    wanted = [row for row in done if row["set"] in args.sets and row["split"] < args.splits and row["method"] in args.methods]
    print(table(wanted))
    return 0


if __name__ == "__main__":
    sys.exit(main())
