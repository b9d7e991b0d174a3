"""Offline datasets: scikit-learn's bundled files and seeded synthetic sets.

``load(name, seed=...)`` returns a :class:`Dataset` with standardised inputs (training-split
statistics) and a seeded train/test split. Nothing is downloaded. The nine UCI regression sets
(``boston``, ``concrete``, ...: :data:`UCI_FOLDERS`) are read from a local copy with their canonical
splits: ``load("concrete", split=3, root=FOLDER)`` or the ``PPL_DATA_DIR`` environment variable. ``load_file(path, target=...)``
reads a CSV or .npz file (a CSV with more than two columns needs ``target``; see its docstring).
The Dataset keeps the scaling it applied (``input_mean``/``input_std``, ``target_mean``/``target_std``)
and, for text class labels, the labels in class order (``classes``).

>>> import ppl
>>> data = ppl.datasets.load("breast_cancer", seed=0)
>>> data.train.X.shape[1], data.task
(30, 'classification')
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ppl.core.data import Split, check_finite, validate_supervised
from ppl.core.errors import DataError, did_you_mean

__all__ = ["Dataset", "Split", "load", "load_file", "read_rows", "names", "DESCRIPTIONS", "rotate_images", "UCI_FOLDERS",
           "DATA_DIR_VARIABLE"]

DESCRIPTIONS = {
    "breast_cancer": "Wisconsin breast cancer, 569 × 30, binary (scikit-learn)",
    "digits": "8×8 handwritten digits, 1797 × 64, 10 classes (scikit-learn)",
    "rotated_digits": (
        "the 8×8 digits 0–7, 1443 × 64, 8 classes (scikit-learn); ood: the digits 8 and 9; shifts: the test "
        "images rotated by 0, 15, …, 180 degrees"
    ),
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
        target_mean, target_std: how a standardised regression target was scaled (else 0, 1):
            the model sees ``(y - target_mean) / target_std``.
        input_mean, input_std: how the inputs were standardised, per column, with training-split
            statistics (zeros and ones where the inputs are used as they are): the model sees
            ``(X_raw - input_mean) / input_std``. Apply the same to new raw rows before ``predict``.
            None only for a Dataset built by hand.
        target: the name of the target column of a CSV file (None for named datasets and .npz files).
        features: the names of the input columns, in the order of X's columns (CSV files and
            scikit-learn's sets; else None).
        classes: the class labels, as text, in class order, when a file's target held text labels
            (class ``i`` is ``classes[i]``); None when labels are numbers (class ``i`` is label ``i``).
        shifts: shifted test sets, ``((intensity, Split), ...)`` in increasing intensity, standardised
            like ``test`` (the first is usually the unshifted test set itself); None for datasets without.
        shift_name: what the intensity measures, e.g. "rotation (degrees)"; None without ``shifts``.
        split: which canonical split of a UCI set this is (None for other sets); ``label`` names
            the set with it ("concrete split 3").
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
    input_mean: np.ndarray | None = None
    input_std: np.ndarray | None = None
    target: str | None = None
    features: list[str] | None = None
    classes: list[str] | None = None
    shifts: tuple[tuple[float, Split], ...] | None = None
    shift_name: str | None = None
    split: int | None = None

    @property
    def label(self) -> str:
        """The dataset's name, with its split when it has one: ``"concrete split 3"``."""
        return self.name if self.split is None else f"{self.name} split {self.split}"

    def in_target_units(self, metrics: dict) -> dict:
        """Regression metrics of ``ppl.evaluate`` on this Dataset converted from the standardised target
        the model saw to the target's own units.

        With y_std = (y − target_mean) / target_std, a density transforms as
        log p(y) = log p(y_std) − log target_std, so ``nll`` gains ``log(target_std)``; ``rmse`` is
        multiplied by ``target_std``; coverage does not change. Other keys are copied as they are.

        >>> data = load("diabetes")  # doctest: +SKIP
        >>> data.in_target_units(ppl.evaluate(post, data.test, seed=1))["rmse"]  # doctest: +SKIP
        """
        if self.task != "regression":
            raise DataError(
                f"in_target_units converts regression metrics; {self.label} is a {self.task} dataset, whose "
                "metrics have no target units"
            )
        converted = dict(metrics)
        if converted.get("nll") is not None:
            converted["nll"] = float(converted["nll"]) + float(np.log(self.target_std))
        if converted.get("rmse") is not None:
            converted["rmse"] = float(converted["rmse"]) * float(self.target_std)
        return converted


def names() -> list[str]:
    return list(DESCRIPTIONS)


def _split(X, y, seed: int, test_fraction: float):
    rng = np.random.default_rng(seed)
    order = rng.permutation(X.shape[0])
    n_test = max(1, int(round(test_fraction * X.shape[0])))
    return order[n_test:], order[:n_test]


def _standardise(train: np.ndarray, *others, where: str = "the data", labels: list[str] | None = None):
    """``(mean, std, [train, *others] standardised)`` with the training split's statistics.

    A column whose mean or sd overflows 64-bit floats is refused, named by ``labels`` (one phrase
    per input column, e.g. "column 'age'"; else "input column j", counted from 0) and ``where``.
    """
    # An overflowing column is refused below, by name; numpy's own warning would only say "overflow".
    with np.errstate(over="ignore", invalid="ignore"):
        mean, std = train.mean(axis=0), train.std(axis=0)
        # A constant column is centred, not divided by zero — nor by its std's rounding error (naval's
        # constant 0.998 column has a computed std of 2e-13, which turned it into ±1 noise). Compared
        # with its first row rather than by np.ptp, whose max − min itself overflows at ±1e308.
        constant = np.all(train == train[:1], axis=0)
        mean, std = np.where(constant, train[0], mean), np.where(constant | ~(std > 0), 1.0, std)
        scaled = [(a - mean) / std if a is not None else None for a in (train, *others)]
    bad = ~(np.isfinite(mean) & np.isfinite(std))
    for a in scaled:
        if a is not None:
            bad |= ~np.isfinite(a).all(axis=0)
    if bad.any():
        j = int(np.flatnonzero(bad)[0])
        name = labels[j] if labels is not None else f"input column {j} (counted from 0)"
        largest = max(float(np.max(np.abs(a[:, j]))) for a in (train, *others) if a is not None)
        more = f" ({int(bad.sum()) - 1} more columns too)" if bad.sum() > 1 else ""
        raise DataError(
            f"{where}: {name} cannot be standardised{more}: its values reach {largest:.3g} in size, so its mean or "
            "standard deviation overflows 64-bit floats (which end near 1.8e308) and the column would become "
            "inf or zeros; rescale it (divide it by a power of ten, or take logs) or drop it before fitting"
        )
    return mean, std, scaled


def _check_target_scale(y: np.ndarray, where: str, name: str) -> None:
    """Refuse a regression target whose mean or sd overflows 64-bit floats: a model of it would see inf."""
    with np.errstate(over="ignore", invalid="ignore"):
        finite = np.isfinite(y.mean(axis=0)).all() and np.isfinite(y.std(axis=0)).all()
    if not finite:
        raise DataError(
            f"{where}: {name} reaches {float(np.max(np.abs(y))):.3g} in size, so its mean or standard deviation "
            "overflows 64-bit floats (which end near 1.8e308); rescale it (divide it by a power of ten, or take "
            "logs) before fitting"
        )


def _unscaled(X: np.ndarray):
    """The statistics recorded for inputs used as they are."""
    return np.zeros(X.shape[1]), np.ones(X.shape[1])


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
        return bunch.data.astype(float), bunch.target, task, {"features": [str(f) for f in bunch.feature_names]}
    if name == "digits_binary":
        from sklearn.datasets import load_digits

        bunch = load_digits()  # same rows and order as "digits", so the seeded splits agree
        features = [str(f) for f in bunch.feature_names]
        return (bunch.data > 8.0).astype(float), bunch.target, "unsupervised", {"keep_inputs": True, "features": features}
    rng = np.random.default_rng(seed)
    if name == "two_moons":
        X, y = _moons(500, 0.1, seed)
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
    raise DataError(f"unknown dataset {name!r}{did_you_mean(name, DESCRIPTIONS)}; available: {', '.join(DESCRIPTIONS)}")


def _moons(count: int, noise: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Two interleaved half circles, the points of scikit-learn's ``make_moons(count, noise=noise,
    random_state=seed)`` exactly (a test pins them), without importing scikit-learn (a second of a
    first MAP fit's five): the upper arc (class 0) and the lower arc shifted right (class 1), rows
    shuffled and Gaussian noise added from one legacy ``RandomState`` stream, in that order."""
    upper, lower = count // 2, count - count // 2
    a, b = np.linspace(0.0, np.pi, upper), np.linspace(0.0, np.pi, lower)
    X = np.stack([np.append(np.cos(a), 1.0 - np.cos(b)), np.append(np.sin(a), 1.0 - np.sin(b) - 0.5)], axis=1)
    y = np.append(np.zeros(upper, dtype=np.intp), np.ones(lower, dtype=np.intp))
    stream = np.random.RandomState(seed)
    order = np.arange(count)
    stream.shuffle(order)
    X, y = X[order], y[order]
    return X + stream.normal(scale=noise, size=X.shape), y


class _AnyTargets:
    """Stand-in model for validating a file's inputs before the task is known."""

    def check_targets(self, y):
        return y


def _check_seed(seed) -> None:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise DataError(f"seed must be a non-negative integer, got {seed!r}")


def load(name: str, *, seed: int = 0, test_fraction: float = 0.2, split: int | None = None, root=None,
         images: bool = False) -> Dataset:
    """Load dataset ``name`` with standardised inputs and a seeded train/test split.

    The UCI regression sets (:data:`UCI_FOLDERS`) come with their canonical splits instead: ``split``
    (default 0) picks one, ``seed`` and ``test_fraction`` do not apply, and the data are read from
    ``root`` (or the ``PPL_DATA_DIR`` environment variable), the folder that holds the sets' folders.

    ``images=True`` (``digits`` only) gives the inputs as images (N, 8, 8, 1), for convolutional
    networks; the rows, split and per-pixel standardisation are those of the flat (N, 64) inputs.
    """
    _check_seed(seed)
    if images is not False and (images is not True or name != "digits"):
        raise DataError(f"images=True applies to the 'digits' dataset only (got name={name!r}, images={images!r})")
    if name in UCI_FOLDERS:
        if test_fraction != 0.2:
            raise DataError(
                f"test_fraction={test_fraction!r}: the UCI set {name!r} comes with canonical train/test splits; "
                "choose one with split=K instead"
            )
        return _load_uci(name, 0 if split is None else split, root)
    if split is not None or root is not None:
        given = ", ".join(f"{option}={value!r}" for option, value in (("split", split), ("root", root)) if value is not None)
        raise DataError(
            f"{given}: only the UCI sets ({', '.join(UCI_FOLDERS)}) have canonical splits and a data folder; "
            f"{name!r} is split by seed= and test_fraction="
        )
    if not 0.0 < test_fraction < 1.0:
        raise DataError(f"test_fraction must lie in (0, 1), got {test_fraction!r}")
    if name == "rotated_digits":
        return _rotated_digits(seed, test_fraction)
    X, y, task, extras = _raw(name, seed)
    train_idx, test_idx = _split(X, y, seed, test_fraction)
    ood = extras.get("ood")
    if extras.get("keep_inputs"):
        # The known truth refers to the generating inputs; they are already standard normal.
        X_train, X_test = X[train_idx], X[test_idx]
        input_mean, input_std = _unscaled(X)
    else:
        input_mean, input_std, (X_train, X_test, ood) = _standardise(X[train_idx], X[test_idx], ood)
    y_train, y_test = y[train_idx], y[test_idx]
    target_mean, target_std = 0.0, 1.0
    if name == "diabetes":
        target_mean, target_std = float(y_train.mean()), float(y_train.std())
        y_train, y_test = (y_train - target_mean) / target_std, (y_test - target_mean) / target_std
    num_classes = int(np.max(y)) + 1 if task == "classification" else None
    if task in ("classification", "unsupervised"):
        y_train, y_test = y_train.astype(np.int32), y_test.astype(np.int32)
    if images:  # row-major 8 × 8 pixels, one channel
        X_train, X_test = X_train.reshape(-1, 8, 8, 1), X_test.reshape(-1, 8, 8, 1)
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
        input_mean=input_mean,
        input_std=input_std,
        features=extras.get("features"),
    )


# -- rotated digits: a covariate-shift benchmark --------------------------------------------------------

ROTATED_DIGITS_KEPT = 8  # digits 0..7 are the classes; 8 and 9 are held out as out-of-distribution
ROTATED_DIGITS_ANGLES = tuple(float(a) for a in range(0, 181, 15))


def rotate_images(images, degrees: float) -> np.ndarray:
    """Rotate square images (..., H, W) counter-clockwise (as displayed, row 0 at the top) by
    ``degrees`` about their centre, with bilinear interpolation and zero outside the image.

    Each output pixel takes the bilinear interpolation of the input at its preimage under the
    rotation. Multiples of 90 degrees use exact cosines and sines, so they permute the pixels
    exactly (90 degrees is ``np.rot90`` on the last two axes).
    """
    images = np.asarray(images, dtype=float)
    if images.ndim < 2 or images.shape[-1] != images.shape[-2]:
        raise ValueError(f"rotate_images: expected square images (..., H, H), got shape {images.shape}")
    size = images.shape[-1]
    quarter = float(degrees) / 90.0
    if quarter == round(quarter):  # exact: cos and sin of a multiple of 90 degrees are 0 or ±1
        cos, sin = [(1.0, 0.0), (0.0, 1.0), (-1.0, 0.0), (0.0, -1.0)][int(round(quarter)) % 4]
    else:
        cos, sin = np.cos(np.deg2rad(degrees)), np.sin(np.deg2rad(degrees))
    centre = (size - 1) / 2.0
    rows, cols = np.meshgrid(np.arange(size, dtype=float), np.arange(size, dtype=float), indexing="ij")
    x, y = cols - centre, centre - rows  # y points up, so a positive angle turns counter-clockwise on screen
    # the preimage of (x, y) under a rotation by θ is its rotation by −θ
    source_col = cos * x + sin * y + centre
    source_row = centre - (-sin * x + cos * y)
    r0, c0 = np.floor(source_row).astype(int), np.floor(source_col).astype(int)
    fr, fc = source_row - r0, source_col - c0
    padded = np.zeros(images.shape[:-2] + (size + 2, size + 2))  # a zero border: outside the image is 0
    padded[..., 1:-1, 1:-1] = images

    def pixel(r, c):
        inside = (r >= -1) & (r <= size) & (c >= -1) & (c <= size)
        return np.where(inside, padded[..., np.clip(r + 1, 0, size + 1), np.clip(c + 1, 0, size + 1)], 0.0)

    return (
        (1 - fr) * (1 - fc) * pixel(r0, c0) + (1 - fr) * fc * pixel(r0, c0 + 1)
        + fr * (1 - fc) * pixel(r0 + 1, c0) + fr * fc * pixel(r0 + 1, c0 + 1)
    )


def _rotated_digits(seed: int, test_fraction: float) -> Dataset:
    """The digits 0–7 split as ``digits`` splits its rows; ood: every 8 and 9; shifts: the test
    images rotated by each of ``ROTATED_DIGITS_ANGLES``.

    Inputs are standardised with one mean and one sd over all training pixels (recorded per column
    in ``input_mean``/``input_std``, all equal), not per pixel: rotation moves ink onto border
    pixels that are nearly blank in training, and per-pixel scaling would blow those up by their
    tiny training sd. One scale for every pixel also commutes with rotation.
    """
    from sklearn.datasets import load_digits

    bunch = load_digits()
    X, y = bunch.data.astype(float), bunch.target
    kept = y < ROTATED_DIGITS_KEPT
    X_in, y_in = X[kept], y[kept]
    train_idx, test_idx = _split(X_in, y_in, seed, test_fraction)
    X_train = X_in[train_idx]
    mean, std = float(X_train.mean()), float(X_train.std())
    scale = lambda a: (a - mean) / std  # noqa: E731
    side = int(round(np.sqrt(X.shape[1])))
    test_images = X_in[test_idx].reshape(-1, side, side)
    y_test = y_in[test_idx].astype(np.int32)
    shifts = tuple(
        (angle, Split(scale(rotate_images(test_images, angle).reshape(test_images.shape[0], -1)), y_test))
        for angle in ROTATED_DIGITS_ANGLES
    )
    return Dataset(
        name="rotated_digits",
        task="classification",
        train=Split(scale(X_train), y_in[train_idx].astype(np.int32)),
        test=Split(scale(X_in[test_idx]), y_test),
        num_classes=ROTATED_DIGITS_KEPT,
        ood=Split(scale(X[~kept]), None),
        input_mean=np.full(X.shape[1], mean),
        input_std=np.full(X.shape[1], std),
        features=[str(f) for f in bunch.feature_names],
        shifts=shifts,
        shift_name="rotation (degrees)",
    )


# -- UCI regression sets ---------------------------------------------------------------------------

DATA_DIR_VARIABLE = "PPL_DATA_DIR"
# User names of the nine standard UCI regression sets -> their folders in the common layout
# (Hernández-Lobato & Adams 2015): data.txt, index_features.txt, index_target.txt,
# index_train_K.txt, index_test_K.txt, n_splits.txt.
UCI_FOLDERS = {
    "boston": "bostonHousing",
    "concrete": "concrete",
    "energy": "energy",
    "kin8nm": "kin8nm",
    "naval": "naval-propulsion-plant",
    "power": "power-plant",
    "protein": "protein-tertiary-structure",
    "wine_quality": "wine-quality-red",
    "yacht": "yacht",
}
DESCRIPTIONS.update({
    "boston": "UCI Boston housing, 506 × 13, regression, 20 canonical splits (local copy: root= or PPL_DATA_DIR)",
    "concrete": "UCI concrete strength, 1030 × 8, regression, 20 canonical splits (local copy)",
    "energy": "UCI energy efficiency (heating load), 768 × 8, regression, 20 canonical splits (local copy)",
    "kin8nm": "UCI kin8nm robot arm, 8192 × 8, regression, 20 canonical splits (local copy)",
    "naval": "UCI naval propulsion (compressor decay), 11934 × 16, regression, 20 canonical splits (local copy)",
    "power": "UCI combined-cycle power plant, 9568 × 4, regression, 20 canonical splits (local copy)",
    "protein": "UCI protein tertiary structure, 45730 × 9, regression, 5 canonical splits (local copy)",
    "wine_quality": "UCI red wine quality, 1599 × 11, regression, 20 canonical splits (local copy)",
    "yacht": "UCI yacht hydrodynamics, 308 × 6, regression, 20 canonical splits (local copy)",
})
_UCI_HOW = (
    f"pass root=FOLDER (the folder holding {', '.join(UCI_FOLDERS.values())}) or set the {DATA_DIR_VARIABLE} "
    "environment variable to it; ppl never downloads data"
)


def _uci_folder(name: str, root) -> Path:
    """The set's folder under ``root`` or ``$PPL_DATA_DIR``, or an error saying how to supply it."""
    if root is None:
        env = os.environ.get(DATA_DIR_VARIABLE)
        if not env:
            raise DataError(f"the UCI set {name!r} is read from a local copy, and none was given: {_UCI_HOW}")
        root, where = Path(env), f"{DATA_DIR_VARIABLE}={env}"
    else:
        root, where = Path(root), f"root={str(root)!r}"
    folder = root / UCI_FOLDERS[name]
    if not folder.is_dir():
        raise DataError(f"the UCI set {name!r} needs the folder {folder} (from {where}), which does not exist; {_UCI_HOW}")
    return folder


def _uci_ints(path: Path, what: str) -> np.ndarray:
    if not path.is_file():
        raise DataError(f"{path} ({what}) does not exist; the UCI folder is incomplete — {_UCI_HOW}")
    try:
        values = np.loadtxt(path, ndmin=1)
    except ValueError as error:
        raise DataError(f"{path} ({what}) is not a list of integers, one a line ({error})") from None
    if values.size == 0 or np.any(values != np.round(values)) or np.any(values < 0):
        raise DataError(f"{path} ({what}) must hold non-negative integers, one a line")
    return values.astype(np.int64)


def _load_uci(name: str, split, root) -> Dataset:
    """One canonical split of a UCI set, inputs and target standardised with the training rows' statistics."""
    folder = _uci_folder(name, root)
    (num_splits,) = _uci_ints(folder / "n_splits.txt", "the number of splits")[:1]
    if isinstance(split, bool) or not isinstance(split, (int, np.integer)) or not 0 <= split < num_splits:
        raise DataError(f"split={split!r} for the UCI set {name!r}: valid splits are 0 to {num_splits - 1} ({folder})")
    data_path = folder / "data.txt"
    if not data_path.is_file():
        raise DataError(f"{data_path} (the data rows) does not exist; the UCI folder is incomplete — {_UCI_HOW}")
    try:
        rows = np.loadtxt(data_path, ndmin=2)
    except ValueError as error:
        raise DataError(f"{data_path} is not whitespace-separated numbers ({error})") from None
    features = _uci_ints(folder / "index_features.txt", "the input columns")
    (target,) = _uci_ints(folder / "index_target.txt", "the target column")[:1]
    train = _uci_ints(folder / f"index_train_{split}.txt", f"the training rows of split {split}")
    test = _uci_ints(folder / f"index_test_{split}.txt", f"the test rows of split {split}")
    for what, index, size in (("input column", features, rows.shape[1]), ("target column", np.array([target]), rows.shape[1]),
                              (f"training row of split {split}", train, rows.shape[0]),
                              (f"test row of split {split}", test, rows.shape[0])):
        if np.any(index >= size):
            raise DataError(f"{folder}: a {what} index, {int(index.max())}, is beyond the data's {size} (counted from 0)")
    check_finite(f"{data_path}", rows[:, np.append(features, target)])
    X, y = rows[:, features], rows[:, target]
    labels = [f"column {int(j)} of data.txt (counted from 0)" for j in features]
    input_mean, input_std, (X_train, X_test) = _standardise(X[train], X[test], where=str(data_path), labels=labels)
    _check_target_scale(y[train], str(data_path), f"the target (column {int(target)} of data.txt, counted from 0)")
    target_mean, target_std = float(y[train].mean()), float(y[train].std())
    if not target_std > 0:
        raise DataError(f"{folder}: the target is constant over the training rows of split {split}; nothing to regress")
    return Dataset(
        name=name, task="regression",
        train=Split(X_train, (y[train] - target_mean) / target_std),
        test=Split(X_test, (y[test] - target_mean) / target_std),
        target_mean=target_mean, target_std=target_std, input_mean=input_mean, input_std=input_std, split=int(split),
    )


# -- files ------------------------------------------------------------------------------------------

# Cells read as missing (compared lower-cased, after stripping spaces), as spreadsheets and pandas write them.
_MISSING = frozenset({"", "na", "n/a", "nan", "-nan", "+nan", "null", "none", "#n/a", "<na>"})
_ROWS = "rows are counted as in a spreadsheet: the header is row 1, the first data row is row 2"
_TASKS = ("classification", "regression", "unsupervised")


def _shown(text: str, limit: int = 40) -> str:
    """A cell's text for a message: escaped (so control characters cannot reach the terminal), truncated."""
    if text == "":
        return "an empty cell"
    return repr(text[:limit]) + ("…" if len(text) > limit else "")


def _count(n: int) -> str:
    return f"{n} value" + ("" if n == 1 else "s")


def _listing(header: list[str], limit: int = 20) -> str:
    names = ", ".join(_shown(name) for name in header[:limit])
    return names + (f", … ({len(header) - limit} more)" if len(header) > limit else "")


def _parse_column(cells: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """``(values, text)``: the cells as floats (NaN where missing or text) and where they hold text."""
    try:
        return np.array(cells, dtype=float), np.zeros(len(cells), dtype=bool)
    except ValueError:  # some cell is not a number: missing markers, or text
        pass
    values, text = np.full(len(cells), np.nan), np.zeros(len(cells), dtype=bool)
    for i, cell in enumerate(cells):
        if cell.lower() in _MISSING:
            continue
        try:
            values[i] = float(cell)
        except ValueError:
            text[i] = True
    return values, text


def _read_csv(path: Path, target: str | None, task: str | None):
    """``(X, y, target, features, classes)`` from a CSV file with a header row, every problem named."""
    try:
        with path.open(newline="", encoding="utf-8-sig") as handle:  # -sig: Excel's byte-order mark
            reader = csv.reader(handle)
            try:
                records = list(reader)
            except csv.Error as error:
                raise DataError(f"{path} is not a readable CSV file (row {reader.line_num}: {error})") from None
    except UnicodeDecodeError as error:
        raise DataError(
            f"{path} is not UTF-8 text (byte {error.start} cannot be decoded); save it as UTF-8 CSV"
        ) from None
    if not records or not any(cell.strip() for cell in records[0]):
        raise DataError(f"{path}: the first row must be a header naming the columns; it is empty")
    header = [cell.strip() for cell in records[0]]
    for j, name in enumerate(header):
        if name in header[:j]:
            raise DataError(
                f"{path}: the header names column {_shown(name)} twice (columns {header.index(name) + 1} and "
                f"{j + 1}); give every column its own name"
            )
    rows = [(number, record) for number, record in enumerate(records[1:], start=2) if record]  # blank lines skipped
    if not rows:
        raise DataError(f"{path} needs a header row and at least one data row")
    for number, record in rows:
        if len(record) != len(header):
            raise DataError(
                f"{path}: row {number} has {len(record)} values but the header names {len(header)} columns; "
                f"every row needs one value per column ({_ROWS})"
            )
    column = _target_column(path, header, target, task)
    numbers = [number for number, _ in rows]
    cells = [[record[j].strip() for _, record in rows] for j in range(len(header))]
    parsed = [_parse_column(column_cells) for column_cells in cells]
    inputs = [j for j in range(len(header)) if j != column]

    text_columns = []
    for j in inputs:
        text = parsed[j][1]
        if text.any():
            i = int(np.flatnonzero(text)[0])
            text_columns.append(
                f"column {_shown(header[j])} holds text: row {numbers[i]} is {_shown(cells[j][i])} "
                f"({int(text.sum())} of {len(rows)} values are not numbers)"
            )
    if text_columns:
        hint = "" if column is None or target is not None else (
            f"; if one of them is what you want to predict, name it as the target (target=NAME, --target NAME) "
            f"instead of {_shown(header[column])}"
        )
        raise DataError(
            f"{path}: input columns must be numbers — " + "; ".join(text_columns[:5])
            + (f"; and {len(text_columns) - 5} more columns" if len(text_columns) > 5 else "")
            + f" ({_ROWS}). Encode such a column as numbers (e.g. one 0/1 column per category) or drop it{hint}"
        )

    classes = None
    if column is not None:
        values, text = parsed[column]
        if text.any():
            i = int(np.flatnonzero(text)[0])
            if task == "regression":
                raise DataError(
                    f"{path}: the target column {_shown(header[column])} holds text (row {numbers[i]} is "
                    f"{_shown(cells[column][i])}), but task='regression' needs numbers ({_ROWS})"
                )
            # Text labels: the sorted distinct labels are the classes 0..C-1; missing cells stay NaN.
            labels = cells[column]
            present = [label.lower() not in _MISSING for label in labels]
            classes = sorted({label for label, keep in zip(labels, present) if keep})
            index = {label: float(k) for k, label in enumerate(classes)}
            values = np.array([index[label] if keep else np.nan for label, keep in zip(labels, present)])
            parsed[column] = (values, np.zeros(len(labels), dtype=bool))

    missing = []
    for j in range(len(header)):
        bad = ~np.isfinite(parsed[j][0])
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            missing.append(
                f"column {_shown(header[j])}{' (the target)' if j == column else ''}: {_count(int(bad.sum()))}, "
                f"the first at row {numbers[i]} ({_shown(cells[j][i])})"
            )
    if missing:
        raise DataError(
            f"{path} has missing or non-finite values (empty cells, NaN or Inf) — " + "; ".join(missing)
            + f" ({_ROWS}). Drop or impute those rows before fitting"
        )
    X = np.stack([parsed[j][0] for j in inputs], axis=1)
    y = np.zeros(len(rows)) if column is None else parsed[column][0]
    return X, y, None if column is None else header[column], [header[j] for j in inputs], classes


def _target_column(path: Path, header: list[str], target: str | None, task: str | None) -> int | None:
    """The index of the target column: named, or the last of exactly two; None when unsupervised."""
    if task == "unsupervised":
        return None
    if target is not None:
        if target not in header:
            raise DataError(f"{path} has no column {_shown(target)}; its columns: {_listing(header)}")
        column = header.index(target)
    elif len(header) == 2:
        column = 1  # one input and one target: the last column is the target, and the CLI says so
    elif len(header) > 2:
        raise DataError(
            f"{path} has {len(header)} columns ({_listing(header)}): name the one to predict with target=NAME "
            f"(on the command line: --target NAME); with more than two columns ppl does not guess it"
        )
    else:
        column = 0
    if len(header) == 1:
        raise DataError(
            f"{path} has a single column ({_shown(header[0])}); a supervised model needs at least one input "
            f"column besides the target (or task='unsupervised' to model the column as data)"
        )
    return column


def _read_npz(path: Path, task: str | None):
    """``(X, y, classes)`` from a .npz file holding arrays X and y (X alone when unsupervised)."""
    try:
        with np.load(path) as npz:
            needed = ("X",) if task == "unsupervised" else ("X", "y")
            if any(name not in npz for name in needed):
                raise DataError(f"{path} must hold arrays named {needed}; it has {sorted(npz.files)}")
            X = np.asarray(npz["X"])
            y = np.zeros(X.shape[0] if X.ndim else 0) if task == "unsupervised" else np.asarray(npz["y"])
    except (ValueError, OSError) as error:  # object arrays (pickles are refused), corrupt files
        raise DataError(f"{path} is not a readable .npz of numeric arrays X and y ({error})") from None
    classes = None
    if y.dtype.kind in "US":  # text labels, as in a CSV file: sorted distinct labels are the classes
        if task == "regression":
            raise DataError(f"{path}: y holds text labels ({y.dtype}), but task='regression' needs numbers")
        labels = y.astype(str)
        classes = sorted(set(labels.ravel().tolist()))
        y = np.searchsorted(np.array(classes), labels).astype(float)
    if X.ndim == 2 and np.issubdtype(X.dtype, np.floating):
        bad_columns = np.flatnonzero(~np.isfinite(X).all(axis=0))
        if bad_columns.size:
            parts = []
            for j in bad_columns[:5]:
                bad = ~np.isfinite(X[:, j])
                parts.append(f"column {j}: {_count(int(bad.sum()))}, the first at row {int(np.flatnonzero(bad)[0])}")
            more = f"; and {bad_columns.size - 5} more columns" if bad_columns.size > 5 else ""
            raise DataError(
                f"{path}: X has non-finite values (NaN or Inf) — " + "; ".join(parts) + more
                + " (columns and rows counted from 0). Drop or impute those rows before fitting"
            )
    return X, y, classes


def load_file(path, *, target: str | None = None, seed: int = 0, test_fraction: float = 0.2, task: str | None = None) -> Dataset:
    """Load a ``.csv`` file (a header row naming the columns) or a ``.npz`` file (arrays ``X`` and ``y``).

    A CSV's target column: ``target`` names it. It may be left out only when the file has exactly
    two columns (the last is then the target, and ``Dataset.target`` records which); with more
    columns, leaving it out is an error that lists the columns. Every other column is an input and
    must hold numbers. A target column holding text is read as class labels: the sorted distinct
    labels become classes 0..C-1 and ``Dataset.classes`` keeps them in that order. Empty cells and
    NA/NaN/null markers are missing; missing or non-finite values, text in an input column, ragged
    rows and duplicate column names are refused, naming the column, the first row (counted as in a
    spreadsheet: the header is row 1) and the value found there.

    ``task``: None infers it (text labels, or at most 20 distinct integers, make a classification;
    other numbers a regression), and refuses integers guessed to be labels 0..K-1 that cannot be
    (a negative one, or more classes than distinct values, as 0, 100, …, 900 would make):
    ``"regression"`` or ``"classification"`` then says which is meant. ``"unsupervised"``: every
    column (or the array X) is data, there is no target and the inputs are not standardised.
    Otherwise the inputs are standardised with the training split's statistics (kept as
    ``input_mean``/``input_std``); the target is used as it is (``target_mean`` 0, ``target_std``
    1). An input column, or a regression target, whose mean or sd overflows 64-bit floats (values
    near 1e300) is refused by name: rescale it first.
    """
    _check_seed(seed)
    if not 0.0 < test_fraction < 1.0:
        raise DataError(f"test_fraction must lie in (0, 1), got {test_fraction!r}")
    if task is not None and task not in _TASKS:
        raise DataError(f"task must be one of {', '.join(map(repr, _TASKS))} or None (inferred), got {task!r}")
    path = Path(path)
    if not path.is_file():
        raise DataError(f"data file {path} does not exist")
    if task == "unsupervised" and target is not None:
        raise DataError(f"task='unsupervised' models every column of {path} as data; drop target={target!r}")
    target_name = features = classes = None
    if path.suffix == ".npz":
        if target is not None:
            raise DataError(f"target={target!r} names a CSV column, but {path} is a .npz file: its targets are the array y")
        X, y, classes = _read_npz(path, task)
    elif path.suffix == ".csv":
        X, y, target_name, features, classes = _read_csv(path, target, task)
    else:
        raise DataError(f"data file {path} must end in .csv or .npz")
    if X.ndim != 2 or X.shape[0] < 2:
        raise DataError(f"{path}: need at least 2 rows of 2-D inputs, got shape {X.shape}")
    # Validate before standardising: one NaN would otherwise turn a whole column into NaN.
    X, _ = validate_supervised(_AnyTargets(), (X, y), where=str(path))
    check_finite(f"{path} y", np.asarray(y))
    target_label = "the target y" if target_name is None else f"the target column {_shown(target_name)}"
    if classes is not None:
        task = "classification"
    elif task is None:
        integral = np.all(np.isfinite(y)) and np.all(np.mod(y, 1) == 0)
        task = "classification" if integral and len(np.unique(y)) <= 20 else "regression"
        if task == "classification":
            _check_guessed_labels(y, str(path), target_label)
    if task == "regression":
        _check_target_scale(y, str(path), target_label)
    train_idx, test_idx = _split(X, y, seed, test_fraction)
    if task == "unsupervised":  # the model sees the data as they are (a Bernoulli VAE needs [0, 1])
        X_train, X_test = X[train_idx], X[test_idx]
        input_mean, input_std = _unscaled(X)
    else:
        labels = ([f"column {_shown(name)}" for name in features] if features is not None
                  else [f"X column {j} (counted from 0)" for j in range(X.shape[1])])
        input_mean, input_std, (X_train, X_test) = _standardise(X[train_idx], X[test_idx], where=str(path), labels=labels)
    num_classes = None
    if task == "classification":
        num_classes = len(classes) if classes is not None else int(np.nanmax(y)) + 1
        y = y.astype(np.int32) if np.all(np.mod(y, 1) == 0) else y  # non-integer labels: the model names them
    return Dataset(
        path.stem, task, Split(X_train, y[train_idx]), Split(X_test, y[test_idx]), num_classes,
        input_mean=input_mean, input_std=input_std, target=target_name, features=features, classes=classes,
    )


def _check_guessed_labels(y: np.ndarray, where: str, name: str) -> None:
    """Refuse integer targets guessed to be class labels 0..K-1 that cannot be: a negative one, or
    more classes than distinct values (0, 100, …, 900 would make a 901-class model of 10 values)."""
    values = np.unique(y)
    shown = ", ".join(f"{v:g}" for v in values[:6]) + (", …" if len(values) > 6 else "")
    guessed = f"{name} holds {len(values)} distinct integers ({shown}), so ppl guessed a classification, but "
    regression = "if it is a number to predict, pass task='regression' (on the command line: --task regression)"
    if values[0] < 0:
        raise DataError(
            f"{where}: {guessed}class labels count from 0 and {values[0]:g} is negative; {regression}; if these are "
            "classes, recode them as 0..K-1"
        )
    num_classes = float(values[-1]) + 1  # a float: labels near 1e300 are integers too
    if num_classes > len(values):
        raise DataError(
            f"{where}: {guessed}as labels 0..K-1 they would make {num_classes:.6g} classes, {num_classes - len(values):.6g} "
            f"of them absent; {regression}; if these are classes and some are absent, pass task='classification' "
            "(--task classification), or recode them as 0..K-1"
        )


def read_rows(path, *, num_features: int, features: list[str] | None = None, target: str | None = None,
              classes: list[str] | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Raw rows of a ``.csv`` or ``.npz`` file to predict: ``(X, y or None)``, nothing standardised.

    A CSV's inputs are taken by name when ``features`` (the training columns, in order) is given,
    else every column but ``target`` in file order; other columns are ignored. ``y`` is read when
    the file has the ``target`` column (text labels map through the training ``classes``; a label
    training never saw is an error). A ``.npz`` file holds ``X`` (and optionally ``y``).
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"data file {path} does not exist")
    if path.suffix == ".npz":
        X, _, _ = _read_npz(path, "unsupervised")
        try:
            with np.load(path) as npz:
                y = np.asarray(npz["y"]) if "y" in npz.files else None
        except (ValueError, OSError) as error:
            raise DataError(f"{path} is not a readable .npz of numeric arrays ({error})") from None
        if X.ndim != 2 or X.shape[1] != num_features:
            raise DataError(f"{path}: X has shape {list(X.shape)}; the run was fitted on {num_features} input columns")
        return X.astype(float), _labels(path, y, classes)
    if path.suffix != ".csv":
        raise DataError(f"{path}: expected a .csv or .npz file")
    try:
        with path.open(newline="", encoding="utf-8-sig") as handle:
            header = [cell.strip() for cell in next(csv.reader(handle), [])]
    except (UnicodeDecodeError, csv.Error):
        header = []  # _read_csv below names the problem
    has_target = target is not None and target in header
    task = "unsupervised" if not has_target else ("classification" if classes else None)
    X, y, _, names, new_classes = _read_csv(path, target if has_target else None, task)
    if features is not None:
        missing = [name for name in features if name not in names]
        if missing:
            raise DataError(
                f"{path} lacks the input column(s) {_listing(missing)} the run was fitted on; its columns: {_listing(names)}"
            )
        X = X[:, [names.index(name) for name in features]]
    elif X.shape[1] != num_features:
        raise DataError(
            f"{path} has {X.shape[1]} input column(s) ({_listing(names)}); the run was fitted on {num_features}"
        )
    if not has_target:
        return X, None
    if new_classes is not None:  # text labels: back to text, then to the training classes' indices
        y = np.array([new_classes[int(i)] for i in y], dtype=object)
    return X, _labels(path, y, classes)


def _labels(path, y, classes):
    """Targets as the run's numbers: text labels mapped through the training ``classes``."""
    if y is None:
        return None
    y = np.asarray(y)
    if classes is None:
        if y.dtype.kind not in "biuf":
            raise DataError(f"{path}: the targets are text but the run was fitted on numeric labels")
        return y.astype(float)
    index = {label: k for k, label in enumerate(classes)}
    unknown = sorted({str(v) for v in y.ravel().tolist()} - set(index))
    if unknown:
        raise DataError(f"{path}: label(s) {_listing(unknown)} were not among the training classes {_listing(classes)}")
    return np.array([index[str(v)] for v in y.ravel().tolist()], dtype=float)
