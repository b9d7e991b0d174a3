"""Stochastic-gradient MCMC on minibatches: ``sgld``, ``sghmc`` and ``cyclical_sgld``.

The transition kernels are BlackJAX's (``blackjax.sgmcmc``). They are fed the gradient of the
Problem's log density on a minibatch, which is already scaled by N/B and already tempered, so
BlackJAX's own data-size estimator and ``temperature`` are not used (they would count N/B and T a
second time); BlackJAX's temperature argument only switches the injected noise off during the
exploration stage of ``cyclical_sgld``. Chains run vmapped, in compiled chunks of draws with a
Ctrl-C check between chunks.

Preconditioning and step sizes. Each chain runs in whitened coordinates z, with u = L z fixed for
the run (a linear change of variables leaves the target intact): L Lᵀ = H⁻¹ for H the curvature
of −log p̃ averaged over the chains' starting points. For ``ppl.models`` H is the tempered GGN
plus the prior's precision (positive definite); for plain programs the exact Hessian, its
eigenvalues floored. With at most ``DENSE_LIMIT`` parameters L is dense (correlations are
whitened too); beyond that, diagonal. The step ε, when not given, then comes from λ, the largest
eigenvalue of Lᵀ H L at the starts (power iteration on Hessian-vector products; near 1 when the
curvature changes little), and r = (N/B)(1 − B/N), the minibatch gradient noise relative to the
curvature when the per-datum gradients' spread matches the Fisher information (true near the
mode of a well-specified model). For SGLD the stationary variance along a direction of whitened
curvature λ is then inflated by about (1 + ελr/2)/(1 − ελ/2) (Mandt, Hoffman & Blei 2017;
Vollmer, Zygalakis & Teh 2016); the default ε = 0.1/(λ(1 + r)) keeps that below about 1.1 (5% in
standard deviation). ``info`` records λ, r, ε and that predicted inflation, and the diagnostics
fail a run whose predicted inflation exceeds 1.25. A ``step_size`` given by the user is ε, in the
whitened units.
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

from ppl import _interrupt, _progress
from ppl._checkpoint import Interrupted, ResumeState, Session, restore_tree
from ppl._data import check_batch_size
from ppl._errors import NonFiniteError, OptionError, ResumeError
from ppl._posterior import Posterior
from ppl._records import ChainStats, RunStatus
from ppl.inference import _devices
from ppl.inference._base import Method, check_choice, check_positive, check_positive_int
from ppl.inference._curvature import largest_eigenvalue
from ppl.inference.optimize import INITS, minibatch_indices

__all__ = ["SGLD", "SGHMC", "CyclicalSGLD", "Whitening", "whitening", "curvature_scale"]

DEFAULT_BATCH = 64
POWER_ITERATIONS = 30
DRAWS_PER_CHUNK = 100  # draws per compiled call; Ctrl-C is honoured between calls
STEP_FACTOR = 0.1  # ε λ (1 + r) for the automatic Langevin step size
SGHMC_STEP_FACTOR = 0.25  # ε √(λ (1 + r)) for the automatic SGHMC step size


class Whitening(NamedTuple):
    """u = L z; ``inverse`` maps back (dense matrices, or vectors for a diagonal L)."""

    L: jax.Array
    inverse: jax.Array

    def to_u(self, z):
        return self.L @ z if self.L.ndim == 2 else self.L * z

    def to_z(self, u):
        return self.inverse @ u if self.inverse.ndim == 2 else self.inverse * u

    def pull(self, g):
        """A gradient in u as one in z: Lᵀ g."""
        return self.L.T @ g if self.L.ndim == 2 else self.L * g


DENSE_LIMIT = 1000  # parameters up to which the whitening is dense


@partial(jax.jit, static_argnames=("dense",))
def _curvature_at(problem, u, key, dense: bool):
    """H at u: (P, P) when ``dense``, else its diagonal (see the module docstring)."""
    from ppl.inference import _curvature as curvature

    if problem.is_declarative:
        prior_weight, lik_weight = problem.weights(None)
        rows = curvature.chunk_rows(problem.model.output_dim(), problem.num_params)
        prior = prior_weight * curvature.prior_precision_diagonal(problem, u)
        ggn = curvature.ggn(problem, u, None, "full" if dense else "diag", rows).astype(u.dtype)
        return lik_weight * ggn + (jnp.diag(prior) if dense else prior)
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
    if dense:
        values, vectors = jnp.linalg.eigh(0.5 * (H + H.T))
        values = jnp.maximum(values, 1e-6 * jnp.max(jnp.abs(values)))
        root = jnp.sqrt(values)[None, :]
        return Whitening(vectors / root, (vectors * root).T)
    h = jnp.maximum(H, 1e-6 * jnp.max(H))
    return Whitening(1.0 / jnp.sqrt(h), jnp.sqrt(h))


@partial(jax.jit, static_argnames=("iterations",))
def _top_curvature(problem, u, key, white, iterations: int = POWER_ITERATIONS):
    """|largest eigenvalue| of Lᵀ (−∇² log p̃) L at u (full batch), by power iteration on HVPs."""
    grad = jax.grad(problem.logdensity_fn)

    def hvp(v):
        return -white.pull(jax.jvp(grad, (u,), (white.to_u(v),))[1])

    return largest_eigenvalue(hvp, key, u, iterations)


def curvature_scale(problem, starts, key, white) -> float:
    """λ: the largest whitened curvature over the chains' starting points."""
    values = [float(_top_curvature(problem, u, jax.random.fold_in(key, c), white)) for c, u in enumerate(starts)]
    return max(values)


def _gradient(problem, white):
    """The gradient in z of the Problem's (scaled, tempered) log density on a minibatch of rows."""
    def estimate(z, rows):
        grad = jax.grad(problem.logdensity_fn)(white.to_u(z), None if rows is None else problem.batch(rows))
        return white.pull(grad)

    return estimate


SCATTER_PROBES = 32  # minibatch gradients behind the measured gradient scatter


@partial(jax.jit, static_argnames=("batch",))
def _gradient_scatter(problem, white, batch, u, key):
    """The largest variance, over whitened directions, of the minibatch gradient estimate at u
    (from ``SCATTER_PROBES`` minibatches; the top eigenvalue of their covariance, via the small
    Gram matrix of the centred estimates)."""
    z = white.to_z(u)
    grad = _gradient(problem, white)
    keys = jax.random.split(key, SCATTER_PROBES)
    estimates = jax.vmap(lambda k: grad(z, _rows(problem, k, batch)))(keys)
    centred = estimates - jnp.mean(estimates, axis=0, keepdims=True)
    gram = centred @ centred.T / (SCATTER_PROBES - 1)
    return jnp.max(jnp.linalg.eigvalsh(gram))


def _rows(problem, key, batch_size):
    if batch_size is None:
        return None
    return minibatch_indices(key, problem.num_data, batch_size)


@dataclass(frozen=True)
class _WhitenedChains(Method):
    """Chains in whitened coordinates, vmapped, in compiled chunks of draws: the runner shared by
    the SG-MCMC methods and ``mh``. A subclass defines its step rule, its per-chain extra state,
    ``_transition`` (one warmup step) and ``_draw`` (the steps behind one stored draw)."""

    kind: ClassVar[str] = "chains"

    num_warmup: int = 1000
    num_samples: int = 1000
    num_chains: int = 4
    thinning: int = 5
    init: str = "uniform"

    def __post_init__(self):
        super().__post_init__()
        check_positive_int(self.name, "num_warmup", self.num_warmup, allow_zero=True)
        for option in ("num_samples", "num_chains", "thinning"):
            check_positive_int(self.name, option, getattr(self, option))
        check_choice(self.name, "init", self.init, INITS)

    def stored_draws(self) -> int:
        return self.num_chains * self.num_samples

    def _batch(self, problem):
        return None  # full batch

    def _step(self, curvature: float, noise: float) -> float:
        raise NotImplementedError

    def _inflation(self, step: float, curvature: float, noise: float) -> float | None:
        return None

    def _init_extra(self, problem, white, z):
        return ()

    def _record(self, chain_stats: ChainStats, state, draws_done: int) -> tuple[ChainStats, dict]:
        """The chain statistics and ``info`` entries completed from the final state, after
        ``draws_done`` stored draws."""
        return chain_stats, {}

    def run(self, key, problem, session: Session | None = None) -> Posterior:
        self.check(problem)
        session = session or Session()
        start_key, curve_key, run_key = jax.random.split(key, 3)
        dtype = problem.init_params.dtype
        starts = jnp.stack([problem.init_position(jax.random.fold_in(start_key, c), self.init) for c in range(self.num_chains)])
        batch = self._batch(problem)
        noise = 0.0 if batch is None else (problem.num_data / batch) * (1.0 - batch / problem.num_data)
        # the frame, the curvature and the step come from the seed's starts: a resumed run recomputes
        # them exactly, and the checkpoint holds only the chains' state and their draws
        white = whitening(problem, starts, curve_key)
        curvature = curvature_scale(problem, starts, curve_key, white)
        step = self._step(curvature, noise)
        plan = self._plan()
        steps = jnp.asarray(step, dtype)
        state = _initial(self, problem, white, starts)
        # separate streams for warmup and sampling, whatever their lengths
        warm_keys, keys = (jax.random.split(k, self.num_chains) for k in jax.random.split(run_key))
        draws, done = self._resumed(session, problem, state)
        if session.resume is not None:
            state = restore_tree(state, session.resume.leaves, "chain state")
        session.start_count(done)

        def state_now():
            leaves = [np.asarray(x) for x in jax.tree_util.tree_leaves(jax.device_get(state))]
            stored = np.concatenate(draws, axis=1) if draws else np.zeros((self.num_chains, 0, problem.num_params), dtype)
            return session.stamp(ResumeState("chains", {"draws_done": done}, leaves, {"draws": stored}))

        def result_now():
            flat = jnp.concatenate([jnp.asarray(d) for d in draws], axis=1)
            return self._posterior(problem, white, batch, curvature, noise, step, plan, run_key, flat, state, done)

        label = f"{self.name} ({self.num_chains} chains)"
        devices = _devices.spread_devices(self.num_chains)
        with _progress.task(label, plan["warmup_calls"] + self.num_samples), _interrupt.guard():
            if plan["warmup_calls"] and session.resume is None:
                state = _warm(self, problem, white, batch, state, warm_keys, steps, plan["warmup_calls"], devices=devices)
                _check_finite(self, state[0], "warmup", 0)
            _progress.advance(plan["warmup_calls"] + done)
            while done < self.num_samples and not _interrupt.requested():
                # full chunks share one compiled program; a shorter last chunk compiles once more, so
                # the chains never step past the draws they store
                count = min(DRAWS_PER_CHUNK, self.num_samples - done)
                state, chunk = _sample(self, problem, white, batch, state, keys, steps, jnp.asarray(done), count,
                                       devices=devices)
                _check_finite(self, chunk, "sampling", done, partial=draws, problem=problem)
                draws.append(chunk)
                done += count
                _progress.advance(count)
                session.maybe_checkpoint(done, lambda: (result_now(), state_now()))
        if not draws:
            raise Interrupted(f"{self.name}: interrupted before the first draw (after warmup)", state_now())
        posterior = result_now()
        if done < self.num_samples:
            posterior.resume_state = state_now()
        return posterior

    def _resumed(self, session, problem, state) -> tuple:
        """(stored draws, draws done) of the state to resume from, checked against this run."""
        resume = session.resume_state("chains")
        if resume is None:
            return [], 0
        done = resume.progress.get("draws_done")
        stored = np.asarray(resume.arrays.get("draws", np.zeros(0)))
        expected = (self.num_chains, done, problem.num_params)
        if not (isinstance(done, int) and 0 <= done <= self.num_samples) or stored.shape != expected:
            raise ResumeError(
                f"the checkpoint's progress ({done!r} draws, stored draws of shape {list(stored.shape)}) does not fit "
                f"a run of {self.num_chains} chains × {self.num_samples} draws; resume with the options that wrote it, "
                "or start afresh"
            )
        return ([stored.astype(problem.init_params.dtype)] if done else []), done

    def _posterior(self, problem, white, batch, curvature, noise, step, plan, run_key, flat, state, done) -> Posterior:
        info = {"curvature": curvature, "gradient_noise": noise, "batch_size": batch}
        sampling_step = step if plan.get("sampling_step") is None else plan["sampling_step"](step)
        inflation = self._inflation(sampling_step, curvature, noise)
        if inflation is not None and batch is not None:
            # The prediction assumes the minibatch gradients scatter like the Fisher information; an
            # outlier or a misspecified model makes them scatter far more. Measure their scatter at the
            # draws' mean and take the worse of the two.
            measured = float(_gradient_scatter(problem, white, batch, jnp.mean(flat.reshape(-1, flat.shape[-1]), axis=0),
                                               jax.random.fold_in(run_key, 7)))
            info["gradient_scatter"] = measured
            inflation = max(inflation, self._inflation(sampling_step, curvature, measured / max(curvature, 1e-300)))
        chain_stats = ChainStats(step_size=np.full(self.num_chains, step), variance_inflation=inflation)
        chain_stats, extra = self._record(chain_stats, state, done)
        info.update(extra)
        return Posterior(
            method=self.name, kind=self.kind, problem=problem, flat_draws=flat,
            status=RunStatus(interrupted=done < self.num_samples, steps_done=done), chain_stats=chain_stats, info=info,
        )

    def _plan(self) -> dict:
        return {"warmup_calls": self.num_warmup}


@dataclass(frozen=True)
class _SGMCMC(_WhitenedChains):
    """Minibatch gradient chains: a step size (whitened units, None chooses it) and a batch size."""

    step_size: float | None = None
    batch_size: int | None = None

    def __post_init__(self):
        super().__post_init__()
        if self.step_size is not None:
            check_positive(self.name, "step_size", self.step_size)
        if self.batch_size is not None:
            check_positive_int(self.name, "batch_size", self.batch_size)

    def check(self, problem) -> None:
        check_batch_size(self.batch_size, problem.num_data)

    def _batch(self, problem):
        if not problem.is_declarative:
            return None
        return self.batch_size if self.batch_size is not None else min(DEFAULT_BATCH, problem.num_data)

    def _step(self, curvature: float, noise: float) -> float:
        return float(self.step_size) if self.step_size is not None else self._auto_step(curvature, noise)

    def _auto_step(self, curvature: float, noise: float) -> float:
        return STEP_FACTOR / (curvature * (1.0 + noise))

    def _inflation(self, step: float, curvature: float, noise: float) -> float | None:
        """Predicted worst-case variance inflation of a Langevin step ``step`` (see the module)."""
        half = step * curvature / 2.0
        return (1.0 + half * noise) / (1.0 - half) if half < 1.0 else float("inf")


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
                method=method.name, kind=method.kind, problem=problem, flat_draws=jnp.concatenate(partial, axis=1),
                status=RunStatus(interrupted=True, failed=str(error), steps_done=done),
            )
        raise error


@partial(jax.jit, static_argnames=("method",))
def _initial(method, problem, white, starts):
    """The chains' starting states: z = L⁻¹ u and the method's extra state, compiled once."""
    zs = jax.vmap(white.to_z)(starts)
    return zs, jax.vmap(lambda z: method._init_extra(problem, white, z))(zs)


@partial(jax.jit, static_argnames=("method", "batch", "calls", "devices"))
def _warm(method, problem, white, batch, state, keys, step, calls: int, devices=None):
    def chains(state, keys, problem, white, step):
        def chain(state, key):
            def body(i, s):
                return method._transition(problem, white, batch, s, jax.random.fold_in(key, i), step, i)

            return jax.lax.fori_loop(0, calls, body, state)

        return jax.vmap(chain)(state, keys)

    return _devices.spread(chains, devices, (state, keys), (problem, white, step))


@partial(jax.jit, static_argnames=("method", "batch", "count", "devices"))
def _sample(method, problem, white, batch, state, keys, step, offset, count: int, devices=None):
    """``count`` draws per chain, returned in u (the chains run in z), the chains split evenly
    over ``devices``."""
    def chains(state, keys, problem, white, step, offset):
        def chain(state, key):
            def body(s, d):
                s = method._draw(problem, white, batch, s, jax.random.fold_in(key, offset + d), step, offset + d)
                return s, white.to_u(s[0])

            return jax.lax.scan(body, state, jnp.arange(count))

        return jax.vmap(chain)(state, keys)

    return _devices.spread(chains, devices, (state, keys), (problem, white, step, offset))


@dataclass(frozen=True)
class SGLD(_SGMCMC):
    """Stochastic gradient Langevin dynamics (Welling & Teh 2011): u ← u + ε ∇log p̃_B(u) + √(2ε) ξ,
    ``thinning`` steps per stored draw, after ``num_warmup`` steps."""

    name: ClassVar[str] = "sgld"
    description: ClassVar[str] = "stochastic gradient Langevin dynamics on minibatches (BlackJAX kernel), several chains"

    def _transition(self, problem, white, batch, state, key, step, index):
        z, extra = state
        rows_key, noise_key = jax.random.split(key)
        kernel = blackjax.sgmcmc.sgld.build_kernel()
        return kernel(noise_key, z, _gradient(problem, white), _rows(problem, rows_key, batch), step), extra

    def _draw(self, problem, white, batch, state, key, step, index):
        def body(i, s):
            return self._transition(problem, white, batch, s, jax.random.fold_in(key, i), step, i)

        return jax.lax.fori_loop(0, self.thinning, body, state)


@dataclass(frozen=True)
class SGHMC(_SGMCMC):
    """Stochastic gradient HMC (Chen, Fox & Guestrin 2014) with BlackJAX's kernel: each stored
    draw is one trajectory of ``thinning`` steps with fresh momentum and friction ``friction``
    (per unit time; the default makes ε·friction = 0.1)."""

    name: ClassVar[str] = "sghmc"
    description: ClassVar[str] = "stochastic gradient Hamiltonian Monte Carlo with friction on minibatches (BlackJAX kernel)"

    friction: float | None = None

    def __post_init__(self):
        super().__post_init__()
        if self.friction is not None:
            check_positive(self.name, "friction", self.friction)

    def _auto_step(self, curvature: float, noise: float) -> float:
        # the position moves by ε·p per step, with p of unit scale: ε √λ is the leapfrog-like stability
        # number; 0.25 keeps the Euler scheme's error small while a trajectory of 5 steps moves ~1.25 sd
        return SGHMC_STEP_FACTOR / math.sqrt(curvature * (1.0 + noise))

    def _inflation(self, step, curvature, noise):
        # The gradient noise's share only (no closed form for the Euler scheme's own error here): per
        # step it adds ε² v to the momentum's variance against the 2 α ε injected, v = noise · λ.
        alpha_step = 0.1 if self.friction is None else self.friction * step
        return 1.0 + step * step * noise * curvature / (2.0 * alpha_step)


    def _draw(self, problem, white, batch, state, key, step, index):
        z, extra = state
        alpha = (0.1 / step) if self.friction is None else jnp.asarray(self.friction, step.dtype)
        kernel = blackjax.sgmcmc.sghmc.build_kernel(alpha=alpha)
        rows = _rows(problem, jax.random.fold_in(key, 1), batch)
        return kernel(key, z, _gradient(problem, white), rows, step, self.thinning), extra

    def _transition(self, problem, white, batch, state, key, step, index):
        return self._draw(problem, white, batch, state, key, step, index)

    def _plan(self) -> dict:
        return {"warmup_calls": -(-self.num_warmup // self.thinning)}


@dataclass(frozen=True)
class CyclicalSGLD(_SGMCMC):
    """Cyclical SGLD (Zhang, Li, Zhang, Chen & Wilson 2020): ``num_cycles`` cycles of a cosine step
    size from ε₀ down to 0; the first ``exploration`` fraction of each cycle moves without noise
    (optimisation towards a mode), the rest samples, and draws are stored every ``thinning`` steps
    of each sampling stage (the small-step end of the cycle). ``num_warmup`` is not used: the
    cycles are the schedule."""

    name: ClassVar[str] = "cyclical_sgld"
    description: ClassVar[str] = "cyclical SGLD: cosine cyclical step size, sampling at the small-step end of each cycle"

    num_cycles: int = 4
    exploration: float = 0.8
    num_warmup: int = 0

    def __post_init__(self):
        super().__post_init__()
        check_positive_int(self.name, "num_cycles", self.num_cycles)
        if not 0.0 <= self.exploration < 1.0:
            raise OptionError(f"{self.name}: exploration must lie in [0, 1), got {self.exploration!r}")
        if self.num_samples % self.num_cycles:
            raise OptionError(
                f"{self.name}: num_samples={self.num_samples} must be a multiple of num_cycles={self.num_cycles} "
                "(the same number of draws from each cycle)"
            )

    def _geometry(self) -> tuple:
        """(steps per cycle, exploration steps per cycle)."""
        per_cycle_draws = self.num_samples // self.num_cycles
        sampling = per_cycle_draws * self.thinning
        length = int(math.ceil(sampling / (1.0 - self.exploration)))
        return length, length - sampling

    def _auto_step(self, curvature: float, noise: float) -> float:
        # ε₀ such that the step at the start of the sampling stage is the SGLD default
        length, explore = self._geometry()
        return super()._auto_step(curvature, noise) / self._shape(explore, length)

    @staticmethod
    def _shape(position, length):
        return 0.5 * (1.0 + math.cos(math.pi * position / length))

    def _plan(self) -> dict:
        length, explore = self._geometry()
        return {"warmup_calls": 0, "sampling_step": lambda step0: step0 * self._shape(explore, length)}

    def _at(self, step0, k):
        length, _ = self._geometry()
        return step0 * 0.5 * (1.0 + jnp.cos(jnp.pi * (k % length) / length))

    def _transition(self, problem, white, batch, state, key, step0, k):
        z, extra = state
        length, explore = self._geometry()
        rows_key, noise_key = jax.random.split(key)
        kernel = blackjax.sgmcmc.sgld.build_kernel()
        noise_on = (k % length) >= explore
        temperature = jnp.where(noise_on, 1.0, 0.0).astype(z.dtype)  # switches the injected noise only
        return kernel(noise_key, z, _gradient(problem, white), _rows(problem, rows_key, batch), self._at(step0, k),
                      temperature), extra

    def _draw(self, problem, white, batch, state, key, step0, index):
        # draw d of the run: cycle c = d // per_cycle, position j = d % per_cycle in its sampling stage
        length, explore = self._geometry()
        per_cycle = self.num_samples // self.num_cycles
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
