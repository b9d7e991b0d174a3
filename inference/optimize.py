"""Gradient-based optimisation shared by ``map``, ``svi``, SWAG, ensembles and the prior tuning.

:func:`minimize` runs an objective in chunks of steps. Each chunk is one jitted ``lax.scan``;
between chunks the host checks for non-finite losses/parameters (stopping at the first bad chunk
with the last finite parameters kept) and advances the progress bar. Per-step keys are
``fold_in(key, step)``, so results do not depend on the chunking.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import optax
from scipy.special import stdtrit

from ppl.core import devices as _devices
from ppl.core import interrupt, progress
from ppl.core.checkpoint import Interrupted, ResumeState, Session, restore_tree
from ppl.core.errors import NonFiniteError, OptionError, ResumeError
from ppl.core.gaussian import PointMass, from_arrays
from ppl.core.loop import Loop, drive
from ppl.core.method import Method, check_positive_int
from ppl.core.posterior import Posterior
from ppl.core.records import RunStatus, TrainingTrace

__all__ = [
    "OptimizerConfig", "Minimized", "minimize", "run_to_posterior", "mode_config", "fit_mode", "loss_convergence", "round_convergence", "mode_stationarity",
    "NegativeLogJoint", "Restricted", "restricted",
]

OPTIMIZERS = ("auto", "adam", "lbfgs")
SCHEDULES = ("constant", "cosine")
INITS = ("prior", "median", "uniform", "zeros", "pretrained")  # pretrained: a Network's trained values
SGD_MOMENTUM = 0.9  # the heavy-ball momentum of the "sgd" optimizer (SWAG's trajectory)
CHUNK_CAPACITY = 256  # most steps one compiled chunk can take (chunks are sized to ~0.5 s)
CONVERGENCE_RTOL = 1e-3  # a last-window loss drop below this fraction of the loss's scale is "settled"
GRADIENT_RTOL = 1e-3  # full-batch: final gradient norm against the starting one


@dataclass(frozen=True)
class OptimizerConfig:
    """Static description of an optimisation run (hashable: it keys the compilation cache)."""

    # "adam", "lbfgs" or "sgd" (momentum SGD_MOMENTUM; SWAG's trajectory), or a hashable rule object whose
    # ``build(rate)`` gives an optax transformation called as ``update(grads, state, params)`` (IVON's)
    optimizer: object
    steps: int  # one round: the schedule's length, and the steps between convergence checks
    schedule: str = "cosine"  # "cosine" (decay over the run), "constant", or "cyclic" (cosine per cycle)
    batch_size: int | None = None
    cycle: int = 1  # steps per cycle of the "cyclic" schedule
    # L-BFGS stops updating once the gradient norm is this small (its line search divides by the
    # curvature pair, which vanishes at an exact optimum).
    grad_tol: float = 1e-9
    # The step budget: with a ``judge`` (see :func:`minimize`), training goes on in further rounds of
    # ``steps`` until the judge accepts or this many steps are done. None: exactly ``steps``.
    max_steps: int | None = None

    @property
    def budget(self) -> int:
        return self.steps if self.max_steps is None else max(self.steps, self.max_steps)

    def build(self, learning_rate) -> optax.GradientTransformation:
        """The optax transformation; ``learning_rate`` may be a traced array (no recompilation)."""
        if self.optimizer == "lbfgs":
            return optax.lbfgs()
        if self.schedule == "cosine":
            # Decay to 1% of the rate: late iterates average out the gradient noise of MC objectives.
            rate = optax.cosine_decay_schedule(learning_rate, self.steps, alpha=0.01)
            if self.budget > self.steps:
                # Each further round of a run that did not settle restarts the decay (as SGDR does):
                # it moves with large steps again and ends with small ones before it is judged.
                decay = rate

                def rate(count):
                    return decay(count % self.steps)
        elif self.schedule == "cyclic":
            # Within each cycle, cosine from the rate down to 1% of it, reached at the cycle's last step.
            def rate(count):
                phase = ((count % self.cycle) + 1) / self.cycle
                return learning_rate * (0.01 + 0.99 * 0.5 * (1.0 + jnp.cos(jnp.pi * phase)))
        else:
            rate = learning_rate
        if self.optimizer == "sgd":
            return optax.sgd(rate, momentum=SGD_MOMENTUM)
        if not isinstance(self.optimizer, str):
            return self.optimizer.build(rate)
        return optax.adam(rate)


@dataclass(frozen=True)
class NegativeLogJoint:
    """−log p(θ(u), D) without the Jacobian: minimised at the constrained-space MAP."""

    def __call__(self, params, problem, key, batch, step=None):
        return -problem.log_joint(params, batch)


@dataclass(frozen=True)
class NegativeLogDensity:
    """−log p̃(u | D) with the Jacobian: minimised at the mode of the unconstrained density."""

    def __call__(self, params, problem, key, batch, step=None):
        return -problem.logdensity_fn(params, batch)


@dataclass(frozen=True)
class Restricted:
    """``inner`` as a function of the coordinates ``movable`` marks, every other coordinate held
    where it is: the gradient there is zero, so no optimiser here moves them (Adam's update and
    L-BFGS's direction vanish on them). ``movable`` is the mask packed into bytes (hashable, and
    its hash is cached: the objective is a static argument of the compiled loops)."""

    inner: Any
    movable: bytes
    size: int

    @classmethod
    def over(cls, inner, movable) -> "Restricted":
        mask = np.asarray(movable, bool)
        return cls(inner, np.packbits(mask).tobytes(), int(mask.size))

    def mask(self) -> np.ndarray:
        return np.unpackbits(np.frombuffer(self.movable, np.uint8))[: self.size].astype(bool)

    def __call__(self, params, problem, key, batch, step=None):
        held = jnp.where(jnp.asarray(self.mask()), params, jax.lax.stop_gradient(params))
        return self.inner(held, problem, key, batch, step)


def restricted(objective, movable):
    """``objective`` over the coordinates ``movable`` marks (None: all of them)."""
    return objective if movable is None else Restricted.over(objective, movable)


def _stable_argsort(keys: jax.Array) -> jax.Array:
    """``argsort(keys, stable=True)`` of 1-D uint32 ``keys`` (n ≤ 2**16) by two single-operand sorts.

    Each sort packs a 16-bit-or-less key field above the element's position, so the packed values
    are distinct and a plain sort orders them by (field, position): first by the key's low bits, then,
    stably, by its high bits — the order (key, index) of a stable sort. XLA:CPU sorts a single
    operand far faster than the two operands (keys, payload) of ``lax.sort_key_val`` (n = 455 on
    one core: 23 µs for both sorts with their gathers against 42 µs).
    """
    n = keys.shape[0]
    shift = max(1, (n - 1).bit_length())
    mask = jnp.uint32((1 << shift) - 1)
    iota = jnp.arange(n, dtype=jnp.uint32)
    by_low = jax.lax.sort(((keys & mask) << shift) | iota) & mask
    by_high = jax.lax.sort(((keys[by_low] >> shift) << shift) | iota) & mask
    return by_low[by_high].astype(jnp.int32)


def shuffled(key, num_data: int) -> jax.Array:
    """``jax.random.permutation(key, num_data)``: the same order, computed faster.

    That call shuffles ``arange(num_data)`` by rounds of a stable sort by fresh random 32-bit keys;
    the rounds are repeated here with the same keys and :func:`_stable_argsort` in place of the
    two-operand sort, which took three quarters of an Adam step on a small network
    (tests/test_ensemble.py checks the orders are the same).
    """
    if num_data > 2**16:
        return jax.random.permutation(key, num_data)
    # jax.random.permutation's number of rounds (jax/_src/random: _shuffle)
    rounds = int(np.ceil(3 * np.log(max(1, num_data)) / np.log(np.iinfo(np.uint32).max)))
    order = jnp.arange(num_data, dtype=jnp.int32)
    for _ in range(rounds):
        key, subkey = jax.random.split(key)
        order = order[_stable_argsort(jax.random.bits(subkey, (num_data,), jnp.uint32))]
    return order


def minibatch_indices(key, num_data: int, batch_size: int) -> jax.Array:
    """``jax.random.choice(key, num_data, (batch_size,), replace=False)``: the first ``batch_size``
    of :func:`shuffled` (the same indices, computed faster)."""
    return shuffled(key, num_data)[:batch_size]


ROWS_STREAM = 1  # the random stream (folded into a step's key) of the rows' shuffle


def epoch_order(key, first_step, num_data: int) -> jax.Array:
    """The order in which an epoch visits the rows: a fresh shuffle, drawn from the key of the
    epoch's first step (step ``t`` of a run uses ``fold_in(key, t)``)."""
    return shuffled(jax.random.fold_in(jax.random.fold_in(key, first_step), ROWS_STREAM), num_data)


@partial(jax.jit, static_argnames=("config", "members", "collector"))
def _init_state(config, params, learning_rate, members: bool = False, collector=None):
    """(optimiser state, collector state): the state :func:`_chunk` carries beside the parameters."""
    def init(p):
        return config.build(learning_rate).init(p), (() if collector is None else collector.init(p))

    state = jax.vmap(init)(params) if members else init(params)
    # Optimisers start some counters as weakly typed Python scalars, which the first chunk returns
    # strongly typed: without this the chunk's program would be compiled twice, once per typing.
    return jax.tree_util.tree_map(lambda x: jax.lax.convert_element_type(x, x.dtype), state)


def select(flag, new, old):
    return jax.tree_util.tree_map(lambda a, b: jnp.where(flag, a, b), new, old)


def _chunk(objective, config, capacity, collector, problem, params, state, key, start, num_active, learning_rate,
           frozen=None):
    """Steps ``start .. start + num_active − 1`` (at most ``capacity``; the rest are skipped).

    One compiled program serves every chunk length, so chunks are sized to wall time. Step ``t``
    uses ``fold_in(key, t)``, so the result does not depend on where chunks begin. ``state`` is
    (optimiser state, collector state); the collector sees the parameters after every step taken.
    ``frozen`` (a boolean array, or None): when true, no step changes the state (an ensemble member
    that has settled while others train on); the losses are still evaluated.
    """
    optimizer = config.build(learning_rate)
    # Minibatches are read epoch by epoch: each epoch visits the rows in a fresh random order, B at a
    # time, and leaves out the last N mod B rows of that order (other rows each epoch). Each step's
    # rows are a uniform draw without replacement, as before, and the shuffle — most of a small
    # network's step when it was drawn afresh at every step — is paid once per epoch.
    per_epoch = None if config.batch_size is None else problem.num_data // config.batch_size

    def one_step(carry, step, order):
        params, (opt_state, collected) = carry
        step_key = jax.random.fold_in(key, step)
        batch = None
        if config.batch_size is not None:
            index = jax.lax.dynamic_slice_in_dim(order, (step % per_epoch) * config.batch_size, config.batch_size)
            batch = _devices.shard_rows(problem.batch(index))

        def loss_fn(p):
            return objective(p, problem, step_key, batch, step)

        if config.optimizer == "lbfgs":
            value, grad = optax.value_and_grad_from_state(loss_fn)(params, state=opt_state)
            updates, new_state = optimizer.update(grad, opt_state, params, value=value, grad=grad, value_fn=loss_fn)
            grad_norm = optax.tree_utils.tree_norm(grad)
            active = (step < config.budget) & (grad_norm > config.grad_tol)
        else:
            value, grad = jax.value_and_grad(loss_fn)(params)
            updates, new_state = optimizer.update(grad, opt_state, params)
            # every step is taken: the run loop never asks for one past the budget (_MinimizeLoop.advance)
            active = None
        if frozen is not None:
            active = ~frozen if active is None else active & ~frozen
        new_params = optax.apply_updates(params, updates)
        new_collected = collected if collector is None else collector.update(collected, new_params, step)
        if active is None:  # no copy of the state to choose between: on a small network, a tenth of a step
            return (new_params, (new_state, new_collected)), value
        new_state, new_collected = select(active, (new_state, new_collected), (opt_state, collected))
        return (select(active, new_params, params), (new_state, new_collected)), value

    # A loop of ``num_active`` trips (a traced count, so one program serves every chunk length);
    # the losses of the steps not taken stay NaN. A scan over ``capacity`` with a conditional step
    # did the same at a cost, per step, of the conditional and its copies of the state: on a
    # 513-weight network as much as the step itself.
    def body(index, carry):
        state_now, losses, order = carry
        step = start + index
        if per_epoch is not None:  # the step (never a member's) decides, so under vmap this stays a branch
            order = jax.lax.cond(step % per_epoch == 0, lambda: epoch_order(key, step, problem.num_data),
                                 lambda: order)
        new_state, value = one_step(state_now, step, order)
        return new_state, losses.at[index].set(value.astype(losses.dtype)), order

    losses = jnp.full((capacity,), jnp.nan, problem.init_params.dtype)
    # The order of the epoch the chunk starts in (a chunk may start mid-epoch, a resumed run too)
    order = (jnp.zeros((0,), jnp.int32) if per_epoch is None
             else epoch_order(key, start - start % per_epoch, problem.num_data))
    (params, state), losses, _ = jax.lax.fori_loop(0, num_active, body, ((params, state), losses, order))
    return params, state, losses


@partial(jax.jit, static_argnames=("objective", "config", "capacity", "collector", "mesh"))
def _run_chunk(objective, config, capacity, collector, problem, params, state, key, start, num_active, learning_rate,
               mesh=None):
    """:func:`_chunk` for one run, compiled. With a ``mesh`` (several devices), each step's
    minibatch rows and the guide's draws are split over it (:mod:`ppl.core.devices`)."""
    with _devices.constrained(mesh):
        if problem.is_declarative or problem.spec.kind == "unsupervised":
            # A full-batch step's rows split over the devices like a minibatch's.
            problem = type(problem)(problem.spec, _devices.shard_rows(problem.data), problem.temperature)
        return _chunk(objective, config, capacity, collector, problem, params, state, key, start, num_active,
                      learning_rate)


@partial(jax.jit, static_argnames=("objective", "config", "capacity", "collector", "devices"))
def _run_members_chunk(objective, config, capacity, collector, problem, params, opt_state, keys, start, num_active,
                       learning_rate, frozen, devices=None):
    """:func:`_chunk` for M members in one compiled program, over a leading axis of (params,
    optimiser state, key).

    Gradient steps are vmapped: the members' matrix products become one batched product. L-BFGS
    members run one after the other inside the program (``lax.map``) instead: its line search is
    a data-dependent loop, and vmapped it would run every member until the slowest one finished,
    at every step, with both sides of each branch evaluated (measured 2.8× slower than
    sequential fits; one after the other, 0.95×).

    With ``devices`` (more than one), the members are split evenly over them by ``shard_map``, each
    device running its share as above; the member axis is padded with copies of the last member,
    whose results are dropped. XLA:CPU runs one program's operations on one core, so this is how
    an ensemble uses several cores (``jax_num_cpu_devices``) or several accelerators. A member's
    steps are the same arithmetic on any device (identical results in float64; in float32 an
    L-BFGS step can round its last bit differently, which later steps amplify)."""
    def members(params, opt_state, keys, frozen, problem, start, num_active, learning_rate):
        def one(p, s, k, f):
            return _chunk(objective, config, capacity, collector, problem, p, s, k, start, num_active, learning_rate, f)

        if config.optimizer == "lbfgs":
            return jax.lax.map(lambda args: one(*args), (params, opt_state, keys, frozen))
        return jax.vmap(one)(params, opt_state, keys, frozen)

    return _devices.spread(members, devices, (params, opt_state, keys, frozen), (problem, start, num_active, learning_rate))


@partial(jax.jit, static_argnames=("objective",))
def full_gradient(objective, problem, params, key):
    value, grad = jax.value_and_grad(lambda p: objective(p, problem, key, None))(params)
    return value, optax.tree_utils.tree_norm(grad)


DESCENT_TRIALS = 40  # step lengths along −∇f tried by the descent test, each half the last


@partial(jax.jit, static_argnames=("objective",))
def _descends(objective, problem, params, key):
    """Whether some step along −∇f lowers the full-batch objective by Armijo's sufficient decrease
    and by a gain worth taking, f(x − t g) ≤ f(x) − max(1e-4 t |g|², √eps max(|f(x)|, 1)), for
    t = t₀ 2^−k, k < ``DESCENT_TRIALS``, t₀ = 0.1 max(|x|, 1)/|g|.

    A smooth objective with a gradient that does not vanish always descends for small enough t. A
    piecewise-linear one (a ReLU network's loss) can sit at a kink where the gradient of one piece
    stays large and yet every step along it climbs: a local minimum that no gradient-norm test
    recognises.
    """
    def f(p):
        return objective(p, problem, key, None)

    value, grad = jax.value_and_grad(f)(params)
    flat_x, unravel = jax.flatten_util.ravel_pytree(params)
    flat_g = jax.flatten_util.ravel_pytree(grad)[0]
    norm2 = jnp.sum(flat_g * flat_g)
    first = 0.1 * jnp.maximum(jnp.linalg.norm(flat_x), 1.0) / jnp.sqrt(jnp.maximum(norm2, jnp.finfo(flat_x.dtype).tiny))
    steps = first * 0.5 ** jnp.arange(DESCENT_TRIALS, dtype=flat_x.dtype)
    trial = jax.lax.map(lambda t: f(unravel(flat_x - t * flat_g)), steps)
    # A descent must also be worth taking: at least √eps of f's scale. Where f is large, a tiny
    # step leaves it unchanged in floating point (the Armijo margin then rounds away against f), or
    # moves it by rounding noise of either sign; and a kink may sit a hair from where the
    # optimiser stopped (at data stored in float32, say), a gain of 1e-12 of the loss.
    least = jnp.sqrt(jnp.finfo(value.dtype).eps) * jnp.maximum(jnp.abs(value), 1.0)
    return jnp.any(trial <= value - jnp.maximum(1e-4 * steps * norm2, least))


def gradient_evidence(objective, problem, params, key, start_norm: float) -> dict:
    """The ``gradient`` (and, when its norm is not small, ``descends``) arguments of
    :func:`loss_convergence` for a deterministic full-batch objective at ``params``."""
    final = float(full_gradient(objective, problem, params, key)[1])
    judged = {"gradient": (start_norm, final)}
    # A non-finite gradient is a failure whatever the descent test says (its trials are NaN too).
    if math.isfinite(final) and final > GRADIENT_RTOL * max(start_norm, 1.0):
        judged["descends"] = bool(_descends(objective, problem, params, key))
    return judged


GRADIENT_REPEATS = 32  # independent gradient estimates behind the stochastic stationarity test
STATIONARITY_ALPHA = 1e-3  # family-wise false-alarm rate of that test at a true optimum


@partial(jax.jit, static_argnames=("objective", "repeats"))
def _gradient_draws(objective, problem, params, key, repeats: int = GRADIENT_REPEATS):
    """``repeats`` independent full-batch gradient estimates of a stochastic objective, flattened."""
    def one(k):
        grad = jax.grad(lambda p: objective(p, problem, k, None))(params)
        return jax.flatten_util.ravel_pytree(grad)[0]

    return jax.lax.map(one, jax.random.split(key, repeats))


def stationarity(objective, problem, params, key, loss_scale: float = 1.0) -> tuple:
    """Is the expected gradient of a stochastic objective zero at ``params``?

    At an optimum every coordinate of the mean of independent gradient estimates is zero up to
    Monte Carlo noise: ḡ_i / (s_i / √R) follows Student's t with R − 1 degrees of freedom. Returns
    (the largest |t| over coordinates, the Bonferroni threshold at family-wise rate
    ``STATIONARITY_ALPHA``). A run parked on a ridge, where the loss barely moves step to step but
    the gradient still points one way, fails it. Coordinates whose mean gradient is at rounding
    level (below ``1e-9 · max(1, |loss|)``) are left out: frozen parameters, and estimators whose
    noise vanishes at the optimum (DReG when q equals the posterior) where a t-ratio of rounding
    errors means nothing.
    """
    draws = np.asarray(_gradient_draws(objective, problem, params, key))
    if not np.all(np.isfinite(draws)):
        return float("inf"), 0.0  # a gradient that overflowed: nothing settled
    # Each coordinate in units of its own largest draw: t-ratios do not change, squares of
    # gradients near 1e300 do not overflow.
    unit = np.max(np.abs(draws), axis=0)
    unit = np.where(unit > 0, unit, 1.0)
    scaled = draws / unit
    mean, sd = scaled.mean(axis=0), scaled.std(axis=0, ddof=1)
    live = np.abs(mean * unit) > 1e-9 * max(1.0, abs(float(loss_scale)))
    if not np.any(live):
        return 0.0, float("inf")
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.abs(mean[live]) / (sd[live] / math.sqrt(draws.shape[0]))
    t = np.where(np.isnan(t), np.inf, t)
    threshold = float(stdtrit(draws.shape[0] - 1, 1.0 - STATIONARITY_ALPHA / (2 * int(live.sum()))))
    return float(np.max(t)), threshold


def _finite_rows(params) -> np.ndarray:
    """Per member (the leading axis), whether all its parameters are finite."""
    leaves = [np.asarray(x) for x in jax.tree_util.tree_leaves(params)]
    return np.all([np.all(np.isfinite(x.reshape(x.shape[0], -1)), axis=1) for x in leaves], axis=0)


def _nonfinite_sites(params, problem) -> list[str]:
    names = []
    leaves = jax.tree_util.tree_leaves_with_path(params)
    for path, leaf in leaves:
        leaf = np.asarray(leaf)
        if np.all(np.isfinite(leaf)):
            continue
        label = jax.tree_util.keystr(path) or "params"
        if leaf.shape and leaf.shape[0] == problem.num_params:
            bad = ~np.all(np.isfinite(leaf.reshape(problem.num_params, -1)), axis=1)
            label += f" (sites {', '.join(problem.sites_of(bad))})"
        names.append(label)
    return names


class Minimized(NamedTuple):
    """What :func:`minimize` returns: the parameters reached, one loss per step done, and the state
    to resume from when the run stopped early (None when it ran to the end)."""

    params: Any
    losses: np.ndarray
    resume_state: ResumeState | None
    collected: Any = ()  # the collector's state at the end (``()`` without a collector)
    stopped: Any = None  # members: the step at which each settled (0: trained to the end); else None


def minimize(
    objective,
    config: OptimizerConfig,
    problem,
    params,
    key,
    *,
    learning_rate: float,
    label: str,
    session: Session | None = None,
    build=None,
    members: int | None = None,
    collector=None,
    judge=None,
) -> Minimized:
    """Minimise ``objective(params, problem, key, batch)`` in chunks of steps.

    With ``members=M``, ``params`` and ``key`` carry a leading axis of M independent runs (an
    ensemble), trained together as one vmapped compiled program; ``losses`` are then (M, steps),
    and a non-finite loss names the member.

    ``collector`` (hashable, with ``init(params) -> state`` and ``update(state, params, step) ->
    state``, pure array code) is carried through the compiled steps and sees the parameters after
    every step (SWAG's running moments); its state is checkpointed with the optimiser's and
    returned as ``Minimized.collected``.

    Between chunks the host checks for non-finite losses/parameters (stopping at the first bad chunk,
    with the last finite parameters kept on the :class:`ppl.NonFiniteError` and, when ``build`` is
    given, a partial Posterior built from them as ``.partial``), advances the progress bar, writes a
    checkpoint when one is due, and stops early on Ctrl-C. ``build(params, losses)`` turns parameters
    into a Posterior (for checkpoints and partial results).

    Rounds: with ``judge(params, losses) -> bool`` and a budget ``config.max_steps`` above
    ``config.steps``, the run is judged after every ``config.steps`` steps and stops at the first
    round the judge accepts, or at the budget. Chunks never cross a round's end, the compiled chunk
    is the same for every round (no recompilation), and the verdict depends only on the parameters
    and losses, so a resumed run stops where an uninterrupted one does.

    With members, ``judge(params, losses, stopped)`` and ``build(params, losses, stopped)`` also
    receive ``stopped`` (M,): the step at which each member settled, 0 while it trains. The judge
    returns one verdict per member; a member that settles is frozen (its parameters and optimiser
    state stop changing) while the others go on, so a member's result does not depend on the others
    — member 0 of an ensemble stays the ``map`` run with the same seed. ``Minimized.stopped`` holds
    the final ``stopped``.
    """
    session = session or Session()
    loop = _MinimizeLoop(objective, config, problem, params, key, learning_rate, label, session, build, members,
                         collector, judge)
    return drive(loop, session)


class _MinimizeLoop(Loop):
    """One :func:`minimize` run for :func:`drive`: rounds of ``config.steps`` steps, judged at each
    round's end until the judge accepts or the budget is spent."""

    def __init__(self, objective, config, problem, params, key, learning_rate, label, session, build, members,
                 collector, judge):
        self.objective, self.config, self.problem, self.key, self.label = objective, config, problem, key, label
        self.session, self.build, self.collector, self.judge, self.members = session, build, collector, judge, members
        self.capacity = max(1, min(CHUNK_CAPACITY, config.steps))
        self.learning_rate = jnp.asarray(learning_rate, dtype=problem.init_params.dtype)
        opt_state = _init_state(config, params, self.learning_rate, members=members is not None, collector=collector)
        self.run_chunk = _chunk_runner(objective, members, session.devices)
        self.lead = () if members is None else (int(members),)
        self.budget = config.budget if judge is not None else config.steps
        self.history: list = []
        step = 0
        self.stopped = None if members is None else np.zeros(self.lead, dtype=np.int64)
        resume = session.resume_state("optimize")
        if resume is not None:
            step = int(resume.progress.get("steps_done", -1))
            losses = np.asarray(resume.arrays.get("losses", np.zeros(0)))
            if self.stopped is not None:
                self.stopped = np.asarray(resume.arrays.get("stopped", self.stopped), dtype=np.int64)
                if self.stopped.shape != self.lead:
                    raise ResumeError(f"the checkpoint's record of settled members has shape {self.stopped.shape}, "
                                      f"not {self.lead}; start afresh without resume")
            if not 0 <= step <= self.budget or losses.shape != (*self.lead, step):
                raise ResumeError(
                    f"the checkpoint's progress ({step} steps, losses of shape {losses.shape}) does not fit a run of "
                    f"at most {self.budget} steps; start afresh without resume"
                )
            params, opt_state = restore_tree((params, opt_state), resume.leaves, "optimiser state")
            params, opt_state = jax.tree_util.tree_map(jnp.asarray, (params, opt_state))
            self.history.append(losses)
        self.params, self.opt_state, self.step = params, opt_state, step
        self.pace = interrupt.ChunkPace(self.capacity)
        self.finished = False
        self.judged_at = None  # the step of the last round's end judged
        self.previous = None  # the state at the start of the chunk before the current one

    # -- what the driver asks -----------------------------------------------------------------------
    def bars(self) -> tuple:
        steps = self.config.steps
        return self.label, min(self.budget, max(steps, -(-self.step // steps) * steps))

    def begin(self) -> None:
        progress.advance(self.step)

    def count(self) -> int:
        return self.step

    def round_over(self) -> bool:
        at_end = self.step > 0 and self.step % self.config.steps == 0 and self.judged_at != self.step
        return self.step >= self.budget or at_end

    def next_round(self) -> bool:
        """The end of a round: stop if it settled (or the budget is spent), else go on."""
        if self.step >= self.budget:
            return False
        self.judged_at = self.step
        if self._settled():
            self.finished = True
            return False
        progress.extend(min(self.budget, self.step + self.config.steps))
        return True

    def advance(self) -> None:
        steps, step = self.config.steps, self.step
        count = min(self.pace.next_chunk(), steps - step % steps, self.budget - step)
        started = time.perf_counter()
        frozen = () if self.stopped is None else (jnp.asarray(self.stopped > 0),)
        new_params, new_state, losses = self.run_chunk(
            self.objective, self.config, self.capacity, self.collector, self.problem, self.params, self.opt_state,
            self.key, jnp.asarray(step), jnp.asarray(count), self.learning_rate, *frozen,
        )
        losses = np.asarray(losses)[..., :count]
        self.pace.record(count, time.perf_counter() - started)
        finite_params = all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree_util.tree_leaves(new_params))
        if not np.all(np.isfinite(losses)) or not finite_params:
            raise self._nonfinite(new_params, losses, count)
        self.previous = (self.params, self.opt_state, step)
        self.params, self.opt_state = new_params, new_state
        self.history.append(losses)
        self.step += count
        progress.advance(count)

    def snapshot(self) -> tuple:
        return self._partial(self.params, self.opt_state, self.step)

    def finish(self) -> Minimized:
        steps, step = self.config.steps, self.step
        if not self.finished and self.judge is not None and 0 < step < self.budget and step % steps == 0 \
                and self.judged_at != step:
            self.finished = self._settled()  # stopped by Ctrl-C just as a round ended
        losses = self._joined()
        if step == 0:
            raise Interrupted(f"{self.label}: interrupted before the first step finished",
                              self._state(self.params, self.opt_state, 0))
        finished = self.finished or step >= self.budget
        return Minimized(self.params, losses, None if finished else self._state(self.params, self.opt_state, step),
                         self.opt_state[1], self.stopped)

    # -- pieces ---------------------------------------------------------------------------------------
    def _joined(self):
        return np.concatenate(self.history, axis=-1) if self.history else np.zeros((*self.lead, 0))

    def _state(self, params, opt_state, step) -> ResumeState:
        losses = self._joined()
        leaves = [np.asarray(x) for x in jax.tree_util.tree_leaves(jax.device_get((params, opt_state)))]
        arrays = {"losses": losses} if self.stopped is None else {"losses": losses, "stopped": self.stopped.copy()}
        return self.session.stamp(ResumeState("optimize", {"steps_done": int(step)}, leaves, arrays))

    def _with_stopped(self, fn, params, losses):
        return fn(params, losses) if self.stopped is None else fn(params, losses, self.stopped.copy())

    def _settled(self) -> bool:
        """Judge the round just ended; with members, freeze those that settled. True when all did."""
        if self.stopped is None:
            return bool(self.judge(self.params, self._joined()))
        verdict = np.asarray(self._with_stopped(self.judge, self.params, self._joined()), dtype=bool)
        self.stopped = np.where((self.stopped == 0) & verdict, self.step, self.stopped)
        return bool(np.all(self.stopped > 0))

    def _partial(self, params, opt_state, step, *, at_start=False) -> tuple:
        state = self._state(params, opt_state, step)
        unbuilt = self.build is None or (step == 0 and not at_start)
        posterior = None if unbuilt else self._with_stopped(self.build, params, state.arrays["losses"])
        if posterior is not None and step < self.budget:
            posterior = posterior.replace(resume_state=state)
        return posterior, state

    def _nonfinite(self, new_params, losses, count) -> NonFiniteError:
        """The error for a chunk that left the loss or the parameters non-finite, with the partial
        result attached. The parameters before this chunk are finite, but one wild step can leave
        them finite and still useless (a scale of exp(-1e30) = 0): the partial result is the latest
        of the last two chunk starts that builds a posterior ppl.load accepts."""
        step = self.step
        candidates = [(self.params, self.opt_state, step)] + ([self.previous] if self.previous is not None else [])
        partial, kept = None, step
        for old_params, old_state, old_step in candidates:
            # a failure keeps even the starting state: it is the last usable one
            partial = self._partial(old_params, old_state, old_step, at_start=True)[0]
            if partial is not None and _loadable(partial):
                kept = old_step
                break
            partial = None
        bad_steps = ~np.isfinite(losses)
        member, culprit = "", new_params
        if self.members is not None:
            rows = np.flatnonzero(bad_steps.any(axis=1) | ~_finite_rows(new_params))
            row = int(rows[0]) if rows.size else 0
            member, culprit = f" in member {row}", jax.tree_util.tree_map(lambda x: x[row], new_params)
            bad_steps = bad_steps[row]
        bad = np.flatnonzero(bad_steps)
        first = step + int(bad[0]) if bad.size else step + count - 1
        where = _nonfinite_sites(culprit, self.problem)
        if partial is not None:
            kept_text = f" and the state after {kept} steps as a partial result in .partial"
        elif self.build is not None:
            kept_text = " (neither of the last two states gives a usable posterior, so there is no partial result)"
        else:
            kept_text = ""
        error = NonFiniteError(
            f"{self.label}: the loss or the parameters became non-finite{member} at step {first} "
            f"(non-finite: {', '.join(where) or 'the loss only'}); the last finite parameters "
            f"(before step {step}) are kept on this error as .last_finite_params{kept_text}"
            " — lower learning_rate, tighten the prior, or standardise the data",
            step=first,
            last_finite_params=self.params,
        )
        error.partial = partial
        return error


def _chunk_runner(objective, members, devices):
    """The compiled chunk for one run or for ``members`` runs trained together, on ``devices``
    (None: all of ``jax.devices()``)."""
    if members is None:
        # One run: its steps are partitioned over every device of the fit (data rows and particles).
        mesh = _devices.run_mesh(devices, getattr(getattr(objective, "objective", objective), "num_particles", 1))

        def run_chunk(*args):
            return _run_chunk(*args, mesh=mesh)
        return run_chunk
    devices = _devices.spread_devices(int(members), devices)
    if len(devices) == 1:
        return _run_members_chunk

    # Chunks run on all the devices; everything between them stays on this process's first one.
    def run_chunk(objective, config, capacity, collector, problem, params, opt_state, key, start, count,
                  rate, frozen):
        params, opt_state, key, frozen = _devices.replicate((params, opt_state, key, frozen), devices)
        out = _run_members_chunk(objective, config, capacity, collector, problem, params, opt_state, key,
                                 start, count, rate, frozen, devices=devices)
        return _devices.local(out)
    return run_chunk


def _loadable(posterior) -> bool:
    """Whether a partial result holds what a saved run must: finite draws and an approximation that
    passes the checks ``ppl.load`` makes (positive finite scales, finite location)."""
    if not np.all(np.isfinite(np.asarray(posterior.flat_draws))):
        return False
    family = posterior.approximation
    if family is None:
        return True
    try:
        from_arrays(family.kind, {k: np.asarray(v) for k, v in family.arrays().items()},
                    dim=int(np.shape(posterior.flat_draws)[-1]))
    except (ValueError, TypeError, KeyError):
        return False
    return True


def loss_convergence(losses: np.ndarray | None, planned_steps: int | None = None, *, moved: bool | None = None,
                     gradient: tuple | None = None, stochastic: bool = True, descends: bool | None = None,
                     stationary: tuple | None = None, previous: np.ndarray | None = None
                     ) -> tuple[RunStatus, TrainingTrace]:
    """Judge whether an optimisation run settled, from its loss curve and its final state.

    Three tests, each recorded (a run is converged only when none fails):

    * it moved: parameters that never left their starting point are a failed run (an overflowed
      loss, a line search that never accepted a step), not a converged one;
    * the loss stopped falling: a least-squares line through the last 20% of the losses must not
      have a slope more than three standard errors below zero while falling, over that window, by
      more than the losses' step-to-step noise (stochastic losses) or ``CONVERGENCE_RTOL`` of the
      loss's scale (either, for stochastic losses; the scale alone for deterministic ones) —
      so minibatch and Monte Carlo losses are judged on their trend, not their jitter. With
      ``previous`` (the losses of the round before, see :func:`round_convergence`), a fall within
      the window counts only if the window's mean is also below the same window of the previous
      round by more than three standard errors of the difference: a learning-rate schedule that
      restarts each round lowers the loss within every round as its steps shrink (less gradient
      noise, not progress), and a round that ends no lower than the one before bought nothing;
    * for a deterministic objective (``stochastic=False``: exact full-batch losses), the final loss
      is not above the best one seen (an optimiser thrown off by overflow or a failed line search
      ends far above it), and, when ``gradient`` = (‖∇f(x_0)‖, ‖∇f(x_T)‖) of the full-batch objective
      is given, the final gradient is small relative to where the run started:
      ‖∇f(x_T)‖ ≤ ``GRADIENT_RTOL`` · max(‖∇f(x_0)‖, 1) — or, with ``descends=False`` (from
      :func:`_descends`), no step along −∇f(x_T) lowers the loss: a kink of a piecewise-linear
      loss (ReLU networks) at a local minimum, where the gradient of one piece need not vanish.

    With ``stationary`` = (max |t|, threshold) from :func:`stationarity`, a stochastic objective's
    expected gradient must also be zero within its Monte Carlo noise at the end.

    With ``losses=None`` there is no loss curve: only the gradient and stationarity tests apply (a
    mode found elsewhere, as ``laplace`` receives one) — one verdict for every optimiser's result.

    Returns the run's status (``converged``, ``convergence``; with ``planned_steps`` also
    ``interrupted`` when fewer steps were done than planned) and its trace with the figures judged.
    """
    reasons = []
    curve = losses is not None  # None: a point judged by its gradient alone (a mode handed to laplace)
    losses = np.zeros(0) if losses is None else losses
    result = {"final_loss": float(losses[-1]) if len(losses) else None}
    if moved is False:
        reasons.append("the parameters never moved from their starting point")
    window = max(10, len(losses) // 5)
    if not curve:
        pass
    elif len(losses) >= 2 * window:
        tail = np.asarray(losses[-window:], dtype=float)
        # Work on losses divided by their largest magnitude: squares of losses near 1e300 overflow.
        unit = float(np.max(np.abs(tail))) or 1.0
        scaled = tail / unit
        t = np.arange(window, dtype=float) - (window - 1) / 2.0
        slope = float(np.sum(t * (scaled - scaled.mean())) / np.sum(t * t))
        residual = scaled - scaled.mean() - slope * t
        se = float(np.sqrt(np.sum(residual**2) / (window - 2) / np.sum(t * t)))
        # Successive losses of an optimiser are correlated; inflate the standard error by the
        # residuals' lag-1 autocorrelation (an AR(1) variance factor) so jitter is not read as trend.
        inflation = 1.0
        if window > 3 and np.var(residual) > 0:
            rho = float(np.clip(np.corrcoef(residual[:-1], residual[1:])[0, 1], 0.0, 0.99))
            inflation = math.sqrt((1 + rho) / (1 - rho))
            se *= inflation
        slope, se = slope * unit, se * unit
        noise = float(np.std(residual)) * unit
        scale = max(1.0, abs(float(tail.mean())))
        drop = -slope * window
        # A stochastic loss still moving by more than one step's noise over the window is not
        # settled, however small that is against the loss's size; a deterministic one (no noise)
        # is judged against its scale.
        allowed = min(CONVERGENCE_RTOL * scale, noise) if stochastic else CONVERGENCE_RTOL * scale
        result.update(loss_slope=slope, loss_slope_se=se, loss_noise=noise, final_loss=float(tail.mean()))
        falling, gain = slope < -3.0 * se and drop > allowed, None
        if falling and previous is not None and len(previous) >= window:
            before = np.asarray(previous[-window:], dtype=float)
            # Standard errors of the two windows' means, each inflated for autocorrelation as above.
            spread = math.sqrt((noise**2 + float(np.var(before - before.mean()))) / window) * inflation
            gain = float(before.mean() - tail.mean())
            falling = gain > 3.0 * spread
        if falling:
            reasons.append(
                f"the loss still fell by {drop:.3g} over the last {window} steps ({drop / scale:.2%} of its scale, "
                f"{drop / noise if noise > 0 else float('inf'):.1f} × its step-to-step noise)"
                + ("" if gain is None else f", and ended {gain:.3g} below the same steps of the round before")
            )
    else:
        reasons.append(f"only {len(losses)} steps: too few to judge whether the loss settled")
    if not stochastic and len(losses):
        best, final = float(np.min(losses)), float(losses[-1])
        if not final <= best + CONVERGENCE_RTOL * max(1.0, abs(best)):
            reasons.append(f"the final loss {final:.4g} is above the best one reached, {best:.4g}")
    if gradient is not None:
        start_norm, final_norm = (float(g) for g in gradient)
        result["grad_norm"] = final_norm
        large = not math.isfinite(final_norm) or final_norm > GRADIENT_RTOL * max(start_norm, 1.0)
        if large and (descends is not False or not math.isfinite(final_norm)):
            reasons.append(
                f"the final gradient norm {final_norm:.3g} is not small against the starting {start_norm:.3g}"
                + (" and a step along it still lowers the loss" if descends else "")
            )
        elif large:
            result["kink"] = True
    if stationary is not None:
        t_max, threshold = stationary
        result["gradient_t_max"] = t_max
        if not t_max <= threshold:
            reasons.append(
                f"the expected gradient is not zero: a coordinate's mean over {GRADIENT_REPEATS} estimates is "
                f"{t_max:.3g} standard errors from zero (threshold {threshold:.2f}) — still moving along a ridge "
                "or stopped early; raise steps or learning_rate"
            )
    settled = "settled" if not result.pop("kink", False) else (
        "settled at a kink: the gradient does not vanish but no step along it lowers the loss (a local minimum "
        "of a piecewise-linear loss, as a ReLU network's)"
    )
    status = RunStatus(converged=not reasons, convergence="; ".join(reasons) or settled)
    if planned_steps is not None:
        status = status._replace(interrupted=len(losses) < planned_steps, steps_done=len(losses))
    return status, TrainingTrace(losses=np.asarray(losses), **result)


def round_convergence(losses, steps: int, budget: int, **evidence) -> tuple[RunStatus, TrainingTrace]:
    """:func:`loss_convergence` of a run trained in rounds of ``steps`` within ``budget`` steps
    (see :func:`minimize`): the loss tests look at the latest ``steps`` losses, the latest round
    (earlier rounds ended unsettled by construction); the trace keeps every loss. The run is
    interrupted unless it reached the budget or ended a round that settled."""
    losses = np.asarray(losses)
    done = losses.shape[-1]
    previous = losses[-2 * steps:-steps] if done >= 2 * steps and done % steps == 0 else None
    status, trace = loss_convergence(losses[-steps:], None, previous=previous, **evidence)
    finished = done >= budget or (done % steps == 0 and status.converged)
    if done >= budget > steps and not status.converged:
        status = status._replace(
            convergence=f"{status.convergence} — after {done} steps, the whole max_steps budget "
            f"({-(-done // steps)} rounds of {steps})"
        )
    return status._replace(interrupted=not finished, steps_done=done), trace._replace(losses=losses)


MAX_ROUNDS = 10  # default step budget of map and svi: this many rounds of ``steps``


def budget_of(steps: int, max_steps: int | None) -> int:
    """The step budget of a method with options ``steps`` and ``max_steps`` (None: ``MAX_ROUNDS`` rounds)."""
    return int(MAX_ROUNDS * steps if max_steps is None else max_steps)


def check_budget(method: str, steps: int, max_steps: int | None) -> None:
    if max_steps is None:
        return
    check_positive_int(method, "max_steps", max_steps)
    if max_steps < steps:
        raise OptionError(
            f"{method}: max_steps={max_steps} is below steps={steps}; max_steps is the budget a run that has not "
            f"settled may use beyond steps — give max_steps ≥ steps (max_steps=steps trains exactly steps)"
        )


def has_moved(start, end) -> bool:
    return any(bool(jnp.any(a != b)) for a, b in zip(jax.tree_util.tree_leaves(start), jax.tree_util.tree_leaves(end)))


def mode_stationarity(problem, u, key, start, how: str, density: bool = False, movable=None) -> tuple:
    """(status, None, info): a mode judged by :func:`loss_convergence` on
    its full-batch gradient alone (no loss curve: the trace slot is None), against the norm at a
    reference start; ``info`` holds the norm.

    As for ``map``, a gradient that stays large is a kink, not a failure, when no step along it
    lowers the objective by a gain worth taking: a ReLU network's MAP sits at such kinks, and its
    GGN there is the curvature the approximation uses. ``movable``: judge only these coordinates
    (the others held fixed by design)."""
    objective = restricted(NegativeLogDensity() if density else NegativeLogJoint(), movable)
    reference = problem.init_position(key, "prior") if start is None else start
    start_norm = float(full_gradient(objective, problem, reference, key)[1])
    evidence = gradient_evidence(objective, problem, u, key, start_norm)
    status, _ = loss_convergence(None, stochastic=False, **evidence)
    if not status.converged:
        status = status._replace(convergence=(
            f"the mode from {how} is not stationary ({status.convergence}), so the Laplace approximation sits at a "
            "non-stationary point"
        ))
    return status, None, {"map_gradient_norm": evidence["gradient"][1]}


def run_to_posterior(objective, config: OptimizerConfig, problem, start, key, *, learning_rate, label: str,
                     session, build, judged):
    """``minimize`` in rounds judged by ``judged(params, losses) -> (status, trace)``, then the
    Posterior ``build(params, losses)`` makes of where it stopped, with the state a resume needs."""
    result = minimize(
        objective, config, problem, start, key, learning_rate=learning_rate, label=label, session=session,
        build=build, judge=lambda params, losses: judged(params, losses)[0].converged,
    )
    return build(result.params, result.losses).replace(resume_state=result.resume_state)


def mode_config(steps: int, batch_size: int | None = None, optimizer: str = "auto",
                max_steps: int | None = None) -> OptimizerConfig:
    """The ``map`` method's optimiser settings: ``optimizer="auto"`` is L-BFGS on full-batch data
    and Adam on minibatches, with a cosine schedule, in rounds of ``steps`` within ``max_steps``."""
    if optimizer == "auto":
        optimizer = "adam" if batch_size is not None else "lbfgs"
    return OptimizerConfig(optimizer, int(steps), "cosine", batch_size, max_steps=budget_of(steps, max_steps))


def fit_mode(key, problem, config: OptimizerConfig, *, learning_rate: float = 0.01, init: str = "prior",
             session: Session | None = None, info: dict | None = None, movable=None,
             declared_by: type[Method] = Method) -> Posterior:
    """The ``map`` method's run on ``problem`` as given (its prior already chosen): from a start drawn
    by ``init``, ``minimize`` the negative log joint under ``config`` until its convergence test
    passes or the budget is spent; a point-mass Posterior whose ``info`` adds ``info``. The prior
    tuning builds on it too, which is why it lives here and not in the method's module. ``movable``
    (a mask over the flat coordinates; None: all) moves only those, the others held at the start.
    ``declared_by``: the class whose declaration speaks for the result (``MAP`` passes itself; a
    mode found inside another method keeps the base class's generic remedies)."""
    init_key, run_key = jax.random.split(key)
    start = problem.init_position(init_key, init)
    objective = restricted(NegativeLogJoint(), movable)
    # The MAP objective is deterministic on the full data even when training uses minibatches,
    # so its full-batch gradient at the start and the end is a sound convergence test either way.
    start_norm = float(full_gradient(objective, problem, start, run_key)[1])

    def judged(params, losses):
        """(status, trace) of the run so far: each round is judged by this alone, without a Posterior."""
        return round_convergence(
            losses, config.steps, config.budget, moved=has_moved(start, params), stochastic=config.batch_size is not None,
            **gradient_evidence(objective, problem, params, run_key, start_norm),
        )

    def build(params, losses):
        status, trace = judged(params, losses)
        return Posterior(
            method="map", kind="point", declared_by=declared_by, problem=problem, flat_draws=params[None, None], status=status,
            trace=trace, info={"optimizer": config.optimizer, **(info or {})}, approximation=PointMass(params),
        )

    return run_to_posterior(objective, config, problem, start, run_key, learning_rate=learning_rate, label="map",
                            session=session, build=build, judged=judged)
