"""UCI regression benchmark: a 50-unit BNN at default options on the canonical splits.

    python -m bench.uci [--root DIR] [--sets concrete yacht] [--splits 5] \
        [--methods map laplace ensemble] [--results FILE] [--table]

For each set, split and method: fit ``BNN(hidden=(50,))`` (100 units for protein; ReLU, N(0, 1)
weights, learned noise sigma) with every option at its default and seed 0, on inputs and target
standardised with the training split's statistics, and score the test split in the target's own
units: test log-likelihood per point (the standardised one minus log of the target's sd), RMSE,
and the coverage of the central 90% predictive interval. Each fit is judged by its own verdict
with the test split held out (``Posterior.with_heldout``), so "ok" includes the held-out check. The
table prints mean ± standard error over the splits, the share of ok runs and the seconds per
fit, beside the published anchors: deep ensembles (Lakshminarayanan et al. 2017, Table 1) and MC
dropout with 10× epochs (Gal & Ghahramani 2016), on the same splits.

The data folder is ``--root``, else ``$PPL_DATA_DIR``, else the ``shared/data/uci`` folder beside
the repository. Each fit is appended to ``--results`` (JSON lines) as it ends; a rerun skips the
fits already there, so an interrupted benchmark continues where it stopped, set by set (the whole
takes hours on 2 cores). NUTS runs only on the five small sets (``NUTS_SETS``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from ppl.models import BNN
import ppl

# Published test log-likelihoods (and RMSE) on these splits, mean over splits.
ANCHORS = {
    "boston": {"de": -2.41, "dropout": -2.39, "rmse_de": 3.28},
    "concrete": {"de": -3.06, "dropout": -2.94, "rmse_de": 6.03},
    "energy": {"de": -1.38, "dropout": -1.72, "rmse_de": 2.09},
    "kin8nm": {"de": 1.20, "dropout": 0.97, "rmse_de": 0.09},
    "naval": {"de": 5.63, "dropout": None, "rmse_de": 0.00},
    "power": {"de": -2.79, "dropout": -2.79, "rmse_de": 4.11},
    "protein": {"de": -2.83, "dropout": None, "rmse_de": 4.71},
    "wine_quality": {"de": -0.94, "dropout": -0.92, "rmse_de": 0.64},
    "yacht": {"de": -1.18, "dropout": -1.38, "rmse_de": 1.58},
}
SETS = list(ANCHORS)
NUTS_SETS = ("boston", "concrete", "energy", "wine_quality", "yacht")
METHODS = ["map", "laplace", "ensemble", "batch_ensemble", "mola", "swag", "multiswag", "svi", "ivon", "sgld", "sghmc", "cyclical_sgld", "nuts"]
SPLITS = {"protein": 3}  # fewer splits where one fit takes long


def default_root() -> Path:
    if os.environ.get(ppl.datasets.DATA_DIR_VARIABLE):
        return Path(os.environ[ppl.datasets.DATA_DIR_VARIABLE])
    return Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "uci"


def fit_one(name: str, split: int, method: str, root: Path) -> dict:
    data = ppl.datasets.load(name, split=split, root=root)
    model = BNN(hidden=(100,) if name == "protein" else (50,))
    row = {"set": name, "split": split, "method": method}
    started = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            posterior = ppl.fit(model, data.train, method=method, seed=0)
            wall = time.perf_counter() - started
            metrics = data.in_target_units(ppl.evaluate(posterior, data.test, seed=1))
            diagnostics = posterior.with_heldout(*data.test).diagnostics()
    except Exception as error:  # a failed fit is a row that says why; the benchmark goes on
        return {**row, "error": f"{type(error).__name__}: {error}"[:300], "wall_s": time.perf_counter() - started}
    return {
        **row, "test_ll": -metrics["nll"], "rmse": metrics["rmse"], "coverage_90": metrics["coverage_90"],
        "ok": bool(diagnostics.ok), "failed": [c.field for c in diagnostics.failed],
        "noise_scale": posterior.info.get("noise_scale"), "wall_s": wall,
    }


def mean_se(values) -> str:
    values = np.asarray(values, dtype=float)
    if values.size < 2:
        return f"{values.mean():.2f}" if values.size else "—"
    return f"{values.mean():.2f} ± {values.std(ddof=1) / math.sqrt(values.size):.2f}"


def table(rows: list[dict]) -> str:
    """The results table; a fit run again (the same set, split and method) counts once, as its last row."""
    rows = list({(row["set"], row["split"], row["method"]): row for row in rows}.values())
    head = (f"{'set':<13} {'method':<14} {'splits':>6}  {'test LL':>14}  {'RMSE':>14}  {'90% cover':>9}  "
            f"{'ok':>7}  {'s/fit':>6}")
    lines = [head, "-" * len(head)]
    beats, trusted_beats = [], []
    for name in dict.fromkeys(row["set"] for row in rows):
        best = trusted = None
        for method in dict.fromkeys(row["method"] for row in rows if row["set"] == name):
            mine = [row for row in rows if row["set"] == name and row["method"] == method and "error" not in row]
            failed = sum(1 for row in rows if row["set"] == name and row["method"] == method and "error" in row)
            if not mine:
                lines.append(f"{name:<13} {method:<14} {failed:>6}  failed: {rows[-1].get('error', '')[:60]}")
                continue
            ll = [r["test_ll"] for r in mine]
            if best is None or np.mean(ll) > best[1]:
                best = (method, float(np.mean(ll)))
            # the best among methods that say "trustworthy" on at least half their splits
            if 2 * sum(r["ok"] for r in mine) >= len(mine) and (trusted is None or np.mean(ll) > trusted[1]):
                trusted = (method, float(np.mean(ll)))
            lines.append(
                f"{name:<13} {method:<14} {len(mine):>6}  {mean_se(ll):>14}  {mean_se([r['rmse'] for r in mine]):>14}  "
                f"{np.mean([r['coverage_90'] for r in mine]):>9.2f}  {sum(r['ok'] for r in mine):>3} of {len(mine):<2}"
                f"{f' ({failed} failed)' if failed else ''}  {np.mean([r['wall_s'] for r in mine]):>6.0f}"
            )
        anchor = ANCHORS.get(name, {})
        if anchor:
            dropout = "—" if anchor["dropout"] is None else f"{anchor['dropout']:.2f}"
            lines.append(f"{name:<13} {'anchors':<14} {'':>6}  DE {anchor['de']:.2f}, MC dropout {dropout}; DE RMSE "
                         f"{anchor['rmse_de']:.2f}")
            if best is not None:
                beats.append((name, best, best[1] > anchor["de"]))
            if trusted is not None:
                trusted_beats.append((name, trusted, trusted[1] > anchor["de"]))
    for label, found in (("best method", beats), ("best method that says ok on at least half its splits", trusted_beats)):
        if found:
            lines.append("")
            lines.append(f"{label} at defaults beats the deep-ensembles anchor on {sum(b for *_, b in found)} of "
                         f"{len(found)} sets: " + ", ".join(f"{n} {m} {v:.2f}" for n, (m, v), _ in found))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=None, help="folder holding the UCI set folders")
    parser.add_argument("--sets", nargs="+", default=SETS)
    parser.add_argument("--splits", type=int, default=5, help="the first N canonical splits (3 for protein)")
    parser.add_argument("--methods", nargs="+", default=METHODS)
    parser.add_argument("--results", type=Path, default=Path(__file__).parent / "results" / "uci.jsonl",
                        help="JSON lines, appended")
    parser.add_argument("--table", action="store_true", help="print the table of the results so far and stop")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the table to this Markdown file")
    args = parser.parse_args(argv)
    root = args.root or default_root()
    done = []
    if args.results.is_file():
        done = [json.loads(line) for line in args.results.read_text().splitlines() if line.strip()]
    have = {(row["set"], row["split"], row["method"]) for row in done}
    for name in [] if args.table else args.sets:
        for split in range(min(args.splits, SPLITS.get(name, args.splits))):
            for method in args.methods:
                if (name, split, method) in have or (method == "nuts" and name not in NUTS_SETS):
                    continue
                row = fit_one(name, split, method, root)
                with args.results.open("a") as handle:
                    handle.write(json.dumps(row) + "\n")
                done.append(row)
                said = row.get("error") or (f"test LL {row['test_ll']:8.3f}  RMSE {row['rmse']:6.3f}  cover "
                                            f"{row['coverage_90']:.2f}  ok {row['ok']} {row['failed']}")
                print(f"{name} split {split} {method:<14} {said}  ({row['wall_s']:.0f} s)", flush=True)
            if not args.table:
                from ppl.core.cache import release_compiled

                # Each fit compiles programs of its own (its tuned hyperparameters are static); a
                # hundred fits in one process reached the kernel's limit of memory maps, where XLA
                # fails with "LLVM compilation error: Cannot allocate memory".
                release_compiled()
    wanted = [row for row in done if row["set"] in args.sets and row["method"] in args.methods]
    text = table(wanted)
    print(text)
    if args.markdown is not None:
        import datetime

        command = "python -m bench.uci " + " ".join(argv if argv is not None else sys.argv[1:])
        args.markdown.write_text(
            f"# UCI regression at default options\n\nProduced by `{command}` on {datetime.date.today().isoformat()} "
            f"from `{args.results.name}` (one JSON line per fit; a rerun continues it). BNN with one hidden layer "
            "of 50 ReLU units (100 for protein), seed 0, every option at its default; test log-likelihood per point "
            "in the target's units and RMSE as mean ± standard error over the splits; 90% interval coverage averaged "
            "over the splits; ok: runs whose verdict, with the test split held out, is trustworthy; s/fit: wall "
            "seconds per fit on a 2-core CPU, compilation included (the first fit of a set pays for it).\n\n"
            f"```\n{text}\n```\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
