"""Post-hoc calibration of a fitted posterior: temperature scaling (``ppl.calibrate``) and
split-conformal prediction sets and intervals (``ppl.conformal``).

Both are fitted on held-out data the posterior never saw (a validation or calibration split) and
leave the posterior itself untouched: they wrap its ``predict``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from fractions import Fraction

import jax
import numpy as np
from scipy.optimize import minimize_scalar
from scipy.special import log_softmax, logsumexp

from ppl.core.data import validate_inputs, validate_supervised
from ppl.core.errors import DataError, OptionError, RunError
from ppl.core.keys import as_key
from ppl.core.predict import classification_prediction, entropy_of, task_of
from ppl.core.results import Prediction
from ppl.diagnostics import classification_metrics
from ppl.io.load import load_with
from ppl.io.store import save_posterior

__all__ = [
    "calibrate", "Calibration", "conformal", "Conformal", "scale_temperature", "conformal_rank", "load_calibration",
    "CALIBRATION_FILE",
]

# Temperatures are searched on log T in [−log 100, log 100]. A validation optimum outside
# [0.01, 100] means the validation split cannot tell temperatures apart (every point classified
# right, or the classifier no better than uniform); the result then says so in its notes.
_LOG_T_BOUND = math.log(100.0)
# 81 grid points: a step of ln(100)/40 ≈ 0.115 in log T (T changes by 12% per step), with T = 1 on
# the grid. The grid guards against a local optimum: with several draws the NLL of the predictive
# mixture is not guaranteed to be unimodal in T, and bounded Brent alone assumes it is.
_NUM_GRID = 81
_CLASSIFICATION_SCORES = ("aps", "lac")
_REGRESSION_SCORES = ("residual",)


# scipy is imported inside the functions that use it, so `import ppl` stays fast.


# -- temperature scaling ---------------------------------------------------------------------------
def scale_temperature(prediction: Prediction, temperature: float) -> Prediction:
    """The classification ``prediction`` with every draw's logits divided by ``temperature``.

    log_softmax(log p_s / T) = log_softmax(f_s / T) for a draw's logits f_s, because log p_s and f_s
    differ by a constant per input (also for the two-column Bernoulli layout, whose columns are
    log σ(−f) and log σ(f), logits −f/2 and f/2 up to a shared constant). So the per-draw log
    probabilities suffice, and the predictive mean, entropy, aleatoric and epistemic parts are
    re-derived from the scaled draws. A closed-form predictive (``mode="probit"`` or ``"bridge"``)
    has no draws: its own log probabilities are scaled, log_softmax(log p / T), which is Guo et
    al.'s temperature scaling of that predictive; the aleatoric/epistemic split stays None.
    """
    if prediction.task != "classification":
        raise OptionError("scale_temperature needs a classification Prediction; a regression one has no class probabilities")
    temperature = float(temperature)
    if not (math.isfinite(temperature) and temperature > 0.0):
        raise OptionError(f"temperature must be a positive finite number, got {temperature!r}")
    if prediction.member_log_probs is not None:
        members = np.asarray(prediction.member_log_probs, dtype=np.float64)
        return classification_prediction(log_softmax(members / temperature, axis=-1))
    log_probs = prediction.log_probs if prediction.log_probs is not None else np.log(prediction.probs)
    log_probs = log_softmax(np.asarray(log_probs, dtype=np.float64) / temperature, axis=-1)
    probs = np.exp(log_probs)
    return Prediction(task="classification", probs=probs, log_probs=log_probs, entropy=entropy_of(probs, log_probs))


def _members(prediction: Prediction) -> np.ndarray:
    """(S, N, C) float64 per-draw log probabilities; a closed-form predictive counts as one draw."""
    if prediction.member_log_probs is not None:
        return np.asarray(prediction.member_log_probs, dtype=np.float64)
    log_probs = prediction.log_probs if prediction.log_probs is not None else np.log(prediction.probs)
    return np.asarray(log_probs, dtype=np.float64)[None]


def _scaled_nll(members: np.ndarray, labels: np.ndarray, log_temperature: float) -> float:
    """Mean −log (1/S) Σ_s softmax(log p_s / T)_y over the points, in log space."""
    scaled = log_softmax(members * math.exp(-log_temperature), axis=-1)
    picked = scaled[:, np.arange(labels.shape[0]), labels]  # (S, N)
    return float(-np.mean(logsumexp(picked, axis=0) - math.log(members.shape[0])))


def _fit_temperature(members: np.ndarray, labels: np.ndarray) -> tuple[float, float, float, bool]:
    """(T, NLL at T, NLL at T = 1, whether T sits at the search bound).

    A grid over log T finds the best bracket; bounded Brent refines inside it. T = 1 is on the grid
    and the result is the best point evaluated, so its validation NLL is never above T = 1's.
    """
    grid = np.linspace(-_LOG_T_BOUND, _LOG_T_BOUND, _NUM_GRID)
    values = np.array([_scaled_nll(members, labels, g) for g in grid])
    if not np.all(np.isfinite(values)):
        raise FloatingPointError(
            "the validation NLL is not finite for some temperatures; the posterior's predictions contain "
            "non-finite log probabilities — check the fit (post.diagnostics()) before calibrating"
        )
    best = int(np.argmin(values))
    log_t, nll = float(grid[best]), float(values[best])
    if 0 < best < _NUM_GRID - 1:
        refined = minimize_scalar(
            lambda g: _scaled_nll(members, labels, g),
            bounds=(float(grid[best - 1]), float(grid[best + 1])),
            method="bounded",
            options={"xatol": 1e-8},
        )
        if refined.fun < nll:
            log_t, nll = float(refined.x), float(refined.fun)
    at_one = _scaled_nll(members, labels, 0.0)
    if not nll < at_one:
        log_t, nll = 0.0, at_one
    at_bound = best in (0, _NUM_GRID - 1) and log_t != 0.0
    return math.exp(log_t), nll, at_one, at_bound


def supervised_task(posterior, what: str) -> str:
    problem = getattr(posterior, "problem", None)
    if problem is None or not hasattr(posterior, "predict"):
        raise TypeError(f"{what} takes a fitted ppl.Posterior (from ppl.fit or ppl.load), got {type(posterior).__name__}")
    if not problem.is_declarative or problem.spec.kind != "supervised":
        raise TypeError(
            f"{what} needs a supervised declarative model from ppl.models (BNN, LogisticRegression, "
            "LinearRegression): it predicts from (X, y)"
        )
    return task_of(problem)


def _labelled(posterior, data, where: str) -> tuple[np.ndarray, np.ndarray]:
    X, y = validate_supervised(posterior.problem.model, data, where=where)
    if y is None:
        raise DataError(f"{where} has no targets (y is None); pass (X, y) with the true labels or values")
    _check_features(posterior, X, where)
    return X, y


def _check_features(posterior, X: np.ndarray, where: str) -> None:
    expected = posterior.problem.data[0].shape[1]
    if X.shape[1] != expected:
        raise DataError(
            f"{where} X has {X.shape[1]} features but the posterior was fitted on {expected}; prepare it as the "
            "training inputs were (same columns, same standardisation)"
        )


def _check_seed_given(seed, what: str) -> None:
    if seed is None:
        raise OptionError(f"{what} needs seed= (an int or a JAX key) for its prediction draws; pass e.g. seed=0")


@dataclass(frozen=True)
class Calibration:
    """A posterior with one temperature T fitted on validation data (Guo et al. 2017).

    ``predict(X, seed=...)`` gives the posterior's predictive with every draw's logits divided by T.
    ``temperature`` (T > 1 softens an overconfident predictive, T < 1 sharpens an underconfident
    one), ``validation_nll`` and ``validation_nll_uncalibrated`` (mean per point, at T and at 1),
    ``num_validation``, and ``notes`` (empty unless something deserves a word).
    """

    posterior: object = field(repr=False)
    temperature: float
    validation_nll: float
    validation_nll_uncalibrated: float
    num_validation: int
    num_samples: int | None
    mode: str
    notes: tuple = ()

    def predict(self, X, *, seed, num_samples: int | None = None) -> Prediction:
        """Temperature-scaled posterior predictive at ``X`` (N, D); ``num_samples`` defaults to the
        number used when the temperature was fitted."""
        _check_seed_given(seed, "Calibration.predict")
        X = validate_inputs(X)
        _check_features(self.posterior, X, "X")
        prediction = self.posterior.predict(
            X, seed=seed, num_samples=self.num_samples if num_samples is None else num_samples, mode=self.mode
        )
        return scale_temperature(prediction, self.temperature)

    def evaluate(self, data, *, seed) -> dict:
        """Test metrics before and after scaling, from the same posterior draws:
        ``{"temperature": T, "uncalibrated": {...}, "calibrated": {...}}``, each with ``nll``,
        ``accuracy``, ``ece`` (15 equal-width bins) and ``brier`` (multi-class). Accuracy does not
        change: dividing logits by T > 0 keeps each draw's ranking (the mean over several draws
        can, rarely, reorder)."""
        _check_seed_given(seed, "Calibration.evaluate")
        X, y = _labelled(self.posterior, data, "test data")
        prediction = self.posterior.predict(X, seed=seed, num_samples=self.num_samples, mode=self.mode)
        return {
            "temperature": self.temperature,
            "uncalibrated": classification_metrics(prediction, y),
            "calibrated": classification_metrics(scale_temperature(prediction, self.temperature), y),
        }

    def __str__(self) -> str:
        direction = (
            "softens an overconfident predictive" if self.temperature > 1.0
            else "sharpens an underconfident predictive" if self.temperature < 1.0
            else "no temperature beat T = 1 on the validation data"
        )
        lines = [
            f"Temperature scaling — {_of_method(self.posterior)}mode={self.mode!r}",
            f"  temperature        {self.temperature:.4g}  ({direction})",
            f"  validation NLL     {self.validation_nll_uncalibrated:.4f} at T = 1 -> {self.validation_nll:.4f} "
            f"per point ({self.num_validation} points)",
        ]
        lines.extend(f"  note: {note}" for note in self.notes)
        return "\n".join(lines)

    def save(self, path) -> None:
        """Write the posterior's run to folder ``path`` with this temperature in it, as one unit
        (replacing a run there, as ``Posterior.save`` does); ``ppl.load_calibration(path)`` reads both
        back and ``ppl.load(path)`` the posterior alone."""
        _save(self, path)


def _of_method(posterior) -> str:
    method = getattr(posterior, "method", None)
    return f"{method} posterior, " if method else ""


def calibrate(posterior, val_data, *, seed, num_samples: int | None = None, mode: str = "mc") -> Calibration:
    """Fit one temperature T > 0 to a classifier's posterior predictive on validation data.

    Minimises the validation NLL −(1/N) Σ_i log (1/S) Σ_s softmax(f_s(x_i) / T)_{y_i} over log T
    (a grid on [1/100, 100] refined by bounded Brent, in float64); T = 1 is a candidate, so the
    validation NLL never gets worse. An optimum at a bound of the search is refused (T = 1 is kept,
    and ``notes`` says why): it means the split cannot tell temperatures apart, as when every
    validation point is classified right and the NLL falls without limit as T → 0. One scalar keeps the ranking of each draw's classes, so
    accuracy is (for one draw, exactly) unchanged (Guo et al. 2017, "On calibration of modern
    neural networks", ICML).

    Args:
        posterior: a fitted classification posterior (Bernoulli or categorical likelihood).
        val_data: ``(X, y)``, X (N, D), y (N,) labels; data the posterior was not fitted on.
        seed: int or JAX key for the prediction draws.
        num_samples, mode: passed to ``posterior.predict`` (here and in every later prediction).
            ``mode="probit"``/``"bridge"`` have no per-draw values: their closed-form log
            probabilities are scaled instead.

    Example::

        data = ppl.datasets.load("digits", seed=0)
        X, y = data.train
        post = ppl.fit(BNN(hidden=(32,), likelihood="categorical"), (X[:1000], y[:1000]), method="map", seed=0)
        cal = ppl.calibrate(post, (X[1000:], y[1000:]), seed=1)
        print(cal, cal.evaluate(data.test, seed=2))
    """
    _check_seed_given(seed, "ppl.calibrate")
    if supervised_task(posterior, "ppl.calibrate") != "classification":
        raise OptionError(
            f"ppl.calibrate fits a temperature to class probabilities, but this posterior's likelihood is "
            f"{posterior.problem.likelihood!r} (regression); for calibrated regression intervals use "
            "ppl.conformal(posterior, cal_data, alpha=..., seed=...)"
        )
    X, y = _labelled(posterior, val_data, "validation data")
    prediction = posterior.predict(X, seed=seed, num_samples=num_samples, mode=mode)
    temperature, nll, nll_at_one, at_bound = _fit_temperature(_members(prediction), np.asarray(y, dtype=np.int64))
    notes = []
    if at_bound:
        # An optimum at the bound is not a temperature the data chose: the NLL falls without limit as T
        # shrinks when every validation point is classified right (and as T grows when the predictions
        # carry no information). Applying it would make every future mistake near-certain — on one such
        # split T = 0.01 made the test NLL 35 times worse — so T = 1 is kept.
        notes.append(
            f"the validation NLL kept falling up to the search bound (T = {temperature:.3g}), so no temperature was "
            "applied (T = 1 kept): the validation split cannot pin the temperature down (every point classified "
            "right, or predictions no better than uniform) — use a larger or harder validation split"
        )
        temperature, nll = 1.0, nll_at_one
    return Calibration(
        posterior=posterior, temperature=temperature, validation_nll=nll, validation_nll_uncalibrated=nll_at_one,
        num_validation=int(X.shape[0]), num_samples=num_samples, mode=mode, notes=tuple(notes),
    )


# -- split conformal prediction --------------------------------------------------------------------
def conformal_rank(num_calibration: int, alpha: float) -> int:
    """k = ⌈(n + 1)(1 − α)⌉, the rank of the calibration score used as the threshold, in exact
    rational arithmetic on α as written (0.1 is 1/10, so (9 + 1)(1 − 0.1) is 9, not 9.000000000000002).
    Raises when k > n: too few calibration points for coverage 1 − α, naming the smallest n."""
    exact = Fraction(repr(float(alpha)))
    rank = math.ceil((num_calibration + 1) * (1 - exact))
    if rank > num_calibration:
        # (n + 1)(1 − α) ≤ n  ⟺  n ≥ (1 − α)/α
        minimum = math.ceil((1 - exact) / exact)
        raise DataError(
            f"split conformal at alpha={alpha} needs at least {minimum} calibration points (the threshold is the "
            f"⌈(n+1)(1−α)⌉-th smallest of n scores), got {num_calibration}; pass more calibration data or a "
            "larger alpha"
        )
    return rank


def _check_alpha(alpha) -> float:
    if isinstance(alpha, (bool, np.bool_)) or not isinstance(alpha, (int, float, np.integer, np.floating)):
        raise OptionError(f"alpha must be a number in (0, 1) (the miscoverage rate; 0.1 targets 90% coverage), got {alpha!r}")
    alpha = float(alpha)
    if not 0.0 < alpha < 1.0:
        raise OptionError(
            f"alpha={alpha!r} lies outside (0, 1); alpha is the miscoverage rate, so alpha=0.1 asks for sets that "
            "contain the truth 90% of the time"
        )
    return alpha


# Tags folded into the seed for APS's uniforms: calibration and test points must not share them
# (the coverage guarantee needs every point's U independent of every other point's), and neither may
# reuse the prediction draws' key.
_CALIBRATION_TAG, _TEST_TAG = 0x43414C, 0x544553


def _uniforms(seed, count: int, tag: int) -> np.ndarray:
    """``count`` uniforms on [0, 1) for APS's randomisation, from ``seed`` folded with ``tag``."""
    return np.asarray(jax.random.uniform(jax.random.fold_in(as_key(seed), tag), (count,)), dtype=np.float64)


def _aps_cumulative(probs: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """Randomised APS score of every class (N, C): the mass of the classes ranked above it plus U
    times its own probability (Romano, Sesia, Candès 2020), with one U per input."""
    order = np.argsort(-probs, axis=1, kind="stable")
    sorted_probs = np.take_along_axis(probs, order, axis=1)
    above = np.cumsum(sorted_probs, axis=1) - sorted_probs
    scores_sorted = above + uniforms[:, None] * sorted_probs
    scores = np.empty_like(scores_sorted)
    np.put_along_axis(scores, order, scores_sorted, axis=1)
    return scores


def _class_scores(probs: np.ndarray, score: str, uniforms: np.ndarray) -> np.ndarray:
    """Nonconformity of every class (N, C): larger means less plausible."""
    if score == "lac":
        return 1.0 - probs
    return _aps_cumulative(probs, uniforms)


def _regression_scale(prediction: Prediction, where: str) -> np.ndarray:
    sd = np.sqrt(np.asarray(prediction.variance, dtype=np.float64))
    if not np.all(np.isfinite(sd) & (sd > 0.0)):
        raise FloatingPointError(
            f"the predictive standard deviation at the {where} inputs is zero or not finite at "
            f"{int(np.sum(~(np.isfinite(sd) & (sd > 0.0))))} point(s); the residual score divides by it — check the fit"
        )
    return sd


@dataclass(frozen=True)
class Conformal:
    """Split-conformal prediction sets (classification) or intervals (regression) around a posterior.

    ``alpha`` (target coverage 1 − α), ``score`` (``"aps"``, ``"lac"`` or ``"residual"``),
    ``threshold`` (the ⌈(n+1)(1−α)⌉-th smallest calibration score), ``num_calibration`` (n),
    ``temperature`` (None, or T when built on a :class:`Calibration`'s scaled predictive).
    Over random calibration and test points, a set covers the truth with probability in
    [1 − α, 1 − α + 1/(n + 1)] (Vovk et al. 2005; Lei et al. 2018), whatever the model — as long
    as calibration and test points are exchangeable.
    """

    posterior: object = field(repr=False)
    task: str
    alpha: float
    score: str
    threshold: float
    num_calibration: int
    num_samples: int | None
    mode: str
    # set when the sets are built on a temperature-scaled predictive (ppl.conformal(calibration, ...))
    temperature: float | None = None

    def _predict(self, X, seed) -> Prediction:
        prediction = self.posterior.predict(X, seed=seed, num_samples=self.num_samples, mode=self.mode)
        return prediction if self.temperature is None else scale_temperature(prediction, self.temperature)

    def _sets_from(self, prediction: Prediction, seed):
        if self.task == "classification":
            uniforms = _uniforms(seed, prediction.probs.shape[0], _TEST_TAG)
            return _class_scores(np.asarray(prediction.probs, dtype=np.float64), self.score, uniforms) <= self.threshold
        half = self.threshold * _regression_scale(prediction, "prediction")
        return prediction.mean - half, prediction.mean + half

    def predict_sets(self, X, *, seed):
        """Classification: boolean membership (N, C), True where a class is in the set (a set can be
        empty where even the top class is implausible at this α). Regression: ``(lower, upper)``,
        each (N,) (or (N, K) for K outputs), the interval mean ± threshold · predictive sd."""
        _check_seed_given(seed, "Conformal.predict_sets")
        return self.predict_with_sets(X, seed=seed)[1]

    def predict_with_sets(self, X, *, seed) -> tuple:
        """``(prediction, sets)``: the predictive the sets are built on (temperature-scaled where
        the calibration has a temperature) and :meth:`predict_sets`'s sets, from one prediction."""
        _check_seed_given(seed, "Conformal.predict_with_sets")
        X = validate_inputs(X)
        _check_features(self.posterior, X, "X")
        prediction = self._predict(X, seed)
        return prediction, self._sets_from(prediction, seed)

    def coverage(self, data, *, seed) -> dict:
        """Empirical coverage on labelled test data ``(X, y)``: ``coverage`` (fraction of points whose
        set or interval holds the truth; with K outputs, all K), ``target`` (1 − α),
        ``mean_set_size`` and ``empty_sets`` (classification) or ``mean_width`` (regression),
        ``num_test`` and ``num_calibration``."""
        _check_seed_given(seed, "Conformal.coverage")
        X, y = _labelled(self.posterior, data, "test data")
        sets = self._sets_from(self._predict(X, seed), seed)
        result = {"coverage": None, "target": 1.0 - self.alpha}
        if self.task == "classification":
            sizes = sets.sum(axis=1)
            result.update(
                coverage=float(np.mean(sets[np.arange(y.shape[0]), y])),
                mean_set_size=float(np.mean(sizes)),
                empty_sets=float(np.mean(sizes == 0)),
            )
        else:
            lower, upper = sets
            inside = (y >= lower) & (y <= upper)
            if inside.ndim == 2:
                inside = inside.all(axis=1)
            result.update(coverage=float(np.mean(inside)), mean_width=float(np.mean(upper - lower)))
        result.update(num_test=int(X.shape[0]), num_calibration=self.num_calibration)
        return result

    def __str__(self) -> str:
        what = "prediction sets" if self.task == "classification" else "prediction intervals"
        scaled = "" if self.temperature is None else f" on the predictive at temperature {self.temperature:.4g}"
        return (
            f"Split conformal {what}{scaled} — score={self.score!r}, alpha={self.alpha:g} (target coverage "
            f"{1 - self.alpha:.3g}), threshold {self.threshold:.4g} from {self.num_calibration} calibration points"
        )

    def save(self, path) -> None:
        """Write the posterior's run to folder ``path`` with these sets' threshold in it, as one unit
        (replacing a run there, as ``Posterior.save`` does); ``ppl.load_calibration(path)`` reads both
        back and ``ppl.load(path)`` the posterior alone."""
        _save(self, path)


def conformal(
    posterior, cal_data, *, alpha: float = 0.1, seed, score: str | None = None, num_samples: int | None = None,
    mode: str | None = None,
) -> Conformal:
    """Split-conformal prediction sets or intervals calibrated on held-out data.

    Each calibration point gets a nonconformity score s(x, y); the threshold q̂ is the k-th smallest
    of the n scores, k = ⌈(n + 1)(1 − α)⌉, and a new input's set is every y with s(x, y) ≤ q̂.

    - ``score="aps"`` (classification default), adaptive prediction sets, *randomised*: classes are
      ranked by the posterior-predictive probability, and a class scores the mass ranked above it
      plus U times its own probability, U ~ Uniform(0, 1) per input (Romano, Sesia, Candès 2020).
      The randomisation makes coverage exact (not just at least 1 − α) and sets smaller; the same
      ``seed`` reproduces the same sets.
    - ``score="lac"``: 1 − p(y | x), least ambiguous sets (Sadinle, Lei, Wasserman 2019): the
      smallest sets on average, less adaptive to hard inputs.
    - ``score="residual"`` (regression, the only choice): |y − mean(x)| / sd(x) with the posterior
      predictive mean and total sd, so intervals mean ± q̂·sd widen where the posterior is unsure;
      with K outputs the largest of the K normalised residuals (joint coverage of all K).

    Args:
        posterior: a fitted supervised posterior, or a :class:`Calibration` from ``ppl.calibrate``
            (the sets are then built on the temperature-scaled predictive; fit the temperature on
            a split other than ``cal_data``, or the calibration points are no longer exchangeable
            with test points).
        cal_data: ``(X, y)`` calibration split, exchangeable with future test points and unused in fitting.
        alpha: miscoverage rate in (0, 1); the sets target coverage 1 − α.
        seed: int or JAX key for the prediction draws and APS's uniforms.
        num_samples, mode: passed to ``posterior.predict`` (here and in every later prediction);
            ``mode=None`` is ``"mc"``. A Calibration brings its own, so leave them unset there.

    Example::

        conf = ppl.conformal(post, (X_cal, y_cal), alpha=0.1, seed=1)
        sets = conf.predict_sets(X_new, seed=2)          # (N, C) booleans or (lower, upper)
        conf.coverage(data.test, seed=2)                 # {"coverage": ..., "target": 0.9, ...}
    """
    _check_seed_given(seed, "ppl.conformal")
    alpha = _check_alpha(alpha)
    temperature = None
    if isinstance(posterior, Calibration):
        if num_samples is not None or mode is not None:
            raise OptionError(
                f"ppl.conformal on a Calibration predicts as the calibration did (num_samples={posterior.num_samples}, "
                f"mode={posterior.mode!r}); leave num_samples and mode unset, or call ppl.calibrate with the ones you want"
            )
        posterior, temperature, num_samples, mode = (
            posterior.posterior, posterior.temperature, posterior.num_samples, posterior.mode,
        )
    mode = "mc" if mode is None else mode
    task = supervised_task(posterior, "ppl.conformal")
    allowed = _CLASSIFICATION_SCORES if task == "classification" else _REGRESSION_SCORES
    score = allowed[0] if score is None else score
    if score not in allowed:
        raise OptionError(
            f"score={score!r} does not apply to this {task} posterior (likelihood {posterior.problem.likelihood!r}); "
            f"choose one of {allowed}"
        )
    X, y = _labelled(posterior, cal_data, "calibration data")
    rank = conformal_rank(int(X.shape[0]), alpha)
    prediction = posterior.predict(X, seed=seed, num_samples=num_samples, mode=mode)
    if temperature is not None:
        prediction = scale_temperature(prediction, temperature)
    if task == "classification":
        class_scores = _class_scores(np.asarray(prediction.probs, dtype=np.float64), score, _uniforms(seed, X.shape[0], _CALIBRATION_TAG))
        scores = class_scores[np.arange(y.shape[0]), y]
    else:
        scores = np.abs(y - prediction.mean) / _regression_scale(prediction, "calibration")
        if scores.ndim == 2:
            scores = scores.max(axis=1)
    threshold = float(np.sort(scores)[rank - 1])
    return Conformal(
        posterior=posterior, task=task, alpha=alpha, score=score, threshold=threshold,
        num_calibration=int(X.shape[0]), num_samples=num_samples, mode=mode, temperature=temperature,
    )


# -- saving and loading ----------------------------------------------------------------------------
# A calibration lives in its posterior's run folder as one small JSON file, checked on loading like
# every other file of a run (the manifest's checksum, then each field's type and range).
CALIBRATION_FILE = "calibration.json"
_KINDS = {"temperature": Calibration, "conformal": Conformal}


def calibration_record(calibration) -> dict:
    """The JSON record of a :class:`Calibration` or :class:`Conformal` (everything but the posterior)."""
    kind = next(name for name, cls in _KINDS.items() if isinstance(calibration, cls))
    record = {"kind": kind}
    record.update((f.name, getattr(calibration, f.name)) for f in fields(calibration) if f.name != "posterior")
    if "notes" in record:
        record["notes"] = list(record["notes"])
    return record


def _save(calibration, path) -> None:
    calibration.posterior._attached("save")
    save_posterior(calibration.posterior, path, extra_files={CALIBRATION_FILE: calibration_record(calibration)})


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _finite(value, low=-math.inf) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > low


def calibration_from_record(posterior, record, where: str, task: str | None = None):
    """A :class:`Calibration` or :class:`Conformal` on ``posterior`` from its JSON ``record``, every
    field checked (``where`` names the file in errors). ``task`` (``"classification"`` or
    ``"regression"``) stands in for the posterior's where there is none (``posterior=None``, as
    ``ppl show`` reads a run without loading it)."""
    def bad(name: str, wanted: str):
        shown = repr(record.get(name, "<missing>") if isinstance(record, dict) else record)
        return RunError(f"{where}: field {name!r} must be {wanted}, got {shown[:80]} — the file was edited or corrupted")

    if not isinstance(record, dict) or record.get("kind") not in _KINDS:
        raise bad("kind", f"one of {list(_KINDS)}")
    kind = record["kind"]
    task = task or supervised_task(posterior, "ppl.load_calibration")
    checks = {
        "num_samples": (lambda v: v is None or _positive_int(v), "a positive integer or null"),
        "mode": (lambda v: isinstance(v, str), "a prediction mode name"),
    }
    if kind == "temperature":
        checks.update(
            temperature=(lambda v: _finite(v, 0.0), "a positive finite number"),
            validation_nll=(_finite, "a finite number"),
            validation_nll_uncalibrated=(_finite, "a finite number"),
            num_validation=(_positive_int, "a positive integer"),
            notes=(lambda v: isinstance(v, list) and all(isinstance(n, str) for n in v), "a list of strings"),
        )
        if task != "classification":
            raise RunError(f"{where}: holds a temperature, but the run is a {task} posterior — the file was edited or corrupted")
    else:
        allowed = _CLASSIFICATION_SCORES if task == "classification" else _REGRESSION_SCORES
        checks.update(
            task=(lambda v: v == task, f"{task!r} (the run's task)"),
            alpha=(lambda v: _finite(v, 0.0) and v < 1.0, "a number in (0, 1)"),
            score=(lambda v: v in allowed, f"one of {list(allowed)}"),
            threshold=(lambda v: _finite(v, -1e-12), "a finite number ≥ 0"),
            num_calibration=(_positive_int, "a positive integer"),
            temperature=(lambda v: v is None or _finite(v, 0.0), "a positive finite number or null"),
        )
    unknown = sorted(set(record) - set(checks) - {"kind"})
    if unknown:
        raise RunError(f"{where}: unexpected field(s) {unknown} — the file was edited or written by another version")
    for name, (ok, wanted) in checks.items():
        if name not in record or not ok(record[name]):
            raise bad(name, wanted)
    values = {name: record[name] for name in checks}
    if kind == "temperature":
        values["notes"] = tuple(values["notes"])
        values["temperature"] = float(values["temperature"])
    return _KINDS[kind](posterior=posterior, **values)


def load_calibration(path, *, model=None, trust: bool = False):
    """The :class:`Calibration` or :class:`Conformal` saved in run folder ``path`` (by its ``save``
    or ``ppl calibrate``), on the run's posterior; both are read from one snapshot of the folder and
    checked as ``ppl.load`` checks a run. ``model`` and ``trust`` as for ``ppl.load``."""
    posterior, record = load_with(path, CALIBRATION_FILE, model=model, trust=trust)
    if record is None:
        raise RunError(
            f"{path}: the run holds no calibration; fit one with ppl.calibrate(post, val_data, seed=...).save(path), "
            "ppl.conformal(...).save(path), or `ppl calibrate RUN --data FILE`"
        )
    return calibration_from_record(posterior, record, f"{path}/{CALIBRATION_FILE}")
