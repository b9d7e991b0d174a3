"""``ppl calibrate``: fit a temperature and/or conformal sets to a saved run and save them into it."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ppl._calibrate import CALIBRATION_FILE, supervised_task, calibration_record
from ppl.cli._arguments import UsageError
from ppl.cli._common import print_lines, run_folder, safe
from ppl.cli._rows import raw_rows, supervised_run
from ppl.io import store
import ppl


def run(args) -> int:
    """Fit a temperature and/or conformal sets to a saved run on held-out rows and save them into it."""
    folder = run_folder(Path(args.run))
    posterior, prep, _ = supervised_run(folder, "calibrate")
    regression = supervised_task(posterior, "ppl calibrate") == "regression"
    temperature = not args.no_temperature and not regression
    if args.alpha is None and not temperature:
        raise UsageError(
            "nothing to calibrate: " + ("a regression run has no temperature to fit; " if regression else "")
            + "give --alpha (e.g. --alpha 0.1) for split-conformal " + ("intervals" if regression else "sets")
        )
    if args.score is not None and args.alpha is None:
        raise UsageError(f"--score {args.score} chooses the conformal score; give --alpha as well")
    X, y, described = raw_rows(args.data, posterior, prep, "calibrate")
    if y is None:
        raise UsageError(f"--data {args.data}: has no target column {prep['target']!r}; calibrating needs the labels")
    y = y if not regression else (y - prep["target_mean"]) / prep["target_std"]
    y = y.astype(np.int64) if not regression else y
    lines = [f"calibrating {folder} ({posterior.method}) on {described}"]
    if temperature and args.alpha is not None:
        # The conformal threshold needs points the temperature was not fitted on: split the rows in two.
        order = np.random.default_rng(args.seed).permutation(len(X))
        half = len(X) // 2
        first, second = order[:half], order[half:]
        lines.append(f"  the rows are split in two at random (seed {args.seed}): {len(first)} fit the temperature, "
                     f"{len(second)} the conformal threshold")
    else:
        first = second = np.arange(len(X))
    result = None
    if temperature:
        result = ppl.calibrate(posterior, (X[first], y[first]), seed=args.seed, num_samples=args.num_samples)
        lines.append(str(result))
    if args.alpha is not None:
        base = result if result is not None else posterior
        options = {} if result is not None else {"num_samples": args.num_samples}
        result = ppl.conformal(base, (X[second], y[second]), alpha=args.alpha, seed=args.seed, score=args.score, **options)
        lines.append(str(result))
    store.add_run_files(folder, {CALIBRATION_FILE: calibration_record(result)})
    lines.append(f"saved to {folder / CALIBRATION_FILE}; ppl predict {folder} now applies it, and ppl show prints it")
    print_lines([safe(line) for line in lines])
    return 0
