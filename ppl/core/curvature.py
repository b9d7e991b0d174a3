"""The curvature service: every second-order quantity Laplace and linearised prediction need.

Everything here works on a compiled :class:`ppl.Problem` and a flat unconstrained vector ``u``,
for any declarative model that exposes ``apply`` (its network), ``forward`` (the same pass, also
returning each dense layer's input and accepting additive "taps" on its pre-activations) and
``output_hessian_sqrt`` (a square root L of the likelihood's Hessian Λ(f) in the outputs).

* :func:`linearize` — f(u) and its Jacobian-vector product at ``u``.
* :func:`output_jacobians` — per-input Jacobians J_n (C × k) over chosen coordinates, by reverse
  mode vmapped over inputs. Linearised predictions feed them to the covariance operators'
  ``jacobian_variance``, so no P × P matrix and no P Jacobian-vector products are ever needed.
* :func:`ggn` — the generalised Gauss–Newton Σ_n J_nᵀ Λ_n J_n over chosen coordinates, dense
  (``"full"``) or its diagonal (``"diag"``); :func:`last_layer_ggn` the same for exactly the last
  dense layer, from its structure (J_n = φ̃_n ⊗ I).
* :func:`ggn_vp` and :func:`ggn_lowrank` — matrix-free GGN products and the top eigenpairs
  from them (randomised subspace iteration).
* :func:`kfac_factors` — per layer, A = (1/N) Σ_n ã_n ã_nᵀ (ã the layer input with a 1
  appended for the bias) and G = Σ_n Σ_c g_nc g_ncᵀ (g the pre-activation gradient of the c-th
  output of Lᵀ f); the layer's GGN block is approximated by A ⊗ G, exact for a linear model.
  A convolution counts each location as a row (K-FAC-expand).
* :func:`hessian` — the exact Hessian of the (unconstrained) log density, for plain programs.

Sums over data run batch by batch (:data:`CHUNK_BYTES` bounds a chunk's Jacobians); rows added
to fill the last chunk are masked out. The results are the likelihood's curvature, unweighted:
the caller applies tempering and the prior (``Problem.weights``).

Precision: the network runs in the run's own float type, but its Jacobians are widened to float64
before they are multiplied and summed, whenever float64 is available — which :func:`float64`
makes it, for the duration of a curvature computation, even in a float32 run. Products of float32
numbers are exact in float64, so a GGN summed over many data points loses nothing to rounding,
and the factorisations and log-determinants done on it afterwards are float64 too: an
ill-conditioned posterior precision (collinear inputs, a weak prior) is inverted accurately.
"""

from __future__ import annotations

import contextlib
import fnmatch
import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from ppl.core.errors import OptionError

__all__ = [
    "linearize", "output_jacobians", "ggn", "ggn_vp", "ggn_lowrank", "kfac_factors", "hessian",
    "layer_slices", "layer_locations", "network_params", "CHUNK_BYTES", "chunk_rows", "last_layer_ggn", "group_slices",
    "network_mask", "last_layer_index",
]

CHUNK_BYTES = 64 * 2**20  # the per-input Jacobians of one chunk of data stay below this


def float64():
    """A context in which float64 arrays exist, whatever the run's default float type (nothing to
    do in a float64 run). Functions jitted inside it compile separately from those outside."""
    return contextlib.nullcontext() if jax.config.jax_enable_x64 else jax.enable_x64(True)


def wide(dtype):
    """float64 where it is available (inside :func:`float64`), else ``dtype``; traced code uses it
    for accumulators, so that it also runs, narrower, outside the context."""
    return jnp.promote_types(dtype, jax.dtypes.canonicalize_dtype(jnp.float64))


def network_params(problem, u, base: dict, held=None, sites=None) -> dict:
    """Constrained parameters at ``u``: the network's weights read straight from ``u`` (they are
    real-valued, so their transform is the identity) over ``base`` (the other sites, e.g. σ).

    With ``sites`` (names) only those are read from ``u``; the other weights come from ``held``
    as constants, so derivatives in ``u`` never flow through them. A Jacobian over a few layers
    then costs what those layers cost: per-input gradients of a convolution's kernel, which the
    derivative would otherwise form and discard, are by far the largest arrays of such a pass."""
    flat = problem.unravel(u)
    fixed = flat if held is None else problem.unravel(held)
    params = dict(base)
    for name in problem.network_sites():
        params[name] = flat[name] if sites is None or name in sites else jax.lax.stop_gradient(fixed[name])
    return params


def _as_matrix(f):
    return f[:, None] if f.ndim == 1 else f


def _network(problem, u, base, X, held=None, sites=None):
    """Outputs (B, C) of the network at flat ``u`` (only ``sites`` read from u, see network_params)."""
    return _as_matrix(problem.apply(network_params(problem, u, base, held, sites), X))


def linearize(problem, u, X):
    """(f(u) at X as (B, C), v ↦ J v): the network's value and Jacobian-vector product at ``u``."""
    base = problem.constrain(u)
    return jax.linearize(lambda v: _network(problem, v, base, X), u)


def _with_free(u, index, free):
    return free if index is None else u.at[index].set(free)


def output_jacobians(problem, u, X, index=None, base=None, sites=None):
    """Per-input Jacobians (B, C, k) of the network outputs at inputs X over the coordinates
    ``index`` of u (all when None), every other coordinate held at u. ``sites``: the names of the
    sites that hold ``index`` (None: any may), so that the others are held as constants."""
    base = problem.constrain(u) if base is None else base
    free = u if index is None else u[index]

    def one(v, x):
        return _network(problem, _with_free(u, index, v), base, x[None], u, sites)[0]

    return jax.vmap(jax.jacrev(one), in_axes=(None, 0))(free, X)


def chunk_rows(num_outputs: int, num_coords: int, itemsize: int = 8) -> int:
    """Rows per chunk so that a chunk's Jacobians (rows × C × k numbers) stay under CHUNK_BYTES."""
    return int(max(1, min(4096, CHUNK_BYTES // max(1, num_outputs * num_coords * itemsize))))


def _chunked(X, y, rows: int):
    """X and y padded to a multiple of ``rows`` and split into chunks, with a 0/1 row mask."""
    n = X.shape[0]
    count = -(-n // rows)
    pad = count * rows - n
    mask = jnp.concatenate([jnp.ones(n, X.dtype), jnp.zeros(pad, X.dtype)])
    Xp = jnp.concatenate([X, jnp.zeros((pad, *X.shape[1:]), X.dtype)])
    yp = jnp.concatenate([y, jnp.zeros((pad, *y.shape[1:]), y.dtype)])
    shape = lambda a: jnp.reshape(a, (count, rows, *a.shape[1:]))  # noqa: E731
    return shape(Xp), shape(yp), shape(mask)


def _hessian_root(problem, u, base, X, mask):
    """L (B, C, C) with Λ = L Lᵀ at u, zeroed on padding rows."""
    f = problem.apply(network_params(problem, u, base), X)
    return problem.model.output_hessian_sqrt(f, base) * mask[:, None, None]


@partial(jax.jit, static_argnames=("structure", "rows", "sites"))
def ggn(problem, u, index, structure: str, rows: int, sites=None):
    """Σ_n J_nᵀ Λ_n J_n over the coordinates ``index`` (all when None): the dense matrix for
    ``structure="full"``, its diagonal for ``"diag"``; summed over the training data in chunks."""
    X, y = problem.data
    base = problem.constrain(u)
    k = u.shape[0] if index is None else index.shape[0]
    Xc, yc, mc = _chunked(X, y, rows)

    def add(total, chunk):
        x, _, m = chunk
        jac = output_jacobians(problem, u, x, index, base, sites)  # (B, C, k)
        root = _hessian_root(problem, u, base, x, m)  # (B, C, C)
        acc = total.dtype
        scaled = jnp.einsum("bcp,bcd->bdp", jac.astype(acc), root.astype(acc))  # Lᵀ J
        if structure == "diag":
            return total + jnp.sum(jnp.square(scaled), axis=(0, 1)), None
        flat = jnp.reshape(scaled, (-1, k))
        return total + flat.T @ flat, None

    zero = jnp.zeros((k,) if structure == "diag" else (k, k), wide(u.dtype))
    return jax.lax.scan(add, zero, (Xc, yc, mc))[0]


@partial(jax.jit, static_argnames=("structure", "rows"))
def last_layer_ggn(problem, u, structure: str, rows: int):
    """The GGN over the last dense layer's augmented weights [W; b] (row-major), from its structure:
    that layer's Jacobian is φ̃_n ⊗ I_C (φ̃ its input with a 1 appended for the bias), so
    GGN = Σ_n (φ̃_n φ̃_nᵀ) ⊗ Λ_n: N·a²·C² work instead of the generic N·C·(a·C)²."""
    X, y = problem.data
    base = problem.constrain(u)
    params = network_params(problem, u, base)
    last = problem.layers()[-1]
    first = _bias_first(problem)[-1]
    Xc, yc, mc = _chunked(X, y, rows)
    size = (last.fan_in + (last.bias is not None)) * last.fan_out

    def add(total, chunk):
        x, _, m = chunk
        raw, inputs = problem.model.forward(params, x)
        phi = inputs[-1]
        if last.bias is not None:
            phi = _augmented(phi, first)
        root = (problem.model.output_hessian_sqrt(raw, base) * m[:, None, None]).astype(total.dtype)
        phi = phi.astype(total.dtype)
        lam = root @ jnp.swapaxes(root, 1, 2)  # (B, C, C)
        if structure == "diag":
            diag = jnp.square(phi).T @ jnp.diagonal(lam, axis1=1, axis2=2)  # (a, C)
            return total + jnp.reshape(diag, (size,)), None
        weighted = jnp.einsum("ni,ncd->nicd", phi, lam)
        return total + jnp.reshape(jnp.einsum("nj,nicd->icjd", phi, weighted), (size, size)), None

    zero = jnp.zeros((size,) if structure == "diag" else (size, size), wide(u.dtype))
    return jax.lax.scan(add, zero, (Xc, yc, mc))[0]


def ggn_vp(problem, u, index, vectors, rows: int, sites=None):
    """GGN · V for V (k, m) over the coordinates ``index``, matrix-free (one JVP and one VJP per
    chunk of data and column), summed over the training data."""
    X, y = problem.data
    base = problem.constrain(u)
    free = u if index is None else u[index]
    Xc, yc, mc = _chunked(X, y, rows)

    def add(total, chunk):
        x, _, m = chunk
        root = _hessian_root(problem, u, base, x, m)
        fn = lambda v: _network(problem, _with_free(u, index, v), base, x, u, sites)  # noqa: E731
        _, pullback = jax.vjp(fn, free)

        def one(v):
            tangent = jax.jvp(fn, (free,), (v.astype(free.dtype),))[1]  # J v, (B, C)
            weighted = jnp.einsum("bcd,bed,be->bc", root, root, tangent)  # Λ J v
            return pullback(weighted)[0].astype(total.dtype)

        return total + jax.vmap(one, in_axes=1, out_axes=1)(vectors), None

    return jax.lax.scan(add, jnp.zeros_like(vectors), (Xc, yc, mc))[0]


@partial(jax.jit, static_argnames=("rank", "rows", "oversample", "iterations", "sites"))
def ggn_lowrank(problem, u, index, key, rank: int, rows: int, oversample: int = 10, iterations: int = 3, sites=None):
    """The top ``rank`` eigenpairs (vectors (k, rank), values (rank,)) of the GGN over ``index``,
    by randomised subspace iteration (Halko, Martinsson & Tropp 2011) on :func:`ggn_vp` products."""
    k = u.shape[0] if index is None else index.shape[0]
    width = min(k, rank + oversample)
    basis, _ = jnp.linalg.qr(jax.random.normal(key, (k, width), wide(u.dtype)))
    for _ in range(iterations):
        basis, _ = jnp.linalg.qr(ggn_vp(problem, u, index, basis, rows, sites))
    projected = basis.T @ ggn_vp(problem, u, index, basis, rows, sites)
    values, vectors = jnp.linalg.eigh(0.5 * (projected + projected.T))
    top = jnp.argsort(values)[::-1][:rank]
    return basis @ vectors[:, top], jnp.maximum(values[top], 0.0)


def site_offsets(problem) -> dict:
    """{site name: (start, size)}: where each site's coordinates lie in u."""
    offsets, start = {}, 0
    for site in problem.sites:
        offsets[site.name] = (start, site.size)
        start += site.size
    return offsets


def group_slices(problem) -> list:
    """(start, size) for each parameter group (a dense layer: its weights and bias), where its
    coordinates lie in u. A group's sites are adjacent in u (models declare them one after another)."""
    offsets, out = site_offsets(problem), []
    for name, sites in problem.parameter_groups():
        starts = [offsets[site][0] for site in sites]
        ends = [offsets[site][0] + offsets[site][1] for site in sites]
        size = sum(offsets[site][1] for site in sites)
        if max(ends) - min(starts) != size:
            raise OptionError(f"the parameters of layer {name!r} ({', '.join(sites)}) are not adjacent in the parameter vector")
        out.append((min(starts), size))
    return out


def network_mask(problem) -> np.ndarray:
    """(P,) flags of the network's weights and biases in u (the rest: a noise scale)."""
    mask = np.zeros(problem.num_params, bool)
    for start, size in group_slices(problem):
        mask[start : start + size] = True
    return mask


def last_layer_index(problem):
    """The flat coordinates of the output layer, or None when the model does not know which it is."""
    sites = problem.last_layer_sites()
    if sites is None:
        return None
    return _site_coordinates(problem, sites)


def _site_coordinates(problem, names) -> np.ndarray:
    """The sorted flat coordinates of the sites ``names`` in u."""
    offsets = site_offsets(problem)
    return np.unique(np.concatenate([np.arange(offsets[n][0], offsets[n][0] + offsets[n][1]) for n in names]))


def site_matches(name: str, pattern: str) -> bool:
    """Whether the site ``name`` (a dotted path, ``dense_2.kernel``) is selected by ``pattern``: a
    glob over the path (``*`` any run of characters, ``?`` one, ``[...]`` a set; ``/`` may stand for
    ``.``), or a path prefix that matches whole components (``dense_2`` selects ``dense_2.kernel``
    and ``dense_2.bias``, not ``dense_20.kernel``)."""
    pattern = pattern.replace("/", ".")
    return name == pattern or name.startswith(pattern + ".") or fnmatch.fnmatchcase(name, pattern)


def pattern_index(problem, patterns, where: str) -> np.ndarray:
    """The flat coordinates of the network sites that any of ``patterns`` selects (see
    ``site_matches``). A pattern that selects no site is refused, naming the sites there are."""
    names = problem.model.network_sites(problem.data[0].shape[-1])
    chosen = []
    for pattern in patterns:
        hits = [name for name in names if site_matches(name, pattern)]
        if not hits:
            raise OptionError(
                f"{where}: the pattern {pattern!r} selects no network parameter; the parameters are "
                f"{', '.join(names)} (give a glob over those names such as '*{names[-1][-1:]}', a name, or a path prefix "
                "such as 'dense_2' for 'dense_2.kernel' and 'dense_2.bias')"
            )
        chosen.extend(hits)
    return _site_coordinates(problem, chosen)


def layer_slices(problem) -> list:
    """(start, fan_in + 1 or fan_in, fan_out) for each layer: where its weights and bias lie in u,
    contiguously as the row-major augmented matrix [W; b], or [b; W] when the model declares the
    bias first (a Network's sites come in sorted order: ``conv_0.bias`` before ``conv_0.kernel``).
    Raises when a layer's weight and bias are not adjacent (K-FAC needs the augmented layout)."""
    offsets = site_offsets(problem)
    out = []
    for layer in problem.layers():
        w_start, w_size = offsets[layer.weight]
        rows, start = layer.fan_in, w_start
        if layer.bias is not None:
            b_start, b_size = offsets[layer.bias]
            if b_start not in (w_start + w_size, w_start - b_size):
                raise OptionError(
                    f"K-FAC needs layer {layer.weight!r}'s bias {layer.bias!r} next to its weights in the "
                    "parameter vector; this model declares them apart — use hessian='diag', 'lowrank' or 'full'"
                )
            rows, start = rows + 1, min(w_start, b_start)
        out.append((start, rows, layer.fan_out))
    return out


def layer_locations(problem) -> tuple:
    """Per layer, at how many locations it is applied to each input: 1 for a dense layer, H·W for a
    convolution (read from the shapes of the forward pass, nothing computed)."""
    X = problem.data[0]
    shapes = jax.eval_shape(
        lambda u, x: problem.model.forward(network_params(problem, u, problem.constrain(u)), x)[1],
        problem.init_params, jax.ShapeDtypeStruct((1,) + tuple(X.shape[1:]), X.dtype),
    )
    return tuple(math.prod(s.shape[1:-1]) for s in shapes)


def _bias_first(problem) -> tuple:
    """Per layer, whether its bias precedes its weights in u (its ones column goes first)."""
    offsets = site_offsets(problem)
    return tuple(
        layer.bias is not None and offsets[layer.bias][0] < offsets[layer.weight][0] for layer in problem.layers()
    )


def _augmented(h, first: bool):
    """A layer's input rows (..., fan_in) with the bias's constant 1 appended, or put first."""
    ones = jnp.ones(h.shape[:-1] + (1,), h.dtype)
    return jnp.concatenate([ones, h] if first else [h, ones], axis=-1)


@partial(jax.jit, static_argnames=("rows",))
def kfac_factors(problem, u, rows: int) -> list:
    """[(A_l, G_l)] per layer (see the module docstring), summed over the data in chunks.

    A layer applied at R locations per input (a convolution, whose rows are its patches) counts
    each location as a row, as K-FAC-expand does (Eschenhagen et al., 2023): A sums ã ãᵀ over
    inputs and locations and is divided by N·R, G sums g gᵀ over both, so that A ⊗ G approximates
    Σ_n Σ_r (ã_nr ã_nrᵀ) ⊗ (g_nr g_nrᵀ); for a dense layer (R = 1) this is the usual K-FAC.
    """
    X, y = problem.data
    base = problem.constrain(u)
    params = network_params(problem, u, base)
    layers = problem.layers()
    first = _bias_first(problem)
    Xc, yc, mc = _chunked(X, y, rows)
    locations = layer_locations(problem)

    def add(totals, chunk):
        x, _, m = chunk
        raw, inputs = problem.model.forward(params, x)
        taps = [jnp.zeros(h.shape[:-1] + (layer.fan_out,), u.dtype) for h, layer in zip(inputs, layers)]
        root = problem.model.output_hessian_sqrt(raw, base) * m[:, None, None]
        _, pullback = jax.vjp(lambda t: _as_matrix(problem.model.forward(params, x, t)[0]), taps)

        def grads(c):
            # cotangent (B, C) selecting the c-th output of Lᵀ f per datum
            return pullback(root[:, :, c])[0]

        per_output = jax.vmap(grads)(jnp.arange(root.shape[-1]))  # list of (C, B, [R,] fan_out)
        new = []
        for (a_total, g_total), layer, h, g, bias_first in zip(totals, layers, inputs, per_output, first):
            if layer.bias is not None:
                h = _augmented(h, bias_first)
            h = h * jnp.reshape(m, m.shape + (1,) * (h.ndim - 1))
            h = jnp.reshape(h, (-1, h.shape[-1])).astype(a_total.dtype)
            g2 = jnp.reshape(g, (-1, g.shape[-1])).astype(g_total.dtype)
            new.append((a_total + h.T @ h, g_total + g2.T @ g2))
        return new, None

    zero = []
    for layer in layers:
        a = layer.fan_in + (layer.bias is not None)
        zero.append((jnp.zeros((a, a), wide(u.dtype)), jnp.zeros((layer.fan_out, layer.fan_out), wide(u.dtype))))
    totals = jax.lax.scan(add, zero, (Xc, yc, mc))[0]
    return [(a / (X.shape[0] * r), g) for (a, g), r in zip(totals, locations)]


@partial(jax.jit, static_argnames=("chunk",))
def hessian(problem, u, chunk: int = 32):
    """−∇² log p̃(u | D) (with the Jacobian of the constraining transforms), one Hessian-vector
    product per column, ``chunk`` at a time: the exact curvature for plain NumPyro programs."""
    gradient = jax.grad(problem.logdensity_fn)

    def column(direction):
        return -jax.jvp(gradient, (u,), (direction,))[1]

    return jax.lax.map(column, jnp.eye(u.shape[0], dtype=u.dtype), batch_size=chunk)


def prior_precision_diagonal(problem, u):
    """−∂² log p(θ)/∂θ_p² at u for every coordinate: one Hessian-vector product with a vector of
    ones, exact because the priors of ``ppl.models`` factorise over coordinates."""
    def log_prior(v):
        return problem.log_terms(v).log_prior

    ones = jnp.ones_like(u)
    return -jax.jvp(jax.grad(log_prior), (u,), (ones,))[1]


prior_precision_diagonal = jax.jit(prior_precision_diagonal)


def describe_memory(size: int) -> str:
    return f"{size / 2**30:.2f} GiB" if size >= 2**28 else f"{size / 2**20:.0f} MiB"


__all__ += ["prior_precision_diagonal", "describe_memory", "largest_eigenvalue", "free_layers", "site_offsets"]


def largest_eigenvalue(hvp, key, like: jax.Array, iterations: int) -> jax.Array:
    """|largest eigenvalue| of the symmetric operator ``hvp`` (a Hessian-vector product on vectors
    shaped like ``like``), by ``iterations`` steps of power iteration from a random start; traceable.
    SWAG caps its SGD rate with it and SG-MCMC its step size."""

    def body(_, v):
        w = hvp(v)
        return w / jnp.maximum(jnp.linalg.norm(w), jnp.finfo(like.dtype).tiny)

    v = jax.random.normal(key, like.shape, like.dtype)
    v = jax.lax.fori_loop(0, iterations, body, v / jnp.linalg.norm(v))
    return jnp.abs(jnp.vdot(v, hvp(v)))


def free_layers(layers, index) -> list:
    """The layers whose coordinates are free (K-FAC covers whole layers)."""
    free = set(np.asarray(index).tolist())
    return [layer for layer in layers if layer[0] in free]
