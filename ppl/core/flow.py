"""The normalising-flow family of the ``flow`` guide: inverse autoregressive flows over a frame.

A family like the Gaussian ones in ``_gaussian``: it samples, has ``log_prob`` (k-hat, IWAE), gives
its arrays to be saved and is rebuilt from them, checked, by ``flow_from_arrays``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.example_libraries import stax
from jax.flatten_util import ravel_pytree
from jax.scipy.linalg import solve_triangular
from numpyro.nn import AutoregressiveNN

__all__ = ["FlowFamily", "flow_weights", "flow_from_arrays"]

_LOG_2PI = math.log(2.0 * math.pi)


def _flow_network(dim: int, hidden: tuple, flip: bool):
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
