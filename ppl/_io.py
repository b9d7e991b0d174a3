"""Saving and loading runs: ``Posterior.save(path)`` and ``ppl.load(path)``.

A run directory holds ``posterior.json`` (method, options, seed, scalars of ``info``, the model's
configuration, temperature) and ``arrays.npz`` (flat unconstrained draws, the training data, the
fitted approximation, array-valued ``info``). Each file is written to a temporary name in the
same directory and renamed into place, so a reader never sees a half-written file.
"""

from __future__ import annotations

import importlib
import json
import os
import tempfile
from pathlib import Path

import numpy as np

__all__ = ["save_posterior", "load", "write_atomic"]

FORMAT_VERSION = 1


def write_atomic(path: Path, write) -> None:
    """Call ``write(file_object)`` on a temp file beside ``path``, then rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _model_record(model) -> dict:
    if hasattr(model, "to_config"):
        return {"kind": "declarative", **model.to_config()}
    module, name = getattr(model, "__module__", None), getattr(model, "__qualname__", None)
    return {"kind": "function", "module": module, "qualname": name}


def _jsonable(value):
    if isinstance(value, (np.generic,)):
        return value.item()
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(v, (str, int, float, bool)) or v is None for v in value):
        return list(value)
    return None


def save_posterior(posterior, path) -> None:
    path = Path(path)
    problem = posterior.problem
    scalars, arrays = {}, {"flat_draws": np.asarray(posterior.flat_draws)}
    for key, value in posterior.info.items():
        if isinstance(value, (np.ndarray,)) or hasattr(value, "__array__") and not np.isscalar(value):
            arrays[f"info/{key}"] = np.asarray(value)
        else:
            scalars[key] = _jsonable(value)
    if problem.is_declarative:
        arrays["data/X"], arrays["data/y"] = (np.asarray(a) for a in problem.data)
    else:
        for key, value in problem.data.items():
            arrays[f"data/{key}"] = np.asarray(value)
    family = posterior.approximation
    if family is not None:
        for key, value in family.arrays().items():
            arrays[f"approximation/{key}"] = np.asarray(value)
    meta = {
        "format_version": FORMAT_VERSION,
        "method": posterior.method,
        "options": {k: _jsonable(v) for k, v in posterior.options.items()},
        "seed": posterior.seed,
        "wall_time_s": posterior.wall_time_s,
        "info": scalars,
        "model": _model_record(problem.model),
        "static_kwargs": [[k, _jsonable(v), isinstance(v, tuple)] for k, v in problem.spec.static_kwargs],
        "temperature": float(problem.temperature),
        "tempering": problem.tempering,
        "approximation": None if family is None else family.kind,
    }
    write_atomic(path / "arrays.npz", lambda f: np.savez(f, **arrays))
    write_atomic(path / "posterior.json", lambda f: f.write(json.dumps(meta, indent=2).encode()))


def _load_model(record: dict):
    if record["kind"] == "declarative":
        from ppl.models import from_config

        return from_config(record)
    try:
        obj = importlib.import_module(record["module"])
        for part in record["qualname"].split("."):
            obj = getattr(obj, part)
        return obj
    except (ImportError, AttributeError, TypeError) as error:
        raise ValueError(
            f"this run was fitted with the NumPyro function {record['module']}.{record['qualname']}, which cannot "
            f"be imported now ({error}); make it importable to load the run"
        ) from None


def load(path):
    """Load a run written by ``Posterior.save``; the result predicts and diagnoses like the original."""
    from ppl._posterior import Posterior
    from ppl._problem import compile_problem

    path = Path(path)
    meta_file = path / "posterior.json"
    if not meta_file.is_file():
        raise FileNotFoundError(f"{path} is not a saved ppl run (no posterior.json); save one with post.save(path)")
    meta = json.loads(meta_file.read_text())
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{path}: run format {meta.get('format_version')} is not {FORMAT_VERSION}")
    with np.load(path / "arrays.npz") as npz:
        arrays = {key: npz[key] for key in npz.files}
    model = _load_model(meta["model"])
    if meta["model"]["kind"] == "declarative":
        data = (arrays["data/X"], arrays["data/y"])
    else:
        data = {k[len("data/"):]: v for k, v in arrays.items() if k.startswith("data/")}
        data.update({k: tuple(v) if was_tuple else v for k, v, was_tuple in meta["static_kwargs"]})
    problem = compile_problem(model, data, temperature=meta["temperature"], tempering=meta["tempering"])
    family = None
    if meta["approximation"] is not None:
        from ppl.inference._gaussian import from_arrays

        family = from_arrays(
            meta["approximation"],
            {k[len("approximation/"):]: v for k, v in arrays.items() if k.startswith("approximation/")},
        )
    info = dict(meta["info"])
    info.update({k[len("info/"):]: v for k, v in arrays.items() if k.startswith("info/")})
    return Posterior(
        method=meta["method"],
        problem=problem,
        flat_draws=arrays["flat_draws"],
        info=info,
        options=meta["options"],
        seed=meta["seed"],
        approximation=family,
        wall_time_s=meta["wall_time_s"],
    )
