"""The rotated-digits covariate-shift benchmark: splits, rotation, and shift metrics."""

from __future__ import annotations

import numpy as np
import pytest

from ppl.datasets import rotate_images
import ppl


@pytest.fixture(scope="module")
def data():
    return ppl.datasets.load("rotated_digits", seed=0)


def test_rotation_by_hand():
    image = np.arange(16.0).reshape(4, 4)
    np.testing.assert_array_equal(rotate_images(image, 0), image)
    np.testing.assert_array_equal(rotate_images(image, 90), np.rot90(image))  # counter-clockwise, exact
    np.testing.assert_array_equal(rotate_images(rotate_images(image, 180), 180), image)
    np.testing.assert_array_equal(rotate_images(image, -90), np.rot90(image, -1))
    # 45 degrees, 2×2 image with one lit pixel at the top left, centre (0.5, 0.5): the output's top-left
    # pixel (x, y) = (−½, ½) has preimage column ½ and row ½ − √2/2, i.e. between row −1 (outside, 0)
    # and row 0 with weight 1.5 − √2/2 on row 0, and halfway between columns 0 and 1.
    lit = np.array([[1.0, 0.0], [0.0, 0.0]])
    assert rotate_images(lit, 45)[0, 0] == pytest.approx(0.5 * (1.5 - np.sqrt(2) / 2), abs=1e-12)
    with pytest.raises(ValueError, match="expected square images"):
        rotate_images(np.zeros((2, 3)), 10)


def test_splits_classes_and_scaling(data):
    from sklearn.datasets import load_digits

    digits = load_digits()
    assert data.task == "classification" and data.num_classes == 8
    assert set(np.unique(data.train.y)) == set(range(8)) and set(np.unique(data.test.y)) <= set(range(8))
    assert data.train.X.shape[0] + data.test.X.shape[0] == int(np.sum(digits.target < 8))
    # ood: exactly the 8s and 9s, scaled with the training statistics
    held_out = digits.data[digits.target >= 8]
    np.testing.assert_allclose(data.ood.X * data.input_std + data.input_mean, held_out, atol=1e-12)
    assert data.ood.y is None
    # one mean and sd over all training pixels
    assert abs(data.train.X.mean()) < 1e-12 and abs(data.train.X.std() - 1.0) < 1e-12
    assert ppl.datasets.load("digits", seed=0).shifts is None


def test_shifted_test_sets(data):
    assert data.shift_name == "rotation (degrees)"
    assert [angle for angle, _ in data.shifts] == [float(a) for a in range(0, 181, 15)]
    unrotated, upside_down = data.shifts[0][1], data.shifts[-1][1]
    np.testing.assert_array_equal(unrotated.X, data.test.X)
    np.testing.assert_array_equal(unrotated.y, data.test.y)
    # 180 degrees permutes the pixels exactly, and one scale for every pixel commutes with it
    images = data.test.X.reshape(-1, 8, 8)
    np.testing.assert_array_equal(upside_down.X.reshape(-1, 8, 8), images[:, ::-1, ::-1])
    for _, split in data.shifts:
        assert split.X.shape == data.test.X.shape
        np.testing.assert_array_equal(split.y, data.test.y)


@pytest.mark.slow  # a statistical check: out of the default run (15 minutes); CI runs it in the slow step
def test_map_bnn_accuracy_falls_with_rotation(data):
    from ppl.diagnostics import shift_metrics
    from ppl.models import BNN

    post = ppl.fit(BNN(hidden=(32,), activation="tanh", likelihood="categorical"), data.train, method="map",
                   seed=0, steps=300)
    rows = shift_metrics(post, data, seed=0)
    assert [row["shift"] for row in rows] == [angle for angle, _ in data.shifts]
    accuracy = {row["shift"]: row["accuracy"] for row in rows}
    assert accuracy[0.0] > 0.9
    assert accuracy[0.0] > accuracy[15.0] > accuracy[30.0] > accuracy[45.0]
    assert max(a for angle, a in accuracy.items() if angle >= 30.0) < accuracy[0.0] - 0.3
    assert all(set(row) == {"shift", "nll", "accuracy", "ece", "brier"} for row in rows)
    with pytest.raises(ValueError, match="has no shifted test sets"):
        shift_metrics(post, ppl.datasets.load("digits", seed=0), seed=0)
