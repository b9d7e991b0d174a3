"""What the user reads: the verdict line, what ran, runs that never overwrite each other, K-fold
cross-validation, and the small things users hit (issue: "What the user reads")."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import warnings

import numpy as np
import pytest

from ppl.core.results import Check, Diagnostics
from ppl.models import BNN
import ppl


def _ppl(*args, cwd, timeout=600):
    """The console entry point in a fresh process, stdout not a terminal."""
    return subprocess.run([sys.executable, "-m", "ppl.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


# -- the verdict ---------------------------------------------------------------------------------
@pytest.mark.slow  # moved out of the default run to keep it under 15 minutes; CI runs it in the slow step
def test_the_verdict_names_the_deciding_figure_and_what_to_try(linear_model, linear_data):
    post = ppl.fit(linear_model, linear_data.train, method="svi", seed=0, guide="mean_field", steps=300)
    diag = post.diagnostics()
    assert not diag.ok and diag.failed[0].field == "khat"
    verdict = diag.verdict()
    assert verdict.startswith("verdict: NOT trustworthy — PSIS k-hat")
    assert "guide='full_rank'" in verdict and "method='nuts'" in verdict
    # the value and the threshold are told apart, however close
    shown = verdict.split("PSIS k-hat ")[1].split(":")[0]
    value, threshold = (float(x) for x in shown.split(" > "))
    assert value > threshold
    good = ppl.fit(linear_model, linear_data.train, method="nuts", seed=0).diagnostics()
    assert good.ok and good.verdict().startswith("verdict: trustworthy — function-space R-hat")
    assert str(good).splitlines()[-1] == good.verdict()


def test_ok_and_the_warnings_never_contradict_each_other():
    # an unreliable PSIS-LOO beside ok True is explained in the verdict itself, with a remedy that exists
    record = Diagnostics(method="nuts", num_chains=4, num_draws=100, loo_khat_bad=265,
                         checks=[Check("rhat_max", 1.002, 1.01, True, "")])
    verdict = record.verdict(held_out="test NLL 0.0912 per point")
    assert "trustworthy" in verdict and "265 observation(s)" in verdict
    assert "not the posterior" in verdict and "ppl.kfold" in verdict and "test NLL 0.0912" in verdict
    assert callable(ppl.kfold)
    failed = Diagnostics(method="svi", num_chains=1, num_draws=100, ok=False,
                         checks=[Check("khat", 1.53, 0.7, False, "k-hat 1.53 > 0.70: far — try nuts"),
                                 Check("status.converged", False, None, False, "did not converge — raise steps")])
    assert failed.verdict() == "verdict: NOT trustworthy — k-hat 1.53 > 0.70: far — try nuts (and 1 more failed check(s), listed above)"


def test_a_passed_two_sided_check_names_the_bound_on_its_value_s_side():
    # the sd ratio and the held-out coverage store the bound on the value's side; the verdict read
    # "PSIS sd ratio 0.95 within 0.70"
    record = Diagnostics(method="laplace", num_chains=1, num_draws=1000, checks=[
        Check("psis_sd_ratio", 0.95, 0.70, True, ""), Check("psis_sd_ratio", 1.2, 1.43, True, ""),
        Check("heldout_coverage_90", 0.84, 0.786, True, ""), Check("heldout_coverage_90", 0.95, 0.99, True, ""),
    ])
    assert record.verdict() == (
        "verdict: trustworthy — PSIS sd ratio 0.95 (≥ 0.70), PSIS sd ratio 1.20 (≤ 1.43), held-out 90% coverage "
        "0.840 (≥ 0.786), held-out 90% coverage 0.950 (≤ 0.990)"
    )


def test_the_record_s_values_share_one_column():
    # heldout_baseline_ll, one character longer than the old width, pushed its value out of line
    record = Diagnostics(method="map", num_chains=1, num_draws=1, heldout_ll=-0.06, heldout_baseline_ll=-0.70,
                         checks=[Check("heldout_ll", -0.06, -0.70, True, "")])
    rows = [row for row in record.table().splitlines()[1:] if row.startswith("  ") and not row.startswith("  [")]
    starts = {len(row) - len(row[2:].split(" ", 1)[1].lstrip()) for row in rows}
    assert len(rows) > 20 and len(starts) == 1, rows


def test_a_note_shared_by_several_fields_is_written_once(linear_model, linear_data):
    text = ppl.fit(linear_model, linear_data.train, method="exact", seed=0).diagnostics().table()
    note = "draws are independent samples from the fitted approximation q, not Markov chains"
    assert text.count(note) == 1 and text.count("[1]") == 5  # four fields and the note itself


# -- what ran, and the output without a terminal --------------------------------------------------
@pytest.mark.slow  # moved out of the default run to keep it under 15 minutes; CI runs it in the slow step
def test_fit_without_a_terminal_says_what_ran_and_ends_with_the_verdict(tmp_path):
    done = _ppl("fit", "--model", "bnn", "--data", "iris", "--method", "map", "--set", "hidden=4", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    # no progress bars without a terminal (and never on stdout)
    assert lines[0] == "what ran:" and "━" not in done.stdout + done.stderr
    assert lines[-1].startswith("verdict: ")
    assert lines[-2] == "saved to runs/iris-bnn-map-seed0"
    text = done.stdout
    assert "model     BNN(hidden=(4,), activation='relu', likelihood='categorical', prior_scale=1.0" in text
    assert "data      iris: 120 training rows, 30 test rows" in text
    assert "method    map(steps=2000" in text and "seed      0" in text
    assert "optimizer='lbfgs' (from 'auto')" in text  # what the run chose, not only what was asked
    assert "jax " in text and "numpyro " in text and "python " in text
    assert "note: for a BNN classifier PSIS-LOO is unreliable" in text  # said up front
    # no line is wrapped mid-sentence: every warning and note is one line
    assert all(not line.startswith(" " * 20) for line in lines)
    saved = json.loads((tmp_path / "runs/iris-bnn-map-seed0/posterior.json").read_text())
    assert saved["provenance"]["data"]["source"] == "iris" and saved["provenance"]["versions"]["jax"]
    shown = _ppl("show", "runs/iris-bnn-map-seed0/summary.json", cwd=tmp_path)  # a file inside the run
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[-1] == lines[-1]
    assert "model     BNN(hidden=(4,)" in shown.stdout and "optimizer='lbfgs' (from 'auto')" in shown.stdout


def test_what_ran_names_the_choices_a_method_resolved():
    from ppl.cli._common import what_ran

    lines = what_ran("laplace", {"subset": "auto", "hessian": "auto", "rank": 20, "batch_size": None}, 0, {},
                      {"subset": "last_layer", "hessian": "full", "rank": 5})
    method = next(line for line in lines if line.startswith("  method"))
    assert method == "  method    laplace(subset='last_layer' (from 'auto'), hessian='full' (from 'auto'), rank=20, batch_size=None)"
    # a tuned prior (one precision per layer) and a resolved start are shown too; a long array is not
    lines = what_ran("laplace", {"prior_precision": "auto", "init": "auto", "subset": "auto"}, 0, {},
                     {"prior_precision": [1.0, 17.728609761827464], "init": "pretrained", "subset": list(range(20))})
    method = next(line for line in lines if line.startswith("  method"))
    assert method == ("  method    laplace(prior_precision=[1, 17.73] (from 'auto'), init='pretrained' (from 'auto'), "
                      "subset='auto')")


# -- runs never overwrite each other ---------------------------------------------------------------
@pytest.mark.slow  # moved out of the default run to keep it under 15 minutes; CI runs it in the slow step
def test_runs_never_overwrite_each_other_and_get_the_usual_permissions(tmp_path):
    args = ("fit", "--model", "linear", "--data", "linear", "--method", "exact", "--no-progress")
    old = os.umask(0o022)
    try:
        for _ in range(2):
            assert _ppl(*args, cwd=tmp_path).returncode == 0
    finally:
        os.umask(old)
    runs = sorted(p.name for p in (tmp_path / "runs").iterdir() if not p.name.startswith("."))
    assert runs == ["linear-linear-exact-seed0", "linear-linear-exact-seed0-2"]
    folder = tmp_path / "runs" / runs[0]
    assert stat.S_IMODE(folder.stat().st_mode) == 0o755
    assert {stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()} == {0o644}
    before = (folder / "arrays.npz").read_bytes()
    refused = _ppl(*args, "--out", str(folder), "--seed", "1", cwd=tmp_path)
    assert refused.returncode == 2 and "already holds a run" in refused.stderr and "--force" in refused.stderr
    assert (folder / "arrays.npz").read_bytes() == before
    forced = _ppl(*args, "--out", str(folder), "--seed", "1", "--force", cwd=tmp_path)
    assert forced.returncode == 0 and (folder / "arrays.npz").read_bytes() != before


# -- K-fold cross-validation -----------------------------------------------------------------------
def _closed_form_loo(X, y, noise_sd, prior_sd):
    """Σᵢ log p(yᵢ | xᵢ, D₋ᵢ) of conjugate Bayesian linear regression with a bias, exactly."""
    design = np.c_[X, np.ones(len(X))]
    total = 0.0
    for i in range(len(X)):
        keep = np.arange(len(X)) != i
        precision = design[keep].T @ design[keep] / noise_sd**2 + np.eye(design.shape[1]) / prior_sd**2
        cov = np.linalg.inv(precision)
        mean = cov @ design[keep].T @ y[keep] / noise_sd**2
        var = design[i] @ cov @ design[i] + noise_sd**2
        total += -0.5 * ((y[i] - design[i] @ mean) ** 2 / var + np.log(2 * np.pi * var))
    return total


def test_kfold_with_k_equal_n_is_exact_leave_one_out(linear_model, linear_data):
    X, y = (np.asarray(a) for a in linear_data.train)
    truth = _closed_form_loo(X, y, linear_model.noise_scale, linear_model.prior_scale)
    cv = ppl.kfold(linear_model, linear_data.train, method="exact", k=len(X), seed=0, mode="linearized")
    assert abs(cv.elpd - truth) < 0.01, (cv.elpd, truth)
    assert cv.se > 0 and np.isclose(cv.se, np.sqrt(len(X) * cv.pointwise.var()))
    assert sorted(np.bincount(cv.fold)) == [1] * len(X) and all(cv.fits_ok)
    assert "elpd_kfold" in str(cv)


def test_kfold_deals_near_equal_folds_and_refuses_bad_k(linear_model, linear_data):
    cv = ppl.kfold(linear_model, linear_data.train, method="exact", k=3, seed=0)
    assert sorted(np.bincount(cv.fold)) in ([26, 27, 27],)
    with pytest.raises(ppl.OptionError, match=r"k must be an integer in 2\.\.80"):
        ppl.kfold(linear_model, linear_data.train, method="exact", k=1, seed=0)
    with pytest.raises(ppl.OptionError, match="declarative model"):
        ppl.kfold(lambda: None, {"x": 1}, method="nuts", seed=0)


# -- small things --------------------------------------------------------------------------------
def test_version_and_the_model_options_in_methods(tmp_path):
    version = _ppl("--version", cwd=tmp_path)
    assert version.returncode == 0 and version.stdout.strip() == f"ppl {ppl.__version__}"
    listed = _ppl("methods", cwd=tmp_path).stdout
    assert "models (--model NAME" in listed and "hidden = (50,)" in listed and "activation = 'relu'" in listed


def test_progress_bar_is_public_and_checked(linear_model, linear_data):
    post = ppl.fit(linear_model, linear_data.train, method="map", seed=0, progress_bar=False)
    assert post.status.converged
    with pytest.raises(ppl.OptionError, match="progress_bar must be True, False or None"):
        ppl.fit(linear_model, linear_data.train, method="map", seed=0, progress_bar="yes")


def test_progress_lines_say_compiling_then_count_when_output_is_not_a_terminal(monkeypatch, capsys):
    """Without a terminal, a long fit is not silent: a line every HEARTBEAT_S seconds, "compiling"
    until the first chunk reports, then the phase's count; a short one prints nothing."""
    import time

    from ppl.core import progress
    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.05)
    with progress.task("nuts warmup", 500, ("nuts sampling", 1000), mode="lines"):
        time.sleep(0.2)  # compiling: nothing reported yet
        progress.advance(500, 0)
        progress.advance(300, 1)
        time.sleep(0.2)
    err = capsys.readouterr()
    lines = err.err.splitlines()
    assert lines[0].startswith("  nuts warmup: compiling, ") and lines[0].endswith(" s")
    assert lines[-1].startswith("  nuts sampling: 300/1000, ") and not err.out
    monkeypatch.setattr(progress, "HEARTBEAT_S", 10.0)
    with progress.task("map", 100, mode="lines"):
        progress.advance(100)
    assert capsys.readouterr().err == ""


def test_a_runs_progress_setting_reaches_the_loops_inside_a_method(monkeypatch, capsys, linear_data):
    """progress_bar travels with the run's context to every loop, the MAP inside laplace's tuning
    included: the process's default ("lines", as the command line sets it) applies only without one."""
    from ppl.core import progress

    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.001)
    monkeypatch.setitem(progress._STATE, "enabled", "lines")
    model = ppl.models.BNN(hidden=(3,))
    ppl.fit(model, linear_data.train, method="laplace", seed=0, steps=200, progress_bar=False)
    assert capsys.readouterr().err == ""
    ppl.fit(model, linear_data.train, method="laplace", seed=0, steps=200)
    assert "  map: " in capsys.readouterr().err  # the MAP inside laplace reports as "map"


# -- prediction on new data ------------------------------------------------------------------------
@pytest.mark.slow  # moved out of the default run to keep it under 15 minutes; CI runs it in the slow step
def test_predict_raw_csv_rows_as_training_prepared_them(tmp_path):
    rng = np.random.default_rng(0)
    n = 120
    x1, x2 = rng.normal(50.0, 10.0, n), rng.normal(-3.0, 0.5, n)  # far from standardised
    label = np.where(0.1 * (x1 - 50.0) + 2.0 * (x2 + 3.0) + rng.normal(0, 0.5, n) > 0, "yes", "no")
    rows = [f"{a:.4f},{b:.4f},{c}" for a, b, c in zip(x1, x2, label)]
    (tmp_path / "train.csv").write_text("x1,x2,answer\n" + "\n".join(rows))
    # new rows: columns in another order, no target, one extra column that is ignored
    (tmp_path / "new.csv").write_text("note,x2,x1\n" + "\n".join(f"7,{b:.4f},{a:.4f}" for a, b in zip(x1[:5], x2[:5])))
    fitted = _ppl("fit", "--model", "logistic", "--data", "train.csv", "--target", "answer", "--method", "laplace",
                  "--out", "run", "--no-progress", cwd=tmp_path)
    assert fitted.returncode == 0, fitted.stderr
    done = _ppl("predict", "run", "--data", "new.csv", "--out", "preds.csv", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    header, *lines = (tmp_path / "preds.csv").read_text().splitlines()
    assert header.split(",") == ["p_no", "p_yes", "predicted", "entropy", "aleatoric", "epistemic"]
    probs = np.array([[float(v) for v in line.split(",")[:2]] for line in lines])
    # the same rows prepared by hand with the training split's statistics give the same probabilities
    data = ppl.datasets.load_file(tmp_path / "train.csv", target="answer", seed=0)
    post = ppl.load(tmp_path / "run")
    raw = np.round(np.c_[x1[:5], x2[:5]], 4)  # as written to the file
    expected = post.predict((raw - data.input_mean) / data.input_std, seed=0).probs
    # (the command ran in float32, this process runs float64; the CSV keeps 6 digits)
    np.testing.assert_allclose(probs, expected, rtol=1e-4, atol=1e-6)
    assert [line.split(",")[2] for line in lines] == [["no", "yes"][i] for i in expected.argmax(axis=1)]
    # columns of the file copied in front of the predictions, verbatim, to join them back
    kept = _ppl("predict", "run", "--data", "new.csv", "--out", "kept.csv", "--keep-columns", "note,x1", cwd=tmp_path)
    assert kept.returncode == 0, kept.stderr
    header, *copied = (tmp_path / "kept.csv").read_text().splitlines()
    assert header.split(",")[:3] == ["note", "x1", "p_no"] and [r.split(",")[:2] for r in copied] == [
        ["7", f"{a:.4f}"] for a in x1[:5]]
    assert "did you mean 'note'" in _ppl("predict", "run", "--data", "new.csv", "--keep-columns", "nte", cwd=tmp_path).stderr
    # rows with the target column are scored too; a label training never saw is an error
    (tmp_path / "scored.csv").write_text("x1,x2,answer\n" + "\n".join(rows[:10]))
    scored = _ppl("predict", "run", "--data", "scored.csv", cwd=tmp_path)
    assert scored.returncode == 0 and "log_predictive" in scored.stdout.splitlines()[0] and "accuracy" in scored.stderr
    (tmp_path / "odd.csv").write_text("x1,x2,answer\n1,2,maybe")
    odd = _ppl("predict", "run", "--data", "odd.csv", cwd=tmp_path)
    assert odd.returncode == 2 and "'maybe'" in odd.stderr and "training classes" in odd.stderr


@pytest.mark.slow  # moved out of the default run to keep it under 15 minutes; CI runs it in the slow step
def test_predict_reports_regression_in_the_target_s_own_units(tmp_path):
    fitted = _ppl("fit", "--model", "linear", "--data", "diabetes", "--method", "exact", "--out", "run", "--no-progress",
                  cwd=tmp_path)
    assert fitted.returncode == 0, fitted.stderr
    done = _ppl("predict", "run", "--data", "diabetes", "--out", "p.csv", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    header, *lines = (tmp_path / "p.csv").read_text().splitlines()
    assert header.split(",")[:4] == ["mean", "sd", "lower_90", "upper_90"]
    table = np.array([[float(v) for v in line.split(",")] for line in lines])
    data = ppl.datasets.load("diabetes", seed=0)
    raw_y = np.asarray(data.test.y) * data.target_std + data.target_mean
    assert abs(table[:, 0].mean() - raw_y.mean()) < 0.3 * raw_y.std()  # raw units (~150), not standardised (~0)
    assert np.all(table[:, 2] < table[:, 0]) and np.all(table[:, 0] < table[:, 3])
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())["metrics"]
    # the same test rows scored by ppl fit (standardised units) and by ppl predict (raw units)
    nll = float(done.stdout.split("nll ")[1].split(" ")[0])
    assert abs(nll - (summary["nll"] + np.log(data.target_std))) < 0.02
    coverage = float(done.stdout.split("intervals ")[1].split()[0])
    assert abs(coverage - summary["coverage_90"]) < 0.03


# -- plots from the export -------------------------------------------------------------------------
def test_the_export_has_a_posterior_predictive_and_ensembles_export_without_warnings(linear_model, linear_data):
    import warnings

    post = ppl.fit(linear_model, linear_data.train, method="nuts", seed=0, num_warmup=200, num_samples=200,
                   time_budget=0)
    idata = post.to_arviz()
    replicates = idata.posterior_predictive["y"].values
    assert replicates.shape == (4, 200, 80) and idata.observed_data["y"].shape == (80,)
    # replicates spread like the data: their sd per point is the predictive sd (noise 0.5 and more)
    assert 0.5 < float(replicates.std(axis=(0, 1)).mean()) < 0.6
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # ArviZ's "more chains than draws" would be one
        members = ppl.fit(linear_model, linear_data.train, method="ensemble", seed=0).to_arviz()
    assert members.posterior["w"].shape == (1, 5, 3)  # the members as the draws of one chain
    assert "do not apply" in members.posterior.attrs["ppl_draws"]


def test_independent_draws_export_as_chains_that_arviz_summarises_cleanly(linear_model, linear_data, caplog):
    import logging
    import warnings

    import arviz as az

    post = ppl.fit(linear_model, linear_data.train, method="exact", seed=0)  # 1000 independent draws
    idata = post.to_arviz()
    assert idata.posterior["w"].shape == (4, 250, 3)
    np.testing.assert_array_equal(idata.posterior["w"].values.reshape(1000, 3), post.draws["w"].reshape(1000, 3))
    assert "R-hat of independent draws is 1 by construction" in idata.posterior.attrs["ppl_draws"]
    with warnings.catch_warnings(), caplog.at_level(logging.WARNING):
        warnings.simplefilter("error")
        summary = az.summary(idata)
    assert not [r for r in caplog.records if "Shape validation" in r.getMessage()]
    assert np.all(np.isfinite(summary["r_hat"])) and np.all(summary["ess_bulk"] > 500)
    # an ensemble's members are no chains: the summary its export names is clean, and holds their spread
    members = ppl.fit(linear_model, linear_data.train, method="ensemble", seed=0)
    export = members.to_arviz()
    assert "az.summary(data, kind='stats')" in export.posterior.attrs["ppl_draws"]
    caplog.clear()
    with warnings.catch_warnings(), caplog.at_level(logging.WARNING):
        warnings.simplefilter("error")
        stats = az.summary(export, kind="stats", round_to="none")
    assert not caplog.records and "r_hat" not in stats.columns
    np.testing.assert_allclose(stats.loc["w[0]", "mean"], np.mean(members.draws["w"][..., 0]), rtol=1e-9)


@pytest.mark.slow  # moved out of the default run to keep it under 15 minutes; CI runs it in the slow step
def test_show_plots_writes_the_figures_that_apply(tmp_path):
    for method, extra in (("nuts", ["--set", "num_warmup=100", "--set", "num_samples=100"]), ("svi", ["--set", "steps=300"])):
        done = _ppl("fit", "--model", "bnn", "--data", "sinusoid", "--method", method, "--set", "hidden=8", *extra,
                    "--out", method, "--no-progress", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        shown = _ppl("show", method, "--plots", cwd=tmp_path)
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.splitlines()[-1].startswith("verdict: ")
        expected = {"nuts": ["trace.png", "rank.png", "predictive.png"], "svi": ["loss.png", "predictive.png"]}[method]
        for name in expected:
            assert f"{method}/{name}" in shown.stdout
            assert (tmp_path / method / name).read_bytes().startswith(b"\x89PNG")
        assert ppl.load(tmp_path / method).method == method  # the figures beside the run do not disturb it


@pytest.mark.parametrize("argv, suggestion", [
    (["fit", "--model", "bnn", "--data", "two_moon"], "two_moons"),
    (["fit", "--model", "bnn", "--data", "two_moons", "--method", "nust"], "nuts"),
    (["fit", "--model", "bnm", "--data", "two_moons"], "bnn"),
    (["fitt"], "fit"),
    (["fit", "--model", "bnn", "--data", "two_moons", "--method", "map", "--set", "stesp=3"], "steps"),
    (["compare", "--set", "hiden=3"], "hidden"),
    (["compare", "--set", "nuts.num_chain=2"], "num_chains"),
    (["compare", "--methods", "map,lapalce"], "laplace"),
    (["fit", "--model", "bnn", "--data", "two_moons", "--methdo", "map"], "--method"),
    (["compare", "--methds", "map"], "--methods"),
])
def test_a_misspelt_name_gets_a_suggestion_beside_the_valid_ones(argv, suggestion, capsys, tmp_path, monkeypatch):
    from ppl.cli import main

    monkeypatch.chdir(tmp_path)
    try:
        status = main(argv)
    except SystemExit as stop:  # argparse's own errors
        status = stop.code
    assert status == 2 and not any(tmp_path.iterdir())
    assert f"(did you mean {suggestion!r}?)" in capsys.readouterr().err


def test_the_python_api_suggests_too():
    from ppl.core.errors import DataError, OptionError
    from ppl.models import BNN

    with pytest.raises(DataError, match=r"did you mean 'two_moons'\?"):
        ppl.datasets.load("two_moon", seed=0)
    with pytest.raises(OptionError, match=r"did you mean 'nuts'\?"):
        ppl.fit(BNN(), (np.zeros((4, 2)), np.zeros(4)), method="nust", seed=0)
    with pytest.raises(OptionError, match=r"did you mean 'kfac'\?"):
        ppl.fit(BNN(), (np.zeros((4, 2)), np.zeros(4)), method="laplace", seed=0, hessian="kfak")
    with pytest.raises(OptionError, match=r"did you mean 'hessian'\?"):
        ppl.fit(BNN(), (np.zeros((4, 2)), np.zeros(4)), method="laplace", seed=0, hesian="full")


def test_class_labels_fitted_by_a_regression_likelihood_are_warned_about():
    # BNN()'s likelihood is Gaussian: 0/1 integer labels would be fitted as numbers in silence
    data = ppl.datasets.load("two_moons", seed=0)
    X, y = data.train
    with pytest.warns(UserWarning, match=r"integers 0\.\.1, which look like class labels.*likelihood='bernoulli'"):
        ppl.fit(BNN(hidden=(4,)), (X[:40], np.asarray(y[:40], dtype=int)), method="map", seed=0, steps=50)
    # float targets, labels declared as such, and integer targets that are not 0..K-1 are left alone
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ppl.fit(BNN(hidden=(4,)), (X[:40], np.asarray(y[:40], dtype=float)), method="map", seed=0, steps=50)
        ppl.fit(BNN(hidden=(4,), likelihood="bernoulli"), (X[:40], np.asarray(y[:40], dtype=int)), method="map",
                seed=0, steps=50)
        ppl.fit(BNN(hidden=(4,)), (X[:40], np.arange(40) % 5 + 3), method="map", seed=0, steps=50)


def test_the_loss_figure_shows_the_whole_descent_and_marks_the_method_s_own_rounds(tmp_path, linear_data):
    import matplotlib

    matplotlib.use("Agg")
    from ppl.core.records import TrainingTrace
    from ppl.diagnostics import plots

    def axes_of(post, name):
        figures = []
        original = plots._save
        plots._save = lambda figure, path: figures.append(figure) or path
        try:
            plots.loss_figure(post, tmp_path / name)
        finally:
            plots._save = original
        return figures[0].axes[0]

    post = ppl.fit(ppl.models.LinearRegression(), linear_data.train, method="map", seed=0, steps=10, max_steps=50)
    post = post.replace(trace=TrainingTrace(losses=100.0 + np.exp(-np.arange(45) / 5.0)))  # a descent of 1e-4 on a loss of 100
    axes = axes_of(post, "map.png")
    assert axes.get_yscale() == "log" and axes.yaxis.get_offset_text().get_text() == ""
    assert post.loss_label in axes.get_title()
    rounds = [line for line in axes.get_lines() if line.get_linestyle() == ":"]
    assert [float(line.get_xdata()[0]) for line in rounds] == [10.5, 20.5, 30.5, 40.5]
    # SWAG's trace is one pass collecting moments: no rounds, whatever its steps (the MAP's) are
    swag = ppl.fit(ppl.models.LinearRegression(), linear_data.train, method="swag", seed=0, steps=10, swag_steps=60,
                   collect_every=5)
    assert swag.round_length is None
    assert not [line for line in axes_of(swag, "swag.png").get_lines() if line.get_linestyle() == ":"]
