"""Predictive metrics against hand-computed values."""

from __future__ import annotations

import numpy as np

from ppl.core.results import Prediction
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

    from ppl.core.predict import class_log_probs, classification_prediction

    logits = jnp.asarray([[17.0], [-17.0], [0.5]], dtype=jnp.float32)[None, :, 0]  # one draw, three inputs
    prediction = classification_prediction(np.asarray(class_log_probs("bernoulli", logits)))
    expected = np.logaddexp(0.0, np.array([17.0, 17.0, -0.5]))  # softplus of the logit against the label
    np.testing.assert_allclose(-prediction.log_prob(np.array([0, 1, 1])), expected, rtol=1e-6)
    assert abs(classification_metrics(prediction, np.array([0, 1, 1]))["nll"] - expected.mean()) < 1e-5
    # softmax: the wrong class's log probability is its logit gap, not log 0
    cat = classification_prediction(np.asarray(class_log_probs("categorical", jnp.asarray([[[40.0, 0.0, 0.0]]], jnp.float32))))
    np.testing.assert_allclose(-cat.log_prob(np.array([1])), [40.0], rtol=1e-6)
    # over draws: log-mean-exp, so one confident wrong draw of two costs log 2 plus the other's NLL
    two = classification_prediction(np.asarray(class_log_probs("bernoulli", jnp.asarray([[30.0], [-30.0]], jnp.float32))))
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


# -- uncertainty quality: AUROC, selective prediction, agreement, TV, W1 ------------------------------

import pytest  # noqa: E402

from ppl.diagnostics import (  # noqa: E402
    agreement,
    auroc,
    ood_auroc,
    selective_prediction,
    total_variation,
    wasserstein1,
)


def _classes(probs, epistemic=None):
    probs = np.asarray(probs, dtype=float)
    entropy = -np.sum(probs * np.log(probs), axis=1)
    return Prediction(task="classification", probs=probs, entropy=entropy, epistemic=epistemic)


def _draws(member_means, noise):
    """A regression prediction from draws of the mean (S, N) and noise sds (S,)."""
    means = np.asarray(member_means, dtype=float)
    noise = np.asarray(noise, dtype=float)
    return Prediction(
        task="regression", mean=means.mean(axis=0), variance=means.var(axis=0) + np.mean(noise**2),
        epistemic_variance=means.var(axis=0), aleatoric_variance=np.full(means.shape[1], np.mean(noise**2)),
        member_means=means, member_noise=noise,
    )


def test_auroc_by_hand_with_ties():
    # Pairs (positive, negative): 0.4 beats 0.1 (1), ties 0.4 twice (½ + ½); 0.8 beats all three (3): 5 of 6.
    assert auroc([0.1, 0.4, 0.4], [0.4, 0.8]) == pytest.approx(5 / 6, abs=1e-15)
    assert auroc([1.0, 2.0], [3.0]) == 1.0
    assert auroc([3.0], [1.0, 2.0]) == 0.0
    assert auroc([2.0, 2.0], [2.0]) == 0.5


def test_auroc_matches_the_pairwise_definition():
    rng = np.random.default_rng(0)
    negative, positive = rng.integers(0, 5, 40).astype(float), rng.integers(1, 6, 30).astype(float)
    pairs = (positive[:, None] > negative[None]).mean() + 0.5 * (positive[:, None] == negative[None]).mean()
    assert auroc(negative, positive) == pytest.approx(pairs, abs=1e-12)


def test_auroc_refuses_empty_and_non_finite_scores():
    with pytest.raises(ValueError, match="scores_positive is empty"):
        auroc([0.1], [])
    with pytest.raises(ValueError, match="scores_negative holds a non-finite score at index 1"):
        auroc([0.1, np.nan], [0.2])


def test_ood_auroc_classification_by_hand():
    # in: entropy ranks below out except one tie; MI: 0.3 beats both in-scores, 0.1 beats one of two.
    inside = Prediction(task="classification", probs=np.full((2, 2), 0.5), entropy=np.array([0.1, 0.5]),
                        epistemic=np.array([0.0, 0.2]))
    outside = Prediction(task="classification", probs=np.full((2, 2), 0.5), entropy=np.array([0.5, 0.9]),
                         epistemic=np.array([0.3, 0.1]))
    result = ood_auroc(inside, outside)
    assert result == {"auroc_entropy": pytest.approx(3.5 / 4), "auroc_mi": pytest.approx(3 / 4)}
    probit = Prediction(task="classification", probs=np.full((2, 2), 0.5), entropy=np.array([0.5, 0.9]))
    assert ood_auroc(inside, probit)["auroc_mi"] is None


def test_ood_auroc_regression_scores_by_variances():
    # in: draws agree (epistemic 0), noise 1; out: draws spread ±1 (epistemic 1) at one input, agree at the other
    inside = _draws([[0.0, 0.0], [0.0, 0.0]], [1.0, 1.0])
    outside = _draws([[1.0, 0.0], [-1.0, 0.0]], [1.0, 1.0])
    # total variances: in (1, 1), out (2, 1): 2 beats both (2), 1 ties both (½ + ½) → 3 of 4
    assert ood_auroc(inside, outside) == {"auroc_variance": pytest.approx(0.75), "auroc_epistemic": pytest.approx(0.75)}
    with pytest.raises(ValueError, match="in_prediction is a regression prediction but out_prediction is a classification"):
        ood_auroc(inside, _classes([[0.5, 0.5]]))


def test_selective_prediction_on_four_points():
    probs = [[0.9, 0.1], [0.6, 0.4], [0.8, 0.2], [0.55, 0.45]]
    labels = np.array([0, 1, 0, 0])  # input 1 is the only error
    # by entropy, least uncertain first: inputs 0, 2, 1, 3 → correct, correct, wrong, correct
    curve = selective_prediction(_classes(probs), labels)
    np.testing.assert_array_equal(curve.coverage, [1.0, 0.75, 0.5, 0.25])
    np.testing.assert_allclose(curve.accuracy, [3 / 4, 2 / 3, 1.0, 1.0], rtol=1e-15)
    assert curve.area == pytest.approx((3 / 4 + 2 / 3 + 1 + 1) / 4, abs=1e-15)
    # by MI the error ranks least uncertain: inputs 1, 0, 3, 2 → wrong first
    by_mi = selective_prediction(_classes(probs, epistemic=np.array([0.2, 0.0, 0.3, 0.25])), labels, score="epistemic")
    np.testing.assert_allclose(by_mi.accuracy, [3 / 4, 2 / 3, 1 / 2, 0.0], rtol=1e-15)


def test_selective_prediction_breaks_ties_by_input_order():
    # equal entropies: input 0 (wrong) stays, input 1 (right) is abstained on first
    curve = selective_prediction(_classes([[0.7, 0.3], [0.7, 0.3]]), np.array([1, 0]))
    np.testing.assert_array_equal(curve.accuracy, [0.5, 0.0])


def test_selective_prediction_refusals():
    with pytest.raises(ValueError, match="classification predictions; this one is a regression"):
        selective_prediction(_draws([[0.0]], [1.0]), np.array([0.0]))
    with pytest.raises(ValueError, match="score='epistemic' needs the mutual information"):
        selective_prediction(_classes([[0.7, 0.3]]), np.array([0]), score="epistemic")
    with pytest.raises(ValueError, match="labels have shape"):
        selective_prediction(_classes([[0.7, 0.3]]), np.array([0, 1]))
    with pytest.raises(ValueError, match="score must be one of"):
        selective_prediction(_classes([[0.7, 0.3]]), np.array([0]), score="variance")


def test_agreement_and_total_variation_on_two_by_two():
    p = _classes([[0.7, 0.3], [0.4, 0.6]])
    q = _classes([[0.6, 0.4], [0.6, 0.4]])
    assert agreement(p, q) == 0.5  # argmax (0, 1) against (0, 0)
    assert total_variation(p, q) == pytest.approx((0.1 + 0.2) / 2, abs=1e-15)  # ½(0.1+0.1), ½(0.2+0.2)
    assert agreement(p, p) == 1.0 and total_variation(p, p) == 0.0


def test_agreement_and_total_variation_refusals():
    p = _classes([[0.7, 0.3], [0.4, 0.6]])
    with pytest.raises(ValueError, match=r"probs has shape \(2, 2\) but the reference's has shape \(1, 2\)"):
        total_variation(p, _classes([[0.5, 0.5]]))
    with pytest.raises(ValueError, match="for regression use wasserstein1"):
        agreement(_draws([[0.0]], [1.0]), _draws([[0.0]], [1.0]))


def test_wasserstein1_point_masses_and_self():
    # one draw, no noise: point masses at the means; W1 = |difference| per input, averaged
    a, b = _draws([[0.0, 1.0]], [0.0]), _draws([[2.0, -1.0]], [0.0])
    assert wasserstein1(a, b) == 2.0
    assert wasserstein1(a, a) == 0.0
    # an even mixture of point masses at ±1 against one at 0: every sample moves by 1
    assert wasserstein1(_draws([[-1.0], [1.0]], [0.0, 0.0]), _draws([[0.0]], [0.0]), num_samples=10) == 1.0


def test_wasserstein1_between_gaussians():
    # equal sds: the quantile functions differ by the shift everywhere, W1 = |m1 − m2| (up to rounding)
    assert wasserstein1(_draws([[0.0] * 4], [1.0]), _draws([[1.5] * 4], [1.0]), seed=3) == pytest.approx(1.5, abs=1e-12)
    # N(0, 1) against N(0, 2²): W1 = E|2Z − Z| = E|Z| = √(2/π); Monte Carlo, 4 × 4096 samples (se ≈ 0.005)
    value = wasserstein1(_draws([[0.0] * 4], [1.0]), _draws([[0.0] * 4], [2.0]), seed=0)
    assert abs(value - np.sqrt(2 / np.pi)) < 0.02
    assert value == wasserstein1(_draws([[0.0] * 4], [1.0]), _draws([[0.0] * 4], [2.0]), seed=0)  # seeded
    # an exactly Gaussian prediction is sampled from N(mean, variance), not from its draws
    exact = Prediction(task="regression", mean=np.array([1.5]), variance=np.array([1.0]), gaussian=True,
                       epistemic_variance=np.zeros(1), aleatoric_variance=np.ones(1))
    assert wasserstein1(exact, _draws([[0.0]], [1.0])) == pytest.approx(1.5, abs=1e-12)


def test_wasserstein1_refusals():
    with pytest.raises(ValueError, match=r"mean has shape \(2,\) but the reference's has shape \(1,\)"):
        wasserstein1(_draws([[0.0, 1.0]], [1.0]), _draws([[0.0]], [1.0]))
    with pytest.raises(ValueError, match="for classification use total_variation or agreement"):
        wasserstein1(_classes([[0.5, 0.5]]), _classes([[0.5, 0.5]]))
    with pytest.raises(ValueError, match="num_samples must be a positive integer"):
        wasserstein1(_draws([[0.0]], [1.0]), _draws([[0.0]], [1.0]), num_samples=0)


def test_wasserstein1_in_chunks_with_noise_per_input(monkeypatch):
    import ppl.diagnostics.metrics as metrics

    # heteroscedastic: one noise sd per draw and input; equal sds per input, so W1 = |shift| exactly
    a = Prediction(task="regression", mean=np.zeros(3), variance=np.array([1.0, 4.0, 9.0]),
                   member_means=np.zeros((1, 3)), member_noise=np.array([[1.0, 2.0, 3.0]]))
    b = Prediction(task="regression", mean=np.array([1.0, 2.0, 3.0]), variance=np.array([1.0, 4.0, 9.0]),
                   member_means=np.array([[1.0, 2.0, 3.0]]), member_noise=np.array([[1.0, 2.0, 3.0]]))
    whole = wasserstein1(a, b, num_samples=64)
    monkeypatch.setattr(metrics, "_W1_CHUNK", 1)  # one input per chunk
    assert wasserstein1(a, b, num_samples=64) == pytest.approx(2.0, abs=1e-12) == whole
    assert wasserstein1(a, a, num_samples=64) == 0.0
