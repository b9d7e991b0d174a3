"""Temperature scaling (ppl.calibrate) and split-conformal prediction (ppl.conformal).

Tolerances: hand-computed checks hold to float64 rounding (1e-12). Conformal coverage is random
through the calibration and test points; its tolerance is derived from the exact distribution of
split-conformal coverage (see ``_coverage_spread``), never guessed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from ppl._calibrate import _aps_cumulative, _fit_temperature, _scaled_nll, conformal_rank, scale_temperature
from ppl.core.predict import class_log_probs, classification_prediction
from ppl.models import BNN, LinearRegression
import ppl


def _softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# -- temperature scaling by hand -------------------------------------------------------------------
def test_scaled_probabilities_are_softmax_of_logits_over_temperature():
    logits = np.array([[[2.0, -1.0, 0.5], [0.0, 3.0, -2.0]], [[1.0, 1.0, -4.0], [-1.0, 0.5, 2.5]]])  # (S=2, N=2, C=3)
    prediction = classification_prediction(np.asarray(class_log_probs("categorical", logits)))
    for temperature in (0.5, 1.0, 2.7):
        scaled = scale_temperature(prediction, temperature)
        members = _softmax(logits / temperature)
        probs = members.mean(axis=0)
        entropy = -np.sum(probs * np.log(probs), axis=-1)
        aleatoric = -np.sum(members * np.log(members), axis=-1).mean(axis=0)
        assert np.max(np.abs(scaled.member_probs - members)) < 1e-12
        assert np.max(np.abs(scaled.probs - probs)) < 1e-12
        assert np.max(np.abs(scaled.log_probs - np.log(probs))) < 1e-12
        assert np.max(np.abs(scaled.entropy - entropy)) < 1e-12
        assert np.max(np.abs(scaled.aleatoric - aleatoric)) < 1e-12
        assert np.max(np.abs(scaled.epistemic - (entropy - aleatoric))) < 1e-12


def test_bernoulli_layout_scales_the_single_logit():
    # Two columns log σ(−f), log σ(f): scaling must give P(y = 1) = mean_s σ(f_s / T).
    f = np.array([[3.0, -0.5, 8.0], [1.0, 2.0, -6.0]])  # (S=2, N=3)
    prediction = classification_prediction(np.asarray(class_log_probs("bernoulli", f)))
    temperature = 2.5
    scaled = scale_temperature(prediction, temperature)
    expected = np.mean(1.0 / (1.0 + np.exp(-f / temperature)), axis=0)
    assert np.max(np.abs(scaled.probs[:, 1] - expected)) < 1e-12
    assert np.max(np.abs(scaled.probs.sum(axis=1) - 1.0)) < 1e-12


def test_closed_form_predictive_scales_its_own_log_probabilities():
    probs = np.array([[0.7, 0.2, 0.1], [0.05, 0.9, 0.05]])
    prediction = ppl.Prediction(task="classification", probs=probs, log_probs=np.log(probs))
    scaled = scale_temperature(prediction, 3.0)
    expected = probs ** (1 / 3.0) / np.sum(probs ** (1 / 3.0), axis=1, keepdims=True)
    assert np.max(np.abs(scaled.probs - expected)) < 1e-12
    assert scaled.member_probs is None and scaled.aleatoric is None and scaled.epistemic is None


def test_fitted_temperature_is_never_worse_than_one_and_is_the_grid_optimum():
    # Random mixtures of draws, labels drawn sharper than, equal to, and flatter than the predictive:
    # the optimum lies above, near or below 1, and the mixture NLL need not be unimodal in T.
    rng = np.random.default_rng(0)
    fine = np.linspace(-math.log(100.0), math.log(100.0), 2001)
    for case, sharpen in enumerate((0.3, 1.0, 3.0, 1.0)):
        num_draws = 1 if case == 3 else 5
        logits = rng.normal(size=(num_draws, 200, 4)) * 2.0 + rng.normal(size=(1, 200, 4))
        members = np.asarray(class_log_probs("categorical", logits))
        truth = _softmax(logits.mean(axis=0) * sharpen)
        labels = np.array([rng.choice(4, p=p) for p in truth])
        temperature, nll, nll_at_one, _ = _fit_temperature(members, labels)
        assert nll <= nll_at_one
        assert abs(nll - _scaled_nll(members, labels, math.log(temperature))) < 1e-12
        assert abs(nll_at_one - _scaled_nll(members, labels, 0.0)) < 1e-12
        # no point of a grid 25 times finer beats it (Brent's tolerance 1e-8 in log T costs far less than 1e-9)
        assert nll <= min(_scaled_nll(members, labels, g) for g in fine) + 1e-9


# -- temperature scaling on fitted classifiers ------------------------------------------------------
@pytest.fixture(scope="module")
def cancer():
    data = ppl.datasets.load("breast_cancer", seed=0)
    X, y = data.train
    cut = int(0.6 * X.shape[0])
    return {"train": (X[:cut], y[:cut]), "val": (X[cut:], y[cut:]), "test": data.test}


def _cancer_map(cancer, prior_scale):
    model = BNN(hidden=(16,), activation="tanh", likelihood="bernoulli", prior_scale=prior_scale)
    return ppl.fit(model, cancer["train"], method="map", seed=0, steps=300)


def test_overconfident_map_gets_a_temperature_above_one(cancer):
    # A wide prior lets the MAP's weights grow until the training set is fitted with near-certainty.
    post = _cancer_map(cancer, prior_scale=10.0)
    cal = ppl.calibrate(post, cancer["val"], seed=1)
    assert cal.temperature > 1.0 and cal.notes == ()
    assert cal.validation_nll < cal.validation_nll_uncalibrated
    # the validation NLL at T = 1 is the posterior's own, and the reported one is the scaled predictive's
    uncalibrated = ppl.evaluate(post, cancer["val"], seed=1)
    assert abs(cal.validation_nll_uncalibrated - uncalibrated["nll"]) < 1e-12
    X_val, y_val = cancer["val"]
    rescored = -np.mean(cal.predict(X_val, seed=1).log_prob(y_val))
    assert abs(cal.validation_nll - rescored) < 1e-12
    report = cal.evaluate(cancer["test"], seed=2)
    assert set(report) == {"temperature", "uncalibrated", "calibrated"}
    assert set(report["calibrated"]) == {"nll", "accuracy", "ece", "brier"}
    # one draw: dividing its logits by T > 0 keeps every argmax
    assert report["calibrated"]["accuracy"] == report["uncalibrated"]["accuracy"]
    assert report["uncalibrated"] == ppl.evaluate(post, cancer["test"], seed=2)
    # measured on these 114 test points: NLL 0.118 -> 0.082 (held out, so not guaranteed in general)
    assert report["calibrated"]["nll"] < report["uncalibrated"]["nll"]
    assert "softens an overconfident" in str(cal) and f"{cal.temperature:.4g}" in str(cal)


def test_underconfident_map_gets_a_temperature_below_one(cancer):
    # A narrow prior shrinks the logits towards 0: right answers with probabilities near 1/2.
    post = _cancer_map(cancer, prior_scale=0.1)
    cal = ppl.calibrate(post, cancer["val"], seed=1)
    assert cal.temperature < 1.0 and cal.notes == ()
    assert cal.validation_nll < cal.validation_nll_uncalibrated
    assert "sharpens an underconfident" in str(cal)
    # measured on the 114 test points: NLL 0.315 -> 0.159, ECE 0.183 -> 0.070
    report = cal.evaluate(cancer["test"], seed=2)
    assert report["calibrated"]["nll"] < report["uncalibrated"]["nll"]
    assert report["calibrated"]["ece"] < report["uncalibrated"]["ece"]


def test_a_validation_split_that_cannot_pin_the_temperature_down():
    # One draw that ranks every validation label first: sharper is always better, so the NLL falls
    # all the way to the search bound T = 1/100, and the result must say so rather than pass silently.
    logits = np.zeros((1, 50, 3))
    labels = np.arange(50) % 3
    logits[0, np.arange(50), labels] = 2.0
    members = np.asarray(class_log_probs("categorical", logits))
    temperature, nll, nll_at_one, at_bound = _fit_temperature(members, labels)
    assert at_bound and abs(temperature - 0.01) < 1e-12 and nll < nll_at_one


def test_a_temperature_at_the_search_bound_is_never_applied():
    # Two classes far apart: every validation point is classified right, so the validation NLL falls
    # without limit as T shrinks. Applying T = 0.01 made one such run's test NLL 35 times worse; the
    # calibration keeps T = 1, says why, and leaves every later prediction as the posterior's own.
    rng = np.random.default_rng(0)
    centres = np.array([[-4.0, 0.0], [4.0, 0.0]])
    y = rng.integers(0, 2, 200)
    X = centres[y] + rng.normal(size=(200, 2))
    post = ppl.fit(BNN(hidden=(), likelihood="bernoulli"), (X[:100], y[:100]), method="map", seed=0)
    cal = ppl.calibrate(post, (X[100:150], y[100:150]), seed=1)
    assert cal.temperature == 1.0 and cal.validation_nll == cal.validation_nll_uncalibrated
    assert len(cal.notes) == 1 and "no temperature was applied (T = 1 kept)" in cal.notes[0]
    report = cal.evaluate((X[150:], y[150:]), seed=2)
    for name, value in report["uncalibrated"].items():  # T = 1 rescales nothing (up to float rounding)
        assert report["calibrated"][name] == pytest.approx(value, rel=1e-12, abs=1e-15), name


# -- split conformal --------------------------------------------------------------------------------
ALPHA = 0.1
NUM_FIT, NUM_CAL = 1000, 9500


def _coverage_spread(num_calibration: int, num_test: int, alpha: float) -> tuple[float, float]:
    """Mean and sd of a split-conformal set's empirical test coverage.

    With continuous scores the coverage given the calibration set, C, is Beta(k, n + 1 − k),
    k = ⌈(n + 1)(1 − α)⌉ (Vovk 2012; Angelopoulos & Bates 2021, §3.2); the m test points then
    cover Binomial(m, C) times. Var = Var(C) + E[C(1 − C)]/m.
    """
    n, k = num_calibration, conformal_rank(num_calibration, alpha)
    mean = k / (n + 1)
    var_c = k * (n + 1 - k) / ((n + 1) ** 2 * (n + 2))
    return mean, math.sqrt(var_c + (mean - (var_c + mean**2)) / num_test)


def _assert_coverage(result: dict, alpha: float):
    mean, sd = _coverage_spread(result["num_calibration"], result["num_test"], alpha)
    # 4 sd: a correct implementation fails with probability 6e-5; the data are large enough that
    # 4 sd lies inside the ±3% the issue asks for, so passing here implies that too.
    assert 4 * sd < 0.03, (sd, result)
    assert abs(result["coverage"] - mean) <= 4 * sd, result
    assert abs(result["coverage"] - (1 - alpha)) <= 0.03, result
    assert result["target"] == 1 - alpha


@pytest.fixture(scope="module")
def blobs():
    # Four overlapping Gaussian classes in 5-D: many inputs are genuinely ambiguous.
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(4, 5)) * 1.2
    y = rng.integers(0, 4, 20000)
    X = centres[y] + rng.normal(size=(20000, 5))
    post = ppl.fit(BNN(hidden=(), likelihood="categorical"), (X[:NUM_FIT], y[:NUM_FIT]), method="map", seed=0, steps=200)
    cut = NUM_FIT + NUM_CAL
    return post, (X[NUM_FIT:cut], y[NUM_FIT:cut]), (X[cut:], y[cut:])


@pytest.mark.parametrize("score", ["aps", "lac"])
def test_classification_sets_cover_at_the_target_rate(blobs, score):
    post, cal, test = blobs
    conf = ppl.conformal(post, cal, alpha=ALPHA, seed=1, score=score)
    result = conf.coverage(test, seed=2)
    _assert_coverage(result, ALPHA)
    sets = conf.predict_sets(test[0], seed=2)
    assert sets.shape == (test[0].shape[0], 4) and sets.dtype == bool
    assert abs(result["mean_set_size"] - sets.sum(axis=1).mean()) < 1e-12
    # Sets are prefixes of the classes ranked by probability (both scores grow down the ranking).
    probs = post.predict(test[0], seed=2).probs
    ranked = np.take_along_axis(sets, np.argsort(-probs, axis=1, kind="stable"), axis=1)
    assert np.all(ranked[:, :-1] >= ranked[:, 1:])
    # same seed, same sets (APS's randomisation included)
    assert np.array_equal(sets, conf.predict_sets(test[0], seed=2))


def test_sets_on_a_temperature_scaled_predictive(blobs):
    # Temperature fitted on one half of the calibration split, conformal threshold on the other:
    # the calibration points stay exchangeable with the test points, so coverage holds as before.
    post, (X, y), test = blobs
    half = X.shape[0] // 2
    cal = ppl.calibrate(post, (X[:half], y[:half]), seed=1)
    conf = ppl.conformal(cal, (X[half:], y[half:]), alpha=ALPHA, seed=1, score="lac")
    assert conf.temperature == cal.temperature and "temperature" in str(conf)
    _assert_coverage(conf.coverage(test, seed=2), ALPHA)
    # LAC keeps every class whose scaled probability reaches 1 − threshold
    scaled = cal.predict(test[0][:500], seed=2).probs
    assert np.array_equal(conf.predict_sets(test[0][:500], seed=2), 1.0 - scaled <= conf.threshold)
    with pytest.raises(ppl.OptionError, match="leave num_samples and mode unset"):
        ppl.conformal(cal, (X[half:], y[half:]), seed=1, mode="mc")


def test_aps_scores_by_hand():
    probs = np.array([[0.2, 0.5, 0.3]])
    # ranked 0.5, 0.3, 0.2: mass above plus U times own, U = 0.5
    expected = np.array([[0.8 + 0.1, 0.25, 0.5 + 0.15]])
    assert np.max(np.abs(_aps_cumulative(probs, np.array([0.5])) - expected)) < 1e-12


@pytest.fixture(scope="module")
def heavy_tailed():
    # Heavy-tailed, heteroscedastic noise, while the model assumes Gaussian noise of sd 0.3.
    rng = np.random.default_rng(1)
    X = rng.normal(size=(20000, 5))
    y = X @ rng.normal(size=5) + 0.5 * np.abs(X[:, 0]) * rng.standard_t(3, size=20000)
    post = ppl.fit(LinearRegression(noise_scale=0.3), (X[:NUM_FIT], y[:NUM_FIT]), method="exact", seed=0)
    cut = NUM_FIT + NUM_CAL
    return post, (X[NUM_FIT:cut], y[NUM_FIT:cut]), (X[cut:], y[cut:])


def test_regression_intervals_fix_a_misspecified_noise_level(heavy_tailed):
    # The posterior's own 90% interval covers far less than 90%; the conformal one covers 90%.
    post, cal, test = heavy_tailed
    assert ppl.evaluate(post, test, seed=2)["coverage_90"] < 0.8
    conf = ppl.conformal(post, cal, alpha=ALPHA, seed=1)
    result = conf.coverage(test, seed=2)
    _assert_coverage(result, ALPHA)
    lower, upper = conf.predict_sets(test[0], seed=2)
    prediction = post.predict(test[0], seed=2)
    assert np.max(np.abs((upper - lower) - 2 * conf.threshold * np.sqrt(prediction.variance))) < 1e-9
    assert abs(result["mean_width"] - np.mean(upper - lower)) < 1e-12


def test_threshold_rank_has_the_finite_sample_correction():
    assert conformal_rank(9, 0.1) == 9  # ⌈10 · 0.9⌉ = 9 exactly, not 10 from 9.000000000000002
    assert conformal_rank(99, 0.1) == 90
    assert conformal_rank(100, 0.1) == 91  # ⌈90.9⌉
    assert conformal_rank(19, 0.05) == 19


# -- bad input --------------------------------------------------------------------------------------
def test_calibrate_refuses_a_regression_model(heavy_tailed):
    post, cal, _ = heavy_tailed
    with pytest.raises(ppl.OptionError, match="regression.*ppl.conformal"):
        ppl.calibrate(post, cal, seed=0)


@pytest.mark.parametrize("alpha", [0.0, 1.0, -0.1, 1.5, float("nan"), True, "0.1"])
def test_alpha_outside_the_unit_interval(blobs, alpha):
    post, cal, _ = blobs
    with pytest.raises(ppl.OptionError, match="alpha"):
        ppl.conformal(post, cal, alpha=alpha, seed=0)


def test_mismatched_input_dimension(blobs):
    post, (X, y), _ = blobs
    narrow = (X[:, :3], y)
    with pytest.raises(ppl.DataError, match="validation data X has 3 features but the posterior was fitted on 5"):
        ppl.calibrate(post, narrow, seed=0)
    with pytest.raises(ppl.DataError, match="calibration data X has 3 features"):
        ppl.conformal(post, narrow, seed=0)
    conf = ppl.conformal(post, (X, y), seed=0)
    with pytest.raises(ppl.DataError, match="test data X has 3 features"):
        conf.coverage(narrow, seed=0)
    with pytest.raises(ppl.DataError, match="X has 3 features"):
        conf.predict_sets(X[:, :3], seed=0)
    with pytest.raises(ppl.DataError, match="X has 3 features"):
        ppl.calibrate(post, (X[:200], y[:200]), seed=0).predict(X[:5, :3], seed=0)
    with pytest.raises(ppl.DataError, match="rows"):
        ppl.conformal(post, (X[:10], y[:9]), seed=0)


def test_too_few_calibration_points(blobs):
    post, (X, y), _ = blobs
    with pytest.raises(ppl.DataError, match="at least 9 calibration points.*got 8"):
        ppl.conformal(post, (X[:8], y[:8]), alpha=0.1, seed=0)
    with pytest.raises(ppl.DataError, match="at least 19 calibration points"):
        ppl.conformal(post, (X[:18], y[:18]), alpha=0.05, seed=0)
    # nine points suffice at alpha = 0.1: the threshold is then the largest score
    assert ppl.conformal(post, (X[:9], y[:9]), alpha=0.1, seed=0).num_calibration == 9


def test_scores_that_do_not_fit_the_task(blobs, heavy_tailed):
    post, cal, _ = blobs
    with pytest.raises(ppl.OptionError, match="score='residual'.*classification.*'aps', 'lac'"):
        ppl.conformal(post, cal, score="residual", seed=0)
    regression, regression_cal, _ = heavy_tailed
    with pytest.raises(ppl.OptionError, match="score='aps'.*regression.*'residual'"):
        ppl.conformal(regression, regression_cal, score="aps", seed=0)


def test_targets_are_required(blobs):
    post, (X, _), _ = blobs
    with pytest.raises(ppl.DataError, match="validation data has no targets"):
        ppl.calibrate(post, (X, None), seed=0)


# -- saving, loading and the command line -----------------------------------------------------------
def test_a_saved_calibration_and_conformal_reload_and_predict_the_same(blobs, tmp_path):
    post, (X, y), test = blobs
    half = X.shape[0] // 2
    cal = ppl.calibrate(post, (X[:half], y[:half]), seed=1)
    cal.save(tmp_path / "cal")
    again = ppl.load_calibration(tmp_path / "cal")
    assert isinstance(again, ppl.Calibration) and again.temperature == cal.temperature
    assert again.validation_nll == cal.validation_nll and again.notes == cal.notes
    np.testing.assert_array_equal(again.predict(test[0][:200], seed=2).probs, cal.predict(test[0][:200], seed=2).probs)
    conf = ppl.conformal(cal, (X[half:], y[half:]), alpha=ALPHA, seed=1)
    conf.save(tmp_path / "conf")
    loaded = ppl.load_calibration(tmp_path / "conf")
    assert isinstance(loaded, ppl.Conformal) and (loaded.threshold, loaded.temperature) == (conf.threshold, conf.temperature)
    assert loaded.coverage(test, seed=2) == conf.coverage(test, seed=2)
    # the folder is an ordinary run too; saving the posterior again drops the calibration with it
    assert ppl.load(tmp_path / "conf").method == "map"
    post.save(tmp_path / "conf")
    with pytest.raises(ppl.RunError, match="holds no calibration.*ppl calibrate"):
        ppl.load_calibration(tmp_path / "conf")


@pytest.mark.parametrize("field, value", [("threshold", float("inf")), ("alpha", 1.5), ("score", "residual"),
                                          ("task", "regression"), ("kind", "platt"), ("extra", 1)])
def test_an_edited_calibration_is_refused_naming_the_field(blobs, tmp_path, field, value):
    from ppl._calibrate import CALIBRATION_FILE, calibration_record
    from ppl.io.store import add_run_files

    post, cal, _ = blobs
    conf = ppl.conformal(post, cal, alpha=ALPHA, seed=1)
    conf.save(tmp_path / "run")
    record = calibration_record(conf)
    record[field] = value
    # written through the run's own writer, so the checksum matches and the field check is what refuses it
    add_run_files(tmp_path / "run", {CALIBRATION_FILE: record})
    with pytest.raises(ppl.RunError, match=rf"calibration.json: .*'?{field if field != 'extra' else 'unexpected'}"):
        ppl.load_calibration(tmp_path / "run")


def test_cli_calibrate_saves_into_the_run_and_predict_and_show_use_it(tmp_path, monkeypatch, capsys):
    from ppl.cli import main

    rng = np.random.default_rng(3)

    def rows(n):
        X = rng.normal(size=(n, 2)) * [10.0, 1.0] + [50.0, -3.0]
        label = np.where(0.3 * (X[:, 0] - 50.0) + (X[:, 1] + 3.0) + rng.normal(0, 1.5, n) > 0, "yes", "no")
        return "x1,x2,answer\n" + "\n".join(f"{a:.4f},{b:.4f},{c}" for (a, b), c in zip(X, label))

    for name, n in (("train", 300), ("cal", 400), ("new", 300)):
        (tmp_path / f"{name}.csv").write_text(rows(n))
    monkeypatch.chdir(tmp_path)
    assert main(["fit", "--model", "logistic", "--data", "train.csv", "--target", "answer", "--method", "map",
                 "--out", "run", "--no-progress"]) == 0
    # figures that ppl show writes into the run belong to it: calibrate keeps them, a second --plots replaces them
    for _ in range(2):
        assert main(["show", "run", "--plots"]) == 0
    assert {"loss.png", "predictive.png"} <= {p.name for p in (tmp_path / "run").iterdir()}
    before = {p.name for p in (tmp_path / "run").iterdir()}
    capsys.readouterr()
    assert main(["calibrate", "run", "--data", "cal.csv", "--alpha", "0.2", "--seed", "4"]) == 0
    said = capsys.readouterr().out
    assert "200 fit the temperature, 200 the conformal threshold" in said and "saved to run/calibration.json" in said
    # the run keeps every file the fit wrote (the invocation and the summary of test metrics)
    assert {p.name for p in (tmp_path / "run").iterdir()} == before | {"calibration.json"}
    # what the command saved is what the API computes from the same rows and seed
    post = ppl.load(tmp_path / "run")
    data = ppl.datasets.load_file(tmp_path / "train.csv", target="answer", seed=0)
    cal_rows = ppl.datasets.read_rows(tmp_path / "cal.csv", num_features=2, features=["x1", "x2"], target="answer",
                                      classes=["no", "yes"])
    Xc, yc = (cal_rows[0] - data.input_mean) / data.input_std, cal_rows[1].astype(int)
    order = np.random.default_rng(4).permutation(400)
    cal = ppl.calibrate(post, (Xc[order[:200]], yc[order[:200]]), seed=4)
    conf = ppl.conformal(cal, (Xc[order[200:]], yc[order[200:]]), alpha=0.2, seed=4)
    saved = ppl.load_calibration(tmp_path / "run")
    assert saved.temperature == pytest.approx(conf.temperature, rel=1e-5)
    assert saved.threshold == pytest.approx(conf.threshold, rel=1e-5)
    assert main(["predict", "run", "--data", "new.csv", "--out", "p.csv"]) == 0
    said = capsys.readouterr().out
    assert "calibrated as ppl calibrate saved it" in said and "conformal sets (target coverage 0.8): coverage" in said
    header, *lines = (tmp_path / "p.csv").read_text().splitlines()
    assert "conformal_set" in header.split(",")
    sets = [line.split(",")[header.split(",").index("conformal_set")] for line in lines]
    assert set(sets) <= {"", "no", "yes", "no|yes"} and len(lines) == 300
    assert main(["predict", "run", "--data", "new.csv", "--out", "raw.csv", "--uncalibrated", "--keep-columns", "x2"]) == 0
    assert (tmp_path / "raw.csv").read_text().splitlines()[1].split(",")[0] == (tmp_path / "new.csv").read_text().splitlines()[1].split(",")[1]
    assert "conformal_set" not in (tmp_path / "raw.csv").read_text().splitlines()[0]
    assert main(["show", "run"]) == 0
    assert "calibration (ppl calibrate; ppl predict applies it): Split conformal prediction sets" in capsys.readouterr().out
    # every documented combination of calibrate's options, each followed by predict (a temperature
    # alone once crashed predict: it was read as a conformal calibration without an alpha)
    for options in ([], ["--no-temperature", "--alpha", "0.1"], ["--alpha", "0.2", "--score", "lac"]):
        assert main(["calibrate", "run", "--data", "cal.csv", "--seed", "4", *options]) == 0
        capsys.readouterr()
        assert main(["predict", "run", "--data", "new.csv", "--out", "c.csv"]) == 0, options
        said = capsys.readouterr().out
        header, *lines = (tmp_path / "c.csv").read_text().splitlines()
        assert ("conformal_set" in header.split(",")) == ("--alpha" in options) and len(lines) == 300
        assert ("conformal sets (target coverage" in said) == ("--alpha" in options)
    # what cannot be calibrated says why and what to do instead
    capsys.readouterr()
    assert main(["calibrate", "run", "--data", "breast_cancer"]) == 2
    assert "must stay unseen" in capsys.readouterr().err
    assert main(["calibrate", "run", "--data", "new.csv", "--no-temperature"]) == 2
    assert "give --alpha" in capsys.readouterr().err
    assert main(["predict", "run", "--data", "new.csv", "--num-samples", "5"]) == 2
    assert "--uncalibrated" in capsys.readouterr().err


def test_cli_calibrate_then_predict_for_a_regression_run(tmp_path, monkeypatch, capsys):
    # every documented regression combination, each followed by predict: conformal intervals when an
    # alpha is given; without one there is nothing to calibrate (no temperature), said with what to do
    from ppl.cli import main

    rng = np.random.default_rng(0)
    for name, n in (("train", 200), ("cal", 200), ("new", 100)):
        X = rng.normal(size=(n, 2))
        y = X @ [1.5, -2.0] + 0.5 * rng.normal(size=n)
        (tmp_path / f"{name}.csv").write_text("a,b,y\n" + "\n".join(f"{p:.4f},{q:.4f},{t:.4f}" for (p, q), t in zip(X, y)))
    monkeypatch.chdir(tmp_path)
    assert main(["fit", "--model", "linear", "--data", "train.csv", "--target", "y", "--method", "map", "--out", "run",
                 "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["calibrate", "run", "--data", "cal.csv", "--seed", "4"]) == 2
    assert "a regression run has no temperature to fit; give --alpha" in capsys.readouterr().err
    for options in (["--alpha", "0.1"], ["--alpha", "0.2", "--score", "residual"], ["--no-temperature", "--alpha", "0.1"]):
        assert main(["calibrate", "run", "--data", "cal.csv", "--seed", "4", *options]) == 0, options
        assert main(["predict", "run", "--data", "new.csv", "--out", "p.csv"]) == 0, options
        header, *lines = (tmp_path / "p.csv").read_text().splitlines()
        columns = header.split(",")
        assert {"conformal_lower", "conformal_upper"} <= set(columns) and len(lines) == 100
        low, high = (np.array([float(line.split(",")[columns.index(c)]) for line in lines])
                     for c in ("conformal_lower", "conformal_upper"))
        assert np.all(high > low)
        capsys.readouterr()


@pytest.mark.parametrize("where", ["fitting", "saving"])
def test_cli_calibrate_stopped_by_ctrl_c_leaves_the_run_as_it_was(tmp_path, monkeypatch, capsys, where):
    # Ctrl-C while the conformal threshold is fitted, or while the run is staged with its new
    # file: exit 130, and the run folder holds the same bytes as before (no calibration.json, no
    # staging folder left beside it).
    from ppl.io import store
    from ppl.cli import main

    rng = np.random.default_rng(5)
    for name, n in (("train", 200), ("cal", 200)):
        X = rng.normal(size=(n, 2))
        y = (X[:, 0] + rng.normal(0, 1.0, n) > 0).astype(int)
        (tmp_path / f"{name}.csv").write_text("a,b,y\n" + "\n".join(f"{p:.4f},{q:.4f},{c}" for (p, q), c in zip(X, y)))
    monkeypatch.chdir(tmp_path)
    assert main(["fit", "--model", "logistic", "--data", "train.csv", "--target", "y", "--method", "map",
                 "--out", "run", "--no-progress"]) == 0
    before = {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()}
    capsys.readouterr()

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    if where == "fitting":
        monkeypatch.setattr(ppl, "conformal", interrupted)
    else:
        real_dump = store._dump
        monkeypatch.setattr(store, "_dump", lambda obj: interrupted() if "format" not in obj else real_dump(obj))
    assert main(["calibrate", "run", "--data", "cal.csv", "--alpha", "0.2"]) == 130
    assert "interrupted" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".run.new-")) == []
    monkeypatch.undo()
    assert ppl.load(tmp_path / "run").method == "map"
