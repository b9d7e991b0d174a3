"""Predictive metrics: NLL, accuracy, ECE, Brier (classification); NLL, RMSE, coverage (regression);
uncertainty quality: OOD-detection AUROC, selective prediction, agreement, total variation and
1-Wasserstein distance to a reference predictive, and metrics under dataset shift."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np
from scipy.special import ndtr

from ppl.core.results import Prediction

__all__ = [
    "classification_metrics", "regression_metrics", "expected_calibration_error", "NUM_ECE_BINS",
    "auroc", "ood_auroc", "SelectiveCurve", "selective_prediction", "agreement", "total_variation",
    "wasserstein1", "shift_metrics",
]

NUM_ECE_BINS = 15


def expected_calibration_error(probs: np.ndarray, labels: np.ndarray, num_bins: int = NUM_ECE_BINS) -> float:
    """ECE with equal-width confidence bins: Σ_b (n_b / N) |accuracy_b − confidence_b| (Guo et al. 2017)."""
    confidence = probs.max(axis=1)
    correct = probs.argmax(axis=1) == labels
    # Bin b holds confidences in (b/B, (b+1)/B]; a confidence of exactly 0 joins the first bin.
    bins = np.clip(np.ceil(confidence * num_bins).astype(int) - 1, 0, num_bins - 1)
    ece = 0.0
    for b in range(num_bins):
        members = bins == b
        if members.any():
            ece += members.mean() * abs(correct[members].mean() - confidence[members].mean())
    return float(ece)


def classification_metrics(prediction: Prediction, labels: np.ndarray) -> dict:
    """NLL (mean −log p(y|x, D)), accuracy, ECE (15 bins) and the multi-class Brier score
    Σ_c (p_c − 1[y = c])² averaged over points (for two classes this is twice the binary score)."""
    labels = np.asarray(labels).astype(int)
    probs = prediction.probs
    rows = np.arange(labels.shape[0])
    # Σ_c (p_c − 1[y = c])² = Σ_c p_c² − 2 p_y + 1, without an N × C one-hot matrix.
    brier = np.sum(np.square(probs), axis=1) - 2.0 * probs[rows, labels] + 1.0
    return {
        "nll": float(-np.mean(prediction.log_prob(labels))),
        "accuracy": float(np.mean(probs.argmax(axis=1) == labels)),
        "ece": expected_calibration_error(probs, labels),
        "brier": float(np.mean(brier)),
    }


def regression_metrics(prediction: Prediction, targets: np.ndarray, level: float = 0.9) -> dict:
    """NLL, RMSE of the predictive mean, and coverage of the central ``level`` predictive interval.

    Coverage is exact for the Monte Carlo predictive mixture: y lies in the central interval iff its
    mixture CDF, mean_s Φ((y − f_s)/σ_s), lies in [(1 − level)/2, (1 + level)/2]. With K targets per
    input, RMSE and coverage run over all N·K values and the NLL is the mean joint −log density per input.
    """
    targets = np.asarray(targets, dtype=float)
    cdf = np.mean(ndtr((targets[None] - prediction.member_means) / prediction.noise_per_draw()), axis=0)
    tail = (1.0 - level) / 2.0
    return {
        "nll": float(-np.mean(prediction.log_prob(targets))),
        "rmse": float(np.sqrt(np.mean(np.square(prediction.mean - targets)))),
        f"coverage_{round(level * 100)}": float(np.mean((cdf >= tail) & (cdf <= 1.0 - tail))),
    }


# -- uncertainty quality: OOD detection, selective prediction, agreement with a reference -----------


def auroc(scores_negative, scores_positive) -> float:
    """Area under the ROC curve: the probability that a positive's score exceeds a negative's.

    P(s⁺ > s⁻) + ½ P(s⁺ = s⁻) over all (negative, positive) pairs, computed from ranks (the
    Mann–Whitney U statistic) in O(n log n): with mid-ranks r (tied scores share the mean of the
    ranks they span) over the pooled scores, AUROC = (Σ_{positives} r − n⁺(n⁺ + 1)/2) / (n⁺ n⁻).
    1 means every positive scores above every negative, 0.5 no separation, 0 the reverse.
    """
    negative = np.asarray(scores_negative, dtype=float).reshape(-1)
    positive = np.asarray(scores_positive, dtype=float).reshape(-1)
    for name, scores in (("scores_negative", negative), ("scores_positive", positive)):
        if scores.size == 0:
            raise ValueError(f"auroc: {name} is empty; pass at least one score for each of the two groups")
        if not np.all(np.isfinite(scores)):
            bad = int(np.flatnonzero(~np.isfinite(scores))[0])
            raise ValueError(
                f"auroc: {name} holds a non-finite score at index {bad} ({scores[bad]}); "
                "scores must be finite numbers (drop or replace those inputs)"
            )
    pooled = np.concatenate([negative, positive])
    values, inverse, counts = np.unique(pooled, return_inverse=True, return_counts=True)
    # group g spans ranks start+1 .. start+count (1-based); its mid-rank is start + (count + 1)/2
    start = np.concatenate([[0], np.cumsum(counts)[:-1]])
    mid_rank = start + (counts + 1) / 2.0
    rank_sum = float(np.sum(mid_rank[inverse.reshape(-1)[negative.size:]]))
    n_pos, n_neg = positive.size, negative.size
    return (rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg)


def _entropy_of(prediction: Prediction) -> np.ndarray:
    """The predictive entropy, from ``probs`` when a hand-built prediction lacks it."""
    if prediction.entropy is not None:
        return np.asarray(prediction.entropy, dtype=float)
    probs = np.asarray(prediction.probs, dtype=float)
    return -np.sum(probs * np.log(np.where(probs > 0, probs, 1.0)), axis=-1)


def _per_input(values) -> np.ndarray:
    """A regression variance (N,) or (N, K) as one score per input: the sum over the K outputs."""
    values = np.asarray(values, dtype=float)
    return values.sum(axis=-1) if values.ndim == 2 else values


def _check_task(where: str, prediction: Prediction, task: str, instead: str) -> None:
    if not isinstance(prediction, Prediction):
        raise TypeError(f"{where}: expected a ppl.Prediction (from posterior.predict), got {type(prediction).__name__}")
    if prediction.task != task:
        raise ValueError(f"{where} compares {task} predictions; this one is a {prediction.task} prediction — {instead}")


def ood_auroc(in_prediction: Prediction, out_prediction: Prediction) -> dict:
    """How well predictive uncertainty tells out-of-distribution inputs from in-distribution ones.

    The out-of-distribution inputs are the positives: each AUROC (:func:`auroc`) is the probability
    that an OOD input is more uncertain than an in-distribution one (ties count ½).

    Classification: ``{"auroc_entropy": ..., "auroc_mi": ...}`` scored by the predictive entropy
    and by the mutual information between label and weights (``Prediction.epistemic``).
    ``auroc_mi`` is None when either prediction has no per-draw probabilities (the closed-form
    ``mode="probit"`` predictive); predict with ``mode="mc"`` or ``"linearized"`` to get it. The two
    predictions must have the same number of classes.

    Regression: ``{"auroc_variance": ..., "auroc_epistemic": ...}`` scored by the total predictive
    variance and by its epistemic part (the variance of the mean over draws). With K outputs per
    input the score is the sum of the K variances. A point estimate has zero epistemic variance
    everywhere, so its ``auroc_epistemic`` is 0.5 (all ties).
    """
    for name, prediction in (("in_prediction", in_prediction), ("out_prediction", out_prediction)):
        if not isinstance(prediction, Prediction):
            raise TypeError(f"ood_auroc: {name} must be a ppl.Prediction (from posterior.predict), got {type(prediction).__name__}")
    if in_prediction.task != out_prediction.task:
        raise ValueError(
            f"ood_auroc: in_prediction is a {in_prediction.task} prediction but out_prediction is a "
            f"{out_prediction.task} one; predict both sets with the same posterior"
        )
    if in_prediction.task == "classification":
        classes_in, classes_out = np.shape(in_prediction.probs)[-1], np.shape(out_prediction.probs)[-1]
        if classes_in != classes_out:
            raise ValueError(
                f"ood_auroc: in_prediction has {classes_in} classes but out_prediction has {classes_out}; "
                "entropies over different numbers of classes are not comparable — predict both with the same posterior"
            )
        result = {"auroc_entropy": auroc(_entropy_of(in_prediction), _entropy_of(out_prediction)), "auroc_mi": None}
        if in_prediction.epistemic is not None and out_prediction.epistemic is not None:
            result["auroc_mi"] = auroc(in_prediction.epistemic, out_prediction.epistemic)
        return result
    return {
        "auroc_variance": auroc(_per_input(in_prediction.variance), _per_input(out_prediction.variance)),
        "auroc_epistemic": auroc(
            _per_input(in_prediction.epistemic_variance), _per_input(out_prediction.epistemic_variance)
        ),
    }


class SelectiveCurve(NamedTuple):
    """Accuracy when abstaining on the most uncertain inputs (see :func:`selective_prediction`).

    ``coverage[i]`` = (N − i)/N is the fraction of inputs kept and ``accuracy[i]`` the accuracy on
    them, i = 0..N−1 (from all inputs kept down to one); ``area`` = mean(accuracy).
    """

    coverage: np.ndarray
    accuracy: np.ndarray
    area: float


SELECTIVE_SCORES = ("entropy", "epistemic")


def selective_prediction(prediction: Prediction, labels, score: str = "entropy") -> SelectiveCurve:
    """Accuracy–coverage curve of a classifier that abstains on its most uncertain inputs first.

    Inputs are ordered by ``score`` (``"entropy"``: predictive entropy; ``"epistemic"``: mutual
    information), least uncertain first; equal scores keep input order (a stable sort), so among
    ties the later input is abstained on first. For k = N, N−1, ..., 1 the k least uncertain inputs
    are kept: ``coverage`` = k/N and ``accuracy`` = the fraction of those k whose argmax class is the
    label. ``area`` is the mean of the N accuracies, (1/N) Σ_{k=1}^{N} accuracy(k/N): the area under
    the accuracy–coverage curve as a right Riemann sum with step 1/N. A score that ranks every
    error last gives the largest area the errors allow; a random order gives about the accuracy.

    Classification only: a regression prediction raises ValueError (its analogue would need an
    error measure in place of accuracy; none is implied here).
    """
    _check_task("selective_prediction", prediction, "classification",
                "selective prediction needs class probabilities and labels")
    if score not in SELECTIVE_SCORES:
        raise ValueError(f"selective_prediction: score must be one of {', '.join(map(repr, SELECTIVE_SCORES))}, got {score!r}")
    probs = np.asarray(prediction.probs, dtype=float)
    labels = np.asarray(labels)
    if labels.shape != probs.shape[:1]:
        raise ValueError(
            f"selective_prediction: labels have shape {labels.shape} but the prediction covers {probs.shape[0]} "
            f"inputs; pass one label per predicted input, shape ({probs.shape[0]},)"
        )
    if labels.size == 0:
        raise ValueError("selective_prediction: the prediction covers no inputs; predict at least one")
    if not np.all(np.mod(labels, 1) == 0) or labels.min() < 0 or labels.max() >= probs.shape[1]:
        raise ValueError(
            f"selective_prediction: labels must be integers in 0..{probs.shape[1] - 1} (one per class of the "
            f"prediction); got values from {labels.min()} to {labels.max()}"
        )
    if score == "entropy":
        uncertainty = _entropy_of(prediction)
    else:
        if prediction.epistemic is None:
            raise ValueError(
                "selective_prediction: score='epistemic' needs the mutual information, which this prediction "
                "lacks (the closed-form mode='probit' predictive has no per-draw probabilities); predict with "
                "mode='mc' or 'linearized', or use score='entropy'"
            )
        uncertainty = np.asarray(prediction.epistemic, dtype=float)
    order = np.argsort(uncertainty, kind="stable")
    correct = (probs.argmax(axis=1) == labels.astype(int))[order]
    n = correct.size
    kept = np.arange(n, 0, -1)  # k = N..1
    accuracy = np.cumsum(correct)[kept - 1] / kept
    return SelectiveCurve(coverage=kept / n, accuracy=accuracy, area=float(np.mean(accuracy)))


def _check_pair(where: str, prediction: Prediction, reference: Prediction, task: str, instead: str, field: str) -> tuple:
    _check_task(where, prediction, task, instead)
    if not isinstance(reference, Prediction):
        raise TypeError(f"{where}: reference must be a ppl.Prediction (from posterior.predict), got {type(reference).__name__}")
    if reference.task != task:
        raise ValueError(
            f"{where}: the prediction is a {task} prediction but the reference is a {reference.task} one; "
            "compare predictions of the same model on the same inputs"
        )
    a, b = np.asarray(getattr(prediction, field), dtype=float), np.asarray(getattr(reference, field), dtype=float)
    if a.shape != b.shape:
        raise ValueError(
            f"{where}: the prediction's {field} has shape {a.shape} but the reference's has shape {b.shape}; "
            "both must cover the same inputs (and classes or outputs) — predict the same X with both posteriors"
        )
    if a.size == 0:
        raise ValueError(f"{where}: the predictions cover no inputs; predict at least one")
    return a, b


def agreement(prediction: Prediction, reference: Prediction) -> float:
    """Fraction of inputs whose most probable class under ``prediction`` is that under ``reference``
    (top-1 agreement, Izmailov et al. 2021, "What are Bayesian neural network posteriors really
    like?"). Exact ties in the probabilities resolve to the lowest class index, as ``argmax`` does.
    Classification only; for regression use :func:`wasserstein1`."""
    a, b = _check_pair("agreement", prediction, reference, "classification",
                       "for regression use wasserstein1", "probs")
    return float(np.mean(a.argmax(axis=-1) == b.argmax(axis=-1)))


def total_variation(prediction: Prediction, reference: Prediction) -> float:
    """Mean over inputs of the total-variation distance ½ Σ_c |p_c − q_c| between the predictive
    class probabilities of ``prediction`` (p) and ``reference`` (q); 0 for identical predictives,
    1 for disjoint ones. Classification only; for regression use :func:`wasserstein1`."""
    a, b = _check_pair("total_variation", prediction, reference, "classification",
                       "for regression use wasserstein1", "probs")
    return float(np.mean(0.5 * np.sum(np.abs(a - b), axis=-1)))


W1_SAMPLES = 4096


def _predictive_samples(prediction: Prediction, normals: np.ndarray) -> np.ndarray:
    """``num_samples`` draws per input (and output) from a regression predictive, shape (n, N[, K]),
    built from given standard normals (n, N[, K]) so that two predictives can share them."""
    n = normals.shape[0]
    if prediction.gaussian:  # exactly N(mean, variance)
        return prediction.mean[None] + np.sqrt(prediction.variance)[None] * normals
    means = np.asarray(prediction.member_means, dtype=float)
    noise = np.broadcast_to(prediction.noise_per_draw(), means.shape)
    # Stratified over the equally weighted draws: sample j comes from draw ⌊j S / n⌋, so each draw
    # supplies n/S samples (to within one) instead of a multinomial number of them.
    member = (np.arange(n) * means.shape[0]) // n
    return means[member] + noise[member] * normals


def wasserstein1(prediction: Prediction, reference: Prediction, *, seed: int = 0, num_samples: int = W1_SAMPLES) -> float:
    """Mean over inputs of the 1-Wasserstein distance between two regression predictives.

    For each input, W1(P, Q) = ∫₀¹ |F_P⁻¹(u) − F_Q⁻¹(u)| du, estimated from ``num_samples`` draws of
    each predictive: sorted, paired in order, and the mean absolute difference taken (the exact
    W1 between the two empirical distributions). A predictive is sampled as the Monte Carlo mixture
    it stands for — draw s's mean plus its noise sd times a standard normal, the draws taken in
    equal shares — or, when it is exactly Gaussian (``Prediction.gaussian``), from N(mean,
    variance). Both predictives use the same standard normals (drawn from ``seed``), so the result
    is deterministic given the seed, a prediction compared with itself gives exactly 0, and two
    Gaussians N(m₁, s²) and N(m₂, s²) give exactly |m₁ − m₂|. With K outputs per input, the
    per-output (marginal) distances are averaged over inputs and outputs. Units are those of the
    target the model saw (standardised targets: multiply by ``Dataset.target_std``).
    Regression only; for classification use :func:`total_variation` or :func:`agreement`.
    """
    a, _ = _check_pair("wasserstein1", prediction, reference, "regression",
                       "for classification use total_variation or agreement", "mean")
    for name, p in (("prediction", prediction), ("reference", reference)):
        if not p.gaussian and (p.member_means is None or p.member_noise is None):
            raise ValueError(
                f"wasserstein1: the {name} has no per-draw means and noise (member_means, member_noise) to "
                "sample its predictive from; pass a Prediction from posterior.predict"
            )
    if isinstance(num_samples, bool) or not isinstance(num_samples, (int, np.integer)) or num_samples < 1:
        raise ValueError(f"wasserstein1: num_samples must be a positive integer, got {num_samples!r}")
    rng = np.random.default_rng(seed)
    # Inputs in chunks of at most _W1_CHUNK sampled values, so a large test set does not hold
    # num_samples × N values (several times over) at once; the chunking depends only on the shapes.
    per_input = int(num_samples) * int(np.prod(a.shape[1:], dtype=int))
    step = max(1, _W1_CHUNK // per_input)
    total = 0.0
    for start in range(0, a.shape[0], step):
        rows = slice(start, min(start + step, a.shape[0]))
        normals = rng.standard_normal((int(num_samples), rows.stop - rows.start, *a.shape[1:]))
        first = np.sort(_predictive_samples(_rows(prediction, rows), normals), axis=0)
        second = np.sort(_predictive_samples(_rows(reference, rows), normals), axis=0)
        total += float(np.sum(np.mean(np.abs(first - second), axis=0)))
    return total / a.size


_W1_CHUNK = 1 << 22


def _rows(prediction: Prediction, rows: slice) -> Prediction:
    """The regression fields :func:`_predictive_samples` reads, for the inputs ``rows`` only."""
    def cut(values, axis):
        return None if values is None else np.asarray(values)[(slice(None),) * axis + (rows,)]

    noise = prediction.member_noise
    if noise is not None and prediction.member_means is not None:
        noise = prediction.noise_per_draw()
        noise = noise if noise.shape[1] == 1 else cut(noise, 1)  # per-input noise (heteroscedastic) is cut too
    return dataclasses.replace(
        prediction, mean=cut(prediction.mean, 0), variance=cut(prediction.variance, 0),
        member_means=cut(prediction.member_means, 1), member_noise=noise,
    )


def shift_metrics(posterior, dataset, *, seed, **predict_options) -> list[dict]:
    """Predictive metrics on each shifted test set of ``dataset`` (``Dataset.shifts``), in order.

    One dict per shift intensity: ``{"shift": intensity, **metrics}`` where the metrics are
    :func:`classification_metrics` (nll, accuracy, ece, brier) or :func:`regression_metrics`
    (nll, rmse, coverage_90), as the dataset's task asks. ``Dataset.shift_name`` says what the
    intensity measures (e.g. "rotation (degrees)"). Every set is predicted with the same ``seed``
    and ``predict_options`` (passed to ``posterior.predict``: ``num_samples``, ``mode``).
    """
    shifts = getattr(dataset, "shifts", None)
    if not shifts:
        raise ValueError(
            f"shift_metrics: dataset {getattr(dataset, 'name', '?')!r} has no shifted test sets (Dataset.shifts "
            "is empty); use a dataset that has them, such as ppl.datasets.load('rotated_digits', seed=0)"
        )
    score = classification_metrics if dataset.task == "classification" else regression_metrics
    rows = []
    for intensity, split in shifts:
        prediction = posterior.predict(split.X, seed=seed, **predict_options)
        rows.append({"shift": float(intensity), **score(prediction, split.y)})
    return rows
