"""Diagnostics: convergence (R-hat, ESS), PSIS k-hat and LOO, predictive metrics, ArviZ export."""

from __future__ import annotations

from ppl.diagnostics.convergence import function_rhat
from ppl.diagnostics.metrics import (
    SelectiveCurve,
    agreement,
    auroc,
    classification_metrics,
    expected_calibration_error,
    ood_auroc,
    regression_metrics,
    selective_prediction,
    shift_metrics,
    total_variation,
    wasserstein1,
)
from ppl.diagnostics.psis import khat, khat_threshold, psis_loo
from ppl.diagnostics.report import compute_diagnostics, to_inference_data

__all__ = [
    "compute_diagnostics",
    "to_inference_data",
    "khat",
    "khat_threshold",
    "psis_loo",
    "function_rhat",
    "classification_metrics",
    "regression_metrics",
    "expected_calibration_error",
    "auroc",
    "ood_auroc",
    "selective_prediction",
    "SelectiveCurve",
    "agreement",
    "total_variation",
    "wasserstein1",
    "shift_metrics",
]
