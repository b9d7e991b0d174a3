"""``ppl.evaluate``: test-set metrics of a posterior."""

from __future__ import annotations

from ppl.core.data import validate_supervised
from ppl.diagnostics import classification_metrics, regression_metrics

__all__ = ["evaluate"]


def evaluate(posterior, data, *, seed, num_samples: int | None = None, mode: str = "mc") -> dict:
    """Test metrics of ``posterior`` on ``data = (X, y)``.

    Classification: ``nll``, ``accuracy``, ``ece`` (15 equal-width bins), ``brier``.
    Regression: ``nll``, ``rmse``, ``coverage_90`` (central 90% predictive interval).
    """
    problem = posterior.problem
    if not problem.is_declarative:
        raise TypeError("ppl.evaluate needs a declarative model from ppl.models (it predicts from (X, y))")
    X, y = validate_supervised(problem.model, data, where="evaluation data")
    if y is None:
        raise TypeError("ppl.evaluate needs targets: pass (X, y)")
    prediction = posterior.predict(X, seed=seed, num_samples=num_samples, mode=mode)
    if prediction.task == "classification":
        return classification_metrics(prediction, y)
    return regression_metrics(prediction, y)
