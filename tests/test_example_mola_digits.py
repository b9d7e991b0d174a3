"""The claims of examples/mola_digits.py (mixtures of Laplace approximations on rotated digits),
asserted on its small instance (--quick)."""

from __future__ import annotations


import pytest


@pytest.mark.extended  # 2.6 minutes on 2 CPU cores (measured 2026-12-05); CI leaves it out to stay within its time
def test_mola_digits_last_layer_gaussians_bound_the_confidence_map_does_not(tmp_path, load_example):
    example = load_example("mola_digits")
    out = example.main(["--out", str(tmp_path), "--quick"])
    rows = out["rows"]
    far = {label: r["confidence"][-1] for label, r in rows.items()}  # at δ = 1e4

    # Measured on --quick (seed 0 / seed 1), confidence at δ = 1e4:
    #   MAP 1.0000 / 1.0000; Laplace mc 0.925 / 0.936, probit 0.851 / 0.856;
    #   MoLA mc 0.930 / 0.939, probit 0.848 / 0.857; ensemble 1.0000 / 0.9988.
    # A ReLU MAP's logits grow like δ, so its confidence goes to 1; a last-layer Gaussian keeps it below.
    assert far["MAP (plug-in)"] > 0.999
    for label in ("Laplace (mc)", "MoLA (mc)"):
        assert far[label] < 0.97, (label, far[label])
    for label in ("Laplace (probit)", "MoLA (probit)"):
        assert far[label] < 0.90, (label, far[label])

    # Under rotation the Gaussians' NLL is lower: mean over 0..180 degrees, measured
    # MAP 4.17 / 4.49, Laplace mc 2.79 / 2.90, MoLA mc 2.85 / 2.91, ensemble 4.25 / 4.23.
    for label in ("Laplace (mc)", "MoLA (mc)", "Laplace (probit)", "MoLA (probit)"):
        assert rows[label]["mean_shift_nll"] < rows["MAP (plug-in)"]["mean_shift_nll"] - 0.5, label

    # Held-out digits by mutual information: MAP has none (0.5); measured ensemble 0.984 / 0.972,
    # MoLA 0.939 / 0.940. By entropy all lie within 0.970 ± 0.015 and their order changes with the
    # seed (MoLA below MAP by 0.003 / 0.006), so only the level is asserted.
    assert rows["MAP (plug-in)"]["auroc_mi"] == pytest.approx(0.5)
    assert rows["Ensemble (mc)"]["auroc_mi"] > 0.9 and rows["MoLA (mc)"]["auroc_mi"] > 0.9
    assert all(r["auroc_entropy"] > 0.9 for r in rows.values())

    # Where the paper's claim does not hold here: with the model's N(0, 1) prior the last-layer
    # Gaussians are underconfident on the unrotated test set (ECE measured MAP 0.015 / 0.013,
    # Laplace mc 0.078 / 0.075, MoLA mc 0.076 / 0.066).
    for label in ("Laplace (mc)", "MoLA (mc)"):
        assert rows[label]["ece"] > rows["MAP (plug-in)"]["ece"] + 0.03, label

    # The prior precision chosen by the evidence (the paper tunes it) shrinks that underconfidence
    # but keeps the bounded confidence: probit ECE at 0° measured 0.163 default, 0.090 tuned
    # (seed 0); confidence at δ = 1e4 0.943.
    tuned = rows["Laplace, tuned prior (probit)"]
    assert tuned["ece"] < rows["Laplace (probit)"]["ece"] - 0.03
    assert far["Laplace, tuned prior (probit)"] < 0.97

    for name in ("mola_digits_shift.png", "mola_digits_confidence.png"):
        assert (tmp_path / name).stat().st_size > 10_000
    table = (tmp_path / "mola_digits_table.md").read_text()
    assert table.count("\n|") == 1 + len(example.VARIANTS) and "nan" not in table.lower()
