"""The one Gaussian family shared by every Gaussian approximation (SVI guides, exact, Laplace, SWAG).

A :class:`Gaussian` is a mean plus a covariance operator over the flat unconstrained parameter
vector. Operators implement the same small interface, so sampling, densities, entropies and
linearised predictions are written once:

* :class:`Diagonal` — Σ = diag(d²)
* :class:`LowRankDiagonal` — Σ = diag(d²) + W Wᵀ (W is P × r)
* :class:`Full` — Σ = L Lᵀ with L lower triangular

:class:`PointMass` is the degenerate member used by point estimates (MAP, the delta guide): it
samples its location and has no density.
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import solve_triangular

__all__ = ["Gaussian", "Diagonal", "LowRankDiagonal", "Full", "PointMass", "from_arrays", "draw"]

_LOG_2PI = math.log(2.0 * math.pi)


@jax.tree_util.register_pytree_node_class
class Diagonal:
    """Σ = diag(scale²)."""

    kind = "diagonal"

    def __init__(self, scale):
        self.scale = scale

    def tree_flatten(self):
        return (self.scale,), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)

    @property
    def dim(self) -> int:
        return self.scale.shape[-1]

    @property
    def noise_dim(self) -> int:
        return self.dim

    def transform_noise(self, eps):
        return eps * jnp.broadcast_to(self.scale, eps.shape)

    def log_det(self):
        return 2.0 * jnp.sum(jnp.log(self.scale))

    def whitened_sq_norm(self, x):
        return jnp.sum(jnp.square(x / jnp.broadcast_to(self.scale, x.shape)), axis=-1)

    def variance(self):
        return jnp.square(self.scale)

    def sqrt_dense(self):
        return jnp.diag(self.scale)

    def arrays(self) -> dict:
        return {"scale": self.scale}


@jax.tree_util.register_pytree_node_class
class LowRankDiagonal:
    """Σ = diag(diag_scale²) + factor factorᵀ, factor of shape (P, r)."""

    kind = "low_rank"

    def __init__(self, factor, diag_scale):
        self.factor = factor
        self.diag_scale = diag_scale

    def tree_flatten(self):
        return (self.factor, self.diag_scale), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)

    @property
    def dim(self) -> int:
        return self.diag_scale.shape[-1]

    @property
    def noise_dim(self) -> int:
        return self.dim + self.factor.shape[-1]

    def transform_noise(self, eps):
        head = eps[..., : self.dim]
        return head * jnp.broadcast_to(self.diag_scale, head.shape) + eps[..., self.dim :] @ self.factor.T

    def _capacitance(self):
        # I + Wᵀ D⁻² W (r × r): Woodbury and the determinant lemma both go through it.
        scaled = self.factor / self.diag_scale[:, None]
        return jnp.eye(self.factor.shape[-1]) + scaled.T @ scaled

    def log_det(self):
        chol = jnp.linalg.cholesky(self._capacitance())
        return 2.0 * jnp.sum(jnp.log(self.diag_scale)) + 2.0 * jnp.sum(jnp.log(jnp.diag(chol)))

    def whitened_sq_norm(self, x):
        inv_d2 = jnp.broadcast_to(1.0 / jnp.square(self.diag_scale), x.shape)
        chol = jnp.linalg.cholesky(self._capacitance())
        proj = (x * inv_d2) @ self.factor
        sol = solve_triangular(chol, proj.T, lower=True).T
        return jnp.sum(jnp.square(x) * inv_d2, axis=-1) - jnp.sum(jnp.square(sol), axis=-1)

    def variance(self):
        return jnp.square(self.diag_scale) + jnp.sum(jnp.square(self.factor), axis=-1)

    def sqrt_dense(self):
        return jnp.concatenate([jnp.diag(self.diag_scale), self.factor], axis=1)

    def arrays(self) -> dict:
        return {"factor": self.factor, "diag_scale": self.diag_scale}


@jax.tree_util.register_pytree_node_class
class Full:
    """Σ = L Lᵀ, ``scale_tril`` lower triangular with a positive diagonal."""

    kind = "full"

    def __init__(self, scale_tril):
        self.scale_tril = scale_tril

    def tree_flatten(self):
        return (self.scale_tril,), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)

    @property
    def dim(self) -> int:
        return self.scale_tril.shape[-1]

    @property
    def noise_dim(self) -> int:
        return self.dim

    def transform_noise(self, eps):
        return eps @ self.scale_tril.T

    def log_det(self):
        return 2.0 * jnp.sum(jnp.log(jnp.abs(jnp.diag(self.scale_tril))))

    def whitened_sq_norm(self, x):
        sol = solve_triangular(self.scale_tril, jnp.atleast_2d(x).T, lower=True).T
        return jnp.reshape(jnp.sum(jnp.square(sol), axis=-1), jnp.shape(x)[:-1])

    def variance(self):
        return jnp.sum(jnp.square(self.scale_tril), axis=-1)

    def sqrt_dense(self):
        return self.scale_tril

    def arrays(self) -> dict:
        return {"scale_tril": self.scale_tril}


_OPERATORS = {cls.kind: cls for cls in (Diagonal, LowRankDiagonal, Full)}


@jax.tree_util.register_pytree_node_class
class Gaussian:
    """N(loc, Σ) over the flat unconstrained parameter vector; Σ given by an operator above.

    >>> import jax, jax.numpy as jnp
    >>> q = Gaussian(jnp.zeros(3), Diagonal(jnp.ones(3)))
    >>> q.sample(jax.random.key(0), 5).shape
    (5, 3)
    """

    has_density = True

    def __init__(self, loc, cov):
        self.loc = loc
        self.cov = cov

    def tree_flatten(self):
        return (self.loc, self.cov), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)

    @property
    def kind(self) -> str:
        return self.cov.kind

    @property
    def mean(self):
        return self.loc

    def variance(self):
        return self.cov.variance()

    def sample(self, key, n: int):
        eps = jax.random.normal(key, (n, self.cov.noise_dim), dtype=self.loc.dtype)
        return self.loc[None, :] + self.cov.transform_noise(eps)

    def log_prob(self, x):
        d = self.cov.dim
        centred = x - jnp.broadcast_to(self.loc, jnp.shape(x))
        return -0.5 * (d * _LOG_2PI + self.cov.log_det() + self.cov.whitened_sq_norm(centred))

    def entropy(self):
        return 0.5 * (self.cov.dim * (1.0 + _LOG_2PI) + self.cov.log_det())

    def covariance_sqrt(self):
        """A dense S with Σ = S Sᵀ (P × K); used for exact linearised variances."""
        return self.cov.sqrt_dense()

    def arrays(self) -> dict:
        return {"loc": self.loc, **self.cov.arrays()}


@jax.tree_util.register_pytree_node_class
class PointMass:
    """A point estimate: every sample is ``loc``; there is no density."""

    has_density = False
    kind = "point"

    def __init__(self, loc):
        self.loc = loc

    def tree_flatten(self):
        return (self.loc,), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)

    @property
    def mean(self):
        return self.loc

    def variance(self):
        return jnp.zeros_like(self.loc)

    def sample(self, key, n: int):
        return jnp.broadcast_to(self.loc, (n, self.loc.shape[-1]))

    def log_prob(self, x):
        raise TypeError("a point estimate has no density; log_prob needs a Gaussian approximation (exact, svi)")

    def arrays(self) -> dict:
        return {"loc": self.loc}


@partial(jax.jit, static_argnames=("num",))
def draw(family, key, num: int):
    """``num`` draws from any family (compiled once per family layout and ``num``)."""
    return family.sample(key, num)


_FIELDS = {"point": ("loc",), "diagonal": ("loc", "scale"), "low_rank": ("loc", "factor", "diag_scale"),
           "full": ("loc", "scale_tril")}


def from_arrays(kind: str, arrays: dict, dim: int | None = None):
    """Rebuild a family saved with ``family.kind`` and ``family.arrays()``, checking every array's
    name, shape and values against the family (``dim``: the flat parameter count, when known)."""
    if kind == "flow":
        from ppl.inference.guides import flow_from_arrays

        return flow_from_arrays(arrays, dim if dim is not None else int(np.shape(arrays["shift"])[-1]))
    if kind not in _FIELDS:
        raise ValueError(f"unknown Gaussian family kind {kind!r}; known: {', '.join(_FIELDS)}")
    if set(arrays) != set(_FIELDS[kind]):
        raise ValueError(f"a {kind!r} family needs arrays {_FIELDS[kind]}, got {sorted(arrays)}")
    loc = arrays["loc"]
    dim = loc.shape[-1] if dim is None and loc.ndim == 1 else dim
    expected = {"loc": (dim,), "scale": (dim,), "diag_scale": (dim,), "scale_tril": (dim, dim)}
    for name, value in arrays.items():
        want = expected.get(name)
        if name == "factor":
            if value.ndim != 2 or value.shape[0] != dim:
                raise ValueError(f"array {name!r} has shape {list(value.shape)}; expected [{dim}, rank]")
        elif tuple(value.shape) != want:
            raise ValueError(f"array {name!r} has shape {list(value.shape)}; expected {list(want)}")
        if not np.all(np.isfinite(value)):
            raise ValueError(f"array {name!r} holds non-finite values")
    for name in ("scale", "diag_scale"):
        if name in arrays and not np.all(arrays[name] > 0):
            raise ValueError(f"array {name!r} must be positive")
    if "scale_tril" in arrays:
        tril = np.asarray(arrays["scale_tril"])
        if np.any(np.triu(tril, 1) != 0) or not np.all(np.diag(tril) > 0):
            raise ValueError("array 'scale_tril' must be lower triangular with a positive diagonal")
    arrays = {k: jnp.asarray(v) for k, v in arrays.items()}
    if kind == "point":
        return PointMass(arrays["loc"])
    loc = arrays.pop("loc")
    return Gaussian(loc, _OPERATORS[kind](**arrays))
