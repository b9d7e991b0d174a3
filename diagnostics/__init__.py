"""Diagnostics: convergence (R-hat, ESS), PSIS k-hat and LOO, predictive metrics, ArviZ export."""

from __future__ import annotations

from ppl.diagnostics.metrics import classification_metrics, expected_calibration_error, regression_metrics
from ppl.diagnostics.psis import khat, khat_threshold, psis_loo
from ppl.diagnostics.report import compute_diagnostics, to_inference_data
from ppl.diagnostics.vae import VAEReport, vae_report

__all__ = [
    "compute_diagnostics",
    "to_inference_data",
    "khat",
    "khat_threshold",
    "psis_loo",
    "classification_metrics",
    "regression_metrics",
    "expected_calibration_error",
    "vae_report",
    "VAEReport",
]
