"""ppl — probabilistic-programming inference for neural-network weight posteriors.

Declare a model once, switch the inference method with one argument, read the same diagnostics:

>>> import ppl
>>> from ppl.models import LinearRegression
>>> data = ppl.datasets.load("linear", seed=0)
>>> post = ppl.fit(LinearRegression(noise_scale=0.5), data.train, method="exact", seed=0)
>>> metrics = ppl.evaluate(post, data.test, seed=1)
"""

from __future__ import annotations

import importlib

from ppl.core.errors import DataError, MemoryBudgetError, NonFiniteError, OptionError, ResumeError, RunError

# Everything else is imported on first use (``ppl.fit`` loads JAX, ``ppl.datasets`` only NumPy), so that
# ``import ppl`` and the command line's listing commands answer without loading JAX.
_LAZY = {
    "datasets": "ppl.datasets",
    "use_compilation_cache": "ppl.core.cache",
    "Calibration": "ppl._calibrate",
    "Conformal": "ppl._calibrate",
    "calibrate": "ppl._calibrate",
    "conformal": "ppl._calibrate",
    "load_calibration": "ppl._calibrate",
    "Interrupted": "ppl.core.checkpoint",
    "Comparison": "ppl._compare",
    "ComparisonInterrupted": "ppl._compare",
    "compare": "ppl._compare",
    "evaluate": "ppl._evaluate",
    "fit": "ppl._fit",
    "load": "ppl.io.load",
    "sbc": "ppl._sbc",
    "vae_report": "ppl._vae_report",
    "VAEReport": "ppl._vae_report",
    "KFold": "ppl._kfold",
    "kfold": "ppl._kfold",
    "Posterior": "ppl.core.posterior",
    "Problem": "ppl.core.problem",
    "compile_problem": "ppl.core.problem",
    "ChainStats": "ppl.core.records",
    "Evidence": "ppl.core.records",
    "RunStatus": "ppl.core.records",
    "TrainingTrace": "ppl.core.records",
    "Diagnostics": "ppl.core.results",
    "Prediction": "ppl.core.results",
}

__all__ = [
    "fit",
    "load",
    "evaluate",
    "compare",
    "Comparison",
    "ComparisonInterrupted",
    "kfold",
    "KFold",
    "Posterior",
    "Prediction",
    "Diagnostics",
    "RunStatus",
    "TrainingTrace",
    "ChainStats",
    "Evidence",
    "Problem",
    "compile_problem",
    "datasets",
    "DataError",
    "OptionError",
    "NonFiniteError",
    "MemoryBudgetError",
    "RunError",
    "ResumeError",
    "Interrupted",
    "sbc",
    "vae_report",
    "VAEReport",
    "calibrate",
    "Calibration",
    "conformal",
    "Conformal",
    "load_calibration",
    "use_compilation_cache",
]
__version__ = "0.1.0"


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ppl' has no attribute {name!r}")
    imported = importlib.import_module(module)
    value = imported if module == f"ppl.{name}" else getattr(imported, name)
    globals()[name] = value  # later look-ups find it directly
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
