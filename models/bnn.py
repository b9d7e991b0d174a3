"""Bayesian neural network: a stack of dense layers with a prior on every weight."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import numpyro

from ppl.core.errors import DataError
from ppl.models._base import ACTIVATIONS, LIKELIHOODS, Layer, SupervisedModel, check_choice, check_scale
from ppl.models.priors import ByName, Isotropic, PerLayer, Prior

__all__ = ["BNN", "ACTIVATIONS"]

MAX_INFERRED_CLASSES = 10_000



@dataclass(frozen=True)
class BNN(SupervisedModel):
    """Dense Bayesian neural network.

    Sites ``w{i}`` (fan_in, fan_out) and ``b{i}`` (fan_out,) for dense layer ``i`` counted from the
    input; ``sigma`` when a Gaussian noise scale is learned (``noise_scale=None``). The output is
    one unit for ``gaussian`` (the mean) and ``bernoulli`` (the logit), C units for
    ``categorical`` (logits; C read from the labels by ``ppl.fit`` unless ``num_classes`` is given),
    two for ``heteroscedastic`` (the mean and the log-variance of a Gaussian: noise that depends on
    the input). Gaussian regression on targets of shape (N, K) has K output units and a noise scale
    per output (``sigma`` of shape (K,) when learned); K is read from the targets unless
    ``num_outputs`` is given.

    Args:
        hidden: widths of the hidden layers; ``()`` gives a generalised linear model.
        activation: ``relu``, ``tanh`` or ``gelu``.
        likelihood: ``gaussian``, ``bernoulli``, ``categorical`` or ``heteroscedastic``.
        prior_scale: scale of the isotropic N(0, s²) prior used when ``prior`` is None.
        prior: a ``ppl.models.priors`` object (per-layer, fan-in scaled, scale mixture).
        noise_scale: fixed Gaussian noise σ (with K outputs: one number for all, or a tuple of K),
            or None to learn it.
        num_outputs: K for multi-output Gaussian regression; None reads it from the targets.

    >>> from ppl.models import BNN
    >>> model = BNN(hidden=(32,), activation="tanh", likelihood="bernoulli")
    """

    hidden: tuple = (50,)
    activation: str = "relu"
    likelihood: str = "gaussian"
    prior_scale: float = 1.0
    prior: Prior | None = None
    noise_scale: float | None = None
    num_classes: int | None = None
    num_outputs: int | None = None

    def __post_init__(self):
        hidden = (self.hidden,) if isinstance(self.hidden, (int, np.integer)) else self.hidden
        if isinstance(hidden, (str, bytes)) or not isinstance(hidden, (tuple, list)) or not all(
            isinstance(h, (int, np.integer)) and not isinstance(h, (bool, np.bool_)) for h in hidden
        ):
            raise ValueError(
                f"BNN.hidden must be an integer width or a tuple of them, e.g. (32,) or (32, 32); got {self.hidden!r}"
            )
        object.__setattr__(self, "hidden", tuple(int(h) for h in hidden))
        if any(h < 1 for h in self.hidden):
            raise ValueError(f"BNN.hidden widths must be positive integers, got {self.hidden}")
        check_choice("BNN.activation", self.activation, tuple(ACTIVATIONS))
        check_choice("BNN.likelihood", self.likelihood, LIKELIHOODS)
        check_scale("BNN.prior_scale", self.prior_scale)
        if isinstance(self.noise_scale, (tuple, list)):
            if not self.noise_scale:
                raise ValueError("BNN.noise_scale is an empty tuple; give one positive number per output, or one for all")
            for k, value in enumerate(self.noise_scale):
                check_scale(f"BNN.noise_scale[{k}]", value)
            scales = tuple(float(v) for v in self.noise_scale)
            object.__setattr__(self, "noise_scale", scales[0] if len(scales) == 1 else scales)
        else:
            check_scale("BNN.noise_scale", self.noise_scale, allow_none=True)
        if self.noise_scale is not None and self.likelihood != "gaussian":
            raise ValueError(f"BNN.noise_scale applies only to likelihood='gaussian', not {self.likelihood!r}")
        if self.prior is not None and not isinstance(self.prior, Prior):
            raise ValueError(
                f"BNN.prior must be a ppl.models.priors object (Isotropic, PerLayer, FanIn, "
                f"ScaleMixture, ByName), got {type(self.prior).__name__}"
            )
        if isinstance(self.prior, ByName):
            names = [name for i in range(len(self.hidden) + 1) for name in (f"w{i}", f"b{i}")]
            self.prior.check_names(names, "BNN")
        if self.num_outputs is not None:
            if isinstance(self.num_outputs, (bool, np.bool_)) or not isinstance(self.num_outputs, (int, np.integer)) or self.num_outputs < 1:
                raise ValueError(f"BNN.num_outputs must be a positive integer or None, got {self.num_outputs!r}")
            if self.likelihood != "gaussian":
                raise ValueError(
                    f"BNN.num_outputs applies only to likelihood='gaussian' (multi-output regression), not {self.likelihood!r}"
                )
            object.__setattr__(self, "num_outputs", int(self.num_outputs))
        if isinstance(self.noise_scale, tuple) and len(self.noise_scale) != (self.num_outputs or 1):
            raise ValueError(
                f"BNN.noise_scale has {len(self.noise_scale)} values but the model has {self.num_outputs or 1} output(s); "
                "give one per output (set num_outputs=K) or a single number for all"
            )
        if self.num_classes is not None:
            if self.likelihood != "categorical":
                raise ValueError("BNN.num_classes applies only to likelihood='categorical'")
            if int(self.num_classes) < 2:
                raise ValueError(f"BNN.num_classes must be at least 2, got {self.num_classes}")

    def bind(self, X, y):
        if self.likelihood == "gaussian" and self.num_outputs is None and y is not None and np.ndim(y) == 2:
            return dataclasses.replace(self, num_outputs=int(np.shape(y)[1]))
        if self.likelihood == "categorical" and self.num_classes is None and y is not None:
            classes = max(int(np.max(y)) + 1, 2)
            if classes > MAX_INFERRED_CLASSES:
                raise DataError(
                    f"the largest label is {classes - 1}, which would make {classes} classes; recode the labels "
                    f"to 0..C-1, or pass num_classes= explicitly if you really mean that many"
                )
            return dataclasses.replace(self, num_classes=classes)
        return self

    @property
    def _prior(self) -> Prior:
        return self.prior if self.prior is not None else Isotropic(self.prior_scale)

    def layers(self, input_dim: int) -> tuple:
        widths = (int(input_dim), *self.hidden, self.output_dim())
        last = len(widths) - 2
        return tuple(
            Layer(f"w{i}", f"b{i}", widths[i], widths[i + 1], None if i == last else self.activation)
            for i in range(len(widths) - 1)
        )

    def with_prior_scales(self, scales: tuple):
        return dataclasses.replace(self, prior=PerLayer(tuple(float(s) for s in scales)))

    def __call__(self, X, y=None):
        params = {}
        for i, layer in enumerate(self.layers(X.shape[-1])):
            shape_w, shape_b = (layer.fan_in, layer.fan_out), (layer.fan_out,)
            params[layer.weight] = numpyro.sample(
                layer.weight, self._prior.distribution(i, "weight", shape_w, layer.fan_in, layer.weight)
            )
            params[layer.bias] = numpyro.sample(
                layer.bias, self._prior.distribution(i, "bias", shape_b, layer.fan_in, layer.bias)
            )
        params.update(self._sample_noise())
        return self._observe(X, y, params)
