"""Bad input: ppl.DataError before any compilation, naming the problem; the CLI exits 2, writes nothing."""

from __future__ import annotations

import numpy as np
import pytest

from ppl.cli import main
from ppl.core.problem import trace_count
from ppl.models import BNN, LinearRegression, LogisticRegression
import ppl

rng = np.random.default_rng(0)
X = rng.standard_normal((20, 3))
y_real = rng.standard_normal(20)
y_binary = (X[:, 0] > 0).astype(int)


def _with(array, index, value):
    array = np.array(array, dtype=float)
    array[index] = value
    return array


CASES = [
    ("nan in X", LinearRegression(), (_with(X, (4, 1), np.nan), y_real), r"X has 1 non-finite.*index \(4, 1\)"),
    ("inf in y", LinearRegression(), (X, _with(y_real, 7, np.inf)), r"y has 1 non-finite.*index 7"),
    ("length mismatch", LinearRegression(), (X, y_real[:-1]), "20 rows but y has 19"),
    ("column targets", LinearRegression(), (X, y_real[:, None]), r"shape \(20, 1\).*ravel"),
    ("empty", LinearRegression(), (X[:0], y_real[:0]), "empty"),
    ("labels outside 0/1", LogisticRegression(), (X, _with(y_binary, 3, 2)), r"outside \{0, 1\}.*y\[3\]"),
    ("non-integer labels", BNN(likelihood="bernoulli"), (X, _with(y_binary, 2, 0.5)), r"y\[2\] = 0.5 is not an integer"),
    ("negative class", BNN(likelihood="categorical"), (X, _with(y_binary, 0, -1)), "negative"),
    ("too many classes", BNN(likelihood="categorical", num_classes=2), (X, _with(y_binary, 0, 5)), "num_classes=2"),
    ("1-D inputs", LinearRegression(), (X[:, 0], y_real), r"X\[:, None\]"),
    ("dict for a declarative model", LinearRegression(), {"X": X, "y": y_real}, "tuple"),
]


@pytest.mark.parametrize("label, model, data, message", CASES, ids=[c[0] for c in CASES])
def test_data_error_before_compilation(label, model, data, message):
    before = trace_count()
    with pytest.raises(ppl.DataError, match=message):
        ppl.fit(model, data, method="map", seed=0)
    assert trace_count() == before


def test_batch_size_outside_range():
    with pytest.raises(ppl.DataError, match="batch_size must be an integer in 1..20"):
        ppl.fit(LinearRegression(), (X, y_real), method="svi", seed=0, batch_size=50)


def test_unknown_method_and_option_list_the_valid_ones():
    with pytest.raises(ppl.OptionError, match="valid methods: .*nuts"):
        ppl.fit(LinearRegression(), (X, y_real), method="nutz", seed=0)
    with pytest.raises(ppl.OptionError, match="valid options: .*num_samples"):
        ppl.fit(LinearRegression(), (X, y_real), method="nuts", seed=0, num_sample=10)
    with pytest.raises(ppl.OptionError, match="guide='nope' is not one of"):
        ppl.fit(LinearRegression(), (X, y_real), method="svi", seed=0, guide="nope")


def test_exact_refuses_non_conjugate_models():
    with pytest.raises(ppl.OptionError, match="fixed noise_scale"):
        ppl.fit(LinearRegression(noise_scale=None), (X, y_real), method="exact", seed=0)


def test_nonfinite_training_stops_with_the_step(monkeypatch):
    # A huge learning rate on a sharply peaked posterior diverges; the error names the step.
    data = (X, y_real * 1e6)
    with pytest.raises(ppl.NonFiniteError, match="step") as info:
        ppl.fit(LinearRegression(noise_scale=1e-6), data, method="svi", seed=0, learning_rate=1e6, steps=200)
    assert info.value.last_finite_params is not None


def test_cli_bad_csv_exits_2_and_writes_nothing(tmp_path, capsys):
    csv = tmp_path / "bad.csv"
    csv.write_text("a,b,target\n1,2,0.5\nnan,3,1.5\n4,5,2.0\n6,7,1.0\n8,9,0.0\n")
    out = tmp_path / "run"
    code = main(["fit", "--model", "linear", "--data", str(csv), "--target", "target", "--method", "exact",
                 "--out", str(out), "--no-progress"])
    assert code == 2
    assert "column 'a': 1 value, the first at row 3 ('nan')" in capsys.readouterr().err
    assert not out.exists()


def test_cli_unknown_option_exits_2(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["fit", "--model", "linear", "--data", "linear", "--method", "exact", "--set", "bogus=1", "--out", str(out)])
    assert code == 2 and not out.exists()
    assert "bogus" in capsys.readouterr().err


def test_cli_usage_error_exits_2(capsys):
    with pytest.raises(SystemExit) as info:
        main(["fit", "--model", "nope", "--data", "linear"])
    assert info.value.code == 2
