"""The claims of examples/method_comparison.py, asserted on its --quick instance."""

from __future__ import annotations

import math

import pytest


@pytest.mark.extended  # 2.2 minutes on 2 CPU cores (measured 2026-12-05); CI leaves it out to stay within its time
def test_method_comparison_measures_every_method_against_the_reference(tmp_path, load_example):
    example = load_example("method_comparison")
    outcome = example.main(["--out", str(tmp_path), "--quick"])
    entries = {e["method"]: e for e in outcome["entries"]}
    assert set(entries) == {"nuts", "nuts (second run)", *example.QUICK_METHODS}
    assert all(not e.get("error") for e in entries.values())
    floor = entries["nuts (second run)"]
    # two NUTS runs agree far more closely than any approximation comes to them
    # (measured: TV 0.0017 between the runs; 0.021–0.037 for the five methods)
    assert floor["agreement"] == 1.0 and floor["rhat_function_max"] < 1.01
    for method in example.QUICK_METHODS:
        assert entries[method]["total_variation"] > 3 * floor["total_variation"]
        assert 0.9 < entries[method]["agreement"] <= 1.0
        assert math.isfinite(entries[method]["nll"]) and entries[method]["cost"] > 0
    # the mean-field Gaussian's k-hat says it is not the posterior (measured 2.05)
    assert entries["svi"]["khat"] > 0.7
    assert (tmp_path / "method_comparison.png").stat().st_size > 10_000
    text = (tmp_path / "method_comparison_table.md").read_text()
    assert "nan" not in text and text.count("\n| ") == len(entries) + 1
