"""Slow end-to-end checks (``pytest -m slow``; CI runs them in a separate step)."""

from __future__ import annotations

import json
import math
import time

import pytest

from ppl.cli import main


@pytest.mark.slow
def test_bnn_nuts_on_breast_cancer_through_the_cli(tmp_path, capsys):
    out = tmp_path / "bnn"
    start = time.perf_counter()
    code = main(["fit", "--model", "bnn", "--data", "breast_cancer", "--method", "nuts", "--seed", "0",
                 "--out", str(out), "--no-progress"])
    elapsed = time.perf_counter() - start
    assert code == 0
    assert elapsed < 180, f"took {elapsed:.0f} s"
    printed = capsys.readouterr().out
    assert "rhat_max" in printed and "rhat_function_max" in printed
    diagnostics = json.loads((out / "summary.json").read_text())["diagnostics"]
    assert math.isfinite(diagnostics["rhat_max"]) and diagnostics["rhat_function_max"] <= 1.01
    assert diagnostics["divergences"] == 0
    assert json.loads((out / "summary.json").read_text())["metrics"]["accuracy"] > 0.9
