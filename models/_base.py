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

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

from ppl.core.errors import DataError
from ppl.models.priors import Prior, prior_record

LIKELIHOODS = ("gaussian", "bernoulli", "categorical", "heteroscedastic")
# Likelihoods of real-valued targets (regression). "heteroscedastic" is a Gaussian whose
# log-variance the network predicts per input: two outputs, mean and log σ².
REGRESSION_LIKELIHOODS = ("gaussian", "heteroscedastic")
ACTIVATIONS = {
    "relu": jax.nn.relu,
    "tanh": jnp.tanh,
    "gelu": jax.nn.gelu,
}
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
        if self.likelihood == "heteroscedastic":
            return 2
        if self.multi_output:
            return int(self.num_outputs)
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

    # Inputs are (N, D) rows; a model that takes (N, ...) arrays of any rank (images) says so.
    accepts_array_inputs = False

    @property
    def dense(self) -> bool:
        """Whether the network is the stack of dense layers :meth:`layers` lists (what K-FAC, the
        closed-form last-layer GGN and the local reparameterisation need)."""
        return True

    @property
    def has_layers(self) -> bool:
        """Whether :meth:`layers` and :meth:`forward` describe the network layer by layer (what K-FAC
        needs; a layer may be applied at several locations, as a convolution is)."""
        return self.dense

    def network_sites(self, input_dim: int) -> tuple:
        """Names of the real-valued sites ``apply`` reads (every weight and bias), in site order."""
        return tuple(name for _, sites in self.parameter_groups(input_dim) for name in sites)

    def parameter_groups(self, input_dim: int) -> tuple:
        """((name, site names), ...) per layer, input to output: the groups that per-layer prior
        scales and Laplace's per-layer prior precision address."""
        return tuple(
            (layer.weight, (layer.weight,) + ((layer.bias,) if layer.bias is not None else ()))
            for layer in self.layers(input_dim)
        )

    def last_layer_sites(self, input_dim: int) -> tuple | None:
        """Site names of the output layer (``subset="last_layer"``), or None when it is unknown."""
        return self.parameter_groups(input_dim)[-1][1]

    @property
    def num_outputs(self):
        """K for multi-output Gaussian regression (targets (N, K)); None for one target per input."""
        return None

    @property
    def multi_output(self) -> bool:
        """Gaussian regression on K ≥ 2 targets per input, each with its own noise scale."""
        return self.likelihood == "gaussian" and (self.num_outputs or 1) > 1

    def forward(self, params: dict, X, taps=None) -> tuple:
        """(output, inputs): the network's output for constrained ``params`` at ``X`` and the input
        ``h`` (B, fan_in) of every dense layer in :meth:`layers` order.

        ``taps``, when given, is one array (B, fan_out) per layer added to that layer's
        pre-activation: the gradient of anything with respect to a tap is the gradient with respect
        to the pre-activation (what K-FAC needs). ``apply`` is this forward pass without taps.
        """
        h, inputs = X, []
        for i, layer in enumerate(self.layers(X.shape[-1])):
            inputs.append(h)
            pre = h @ jnp.reshape(params[layer.weight], (layer.fan_in, layer.fan_out))
            if layer.bias is not None:
                pre = pre + jnp.reshape(params[layer.bias], (1, layer.fan_out))
            if taps is not None:
                pre = pre + taps[i]
            h = pre if layer.activation is None else ACTIVATIONS[layer.activation](pre)
        return self.squeeze(h), inputs

    def squeeze(self, h):
        """The network's last-layer output as ``apply`` returns it: (B,) for one output unit."""
        return h if self.likelihood in ("categorical", "heteroscedastic") or self.multi_output else h[..., 0]

    def apply(self, params: dict, X):
        """The likelihood's natural parameter (mean or logits) at inputs ``X``."""
        return self.forward(params, X)[0]

    def output_hessian_sqrt(self, f, params: dict):
        """L (B, C, C) with L Lᵀ = Λ(f), the Hessian of −log p(y | f) in the outputs f, per datum.

        Λ does not depend on y for these likelihoods: 1/σ² (gaussian), p(1 − p) (bernoulli, p the
        probability of class 1) and diag(p) − p pᵀ (categorical, whose square root is
        diag(√p) − p √pᵀ since Σ p = 1). C = 1 for gaussian and bernoulli (``f`` of shape (B,));
        multi-output Gaussian regression has Λ = diag(1/σ_k²) over its K outputs.
        For ``heteroscedastic`` (outputs μ and s = log σ²) the Hessian depends on y and is not
        positive semi-definite, so its expectation over y, the Fisher information diag(e^(−s), ½),
        is used (the standard GGN choice).
        """
        if self.likelihood == "heteroscedastic":
            first = jnp.exp(-0.5 * f[:, 1])
            zero = jnp.zeros_like(first)
            half = jnp.full_like(first, 0.5**0.5)
            return jnp.stack([jnp.stack([first, zero], -1), jnp.stack([zero, half], -1)], -2)
        if self.likelihood == "gaussian":
            root = jnp.broadcast_to(1.0 / self.noise(params), f.shape)
            return jax.vmap(jnp.diag)(root) if self.multi_output else root[:, None, None]
        if self.likelihood == "bernoulli":
            return jnp.exp(0.5 * (jax.nn.log_sigmoid(f) + jax.nn.log_sigmoid(-f)))[:, None, None]
        p = jax.nn.softmax(f, axis=-1)
        root = jnp.sqrt(p)
        return jax.vmap(jnp.diag)(root) - p[:, :, None] * root[:, None, :]

    # -- Gaussian weight priors (what Laplace's prior-precision options rewrite) ----------------
    @property
    def gaussian_prior(self) -> bool:
        """Whether every weight and bias has a zero-mean Gaussian prior."""
        prior = getattr(self, "_prior", None)
        return True if prior is None else prior.gaussian

    def with_prior_scales(self, scales: tuple):
        """This model with N(0, scales[l]²) on the weights and biases of dense layer ``l``."""
        raise NotImplementedError

    def with_noise_scale(self, noise_scale: float):
        """This model with the Gaussian observation noise fixed to ``noise_scale``."""
        if self.likelihood != "gaussian" or "noise_scale" not in {f.name for f in dataclasses.fields(self)}:
            raise ValueError(f"{type(self).__name__} has no Gaussian noise scale to fix")
        return dataclasses.replace(self, noise_scale=float(noise_scale))

    def bind(self, X, y):
        """A copy with everything read from the data filled in (here: nothing)."""
        return self

    def noise(self, params: dict):
        """Observation noise σ of a Gaussian likelihood: learned ``sigma`` site or the fixed scale;
        one per output (K,) for multi-output regression."""
        if self.noise_scale is None:
            return params["sigma"]
        scale = jnp.asarray(self.noise_scale)
        return jnp.broadcast_to(scale, (self.num_outputs,)) if self.multi_output else scale

    def predictive_moments(self, f, params: dict) -> tuple:
        """(mean, noise sd) of p(y | f) for regression: sd is a scalar σ (gaussian), one per output
        (K,) (multi-output) or one per input (heteroscedastic)."""
        if self.likelihood == "heteroscedastic":
            return f[..., 0], jnp.exp(0.5 * f[..., 1])
        return f, self.noise(params)

    def observation(self, f, params: dict) -> dist.Distribution:
        """p(y | f): ``f`` is ``apply``'s output for a batch of inputs."""
        if self.likelihood == "heteroscedastic":
            return dist.Normal(f[..., 0], jnp.exp(0.5 * f[..., 1]))
        if self.likelihood == "gaussian":
            normal = dist.Normal(f, self.noise(params))
            return normal.to_event(1) if self.multi_output else normal
        if self.likelihood == "bernoulli":
            return dist.Bernoulli(logits=f)
        return dist.Categorical(logits=f)

    def _sample_noise(self):
        if self.likelihood == "gaussian" and self.noise_scale is None:
            if self.multi_output:
                return {"sigma": numpyro.sample("sigma", dist.HalfNormal(jnp.ones(self.num_outputs)).to_event(1))}
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
        if y.ndim == 2:
            if self.num_outputs is not None and y.shape[1] != self.num_outputs:
                raise DataError(
                    f"y has {y.shape[1]} target columns but {type(self).__name__}.num_outputs={self.num_outputs}; "
                    "they must agree (leave num_outputs=None to read it from the targets)"
                )
            return y.astype(float)
        if self.num_outputs is not None and self.num_outputs > 1:
            raise DataError(
                f"{type(self).__name__}.num_outputs={self.num_outputs} needs targets of shape (N, {self.num_outputs}), "
                f"got 1-D targets of shape {y.shape}"
            )
        if self.likelihood in REGRESSION_LIKELIHOODS:
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
        fields = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, Prior):
                value = prior_record(value)
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


def image_patches(h, size: int):
    """(N, H, W, size·size·C): each pixel's size × size neighbourhood, zero-padded as 'SAME' pads,
    flattened in (row, column, channel) order — the im2col matrix of a stride-1 convolution."""
    low = (size - 1) // 2
    height, width = h.shape[1], h.shape[2]
    padded = jnp.pad(h, ((0, 0), (low, size - 1 - low), (low, size - 1 - low), (0, 0)))
    return jnp.concatenate(
        [padded[:, dy:dy + height, dx:dx + width, :] for dy in range(size) for dx in range(size)], axis=-1
    )
