"""``ppl predict``: predict raw rows with a saved run, in the data's own units."""

from __future__ import annotations

import csv
import io
import sys
from pathlib import Path

import numpy as np

from ppl._calibrate import CALIBRATION_FILE, Conformal, calibration_from_record
from ppl.cli._arguments import UsageError
from ppl.cli._common import run_folder, safe
from ppl.cli._rows import raw_rows, supervised_run
from ppl.core.errors import did_you_mean


def run(args) -> int:
    """Predict raw rows with a saved run: prepare them as its training rows were, report in raw units."""
    folder = run_folder(Path(args.run))
    posterior, prep, record = supervised_run(folder, "predict", CALIBRATION_FILE)
    if not 0.0 < args.level < 1.0:
        raise UsageError(f"--level must lie in (0, 1), got {args.level}")
    X, y, described = raw_rows(args.data, posterior, prep, "predict")
    kept = _kept_columns(args.data, args.keep_columns, len(X))
    calibration = None
    if record is not None and not args.uncalibrated:
        calibration = calibration_from_record(posterior, record, f"{folder}/{CALIBRATION_FILE}")
        if args.num_samples is not None and calibration.num_samples != args.num_samples:
            raise UsageError(
                f"--num-samples {args.num_samples}: the run's calibration was fitted with "
                f"{calibration.num_samples or 'all stored'} draws and holds only for those; leave --num-samples out, "
                "or pass --uncalibrated"
            )
    sets = None
    if calibration is None:
        prediction = posterior.predict(X, seed=args.seed, num_samples=args.num_samples)
    elif isinstance(calibration, Conformal):
        # one prediction serves both the probabilities and the sets
        prediction, sets = calibration.predict_with_sets(X, seed=args.seed)
    else:
        prediction = calibration.predict(X, seed=args.seed)
    columns, summary = _prediction_columns(prediction, y, prep, args.level, sets, calibration if sets is not None else None)
    clash = sorted(set(kept) & set(columns))
    if clash:
        raise UsageError(f"--keep-columns: {', '.join(map(repr, clash))} would repeat the name of a prediction column; "
                         "rename that column in the file, or leave it out")
    columns = {**kept, **columns}
    header = list(columns)
    rows = zip(*(columns[name] for name in header))
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(header)
    writer.writerows([f"{v:.6g}" if isinstance(v, float) else v for v in row] for row in rows)
    if args.out:
        Path(args.out).write_text(text.getvalue())
    else:
        sys.stdout.write(text.getvalue())
    report = sys.stdout if args.out else sys.stderr
    print(safe(f"predicted {described} with {folder} ({posterior.method})"
                + (f"; written to {args.out}" if args.out else "")), file=report)
    if calibration is not None:
        print(safe(f"  calibrated as ppl calibrate saved it (--uncalibrated ignores it): {calibration}"), file=report)
    elif record is not None:
        print("  --uncalibrated: the run's saved calibration is not applied", file=report)
    for line in summary:
        print(safe(line), file=report)
    return 0


def _kept_columns(data: str, names: str | None, num_rows: int) -> dict:
    """{name: the column's cells as written} of ``--keep-columns`` from the ``--data`` CSV."""
    if names is None:
        return {}
    if Path(data).suffix != ".csv":
        raise UsageError(f"--keep-columns copies columns of a .csv file; --data {data} is not one (a .npz file or a "
                         "dataset's test split has no columns beyond its inputs)")
    try:
        with open(data, newline="", encoding="utf-8-sig") as handle:
            records = list(csv.reader(handle))
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise UsageError(f"--keep-columns: {data} cannot be read again ({error})") from None
    header = [cell.strip() for cell in records[0]] if records else []
    wanted = header if names.strip() == "all" else [name.strip() for name in names.split(",") if name.strip()]
    missing = [name for name in wanted if name not in header]
    if missing or not wanted:
        raise UsageError(f"--keep-columns: {data} has no column {', '.join(map(repr, missing)) or 'named'}"
                         f"{''.join(did_you_mean(name, header) for name in missing)}; its columns are "
                         f"{', '.join(header)} (or give 'all')")
    rows = [record for record in records[1:] if record]  # blank lines are skipped, as in reading the inputs
    if len(rows) != num_rows:
        raise UsageError(f"--keep-columns: {data} has {len(rows)} rows with cells, but {num_rows} were predicted")
    return {name: [row[header.index(name)] if header.index(name) < len(row) else "" for row in rows] for name in wanted}


def _prediction_columns(prediction, y, prep: dict, level: float, sets=None, conformal=None) -> tuple[dict, list[str]]:
    """CSV columns of a prediction in the data's own units (and a summary when targets are known);
    ``sets`` are a :class:`Conformal`'s sets or intervals for the same rows, ``conformal`` that object."""
    columns, summary = {}, []
    target = None if conformal is None else f"{1 - conformal.alpha:.3g}"
    if prediction.task == "regression":
        scale, shift = prep["target_std"], prep["target_mean"]
        lower, upper = prediction.interval(level)
        outputs = prediction.mean.shape[1] if prediction.mean.ndim == 2 else None
        for k in range(outputs or 1):
            pick = (lambda a: a[:, k]) if outputs else (lambda a: a)
            suffix = f"_{k}" if outputs else ""
            columns[f"mean{suffix}"] = (pick(prediction.mean) * scale + shift).tolist()
            columns[f"sd{suffix}"] = (np.sqrt(pick(prediction.variance)) * scale).tolist()
            percent = f"{level * 100:g}"
            columns[f"lower_{percent}{suffix}"] = (pick(lower) * scale + shift).tolist()
            columns[f"upper_{percent}{suffix}"] = (pick(upper) * scale + shift).tolist()
            columns[f"epistemic_sd{suffix}"] = (np.sqrt(pick(prediction.epistemic_variance)) * scale).tolist()
            columns[f"aleatoric_sd{suffix}"] = (np.sqrt(pick(prediction.aleatoric_variance)) * scale).tolist()
            if sets is not None:
                columns[f"conformal_lower{suffix}"] = (pick(sets[0]) * scale + shift).tolist()
                columns[f"conformal_upper{suffix}"] = (pick(sets[1]) * scale + shift).tolist()
        if y is not None and sets is not None:
            inside = (y >= sets[0] * scale + shift) & (y <= sets[1] * scale + shift)
            inside = inside.all(axis=1) if inside.ndim == 2 else inside
            summary.append(f"  conformal intervals (target coverage {target}): coverage {inside.mean():.3f}, mean width "
                           f"{np.mean((sets[1] - sets[0]) * scale):.4g}")
        if y is not None:
            log_density = prediction.log_prob((y - shift) / scale) - (outputs or 1) * np.log(scale)
            columns["log_predictive"] = log_density.tolist()
            inside = (y >= lower * scale + shift) & (y <= upper * scale + shift)
            summary.append(
                f"  nll {-log_density.mean():.4f} (per row, in the target's units), "
                f"rmse {np.sqrt(np.mean(np.square(prediction.mean * scale + shift - y))):.4g}, "
                f"coverage of the {level:.0%} intervals {inside.mean():.3f}"
            )
        return columns, summary
    labels = prep["classes"] or [str(c) for c in range(prediction.probs.shape[1])]
    for c, label in enumerate(labels):
        columns[f"p_{label}"] = prediction.probs[:, c].tolist()
    columns["predicted"] = [labels[i] for i in np.argmax(prediction.probs, axis=1)]
    columns["entropy"] = prediction.entropy.tolist()
    if prediction.aleatoric is not None:
        columns["aleatoric"] = prediction.aleatoric.tolist()
        columns["epistemic"] = prediction.epistemic.tolist()
    if sets is not None:
        columns["conformal_set"] = ["|".join(label for label, inside in zip(labels, row) if inside) for row in sets]
        if y is not None:
            covered = sets[np.arange(len(y)), y.astype(int)]
            summary.append(f"  conformal sets (target coverage {target}): coverage {covered.mean():.3f}, mean size "
                           f"{sets.sum(axis=1).mean():.3g}, empty {np.mean(sets.sum(axis=1) == 0):.3f}")
    if y is not None:
        log_density = prediction.log_prob(y)
        columns["log_predictive"] = log_density.tolist()
        accuracy = float(np.mean(np.argmax(prediction.probs, axis=1) == y.astype(int)))
        summary.append(f"  nll {-log_density.mean():.4f} per row, accuracy {accuracy:.4f}")
    return columns, summary
