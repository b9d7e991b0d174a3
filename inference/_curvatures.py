"""The structures a Laplace curvature can take, as strategy objects in a registry.

A structure says how the likelihood's curvature over the free coordinates is computed and held —
a dense GGN, its diagonal, one Kronecker product per layer (K-FAC), or its top eigenpairs — and
everything that follows from that form:

* ``pieces`` — the likelihood's curvature, unweighted, in the structure's own form (a matrix, a
  vector, a list of factor pairs, eigenpairs), from the curvature service;
* ``assemble`` — the Gaussian's covariance blocks from the pieces, the likelihood weight and the
  prior precision (traceable), with a health number for the positive-definiteness check;
* ``log_det`` — log |s · pieces + diag(d)|, what the Laplace evidence needs when the prior
  precision ``d`` and the likelihood's scale ``s`` are tuned (traceable);
* ``memory_bytes`` — what computing and holding it costs, known before anything is computed;
* ``check`` — what the structure needs of the model and the options, before any work;
* ``check_health`` — the refusal of a precision that is not positive definite.

``laplace``, ``mola`` and the evidence tuning see a structure only through this interface, by its
registered name. Adding one is one module with a :class:`Structure` subclass and one line in
:data:`STRUCTURES`; the Laplace tests run every registered structure.
"""

from __future__ import annotations

import importlib

import jax.numpy as jnp
import numpy as np

from ppl.core import curvature
from ppl.core.errors import OptionError, did_you_mean
from ppl.core.gaussian import Diagonal, Full, Kronecker, PrecisionLowRank
from ppl.inference.exact import NotPositiveDefiniteError, check_positive_definite, factor_precision, flat_names

__all__ = ["STRUCTURES", "Structure", "structure", "names", "likelihood_pieces", "whole_layers", "not_positive_definite"]

# name -> "module:Class", resolved on first use (as the method registry is)
STRUCTURES = {
    "full": "ppl.inference._curvatures:FullGGN",
    "diag": "ppl.inference._curvatures:DiagonalGGN",
    "kfac": "ppl.inference._curvatures:KFAC",
    "lowrank": "ppl.inference._curvatures:LowRankGGN",
}

_RESOLVED: dict = {}


def names() -> tuple:
    """The registered structures' names, in registry order."""
    return tuple(STRUCTURES)


def structure(name: str) -> Structure:
    """The structure registered as ``name`` (one shared instance: structures hold no state)."""
    if name not in _RESOLVED:
        if name not in STRUCTURES:
            raise OptionError(
                f"unknown curvature structure {name!r}{did_you_mean(name, STRUCTURES)}; valid: {', '.join(STRUCTURES)}"
            )
        module, cls = STRUCTURES[name].split(":")
        _RESOLVED[name] = getattr(importlib.import_module(module), cls)()
    return _RESOLVED[name]


class Structure:
    """One form of the likelihood's curvature. Subclasses set ``name`` and implement the pieces,
    the assembly, the log-determinant and the memory estimate; the checks default to none."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.label = cls.label or cls.name

    name: str = ""
    label: str = ""  # how messages name it (the name when empty)
    needs_layers = False  # True: covers whole dense layers, so the network must declare them

    def pieces(self, problem, u, index, *, rank: int, key, layers, sites, rows: int):
        """The likelihood curvature over ``index`` (unweighted), in this structure's form.
        ``layers``: the network's layer slices (None without declared layers); ``sites``: the
        sample sites holding the free coordinates; ``rows``: data rows per chunk."""
        raise NotImplementedError

    def assemble(self, pieces, lik_weight, prior_diag) -> tuple:
        """(covariance blocks, health, precision) of the Gaussian whose precision is
        ``lik_weight · pieces + diag(prior_diag)``; health > 0 means positive definite."""
        raise NotImplementedError

    def log_det(self, pieces, scale, prior_diag):
        """log |scale · pieces + diag(prior_diag)|."""
        raise NotImplementedError

    def memory_bytes(self, num_free: int, num_outputs: int, layers, rank: int, itemsize: int = 8) -> int:
        """What computing and holding it over ``num_free`` coordinates takes: the largest arrays
        alive at once (:meth:`held_bytes`) and one chunk of per-input Jacobians."""
        return self.held_bytes(num_free, num_outputs, layers, rank, itemsize) + curvature.CHUNK_BYTES

    def held_bytes(self, num_free: int, num_outputs: int, layers, rank: int, itemsize: int) -> int:
        """The structure's own arrays: ``layers`` are the covered layers' slices (K-FAC's unit)."""
        raise NotImplementedError

    def applies(self, problem) -> bool:
        """Whether the structure can be computed for ``problem`` at all (for suggestions)."""
        return problem.is_declarative and (problem.model.has_layers or not self.needs_layers)

    def check(self, method: str, problem, *, subset, mask: bool, patterns: bool, index, fixed_prior) -> None:
        """Refuse, before any work, options this structure cannot serve. ``subset``: the option as
        given; ``mask``/``patterns``: whether it is a boolean mask / names path patterns;
        ``index``: the free coordinates; ``fixed_prior``: whether the model's own prior is used as
        it is (not tuned nor replaced)."""

    def check_health(self, health, precision, names_of) -> None:
        """Refuse a precision whose health number says it is not positive definite. ``names_of``:
        a function giving the free coordinates' names."""
        if not float(health) > 0:
            raise NotPositiveDefiniteError(
                f"laplace: the {self.name} posterior precision is not positive: the prior's curvature is not "
                "positive there (a non-Gaussian prior) — use a Gaussian prior, or hessian='full' to see where"
            )


def likelihood_pieces(problem, u, index, name: str, rank: int, key, layers):
    """The likelihood curvature over ``index`` (unweighted) in the form of the structure ``name``.
    ``layers``: the network's layer slices (None for a network without declared layer structure)."""
    # the sites holding the free coordinates: derivatives skip every other layer
    columns = np.zeros(problem.num_params, bool)
    columns[np.asarray(index)] = True
    sites = tuple(problem.sites_of(columns))
    rows = curvature.chunk_rows(problem.model.output_dim(), len(index))
    return structure(name).pieces(problem, u, index, rank=rank, key=key, layers=layers, sites=sites, rows=rows)


def _dense_pieces(problem, u, index, diagonal: bool, layers, sites, rows: int):
    """The GGN (dense, or its diagonal) over ``index``: in closed form when ``index`` is exactly
    the last layer, a dense one (its Jacobian is φ̃ ⊗ I), else from per-input Jacobians."""
    form = "diag" if diagonal else "full"
    outputs = problem.model.output_dim()
    if layers is not None and curvature.layer_locations(problem)[-1] == 1:
        start, width, outputs_last = layers[-1]
        if np.array_equal(np.asarray(index), np.arange(start, start + width * outputs_last)):
            return curvature.last_layer_ggn(problem, u, form, curvature.chunk_rows(outputs * outputs, width))
    return curvature.ggn(problem, u, jnp.asarray(index), form, rows, sites)


class FullGGN(Structure):
    """The dense GGN: exact curvature of the linearised network, |S|² numbers."""

    name = "full"

    def pieces(self, problem, u, index, *, rank, key, layers, sites, rows):
        return _dense_pieces(problem, u, index, False, layers, sites, rows)

    def assemble(self, pieces, lik_weight, prior_diag):
        precision = lik_weight * pieces + jnp.diag(prior_diag)
        factor = factor_precision(precision)
        return (Full(factor.scale_tril),), factor.rcond, precision

    def log_det(self, pieces, scale, prior_diag):
        chol = jnp.linalg.cholesky(scale * pieces + jnp.diag(prior_diag))
        return 2.0 * jnp.sum(jnp.log(jnp.diag(chol)))

    def held_bytes(self, num_free, num_outputs, layers, rank, itemsize):
        return 3 * num_free**2 * itemsize

    def check_health(self, health, precision, names_of):
        # the reciprocal condition number of the factorisation, against rounding at this size
        if not float(health) > float(precision.shape[0] * jnp.finfo(precision.dtype).eps):
            not_positive_definite(health, precision, names_of())


class DiagonalGGN(Structure):
    """The GGN's diagonal: |S| numbers, no correlations."""

    name = "diag"

    def pieces(self, problem, u, index, *, rank, key, layers, sites, rows):
        return _dense_pieces(problem, u, index, True, layers, sites, rows)

    def assemble(self, pieces, lik_weight, prior_diag):
        precision = lik_weight * pieces + prior_diag
        return (Diagonal(1.0 / jnp.sqrt(precision)),), jnp.min(precision), precision

    def log_det(self, pieces, scale, prior_diag):
        return jnp.sum(jnp.log(scale * pieces + prior_diag))

    def held_bytes(self, num_free, num_outputs, layers, rank, itemsize):
        return 4 * num_free * itemsize

    def check_health(self, health, precision, names_of):
        if not float(health) > 0:
            names = names_of()
            bad = [names[i] for i in np.flatnonzero(~(np.asarray(precision) > 0))]
            raise NotPositiveDefiniteError(
                f"laplace: the diag posterior precision is not positive at {', '.join(bad[:10])}"
                f"{' and more' if len(bad) > 10 else ''}: the prior's curvature is not positive there (a "
                "non-Gaussian prior) — use a Gaussian prior, or hessian='full' to see where"
            )


class KFAC(Structure):
    """One Kronecker product A ⊗ G per dense layer (the bias a homogeneous coordinate of A):
    a² + g² numbers a layer instead of (a·g)², with the prior one precision per layer."""

    name = "kfac"
    label = "K-FAC"
    needs_layers = True

    def pieces(self, problem, u, index, *, rank, key, layers, sites, rows):
        outputs = problem.model.output_dim()
        factors = curvature.kfac_factors(problem, u, curvature.chunk_rows(outputs, max(r * c for _, r, c in layers)))
        starts = {start for start, _, _ in curvature.free_layers(layers, index)}
        # in the order of the layers' coordinates in u, as the blocks of the Gaussian lie (a network
        # may declare its layers in call order while its sites sort otherwise: Flax's Dense_0 can
        # be the output layer)
        ordered = sorted(zip(factors, layers), key=lambda pair: pair[1][0])
        return [f for f, (start, _, _) in ordered if start in starts]

    def assemble(self, pieces, lik_weight, prior_diag):
        blocks, offset = [], 0
        for A, G in pieces:
            # one prior precision per layer (checked before the run)
            la, qa = jnp.linalg.eigh(0.5 * (A + A.T))
            lg, qg = jnp.linalg.eigh(0.5 * (G + G.T))
            precision = lik_weight * jnp.maximum(la, 0.0)[:, None] * jnp.maximum(lg, 0.0)[None, :] + prior_diag[offset]
            blocks.append(Kronecker(qa, qg, 1.0 / jnp.sqrt(precision)))
            offset += A.shape[0] * G.shape[0]
        return tuple(blocks), jnp.min(prior_diag), jnp.zeros(())

    def log_det(self, pieces, scale, prior_diag):
        total, offset = 0.0, 0
        for A, G in pieces:
            la = jnp.maximum(jnp.linalg.eigvalsh(0.5 * (A + A.T)), 0.0)
            lg = jnp.maximum(jnp.linalg.eigvalsh(0.5 * (G + G.T)), 0.0)
            total = total + jnp.sum(jnp.log(scale * la[:, None] * lg[None, :] + prior_diag[offset]))
            offset += la.shape[0] * lg.shape[0]
        return total

    def held_bytes(self, num_free, num_outputs, layers, rank, itemsize):
        return 4 * sum(a * a + g * g for _, a, g in layers) * itemsize

    def check(self, method, problem, *, subset, mask, patterns, index, fixed_prior):
        if mask:
            raise OptionError(
                f"{method}: K-FAC approximates whole layers; a subnetwork mask needs hessian='full', 'diag' or 'lowrank'"
            )
        model = problem.model
        if patterns and model.has_layers and not whole_layers(problem, index):
            raise OptionError(
                f"{method}: K-FAC approximates whole layers (weights and bias together), and subset={subset!r} "
                "selects part of one: widen the patterns to each chosen layer's weight and bias, or use "
                "hessian='full', 'diag' or 'lowrank'"
            )
        if not model.has_layers:
            groups = ", ".join(name for name, _ in problem.parameter_groups())
            why = getattr(model, "layer_problem", "") or "it does not declare one"
            raise OptionError(
                f"{method}: K-FAC needs the network's layer structure, which is unknown for this "
                f"{type(model).__name__} ({why}): it cannot handle the parameter groups {groups} — use "
                "hessian='full', 'diag' or 'lowrank' (the generic GGN works for any network)"
            )
        if fixed_prior:
            # A Gaussian prior's precision does not depend on θ: one number per layer, checked before any work.
            prior = np.asarray(curvature.prior_precision_diagonal(problem, problem.init_params))
            for start, rows, cols in curvature.free_layers(curvature.layer_slices(problem), index):
                _one_precision(method, problem, prior[start : start + rows * cols], start)


class LowRankGGN(Structure):
    """The GGN's top ``rank`` eigenpairs (randomised subspace iteration) over the prior's diagonal."""

    name = "lowrank"

    def pieces(self, problem, u, index, *, rank, key, layers, sites, rows):
        return curvature.ggn_lowrank(problem, u, jnp.asarray(index), key, min(rank, len(index)), rows, sites=sites)

    def assemble(self, pieces, lik_weight, prior_diag):
        vectors, values = pieces
        block = PrecisionLowRank.from_eigenpairs(prior_diag, vectors, lik_weight * values)
        return (block,), jnp.min(prior_diag), jnp.zeros(())

    def log_det(self, pieces, scale, prior_diag):
        vectors, values = pieces
        inner = (vectors / prior_diag[:, None]).T @ vectors * scale
        root = jnp.sqrt(values)
        small = jnp.eye(values.shape[0], dtype=vectors.dtype) + root[:, None] * inner * root[None, :]
        return jnp.sum(jnp.log(prior_diag)) + 2.0 * jnp.sum(jnp.log(jnp.diag(jnp.linalg.cholesky(small))))

    def held_bytes(self, num_free, num_outputs, layers, rank, itemsize):
        return 4 * num_free * (rank + 10) * itemsize


def whole_layers(problem, index) -> bool:
    """Whether the coordinates ``index`` are exactly some of the network's declared layers (K-FAC's
    unit); False for a network without declared layers."""
    if not problem.model.has_layers:
        return False
    covered = set()
    chosen = set(np.asarray(index).tolist())
    for start, rows, cols in curvature.layer_slices(problem):
        if start in chosen:
            covered.update(range(start, start + rows * cols))
    return covered == chosen


def _one_precision(method: str, problem, delta: np.ndarray, start: int) -> None:
    """K-FAC's eigen-decomposition needs the prior precision to be one number across a layer."""
    if float(np.max(delta) - np.min(delta)) > 1e-9 * float(np.max(np.abs(delta))):
        raise OptionError(
            f"{method}: K-FAC needs one prior precision per layer, but the prior of the layer starting at "
            f"{flat_names(problem)[start]} varies between {float(np.min(delta)):.4g} and {float(np.max(delta)):.4g} "
            "(its weights and bias differ, e.g. a FanIn prior); pass prior_precision= per-layer numbers, or use "
            "hessian='diag', 'lowrank' or 'full'"
        )


def not_positive_definite(rcond, precision, names):
    """Raise the exact method's not-positive-definite error, worded for laplace."""
    try:
        check_positive_definite(rcond, precision, names, advice="Use a Gaussian prior or a tighter one, or hessian='diag'")
    except NotPositiveDefiniteError as error:
        raise NotPositiveDefiniteError(str(error).replace("method 'exact'", "method 'laplace'")) from None
    raise NotPositiveDefiniteError("method 'laplace': the posterior precision is not positive definite")
