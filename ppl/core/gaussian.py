"""The one Gaussian family shared by every Gaussian approximation (SVI guides, exact, Laplace, SWAG).

A :class:`Gaussian` is a mean plus a covariance operator over the flat unconstrained parameter
vector. Operators implement the same small interface, so sampling, densities, entropies and
linearised predictions are written once:

* :class:`Diagonal` — Σ = diag(d²)
* :class:`LowRankDiagonal` — Σ = diag(d²) + W Wᵀ (W is P × r)
* :class:`Full` — Σ = L Lᵀ with L lower triangular
* :class:`Kronecker` — one dense layer's K-FAC posterior, precision w·(A ⊗ G) + δ I, kept as the
  eigenbases of A and G and the (a × g) grid of posterior standard deviations along them
* :class:`PrecisionLowRank` — precision diag(d) + U diag(λ) Uᵀ (a low-rank curvature from its
  eigenpairs plus a diagonal prior), kept as a symmetric square root of Σ
* :class:`Subset` — a block-diagonal Gaussian over some coordinates (last layer, subnetwork, or
  all of them); the others are held at the mean (zero variance)

Every operator also gives ``jacobian_variance(jac)``: J Σ Jᵀ for Jacobians ``jac`` (..., C, dim) of
a network's C outputs, the output covariance of the linearised network, computed from its
structure without a dense P × P matrix. :class:`Mixture` is a weighted mixture of such Gaussians.

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

from ppl.core.flow import flow_from_arrays

__all__ = [
    "Gaussian", "Diagonal", "LowRankDiagonal", "Full", "Kronecker", "KroneckerFactors", "PrecisionLowRank", "Subset",
    "Mixture",
    "PointMass", "from_arrays", "draw", "stored_draws_mismatch",
]

_LOG_2PI = math.log(2.0 * math.pi)


@jax.tree_util.register_pytree_node_class
class Diagonal:
    """Σ = diag(scale²)."""

    kind = "diagonal"
    fields = ("scale",)

    @staticmethod
    def check_arrays(arrays: dict) -> int:
        """The coordinates a saved operator covers, after checking its arrays (ValueError if not)."""
        return _positive_vector(arrays["scale"], "scale")

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

    def jacobian_variance(self, jac):
        scaled = jac * jnp.broadcast_to(self.scale, jac.shape)
        return scaled @ jnp.swapaxes(scaled, -1, -2)

    def arrays(self) -> dict:
        return {"scale": self.scale}


@jax.tree_util.register_pytree_node_class
class LowRankDiagonal:
    """Σ = diag(diag_scale²) + factor factorᵀ, factor of shape (P, r)."""

    kind = "low_rank"
    fields = ("factor", "diag_scale")

    @staticmethod
    def check_arrays(arrays: dict) -> int:
        size = _positive_vector(arrays["diag_scale"], "diag_scale")
        factor = np.asarray(arrays["factor"])
        if factor.ndim != 2 or factor.shape[0] != size:
            raise ValueError(f"array 'factor' has shape {list(factor.shape)}; expected [{size}, rank]")
        return size

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

    def _basis(self):
        """(U, λ, E): D⁻¹W = U T with U (P, r) orthonormal (thin QR), and T Tᵀ = E diag(λ) Eᵀ, so that
        Σ = D (I + U T Tᵀ Uᵀ) D. Everything below goes through these, never through the capacitance
        I + Wᵀ D⁻² W: where a coordinate's diagonal scale is tiny (SWAG floors a coordinate SGD never
        moved at float resolution) that matrix's entries reach 1e10 and its float32 Cholesky fails
        (NaN), and the Woodbury form of the whitened norm cancels catastrophically."""
        basis, upper = jnp.linalg.qr(self.factor / self.diag_scale[:, None])
        values, vectors = jnp.linalg.eigh(upper @ upper.T)
        return basis, jnp.maximum(values, 0.0), vectors

    def log_det(self):
        _, values, _ = self._basis()
        return 2.0 * jnp.sum(jnp.log(self.diag_scale)) + jnp.sum(jnp.log1p(values))

    def whitened_sq_norm(self, x):
        # v = D⁻¹x split into its part outside span(U), whose squared norm counts in full, and its
        # coordinates c = Uᵀv inside, weighted by (I + T Tᵀ)⁻¹: a sum of non-negative terms.
        basis, values, vectors = self._basis()
        v = x / jnp.broadcast_to(self.diag_scale, x.shape)
        inside = v @ basis
        outside = v - inside @ basis.T
        rotated = inside @ vectors
        weight = jnp.broadcast_to(1.0 + values, rotated.shape)
        return jnp.sum(jnp.square(outside), axis=-1) + jnp.sum(jnp.square(rotated) / weight, axis=-1)

    def variance(self):
        return jnp.square(self.diag_scale) + jnp.sum(jnp.square(self.factor), axis=-1)

    def jacobian_variance(self, jac):
        scaled, projected = jac * jnp.broadcast_to(self.diag_scale, jac.shape), jac @ self.factor
        return scaled @ jnp.swapaxes(scaled, -1, -2) + projected @ jnp.swapaxes(projected, -1, -2)

    def arrays(self) -> dict:
        return {"factor": self.factor, "diag_scale": self.diag_scale}


@jax.tree_util.register_pytree_node_class
class Full:
    """Σ = L Lᵀ, ``scale_tril`` lower triangular with a positive diagonal."""

    kind = "full"
    fields = ("scale_tril",)

    @staticmethod
    def check_arrays(arrays: dict) -> int:
        tril = np.asarray(arrays["scale_tril"])
        size = tril.shape[0] if tril.ndim == 2 else -1
        _shape(tril, (size, size), "scale_tril")
        if np.any(np.triu(tril, 1) != 0) or not np.all(np.diag(tril) > 0):
            raise ValueError("array 'scale_tril' must be lower triangular with a positive diagonal")
        return size

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

    def jacobian_variance(self, jac):
        projected = jac @ self.scale_tril
        return projected @ jnp.swapaxes(projected, -1, -2)

    def arrays(self) -> dict:
        return {"scale_tril": self.scale_tril}


@jax.tree_util.register_pytree_node_class
class Kronecker:
    """One dense layer's K-FAC posterior over its (fan_in + 1) × fan_out augmented weights.

    The layer's weights and bias, flattened row by row as ``[W; b]`` (the bias a homogeneous input
    coordinate), have precision w·(A ⊗ G) + δ I. With A = Q_A diag(a) Q_Aᵀ and G = Q_G diag(g) Q_Gᵀ
    that is (Q_A ⊗ Q_G) diag(w a ⊗ g + δ) (Q_A ⊗ Q_G)ᵀ, so Σ^(1/2) ε = vec(Q_A (S ∘ E) Q_Gᵀ) with
    ``scale`` S_ij = (w a_i g_j + δ)^(-1/2): nothing larger than A or G is ever formed.
    """

    kind = "kronecker"
    fields = ("qa", "qg", "scale")

    @staticmethod
    def check_arrays(arrays: dict) -> int:
        qa, qg, scale = (np.asarray(arrays[k]) for k in ("qa", "qg", "scale"))
        if scale.ndim != 2:
            raise ValueError(f"array 'scale' has shape {list(scale.shape)}; expected [fan_in + 1, fan_out]")
        _shape(qa, (scale.shape[0],) * 2, "qa")
        _shape(qg, (scale.shape[1],) * 2, "qg")
        for name, q in (("qa", qa), ("qg", qg)):
            if not np.allclose(q.T @ q, np.eye(q.shape[0]), atol=1e-6 * max(1, q.shape[0])):
                raise ValueError(f"array {name!r} is not an orthonormal eigenbasis")
        if not np.all(scale > 0):
            raise ValueError("array 'scale' must be positive")
        return scale.size

    def __init__(self, qa, qg, scale):
        self.qa, self.qg, self.scale = qa, qg, scale

    def tree_flatten(self):
        return (self.qa, self.qg, self.scale), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)

    @property
    def dim(self) -> int:
        return self.scale.shape[0] * self.scale.shape[1]

    @property
    def noise_dim(self) -> int:
        return self.dim

    def _grid(self, x):
        return jnp.reshape(x, (*x.shape[:-1], *self.scale.shape))

    def _rotate_in(self, x):
        """Coordinates of x (..., dim) in the eigenbasis: Q_Aᵀ X Q_G, shape (..., a, g)."""
        return jnp.swapaxes(self.qa, 0, 1) @ self._grid(x) @ self.qg  # two matmuls, never one 3-way contraction

    def transform_noise(self, eps):
        grid = self._grid(eps)
        grid = self.qa @ (grid * jnp.broadcast_to(self.scale, grid.shape)) @ jnp.swapaxes(self.qg, 0, 1)
        return jnp.reshape(grid, eps.shape)

    def log_det(self):
        return 2.0 * jnp.sum(jnp.log(self.scale))

    def whitened_sq_norm(self, x):
        rotated = self._rotate_in(x)
        return jnp.sum(jnp.square(rotated / jnp.broadcast_to(self.scale, rotated.shape)), axis=(-2, -1))

    def variance(self):
        return jnp.ravel(jnp.square(self.qa) @ jnp.square(self.scale) @ jnp.square(self.qg).T)

    def jacobian_variance(self, jac):
        rotated = self._rotate_in(jac)
        rotated = rotated * jnp.broadcast_to(self.scale, rotated.shape)
        return jnp.einsum("...cab,...dab->...cd", rotated, rotated)

    def arrays(self) -> dict:
        return {"qa": self.qa, "qg": self.qg, "scale": self.scale}


@jax.tree_util.register_pytree_node_class
class PrecisionLowRank:
    """Σ = (diag(d) + U diag(λ) Uᵀ)⁻¹: a diagonal prior precision plus a rank-k curvature.

    Kept as the symmetric square root Σ^(1/2) = diag(a)(I + B diag(e) Bᵀ) with a = d^(-1/2), B
    (P × k) orthonormal and e ∈ (−1, 0]: with V = diag(a) U diag(λ)^(1/2) = B diag(s)^(1/2) Wᵀ,
    (I + V Vᵀ)^(-1/2) = I + B diag((1 + s)^(-1/2) − 1) Bᵀ. See :meth:`from_eigenpairs`.
    """

    kind = "precision_low_rank"
    fields = ("inv_sqrt_d", "basis", "coef")

    @staticmethod
    def check_arrays(arrays: dict) -> int:
        size = _positive_vector(arrays["inv_sqrt_d"], "inv_sqrt_d")
        basis, coef = np.asarray(arrays["basis"]), np.asarray(arrays["coef"])
        if basis.ndim != 2 or basis.shape[0] != size:
            raise ValueError(f"array 'basis' has shape {list(basis.shape)}; expected [{size}, rank]")
        _shape(coef, (basis.shape[1],), "coef")
        if not (np.all(coef <= 0) and np.all(coef > -1)):
            raise ValueError("array 'coef' must lie in (-1, 0]")
        return size

    def __init__(self, inv_sqrt_d, basis, coef):
        self.inv_sqrt_d, self.basis, self.coef = inv_sqrt_d, basis, coef

    @classmethod
    def from_eigenpairs(cls, d, vectors, values):
        """From a diagonal precision ``d`` (P,) and curvature eigenpairs: ``vectors`` (P, k), ``values`` (k,) ≥ 0."""
        a = 1.0 / jnp.sqrt(d)
        v = a[:, None] * vectors * jnp.sqrt(jnp.maximum(values, 0.0))[None, :]
        q, r = jnp.linalg.qr(v)
        s, w = jnp.linalg.eigh(r @ r.T)
        return cls(a, q @ w, 1.0 / jnp.sqrt(1.0 + jnp.maximum(s, 0.0)) - 1.0)

    def tree_flatten(self):
        return (self.inv_sqrt_d, self.basis, self.coef), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)

    @property
    def dim(self) -> int:
        return self.inv_sqrt_d.shape[-1]

    @property
    def noise_dim(self) -> int:
        return self.dim

    def _inner(self, x, coef):
        projected = x @ self.basis
        return x + (projected * jnp.broadcast_to(coef, projected.shape)) @ self.basis.T

    def _scale(self, x):
        return jnp.broadcast_to(self.inv_sqrt_d, x.shape)

    def transform_noise(self, eps):
        return self._scale(eps) * self._inner(eps, self.coef)

    def log_det(self):
        return 2.0 * jnp.sum(jnp.log(self.inv_sqrt_d)) + 2.0 * jnp.sum(jnp.log1p(self.coef))

    def whitened_sq_norm(self, x):
        inverse = self._inner(x / self._scale(x), 1.0 / (1.0 + self.coef) - 1.0)
        return jnp.sum(jnp.square(inverse), axis=-1)

    def _squared_coef(self):
        return jnp.square(1.0 + self.coef) - 1.0  # (I + B e Bᵀ)² = I + B ((1 + e)² − 1) Bᵀ

    def variance(self):
        return jnp.square(self.inv_sqrt_d) * (1.0 + jnp.square(self.basis) @ self._squared_coef())

    def jacobian_variance(self, jac):
        scaled = jac * self._scale(jac)
        projected = scaled @ self.basis
        weighted = projected * jnp.broadcast_to(self._squared_coef(), projected.shape)
        return scaled @ jnp.swapaxes(scaled, -1, -2) + weighted @ jnp.swapaxes(projected, -1, -2)

    def arrays(self) -> dict:
        return {"inv_sqrt_d": self.inv_sqrt_d, "basis": self.basis, "coef": self.coef}


@jax.tree_util.register_pytree_node_class
class KroneckerFactors:
    """A matrix-normal Gaussian over one weight matrix (a × g, flattened row by row): Σ = U ⊗ V with
    U = L_a L_aᵀ (between rows) and V = L_g L_gᵀ (between columns), L_a and L_g lower triangular with
    a positive diagonal. Σ^(1/2) ε = vec(L_a E L_gᵀ): a² + g² numbers stand for the (a·g)² of Σ.
    """

    kind = "kronecker_factors"
    fields = ("la", "lg")

    @staticmethod
    def check_arrays(arrays: dict) -> int:
        sizes = []
        for name in ("la", "lg"):
            factor = np.asarray(arrays[name])
            size = factor.shape[0] if factor.ndim == 2 else -1
            _shape(factor, (size, size), name)
            if np.any(np.triu(factor, 1) != 0) or not np.all(np.diag(factor) > 0):
                raise ValueError(f"array {name!r} must be lower triangular with a positive diagonal")
            sizes.append(size)
        return sizes[0] * sizes[1]

    def __init__(self, la, lg):
        self.la, self.lg = la, lg

    def tree_flatten(self):
        return (self.la, self.lg), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)

    @property
    def shape(self) -> tuple:
        return self.la.shape[0], self.lg.shape[0]

    @property
    def dim(self) -> int:
        return self.shape[0] * self.shape[1]

    @property
    def noise_dim(self) -> int:
        return self.dim

    def _grid(self, x):
        return jnp.reshape(x, (*x.shape[:-1], *self.shape))

    def transform_noise(self, eps):
        return jnp.reshape(self.la @ self._grid(eps) @ jnp.swapaxes(self.lg, 0, 1), eps.shape)

    def log_det(self):
        a, g = self.shape
        return 2.0 * (g * jnp.sum(jnp.log(jnp.diag(self.la))) + a * jnp.sum(jnp.log(jnp.diag(self.lg))))

    def whitened_sq_norm(self, x):
        grid = self._grid(x)
        batch = grid.shape[:-2]
        flat = jnp.reshape(grid, (-1, *self.shape))
        # L_a⁻¹ X L_g⁻ᵀ for each x, by two triangular solves
        left = jax.vmap(lambda m: solve_triangular(self.la, m, lower=True))(flat)
        both = jax.vmap(lambda m: solve_triangular(self.lg, m.T, lower=True).T)(left)
        return jnp.reshape(jnp.sum(jnp.square(both), axis=(-2, -1)), batch)

    def variance(self):
        return jnp.ravel(jnp.outer(jnp.sum(jnp.square(self.la), axis=-1), jnp.sum(jnp.square(self.lg), axis=-1)))

    def jacobian_variance(self, jac):
        # row c of J (L_a ⊗ L_g) is vec(L_aᵀ J_c L_g), J_c the c-th row of J as an a × g matrix
        scaled = jnp.swapaxes(self.la, 0, 1) @ self._grid(jac) @ self.lg
        return jnp.einsum("...cab,...dab->...cd", scaled, scaled)

    def arrays(self) -> dict:
        return {"la": self.la, "lg": self.lg}


@jax.tree_util.register_pytree_node_class
class Subset:
    """A block-diagonal Gaussian over the coordinates ``index`` (sorted); every other coordinate is
    held at the mean. ``blocks`` cover ``index`` in order (one per K-FAC layer, or a single block).

    Its density is that of the free coordinates, i.e. of q(θ_S) with θ_rest fixed: ``log_prob``,
    the ELBO and PSIS k-hat of a last-layer or subnetwork posterior are therefore taken against the
    conditional posterior p(θ_S | θ_rest, D).
    """

    def __init__(self, index, blocks: tuple, dim: int):
        self.index, self.blocks, self._dim = index, tuple(blocks), int(dim)

    def tree_flatten(self):
        return (self.index, self.blocks), self._dim

    @classmethod
    def tree_unflatten(cls, dim, children):
        return cls(children[0], children[1], dim)

    @property
    def kind(self) -> str:
        return "subset:" + ",".join(block.kind for block in self.blocks)

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def density_dim(self) -> int:
        return sum(block.dim for block in self.blocks)

    @property
    def noise_dim(self) -> int:
        return sum(block.noise_dim for block in self.blocks)

    def _split(self, x, sizes):
        edges = np.cumsum([0, *sizes])
        return [x[..., edges[i] : edges[i + 1]] for i in range(len(sizes))]

    def _free(self, x):
        return jnp.take(x, self.index, axis=-1)

    def transform_noise(self, eps):
        parts = self._split(eps, [b.noise_dim for b in self.blocks])
        free = jnp.concatenate([b.transform_noise(p) for b, p in zip(self.blocks, parts)], axis=-1)
        return jnp.zeros((*eps.shape[:-1], self._dim), free.dtype).at[..., self.index].set(free)

    def log_det(self):
        return sum(block.log_det() for block in self.blocks)

    def whitened_sq_norm(self, x):
        parts = self._split(self._free(x), [b.dim for b in self.blocks])
        return sum(b.whitened_sq_norm(p) for b, p in zip(self.blocks, parts))

    def variance(self):
        free = jnp.concatenate([b.variance() for b in self.blocks])
        return jnp.zeros(self._dim, free.dtype).at[self.index].set(free)

    def jacobian_variance(self, jac):
        """J Σ Jᵀ for Jacobians over the free coordinates only (..., C, len(index))."""
        parts = self._split(jac, [b.dim for b in self.blocks])
        return sum(b.jacobian_variance(p) for b, p in zip(self.blocks, parts))

    def arrays(self) -> dict:
        out = {"index": self.index}
        for i, block in enumerate(self.blocks):
            out.update({f"b{i}_{k}": v for k, v in block.arrays().items()})
        return out


_OPERATORS = {cls.kind: cls for cls in (Diagonal, LowRankDiagonal, Full, Kronecker, KroneckerFactors, PrecisionLowRank)}


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

    @property
    def active_index(self):
        """The coordinates with variance (None: all of them); Jacobians are needed for these only."""
        return getattr(self.cov, "index", None)

    @property
    def density_dim(self) -> int:
        return getattr(self.cov, "density_dim", self.cov.dim)

    def log_prob(self, x):
        d = self.density_dim
        centred = x - jnp.broadcast_to(self.loc, jnp.shape(x))
        return -0.5 * (d * _LOG_2PI + self.cov.log_det() + self.cov.whitened_sq_norm(centred))

    def entropy(self):
        return 0.5 * (self.density_dim * (1.0 + _LOG_2PI) + self.cov.log_det())

    def covariance(self):
        """The dense P × P covariance (for small problems and tests)."""
        rows = self.cov.transform_noise(jnp.eye(self.cov.noise_dim, dtype=self.loc.dtype))
        return rows.T @ rows

    def output_covariance(self, jac):
        """J Σ Jᵀ (..., C, C) of Jacobians ``jac`` (..., C, k) over :attr:`active_index` (all if None)."""
        return self.cov.jacobian_variance(jac)

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


@jax.tree_util.register_pytree_node_class
class Mixture:
    """Σ_m w_m q_m(θ) over Gaussian components of one layout (mixtures of Laplace, MultiSWAG).

    Components over a :class:`Subset` hold their other coordinates at their own means, so a point
    has density under component m only where those coordinates equal component m's; ``log_prob``
    honours that (−inf elsewhere), which makes it the exact density of the mixture's draws.
    """

    has_density = True

    def __init__(self, components: tuple, log_weights):
        self.components, self.log_weights = tuple(components), log_weights

    def tree_flatten(self):
        return (self.components, self.log_weights), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)

    @property
    def kind(self) -> str:
        return f"mixture:{len(self.components)}:{self.components[0].kind}"

    @property
    def weights(self):
        return jnp.exp(self.log_weights)

    @property
    def mean(self):
        return sum(w * c.loc for w, c in zip(self.weights, self.components))

    def variance(self):
        second = sum(w * (c.variance() + jnp.square(c.loc)) for w, c in zip(self.weights, self.components))
        return second - jnp.square(self.mean)

    def sample(self, key, n: int):
        pick_key, *keys = jax.random.split(key, len(self.components) + 1)
        pick = jax.random.categorical(pick_key, self.log_weights, shape=(n,))
        out = jnp.zeros((n, self.components[0].loc.shape[-1]), self.components[0].loc.dtype)
        for m, (component, k) in enumerate(zip(self.components, keys)):
            out = jnp.where((pick == m)[:, None], component.sample(k, n), out)
        return out

    def log_prob(self, x):
        terms = []
        for log_w, component in zip(self.log_weights, self.components):
            log_q = component.log_prob(x)
            index = component.active_index
            if index is not None:
                fixed = jnp.ones(component.loc.shape[-1], bool).at[index].set(False)
                loc = jnp.broadcast_to(component.loc, jnp.shape(x))
                on_support = jnp.all(jnp.where(jnp.broadcast_to(fixed, jnp.shape(x)), x == loc, True), axis=-1)
                log_q = jnp.where(on_support, log_q, -jnp.inf)
            terms.append(log_w + log_q)
        return jax.scipy.special.logsumexp(jnp.stack(terms), axis=0)

    def arrays(self) -> dict:
        out = {"log_weights": self.log_weights}
        for m, component in enumerate(self.components):
            out.update({f"c{m}_{k}": v for k, v in component.arrays().items()})
        return out


@partial(jax.jit, static_argnames=("num",))
def draw(family, key, num: int):
    """``num`` draws from any family (compiled once per family layout and ``num``)."""
    return family.sample(key, num)


@jax.jit
def _log_q(family, x):
    return family.log_prob(x)


STORED_DRAWS_SIGMAS = 8.0  # how far the stored draws' mean log q may sit from fresh draws' (in standard errors)


def stored_draws_mismatch(family, flat) -> str | None:
    """Why ``flat`` (…, P) cannot be draws of ``family``, or None where they can be.

    A run saves its approximation q and draws from it. Their agreement is checked on load, so draws
    edited apart from q (shifted, rescaled, swapped for another run's) are refused rather than
    predicted with: a point's draws must be its location; a density's draws must lie in its support
    (a subset Gaussian holds its other coordinates at the mean), and the mean of log q over them
    must match the mean over fresh draws of q within ``STORED_DRAWS_SIGMAS`` standard errors (both
    are averages of independent copies of one variable; for a Gaussian this is the χ² test of
    the whitened draws), plus a relative 1e-4 for rounding in float32.
    """
    x = np.asarray(flat).reshape(-1, np.shape(flat)[-1])
    loc = getattr(family, "loc", None)
    if isinstance(family, PointMass):
        if not np.allclose(x, np.asarray(loc), rtol=1e-6, atol=0.0):
            return "the draws of a point estimate differ from its stored location"
        return None
    if isinstance(family, Gaussian) and family.active_index is not None:
        fixed = np.ones(x.shape[1], bool)
        fixed[np.asarray(family.active_index)] = False
        if not np.array_equal(x[:, fixed], np.broadcast_to(np.asarray(loc)[fixed], (x.shape[0], int(fixed.sum())))):
            return "the draws move coordinates that the approximation holds at its mean"
    count = max(1000, x.shape[0])
    fresh = np.asarray(_log_q(family, draw(family, jax.random.key(0), count)), dtype=np.float64)
    if not np.all(np.isfinite(fresh)):
        # q's density is not finite even at its own draws (a covariance too ill-conditioned for the
        # precision it was computed in): nothing to compare with, and its k-hat fails the run anyway
        return None
    stored = np.asarray(_log_q(family, jnp.asarray(x)), dtype=np.float64)
    outside = int(np.sum(~np.isfinite(stored)))
    if outside:
        return f"{outside} of {stored.size} draw(s) have log q = -inf or NaN: they are not draws of the approximation"
    error = math.sqrt(float(np.var(fresh)) * (1.0 / stored.size + 1.0 / fresh.size))
    gap = float(np.mean(stored) - np.mean(fresh))
    if abs(gap) > STORED_DRAWS_SIGMAS * error + 1e-4 * (1.0 + abs(float(np.mean(fresh)))):
        return (f"their mean log q is {np.mean(stored):.6g} where draws of the approximation average "
                f"{np.mean(fresh):.6g} ± {error:.2g}")
    return None


MAX_MIXTURE_COMPONENTS = 1000


def _prefixed(arrays: dict, prefix: str) -> dict:
    return {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}


def _check_finite(arrays: dict) -> None:
    for name, value in arrays.items():
        # floating only: a location or scale edited to integers passed as "numeric" and then broke
        # the load itself (jax.random.normal refuses an int dtype) instead of being refused
        if not np.issubdtype(np.asarray(value).dtype, np.floating) or not np.all(np.isfinite(value)):
            raise ValueError(f"array {name!r} holds non-finite or non-float values")


def _shape(value, want: tuple, name: str) -> None:
    if tuple(np.shape(value)) != tuple(want):
        raise ValueError(f"array {name!r} has shape {list(np.shape(value))}; expected {list(want)}")


def _positive_vector(value, name: str) -> int:
    """The length of a saved vector of positive scales (ValueError if it is not one)."""
    value = np.asarray(value)
    size = value.shape[0] if value.ndim == 1 else -1
    _shape(value, (size,), name)
    if not np.all(value > 0):
        raise ValueError(f"array {name!r} must be positive")
    return size


def _operator_from_arrays(kind: str, arrays: dict, dim: int | None):
    """One covariance operator of ``kind`` from its arrays: the names here, every shape and value
    by the operator's own ``check_arrays``."""
    if kind not in _OPERATORS:
        raise ValueError(f"unknown covariance operator {kind!r}; known: {', '.join(_OPERATORS)}")
    operator = _OPERATORS[kind]
    if set(arrays) != set(operator.fields):
        raise ValueError(f"a {kind!r} operator needs arrays {operator.fields}, got {sorted(arrays)}")
    _check_finite(arrays)
    size = operator.check_arrays(arrays)
    if dim is not None and size != dim:
        raise ValueError(f"a {kind!r} operator over {size} coordinates where {dim} were expected")
    return operator(**{k: jnp.asarray(v) for k, v in arrays.items()})


def _subset_from_arrays(kinds: str, arrays: dict, dim: int):
    index = np.asarray(arrays.get("index", np.zeros(0)))
    if not np.issubdtype(index.dtype, np.integer) or index.ndim != 1 or index.size == 0:
        raise ValueError("a subset needs a non-empty integer array 'index'")
    if np.any(np.diff(index) <= 0) or index[0] < 0 or index[-1] >= dim:
        raise ValueError(f"array 'index' must be strictly increasing within [0, {dim})")
    names = kinds.split(",")
    if not 1 <= len(names) <= 10_000:
        raise ValueError(f"a subset has between 1 and 10000 blocks, not {len(names)}")
    blocks = [_operator_from_arrays(k, _prefixed(arrays, f"b{i}_"), None) for i, k in enumerate(names)]
    known = {"index"} | {f"b{i}_{field}" for i, k in enumerate(names) for field in _OPERATORS[k].fields}
    if set(arrays) != known:
        raise ValueError(f"unexpected arrays for a subset: {sorted(set(arrays) - known)}")
    if sum(b.dim for b in blocks) != index.size:
        raise ValueError(f"the blocks cover {sum(b.dim for b in blocks)} coordinates but 'index' names {index.size}")
    return Subset(jnp.asarray(index), tuple(blocks), dim)


def from_arrays(kind: str, arrays: dict, dim: int | None = None):
    """Rebuild a family saved with ``family.kind`` and ``family.arrays()``, checking every array's
    name, shape and values against the family (``dim``: the flat parameter count, when known).

    ``kind`` is read as data: a base name, ``subset:<block kinds, comma-separated>`` or
    ``mixture:<count>:<component kind>``; nothing it names is imported or called."""
    if kind == "flow":
        return flow_from_arrays(arrays, dim if dim is not None else int(np.shape(arrays["shift"])[-1]))
    if kind.startswith("mixture:"):
        _, count, component_kind = (kind.split(":", 2) + ["", ""])[:3]
        if not count.isdigit() or not 1 <= int(count) <= MAX_MIXTURE_COMPONENTS or component_kind.startswith("mixture"):
            raise ValueError(f"malformed mixture kind {kind!r}")
        log_weights = np.asarray(arrays.get("log_weights", np.zeros(0)))
        _shape(log_weights, (int(count),), "log_weights")
        if not np.all(np.isfinite(log_weights)) or abs(float(np.logaddexp.reduce(log_weights))) > 1e-6:
            raise ValueError("array 'log_weights' must be finite log weights summing to one")
        components = [from_arrays(component_kind, _prefixed(arrays, f"c{m}_"), dim) for m in range(int(count))]
        if any(isinstance(c, PointMass) for c in components):
            raise ValueError("mixture components must be Gaussians")
        return Mixture(tuple(components), jnp.asarray(log_weights))
    loc = np.asarray(arrays.get("loc", np.zeros((0, 0))))
    if loc.ndim != 1:
        raise ValueError(f"array 'loc' has shape {list(loc.shape)}; expected [{dim}]")
    dim = loc.shape[0] if dim is None else dim
    _shape(loc, (dim,), "loc")
    _check_finite({"loc": loc})
    rest = {k: v for k, v in arrays.items() if k != "loc"}
    if kind == "point":
        if rest:
            raise ValueError(f"a 'point' family needs only 'loc', got {sorted(arrays)}")
        return PointMass(jnp.asarray(loc))
    if kind.startswith("subset:"):
        return Gaussian(jnp.asarray(loc), _subset_from_arrays(kind[len("subset:"):], rest, dim))
    return Gaussian(jnp.asarray(loc), _operator_from_arrays(kind, rest, dim))
