"""CNN: a Network over images; its convolution against a direct sum, the digits as images.

The convolution is checked against its definition (a cross-correlation with zero 'SAME' padding,
summed in numpy) to float64 rounding: 1e-12 relative.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

import ppl
from ppl._errors import DataError, OptionError
from ppl._problem import compile_problem
from ppl.models import CNN, Network
from ppl.models.cnn import ConvNet


def _direct(params, X, net: ConvNet):
    """The ConvNet's forward pass written with explicit sums (one convolution, pooling, output)."""
    kernel, bias = np.asarray(params["conv_0"]["kernel"]), np.asarray(params["conv_0"]["bias"])
    k = kernel.shape[0]
    pad = (k - 1) // 2
    n, height, width, _ = X.shape
    padded = np.zeros((n, height + k - 1, width + k - 1, X.shape[3]))
    padded[:, pad : pad + height, pad : pad + width] = X
    out = np.zeros((n, height, width, kernel.shape[3]))
    for r in range(height):
        for c in range(width):
            patch = padded[:, r : r + k, c : c + k, :]
            out[:, r, c, :] = np.einsum("nijc,ijco->no", patch, kernel) + bias
    out = np.maximum(out, 0.0)
    p = net.pool
    pooled = out[:, : height // p * p, : width // p * p].reshape(n, height // p, p, width // p, p, -1).mean(axis=(2, 4))
    flat = pooled.reshape(n, -1)
    return flat @ np.asarray(params["out"]["kernel"]) + np.asarray(params["out"]["bias"])


def test_convolution_matches_its_definition():
    net = ConvNet(channels=(3,), kernel=3, dense=(), activation="relu", pool=2, outputs=4)
    template = net.template((6, 5, 2))
    rng = np.random.default_rng(0)
    params = jax.tree_util.tree_map(lambda a: rng.normal(size=a.shape), template)
    X = rng.normal(size=(7, 6, 5, 2))
    np.testing.assert_allclose(np.asarray(net(params, X)), _direct(params, X, net), rtol=1e-12, atol=1e-12)


def test_digits_as_images():
    flat = ppl.datasets.load("digits", seed=0)
    images = ppl.datasets.load("digits", seed=0, images=True)
    assert images.train.X.shape == (flat.train.X.shape[0], 8, 8, 1)
    np.testing.assert_array_equal(images.train.X.reshape(flat.train.X.shape), flat.train.X)
    np.testing.assert_array_equal(images.test.y, flat.test.y)
    with pytest.raises(DataError, match="images=True applies to the 'digits' dataset only"):
        ppl.datasets.load("iris", images=True)


def test_cnn_is_a_network_on_the_data():
    data = ppl.datasets.load("digits", seed=0, images=True)
    X, y = data.train.X[:120], data.train.y[:120]
    problem = compile_problem(CNN(channels=(2,), dense=()), (X, y))
    assert isinstance(problem.model, Network)
    assert [s.name for s in problem.sites] == ["conv_0.bias", "conv_0.kernel", "out.bias", "out.kernel"]
    assert problem.model.num_classes == int(y.max()) + 1
    post = ppl.fit(CNN(channels=(2,), dense=()), (X, y), method="laplace", seed=0, steps=200, num_draws=50)
    assert post.info["subset"] == "last_layer" and post.info["num_free"] == (4 * 4 * 2 + 1) * 10
    pred = post.predict(data.test.X[:30], seed=1)
    assert pred.probs.shape == (30, 10) and np.allclose(pred.probs.sum(axis=1), 1.0)
    with pytest.raises(OptionError, match="K-FAC.*conv_0, out"):
        ppl.fit(CNN(channels=(2,), dense=()), (X, y), method="laplace", seed=0, hessian="kfac")


def test_cnn_refuses_rows():
    data = ppl.datasets.load("digits", seed=0)
    with pytest.raises(DataError, match=r"CNN takes images \(N, H, W, C\)"):
        ppl.fit(CNN(), data.train, method="map", seed=0)
    with pytest.raises(ValueError, match="CNN.channels must be a tuple of positive integers"):
        CNN(channels=(0,))


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5])
def test_patch_convolution_equals_xla_convolution_for_every_kernel_size(size):
    from ppl.models.cnn import same_convolution

    rng = np.random.default_rng(size)
    images, kernel = rng.normal(size=(3, 7, 6, 2)), rng.normal(size=(size, size, 2, 4))
    expected = jax.lax.conv_general_dilated(images, kernel, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    np.testing.assert_allclose(same_convolution(images, kernel), expected, rtol=1e-12, atol=1e-12)


def test_a_saved_cnn_run_reloads_given_the_cnn(tmp_path):
    data = ppl.datasets.load("digits", images=True)
    X, y = data.train.X[:60], data.train.y[:60]
    model = CNN(channels=(2,), dense=(), num_classes=10)
    post = ppl.fit(model, (X, y), method="map", seed=0, steps=20, max_steps=20)
    post.save(tmp_path / "run")
    loaded = ppl.load(tmp_path / "run", model=CNN(channels=(2,), dense=(), num_classes=10))
    np.testing.assert_array_equal(loaded.predict(X[:4], seed=0).probs, post.predict(X[:4], seed=0).probs)
    with pytest.raises(ppl.RunError, match="not the Network this run was fitted with"):
        ppl.load(tmp_path / "run", model=CNN(channels=(3,), dense=(), num_classes=10))
