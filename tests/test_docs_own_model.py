"""docs/models/own_model.md is run, not only read: its python blocks, in order, as one script, and
the figures its text states."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import pytest

PAGE = Path(__file__).resolve().parents[1] / "docs" / "models" / "own_model.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)


def test_the_page_has_its_steps():
    text = "\n".join(_blocks())
    for step in ('method="nuts"', 'method="svi"', "to_arviz()", "Predictive(network, posterior_samples=",
                 "as_numpyro_guide()", ".save(", "ppl.load(", "model=network", "ImproperUniform",
                 "numpyro.deterministic", "function_sites="):
        assert step in text, step


@pytest.mark.slow  # about 20 s: NUTS with 4 chains and SVI at their defaults, as the page runs them
def test_the_page_runs_and_says_what_it_finds(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the page saves to a relative folder
    # Run as a user's script runs: its program lives in __main__, so saving it warns.
    namespace = {"__name__": "__main__"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i, block in enumerate(_blocks()):
            exec(compile(block, f"{PAGE}:block{i}", "exec"), namespace)
    raised = [w for w in caught if not issubclass(w.category, (DeprecationWarning, FutureWarning))]
    assert len(raised) == 1 and issubclass(raised[0].category, UserWarning), [str(w.message) for w in raised]
    assert "defined in __main__" in str(raised[0].message)
    assert "ppl.load('runs/network-nuts', model=network)" in str(raised[0].message)

    # The figures the text states.
    d, d_vi = namespace["diagnostics"], namespace["diagnostics_vi"]
    assert d.ok, d.warnings
    assert d.rhat_max > 2.0 and d.rhat_function_max <= 1.01  # "about 2.4" and "about 1.005"
    assert namespace["post"].draws["f"].shape == (4, 500, 40)
    assert 0.5 < d_vi.khat <= d_vi.khat_threshold and d_vi.ok, d_vi.warnings  # "about 0.6, under 0.67"
    assert namespace["post_vi"].draws["f"].shape == (1, 1000, 40)
    assert namespace["idata"].posterior["f"].dims == ("chain", "draw", "f_dim_0")
    printed = capsys.readouterr().out
    assert f"{d.rhat_function_max:.4f}"[:5] in printed
    out = namespace["out"]
    assert out["f"].shape == (400, 41) and namespace["out_vi"]["f"].shape == (400, 41)
    # The recomputed f follows sin(2x) between the data's ends (noise sd 0.1, 40 points).
    x_new = namespace["x_new"]
    assert np.max(np.abs(namespace["mean"] - np.sin(2.0 * x_new))) < 0.2
    inside = (namespace["low"] < np.sin(2.0 * x_new)) & (np.sin(2.0 * x_new) < namespace["high"])
    assert inside.mean() > 0.9
    assert namespace["detached"].is_detached and namespace["detached"].function_sites == ("f",)
    assert namespace["detached"].diagnostics().rhat_function_max == d.rhat_function_max
    assert not namespace["same"].is_detached and namespace["draws"]["f"].shape == (100, 40)
