"""K-fold cross-validation: the expected log predictive density of held-out points, for when
PSIS-LOO is unreliable (most points of a BNN classifier have Pareto k > 0.7)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import jax
import numpy as np

from ppl._fit import fit
from ppl.core.data import validate_supervised
from ppl.core.errors import OptionError
from ppl.core.keys import as_key

__all__ = ["kfold", "KFold"]


@dataclass(frozen=True)
class KFold:
    """The result of :func:`ppl.kfold`.

    ``elpd`` = Σᵢ log p(yᵢ | xᵢ, D₋fold(i)), the sum over every point of its log predictive density
    under the posterior fitted without its fold; ``se`` its standard error, √(N · var(pointwise))
    (as for PSIS-LOO); ``pointwise`` (N,) and ``fold`` (N,), the fold each point was held out in.
    ``fits_ok`` says, per fold, whether that fit's own diagnostics were ok: an elpd from fits that
    failed them is not to be trusted either.
    """

    elpd: float
    se: float
    pointwise: np.ndarray = field(repr=False)
    fold: np.ndarray = field(repr=False)
    k: int = 0
    method: str = ""
    fits_ok: tuple = ()
    wall_time_s: float = 0.0

    def __str__(self) -> str:
        failed = [i for i, ok in enumerate(self.fits_ok) if not ok]
        line = f"elpd_kfold {self.elpd:.2f} ± {self.se:.2f} ({self.k}-fold, {self.method}, {len(self.pointwise)} points)"
        if failed:
            line += f"; the fits of fold(s) {', '.join(map(str, failed))} failed their diagnostics"
        return line


def kfold(model, data, method: str = "nuts", *, k: int = 10, seed, mode: str = "mc",
          num_samples: int | None = None, progress_bar: bool | None = None, **options) -> KFold:
    """K-fold cross-validated elpd of ``model`` fitted by ``method`` on ``data = (X, y)``.

    The rows are shuffled with ``seed`` and dealt into ``k`` folds of near-equal size; fold f is
    fitted with the key ``fold_in(seed, f)`` on the other folds' rows, and each held-out point
    scores log p(yᵢ | xᵢ, D₋f) from ``posterior.predict(mode=mode, num_samples=num_samples)``
    (``mode="linearized"`` is exact for a Gaussian posterior of a model linear in its weights, such
    as ``LinearRegression`` fitted by ``exact``). ``k`` = N is exact leave-one-out.

    >>> import ppl
    >>> from ppl.models import LinearRegression
    >>> data = ppl.datasets.load("linear", seed=0)
    >>> cv = ppl.kfold(LinearRegression(noise_scale=0.5), data.train, method="exact", k=5, seed=0)
    >>> cv.se > 0
    True
    """
    if not hasattr(model, "to_config"):
        raise OptionError(
            "ppl.kfold needs a declarative model from ppl.models (it predicts held-out rows from (X, y)); for a "
            "plain NumPyro program, split its data yourself and score the held-out rows with numpyro.infer.Predictive"
        )
    X, y = validate_supervised(model, data, where="ppl.kfold data")
    if y is None:
        raise OptionError("ppl.kfold needs targets: pass data=(X, y)")
    n = X.shape[0]
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 2 <= k <= n:
        raise OptionError(f"ppl.kfold: k must be an integer in 2..{n} (the number of rows), got {k!r}")
    key = as_key(seed)
    order = np.asarray(jax.random.permutation(jax.random.fold_in(key, 2**31 - 1), n))
    fold = np.empty(n, dtype=np.int64)
    fold[order] = np.arange(n) % k
    pointwise = np.empty(n)
    fits_ok = []
    start = time.perf_counter()
    for f in range(int(k)):
        held = fold == f
        post = fit(model, (X[~held], y[~held]), method=method, seed=jax.random.fold_in(key, f),
                   progress_bar=progress_bar, **options)
        if post.status.interrupted:
            raise KeyboardInterrupt(f"ppl.kfold interrupted during fold {f} of {k}")
        fits_ok.append(bool(post.diagnostics().ok))
        prediction = post.predict(X[held], seed=jax.random.fold_in(key, k + f), num_samples=num_samples, mode=mode)
        pointwise[held] = prediction.log_prob(y[held])
    with np.errstate(over="ignore", invalid="ignore"):
        elpd = float(pointwise.sum())
        se = float(math.sqrt(n * pointwise.var()))
    return KFold(elpd, se, pointwise, fold, int(k), method, tuple(fits_ok), time.perf_counter() - start)
