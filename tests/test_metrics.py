"""Predictive metrics against hand-computed values."""

from __future__ import annotations

import numpy as np

from ppl._results import Prediction
from ppl.diagnostics import classification_metrics, expected_calibration_error, regression_metrics


def test_ece_by_hand():
    probs = np.array([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4]])
    labels = np.array([0, 1, 1, 1])
    # Bins (15 equal-width): 0.9 -> bin 13, 0.8 -> bin 11, 0.7 -> bin 10, 0.6 -> bin 8; one point each.
    expected = (abs(1 - 0.9) + abs(0 - 0.8) + abs(1 - 0.7) + abs(0 - 0.6)) / 4
    assert abs(expected_calibration_error(probs, labels) - expected) < 1e-12


def test_classification_metrics_by_hand():
    probs = np.array([[0.9, 0.1], [0.2, 0.8]])
    pred = Prediction(task="classification", probs=probs)
    m = classification_metrics(pred, np.array([0, 0]))
    assert abs(m["nll"] - (-(np.log(0.9) + np.log(0.2)) / 2)) < 1e-12
    assert m["accuracy"] == 0.5
    assert abs(m["brier"] - ((0.01 + 0.01) + (0.64 + 0.64)) / 2) < 1e-12


def test_regression_metrics_single_gaussian():
    # One draw: the predictive is N(0, 1); 1.6449 is the 95% quantile.
    pred = Prediction(
        task="regression", mean=np.zeros(3), variance=np.ones(3), member_means=np.zeros((1, 3)), member_noise=np.ones(1)
    )
    m = regression_metrics(pred, np.array([0.0, 1.6, 1.7]))
    assert m["coverage_90"] == 2 / 3
    expected_nll = np.mean(0.5 * np.array([0.0, 1.6, 1.7]) ** 2 + 0.5 * np.log(2 * np.pi))
    assert abs(m["nll"] - expected_nll) < 1e-12
    assert abs(m["rmse"] - np.sqrt((1.6**2 + 1.7**2) / 3)) < 1e-12
