"""Stochastic-gradient MCMC on minibatches: ``sgld``, ``sghmc`` and ``cyclical_sgld``.

The Langevin kernels of ``sgld`` and ``cyclical_sgld`` are BlackJAX's (``blackjax.sgmcmc``);
``sghmc`` takes BAOAB steps of its own with a persistent momentum (see :class:`SGHMC` for why not
BlackJAX's kernel). They are fed the gradient of the Problem's log density on a minibatch, which is
already scaled by N/B and already tempered, so BlackJAX's own data-size estimator and
``temperature`` are not used (they would count N/B and T a second time); BlackJAX's temperature
argument only switches the injected noise off during the exploration stage of ``cyclical_sgld``.
After sampling, the configurational temperature of the draws is measured
(:func:`configurational_temperature`): 1 for draws from the target, with no reference needed.
Chains run vmapped, in compiled chunks of draws with a Ctrl-C check between chunks.

Preconditioning and step sizes. Each chain runs in whitened coordinates z, with u = L z fixed for
the sampling phase (a linear change of variables leaves the target intact): L Lᵀ = H⁻¹ for H the
curvature of −log p̃. For ``ppl.models`` H is the tempered GGN plus the prior's precision
(positive definite); for plain programs the exact Hessian, its eigenvalues floored. With at most
``DENSE_LIMIT`` parameters L is dense (correlations are whitened too); beyond that, diagonal. The
first frame is H averaged over the chains' starting points. The SG-MCMC methods then adapt during
warmup: after each of the first ``adapt_windows`` of its windows, every chain's frame, step and
gradient noise are measured again where that chain stands (chains of a network settle in different
modes, and the curvature at a random start is far from the curvature the chain samples in: on the
main job's BNN λ fell from about 230 to 3-60, so the step grew by two orders of magnitude).

The step ε, when not given, comes from λ, the largest eigenvalue of Lᵀ H L (the exact Hessian, by
power iteration on Hessian-vector products; near 1 when the curvature changes little), and r, the
minibatch gradient noise relative to λ. Before warmup has measured it, r = (N/B)(1 − B/N), which
holds when the per-datum gradients spread like the Fisher information; warmup measures it (see
``_row_noise``): on a classifier, rows fitted confidently wrong make it hundreds of times larger.
For SGLD the stationary variance along a direction of whitened curvature λ is inflated by about
(1 + ελr/2)/(1 − ελ/2) (Mandt, Hoffman & Blei 2017; Vollmer, Zygalakis & Teh 2016); the default
ε = 0.1/(λ(1 + r)) keeps that below about 1.05 at the λ warmup measured, and below the diagnostics'
bound of 1.25 where the posterior is curved up to 4 times more (on the main job's BNN it is curved 3
times more at some of the draws than where warmup measured it). With ``batch_size=None``
warmup also chooses the batch: of a small one and the largest affordable, the one that buys more
step per gradient evaluation (``_SGMCMC._choose_batch``). ``info`` records λ, r and the batch, the
chain statistics ε and the predicted inflation, and the diagnostics fail a run whose predicted
inflation exceeds 1.25 (measured again at the chains' mean draws). A ``step_size`` given by the
user is ε, in the whitened units.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import ClassVar, NamedTuple

import blackjax
import jax
import jax.numpy as jnp
import numpy as np

from ppl.core import curvature
from ppl.core import devices as _devices
from ppl.core import progress as _progress
from ppl.core.checkpoint import Interrupted, ResumeState, Session, restore_tree
from ppl.core.curvature import largest_eigenvalue
from ppl.core.data import check_batch_size
from ppl.core.errors import NonFiniteError, OptionError, ResumeError
from ppl.core.extend import DEFAULT_TIME_BUDGET, Extension, check_time_budget, restored_halving
from ppl.core.loop import SamplerLoop, drive
from ppl.core.method import Method, check_choice, check_positive, check_positive_int, extended_remedy
from ppl.core.posterior import Posterior
from ppl.core.records import ChainStats, RunStatus
from ppl.inference.ensemble import train_members
from ppl.inference.optimize import INITS, minibatch_indices, mode_config

__all__ = ["SGLD", "SGHMC", "CyclicalSGLD", "Whitening", "whitening", "curvature_scale"]

DEFAULT_BATCH = 64
SETTLE_WINDOWS = 8  # extra warmup windows at most while the measured curvature keeps outgrowing the step
SETTLE_TOLERANCE = 1.25  # curvature growth (against the step's) that the settling tolerates
MAX_AUTO_BATCH = 4096  # the largest minibatch the automatic choice takes (the full data when smaller)
POWER_ITERATIONS = 30
DRAWS_PER_CHUNK = 100  # draws per compiled call; Ctrl-C is honoured between calls
# SGLD steps unrolled per trip of its sampling loop: a step of a small network is a few dozen small
# operations, and XLA:CPU pays a fixed cost per loop trip. Measured on the main job's BNN (4 chains,
# 400 draws × 50 steps, warm fit): 7.5 s with 1, 6.2 s with 10, 6.5–6.6 s with 25 or 50 (1 s more
# compiling with 10, 7 s with 25), identical draws. Not in the warmup loop (3 s more compiling for
# little), nor SGHMC's (13% faster for twice the compile time, and its float32 trajectory rounds
# differently) or cyclical SGLD's (4% faster, 3 s more compiling).
UNROLL = 10
STEP_FACTOR = 0.1  # ε λ (1 + r) for the automatic Langevin step size
SGHMC_STEP_FACTOR = 0.25  # ε √(λ (1 + r)) for the automatic SGHMC step size
EXPLORATION_CAP = 1.0  # the largest ε λ (1 + r) at the top of a cyclical SGLD cycle
DRAWS_PER_CYCLE = 5  # cyclical SGLD's default: every cycle ends in 5 stored draws (see docs/methods/sgmcmc.md)
NOISE_SHARE = 0.1  # the variance inflation the automatic SGHMC step allows the gradient noise
ANCHOR_STREAM = 17  # the key stream (of the chains' starts) of the control variates' MAP runs
ANCHOR_STEPS = 2000  # L-BFGS iterations per round of those MAP runs (map's default)


class Whitening(NamedTuple):
    """The frame a chain's gradient is taken in: u = L z, ``inverse`` maps back (dense matrices, or
    vectors for a diagonal L). With control variates, also the chain's anchor: a mode û of the
    log density and its full-data gradient there (both in u), see ``_gradient``."""

    L: jax.Array
    inverse: jax.Array
    anchor: jax.Array | None = None
    anchor_grad: jax.Array | None = None

    def anchored(self, other: "Whitening") -> "Whitening":
        """This frame with ``other``'s anchor (a re-measured frame keeps the chain's anchor)."""
        return self._replace(anchor=other.anchor, anchor_grad=other.anchor_grad)

    def to_u(self, z):
        return self.L @ z if self.L.ndim == 2 else self.L * z

    def to_z(self, u):
        return self.inverse @ u if self.inverse.ndim == 2 else self.inverse * u

    def pull(self, g):
        """A gradient in u as one in z: Lᵀ g."""
        return self.L.T @ g if self.L.ndim == 2 else self.L * g


DENSE_LIMIT = 1000  # parameters up to which the whitening is dense


def _time_covered(posterior, bias: str) -> str:
    """How far a run's chains could travel, in words: the sampling steps behind each chain's draws
    times the step ε is the time they span in the whitened frame, where the widest directions have
    unit curvature at the point the frame was measured (a Langevin diffusion relaxes along them in
    about one unit); "" when the run's record lacks the numbers (a record edited or from another
    version). Cyclical SGLD, whose step changes within each cycle, does not ask for it."""
    info, options = getattr(posterior, "info", None) or {}, getattr(posterior, "options", None) or {}
    def number(x):
        return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool) and math.isfinite(x) and x > 0

    given = options.get("step_size")
    step, curvature, thinning = given or info.get("step_size"), info.get("curvature"), options.get("thinning")
    draws = np.shape(getattr(posterior, "flat_draws", None))
    if not (number(step) and number(curvature) and isinstance(thinning, int) and len(draws) == 3):
        return ""
    steps, noise = draws[1] * thinning, info.get("gradient_noise")
    noisy = f" (with minibatch gradient noise r = {noise:.3g} relative to it)" if number(noise) else ""
    why = ("as given (step_size)" if given else
           f"held that small by the largest whitened curvature, λ = {curvature:.3g}{noisy}, as a step's bias grows "
           f"with {bias}")
    return (f"each chain's draws come from {steps:,} steps of ε = {step:.2g}, {steps * step:.3g} units of time in its "
            f"whitened frame (where the posterior's widest directions have unit curvature, and relax in about one unit); "
            f"ε is {why}; ")


@partial(jax.jit, static_argnames=("dense",))
def _curvature_at(problem, u, key, dense: bool):
    """H at u: (P, P) when ``dense``, else its diagonal (see the module docstring)."""
    if problem.is_declarative:
        prior_weight, lik_weight = problem.weights(None)
        rows = curvature.chunk_rows(problem.model.output_dim(), problem.num_params)
        prior = prior_weight * curvature.prior_precision_diagonal(problem, u)
        ggn = curvature.ggn(problem, u, None, "full" if dense else "diag", rows).astype(u.dtype)
        H = lik_weight * ggn + (jnp.diag(prior) if dense else prior)
        # The GGN covers the network's outputs only: a likelihood's own parameters (a regression's
        # noise scale) would keep their prior's curvature alone, while their likelihood's is about
        # 2N for log σ. On UCI boston that direction alone made the whitened curvature 43,000
        # (600 at the same point with it), and every step that small. Take the exact Hessian's
        # diagonal there (one HVP per such coordinate; the coupling to the weights vanishes in
        # expectation at the posterior's typical points).
        extra = np.flatnonzero(~curvature.network_mask(problem))
        if extra.size:
            grad = jax.grad(problem.logdensity_fn)
            units = jnp.eye(u.shape[0], dtype=u.dtype)[extra]
            exact = -jax.vmap(lambda e: jnp.vdot(e, jax.jvp(grad, (u,), (e,))[1]))(units)
            H = H.at[extra, extra].max(exact) if dense else H.at[extra].max(exact)
        return H
    if dense:
        return curvature.hessian(problem, u)
    grad = jax.grad(problem.logdensity_fn)
    probes = jax.random.rademacher(key, (64, u.shape[0]), dtype=u.dtype)
    return jnp.abs(jnp.mean(jax.vmap(lambda v: -v * jax.jvp(grad, (u,), (v,))[1])(probes), axis=0))


def whitening(problem, starts, key) -> Whitening:
    """L from the curvature averaged over the chains' starting points (eigenvalues floored at
    1e-6 of the largest, so a flat or indefinite direction gets a large but finite scale)."""
    dense = problem.num_params <= DENSE_LIMIT
    H = sum(_curvature_at(problem, u, jax.random.fold_in(key, c), dense) for c, u in enumerate(starts)) / len(starts)
    return _frame(H, dense)


def whitening_each(problem, positions, key) -> Whitening:
    """One frame per chain, from the curvature at that chain's own position (leading chain axis):
    chains of a network settle in different modes, whose curvatures differ (relabelled hidden
    units), so one frame averaged over them fits none of them."""
    dense = problem.num_params <= DENSE_LIMIT
    frames = [_frame(_curvature_at(problem, u, jax.random.fold_in(key, c), dense), dense) for c, u in enumerate(positions)]
    return jax.tree_util.tree_map(lambda *parts: jnp.stack(parts), *frames)


def _frame(H, dense: bool) -> Whitening:
    if dense:
        values, vectors = jnp.linalg.eigh(0.5 * (H + H.T))
        values = jnp.maximum(values, 1e-6 * jnp.max(jnp.abs(values)))
        root = jnp.sqrt(values)[None, :]
        return Whitening(vectors / root, (vectors * root).T)
    h = jnp.maximum(H, 1e-6 * jnp.max(H))
    return Whitening(1.0 / jnp.sqrt(h), jnp.sqrt(h))


@partial(jax.jit, static_argnames=("iterations",))
def _top_curvature(problem, u, key, white, iterations: int = POWER_ITERATIONS):
    """The largest positive eigenvalue of Lᵀ (−∇² log p̃) L at u (full batch), by power iteration
    on HVPs: the curvature that limits a Langevin step (beyond ε λ = 2 the step overshoots and
    the chain oscillates outwards). A network's Hessian is indefinite (the layers' weights couple
    bilinearly, in ± pairs), and plain power iteration finds the eigenvalue of largest magnitude,
    which may be a negative one that no step size has to respect: then the iteration is run again
    on the operator shifted by that magnitude, whose top eigenvalue less the shift is the
    largest positive one."""
    grad = jax.grad(problem.logdensity_fn)

    def hvp(v):
        return -white.pull(jax.jvp(grad, (u,), (white.to_u(v),))[1])

    magnitude = largest_eigenvalue(hvp, key, u, iterations)
    shifted = largest_eigenvalue(lambda v: hvp(v) + magnitude * v, jax.random.fold_in(key, 1), u, iterations)
    positive = shifted - magnitude
    # when the largest-magnitude eigenvalue is itself positive, the shifted top is 2 × it (up to
    # the iteration's error): keep the better-converged unshifted value
    # (floored at a twentieth of the magnitude: a step is never sized for a vanishing curvature)
    return jnp.where(positive >= 0.9 * magnitude, magnitude, jnp.maximum(positive, 0.05 * magnitude))


def curvature_scale(problem, starts, key, white) -> float:
    """λ: the largest whitened curvature over the chains' starting points."""
    values = [float(_top_curvature(problem, u, jax.random.fold_in(key, c), white)) for c, u in enumerate(starts)]
    return max(values)


def _curvature_each(problem, positions, key, frames) -> np.ndarray:
    """λ of each chain at its position, in its own frame (``frames`` with a leading chain axis)."""
    return np.asarray([
        float(_top_curvature(problem, u, jax.random.fold_in(key, c), _chain(frames, c)))
        for c, u in enumerate(positions)
    ])


def _chain(tree, c: int):
    return jax.tree_util.tree_map(lambda x: x[c], tree)


DRIFT_CAP = 10.0  # the most one step's drift may move a whitened coordinate (in posterior sds)


def _gradient(problem, white, step=None):
    """The gradient in z of the Problem's (scaled, tempered) log density on a minibatch of rows.

    With ``step``, each coordinate is capped at DRIFT_CAP / step, so that one step's drift moves
    no coordinate by more than DRIFT_CAP posterior sds. Within 5 sd of the whitened target's centre
    the drift of any stable step (ε λ < 2) is below that, so the cap does not bind there (the
    automatic step's drift is a few hundredths of it); where a network's curvature outgrows the
    step (its gradients grow faster than linearly with the weights), an uncapped chain oscillates
    with growing amplitude until its outputs overflow (seen on the main job's BNN), while a capped
    one moves by a bounded amount and returns. It is the coordinate-wise taming of Brosse, Durmus,
    Moulines & Sabanis (2019) in its clipping form.

    With an anchor in the frame (``control_variate=True``) and a minibatch, the estimate is
    ∇log p̃(û) + ∇log p̃_B(u) − ∇log p̃_B(û) (Baker, Fearnhead, Fox & Nemeth 2019): unbiased like the
    plain minibatch gradient, but its noise comes from the rows' gradient *differences* between u
    and the mode û, which vanish as u nears û, instead of from the rows' gradients themselves. It
    costs a second minibatch gradient per step."""
    grad_fn = jax.grad(problem.logdensity_fn)

    def estimate(z, rows):
        batch = None if rows is None else problem.batch(rows)
        g = grad_fn(white.to_u(z), batch)
        if white.anchor is not None and batch is not None:
            g = g - grad_fn(white.anchor, batch) + white.anchor_grad
        grad = white.pull(g)
        if step is None:
            return grad
        bound = DRIFT_CAP / step
        return jnp.clip(grad, -bound, bound)

    return estimate


NOISE_DRAWS = 4  # draws per chain at which a finished run's gradient noise is measured again
NOISE_ROWS = 4096  # data rows behind the measured gradient noise (every row of a smaller data set)


@partial(jax.jit, static_argnames=("rows",))
def _row_noise(problem, white, u, key, rows: int):
    """K, the per-row gradient noise at u: a minibatch of B of the N rows drawn without
    replacement, each row's log-likelihood gradient weighted by N / (B T), estimates the gradient
    with covariance K (N − B) / B at most along any direction of z, where
    K = N² λ_max(S) / ((N − 1) T²) and S is the covariance of the per-row gradients.

    λ_max(S) comes from power iteration on S v = Gᵀ(G v)/n − ḡ (ḡᵀ v), with G v a JVP and Gᵀ r a
    VJP of the per-row log likelihoods: exact when every row is used (``rows`` ≥ N), otherwise
    from a random subset of ``rows`` rows (an estimate that errs high). Sampling minibatches
    instead would need far more draws than parameters: the top eigenvalue of a few dozen draws'
    covariance measures the variance spread over all directions, not the worst one."""
    n_data = problem.num_data
    data = problem.data if rows >= n_data else problem.batch(jax.random.choice(key, n_data, (rows,), replace=False))

    def per_row(z):
        return problem.pointwise_loglik(white.to_u(z), data)

    # the rows' gradients at z, less their gradients at the anchor under control variates: D v is
    # the JVP and Dᵀ r the VJP of those differences
    z = white.to_z(u)
    values, pull = jax.vjp(per_row, z)
    anchor = None if white.anchor is None else white.to_z(white.anchor)
    pull_anchor = None if anchor is None else jax.vjp(per_row, anchor)[1]

    def D(v):
        out = jax.jvp(per_row, (z,), (v,))[1]
        return out if anchor is None else out - jax.jvp(per_row, (anchor,), (v,))[1]

    def Dt(r):
        out = pull(r)[0]
        return out if pull_anchor is None else out - pull_anchor(r)[0]

    n = values.shape[0]
    mean = Dt(jnp.full((n,), 1.0 / n, values.dtype))

    def covariance(v):
        return Dt(D(v)) / n - mean * jnp.vdot(mean, v)

    top = largest_eigenvalue(covariance, jax.random.fold_in(key, 1), z, POWER_ITERATIONS)
    return n_data * n_data * top / (max(n_data - 1, 1) * problem.temperature ** 2)


def row_noise(problem, frames, positions, key) -> np.ndarray:
    """K (see ``_row_noise``) of each chain at its position, in its frame."""
    rows = min(NOISE_ROWS, problem.num_data)
    return np.asarray([float(_row_noise(problem, _chain(frames, c), u, jax.random.fold_in(key, c), rows))
                       for c, u in enumerate(positions)])


TEMPERATURE_DRAWS = 256  # draws (spread over the chains) at which a finished run's temperature is measured
TEMPERATURE_PROBES = 8  # Rademacher probes per draw for the Laplacian's trace


@partial(jax.jit, static_argnames=("probes",))
def _temperature_terms(problem, draws, key, probes: int = TEMPERATURE_PROBES):
    """|∇ log p̃(u)|² and −Δ log p̃(u) (Hutchinson's trace estimate from ``probes`` Rademacher
    vectors and Hessian-vector products) at each of ``draws`` (K, P), on the full data."""
    grad = jax.grad(problem.logdensity_fn)

    def one(u, k):
        g = grad(u)
        vectors = jax.random.rademacher(k, (probes, u.shape[0]), dtype=u.dtype)
        laplacian = jnp.mean(jax.vmap(lambda v: jnp.vdot(v, jax.jvp(grad, (u,), (v,))[1]))(vectors))
        return jnp.vdot(g, g), -laplacian

    return jax.lax.map(lambda pair: one(*pair), (draws, jax.random.split(key, draws.shape[0])))


def configurational_temperature(problem, flat, key) -> float:
    """T = E|∇U|² / E[ΔU] over the draws, U = −log p̃: exactly 1 when the draws come from p̃ ∝ e^−U
    (integrate ∇·(∇U e^−U) = 0 by parts), whatever p̃ is, so it needs no reference. Draws spread c
    times too wide in variance along a Gaussian's principal directions give T = Σ cᵢλᵢ² / Σ λᵢ,
    the inflation weighted towards the sharpest directions, where a step's discretisation error
    is largest (the molecular-dynamics "configurational temperature"). It sees what the
    predicted inflation cannot: the Euler error of SGHMC, and curvature that varies from draw to
    draw. Measured at ``TEMPERATURE_DRAWS`` draws spread evenly over the chains and their length.

    On the conjugate linear fixture it came to 0.98 ± 0.07 for NUTS's draws, 1.04 for sgld at its
    automatic step, and 3.56 where the variance was 3.8–4.1 times too wide; on the main job's BNN,
    1.08 for NUTS's draws (a ReLU network's kinks add curvature that autodiff does not see, a few
    per cent there) and 41 for an SGHMC run whose outputs were 127 times too spread out."""
    flat = np.asarray(flat)
    chains, count = flat.shape[:2]
    per_chain = max(1, -(-TEMPERATURE_DRAWS // chains))
    picks = np.unique(np.linspace(0, count - 1, per_chain).astype(int))
    draws = jnp.asarray(flat[:, picks].reshape(-1, flat.shape[-1]))
    squared, laplacian = (np.asarray(x, dtype=np.float64) for x in _temperature_terms(problem, draws, key))
    with np.errstate(all="ignore"):  # chains far out in the tails overflow: then T is infinite
        numerator, denominator = float(np.mean(squared)), float(np.mean(laplacian))
        value = numerator / denominator if np.isfinite(denominator) and denominator > 0 else float("inf")
    return value if np.isfinite(value) else float("inf")


def _streams(key) -> tuple:
    """(starts, curvature, run) keys of one run of whitened chains."""
    return tuple(jax.random.split(key, 3))


def _temperature_key(run_key):
    return jax.random.fold_in(run_key, 11)


def minibatch_noise(num_data: int, batch: int | None, row_noise) -> np.ndarray | float:
    """The minibatch gradient's largest variance, K (N − B) / B (0 for the full batch)."""
    return 0.0 if batch is None or batch >= num_data else np.asarray(row_noise) * (num_data - batch) / batch


def _rows(problem, key, batch_size):
    if batch_size is None:
        return None
    return minibatch_indices(key, problem.num_data, batch_size)


class _Tuning(NamedTuple):
    """What the chains' kernel is built from, fixed for sampling: each chain's frame (leading
    chain axis), its whitened curvature λ and per-row gradient noise K (None until warmup measured
    it), and the minibatch size (None: the full batch)."""

    frames: Whitening
    curvature: np.ndarray
    row_noise: np.ndarray | None
    batch: int | None

    def arrays(self) -> dict:
        anchor, anchor_grad = ((np.zeros(0), np.zeros(0)) if self.frames.anchor is None
                               else (np.asarray(self.frames.anchor), np.asarray(self.frames.anchor_grad)))
        return {"frame_L": np.asarray(self.frames.L), "frame_inverse": np.asarray(self.frames.inverse),
                "anchor": anchor, "anchor_grad": anchor_grad,
                "curvature": np.asarray(self.curvature, np.float64),
                "row_noise": np.zeros(0) if self.row_noise is None else np.asarray(self.row_noise, np.float64),
                "batch": np.asarray(0 if self.batch is None else self.batch, np.int64)}

    @staticmethod
    def restore(arrays: dict, template: "_Tuning", problem) -> "_Tuning":
        """The tuning a checkpoint holds, each array checked against this run's shapes."""
        chains = template.curvature.shape[0]
        got = {name: np.asarray(arrays.get(name, np.zeros(0))) for name in template.arrays()}

        def fail(name, wanted):
            raise ResumeError(
                f"the checkpoint's {name} (shape {list(got[name].shape)}) is not {wanted} for this run's {chains} "
                "chains; it was written by another version or with other options — start afresh without resume"
            )

        anchors = (0,) if template.frames.anchor is None else template.frames.anchor.shape
        for name, shape in (("frame_L", template.frames.L.shape), ("frame_inverse", template.frames.inverse.shape),
                            ("curvature", (chains,)), ("anchor", anchors), ("anchor_grad", anchors)):
            if got[name].shape != shape or not np.all(np.isfinite(got[name])):
                fail(name, f"finite and of shape {list(shape)}")
        if got["row_noise"].shape not in ((0,), (chains,)) or not np.all(np.isfinite(got["row_noise"])):
            fail("row_noise", "empty or one finite value per chain")
        batch = got["batch"]
        if batch.shape != () or not 0 <= int(batch) <= (problem.num_data or 0):
            fail("batch", "a batch size no larger than the data")
        dtype = template.frames.L.dtype
        frames = Whitening(jnp.asarray(got["frame_L"], dtype), jnp.asarray(got["frame_inverse"], dtype))
        if template.frames.anchor is not None:
            frames = frames._replace(anchor=jnp.asarray(got["anchor"], dtype),
                                     anchor_grad=jnp.asarray(got["anchor_grad"], dtype))
        return _Tuning(frames,
                       got["curvature"], got["row_noise"] if got["row_noise"].size else None, int(batch) or None)


@dataclass(frozen=True)
class WhitenedChains(Method):
    """Chains in whitened coordinates, vmapped, in compiled chunks of draws: the runner shared by
    the SG-MCMC methods and ``mh``. A subclass defines its step rule, its per-chain extra state,
    ``_transition`` (one warmup step) and ``_draw`` (the steps behind one stored draw)."""

    kind: ClassVar[str] = "chains"
    resumable: ClassVar[bool] = True
    # warmup windows after each of which every chain's frame and step are re-measured where it stands
    adapt_windows: ClassVar[int] = 0

    num_warmup: int = 1000
    num_samples: int = 1000
    num_chains: int = 4
    thinning: int = 5
    init: str = "uniform"
    time_budget: float | None = DEFAULT_TIME_BUDGET

    def __post_init__(self):
        super().__post_init__()
        check_positive_int(self.name, "num_warmup", self.num_warmup, allow_zero=True)
        for option in ("num_samples", "num_chains", "thinning"):
            check_positive_int(self.name, option, getattr(self, option))
        check_choice(self.name, "init", self.init, INITS)
        check_time_budget(self.name, self.time_budget)

    def stored_draws(self) -> int:
        return self.num_chains * self.num_samples

    def _batch(self, problem):
        return None  # full batch

    def _anchored(self, key, problem, session: Session) -> tuple:
        """(the chains' control-variate anchors or None, the session their loop runs in)."""
        return None, session

    def _step(self, curvature: float, noise: float) -> float:
        raise NotImplementedError

    def _inflation(self, step: float, curvature: float, noise: float) -> float | None:
        return None

    def _init_extra(self, problem, white, z):
        return ()

    def _warm_transition(self, problem, white, batch, state, key, step, index):
        """One warmup step (the sampling kernel's own step unless a subclass says otherwise)."""
        return self._transition(problem, white, batch, state, key, step, index)

    def _record(self, chain_stats: ChainStats, state, draws_done: int) -> tuple[ChainStats, dict]:
        """The chain statistics and ``info`` entries completed from the final state, after
        ``draws_done`` stored draws."""
        return chain_stats, {}

    def _resolved(self, steps) -> dict:
        """``info`` entries for the options left to the method (None), under the option's name: what
        the run chose (``steps``: each chain's step size)."""
        return {}

    def run(self, key, problem, session: Session | None = None) -> Posterior:
        self.check(problem)
        session = session or Session()
        anchors, session = self._anchored(key, problem, session)
        return drive(_WhitenedLoop(self, key, problem, session, anchors), session)

    def _noise(self, problem, tune) -> np.ndarray:
        """Each chain's minibatch gradient noise relative to its curvature, r = v / λ: measured
        (``row_noise``) once warmup has measured it, before that predicted as (N/B)(1 − B/N), which
        holds when the per-row gradients scatter like the Fisher information."""
        if tune.batch is None:
            return np.zeros(self.num_chains)
        if tune.row_noise is None:
            n = problem.num_data
            return np.full(self.num_chains, (n / tune.batch) * (1.0 - tune.batch / n))
        return minibatch_noise(problem.num_data, tune.batch, tune.row_noise) / tune.curvature

    def _steps(self, problem, tune) -> np.ndarray:
        """One step for every chain: the smallest of the steps their own curvature and noise ask for.
        Each chain's λ is measured at one point, and the curvature of a network's posterior varies
        several-fold from place to place (3 to 60 on the main job's BNN); a chain that drew a
        low-curvature spot and stepped by it alone later diverged where the curvature was higher."""
        own = [self._step(float(c), float(r)) for c, r in zip(tune.curvature, self._noise(problem, tune))]
        return np.full(self.num_chains, min(own))

    def _windows(self, calls: int) -> list:
        """Lengths of the warmup windows: with ``adapt_windows`` = K, K windows each followed by a
        re-measured frame and step, then two more under the final ones (the chains settle into the
        kernel they will sample with). Equal lengths share one compiled program."""
        if not self.adapt_windows or calls < self.adapt_windows + 2:
            return [calls]
        count = self.adapt_windows + 2
        length = calls // count
        return [length] * (count - 1) + [calls - length * (count - 1)]

    def _adapt(self, problem, tune, state, key):
        """Each chain's frame, curvature and gradient noise re-measured at its current position
        (and the batch size chosen, when it is automatic); the chains' coordinates carried into the
        new frames (the positions u do not move)."""
        z, extra = state
        positions = jax.vmap(lambda f, x: f.to_u(x))(tune.frames, z)
        frames = whitening_each(problem, positions, key).anchored(tune.frames)
        curvature = _curvature_each(problem, positions, key, frames)
        noise = None if tune.batch is None else row_noise(problem, frames, positions, jax.random.fold_in(key, 3))
        if not (np.all(np.isfinite(curvature)) and (noise is None or np.all(np.isfinite(noise)))):
            raise NonFiniteError(
                f"{self.name}: the curvature or gradient noise at the chains' warmup positions is not finite — the "
                "step size is too large for this posterior; lower step_size (or leave it None for the automatic choice)",
                step=0, last_finite_params=None,
            )
        if noise is not None and tune.row_noise is not None:
            # the largest seen so far: the noise varies from place to place as much as the curvature
            # (measured 1.3 at a window's end and 70 at the same chains' mean draws on the main job)
            noise = np.maximum(noise, tune.row_noise)
        batch = tune.batch if noise is None else self._choose_batch(problem, tune.batch, curvature, noise)
        moved = (jax.vmap(lambda f, u: f.to_z(u))(frames, positions), extra)
        return moved, _Tuning(frames, curvature, noise, batch)

    def _choose_batch(self, problem, batch, curvature, noise):
        return batch

    def _resumed(self, resume, problem, tune) -> tuple:
        """(stored draws, draws done, draws targeted, tuning) of the state to resume from, checked
        against this run (the target is num_samples, or a multiple of it in an extended run)."""
        done = resume.progress.get("draws_done")
        target = resume.progress.get("draws_target", self.num_samples)
        stored = np.asarray(resume.arrays.get("draws", np.zeros(0)))
        expected = (self.num_chains, done, problem.num_params)
        fits = (isinstance(target, int) and target >= self.num_samples and target % self.num_samples == 0
                and (target == self.num_samples or self.time_budget))
        if not (fits and isinstance(done, int) and 0 <= done <= target) or stored.shape != expected:
            raise ResumeError(
                f"the checkpoint's progress ({done!r} of {target!r} draws, stored draws of shape {list(stored.shape)}) "
                f"does not fit a run of {self.num_chains} chains × {self.num_samples} draws; resume with the options "
                "that wrote it, or start afresh"
            )
        draws = [stored.astype(problem.init_params.dtype)] if done else []
        return draws, done, target, _Tuning.restore(resume.arrays, tune, problem)

    def _posterior(self, problem, tune, plan, run_key, flat, state, done, target, remeasure: bool,
                   run_info: dict) -> Posterior:
        """The chains' Posterior; ``run_info``: what the run loop adds to its info (the extension's
        rounds, the control variates' anchors)."""
        noise = self._noise(problem, tune)
        steps = self._steps(problem, tune)
        info = {"curvature": float(np.max(tune.curvature)), "gradient_noise": float(np.max(noise)),
                "batch_size": tune.batch}
        sampling = steps if plan.get("sampling_step") is None else plan["sampling_step"](steps)
        curvature = tune.curvature
        if remeasure and self._inflation(1.0, 1.0, 0.0) is not None:
            # Warmup measured λ and the gradient noise where the chains stood then; a network's
            # posterior is curved several times more in some places than in others, and an outlier
            # makes the gradients scatter far more than the Fisher information predicts. Measure both
            # again at a few of each chain's draws, in its frame, and judge the step by the worse:
            # the largest λ, and the mean noise. (Not at the chain's mean draw: a network's mean
            # weights are no typical point of its posterior.)
            picks = np.unique(np.linspace(0, flat.shape[1] - 1, NOISE_DRAWS).astype(int))
            at_draws = np.max([_curvature_each(problem, flat[:, i], jax.random.fold_in(run_key, 7 + int(i)), tune.frames)
                               for i in picks], axis=0)
            info["curvature_at_draws"] = float(np.max(at_draws))
            curvature = np.maximum(curvature, at_draws)
            if tune.batch is not None and tune.batch < problem.num_data:
                per_draw = [row_noise(problem, tune.frames, flat[:, i], jax.random.fold_in(run_key, 7 + int(i)))
                            for i in picks]
                measured = minibatch_noise(problem.num_data, tune.batch, np.mean(per_draw, axis=0))
                info["gradient_noise_measured"] = float(np.max(measured / curvature))
                noise = np.maximum(noise, measured / curvature)
        inflations = [self._inflation(float(e), float(c), float(r)) for e, c, r in zip(sampling, curvature, noise)]
        inflation = None if inflations[0] is None else max(inflations)
        temperature = None
        if remeasure and self._inflation(1.0, 1.0, 0.0) is not None:
            temperature = configurational_temperature(problem, flat, _temperature_key(run_key))
            info["temperature"] = temperature
        chain_stats = ChainStats(step_size=np.asarray(steps, dtype=float), variance_inflation=inflation,
                                 temperature=temperature)
        chain_stats, extra = self._record(chain_stats, state, done)
        info.update(extra)
        info.update(self._resolved(steps))
        info.update(run_info)
        return Posterior(
            method=self.name, kind=self.kind, declared_by=type(self), problem=problem, flat_draws=flat,
            status=RunStatus(interrupted=done < target, steps_done=done), chain_stats=chain_stats, info=info,
        )

    def _plan(self) -> dict:
        return {"warmup_calls": self.num_warmup}


@dataclass(frozen=True)
class _SGMCMC(WhitenedChains):
    """Minibatch gradient chains: a step size (whitened units, None chooses it) and a batch size."""

    adapt_windows: ClassVar[int] = 3
    # what a step's bias grows with, for the mixing remedy (None: the step changes within the run)
    step_bias: ClassVar[str | None] = None

    step_size: float | None = None
    batch_size: int | None = None
    control_variate: bool = False

    def __post_init__(self):
        super().__post_init__()
        if self.step_size is not None:
            check_positive(self.name, "step_size", self.step_size)
        if self.batch_size is not None:
            check_positive_int(self.name, "batch_size", self.batch_size)

    @classmethod
    def remedy(cls, posterior, topic):
        if topic == "mixing":
            # Not "lower step_size" (the generic advice): a chain that has not mixed needs more time, and a
            # smaller step buys less of it per step.
            other = "" if cls.name == "sghmc" else "method='sghmc' (its momentum travels where Langevin steps diffuse) or "
            covered = _time_covered(posterior, cls.step_bias) if cls.step_bias else ""
            return covered + extended_remedy(posterior, f"raise num_samples, or use {other}method='nuts'")
        return super().remedy(posterior, topic)

    def _resolved(self, steps) -> dict:
        if self.step_size is not None:
            return {}
        per_chain = [float(v) for v in np.ravel(np.asarray(steps, dtype=float))]
        return {"step_size": per_chain[0] if len(set(per_chain)) == 1 else per_chain}

    @classmethod
    def remeasure(cls, posterior, key):
        # the configurational temperature is measured at the kept draws with the run's own key: a
        # loaded run measures it again, so that the verdict never reads a stored number
        stats = posterior.chain_stats
        if stats is None or stats.temperature is None:
            return posterior
        temperature = configurational_temperature(posterior.problem, posterior.flat_draws,
                                                  _temperature_key(_streams(key)[2]))
        info = {**posterior.info, "temperature": temperature} if "temperature" in posterior.info else posterior.info
        return posterior.replace(chain_stats=stats._replace(temperature=temperature), info=info)

    def check(self, problem) -> None:
        check_batch_size(self.batch_size, problem.num_data)
        if self.control_variate:
            n = problem.num_data if problem.is_declarative else None
            full = n is None or (self.batch_size is None and n <= MAX_AUTO_BATCH) or (self.batch_size or 0) >= n
            if full:
                rows = "a plain program's data are not cut into rows" if n is None else (
                    f"batch_size={self.batch_size} takes all {n} rows per step" if self.batch_size is not None
                    else f"batch_size=None takes all {n} rows per step (up to {MAX_AUTO_BATCH})")
                raise OptionError(
                    f"{self.name}: control_variate=True corrects minibatch gradients, but this run has none ({rows}); "
                    "its anchors' MAP runs and second gradient per step would buy nothing — set batch_size below "
                    "the number of rows, or leave control_variate off"
                )

    def _anchored(self, key, problem, session: Session) -> tuple:
        """(the chains' anchors, the session of the chains' phase) under control variates: one MAP
        per chain from the chains' own kind of start, trained together as an ensemble with the
        model's own prior, in a phase of its own (``"anchors"``: a Ctrl-C there keeps its state,
        and resuming continues it), then the chains' phase (``"chains"``), whose checkpoints also
        hold the anchors. A mode the optimiser left short is still a valid anchor (the estimate
        stays unbiased); it only removes less of the noise."""
        if not self.control_variate:
            return None, session
        if session.resumed_phase() == "chains":  # the checkpoint holds the anchors
            info = _restored_anchor_info(session.resume.progress)
            return _Anchors(None, None, info), session.phase("chains", **info)
        fit = train_members(
            jax.random.fold_in(_streams(key)[0], ANCHOR_STREAM), problem, mode_config(ANCHOR_STEPS),
            num_members=self.num_chains, init=self.init, session=session.phase("anchors", partial_results=False))
        if fit.status.interrupted:
            raise Interrupted(
                f"{self.name}: interrupted while finding the chains' anchors (their MAP runs), after "
                f"{fit.status.steps_done} steps; the state is kept — resume continues it", fit.resume_state,
            )
        modes = jnp.asarray(fit.flat_draws[:, 0, :])
        grads = jax.vmap(lambda u: jax.grad(problem.logdensity_fn)(u, None))(modes)
        if not (np.all(np.isfinite(np.asarray(modes))) and np.all(np.isfinite(np.asarray(grads)))):
            raise NonFiniteError(
                f"{self.name}: a chain's anchor (its MAP) or the gradient there is not finite; run without "
                "control_variate, or check the model's log density", step=0, last_finite_params=None,
            )
        info = {"anchor_converged": bool(fit.status.converged), "anchor_steps": int(fit.status.steps_done)}
        return _Anchors(modes, grads, info), session.phase("chains", **info)

    def _batch(self, problem):
        if not problem.is_declarative:
            return None
        if self.batch_size is not None:
            return self.batch_size
        n = problem.num_data
        return n if n <= MAX_AUTO_BATCH else DEFAULT_BATCH

    def _step(self, curvature: float, noise: float) -> float:
        return float(self.step_size) if self.step_size is not None else self._auto_step(curvature, noise)

    def _choose_batch(self, problem, batch, curvature, noise):
        """With ``batch_size=None``: every row when there are at most ``MAX_AUTO_BATCH`` (such a step
        costs little more than a small batch's, and has no gradient noise: on the main job's BNN
        the noise warmup measured was 6 times the curvature, but 250 times at the draws the chains
        went on to take). On more rows, of a small batch and the largest affordable one, the one that
        buys more step per gradient evaluation, B / ε(B), with ε(B) the automatic step (the smallest
        over the chains) under that batch's gradient noise v(B) = K (N − B)/B. For SGLD,
        ε ≈ c / (λ + v(B)), so the cost B (λ + v(B)) / c = (λ B + K (N − B)) / c is linear in B and
        the larger batch wins when the per-row noise K exceeds the curvature λ — on small data
        sets, and wherever some rows are fitted confidently wrong, the usual case: there a small
        batch could only be made faithful with a step far too small to mix."""
        if self.batch_size is not None:
            return batch
        n = problem.num_data
        if n <= MAX_AUTO_BATCH:
            return n

        def cost(b):
            relative = np.asarray(minibatch_noise(n, b, noise)) / curvature
            return b / min(self._auto_step(float(c), float(r)) for c, r in zip(curvature, np.broadcast_to(relative, curvature.shape)))

        small, large = min(DEFAULT_BATCH, n), min(n, MAX_AUTO_BATCH)
        return large if cost(large) <= cost(small) else small

    def _auto_step(self, curvature: float, noise: float) -> float:
        return STEP_FACTOR / (curvature * (1.0 + noise))

    def _inflation(self, step: float, curvature: float, noise: float) -> float | None:
        """Predicted worst-case variance inflation of a Langevin step ``step`` (see the module)."""
        half = step * curvature / 2.0
        return (1.0 + half * noise) / (1.0 - half) if half < 1.0 else float("inf")


class _WhitenedLoop(SamplerLoop):
    """One run of whitened chains for :func:`drive`: warmup in windows (each followed by re-measured
    frames, curvature and gradient noise) in ``begin``, then draws in chunks of ``DRAWS_PER_CHUNK``."""

    def __init__(self, method: WhitenedChains, key, problem, session: Session, anchors: "_Anchors | None" = None):
        self.method, self.problem, self.session = method, problem, session
        start_key, self.curve_key, self.run_key = _streams(key)
        self.dtype = problem.init_params.dtype
        starts = jnp.stack([problem.init_position(jax.random.fold_in(start_key, c), method.init)
                            for c in range(method.num_chains)])
        self.anchor_info = {} if anchors is None else anchors.info
        if anchors is not None:
            if anchors.modes is None:  # resumed: the checkpoint's tuning holds them
                anchors = anchors._replace(modes=jnp.zeros_like(starts), grads=jnp.zeros_like(starts))
            else:
                starts = anchors.modes  # each chain starts at its own mode, its anchor
        # The first frame and curvature come from the seed's starts; warmup may re-measure them per
        # chain (adapt_windows), and a checkpoint holds the adapted ones.
        shared = whitening(problem, starts, self.curve_key)
        frames = jax.tree_util.tree_map(lambda x: jnp.stack([x] * method.num_chains), shared)
        if anchors is not None:
            frames = frames._replace(anchor=anchors.modes, anchor_grad=anchors.grads)
        self.tune = _Tuning(frames, np.full(method.num_chains, curvature_scale(problem, starts, self.curve_key, shared)),
                            None, method._batch(problem))
        self.plan = method._plan()
        self.state = _initial(method, problem, frames, starts)
        # separate streams for warmup and sampling, whatever their lengths
        self.warm_keys, self.keys = (jax.random.split(k, method.num_chains) for k in jax.random.split(self.run_key))
        self.draws, self.done, self.target, halved = [], 0, method.num_samples, False
        if session.resume_state("chains") is not None:
            self.draws, self.done, self.target, self.tune = method._resumed(session.resume, problem, self.tune)
            halved = restored_halving(session.resume.progress)
            self.state = restore_tree(self.state, session.resume.leaves, "chain state")
        self.devices = _devices.spread_devices(method.num_chains, session.devices)
        self.extension = Extension(method, session, rounds_done=self.target // method.num_samples, halved=halved)
        self.per_round = method.num_chains * method.num_samples * problem.num_params * np.dtype(self.dtype).itemsize
        self.steps = None  # the sampling steps, fixed once warmup is over

    def bars(self) -> tuple:
        return f"{self.method.name} ({self.method.num_chains} chains)", self.plan["warmup_calls"] + self.target

    def begin(self) -> None:
        m, problem = self.method, self.problem
        if self.plan["warmup_calls"] and self.session.resume is None:
            offset = 0
            windows = m._windows(self.plan["warmup_calls"])
            for window, length in enumerate(windows):
                self._warm(length, offset)
                offset += length
                if window < m.adapt_windows:
                    self.state, self.tune = m._adapt(problem, self.tune, self.state,
                                                     jax.random.fold_in(self.curve_key, 1 + window))
                elif m.adapt_windows and window == len(windows) - 1:
                    # settle: while the chains find the posterior curved more where they now stand
                    # than the step was sized for, shrink the step and warm up one window more
                    for extra in range(SETTLE_WINDOWS):
                        frames = self.tune.frames
                        positions = jax.vmap(lambda f, x: f.to_u(x))(frames, self.state[0])
                        now = _curvature_each(problem, positions, jax.random.fold_in(self.curve_key, 100 + extra), frames)
                        if np.max(now) <= SETTLE_TOLERANCE * np.max(self.tune.curvature):
                            break
                        self.tune = self.tune._replace(curvature=np.maximum(self.tune.curvature, now))
                        _progress.extend(self.plan["warmup_calls"] + length * (extra + 1) + m.num_samples)
                        self._warm(length, offset)
                        offset += length
        else:
            _progress.advance(self.plan["warmup_calls"])
        if self.done:
            _progress.advance(self.done)
        self.steps = jnp.asarray(m._steps(problem, self.tune), self.dtype)

    def _warm(self, length: int, offset: int) -> None:
        """One warmup window of ``length`` calls under the current tuning."""
        steps = jnp.asarray(self.method._steps(self.problem, self.tune), self.dtype)
        self.state = _warm(self.method, self.problem, self.tune.frames, self.tune.batch, self.state, self.warm_keys,
                           steps, jnp.asarray(offset), length, devices=self.devices)
        _check_finite(self.method, self.state[0], "warmup", 0)
        _progress.advance(length)

    def count(self) -> int:
        return self.done

    def round_over(self) -> bool:
        return self.done >= self.target

    def advance(self) -> None:
        # full chunks share one compiled program; a shorter last chunk compiles once more, so the
        # chains never step past the draws they store
        count = min(DRAWS_PER_CHUNK, self.target - self.done)
        state, chunk = _sample(self.method, self.problem, self.tune.frames, self.tune.batch, self.state, self.keys,
                               self.steps, jnp.asarray(self.done), count, devices=self.devices)
        _check_finite(self.method, chunk, "sampling", self.done, partial=self.draws, problem=self.problem)
        self.state = state
        self.draws.append(chunk)
        self.done += count
        _progress.advance(count)

    def _state(self) -> ResumeState:
        leaves = [np.asarray(x) for x in jax.tree_util.tree_leaves(jax.device_get(self.state))]
        m = self.method
        stored = (np.concatenate(self.draws, axis=1) if self.draws
                  else np.zeros((m.num_chains, 0, self.problem.num_params), self.dtype))
        progress = {"draws_done": self.done, "draws_target": self.target, **self.extension.progress()}
        return self.session.stamp(ResumeState("chains", progress, leaves, {"draws": stored, **self.tune.arrays()}))

    def _result(self, remeasure: bool = True) -> Posterior:
        # a partial result (a checkpoint mid-run, or the mixing checks between rounds) skips
        # re-measuring curvature and noise at the draws: only a finished run's verdict uses them
        flat = jnp.concatenate([jnp.asarray(d) for d in self.draws], axis=1)
        if flat.shape[1] > self.extension.discarded():  # an interrupted round keeps what it has
            flat = flat[:, self.extension.discarded():]
        return self.method._posterior(self.problem, self.tune, self.plan, self.run_key, flat, self.state,
                                      self.done, self.target, remeasure=remeasure and self.done >= self.target,
                                      run_info={**self.extension.info(), **self.anchor_info})

    def snapshot(self) -> tuple:
        return self._result(), self._state()

    def so_far(self) -> Posterior:
        return self._result(remeasure=False)

    def extended(self) -> None:
        _progress.extend(self.plan["warmup_calls"] + self.target)

    def finish(self) -> Posterior:
        if not self.draws:
            raise Interrupted(f"{self.method.name}: interrupted before the first draw (after warmup)", self._state())
        posterior = self._result()
        return posterior.replace(resume_state=self._state()) if self.done < self.target else posterior


class _Anchors(NamedTuple):
    """The chains' anchors under control variates: modes and full-data gradients there (C, P) in u
    (None when a checkpoint will restore them), and what their MAP runs reported."""

    modes: jax.Array | None
    grads: jax.Array | None
    info: dict


def _restored_anchor_info(progress: dict) -> dict:
    """What a checkpoint records of the anchors' MAP runs, checked (the file is not trusted)."""
    converged, steps = progress.get("anchor_converged"), progress.get("anchor_steps")
    if not isinstance(converged, bool) or isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ResumeError(
            f"the checkpoint's record of the control variates' anchors (anchor_converged={converged!r}, "
            f"anchor_steps={steps!r}) is not a true/false and a step count; start afresh without resume"
        )
    return {"anchor_converged": converged, "anchor_steps": steps}


def _check_finite(method, values, phase, done, partial=None, problem=None):
    bad = ~np.all(np.isfinite(np.asarray(values)), axis=-1)
    if np.any(bad):
        chain = int(np.flatnonzero(bad.reshape(bad.shape[0], -1).any(axis=1))[0])
        error = NonFiniteError(
            f"{method.name}: chain {chain} became non-finite during {phase} (after {done} draws) — the step size is "
            "too large for this posterior; lower step_size (or leave it None for the automatic choice)",
            step=done, last_finite_params=None,
        )
        error.partial = None
        if partial and problem is not None:
            error.partial = Posterior(
                method=method.name, kind=method.kind, declared_by=type(method), problem=problem,
                flat_draws=jnp.concatenate(partial, axis=1),
                status=RunStatus(interrupted=True, failed=str(error), steps_done=done),
            )
        raise error


@partial(jax.jit, static_argnames=("method",))
def _initial(method, problem, frames, starts):
    """The chains' starting states: z = L⁻¹ u in each chain's frame and the method's extra state,
    compiled once."""
    zs = jax.vmap(lambda f, u: f.to_z(u))(frames, starts)
    return zs, jax.vmap(lambda f, z: method._init_extra(problem, f, z))(frames, zs)


@partial(jax.jit, static_argnames=("method", "batch", "calls", "devices"))
def _warm(method, problem, frames, batch, state, keys, steps, offset, calls: int, devices=None):
    """``calls`` warmup transitions per chain, numbered from ``offset`` (keys and schedules do not
    depend on how warmup is cut into windows)."""
    def chains(state, keys, frames, steps, problem, offset):
        def chain(state, key, white, step):
            def body(i, s):
                return method._warm_transition(problem, white, batch, s, jax.random.fold_in(key, offset + i), step,
                                               offset + i)

            return jax.lax.fori_loop(0, calls, body, state)

        return jax.vmap(chain)(state, keys, frames, steps)

    return _devices.spread(chains, devices, (state, keys, frames, steps), (problem, offset))


@partial(jax.jit, static_argnames=("method", "batch", "count", "devices"))
def _sample(method, problem, frames, batch, state, keys, steps, offset, count: int, devices=None):
    """``count`` draws per chain, returned in u (each chain runs in z of its own frame), the
    chains split evenly over ``devices``."""
    def chains(state, keys, frames, steps, problem, offset):
        def chain(state, key, white, step):
            def body(s, d):
                s = method._draw(problem, white, batch, s, jax.random.fold_in(key, offset + d), step, offset + d)
                return s, white.to_u(s[0])

            return jax.lax.scan(body, state, jnp.arange(count))

        return jax.vmap(chain)(state, keys, frames, steps)

    return _devices.spread(chains, devices, (state, keys, frames, steps), (problem, offset))


@dataclass(frozen=True)
class SGLD(_SGMCMC):
    """Stochastic gradient Langevin dynamics (Welling & Teh 2011): u ← u + ε ∇log p̃_B(u) + √(2ε) ξ,
    ``thinning`` steps per stored draw, after ``num_warmup`` steps."""

    name: ClassVar[str] = "sgld"
    step_bias: ClassVar[str] = "ε λ"
    description: ClassVar[str] = "stochastic gradient Langevin dynamics on minibatches (BlackJAX kernel), several chains"

    # 50 steps per stored draw, as sghmc: at a step stable where the posterior is sharpest the chains
    # diffuse, a draw a few steps on is nearly the same draw, and every stored draw costs a function
    # evaluation in the checks. On the main job's BNN 5 steps per draw stopped at function-space
    # R-hat 1.79 (bulk ESS 6); 50 pass (R-hat 1.006, ESS 790, within total variation 0.001 of NUTS).
    thinning: int = 50

    def _transition(self, problem, white, batch, state, key, step, index):
        z, extra = state
        rows_key, noise_key = jax.random.split(key)
        kernel = blackjax.sgmcmc.sgld.build_kernel()
        return kernel(noise_key, z, _gradient(problem, white, step), _rows(problem, rows_key, batch), step), extra

    def _draw(self, problem, white, batch, state, key, step, index):
        def body(i, s):
            return self._transition(problem, white, batch, s, jax.random.fold_in(key, i), step, i)

        return jax.lax.fori_loop(0, self.thinning, body, state, unroll=UNROLL)


@dataclass(frozen=True)
class SGHMC(_SGMCMC):
    """Stochastic gradient HMC (Chen, Fox & Guestrin 2014): position and momentum follow the
    underdamped Langevin diffusion with friction ``friction`` (per unit time, in the whitened
    coordinates), and a draw is stored every ``thinning`` steps. Each step is BAOAB (Leimkuhler &
    Matthews 2013): half a kick by the minibatch gradient, half a drift, the friction and noise by
    the exact solution of their Ornstein–Uhlenbeck process, p ← e^(−α ε) p + √(1 − e^(−2 α ε)) ξ,
    half a drift and half a kick, one gradient per step. On a Gaussian its positions have exactly
    the posterior's variance at any stable step (measured 1.00 at ε √λ = 0.25 and ε α = 0.5, where
    the first-order drift, kick, friction order gives 1.34). The momentum is part of each chain's
    state and is never drawn afresh.

    The default friction, 2, damps critically the directions of unit curvature, the ones the
    whitening makes the posterior's widest and slowest: chains then travel about one posterior
    sd before their momentum forgets its direction, instead of diffusing. The default ``thinning``
    is 50 steps per stored draw (at the BNN's automatic step, about a third of a unit of time).

    This is not BlackJAX's SGHMC kernel, whose two choices each heat the chains at the automatic
    step (ε √λ = 0.25, measured on the conjugate linear fixture): its Euler step kicks the momentum
    with the gradient from *before* the position moved, which gains energy ε²λ per step against the
    friction's (stationary variance 2.5 times the posterior's at ε α = 0.1), and its kernel draws
    the momentum afresh for every stored draw, which inflates the variance by about L/(L − 1) for
    trajectories of L steps whatever the step (1.25–1.32 at L = 5). On the main job's BNN the
    previous defaults (friction 0.1/ε, 5 steps per draw, BlackJAX's kernel) gave function-space
    R-hat 2.2; these pass R-hat and ESS in one round, within total variation 0.001 of NUTS."""

    name: ClassVar[str] = "sghmc"
    step_bias: ClassVar[str] = "ε √λ"
    description: ClassVar[str] = "stochastic gradient Hamiltonian Monte Carlo with friction on minibatches, several chains"

    thinning: int = 50
    friction: float = 2.0

    def __post_init__(self):
        super().__post_init__()
        check_positive(self.name, "friction", self.friction)

    def _auto_step(self, curvature: float, noise: float) -> float:
        # the position moves by ε·p per step, with p of unit scale: ε √λ is the symplectic Euler
        # step's stability number (below 2); 0.25 keeps its error small
        stable = SGHMC_STEP_FACTOR / math.sqrt(curvature * (1.0 + noise))
        # and small enough that the gradient noise inflates the variance by at most 1 + NOISE_SHARE
        # (see _inflation: about 1 + ε v / (2 α))
        faithful = float("inf") if noise <= 0 else 2.0 * self.friction * NOISE_SHARE / (curvature * noise)
        return min(stable, faithful)

    def _inflation(self, step, curvature, noise):
        # The gradient noise's share only (the temperature measured at the draws covers the rest):
        # per step it adds ε² v to the momentum's variance against the 1 − e^(−2 α ε) that the
        # friction removes, v = noise · λ.
        removed = -math.expm1(-2.0 * self.friction * step)
        return 1.0 + step * step * noise * curvature / removed

    def _init_extra(self, problem, white, z):
        return jnp.zeros_like(z)  # the momentum: warmup brings it to its stationary law

    def _draw(self, problem, white, batch, state, key, step, index):
        damping = jnp.exp(-self.friction * step)
        spread = jnp.sqrt(-jnp.expm1(-2.0 * self.friction * step))
        gradient = _gradient(problem, white, step)
        z, momentum = state
        half = 0.5 * step

        def body(i, carry):
            # BAOAB: half kick, half drift, friction and noise, half drift, half kick; the closing
            # kick's gradient opens the next step
            z, momentum, grad = carry
            rows_key, noise_key = jax.random.split(jax.random.fold_in(key, i + 1))
            z = z + half * (momentum + half * grad)
            momentum = damping * (momentum + half * grad) + spread * jax.random.normal(noise_key, z.shape, z.dtype)
            z = z + half * momentum
            grad = gradient(z, _rows(problem, rows_key, batch))
            return z, momentum + half * grad, grad

        opening = gradient(z, _rows(problem, jax.random.fold_in(key, 0), batch))
        z, momentum, _ = jax.lax.fori_loop(0, self.thinning, body, (z, momentum, opening))
        return z, momentum

    def _transition(self, problem, white, batch, state, key, step, index):
        return self._draw(problem, white, batch, state, key, step, index)

    def _plan(self) -> dict:
        return {"warmup_calls": -(-self.num_warmup // self.thinning)}


@dataclass(frozen=True)
class CyclicalSGLD(_SGMCMC):
    """Cyclical SGLD (Zhang, Li, Zhang, Chen & Wilson 2020): cycles of a cosine step size from ε₀
    down to 0; draws are stored every ``thinning`` steps of each cycle's last ``1 − exploration``
    (the small-step end), ``num_samples / num_cycles`` of them per cycle. In the first
    ``exploration`` fraction the chain moves at the large steps with its Langevin noise
    (``exploration_noise=True``, the default) or without it (``False``: descent towards a mode, the
    paper's Algorithm 1). ``num_cycles=None`` gives each cycle ``DRAWS_PER_CYCLE`` draws (the
    largest divisor of ``num_samples`` up to it). The ``num_warmup`` steps before the cycles are
    plain SGLD steps at the sampling stage's first step, in which each chain's frame, step and
    batch are measured as for ``sgld``."""

    name: ClassVar[str] = "cyclical_sgld"
    description: ClassVar[str] = "cyclical SGLD: cosine cyclical step size, sampling at the small-step end of each cycle"

    num_cycles: int | None = None
    exploration: float = 0.8
    exploration_noise: bool = True

    def __post_init__(self):
        super().__post_init__()
        if self.num_cycles is not None:
            check_positive_int(self.name, "num_cycles", self.num_cycles)
            if self.num_samples % self.num_cycles:
                raise OptionError(
                    f"{self.name}: num_samples={self.num_samples} must be a multiple of num_cycles={self.num_cycles} "
                    "(the same number of draws from each cycle); or leave num_cycles=None "
                    f"({DRAWS_PER_CYCLE} draws a cycle)"
                )
        if not 0.0 <= self.exploration < 1.0:
            raise OptionError(f"{self.name}: exploration must lie in [0, 1), got {self.exploration!r}")

    @classmethod
    def remedy(cls, posterior, topic):
        if topic == "cold":
            if not (posterior.options or {}).get("exploration_noise", True):
                return ("set exploration_noise=True: each cycle's noise-free stage pulls the chain to a mode, and its short "
                        "sampling stage does not spread out again")
            return "lower exploration (a longer sampling stage in each cycle), or raise num_warmup"
        return super().remedy(posterior, topic)

    def _resolved(self, steps) -> dict:
        found = super()._resolved(steps)
        if self.num_cycles is None:
            found["num_cycles"] = self.num_samples // self._draws_per_cycle()
        return found

    def _draws_per_cycle(self) -> int:
        if self.num_cycles is not None:
            return self.num_samples // self.num_cycles
        return max(d for d in range(1, DRAWS_PER_CYCLE + 1) if self.num_samples % d == 0)

    def _geometry(self) -> tuple:
        """(steps per cycle, exploration steps per cycle)."""
        sampling = self._draws_per_cycle() * self.thinning
        length = int(math.ceil(sampling / (1.0 - self.exploration)))
        return length, length - sampling

    def _auto_step(self, curvature: float, noise: float) -> float:
        # ε₀ such that the step at the start of the sampling stage is the SGLD default, but at most
        # 1/(λ(1 + r)): a step at the top of a cycle diverges beyond ε λ = 2 (with or without the
        # noise), and the stored draws would start from a stationary spread inflated beyond 2×
        length, explore = self._geometry()
        return min(super()._auto_step(curvature, noise) / self._shape(explore, length),
                   EXPLORATION_CAP / (curvature * (1.0 + noise)))

    @staticmethod
    def _shape(position, length):
        return 0.5 * (1.0 + math.cos(math.pi * position / length))

    def _plan(self) -> dict:
        length, explore = self._geometry()
        return {"warmup_calls": self.num_warmup, "sampling_step": lambda step0: step0 * self._shape(explore, length)}

    def _warm_transition(self, problem, white, batch, state, key, step0, index):
        z, extra = state
        length, explore = self._geometry()
        kernel = blackjax.sgmcmc.sgld.build_kernel()
        rows_key, noise_key = jax.random.split(key)
        step = step0 * self._shape(explore, length)
        return kernel(noise_key, z, _gradient(problem, white, step), _rows(problem, rows_key, batch), step), extra

    def _at(self, step0, k):
        length, _ = self._geometry()
        return step0 * 0.5 * (1.0 + jnp.cos(jnp.pi * (k % length) / length))

    def _transition(self, problem, white, batch, state, key, step0, k):
        z, extra = state
        length, explore = self._geometry()
        rows_key, noise_key = jax.random.split(key)
        kernel = blackjax.sgmcmc.sgld.build_kernel()
        noise_on = jnp.logical_or(self.exploration_noise, (k % length) >= explore)
        temperature = jnp.where(noise_on, 1.0, 0.0).astype(z.dtype)  # switches the injected noise only
        step = self._at(step0, k)
        return kernel(noise_key, z, _gradient(problem, white, jnp.maximum(step, jnp.finfo(z.dtype).tiny)),
                      _rows(problem, rows_key, batch), step, temperature), extra

    def _draw(self, problem, white, batch, state, key, step0, index):
        # draw d of the run: cycle c = d // per_cycle, position j = d % per_cycle in its sampling stage
        length, explore = self._geometry()
        per_cycle = self._draws_per_cycle()
        cycle, j = index // per_cycle, index % per_cycle
        first = cycle * length + explore + j * self.thinning  # the global step index of this draw's first step

        explore_key, key = jax.random.split(key)

        def explore_body(i, s):
            return self._transition(problem, white, batch, s, jax.random.fold_in(explore_key, i), step0, cycle * length + i)

        # at a cycle's first draw, run its exploration stage first
        state = jax.lax.cond(j == 0, lambda s: jax.lax.fori_loop(0, explore, explore_body, s), lambda s: s, state)

        def body(i, s):
            return self._transition(problem, white, batch, s, jax.random.fold_in(key, i), step0, first + i)

        return jax.lax.fori_loop(0, self.thinning, body, state)
