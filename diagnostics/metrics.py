"""Predictive metrics: NLL, accuracy, ECE, Brier (classification); NLL, RMSE, coverage (regression)."""

from __future__ import annotations

import numpy as np
from scipy.special import ndtr

from ppl._results import Prediction

__all__ = ["classification_metrics", "regression_metrics", "expected_calibration_error", "NUM_ECE_BINS"]

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
