"""A saved run applied to new rows (``ppl predict``, ``ppl calibrate``): the run, the preparation
its training rows had, and raw rows prepared the same way."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ppl import datasets
from ppl.cli._arguments import UsageError
from ppl.cli._common import split_or_none
from ppl.core.errors import RunError, did_you_mean
from ppl.io import load


def _preparation(data: dict, num_features: int, where: Path) -> dict:
    """The saved preparation of the training rows, checked (it is read from disk)."""
    def numbers(value, length):
        return (isinstance(value, list) and len(value) == length
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value))

    def names(value, length=None):
        return value is None or (isinstance(value, list) and all(isinstance(v, str) for v in value)
                                 and (length is None or len(value) == length))

    prep = {"mean": None, "std": None, "target_mean": 0.0, "target_std": 1.0,
            "features": data.get("features"), "target": data.get("target"), "classes": data.get("classes")}
    if "input_mean" in data or "input_std" in data:
        if not (numbers(data.get("input_mean"), num_features) and numbers(data.get("input_std"), num_features)
                and all(v > 0 for v in data["input_std"])):
            raise RunError(f"{where}/posterior.json: the saved input scaling is not {num_features} finite means and positive sds")
        prep["mean"], prep["std"] = data["input_mean"], data["input_std"]
    for key in ("target_mean", "target_std"):
        if key in data:
            if not numbers([data[key]], 1) or (key == "target_std" and data[key] <= 0):
                raise RunError(f"{where}/posterior.json: the saved {key} is not a finite (positive) number")
            prep[key] = float(data[key])
    if not (names(prep["features"], num_features) and names(prep["classes"])
            and (prep["target"] is None or isinstance(prep["target"], str))):
        raise RunError(f"{where}/posterior.json: the saved column names or class labels are malformed")
    return prep


def supervised_run(folder: Path, command: str, extra: str | None = None):
    """(posterior, the saved preparation of its training rows, the run's file ``extra`` or None) of a
    saved run of a supervised ppl model."""
    posterior, file = load.load_with(folder, extra)
    problem = posterior.problem
    if problem is None or not problem.is_declarative or problem.spec.kind == "unsupervised":
        raise UsageError(f"ppl {command} needs a supervised model from ppl.models; {folder} holds a {posterior.method} run "
                         "of another kind (for a NumPyro program use numpyro.infer.Predictive with its draws)")
    num_features = int(problem.data_X.shape[1])
    return posterior, _preparation(posterior.provenance.get("data") or {}, num_features, folder), file


def raw_rows(data: str, posterior, prep: dict, command: str):
    """(X prepared as the training rows were, y in raw units or None, a description) of ``--data``:
    a .csv/.npz file of raw rows, or (ppl predict only) a dataset name for its test split."""
    num_features = int(posterior.problem.data_X.shape[1])
    if Path(data).suffix in (".csv", ".npz"):
        raw, y = datasets.read_rows(data, num_features=num_features, features=prep["features"],
                                    target=prep["target"], classes=prep["classes"])
        described = f"{data}: {len(raw)} rows"
    elif data in datasets.names() and command == "calibrate":
        raise UsageError(f"--data {data}: a dataset name stands for its test split, which must stay unseen to score "
                         "the calibrated run; give held-out labelled rows as a .csv or .npz file instead")
    elif data in datasets.names():
        seed = posterior.seed if isinstance(posterior.seed, int) else 0
        if data in datasets.UCI_FOLDERS:
            saved = posterior.provenance.get("data") or {}
            split = saved.get("split") if saved.get("source") == data and split_or_none(saved.get("split")) else None
            ds = datasets.load(data, split=split or 0)
            picked = f"split {split or 0}"
        else:
            ds = datasets.load(data, seed=seed)
            picked = f"seed {seed}"
        if ds.input_mean is None or ds.test.X.shape[1] != num_features:
            raise UsageError(f"--data {data}: its rows have {ds.test.X.shape[1]} columns; the run was fitted on {num_features}")
        raw = np.asarray(ds.test.X) * np.asarray(ds.input_std) + np.asarray(ds.input_mean)
        y = np.asarray(ds.test.y, dtype=float)
        if ds.task == "regression":
            y = y * ds.target_std + ds.target_mean
        described = f"the test split of {data} ({picked}): {len(raw)} rows"
    else:
        raise UsageError(f"--data {data!r} is neither a dataset ({', '.join(datasets.names())}) nor a .csv/.npz "
                         f"file{did_you_mean(data, datasets.names())}")
    if prep["mean"] is None:
        X = raw
        described += "; the run records no input scaling (fitted through the API), so rows are used as they are"
    else:
        X = (raw - np.asarray(prep["mean"])) / np.asarray(prep["std"])
    return X, y, described
