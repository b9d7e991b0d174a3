"""The benchmark suite's shared harness: timing with compilation apart, the environment record,
the tables as text and JSON. (The benchmarks themselves are measurements, run by hand or by
``python -m bench.run_all``; they are not tests.)"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import _harness  # noqa: E402


def test_timed_separates_the_first_call_from_the_warm_ones():
    calls = []

    def fn():
        time.sleep(0.05 if not calls else 0.01)  # the first call pays a "compilation"
        calls.append(1)

    out = _harness.timed(fn, repeats=3)
    assert len(calls) == 4 and len(out["warm_all_s"]) == 3
    assert 0.009 <= out["warm_s"] < out["first_s"]
    assert abs(out["compile_s"] - (out["first_s"] - out["warm_s"])) < 1e-12


def test_environment_names_versions_and_device():
    env = _harness.environment()
    assert env["versions"]["jax"] and env["versions"]["numpyro"] and env["versions"]["blackjax"]
    assert env["platform"] in ("cpu", "gpu", "tpu") and env["devices"] >= 1


def test_tables_render_aligned_and_round_trip_as_json(tmp_path):
    t = _harness.table("title", ["method", "ratio"], [["svi", 0.5], ["map", 1.234567], ["nuts", None]])
    lines = _harness.render([t]).splitlines()
    assert lines[0] == "title" and lines[3].split() == ["svi", "0.5"] and lines[5].split() == ["nuts", "—"]
    assert len({len(line) for line in lines[1:6]}) == 1  # every row as wide as the header
    path = _harness.write({"tables": [t]}, tmp_path / "sub" / "out.json")
    assert json.loads(path.read_text())["tables"][0]["rows"][1] == ["map", 1.234567]


def test_the_matmul_peak_is_a_positive_rate():
    assert _harness.matmul_peak(size=128, repeats=3) > 1e6


def test_per_step_cancels_what_a_run_does_once():
    """A run of n steps that costs 40 ms once and 0.2 ms a step: the difference of two runs finds
    the 0.2 ms (sleep overshoots by a fraction of a millisecond a call, once per run)."""
    def fit(steps):
        time.sleep(0.04 + 2e-4 * steps)

    out = _harness.per_step(fit, short=4, repeats=3, target_s=0.3)
    assert 1.6e-4 < out["per_step_s"] < 2.6e-4, out
    assert out["extra_steps"] >= 64 and 0.03 < out["fit_fixed_s"] < 0.06
