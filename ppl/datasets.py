"""Offline datasets: scikit-learn's bundled files and seeded synthetic sets.

``load(name, seed=...)`` returns a :class:`Dataset` with standardised inputs (training-split
statistics) and a seeded train/test split. Nothing is downloaded.

>>> import ppl
>>> data = ppl.datasets.load("breast_cancer", seed=0)
>>> data.train.X.shape[1], data.task
(30, 'classification')
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ppl._data import Split, check_finite, validate_supervised
from ppl._errors import DataError

__all__ = ["Dataset", "Split", "load", "load_file", "names", "DESCRIPTIONS"]

DESCRIPTIONS = {
    "breast_cancer": "Wisconsin breast cancer, 569 × 30, binary (scikit-learn)",
    "digits": "8×8 handwritten digits, 1797 × 64, 10 classes (scikit-learn)",
    "digits_binary": "the 8×8 digits binarised (pixel > 8 of 16), 1797 × 64, for VAEs; y holds the digit (scikit-learn)",
    "iris": "iris flowers, 150 × 4, 3 classes (scikit-learn)",
    "wine": "wine cultivars, 178 × 13, 3 classes (scikit-learn)",
    "diabetes": "diabetes progression, 442 × 10, regression, standardised target (scikit-learn)",
    "two_moons": "two interleaving half circles, 500 × 2, binary (synthetic); ood: far-away points",
    "sinusoid": "1-D regression y = sin(3x) + noise with a gap in the inputs, 200 × 1 (synthetic); ood: the gap",
    "linear": "conjugate linear regression with known truth and correlated inputs, 100 × 3 (synthetic)",
}


@dataclass
class Dataset:
    """A dataset split for fitting and testing.

    Attributes:
        name, task ("classification", "regression" or "unsupervised": X is the data, y only
            labels it), num_classes (None unless classification).
        train, test: :class:`Split` ``(X, y)``; ood: inputs-only split away from the data, or None.
        truth: the generating parameters for synthetic sets with known truth.
        target_mean, target_std: how a standardised regression target was scaled (else 0, 1).
    """

    name: str
    task: str
    train: Split
    test: Split
    num_classes: int | None = None
    ood: Split | None = None
    truth: dict = field(default_factory=dict)
    target_mean: float = 0.0
    target_std: float = 1.0


def names() -> list[str]:
    return list(DESCRIPTIONS)


def _split(X, y, seed: int, test_fraction: float):
    rng = np.random.default_rng(seed)
    order = rng.permutation(X.shape[0])
    n_test = max(1, int(round(test_fraction * X.shape[0])))
    return order[n_test:], order[:n_test]


def _standardise(train: np.ndarray, *others):
    mean, std = train.mean(axis=0), train.std(axis=0)
    std = np.where(std > 0, std, 1.0)
    return [(a - mean) / std if a is not None else None for a in (train, *others)]


def _raw(name: str, seed: int):
    """(X, y, task, extras) before splitting."""
    if name in ("breast_cancer", "digits", "iris", "wine", "diabetes"):
        from sklearn import datasets as sk

        loader = {
            "breast_cancer": sk.load_breast_cancer,
            "digits": sk.load_digits,
            "iris": sk.load_iris,
            "wine": sk.load_wine,
            "diabetes": sk.load_diabetes,
        }[name]
        bunch = loader()
        task = "regression" if name == "diabetes" else "classification"
        return bunch.data.astype(float), bunch.target, task, {}
    if name == "digits_binary":
        from sklearn.datasets import load_digits

        bunch = load_digits()  # same rows and order as "digits", so the seeded splits agree
        return (bunch.data > 8.0).astype(float), bunch.target, "unsupervised", {"keep_inputs": True}
    rng = np.random.default_rng(seed)
    if name == "two_moons":
        from sklearn.datasets import make_moons

        X, y = make_moons(n_samples=500, noise=0.1, random_state=seed)
        angle = rng.uniform(0, 2 * np.pi, 100)
        ood = np.stack([np.cos(angle), np.sin(angle)], axis=1) * 6.0 + np.array([0.5, 0.25])
        return X, y, "classification", {"ood": ood}
    if name == "sinusoid":
        x = np.concatenate([rng.uniform(-3.0, -1.0, 100), rng.uniform(1.0, 3.0, 100)])
        y = np.sin(3.0 * x) + 0.1 * rng.standard_normal(x.shape[0])
        return x[:, None], y, "regression", {"ood": np.linspace(-1.0, 1.0, 50)[:, None], "raw_inputs": True}
    if name == "linear":
        dim, correlation, noise = 3, 0.9, 0.5
        cov = np.full((dim, dim), correlation) + (1 - correlation) * np.eye(dim)
        X = rng.multivariate_normal(np.zeros(dim), cov, size=100)
        w, b = rng.standard_normal(dim), float(rng.standard_normal())
        y = X @ w + b + noise * rng.standard_normal(X.shape[0])
        return X, y, "regression", {"truth": {"w": w, "b": b, "noise_scale": noise}, "keep_inputs": True}
    raise DataError(f"unknown dataset {name!r}; available: {', '.join(DESCRIPTIONS)}")


class _AnyTargets:
    """Stand-in model for validating a file's inputs before the task is known."""

    def check_targets(self, y):
        return y


def _check_seed(seed) -> None:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise DataError(f"seed must be a non-negative integer, got {seed!r}")


def load(name: str, *, seed: int = 0, test_fraction: float = 0.2) -> Dataset:
    """Load dataset ``name`` with standardised inputs and a seeded train/test split."""
    _check_seed(seed)
    if not 0.0 < test_fraction < 1.0:
        raise DataError(f"test_fraction must lie in (0, 1), got {test_fraction!r}")
    X, y, task, extras = _raw(name, seed)
    train_idx, test_idx = _split(X, y, seed, test_fraction)
    ood = extras.get("ood")
    if extras.get("keep_inputs"):
        # The known truth refers to the generating inputs; they are already standard normal.
        X_train, X_test = X[train_idx], X[test_idx]
    else:
        X_train, X_test, ood = _standardise(X[train_idx], X[test_idx], ood)
    y_train, y_test = y[train_idx], y[test_idx]
    target_mean, target_std = 0.0, 1.0
    if name == "diabetes":
        target_mean, target_std = float(y_train.mean()), float(y_train.std())
        y_train, y_test = (y_train - target_mean) / target_std, (y_test - target_mean) / target_std
    num_classes = int(np.max(y)) + 1 if task == "classification" else None
    if task in ("classification", "unsupervised"):
        y_train, y_test = y_train.astype(np.int32), y_test.astype(np.int32)
    return Dataset(
        name=name,
        task=task,
        train=Split(X_train, y_train),
        test=Split(X_test, y_test),
        num_classes=num_classes,
        ood=None if ood is None else Split(ood, None),
        truth=extras.get("truth", {}),
        target_mean=target_mean,
        target_std=target_std,
    )


def load_file(path, *, target: str | None = None, seed: int = 0, test_fraction: float = 0.2, task: str | None = None) -> Dataset:
    """Load a ``.csv`` (header row; ``target`` column, default the last) or ``.npz`` (arrays X, y) file.

    ``task="unsupervised"``: every column (or the array X) is data, no target, inputs not standardised.
    """
    _check_seed(seed)
    path = Path(path)
    if not path.is_file():
        raise DataError(f"data file {path} does not exist")
    if path.suffix == ".npz":
        try:
            with np.load(path) as npz:
                needed = ("X",) if task == "unsupervised" else ("X", "y")
                if any(name not in npz for name in needed):
                    raise DataError(f"{path} must hold arrays named {needed}; it has {sorted(npz.files)}")
                X = np.asarray(npz["X"])
                y = np.zeros(X.shape[0]) if task == "unsupervised" else np.asarray(npz["y"])
        except (ValueError, OSError) as error:  # object arrays (pickles are refused), corrupt files
            raise DataError(f"{path} is not a readable .npz of numeric arrays X and y ({error})") from None
    elif path.suffix == ".csv":
        with path.open(newline="") as handle:
            rows = list(csv.reader(handle))
        if len(rows) < 2:
            raise DataError(f"{path} needs a header row and at least one data row")
        header, body = rows[0], rows[1:]
        column = header.index(target) if target in header else None
        if target is not None and column is None:
            raise DataError(f"{path} has no column {target!r}; columns: {', '.join(header)}")
        column = len(header) - 1 if column is None else column
        try:
            table = np.array([[float(v) if v.strip() else np.nan for v in row] for row in body])
        except ValueError as error:
            raise DataError(f"{path}: every value must be numeric ({error})") from None
        if table.ndim != 2 or table.shape[1] != len(header):
            raise DataError(f"{path}: rows have differing numbers of columns")
        if task == "unsupervised":  # every column is data; there is no target
            X, y = table, np.zeros(table.shape[0])
        else:
            X, y = np.delete(table, column, axis=1), table[:, column]
    else:
        raise DataError(f"data file {path} must end in .csv or .npz")
    if X.ndim != 2 or X.shape[0] < 2:
        raise DataError(f"{path}: need at least 2 rows of 2-D inputs, got shape {X.shape}")
    # Validate before standardising: one NaN would otherwise turn a whole column into NaN.
    X, _ = validate_supervised(_AnyTargets(), (X, y), where=str(path))
    check_finite(f"{path} y", np.asarray(y))
    if task is None:
        integral = np.all(np.isfinite(y)) and np.all(np.mod(y, 1) == 0)
        task = "classification" if integral and len(np.unique(y)) <= 20 else "regression"
    train_idx, test_idx = _split(X, y, seed, test_fraction)
    if task == "unsupervised":  # the model sees the data as they are (a Bernoulli VAE needs [0, 1])
        X_train, X_test = X[train_idx], X[test_idx]
    else:
        X_train, X_test = _standardise(X[train_idx], X[test_idx])
    num_classes = int(np.nanmax(y)) + 1 if task == "classification" else None
    return Dataset(path.stem, task, Split(X_train, y[train_idx]), Split(X_test, y[test_idx]), num_classes)
