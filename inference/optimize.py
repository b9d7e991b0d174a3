"""Gradient-based optimisation shared by ``map`` and ``svi`` (and later SWAG and ensembles), and ``map``.

:func:`minimize` runs an objective in chunks of steps. Each chunk is one jitted ``lax.scan``;
between chunks the host checks for non-finite losses/parameters (stopping at the first bad chunk
with the last finite parameters kept) and advances the progress bar. Per-step keys are
``fold_in(key, step)``, so results do not depend on the chunking.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ppl import _progress
from ppl._data import check_batch_size
from ppl._errors import NonFiniteError, OptionError
from ppl._posterior import Posterior
from ppl.inference._base import Method, check_choice, check_positive, check_positive_int
from ppl.inference._gaussian import PointMass

__all__ = ["MAP", "OptimizerConfig", "minimize", "loss_convergence", "NegativeLogJoint"]

OPTIMIZERS = ("auto", "adam", "lbfgs")
SCHEDULES = ("constant", "cosine")
INITS = ("prior", "uniform", "zeros")
_NUM_CHUNKS = 20


@dataclass(frozen=True)
class OptimizerConfig:
    """Static description of an optimisation run (hashable: it keys the compilation cache)."""

    optimizer: str  # "adam" or "lbfgs"
    steps: int
    schedule: str = "cosine"
    batch_size: int | None = None
    # L-BFGS stops updating once the gradient norm is this small (its line search divides by the
    # curvature pair, which vanishes at an exact optimum).
    grad_tol: float = 1e-9

    def build(self, learning_rate) -> optax.GradientTransformation:
        """The optax transformation; ``learning_rate`` may be a traced array (no recompilation)."""
        if self.optimizer == "lbfgs":
            return optax.lbfgs()
        if self.schedule == "cosine":
            # Decay to 1% of the rate: late iterates average out the gradient noise of MC objectives.
            rate = optax.cosine_decay_schedule(learning_rate, self.steps, alpha=0.01)
        else:
            rate = learning_rate
        return optax.adam(rate)


@dataclass(frozen=True)
class NegativeLogJoint:
    """−log p(θ(u), D) without the Jacobian: minimised at the constrained-space MAP.

    ``params`` is the flat vector, or a delta guide's ``{"loc": u}``.
    """

    def __call__(self, params, problem, key, batch):
        u = params["loc"] if isinstance(params, dict) else params
        return -problem.log_joint(u, batch)


@partial(jax.jit, static_argnames=("config",))
def _init_state(config, params, learning_rate):
    return config.build(learning_rate).init(params)


def _select(flag, new, old):
    return jax.tree_util.tree_map(lambda a, b: jnp.where(flag, a, b), new, old)


@partial(jax.jit, static_argnames=("objective", "config", "num_steps"))
def _run_chunk(objective, config, problem, params, opt_state, key, start, learning_rate, num_steps):
    optimizer = config.build(learning_rate)

    def one_step(carry, step):
        params, opt_state = carry
        step_key = jax.random.fold_in(key, step)
        batch = None
        if config.batch_size is not None:
            index = jax.random.choice(
                jax.random.fold_in(step_key, 1), problem.num_data, (config.batch_size,), replace=False
            )
            batch = problem.batch(index)

        def loss_fn(p):
            return objective(p, problem, step_key, batch)

        if config.optimizer == "lbfgs":
            value, grad = optax.value_and_grad_from_state(loss_fn)(params, state=opt_state)
            updates, new_state = optimizer.update(grad, opt_state, params, value=value, grad=grad, value_fn=loss_fn)
            grad_norm = optax.tree_utils.tree_l2_norm(grad)
            active = (step < config.steps) & (grad_norm > config.grad_tol)
        else:
            value, grad = jax.value_and_grad(loss_fn)(params)
            updates, new_state = optimizer.update(grad, opt_state, params)
            active = step < config.steps
        new_params = optax.apply_updates(params, updates)
        return (_select(active, new_params, params), _select(active, new_state, opt_state)), value

    steps = start + jnp.arange(num_steps)
    (params, opt_state), losses = jax.lax.scan(one_step, (params, opt_state), steps)
    return params, opt_state, losses


def _nonfinite_sites(params, problem) -> list[str]:
    names = []
    leaves = jax.tree_util.tree_leaves_with_path(params)
    for path, leaf in leaves:
        leaf = np.asarray(leaf)
        if np.all(np.isfinite(leaf)):
            continue
        label = jax.tree_util.keystr(path) or "params"
        if leaf.shape and leaf.shape[0] == problem.num_params:
            bad = np.flatnonzero(~np.all(np.isfinite(leaf.reshape(problem.num_params, -1)), axis=1))
            start, sites = 0, []
            for site in problem.sites:
                if np.any((bad >= start) & (bad < start + site.size)):
                    sites.append(site.name)
                start += site.size
            label += f" (sites {', '.join(sites)})"
        names.append(label)
    return names


def minimize(objective, config: OptimizerConfig, problem, params, key, *, learning_rate: float, label: str):
    """Minimise ``objective(params, problem, key, batch)``; returns (params, losses).

    ``losses`` has one entry per step done. Ctrl-C (KeyboardInterrupt) between chunks stops early and
    returns what was reached, so ``len(losses) < config.steps`` marks an interrupted run (see
    :func:`loss_convergence`); an interrupt before the first chunk finishes propagates.
    """
    chunk = max(1, math.ceil(config.steps / _NUM_CHUNKS))
    learning_rate = jnp.asarray(learning_rate, dtype=problem.init_params.dtype)
    opt_state = _init_state(config, params, learning_rate)
    history = []
    with _progress.task(label, config.steps), _interruptible(history):
        for start in range(0, config.steps, chunk):
            new_params, new_state, losses = _run_chunk(
                objective, config, problem, params, opt_state, key, jnp.asarray(start), learning_rate, chunk
            )
            losses = np.asarray(losses)[: min(chunk, config.steps - start)]
            finite_params = all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree_util.tree_leaves(new_params))
            if not np.all(np.isfinite(losses)) or not finite_params:
                bad = np.flatnonzero(~np.isfinite(losses))
                step = start + int(bad[0]) if bad.size else start + len(losses) - 1
                where = _nonfinite_sites(new_params, problem)
                raise NonFiniteError(
                    f"{label}: the loss or the parameters became non-finite at step {step} "
                    f"(non-finite: {', '.join(where) or 'the loss only'}); the last finite parameters "
                    f"(before step {start}) are kept on this error as .last_finite_params — lower "
                    "learning_rate, tighten the prior, or standardise the data",
                    step=step,
                    last_finite_params=params,
                )
            params, opt_state = new_params, new_state
            history.append(losses)
            _progress.advance(len(losses))
    return params, np.concatenate(history)


class _interruptible:
    """Swallow a KeyboardInterrupt once some chunks are done (their results are kept)."""

    def __init__(self, history: list):
        self.history = history

    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        return kind is KeyboardInterrupt and bool(self.history)


def loss_convergence(losses: np.ndarray, planned_steps: int | None = None) -> dict:
    """Compare the mean loss over the last 10% of steps with the 10% before.

    Converged when the change is within two standard errors of the difference (the loss is a
    Monte Carlo estimate, so a flat curve still jitters) or below 1e-4 of the loss's magnitude.
    With ``planned_steps``, also records ``interrupted`` (fewer steps done than planned).
    """
    status = {} if planned_steps is None else {"interrupted": len(losses) < planned_steps, "steps_done": len(losses)}
    window = max(10, len(losses) // 10)
    if len(losses) < 2 * window:
        # Too few steps to judge: None, not a verdict either way.
        return {"converged": None, "loss_change": None, "loss_change_se": None, "final_loss": float(losses[-1]), **status}
    last, before = losses[-window:], losses[-2 * window : -window]
    change = float(last.mean() - before.mean())
    se = float(math.sqrt(last.var() / window + before.var() / window))
    converged = abs(change) <= 2.0 * se or abs(change) <= 1e-4 * max(1.0, abs(float(last.mean())))
    return {
        "converged": bool(converged),
        "loss_change": change,
        "loss_change_se": se,
        "final_loss": float(last.mean()),
        **status,
    }


@dataclass(frozen=True)
class MAP(Method):
    """Maximum a posteriori point estimate (constrained-space mode of the tempered posterior).

    ``optimizer="auto"`` takes L-BFGS with a zoom line search for full-batch data (it converges to
    machine precision on smooth problems; ``learning_rate`` is then unused) and Adam with a cosine
    schedule for minibatches.
    """

    name = "map"
    description = "maximum a posteriori point estimate by optax (L-BFGS full batch, Adam minibatch)"

    steps: int = 2000
    learning_rate: float = 0.01
    batch_size: int | None = None
    optimizer: str = "auto"
    init: str = "prior"

    def __post_init__(self):
        check_positive_int(self.name, "steps", self.steps)
        check_positive(self.name, "learning_rate", self.learning_rate)
        check_choice(self.name, "optimizer", self.optimizer, OPTIMIZERS)
        check_choice(self.name, "init", self.init, INITS)
        if self.optimizer == "lbfgs" and self.batch_size is not None:
            raise OptionError("map: optimizer='lbfgs' needs full-batch data; use 'adam' (or 'auto') with batch_size")

    def check(self, problem) -> None:
        check_batch_size(self.batch_size, problem.num_data)

    def config(self) -> OptimizerConfig:
        optimizer = self.optimizer
        if optimizer == "auto":
            optimizer = "adam" if self.batch_size is not None else "lbfgs"
        return OptimizerConfig(optimizer, int(self.steps), "cosine", self.batch_size)

    def run(self, key, problem) -> Posterior:
        self.check(problem)
        init_key, run_key = jax.random.split(key)
        start = problem.init_position(init_key, self.init)
        params, losses = minimize(
            NegativeLogJoint(), self.config(), problem, start, run_key, learning_rate=self.learning_rate, label="map"
        )
        info = {"losses": losses, "optimizer": self.config().optimizer, **loss_convergence(losses, self.steps)}
        return Posterior(
            method=self.name, problem=problem, flat_draws=params[None, None], info=info, approximation=PointMass(params)
        )
