"""Variational autoencoder: a decoder network p(x | z), z ∼ N(0, I) per datum, an amortised encoder as guide.

The generative program, for data X (N, D):

    decoder weights  w{i}, b{i}   (flat prior: point-estimated; N(0, 1) with bayesian_decoder=True)
    sigma                         (gaussian likelihood without noise_scale: learned, ≥ SIGMA_FLOOR)
    for i in plate("data", N):
        z_i ~ N(0, I_L)                               a local latent, one row per datum
        x_i ~ Bernoulli(logits = f(z_i))  or  N(f(z_i), σ² I)

The decoder f is a dense network with hidden widths ``decoder_hidden`` (None: the encoder's
``hidden`` reversed; ``()``: a linear decoder, which with a Gaussian likelihood is probabilistic
PCA). The encoder q(z | x) = N(μ(x), diag s(x)²) is a dense network with widths ``hidden``
(:class:`Encoder`); it is the guide of the local latents, not part of the model.

``beta`` weighs the KL side of the objective (β-VAE); SVI multiplies it into its own ``beta``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.distributions import constraints

from ppl.core.errors import DataError
from ppl.models._base import ACTIVATIONS
from ppl.models._base import DATA_PLATE, check_choice, check_flag, check_scale

__all__ = ["VAE", "Encoder", "LATENT_SITE", "OBSERVED_X", "SIGMA_FLOOR"]

LATENT_SITE = "z"
OBSERVED_X = "x"
SIGMA_FLOOR = 1e-3  # a learned Gaussian decoder noise never goes below this (no collapse to zero)
VAE_LIKELIHOODS = ("bernoulli", "gaussian")


def _widths(value, name: str) -> tuple:
    value = (value,) if isinstance(value, (int, np.integer)) else value
    if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list)) or not all(
        isinstance(h, (int, np.integer)) and not isinstance(h, (bool, np.bool_)) and h >= 1 for h in value
    ):
        raise ValueError(f"VAE.{name} must be a tuple of positive integer widths, e.g. (256,) or (); got {value!r}")
    return tuple(int(h) for h in value)


def dense_stack(params: list, h, activation: str):
    """Apply dense layers [(W, b), ...] with ``activation`` between them (none after the last)."""
    act = ACTIVATIONS[activation]
    for i, (weight, bias) in enumerate(params):
        h = h @ weight + jnp.reshape(bias, (1,) * (jnp.ndim(h) - 1) + bias.shape)
        if i < len(params) - 1:
            h = act(h)
    return h


def init_dense(key, widths: tuple, dtype) -> list:
    """Glorot-uniform weights and zero biases for consecutive ``widths``."""
    layers = []
    for k, (fan_in, fan_out) in zip(jax.random.split(key, len(widths) - 1), zip(widths[:-1], widths[1:])):
        limit = np.sqrt(6.0 / (fan_in + fan_out))
        layers.append((jax.random.uniform(k, (fan_in, fan_out), dtype, -limit, limit), jnp.zeros(fan_out, dtype)))
    return layers


@dataclass(frozen=True)
class Encoder:
    """The amortised Gaussian encoder q(z | x) = N(μ(x), diag s(x)²): widths ``hidden``, output
    2 × latent_dim (μ and s = softplus(·) + 1e-6)."""

    input_dim: int
    latent_dim: int
    hidden: tuple
    activation: str = "relu"

    def init(self, key, dtype=None) -> list:
        dtype = jnp.zeros(()).dtype if dtype is None else dtype
        layers = init_dense(key, (self.input_dim, *self.hidden, 2 * self.latent_dim), dtype)
        # Start with s(x) ≈ 0.1·softplus⁻¹… : a small, data-independent spread (bias −2.25 → s ≈ 0.1).
        weight, bias = layers[-1]
        layers[-1] = (weight, bias.at[self.latent_dim:].set(-2.25))
        return layers

    def __call__(self, params: list, X):
        out = dense_stack(params, X, self.activation)
        return out[..., : self.latent_dim], jax.nn.softplus(out[..., self.latent_dim:]) + 1e-6


@dataclass(frozen=True)
class VAE:
    """Variational autoencoder (see the module docstring).

    >>> from ppl.models import VAE
    >>> model = VAE(latent_dim=2, hidden=(64,))
    """

    latent_dim: int = 2
    hidden: tuple = (256,)
    decoder_hidden: tuple | None = None
    likelihood: str = "bernoulli"
    noise_scale: float | None = None
    beta: float = 1.0
    bayesian_decoder: bool = False
    activation: str = "relu"

    unsupervised = True  # data is X alone

    def __post_init__(self):
        if isinstance(self.latent_dim, (bool, np.bool_)) or not isinstance(self.latent_dim, (int, np.integer)) or self.latent_dim < 1:
            raise ValueError(f"VAE.latent_dim must be a positive integer, got {self.latent_dim!r}")
        object.__setattr__(self, "latent_dim", int(self.latent_dim))
        object.__setattr__(self, "hidden", _widths(self.hidden, "hidden"))
        if self.decoder_hidden is not None:
            object.__setattr__(self, "decoder_hidden", _widths(self.decoder_hidden, "decoder_hidden"))
        check_choice("VAE.likelihood", self.likelihood, VAE_LIKELIHOODS)
        check_choice("VAE.activation", self.activation, tuple(ACTIVATIONS))
        check_scale("VAE.noise_scale", self.noise_scale, allow_none=True)
        check_scale("VAE.beta", self.beta)
        check_flag("VAE.bayesian_decoder", self.bayesian_decoder)
        if self.noise_scale is not None and self.likelihood != "gaussian":
            raise ValueError("VAE.noise_scale applies only to likelihood='gaussian'")

    # -- structure -----------------------------------------------------------------------------
    @property
    def decoder_widths(self) -> tuple:
        return tuple(reversed(self.hidden)) if self.decoder_hidden is None else self.decoder_hidden

    def decoder_sites(self, data_dim: int) -> list:
        widths = (self.latent_dim, *self.decoder_widths, int(data_dim))
        return [(f"w{i}", f"b{i}", widths[i], widths[i + 1]) for i in range(len(widths) - 1)]

    def encoder(self, data_dim: int) -> Encoder:
        return Encoder(int(data_dim), self.latent_dim, self.hidden, self.activation)

    def decode(self, params: dict, z):
        """Decoder output f(z): logits (bernoulli) or means (gaussian), shape (..., D)."""
        layers = [(params[f"w{i}"], params[f"b{i}"]) for i in range(len(self.decoder_widths) + 1)]
        return dense_stack(layers, z, self.activation)

    def noise(self, params: dict):
        return params["sigma"] if self.noise_scale is None else jnp.asarray(self.noise_scale)

    def observation(self, f, params: dict) -> dist.Distribution:
        if self.likelihood == "bernoulli":
            return dist.Bernoulli(logits=f).to_event(1)
        return dist.Normal(f, self.noise(params) * jnp.ones_like(f)).to_event(1)

    def prior(self, num: int) -> dist.Distribution:
        """p(z) = N(0, I) for ``num`` data points (full shapes: no implicit broadcasting)."""
        shape = (int(num), self.latent_dim)
        return dist.Normal(jnp.zeros(shape), jnp.ones(shape)).to_event(1)

    def mean_of(self, f):
        """E[x | z] from the decoder output."""
        return jax.nn.sigmoid(f) if self.likelihood == "bernoulli" else f

    def bind(self, X, y=None):
        return self

    def initial_params(self, key, data_dim: int, dtype=None) -> dict:
        """Constrained starting values of the global sites: Glorot-initialised decoder, sigma = 1
        (``dtype``: JAX's default float unless given)."""
        dtype = jnp.zeros(()).dtype if dtype is None else dtype
        layers = init_dense(key, (self.latent_dim, *self.decoder_widths, int(data_dim)), dtype)
        params = {}
        for i, (weight, bias) in enumerate(layers):
            params[f"w{i}"], params[f"b{i}"] = weight, bias
        if self.likelihood == "gaussian" and self.noise_scale is None:
            params["sigma"] = jnp.asarray(1.0)
        return params

    def num_global_params(self, data_dim: int) -> int:
        """How many global parameters the model has for ``data_dim``-dimensional data (from its
        configuration alone: a saved run's layout is checked against it before anything runs)."""
        total = sum(fan_in * fan_out + fan_out for _, _, fan_in, fan_out in self.decoder_sites(data_dim))
        return total + (1 if self.likelihood == "gaussian" and self.noise_scale is None else 0)

    # -- the program -----------------------------------------------------------------------------
    def __call__(self, X):
        N, D = X.shape
        params = {}
        for weight, bias, fan_in, fan_out in self.decoder_sites(D):
            for name, shape in ((weight, (fan_in, fan_out)), (bias, (fan_out,))):
                if self.bayesian_decoder:
                    prior = dist.Normal(jnp.zeros(shape), 1.0).to_event(len(shape))
                else:
                    prior = dist.ImproperUniform(constraints.real, (), shape)
                params[name] = numpyro.sample(name, prior)
        if self.likelihood == "gaussian" and self.noise_scale is None:
            params["sigma"] = numpyro.sample("sigma", dist.ImproperUniform(constraints.greater_than(SIGMA_FLOOR), (), ()))
        with numpyro.plate(DATA_PLATE, N):
            z = numpyro.sample(LATENT_SITE, self.prior(N))
            numpyro.sample(OBSERVED_X, self.observation(self.decode(params, z), params), obs=X)

    # -- data checks and configuration -------------------------------------------------------------
    def check_inputs(self, X: np.ndarray) -> np.ndarray:
        if self.likelihood == "bernoulli":
            outside = (X < 0) | (X > 1)
            if np.any(outside):
                first = tuple(int(i) for i in np.argwhere(outside)[0])
                raise DataError(
                    f"{int(outside.sum())} values of X lie outside [0, 1] (first: X{list(first)} = {X[first].item()!r}); the "
                    "bernoulli likelihood models binary (or [0, 1]) pixels — rescale or binarise the data, or use "
                    "likelihood='gaussian'"
                )
        return X.astype(float)

    def to_config(self) -> dict:
        fields = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            fields[field.name] = list(value) if isinstance(value, tuple) else value
        return {"class": type(self).__name__, "fields": fields}
