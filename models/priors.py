"""Weight priors for the declarative models.

Each prior turns one weight or bias site into a NumPyro distribution. The object is a frozen
dataclass, so a model that holds it stays hashable (jit caches key on it).

>>> from ppl.models import BNN
>>> from ppl.models.priors import FanIn
>>> model = BNN(hidden=(32,), likelihood="bernoulli", prior=FanIn(scale=1.0))
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax.numpy as jnp
import numpyro.distributions as dist

__all__ = ["Prior", "Isotropic", "PerLayer", "FanIn", "ScaleMixture"]


class Prior:
    """Base class: ``distribution(layer, kind, shape, fan_in)`` for one site.

    ``layer`` counts dense layers from the input (0, 1, ...), ``kind`` is ``"weight"`` or
    ``"bias"``, ``shape`` the site's shape and ``fan_in`` the layer's number of inputs.
    """

    def distribution(self, layer: int, kind: str, shape: tuple, fan_in: int) -> dist.Distribution:
        raise NotImplementedError

    def _normal(self, scale: float, shape: tuple) -> dist.Distribution:
        return dist.Normal(jnp.zeros(shape), scale).to_event(len(shape))


def _check_positive(name: str, value: float) -> None:
    if isinstance(value, bool) or not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")


@dataclass(frozen=True)
class Isotropic(Prior):
    """Every weight and bias ~ N(0, scale²)."""

    scale: float = 1.0

    def __post_init__(self):
        _check_positive("Isotropic.scale", self.scale)

    def distribution(self, layer, kind, shape, fan_in):
        return self._normal(self.scale, shape)


@dataclass(frozen=True)
class PerLayer(Prior):
    """Layer ``i`` gets N(0, scales[i]²) on its weights and biases (one scale per dense layer)."""

    scales: tuple = (1.0,)

    def __post_init__(self):
        if isinstance(self.scales, (str, bytes)) or not isinstance(self.scales, (tuple, list)):
            raise ValueError(f"PerLayer.scales must be a tuple of positive numbers, one per layer; got {self.scales!r}")
        for i, s in enumerate(self.scales):
            _check_positive(f"PerLayer.scales[{i}]", s)
        object.__setattr__(self, "scales", tuple(float(s) for s in self.scales))
        for i, s in enumerate(self.scales):
            _check_positive(f"PerLayer.scales[{i}]", s)

    def distribution(self, layer, kind, shape, fan_in):
        if layer >= len(self.scales):
            raise ValueError(
                f"PerLayer has {len(self.scales)} scales but the network has a layer {layer}; "
                "give one scale per dense layer (hidden layers + output)"
            )
        return self._normal(self.scales[layer], shape)


@dataclass(frozen=True)
class FanIn(Prior):
    """Weights ~ N(0, scale²/fan_in) (variance-preserving, Neal 1996); biases ~ N(0, bias_scale²)."""

    scale: float = 1.0
    bias_scale: float = 1.0

    def __post_init__(self):
        _check_positive("FanIn.scale", self.scale)
        _check_positive("FanIn.bias_scale", self.bias_scale)

    def distribution(self, layer, kind, shape, fan_in):
        if kind == "bias":
            return self._normal(self.bias_scale, shape)
        return self._normal(self.scale / math.sqrt(fan_in), shape)


@dataclass(frozen=True)
class ScaleMixture(Prior):
    """Each weight ~ π N(0, scale1²) + (1 − π) N(0, scale2²) (Blundell et al. 2015)."""

    pi: float = 0.5
    scale1: float = 1.0
    scale2: float = 0.0025

    def __post_init__(self):
        if not 0.0 < self.pi < 1.0:
            raise ValueError(f"ScaleMixture.pi must lie in (0, 1), got {self.pi!r}")
        _check_positive("ScaleMixture.scale1", self.scale1)
        _check_positive("ScaleMixture.scale2", self.scale2)

    def distribution(self, layer, kind, shape, fan_in):
        return _ScaleMixtureNormal(self.pi, self.scale1, self.scale2, shape).to_event(len(shape))


class _ScaleMixtureNormal(dist.Distribution):
    """Elementwise π N(0, s1²) + (1 − π) N(0, s2²) with batch shape ``shape``."""

    support = dist.constraints.real
    reparametrized_params = []

    def __init__(self, pi, scale1, scale2, shape):
        self.pi, self.scale1, self.scale2 = pi, scale1, scale2
        super().__init__(batch_shape=tuple(shape))

    def sample(self, key, sample_shape=()):
        import jax

        key_pick, key_normal = jax.random.split(key)
        shape = tuple(sample_shape) + self.batch_shape
        pick = jax.random.bernoulli(key_pick, self.pi, shape)
        return jax.random.normal(key_normal, shape) * jnp.where(pick, self.scale1, self.scale2)

    def log_prob(self, value):
        first = math.log(self.pi) + dist.Normal(0.0, self.scale1).log_prob(value)
        second = math.log(1.0 - self.pi) + dist.Normal(0.0, self.scale2).log_prob(value)
        return jnp.logaddexp(first, second)
