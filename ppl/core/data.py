"""Host-side data validation: every check runs before anything is traced or compiled."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from ppl.core.errors import DataError

__all__ = ["Split", "validate_supervised", "validate_unsupervised", "validate_inputs", "validate_program_data", "check_batch_size", "check_finite"]


class Split(NamedTuple):
    """One split of a supervised dataset: inputs ``X`` (N, D) and targets ``y`` (N,) or (N, K)."""

    X: np.ndarray
    y: np.ndarray


def check_finite(name: str, array: np.ndarray) -> None:
    if np.issubdtype(array.dtype, np.complexfloating):
        raise DataError(f"{name} is complex ({array.dtype}); ppl's models take real numbers")
    if not np.issubdtype(array.dtype, np.number) and array.dtype != bool:
        raise DataError(f"{name} has dtype {array.dtype}; pass numeric arrays (convert strings/objects first)")
    if np.issubdtype(array.dtype, np.floating):
        bad = ~np.isfinite(array)
        if bad.any():
            first = np.unravel_index(int(np.flatnonzero(bad)[0]), array.shape)
            first = first[0] if len(first) == 1 else tuple(int(i) for i in first)
            raise DataError(
                f"{name} has {int(bad.sum())} non-finite values (NaN or Inf), the first at index "
                f"{first}; drop or impute those rows before fitting"
            )


def validate_supervised(model, data, *, where: str = "data"):
    """Check ``(X, y)`` for a supervised declarative model; return numpy arrays ``(X, y)``.

    ``y`` may be None for prediction-only inputs (then only X is checked).
    """
    if isinstance(data, dict):
        raise DataError(
            f"{where} is a dict, but {type(model).__name__} takes a tuple (X, y); dicts are for plain "
            "NumPyro model functions"
        )
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        raise DataError(
            f"{where} must be a tuple (X, y) for {type(model).__name__}, got {type(data).__name__}"
            + (f" of length {len(data)}" if isinstance(data, (tuple, list)) else "")
        )
    X, y = data
    X = _as_inputs(X, f"{where} X", getattr(model, "accepts_array_inputs", False))
    if y is None:
        return X, None
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:
        raise DataError(
            f"{where} y has shape {y.shape}; targets must be 1-D (N,) — pass y.ravel() (a (N, 1) column "
            "would silently broadcast against (N,) predictions)"
        )
    if y.ndim == 2 and y.shape[1] >= 2 and not _multi_output_capable(model):
        raise DataError(
            f"{where} y has shape {y.shape}: {y.shape[1]} targets per input, which {type(model).__name__} with "
            f"likelihood={getattr(model, 'likelihood', None)!r} cannot model — multi-output regression is "
            "BNN(likelihood='gaussian') (hidden=() for a linear model); otherwise pass 1-D targets (N,)"
        )
    if y.ndim not in (1, 2):
        raise DataError(f"{where} y must be 1-D with shape (N,) (or (N, K) for multi-output regression), got shape {y.shape}")
    if y.shape[0] != X.shape[0]:
        raise DataError(
            f"{where}: X has {X.shape[0]} rows but y has {y.shape[0]}; they must describe the same data points"
        )
    check_finite(f"{where} y", y)
    return X, model.check_targets(y)


def _multi_output_capable(model) -> bool:
    """Whether ``model`` takes K ≥ 2 real targets per input (a ``num_outputs`` field, Gaussian likelihood)."""
    return (
        dataclasses.is_dataclass(model)
        and "num_outputs" in {f.name for f in dataclasses.fields(model)}
        and getattr(model, "likelihood", None) == "gaussian"
    )


def _as_inputs(X, name: str, any_rank: bool = False) -> np.ndarray:
    """Inputs as a float array: (N, D) rows, or (N, ...) of any rank ≥ 2 when ``any_rank`` (a
    network the user brings, e.g. images (N, H, W, C))."""
    X = np.asarray(X)
    if any_rank and X.ndim >= 2:
        if X.shape[0] == 0:
            raise DataError(f"{name} is empty (0 rows); ppl needs at least one data point")
        if 0 in X.shape[1:]:
            raise DataError(f"{name} has shape {X.shape}; every axis after the first must be non-empty")
        check_finite(name, X)
        return X.astype(float)
    if X.ndim != 2:
        hint = " — reshape 1-D inputs with X[:, None]" if X.ndim == 1 else ""
        raise DataError(f"{name} must be 2-D with shape (N, D), got shape {X.shape}{hint}")
    if X.shape[0] == 0:
        raise DataError(f"{name} is empty (0 rows); ppl needs at least one data point")
    if X.shape[1] == 0:
        raise DataError(f"{name} has 0 columns; ppl needs at least one input feature")
    check_finite(name, X)
    return X.astype(float)


def validate_unsupervised(model, data, *, where: str = "data") -> np.ndarray:
    """Check the data array X (N, D) of an unsupervised model (a VAE); targets are refused."""
    if isinstance(data, (tuple, list)) and not isinstance(data, np.ndarray):
        if len(data) == 2 and data[1] is None:
            data = data[0]
        else:
            raise DataError(
                f"{where} for {type(model).__name__} is the data array X alone (it models X, not y given X); "
                f"got a {type(data).__name__} of length {len(data)} — pass X, without targets"
            )
    if isinstance(data, dict):
        raise DataError(f"{where} for {type(model).__name__} is the data array X (N, D), not a dict")
    X = _as_inputs(data, f"{where} X")
    return model.check_inputs(X)


def validate_inputs(X, name: str = "X", any_rank: bool = False) -> np.ndarray:
    """Check prediction inputs (N, D), or (N, ...) of any rank ≥ 2 when ``any_rank``."""
    return _as_inputs(X, name, any_rank)


def validate_program_data(data) -> tuple[dict, dict]:
    """Split a plain model's keyword arguments into array leaves (checked) and static values."""
    if data is None:
        return {}, {}
    if not isinstance(data, dict):
        raise DataError(
            f"data for a plain NumPyro model function must be a dict of keyword arguments, got "
            f"{type(data).__name__}"
        )
    arrays, static = {}, {}
    for key, value in data.items():
        if isinstance(value, np.generic):
            value = value.item()  # numpy scalars are numbers like any other
        if isinstance(value, (np.ndarray, list)) or hasattr(value, "__jax_array__") or type(value).__module__.startswith("jax"):
            try:
                array = np.asarray(value)
            except ValueError as error:
                raise DataError(f"data[{key!r}] is not a rectangular array ({error}); pass equal-length rows") from None
            if array.size == 0:
                raise DataError(f"data[{key!r}] is empty; ppl needs at least one data point")
            check_finite(f"data[{key!r}]", array)
            arrays[key] = array
        elif value is None or isinstance(value, (bool, int, float, str, tuple)):
            # Python numbers, strings and tuples stay static (shapes, counts, switches): the program
            # may use them as Python values. Changing one compiles the program anew.
            if isinstance(value, float) and not np.isfinite(value):
                raise DataError(f"data[{key!r}] = {value!r} is not finite")
            static[key] = value
        else:
            raise DataError(
                f"data[{key!r}] has type {type(value).__name__}; pass arrays, numbers, strings or None"
            )
    return arrays, static


def check_batch_size(batch_size, num_data: int | None) -> None:
    if batch_size is None:
        return
    if num_data is None:
        raise DataError(
            "batch_size needs a declarative model (ppl.models) whose data rows ppl can subsample; "
            "for a plain NumPyro model use full-batch training (batch_size=None)"
        )
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or not 1 <= batch_size <= num_data:
        raise DataError(f"batch_size must be an integer in 1..{num_data} (the number of data points), got {batch_size!r}")
