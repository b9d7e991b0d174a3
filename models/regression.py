"""Bayesian linear and logistic regression."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist

from ppl.models._base import Layer, SupervisedModel, check_flag, check_scale

__all__ = ["LinearRegression", "LogisticRegression"]


class _Linear(SupervisedModel):
    """Sites ``w`` (D,) and, with ``bias``, ``b`` (); natural parameter ``X @ w + b``."""

    def _sample_coefficients(self, input_dim: int) -> dict:
        s = self.prior_scale
        params = {"w": numpyro.sample("w", dist.Normal(jnp.zeros(input_dim), s).to_event(1))}
        if self.bias:
            params["b"] = numpyro.sample("b", dist.Normal(0.0, s))
        return params

    def layers(self, input_dim: int) -> tuple:
        return (Layer("w", "b" if self.bias else None, input_dim, 1, None),)

    def with_prior_scales(self, scales: tuple):
        if len(scales) != 1:
            raise ValueError(f"{type(self).__name__} has one layer, so one prior scale; got {len(scales)}")
        return dataclasses.replace(self, prior_scale=float(scales[0]))

    def __call__(self, X, y=None):
        params = self._sample_coefficients(X.shape[-1])
        params.update(self._sample_noise())
        return self._observe(X, y, params)


@dataclass(frozen=True)
class LinearRegression(_Linear):
    """y ~ N(X w + b, σ²) with w ~ N(0, s² I), b ~ N(0, s²).

    ``noise_scale`` fixes σ (the model is then conjugate and ``method="exact"`` applies);
    ``noise_scale=None`` learns it with a ``sigma ~ HalfNormal(1)`` site.

    >>> import ppl
    >>> from ppl.models import LinearRegression
    >>> data = ppl.datasets.load("linear", seed=0)
    >>> post = ppl.fit(LinearRegression(noise_scale=0.5), data.train, method="exact", seed=0)
    """

    prior_scale: float = 1.0
    noise_scale: float | None = 1.0
    bias: bool = True

    likelihood = "gaussian"

    def __post_init__(self):
        check_scale("LinearRegression.prior_scale", self.prior_scale)
        check_scale("LinearRegression.noise_scale", self.noise_scale, allow_none=True)
        check_flag("LinearRegression.bias", self.bias)


@dataclass(frozen=True)
class LogisticRegression(_Linear):
    """y ~ Bernoulli(logits = X w + b) with w ~ N(0, s² I), b ~ N(0, s²); labels 0/1."""

    prior_scale: float = 1.0
    bias: bool = True

    likelihood = "bernoulli"
    noise_scale = None

    def __post_init__(self):
        check_scale("LogisticRegression.prior_scale", self.prior_scale)
        check_flag("LogisticRegression.bias", self.bias)
