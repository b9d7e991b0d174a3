"""SVI guides as strategy objects: each says how to start its parameters and which family they describe.

A guide is a frozen, hashable dataclass with two methods:

* ``init(frame, key) -> params`` — variational parameters (a pytree) that start at ``frame``;
* ``family(params)`` — the approximation those parameters describe, an object the rest of ppl
  already understands (a :class:`~ppl.inference._gaussian.Gaussian`, a ``PointMass`` or a
  :class:`FlowFamily`): it samples, has ``log_prob`` (k-hat, IWAE), is saved and loaded.

Every guide is written in the coordinates of a fixed affine **frame** u = shift + S·v, found once
before training (``svi``'s ``init``; :class:`Frame`). Training moves the guide's own parameters in v,
where a well-chosen frame (the MAP and the inverse Hessian there) makes the target close to N(0, I):
Adam's fixed step then means the same thing on a coefficient with posterior sd 1e-3 and on one
with sd 10. The frame is part of the parameters (saved, checkpointed) but never trained: its
gradient is stopped, so Adam leaves it exactly where it started.

The objective (:mod:`ppl.inference.objectives`) only uses ``family(params)``, so any guide
composes with any objective.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from jax.scipy.linalg import solve_triangular

from ppl.inference._gaussian import Diagonal, Full, Gaussian, LowRankDiagonal, PointMass

__all__ = [
    "Frame", "MeanField", "LowRank", "FullRank", "Delta", "Flow", "FlowFamily", "Amortized", "WithLocal", "GUIDES",
    "make_guide",
]

INIT_SCALE = 0.1  # guide standard deviation without a curvature frame, as NumPyro's autoguides
_LOG_2PI = math.log(2.0 * math.pi)


class Frame(NamedTuple):
    """The fixed affine frame u = shift + S v the guide is written in.

    ``scale`` is the diagonal of S used by diagonal guides (mean-field, low-rank, delta); ``tril``
    is a dense lower-triangular S used by full-rank and flow guides (``None``: S = diag(scale));
    ``init_scale`` the guide's starting sd in frame units (1 for a curvature frame: the guide
    starts as the Laplace approximation).
    """

    shift: jax.Array
    scale: jax.Array
    tril: jax.Array | None = None
    init_scale: float = 1.0  # the guide's starting sd, in frame units

    @classmethod
    def plain(cls, shift) -> "Frame":
        """No curvature information: unit frame; the guide starts at ``shift`` with sd ``INIT_SCALE``
        (its location moves in the parameters' own units)."""
        return cls(shift, jnp.ones_like(shift), None, INIT_SCALE)

    def dense(self) -> jax.Array:
        return jnp.diag(self.scale) if self.tril is None else self.tril

    def log_init_scale(self) -> jax.Array:
        return jnp.full(self.shift.shape, math.log(self.init_scale), dtype=self.shift.dtype)


def _frozen(params: dict, *names) -> tuple:
    return tuple(jax.lax.stop_gradient(params[name]) for name in names)


@dataclass(frozen=True)
class MeanField:
    """N(μ, diag(σ²)); in the frame μ = shift + s·m, σ = s·exp(ρ), starting at m = 0, ρ = 0."""

    name = "mean_field"

    def init(self, frame: Frame, key) -> dict:
        zeros = jnp.zeros_like(frame.shift)
        return {"shift": frame.shift, "frame_scale": frame.scale, "loc": zeros, "log_scale": frame.log_init_scale()}

    def family(self, params):
        shift, s = _frozen(params, "shift", "frame_scale")
        return Gaussian(shift + s * params["loc"], Diagonal(s * jnp.exp(params["log_scale"])))


@dataclass(frozen=True)
class LowRank:
    """N(μ, diag(σ²) + W Wᵀ), W of shape (P, rank), all scaled by the frame's diagonal."""

    rank: int = 10
    name = "low_rank"

    def init(self, frame: Frame, key) -> dict:
        zeros = jnp.zeros_like(frame.shift)
        rank = min(self.rank, frame.shift.shape[0])
        # A zero factor is a stationary point of the ELBO in W: start it small and random. The
        # diagonal starts a little below the frame's so that diagonal + factor match it.
        factor = 0.01 * frame.init_scale * jax.random.normal(key, (frame.shift.shape[0], rank), dtype=frame.shift.dtype)
        return {"shift": frame.shift, "frame_scale": frame.scale, "loc": zeros, "log_scale": frame.log_init_scale(),
                "factor": factor}

    def family(self, params):
        shift, s = _frozen(params, "shift", "frame_scale")
        operator = LowRankDiagonal(s[:, None] * params["factor"], s * jnp.exp(params["log_scale"]))
        return Gaussian(shift + s * params["loc"], operator)


@dataclass(frozen=True)
class FullRank:
    """N(μ, L Lᵀ); in the frame μ = shift + S m and L = S L', L' lower triangular (exp diagonal)."""

    name = "full_rank"

    def init(self, frame: Frame, key) -> dict:
        dim = frame.shift.shape[0]
        zeros = jnp.zeros_like(frame.shift)
        return {"shift": frame.shift, "frame_tril": frame.dense(), "loc": zeros,
                "tril": jnp.zeros((dim, dim), dtype=frame.shift.dtype), "log_scale": frame.log_init_scale()}

    def family(self, params):
        shift, S = _frozen(params, "shift", "frame_tril")
        inner = jnp.tril(params["tril"], -1) + jnp.diag(jnp.exp(params["log_scale"]))
        # A product of lower-triangular matrices is lower triangular: Σ = (S L')(S L')ᵀ.
        return Gaussian(shift + S @ params["loc"], Full(S @ inner))


@dataclass(frozen=True)
class Delta:
    """A point mass at shift + s·m: MAP by SVI's optimiser (no density)."""

    name = "delta"

    def init(self, frame: Frame, key) -> dict:
        return {"shift": frame.shift, "frame_scale": frame.scale, "loc": jnp.zeros_like(frame.shift)}

    def family(self, params):
        shift, s = _frozen(params, "shift", "frame_scale")
        return PointMass(shift + s * params["loc"])


# -- normalising flow -------------------------------------------------------------------------------
def _flow_network(dim: int, hidden: tuple, flip: bool):
    from jax.example_libraries import stax
    from numpyro.nn import AutoregressiveNN

    order = jnp.arange(dim)[::-1] if flip else jnp.arange(dim)
    return AutoregressiveNN(dim, list(hidden), permutation=order, nonlinearity=stax.Elu)


def _iaf_shift_scale(apply_fn, weights, x):
    # One vector at a time (the network adds (width,) biases to (width,) activations): no implicit
    # rank promotion, whatever the batch shape.
    mean, log_scale = jax.vmap(lambda row: apply_fn(weights, row))(x)
    # Clipped as NumPyro's InverseAutoregressiveTransform does, with the gradient passed through.
    clipped = jnp.clip(log_scale, -5.0, 3.0)
    log_scale = log_scale + jax.lax.stop_gradient(clipped - log_scale)
    return mean, log_scale


@jax.tree_util.register_pytree_node_class
class FlowFamily:
    """q(u): ε ∼ N(0, I) pushed through ``num_flows`` inverse autoregressive flows (Kingma et al.
    2016; each flow reverses the previous one's variable order), then u = shift + S·v.

    Sampling and the density of its own samples cost one network pass per flow; the density of an
    arbitrary point inverts each flow, one pass per dimension (used for stored draws only).
    """

    has_density = True
    kind = "flow"

    def __init__(self, shift, tril, weights, hidden: tuple):
        self.shift, self.tril, self.weights, self.hidden = shift, tril, weights, tuple(hidden)

    def tree_flatten(self):
        return (self.shift, self.tril, self.weights), self.hidden

    @classmethod
    def tree_unflatten(cls, hidden, children):
        return cls(*children, hidden)

    @property
    def dim(self) -> int:
        return self.shift.shape[-1]

    def _networks(self):
        return [_flow_network(self.dim, self.hidden, i % 2 == 1)[1] for i in range(len(self.weights))]

    def sample_and_log_prob(self, key, n: int):
        eps = jax.random.normal(key, (n, self.dim), dtype=self.shift.dtype)
        log_q = -0.5 * jnp.sum(jnp.square(eps), axis=-1) - 0.5 * self.dim * _LOG_2PI
        x = eps
        for apply_fn, weights in zip(self._networks(), self.weights):
            mean, log_scale = _iaf_shift_scale(apply_fn, weights, x)
            x = jnp.exp(log_scale) * x + mean
            log_q = log_q - jnp.sum(log_scale, axis=-1)
        log_det_frame = jnp.sum(jnp.log(jnp.abs(jnp.diag(self.tril))))
        return self.shift[None, :] + x @ self.tril.T, log_q - log_det_frame

    def sample(self, key, n: int):
        return self.sample_and_log_prob(key, n)[0]

    def log_prob(self, u):
        u = jnp.atleast_2d(u)
        v = solve_triangular(self.tril, (u - self.shift[None, :]).T, lower=True).T
        log_q = -jnp.sum(jnp.log(jnp.abs(jnp.diag(self.tril)))) * jnp.ones(v.shape[0], v.dtype)
        for apply_fn, weights in reversed(list(zip(self._networks(), self.weights))):
            # Invert y = exp(s(x))·x + m(x): x_i depends on y and x_<i only, so D sweeps fix it.
            def sweep(_, x, y=v, apply_fn=apply_fn, weights=weights):
                mean, log_scale = _iaf_shift_scale(apply_fn, weights, x)
                return (y - mean) * jnp.exp(-log_scale)

            x = jax.lax.fori_loop(0, self.dim, sweep, jnp.zeros_like(v))
            log_q = log_q - jnp.sum(_iaf_shift_scale(apply_fn, weights, x)[1], axis=-1)
            v = x
        return log_q - 0.5 * jnp.sum(jnp.square(v), axis=-1) - 0.5 * self.dim * _LOG_2PI

    @property
    def mean(self):
        # The flow's mean has no closed form; a fixed 2000-draw estimate (used for reporting only).
        return jnp.mean(self.sample(jax.random.PRNGKey(0), 2000), axis=0)

    def variance(self):
        return jnp.var(self.sample(jax.random.PRNGKey(0), 2000), axis=0)

    def arrays(self) -> dict:
        flat, _ = ravel_pytree(self.weights)
        return {"shift": self.shift, "frame_tril": self.tril, "weights": flat,
                "hidden": np.asarray(self.hidden, dtype=np.int64), "num_flows": np.asarray(len(self.weights))}


def flow_weights(dim: int, hidden: tuple, num_flows: int, key, dtype) -> list:
    """Freshly initialised weights of ``num_flows`` autoregressive networks."""
    weights = []
    for i, flow_key in enumerate(jax.random.split(key, num_flows)):
        init_fn, _ = _flow_network(dim, hidden, i % 2 == 1)
        _, params = init_fn(flow_key, (dim,))
        weights.append(jax.tree_util.tree_map(lambda a: jnp.asarray(a, dtype=dtype), params))
    return weights


def flow_from_arrays(arrays: dict, dim: int) -> FlowFamily:
    """Rebuild a saved flow: the structure comes from its (checked) sizes, the numbers from ``weights``."""
    hidden = tuple(int(h) for h in np.atleast_1d(arrays["hidden"]))
    num_flows = int(arrays["num_flows"])
    if not 1 <= num_flows <= 64 or not hidden or any(not dim <= h <= 1 << 16 for h in hidden):
        raise ValueError(f"flow sizes num_flows={num_flows}, hidden={hidden} are out of range for dimension {dim}")
    for name in ("shift", "frame_tril", "weights"):
        # floating only: integer arrays edited in made sampling fail on their dtype instead of being refused
        if not np.issubdtype(np.asarray(arrays[name]).dtype, np.floating):
            raise ValueError(f"array {name!r} has dtype {np.asarray(arrays[name]).dtype}; a flow holds floats")
    dtype = np.asarray(arrays["weights"]).dtype
    template = jax.eval_shape(lambda: flow_weights(dim, hidden, num_flows, jax.random.PRNGKey(0), dtype))
    zeros = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), template)
    flat, unravel = ravel_pytree(zeros)
    weights = np.asarray(arrays["weights"])
    if weights.shape != flat.shape:
        raise ValueError(f"array 'weights' has shape {list(weights.shape)}; this flow needs {list(flat.shape)}")
    for name, want in (("shift", (dim,)), ("frame_tril", (dim, dim))):
        if tuple(np.shape(arrays[name])) != want:
            raise ValueError(f"array {name!r} has shape {list(np.shape(arrays[name]))}; expected {list(want)}")
    tril = np.asarray(arrays["frame_tril"])
    if np.any(np.triu(tril, 1) != 0) or not np.all(np.diag(tril) > 0):
        raise ValueError("array 'frame_tril' must be lower triangular with a positive diagonal")
    for name in ("shift", "frame_tril", "weights"):
        if not np.all(np.isfinite(arrays[name])):
            raise ValueError(f"array {name!r} holds non-finite values")
    return FlowFamily(jnp.asarray(arrays["shift"]), jnp.asarray(tril), unravel(jnp.asarray(weights)), hidden)


@dataclass(frozen=True)
class Flow:
    """Inverse autoregressive flow guide: ``num_flows`` MADE networks with hidden widths ``hidden``."""

    num_flows: int = 2
    hidden: tuple = ()
    name = "flow"

    def widths(self, dim: int) -> tuple:
        # A MADE layer narrower than its input cannot connect every output: at least the dimension.
        return self.hidden or (max(2 * dim, 8), max(2 * dim, 8))

    def init(self, frame: Frame, key) -> dict:
        weights = flow_weights(frame.shift.shape[0], self.widths(frame.shift.shape[0]), self.num_flows, key,
                               frame.shift.dtype)
        # The flow starts near N(0, I) in its own coordinates: scale the frame to the starting sd.
        return {"shift": frame.shift, "frame_tril": frame.dense() * frame.init_scale, "weights": weights}

    def family(self, params):
        shift, S = _frozen(params, "shift", "frame_tril")
        return FlowFamily(shift, S, params["weights"], self.widths(shift.shape[0]))


GUIDES = ("mean_field", "low_rank", "full_rank", "delta", "flow")


def make_guide(name: str, *, rank: int = 10, num_flows: int = 2, hidden: int | None = None):
    """The guide object registered as ``name`` (the ``svi`` options pick it)."""
    if name == "mean_field":
        return MeanField()
    if name == "low_rank":
        return LowRank(rank)
    if name == "full_rank":
        return FullRank()
    if name == "delta":
        return Delta()
    return Flow(num_flows, () if hidden is None else (int(hidden), int(hidden)))


# -- local latents ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Amortized:
    """q(z_i | x_i) = N(μ(x_i), diag s(x_i)²) for every datum's local latents, from one ``encoder``
    network (its parameters are the guide's): the cost does not grow with the number of data."""

    encoder: object
    name = "amortized"

    def init(self, key, dtype) -> list:
        return self.encoder.init(key, dtype)

    def encode(self, params, X) -> tuple:
        return self.encoder(params, X)


@dataclass(frozen=True)
class WithLocal:
    """A guide for a model with local latents: ``global_guide`` over the flat vector u (the
    decoder's weights) and an :class:`Amortized` guide over each datum's local latents."""

    global_guide: object
    local: Amortized
    name = "with_local"

    def init(self, frame: Frame, key) -> dict:
        global_key, local_key = jax.random.split(key)
        return {"global": self.global_guide.init(frame, global_key), "local": self.local.init(local_key, frame.shift.dtype)}

    def family(self, params):
        """The global family (what the Posterior's draws come from)."""
        return self.global_guide.family(params["global"])
