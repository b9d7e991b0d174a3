"""ppl.compare, its report and ``ppl compare``."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import numpy as np
import pytest

from ppl._compare import format_table
from ppl.cli import main
from ppl.core import interrupt, progress
from ppl.diagnostics import wasserstein1
from ppl.models import LinearRegression
import ppl


@pytest.fixture(scope="module")
def linear_result():
    data = ppl.datasets.load("linear", seed=0)
    return ppl.compare(
        LinearRegression(noise_scale=0.5), data, methods=["exact", "map", "laplace", "nuts"], reference="exact", seed=0,
        options={"nuts": {"num_samples": 10**9}},  # refused for memory: a row that says why
    )


def test_rows_hold_every_method_and_the_reference_is_at_distance_zero(linear_result):
    rows = {r["method"]: r for r in linear_result.rows}
    assert list(rows) == ["exact", "map", "laplace", "nuts"]
    assert rows["exact"]["wasserstein1"] == 0.0
    # Laplace on the conjugate model is the exact posterior: its W1 to the reference is Monte Carlo error
    # only. That error's size is measured here, as the W1 between the reference and exact refits with
    # other seeds (independent draws of the same predictive; 0.007 each at seed 0), and Laplace must
    # stay within 1.5 times the largest of them; MAP, which lacks the epistemic part, lies further off.
    data = ppl.datasets.load("linear", seed=0)
    reference = linear_result.predictions["exact"]
    noise = max(
        wasserstein1(ppl.fit(LinearRegression(noise_scale=0.5), data.train, method="exact", seed=s)
                     .predict(data.test.X, seed=0), reference, seed=0)
        for s in (1, 2)
    )
    assert rows["laplace"]["wasserstein1"] < 1.5 * noise
    assert rows["map"]["wasserstein1"] > rows["laplace"]["wasserstein1"]
    assert rows["exact"]["error"] is None and rows["exact"]["ok"] is True
    assert rows["nuts"]["error"].startswith("the fit failed") and "GiB" in rows["nuts"]["error"]
    assert rows["nuts"]["nll"] is None


def test_paired_elpd_differences_come_from_the_pointwise_values(linear_result):
    exact = linear_result.posteriors["exact"].diagnostics().elpd_loo_pointwise
    laplace = linear_result.posteriors["laplace"].diagnostics().elpd_loo_pointwise
    assert exact.shape == laplace.shape == (ppl.datasets.load("linear", seed=0).train.X.shape[0],)
    diff = exact - laplace
    best, other = ("exact", "laplace") if diff.sum() >= 0 else ("laplace", "exact")
    row = linear_result.row(other)
    np.testing.assert_allclose(row["elpd_diff"], abs(diff.sum()), rtol=1e-9)
    np.testing.assert_allclose(row["elpd_diff_se"], np.sqrt(diff.size * diff.var()), rtol=1e-9)
    assert linear_result.row(best)["elpd_diff"] == 0.0
    # MAP is a point: no LOO, so it takes no part in the paired comparison
    assert linear_result.row("map")["elpd_diff"] is None


def test_table_names_the_failure_and_the_reference(linear_result):
    text = linear_result.table()
    assert "exact (ref)" in text
    assert re.search(r"nuts: the fit failed: .*GiB", text)
    assert "W1" in text
    # the opening reading for a newcomer: who passed, who is flagged and why in a word, who failed
    reading = " ".join(text.split("\n\n")[1].split())
    assert reading.startswith("In short: 3 of 4 methods pass their own checks and can be trusted here (exact, map, laplace).")
    assert reading.endswith("nuts failed to run (the error is below).")
    record = linear_result.to_dict()
    flagged = next(r for r in record["rows"] if r["method"] == "laplace")
    flagged.update(ok=False, failed_checks=["khat", "dispersion_min"], problems=["k-hat 2.8 > 0.7", "narrow"])
    reading = " ".join(format_table(record).split("\n\n")[1].split())
    assert "2 of 4 methods pass" in reading
    assert "1 is flagged, each for a measured reason given below the tables (laplace — k-hat:" in reading


def test_an_interrupted_comparison_continues_from_its_fits_folder(monkeypatch, tmp_path):
    data = ppl.datasets.load("linear", seed=0)
    model = LinearRegression(noise_scale=0.5)
    nuts = dict(num_warmup=60, num_samples=80, num_chains=2)
    settings = dict(methods=["map", "nuts"], reference="exact", seed=0, options={"nuts": nuts})
    whole = ppl.compare(model, data, **settings)

    # Ctrl-C (its first SIGINT's effect) in the middle of the NUTS chains, after exact and map ended.
    monkeypatch.setattr(interrupt.ChunkPace, "next_chunk", lambda self: 10)
    real, armed = progress.advance, {"on": False, "reports": 0}

    def advance(steps, phase=0):
        real(steps, phase)
        armed["reports"] += armed["on"]
        if armed["reports"] == 20:
            interrupt.request()

    monkeypatch.setattr(progress, "advance", advance)
    fits = tmp_path / "fits"
    with pytest.raises(ppl.ComparisonInterrupted, match="interrupted while fitting nuts") as stop:
        ppl.compare(model, data, fits=fits, log=lambda line: armed.update(on=armed["on"] or "nuts" in line), **settings)
    monkeypatch.undo()
    assert stop.value.method == "nuts" and stop.value.finished == ["exact", "map"]
    assert ppl.load(fits / "map").status.converged and ppl.load(fits / "nuts").status.interrupted

    lines = []
    resumed = ppl.compare(model, data, fits=fits, log=lines.append, **settings)
    assert any(line.startswith("exact: the fit saved in") for line in lines)
    assert any(line.startswith("map: the fit saved in") for line in lines)
    assert any(line.startswith("continuing nuts from") for line in lines)
    np.testing.assert_array_equal(resumed.posteriors["nuts"].flat_draws, whole.posteriors["nuts"].flat_draws)
    for method in ("exact", "map", "nuts"):
        for column in ("nll", "elpd_loo", "wasserstein1"):
            assert resumed.row(method)[column] == whole.row(method)[column], (method, column)

    # A third call reuses all three; other settings are refused before anything runs, naming the change.
    assert ppl.compare(model, data, fits=fits, **settings).row("nuts")["nll"] == whole.row("nuts")["nll"]
    changed = dict(settings, options={"nuts": dict(nuts, num_samples=90)})
    with pytest.raises(ppl.ResumeError, match=r"options.num_samples: checkpoint 80, now 90"):
        ppl.compare(model, data, fits=fits, **changed)


def test_each_fit_lets_go_of_its_compiled_programs_before_the_next(monkeypatch):
    # the main job's peak memory fell from 2.1 to 1.4 GB when a finished fit's programs were dropped (and
    # from 1.54 to 1.25 GB, cold, when the freed heap was handed back too: ppl.core.cache.release_compiled)
    import jax

    cleared, fitted, real_fit = [], [], ppl.fit

    def fit(*args, method, **kwargs):
        fitted.append((method, len(cleared)))
        return real_fit(*args, method=method, **kwargs)

    monkeypatch.setattr(jax, "clear_caches", lambda: cleared.append(1))
    monkeypatch.setattr(ppl, "fit", fit)
    data = ppl.datasets.load("linear", seed=0)
    result = ppl.compare(LinearRegression(noise_scale=0.5), data, methods=["exact", "map"], reference="exact", seed=0)
    # once after each fit, before the next, and once after the scoring, before the report's grid
    assert fitted == [("exact", 0), ("map", 1)] and len(cleared) == 3
    assert [row["method"] for row in result.rows] == ["exact", "map"]


def test_each_fit_is_judged_on_the_test_rows_once_and_saved_with_them(monkeypatch, tmp_path):
    # the verdict with the test rows held out was computed twice per method (without them when the fit
    # was saved, with them when it was scored): 0.4 to 0.7 s each of the main job's 13 methods
    from ppl.core import posterior as posterior_module

    computed, real = [], posterior_module.compute_diagnostics
    monkeypatch.setattr(posterior_module, "compute_diagnostics", lambda post: computed.append(post.method) or real(post))
    data = ppl.datasets.load("linear", seed=0)
    result = ppl.compare(LinearRegression(noise_scale=0.5), data, methods=["exact", "map"], reference="exact", seed=0,
                         fits=tmp_path / "fits")
    assert sorted(computed) == ["exact", "map"]
    assert result.row("map")["ok"] and result.posteriors["map"].diagnostics().heldout_rows == len(data.test.y)
    saved = ppl.load(tmp_path / "fits" / "map")
    np.testing.assert_array_equal(saved.heldout[1], data.test.y)
    assert saved.diagnostics().heldout_ll == pytest.approx(result.posteriors["map"].diagnostics().heldout_ll, rel=1e-9)


def test_test_rows_a_fit_cannot_be_judged_on_fail_its_row_not_the_comparison(tmp_path):
    # the rows are attached right after each fit, before it is saved: rows they refuse must not stop
    # the comparison nor lose the fit
    data = ppl.datasets.load("linear", seed=0)
    y = np.array(data.test.y, dtype=float)
    y[0] = np.nan
    result = ppl.compare(LinearRegression(noise_scale=0.5), data.train, test=(data.test.X, y), methods=["exact", "map"],
                         reference="exact", seed=0, fits=tmp_path / "fits")
    for row in result.rows:
        assert row["error"].startswith("scoring failed: held-out data y has 1 non-finite values"), row
    assert ppl.load(tmp_path / "fits" / "map").status.converged


def test_the_opening_line_names_a_held_out_coverage_failure_as_such():
    from ppl._compare import _reading

    rows = [{"method": "ensemble", "error": None, "ok": False, "failed_checks": ["heldout_coverage_90"]},
            {"method": "map", "error": None, "ok": False, "failed_checks": ["heldout_ll"]}]
    text = _reading(rows)
    assert "ensemble — held-out intervals: the 90% intervals cover too few or too many test targets" in text
    assert "map — held-out data: the predictive does worse than a trivial baseline" in text


def test_unknown_method_is_refused_before_anything_is_fitted(monkeypatch):
    def no_fit(*args, **kwargs):
        raise AssertionError("nothing may be fitted")

    monkeypatch.setattr(ppl, "fit", no_fit)
    data = ppl.datasets.load("linear", seed=0)
    with pytest.raises(ppl.OptionError, match="unknown method\\(s\\) 'bogus'.*valid methods"):
        ppl.compare(LinearRegression(), data, methods=["map", "bogus"], seed=0)
    with pytest.raises(ppl.OptionError, match="has no option\\(s\\) 'steps_'"):
        ppl.compare(LinearRegression(), data, methods=["map"], reference=None, seed=0, options={"map": {"steps_": 3}})
    with pytest.raises(ppl.OptionError, match="options are given for svi"):
        ppl.compare(LinearRegression(), data, methods=["map"], reference=None, seed=0, options={"svi": {}})
    # OOD or test inputs with another number of features than the training inputs
    X, y = data.train
    with pytest.raises(ppl.DataError, match=r"the ood inputs have shape \(7, 5\).*training inputs have \(%d,\)" % X.shape[1]):
        ppl.compare(LinearRegression(), (X, y), test=data.test, ood=np.zeros((7, 5)), methods=["map"], seed=0)
    with pytest.raises(ppl.DataError, match="the test inputs have shape"):
        ppl.compare(LinearRegression(), (X, y), test=(data.test.X[:, :1], data.test.y), methods=["map"], seed=0)


@pytest.fixture(scope="module")
def moons_report(tmp_path_factory):
    """``ppl compare`` end to end on two_moons with a logistic regression: two methods, a reference
    that is not a sampler, the report written."""
    out = tmp_path_factory.mktemp("compare") / "report"
    code = main(["compare", "--model", "logistic", "--data", "two_moons", "--methods", "map,laplace,nuts",
                 "--reference", "laplace", "--set", "nuts.num_samples=300", "--set", "nuts.num_warmup=300",
                 "--set", "nuts.num_chains=2", "--out", str(out)])
    assert code == 0
    return out


def test_cli_writes_a_report_with_its_figures(moons_report, capsys):
    files = {p.name for p in moons_report.iterdir()}
    assert {"report.html", "comparison.json", "reliability.png", "selective.png", "predictive.png", "khat.png",
            "trace_nuts.png", "rank_nuts.png", "loss_map.png"} <= files
    page = (moons_report / "report.html").read_text()
    for png in (p for p in files if p.endswith(".png")):
        assert f"src='{png}'" in page
    assert "is not a Markov-chain sampler" in page  # the reference laplace is not a sampler


def test_cli_compare_hides_its_progress_lines_on_request(tmp_path, monkeypatch):
    # as ``ppl fit --no-progress`` does; the comparison's own log is still printed
    asked = []
    monkeypatch.setattr(progress, "enable", asked.append)
    argv = ["compare", "--model", "linear", "--data", "linear", "--methods", "exact", "--reference", "none"]
    assert main([*argv, "--out", str(tmp_path / "a"), "--no-progress"]) == 0
    assert main([*argv, "--out", str(tmp_path / "b")]) == 0
    assert asked == [False, "lines"]


def test_cli_refuses_bad_input_and_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["compare", "--methods", "map,bogus"]) == 2
    assert "unknown method 'bogus'" in capsys.readouterr().err
    assert main(["compare", "--set", "steps=3"]) == 2
    assert "take its name first, as in --set nuts.num_chains=2" in capsys.readouterr().err.replace("takes", "take")
    assert main(["compare", "--methods", "map", "--set", "svi.steps=3"]) == 2
    assert not any(tmp_path.iterdir())


def test_cli_comparison_stopped_by_ctrl_c_resumes_from_its_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(interrupt.ChunkPace, "next_chunk", lambda self: 10)
    real, reports = progress.advance, {"nuts": 0}

    def advance(steps, phase=0):  # Ctrl-C's first SIGINT, ten chunks into NUTS (map and exact have ended)
        real(steps, phase)
        reports["nuts"] += reports.get("armed", 0)
        if reports["nuts"] == 10:
            interrupt.request()

    monkeypatch.setattr(progress, "advance", advance)
    printed = print

    def spy(*items, **kwargs):
        if items and str(items[0]).startswith("fitting nuts"):
            reports["armed"] = 1
        printed(*items, **kwargs)

    monkeypatch.setattr("builtins.print", spy)
    command = ["compare", "--model", "linear", "--data", "linear", "--methods", "map,nuts", "--reference", "exact",
               "--set", "nuts.num_warmup=60", "--set", "nuts.num_samples=80", "--set", "nuts.num_chains=2",
               "--set", "nuts.time_budget=0", "--out", "cmp"]
    assert main(command) == 130
    err = capsys.readouterr().err
    assert "interrupted while fitting nuts" in err and "ppl compare --resume cmp" in err
    assert {p.name for p in (tmp_path / "cmp" / "fits").iterdir() if not p.name.startswith(".")} == {"exact", "map", "nuts"}
    assert not (tmp_path / "cmp" / "report.html").exists()
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)

    # the unfinished folder is neither overwritten nor continued with other settings
    assert main(command) == 2
    assert "ppl compare --resume cmp" in capsys.readouterr().err
    assert main(["compare", "--resume", "cmp", "--seed", "1"]) == 2
    assert "--seed: the run used 0, now 1" in capsys.readouterr().err

    assert main(["compare", "--resume", "cmp"]) == 0
    out = capsys.readouterr().out
    assert "exact: the fit saved in" in out and "map: the fit saved in" in out and "continuing nuts from" in out
    files = {p.name for p in (tmp_path / "cmp").iterdir()}
    assert {"report.html", "comparison.json", "invocation.json", "fits"} <= files
    assert ppl.load(tmp_path / "cmp" / "fits" / "nuts").num_draws == 80
    assert main(["compare", "--resume", "cmp"]) == 2
    assert "this comparison finished" in capsys.readouterr().err


def test_cli_split_applies_to_uci_sets_only(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["compare", "--data", "two_moons", "--split", "2"]) == 2
    assert "only the UCI sets" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse's own refusal, exit status 2
        main(["fit", "--model", "linear", "--data", "linear", "--split", "-1"])
    assert "a split number is 0 or more" in capsys.readouterr().err
    assert main(["fit", "--model", "linear", "--data", "linear", "--split", "1"]) == 2
    assert "only the UCI sets" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def test_report_renders_in_a_real_browser(moons_report, tmp_path):
    # Debian's chromium, headless: every figure of the page must load, and the screenshot must not be blank.
    browser = _chromium()
    if browser is None:
        if os.environ.get("PPL_REQUIRE_BROWSER"):
            pytest.fail("PPL_REQUIRE_BROWSER is set but no chromium is installed (apt-get install chromium)")
        pytest.skip("no chromium here (CI installs Debian's chromium and sets PPL_REQUIRE_BROWSER)")
    page = (moons_report / "report.html").resolve().as_uri()
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run(flags + ["--virtual-time-budget=10000", "--dump-dom", page], capture_output=True, text=True,
                         timeout=120).stdout
    images = re.findall(r"<img [^>]*>", dom)
    pngs = sorted(p.name for p in moons_report.glob("*.png"))
    assert len(images) == len(pngs), (len(images), pngs)
    assert all('data-state="loaded"' in tag for tag in images), [t for t in images if 'data-state="loaded"' not in t]
    assert f'data-figures-loaded="{len(pngs)}"' in dom
    shot = tmp_path / "shot.png"
    subprocess.run(flags + ["--window-size=1280,3000", f"--screenshot={shot}", page], capture_output=True, timeout=120)
    import matplotlib.image

    pixels = matplotlib.image.imread(shot)
    assert pixels.shape[0] == 3000 and pixels[..., :3].std() > 0.05  # figures and tables, not a blank page
