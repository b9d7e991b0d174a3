"""What every declarative supervised model shares: the likelihood, target checks, config I/O.

A declarative model is a frozen (hashable) dataclass and a plain NumPyro model
``model(X, y=None)``. Beyond that it exposes its network structure, which curvature methods and
function-space diagnostics need: ``apply(params, X)`` maps constrained parameters to the
likelihood's natural parameter (the mean, or logits), ``layers(input_dim)`` lists the dense layers.
Per-datum sites live inside ``numpyro.plate("data", N)``; minibatch scaling (N/B) and tempering
are applied by the compiled ``Problem``, never here.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

from ppl._errors import DataError

LIKELIHOODS = ("gaussian", "bernoulli", "categorical")
DATA_PLATE = "data"
OBSERVED_SITE = "y"


class Layer(NamedTuple):
    """One dense layer: sites ``weight`` (fan_in, fan_out) and ``bias`` (fan_out,)."""

    weight: str
    bias: str | None
    fan_in: int
    fan_out: int
    activation: str | None  # applied after this layer; None for the output layer


class SupervisedModel:
    """Mixin with the parts of ``LinearRegression``, ``LogisticRegression`` and ``BNN`` that agree."""

    likelihood: str
    noise_scale: float | None

    # -- structure -----------------------------------------------------------------------------
    def output_dim(self) -> int:
        if self.likelihood == "categorical":
            if self.num_classes is None:
                raise ValueError(
                    f"{type(self).__name__} with a categorical likelihood needs num_classes; "
                    "ppl.fit reads it from the labels, or pass num_classes= yourself"
                )
            return int(self.num_classes)
        return 1

    @property
    def num_classes(self):
        return None

    def bind(self, X, y):
        """A copy with everything read from the data filled in (here: nothing)."""
        return self

    def noise(self, params: dict):
        """Observation noise σ of a Gaussian likelihood: learned ``sigma`` site or the fixed scale."""
        if self.noise_scale is None:
            return params["sigma"]
        return jnp.asarray(self.noise_scale)

    def observation(self, f, params: dict) -> dist.Distribution:
        """p(y | f): ``f`` is ``apply``'s output for a batch of inputs."""
        if self.likelihood == "gaussian":
            return dist.Normal(f, self.noise(params))
        if self.likelihood == "bernoulli":
            return dist.Bernoulli(logits=f)
        return dist.Categorical(logits=f)

    def _sample_noise(self):
        if self.likelihood == "gaussian" and self.noise_scale is None:
            return {"sigma": numpyro.sample("sigma", dist.HalfNormal(1.0))}
        return {}

    def _observe(self, X, y, params):
        f = self.apply(params, X)
        with numpyro.plate(DATA_PLATE, X.shape[0]):
            numpyro.sample(OBSERVED_SITE, self.observation(f, params), obs=y)
        return f

    # -- data checks (host side, before tracing) -----------------------------------------------
    def check_targets(self, y: np.ndarray) -> np.ndarray:
        """Validate targets for this likelihood and return them in the dtype the model uses."""
        n = y.shape[0]
        if self.likelihood == "gaussian":
            return y.astype(float)
        if not np.all(np.equal(np.mod(y, 1), 0)):
            bad = int(np.flatnonzero(np.mod(y, 1) != 0)[0])
            raise DataError(
                f"y[{bad}] = {y[bad].item()!r} is not an integer label; the {self.likelihood} likelihood "
                "needs class labels (0/1 for bernoulli, 0..C-1 for categorical)"
            )
        labels = y.astype(np.int64)
        if self.likelihood == "bernoulli":
            outside = np.flatnonzero((labels != 0) & (labels != 1))
            if outside.size:
                raise DataError(
                    f"{outside.size} of {n} labels lie outside {{0, 1}} (first: y[{outside[0]}] = "
                    f"{y[outside[0]].item()!r}); the bernoulli likelihood needs 0/1 labels — recode them, "
                    "or use likelihood='categorical'"
                )
        else:
            negative = np.flatnonzero(labels < 0)
            if negative.size:
                raise DataError(
                    f"{negative.size} labels are negative (first: y[{negative[0]}] = {y[negative[0]].item()!r}); "
                    "categorical labels must be 0..C-1"
                )
            if self.num_classes is not None and labels.max() >= self.num_classes:
                bad = int(np.flatnonzero(labels >= self.num_classes)[0])
                raise DataError(
                    f"y[{bad}] = {labels[bad]} but num_classes={self.num_classes}; labels must be "
                    f"0..{self.num_classes - 1} — raise num_classes or recode the labels"
                )
        return labels.astype(np.int32)

    # -- configuration I/O ----------------------------------------------------------------------
    def to_config(self) -> dict:
        """A JSON-able description from which ``ppl.models.from_config`` rebuilds the model."""
        from ppl.models import priors as _priors

        fields = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, _priors.Prior):
                value = {"prior": type(value).__name__, **dataclasses.asdict(value)}
            elif isinstance(value, tuple):
                value = list(value)
            fields[field.name] = value
        return {"class": type(self).__name__, "fields": fields}


def check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not one of {', '.join(map(repr, choices))}")


def check_flag(name: str, value) -> None:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {value!r}")


def check_scale(name: str, value, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    valid = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))
    try:
        valid = valid and bool(np.isfinite(float(value))) and value > 0
    except OverflowError:
        valid = False
    if not valid:
        extra = " or None (learn it)" if allow_none else ""
        raise ValueError(f"{name} must be a positive finite number{extra}, got {value!r}")
