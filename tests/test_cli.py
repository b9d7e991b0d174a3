"""The ``ppl`` command line, end to end."""

from __future__ import annotations

import json

import pytest

from ppl.cli import main


def test_fit_then_show(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["fit", "--model", "linear", "--data", "linear", "--method", "exact", "--out", str(out), "--no-progress"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "log_evidence" in printed and "rmse" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["metrics"]["rmse"] > 0
    assert main(["show", str(out)]) == 0
    assert "exact" in capsys.readouterr().out


@pytest.mark.slow  # moved out of the default run to keep it under 15 minutes; CI runs it in the slow step
def test_fit_bnn_with_model_and_method_options(tmp_path, capsys):
    out = tmp_path / "bnn"
    args = ["fit", "--model", "bnn", "--data", "iris", "--method", "svi", "--set", "hidden=4",
            "--set", "steps=200", "--set", "guide=mean_field", "--out", str(out), "--no-progress"]
    assert main(args) == 0
    assert "accuracy" in capsys.readouterr().out


def test_csv_file_with_target_column(tmp_path, capsys):
    csv = tmp_path / "d.csv"
    lines = ["x1,t,x2"] + [f"{i % 7},{i % 3 * 0.5},{i % 5}" for i in range(40)]
    csv.write_text("\n".join(lines))
    assert main(["fit", "--model", "linear", "--data", str(csv), "--target", "t", "--method", "exact",
                 "--out", str(tmp_path / "r"), "--no-progress"]) == 0


@pytest.mark.slow  # moved out of the default run to keep it under 15 minutes; CI runs it in the slow step
def test_fit_and_show_a_vae_with_its_figure(tmp_path, capsys):
    out = tmp_path / "vae"
    args = ["fit", "--model", "vae", "--data", "digits_binary", "--method", "svi", "--set", "objective=iwae",
            "--set", "num_particles=8", "--set", "steps=300", "--set", "batch_size=128", "--set", "latent_dim=2",
            "--set", "hidden=16", "--out", str(out), "--no-progress"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "log_px" in printed and "active_units" in printed and "iwae" in printed
    assert (out / "vae.png").read_bytes().startswith(b"\x89PNG")
    assert main(["show", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "log_px" in shown and "vae.png" in shown


@pytest.mark.slow  # out of the default run to keep it near 15 minutes; CI runs it in the slow step
def test_vae_on_an_unlabelled_csv(tmp_path, capsys):
    import numpy as np

    rng = np.random.default_rng(0)
    csv = tmp_path / "pixels.csv"
    rows = (rng.random((60, 6)) > 0.5).astype(int)
    csv.write_text("\n".join([",".join(f"p{i}" for i in range(6))] + [",".join(map(str, r)) for r in rows]))
    assert main(["fit", "--model", "vae", "--data", str(csv), "--method", "svi", "--set", "steps=100",
                 "--set", "latent_dim=2", "--set", "hidden=8", "--out", str(tmp_path / "r"), "--no-progress"]) == 0
    assert main(["fit", "--model", "vae", "--data", str(csv), "--target", "p0", "--method", "svi",
                 "--out", str(tmp_path / "r2"), "--no-progress"]) == 2
    assert "drop --target" in capsys.readouterr().err


def test_datasets_and_methods(capsys):
    assert main(["datasets"]) == 0
    assert "breast_cancer" in capsys.readouterr().out
    assert main(["methods"]) == 0
    text = capsys.readouterr().out
    for name in ("exact", "map", "nuts", "hmc", "svi"):
        assert name in text
    assert "num_samples = 1000" in text


def test_the_methods_listing_is_the_classes_own():
    from ppl._catalogue import methods_text
    from ppl._methods_text import METHODS_TEXT

    # Kept as text so that `ppl methods` need not load JAX; after changing a model's or a method's
    # options, run `python -m ppl._catalogue` to write it again.
    assert METHODS_TEXT == methods_text(), "ppl/_methods_text.py is stale: run `python -m ppl._catalogue`"


def test_listing_commands_and_usage_errors_answer_without_loading_jax():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from ppl.cli import main\n"
        "for argv in (['--help'], ['fit', '--help'], ['--version'], ['datasets'], ['methods'], ['fit', '--model', 'bnn']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'numpyro', 'matplotlib', 'arviz')))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip().splitlines()[-1] == "[]"
    assert "cyclical_sgld" in result.stdout and "breast_cancer" in result.stdout
    assert "ppl fit: error: ppl fit needs --model and --data" in result.stderr


@pytest.mark.slow  # moved out of the default run to keep it under 15 minutes; CI runs it in the slow step
def test_console_script_in_default_float32(tmp_path):
    # A separate process: the user's default precision (float32), not the tests' float64.
    import subprocess
    import sys

    out = tmp_path / "f32"
    result = subprocess.run(
        [sys.executable, "-m", "ppl.cli", "fit", "--model", "logistic", "--data", "breast_cancer", "--method", "svi",
         "--set", "steps=500", "--set", "guide=full_rank", "--out", str(out), "--no-progress"],
        capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["metrics"]["accuracy"] > 0.9


def test_two_moons_are_scikit_learns():
    # ppl draws the moons itself so that loading them does not import scikit-learn; the points must
    # stay make_moons' exactly, or every documented two-moons figure would silently change
    from sklearn.datasets import make_moons

    import numpy as np

    from ppl.datasets import _moons

    for seed, count in ((0, 500), (1, 500), (7, 7), (123, 100)):
        X, y = _moons(count, 0.1, seed)
        X_sk, y_sk = make_moons(n_samples=count, noise=0.1, random_state=seed)
        np.testing.assert_array_equal(X, X_sk)
        np.testing.assert_array_equal(y, y_sk)
