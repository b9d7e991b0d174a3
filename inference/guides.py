"""SVI guides as strategy objects: each says how to start its parameters and which family they describe.

A guide is a frozen, hashable dataclass with two methods:

* ``init(frame, key) -> params`` — variational parameters (a pytree) that start at ``frame``;
* ``family(params)`` — the approximation those parameters describe, an object the rest of ppl
  already understands (a :class:`~ppl.core.gaussian.Gaussian`, a ``PointMass`` or a
  :class:`FlowFamily`): it samples, has ``log_prob`` (k-hat, IWAE), is saved and loaded;

and declares what ``svi`` needs to know of it (the :class:`Guide` base gives the defaults):
``from_options`` (built from svi's options), ``has_density`` (False: a point, which takes the ELBO
only and stores one draw), ``factorised`` (independent coordinates, as local reparameterisation
needs), ``dense`` (what it holds as P × P arrays, for the memory refusal), ``remedy`` (the advice when
its k-hat fails) and ``check`` (options it refuses for a model's size).

The guides are registered by name in :data:`GUIDES` (name -> ``"module:Class"``, resolved on first
use, as the method registry is): adding one is a class and one line there, and the tests that run
every guide and objective enrol it.

Every guide is written in the coordinates of a fixed affine **frame** u = shift + S·v, found once
before training (``svi``'s ``init``; :class:`Frame`). Training moves the guide's own parameters in v,
where a well-chosen frame (the MAP and the inverse Hessian there) makes the target close to N(0, I):
Adam's fixed step then means the same thing on a coefficient with posterior sd 1e-3 and on one
with sd 10. The frame is part of the parameters (saved, checkpointed) but never trained: its
gradient is stopped, so Adam leaves it exactly where it started.

The objective (:mod:`ppl.core.objectives`) only uses ``family(params)``, so any guide
composes with any objective.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp

from ppl.core.curvature import site_offsets
from ppl.core.errors import OptionError, did_you_mean
from ppl.core.flow import FlowFamily, flow_weights
from ppl.core.gaussian import Diagonal, Full, Gaussian, KroneckerFactors, LowRankDiagonal, PointMass, Subset

__all__ = [
    "Frame", "Guide", "MeanField", "LowRank", "FullRank", "Delta", "Flow", "MatrixNormal", "FlowFamily", "Amortized",
    "WithLocal",
    "GUIDES", "guide_class", "make_guide",
]

INIT_SCALE = 0.1  # guide standard deviation without a curvature frame, as NumPyro's autoguides


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


class Guide:
    """What every guide declares beside ``init`` and ``family``; the defaults suit a Gaussian
    guide with a density, correlated coordinates and O(P) parameters."""

    name = ""
    has_density = True  # False: a point mass (ELBO only, one stored draw, no k-hat)
    factorised = False  # True: independent coordinates (local reparameterisation needs it)
    dense: str | None = None  # what it holds as P × P arrays (four copies while training), if any
    remedy: str | None = None  # the advice when q misses the posterior (k-hat fails); None: the method's

    @classmethod
    def from_options(cls, *, rank: int, num_flows: int, hidden: int | None, problem=None) -> Guide:
        """The guide from ``svi``'s options (each takes the ones it has) for ``problem`` (None: for
        no problem in particular, where the guide does not depend on one)."""
        return cls()

    def check(self, method: str, dim: int) -> None:
        """Refuse, before any work, options this guide cannot serve for ``dim`` parameters."""


_RICHER = "try guide='full_rank' (or 'flow'), or method='nuts'"


@dataclass(frozen=True)
class MeanField(Guide):
    """N(μ, diag(σ²)); in the frame μ = shift + s·m, σ = s·exp(ρ), starting at m = 0, ρ = 0."""

    name = "mean_field"
    factorised = True
    remedy = f"the mean_field guide is far from the posterior: {_RICHER}"

    def init(self, frame: Frame, key) -> dict:
        zeros = jnp.zeros_like(frame.shift)
        return {"shift": frame.shift, "frame_scale": frame.scale, "loc": zeros, "log_scale": frame.log_init_scale()}

    def family(self, params):
        shift, s = _frozen(params, "shift", "frame_scale")
        return Gaussian(shift + s * params["loc"], Diagonal(s * jnp.exp(params["log_scale"])))


@dataclass(frozen=True)
class LowRank(Guide):
    """N(μ, diag(σ²) + W Wᵀ), W of shape (P, rank), all scaled by the frame's diagonal."""

    rank: int = 10
    name = "low_rank"
    remedy = f"the low_rank guide is far from the posterior: {_RICHER}"

    @classmethod
    def from_options(cls, *, rank, num_flows, hidden, problem=None):
        return cls(rank)

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
class FullRank(Guide):
    """N(μ, L Lᵀ); in the frame μ = shift + S m and L = S L', L' lower triangular (exp diagonal)."""

    name = "full_rank"
    dense = "a full-rank guide"
    remedy = "a Gaussian guide is far from the posterior: try guide='flow', or method='nuts'"

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
class Delta(Guide):
    """A point mass at shift + s·m: MAP by SVI's optimiser (no density)."""

    name = "delta"
    has_density = False

    def init(self, frame: Frame, key) -> dict:
        return {"shift": frame.shift, "frame_scale": frame.scale, "loc": jnp.zeros_like(frame.shift)}

    def family(self, params):
        shift, s = _frozen(params, "shift", "frame_scale")
        return PointMass(shift + s * params["loc"])


@dataclass(frozen=True)
class Flow(Guide):
    """Inverse autoregressive flow guide: ``num_flows`` MADE networks with hidden widths ``hidden``."""

    num_flows: int = 2
    hidden: tuple = ()
    name = "flow"
    dense = "a flow guide's frame"

    @classmethod
    def from_options(cls, *, rank, num_flows, hidden, problem=None):
        return cls(num_flows, () if hidden is None else (int(hidden), int(hidden)))

    def check(self, method, dim):
        if self.hidden and self.hidden[0] < dim:
            raise OptionError(
                f"{method}: a flow's autoregressive network needs flow_hidden ≥ the number of parameters ({dim}); got "
                f"flow_hidden={self.hidden[0]} — raise it or leave it None (2 × parameters)"
            )

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


@dataclass(frozen=True)
class MatrixNormal(Guide):
    """Structured mean-field (Louizos & Welling 2017): each dense layer's weight matrix W (a × g) is
    matrix-normal, vec(W) ~ N(vec(M), U ⊗ V), U = L_a L_aᵀ between its rows and V = L_g L_gᵀ between
    its columns; biases and every other coordinate are mean-field. a² + g² numbers a layer instead of
    full-rank's (a·g)².

    ``segments`` lay the flat vector out in order: ``("kron", start, a, g)`` for a layer's weights,
    ``("diag", start, size)`` for the coordinates between. In the frame u = shift + s·v the mean moves
    per coordinate; a layer's factors are scaled by the geometric mean of s over its weights (a
    Kronecker product scaled coordinate by coordinate would not be one), and start at the frame's
    starting sd times the identity."""

    segments: tuple = ()
    name = "matrix_normal"
    remedy = f"the matrix_normal guide is far from the posterior: {_RICHER}"

    @classmethod
    def from_options(cls, *, rank, num_flows, hidden, problem=None):
        if problem is None:
            return cls()
        if not (problem.is_declarative and problem.model.has_layers):
            what = type(problem.model).__name__ if problem.is_declarative else "plain NumPyro program"
            raise OptionError(
                f"svi: guide='matrix_normal' needs the network's dense layers, and this {what} declares none — use "
                "guide='mean_field', 'low_rank' or 'full_rank'"
            )
        offsets = site_offsets(problem)
        layers = sorted((offsets[layer.weight][0], layer.fan_in, layer.fan_out) for layer in problem.layers())
        segments, at = [], 0
        for start, a, g in layers:
            if start > at:
                segments.append(("diag", at, start - at))
            segments.append(("kron", start, a, g))
            at = start + a * g
        if at < problem.num_params:
            segments.append(("diag", at, problem.num_params - at))
        return cls(tuple(segments))

    def _kron(self):
        return [segment for segment in self.segments if segment[0] == "kron"]

    def init(self, frame: Frame, key) -> dict:
        zeros = jnp.zeros_like(frame.shift)
        half = 0.5 * math.log(frame.init_scale)
        factors = [
            (jnp.diag(jnp.full(a, half, frame.shift.dtype)), jnp.diag(jnp.full(g, half, frame.shift.dtype)))
            for _, _, a, g in self._kron()
        ]
        return {"shift": frame.shift, "frame_scale": frame.scale, "loc": zeros, "log_scale": frame.log_init_scale(),
                "factors": factors}

    def family(self, params):
        shift, s = _frozen(params, "shift", "frame_scale")
        blocks, factors = [], iter(params["factors"])
        for segment in self.segments:
            if segment[0] == "diag":
                _, start, size = segment
                piece = slice(start, start + size)
                blocks.append(Diagonal(s[piece] * jnp.exp(params["log_scale"][piece])))
                continue
            _, start, a, g = segment
            raw_a, raw_g = next(factors)
            root = jnp.sqrt(jnp.exp(jnp.mean(jnp.log(s[start : start + a * g]))))
            la = root * (jnp.tril(raw_a, -1) + jnp.diag(jnp.exp(jnp.diag(raw_a))))
            lg = root * (jnp.tril(raw_g, -1) + jnp.diag(jnp.exp(jnp.diag(raw_g))))
            blocks.append(KroneckerFactors(la, lg))
        dim = shift.shape[0]
        return Gaussian(shift + s * params["loc"], Subset(jnp.arange(dim), tuple(blocks), dim))


# name -> "module:Class", resolved on first use
GUIDES = {
    "mean_field": "ppl.inference.guides:MeanField",
    "low_rank": "ppl.inference.guides:LowRank",
    "full_rank": "ppl.inference.guides:FullRank",
    "delta": "ppl.inference.guides:Delta",
    "flow": "ppl.inference.guides:Flow",
    "matrix_normal": "ppl.inference.guides:MatrixNormal",
}


def guide_class(name: str) -> type:
    """The guide class registered as ``name``."""
    if name not in GUIDES:
        raise OptionError(f"unknown guide {name!r}{did_you_mean(name, GUIDES)}; valid guides: {', '.join(GUIDES)}")
    module, cls = GUIDES[name].split(":")
    return getattr(importlib.import_module(module), cls)


def make_guide(name: str, *, rank: int = 10, num_flows: int = 2, hidden: int | None = None, problem=None) -> Guide:
    """The guide registered as ``name``, built from the ``svi`` options for ``problem``."""
    return guide_class(name).from_options(rank=rank, num_flows=num_flows, hidden=hidden, problem=problem)


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
