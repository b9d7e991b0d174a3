"""ppl — probabilistic-programming inference for neural-network weight posteriors.

Declare a model once, switch the inference method with one argument, read the same diagnostics:

>>> import ppl
>>> from ppl.models import LinearRegression
>>> data = ppl.datasets.load("linear", seed=0)
>>> post = ppl.fit(LinearRegression(noise_scale=0.5), data.train, method="exact", seed=0)
>>> metrics = ppl.evaluate(post, data.test, seed=1)
"""

from __future__ import annotations

from ppl import datasets
from ppl._cache import use_compilation_cache
from ppl._calibrate import Calibration, Conformal, calibrate, conformal, load_calibration
from ppl._checkpoint import Interrupted
from ppl._errors import DataError, MemoryBudgetError, NonFiniteError, OptionError, ResumeError, RunError
from ppl._compare import Comparison, ComparisonInterrupted, compare
from ppl._evaluate import evaluate
from ppl._fit import fit
from ppl._io import load
from ppl._kfold import KFold, kfold
from ppl._posterior import Posterior
from ppl._problem import Problem, compile_problem
from ppl._records import ChainStats, Evidence, RunStatus, TrainingTrace
from ppl._results import Diagnostics, Prediction

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
    "calibrate",
    "Calibration",
    "conformal",
    "Conformal",
    "load_calibration",
    "use_compilation_cache",
]
__version__ = "0.1.0"


def sbc(model_fn, method, num_simulations, seed, **options):
    """Simulation-based calibration of ``method`` on ``model_fn`` (see :func:`ppl.diagnostics.sbc.sbc`).

    Imported on first use, so ``import ppl`` stays fast.
    """
    from ppl.diagnostics.sbc import sbc as run_sbc

    return run_sbc(model_fn, method, num_simulations, seed, **options)
