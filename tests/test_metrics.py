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


def test_float32_classification_nll_is_computed_in_log_space():
    # A logistic regression whose MAP is pinned by construction: one input, weight 17 on a float32
    # (JAX's default) posterior. A wrong label at logit 17 costs softplus(17) ≈ 17.0 nats; from the
    # clipped probability 1 − sigmoid(17) = 0 in float32 it read 690.8 (−log 1e-300).
    import jax.numpy as jnp

    from ppl._posterior import _classification, _class_log_probs

    logits = jnp.asarray([[17.0], [-17.0], [0.5]], dtype=jnp.float32)[None, :, 0]  # one draw, three inputs
    prediction = _classification(np.asarray(_class_log_probs("bernoulli", logits)))
    expected = np.logaddexp(0.0, np.array([17.0, 17.0, -0.5]))  # softplus of the logit against the label
    np.testing.assert_allclose(-prediction.log_prob(np.array([0, 1, 1])), expected, rtol=1e-6)
    assert abs(classification_metrics(prediction, np.array([0, 1, 1]))["nll"] - expected.mean()) < 1e-5
    # softmax: the wrong class's log probability is its logit gap, not log 0
    cat = _classification(np.asarray(_class_log_probs("categorical", jnp.asarray([[[40.0, 0.0, 0.0]]], jnp.float32))))
    np.testing.assert_allclose(-cat.log_prob(np.array([1])), [40.0], rtol=1e-6)
    # over draws: log-mean-exp, so one confident wrong draw of two costs log 2 plus the other's NLL
    two = _classification(np.asarray(_class_log_probs("bernoulli", jnp.asarray([[30.0], [-30.0]], jnp.float32))))
    np.testing.assert_allclose(-two.log_prob(np.array([0])), [np.log(2.0)], rtol=1e-6)


def test_float32_nll_through_a_fitted_posterior():
    # The same pin end to end: a float32 MAP logistic regression, evaluated at an input far along
    # its weight vector, so the logit is large and the label the wrong one.
    import ppl
    from ppl.models import LogisticRegression

    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 2)).astype(np.float32)
    y = (X[:, 0] + 0.5 * rng.normal(size=200) > 0).astype(np.int32)
    post = ppl.fit(LogisticRegression(), (X, y), method="map", seed=0)
    w, b = np.asarray(post.draws["w"]).reshape(-1), float(np.asarray(post.draws["b"]).reshape(()))
    x = (w * 40.0 / np.dot(w, w)).astype(np.float32)[None]  # logit 40 + b
    logit = float(x[0] @ w + b)
    prediction = post.predict(x, seed=0)
    assert prediction.probs.dtype == np.float64
    np.testing.assert_allclose(-prediction.log_prob(np.array([0])), [np.logaddexp(0.0, logit)], rtol=1e-4)
