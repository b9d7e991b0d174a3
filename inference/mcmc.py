"""``nuts`` and ``hmc``: NumPyro's HMC/NUTS kernels driven by one jitted program per chain.

NumPyro's functional kernels (``numpyro.infer.hmc.hmc``) do the sampling and Stan-style window
adaptation of step size and mass matrix. ppl owns only the driver: initialisation, warmup and
sampling run as one ``lax.scan`` program compiled once per problem layout (the Problem is a pytree
argument, so a new same-shaped dataset reuses the executable), with progress reported by a host
callback once per chunk of steps.

Chain ``i`` uses ``fold_in(key, i)``, so chain 0 is the same whether 1 or 4 chains run.
``chain_method="sequential"`` runs the compiled chain program once per chain (bit-identical chains
whatever their number); ``"vectorized"`` vmaps it over chains (faster for small models on one
device; a vmapped NUTS step waits for the longest trajectory in the batch).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.infer.hmc import hmc

from ppl.core import devices as _devices
from ppl.core import interrupt, progress as _progress
from ppl.core.checkpoint import Interrupted, ResumeState, Session, restore_tree
from ppl.core.errors import NonFiniteError, OptionError, ResumeError
from ppl.core.extend import DEFAULT_TIME_BUDGET, Extension, check_time_budget, restored_halving
from ppl.core.loop import SamplerLoop, drive
from ppl.core.posterior import Posterior
from ppl.core.records import ChainStats, RunStatus
from ppl.core.method import (
    Method,
    check_choice,
    extended_remedy,
    check_dense_matrix,
    check_positive,
    check_positive_int,
)

__all__ = ["NUTS", "HMC"]

INITS = ("uniform", "prior", "zeros")
CHAIN_METHODS = ("sequential", "vectorized")
MAX_TREE_DEPTH = 20
MAX_LEAPFROG_STEPS = 1024  # per HMC transition, as NUTS's default tree depth of 10 allows
MAX_TRAJECTORY_LENGTH = 1000.0
CHUNK_CAPACITY = 128  # most steps one compiled chunk can take
TARGET_CHUNK_S = 0.5  # wall time the host aims each chunk at (Ctrl-C answers within one chunk)


def _potential_fn_gen(problem):
    # NumPyro speaks potential energy; ppl's one convention is log density, negated only here.
    return lambda u: -problem.logdensity_fn(u)


@dataclass(frozen=True)
class _ChainConfig:
    """Hashable static settings of the chain program (built from the options dataclass)."""

    algo: str
    num_warmup: int
    num_samples: int
    max_tree_depth: int
    dense_mass: bool
    init: str


def _init_kernel_args(config: _ChainConfig, target_accept, trajectory_length) -> dict:
    return dict(
        dense_mass=config.dense_mass,
        target_accept_prob=target_accept,
        max_tree_depth=config.max_tree_depth,
        trajectory_length=trajectory_length,
    )


def _init_chain(config: _ChainConfig, problem, key, target_accept, trajectory_length):
    """The kernel state of a fresh chain: initial position, step-size search, adaptation state."""
    init_key, run_key = jax.random.split(key)
    position = problem.init_position(init_key, config.init)
    init_kernel, _ = hmc(potential_fn_gen=_potential_fn_gen, algo=config.algo)
    return init_kernel(
        position,
        config.num_warmup,
        **_init_kernel_args(config, target_accept, trajectory_length),
        model_args=(problem,),
        rng_key=run_key,
    )


def _advance(config: _ChainConfig, capacity: int, problem, state, num_active, target_accept, trajectory_length):
    """Up to ``capacity`` kernel steps from ``state``; steps ``≥ num_active`` leave it unchanged.

    One compiled program serves every chunk length (``num_active`` is an array), so the host can
    size chunks to wall time without recompiling. The kernel's randomness lives in the state's key,
    so the draws do not depend on how the steps are cut into chunks.
    """
    init_kernel, sample_kernel = hmc(potential_fn_gen=_potential_fn_gen, algo=config.algo)
    # NumPyro keeps the kernel's settings (adaptation schedule, tree depth) in closures that
    # init_kernel fills in; calling it binds them. Its own output is unused and compiled away.
    init_kernel(
        state.z,
        config.num_warmup,
        **_init_kernel_args(config, target_accept, trajectory_length),
        model_args=(problem,),
        rng_key=state.rng_key,
    )

    def kernel(state):
        if config.algo == "HMC":
            # A fixed trajectory takes trajectory_length / step_size leapfrog steps; on a badly scaled
            # posterior the adapted step size collapses and one transition would never end (and a
            # compiled step cannot be interrupted). Cap the steps as NUTS's tree depth does: the
            # kernel stays valid (the length depends on the step size, not on the position).
            cap = state.adapt_state.step_size * MAX_LEAPFROG_STEPS
            state = state._replace(trajectory_length=jnp.minimum(trajectory_length, cap))
        return sample_kernel(state, model_args=(problem,))

    def step(state, index):
        state = jax.lax.cond(index < num_active, kernel, lambda s: s, state)
        return state, (state.z, state.diverging, state.num_steps, state.accept_prob, state.energy)

    return jax.lax.scan(step, state, jnp.arange(capacity))


_init_one = jax.jit(_init_chain, static_argnames=("config",))
_advance_one = jax.jit(_advance, static_argnames=("config", "capacity"))


@partial(jax.jit, static_argnames=("config", "devices"))
def _init_many(config, problem, keys, target_accept, trajectory_length, devices=None):
    def chains(keys, problem, target_accept, trajectory_length):
        return jax.vmap(lambda k: _init_chain(config, problem, k, target_accept, trajectory_length))(keys)

    return _devices.spread(chains, devices, (keys,), (problem, target_accept, trajectory_length))


@partial(jax.jit, static_argnames=("config", "capacity", "devices"))
def _advance_many(config, capacity, problem, states, num_active, target_accept, trajectory_length, devices=None):
    """Vectorized chains, split evenly over ``devices`` (each device runs its share vmapped)."""
    def chains(states, problem, num_active, target_accept, trajectory_length):
        return jax.vmap(
            lambda s: _advance(config, capacity, problem, s, num_active, target_accept, trajectory_length)
        )(states)

    return _devices.spread(chains, devices, (states,), (problem, num_active, target_accept, trajectory_length))


STAT_NAMES = ("z", "diverging", "num_steps", "accept_prob", "energy")


class _Lane:
    """Chains advanced together by one compiled call: one chain on its own device (sequential), or
    every chain vmapped (vectorized; ``device`` is then the tuple of devices the chains are split
    over). ``state`` is the kernel state (leading chain axis when batched)."""

    def __init__(self, chains: list, batched: bool, device):
        self.chains, self.batched, self.device, self.state = chains, batched, device, None


def _chunk_capacity(num_params: int, itemsize: int) -> int:
    # Positions of every step in a chunk come back to the host; keep that transfer under ~64 MiB.
    fits = max(1, (64 * 2**20) // max(1, num_params * itemsize))
    return int(min(CHUNK_CAPACITY, 2 ** int(math.log2(fits))))


@dataclass(frozen=True)
class _MCMC(Method):
    kind = "chains"
    resumable = True
    num_warmup: int = 500
    num_samples: int = 1000
    num_chains: int = 4
    target_accept: float = 0.8
    dense_mass: bool = False
    init: str = "uniform"
    chain_method: str = "sequential"
    time_budget: float | None = DEFAULT_TIME_BUDGET

    @classmethod
    def remedy(cls, posterior, topic):
        if topic == "mixing":
            return extended_remedy(posterior, "raise num_warmup and num_samples, or reparameterise")
        return super().remedy(posterior, topic)

    def __post_init__(self):
        super().__post_init__()
        check_positive_int(self.name, "num_warmup", self.num_warmup, allow_zero=True)
        check_positive_int(self.name, "num_samples", self.num_samples)
        check_positive_int(self.name, "num_chains", self.num_chains)
        if not 0.0 < self.target_accept < 1.0:
            raise OptionError(f"{self.name}: target_accept must lie in (0, 1), got {self.target_accept!r}")
        check_choice(self.name, "init", self.init, INITS)
        check_choice(self.name, "chain_method", self.chain_method, CHAIN_METHODS)
        check_time_budget(self.name, self.time_budget)

    def _config(self) -> _ChainConfig:
        raise NotImplementedError

    def _trajectory_length(self) -> float:
        return 2 * math.pi  # unused by NUTS; NumPyro's default

    def stored_draws(self) -> int:
        return self.num_chains * self.num_samples

    def check(self, problem) -> None:
        itemsize = np.dtype(problem.init_params.dtype).itemsize
        if self.dense_mass:
            check_dense_matrix(
                self.name, "a dense mass matrix", problem.num_params, itemsize,
                copies=self.num_chains if self.chain_method == "vectorized" else 1,
                alternatives="dense_mass=False (a diagonal mass matrix)",
            )

    def run(self, key, problem, session: Session | None = None) -> Posterior:
        self.check(problem)
        session = session or Session()
        return drive(_ChainsLoop(self, key, problem, session), session)

    # -- pieces of run -------------------------------------------------------------------------------
    def _start_lane(self, lane, key, problem, tuning, config, saved_states) -> None:
        if lane.chains[0] in saved_states:
            lane.state = saved_states[lane.chains[0]]
            if not lane.batched:
                lane.state = jax.device_put(lane.state, lane.device)
            return
        keys = [jax.random.fold_in(key, c) for c in lane.chains]
        if lane.batched:
            lane.state = _init_many(config, problem, jnp.stack(keys), *tuning, devices=lane.device)
        else:
            placed = jax.device_put((problem, keys[0], tuning), lane.device)
            lane.state = _init_one(config, placed[0], placed[1], *placed[2])

    def _collect(self, lane, n, stats, done, records, problem) -> None:
        """Keep the post-warmup rows of a chunk's statistics; stop at the first non-finite state."""
        start = done[lane.chains[0]]
        first_draw = max(0, self.num_warmup - start)
        for i, c in enumerate(lane.chains):
            rows = {name: (value[i] if lane.batched else value)[:n] for name, value in zip(STAT_NAMES, stats)}
            bad = ~(np.all(np.isfinite(rows["z"]), axis=1) & np.isfinite(rows["energy"]))
            if bad.any():
                first = int(np.flatnonzero(bad)[0])
                sites = problem.sites_of(~np.isfinite(rows["z"][first]))
                error = NonFiniteError(
                    f"{self.name}: chain {c} reached a non-finite state at step {start + first} "
                    f"({'warmup' if start + first < self.num_warmup else 'sampling'}; non-finite: "
                    f"{', '.join(sites) or 'the energy'}); the draws before it are kept on this error as "
                    ".partial — check the model's log density for NaN/inf (bad constraints, overflow)",
                    step=start + first,
                )
                for name in STAT_NAMES:
                    records[c][name].append(rows[name][first_draw:first])
                done[c] = start + first
                raise error
            for name in STAT_NAMES:
                records[c][name].append(rows[name][first_draw:])
        for c in lane.chains:
            done[c] = start + n

    def _restore(self, resume, records, problem, tuning):
        progress = resume.progress
        target = progress.get("draws_target", self.num_samples)
        if not (isinstance(target, int) and target >= self.num_samples and target % self.num_samples == 0
                and (target == self.num_samples or self.time_budget)):
            raise ResumeError(f"the checkpoint's draw target {target!r} does not fit num_samples={self.num_samples}")
        total = self.num_warmup + target
        done, started = progress.get("steps_done"), progress.get("state_chains")

        def ints(values, low, high):
            return isinstance(values, list) and all(
                isinstance(v, int) and not isinstance(v, bool) and low <= v <= high for v in values
            )

        if not (ints(done, 0, total) and len(done) == self.num_chains and ints(started, 0, self.num_chains - 1)):
            raise ResumeError(f"the checkpoint's progress {progress} does not fit {self.num_chains} chains of {total} steps")
        # Every chain that has started needs its saved state; a vectorized run keeps one for all.
        needed = sorted({0} if self.chain_method == "vectorized" and any(done) else {c for c, d in enumerate(done) if d > 0})
        if sorted(set(started)) != needed or len(started) != len(set(started)):
            raise ResumeError(
                f"the checkpoint holds the states of chains {started}, but chains {needed} have started; it was edited "
                "or written by another version — start afresh without resume"
            )
        if self.chain_method == "vectorized" and len(set(done)) > 1:
            raise ResumeError(f"a vectorized run's chains advance together, but the checkpoint says {done}")
        config = self._config()
        template_key = jnp.zeros(2, jnp.uint32)
        shape = jax.eval_shape(lambda k: _init_chain(config, problem, k, *tuning), template_key)
        if self.chain_method == "vectorized":
            shape = jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct((self.num_chains, *s.shape), s.dtype), shape)
        template = {c: shape for c in started}
        per_chain = len(jax.tree_util.tree_leaves(shape))
        if len(resume.leaves) != per_chain * len(template):
            raise ResumeError(
                f"the checkpoint holds {len(resume.leaves)} state arrays, not the {per_chain * len(template)} "
                f"that {len(template)} chain state(s) of this sampler need; start afresh without resume"
            )
        states = {}
        for i, c in enumerate(template):
            states[c] = restore_tree(template[c], resume.leaves[i * per_chain : (i + 1) * per_chain], f"chain {c} state")
        for c in range(self.num_chains):
            kept = max(0, done[c] - self.num_warmup)
            for name in STAT_NAMES:
                value = resume.arrays.get(f"chain{c}/{name}")
                if value is None and kept == 0:
                    continue
                if value is None or value.ndim < 1 or value.shape[0] != kept:
                    raise ResumeError(f"the checkpoint's chain {c} statistics {name!r} do not match its {kept} draws")
                records[c][name].append(np.asarray(value))
        return done, states, target

    def _partial(self, problem, records, done, lanes_by_chain, saved_states, target, extension):
        """(Posterior of the draws so far or None, ResumeState to continue from), in a run that aims
        at ``target`` draws per chain; the first ``extension.discarded()`` draws of each chain count
        as warmup once the run extends after a failed R-hat."""
        total = self.num_warmup + target
        joined = {c: {name: _concat(parts) for name, parts in rec.items()} for c, rec in records.items()}
        counts = [joined[c]["z"].shape[0] if joined[c]["z"] is not None else 0 for c in joined]
        complete = [c for c in joined if done[c] >= total]
        if complete:
            use, length = complete, target
        else:
            use = [c for c in joined if counts[c] > 0]
            length = min((counts[c] for c in use), default=0)
        posterior = None
        first = extension.discarded() if length > extension.discarded() else 0  # an interrupted round keeps what it has
        if use and length > 0:
            posterior = self._posterior(problem, [{k: v[first:length] for k, v in joined[c].items()} for c in use],
                                        lanes_by_chain, use, saved_states, done, total)
        states, state_chains = [], []
        # A vectorized run keeps one batched state (under chain 0); a sequential one, one per chain.
        owners = [0] if self.chain_method == "vectorized" else range(self.num_chains)
        for c in owners:
            state = self._state_of(c, lanes_by_chain, saved_states)
            started = any(done) if self.chain_method == "vectorized" else done[c] > 0
            if state is not None and started:
                states.append(state)
                state_chains.append(c)
        leaves = [np.asarray(leaf) for s in states for leaf in jax.tree_util.tree_leaves(jax.device_get(s))]
        arrays = {
            f"chain{c}/{name}": value
            for c in joined
            for name, value in joined[c].items()
            if value is not None
        }
        progress = {"steps_done": list(map(int, done)), "state_chains": state_chains, "draws_target": int(target),
                    **extension.progress()}
        state = ResumeState("mcmc", progress, leaves, arrays)
        return posterior, state

    def _state_of(self, chain: int, lanes_by_chain: dict, saved_states: dict):
        """The current kernel state holding ``chain`` (batched for a vectorized run), or None."""
        lane = lanes_by_chain.get(chain)
        if lane is not None:
            return lane.state
        return saved_states.get(0 if self.chain_method == "vectorized" else chain)

    def _posterior(self, problem, rows, lanes_by_chain, use, saved_states, done, total) -> Posterior:
        stats = {name: np.stack([r[name] for r in rows]) for name in STAT_NAMES}
        step_sizes, inverse_masses = [], []
        for c in use:
            adapt = jax.device_get(self._state_of(c, lanes_by_chain, saved_states).adapt_state)
            step_size, inverse_mass = np.asarray(adapt.step_size), np.asarray(adapt.inverse_mass_matrix)
            if self.chain_method == "vectorized":
                step_size, inverse_mass = step_size[c], inverse_mass[c]
            step_sizes.append(step_size)
            inverse_masses.append(inverse_mass if inverse_mass.ndim == 1 else np.diagonal(inverse_mass))
        config = self._config()
        nuts = config.algo == "NUTS"
        chain_stats = ChainStats(
            accept_prob=stats["accept_prob"], diverging=stats["diverging"], num_steps=stats["num_steps"],
            energy=stats["energy"], step_size=np.asarray(step_sizes),
            max_tree_depth=config.max_tree_depth if nuts else None, leapfrog_cap=None if nuts else MAX_LEAPFROG_STEPS,
        )
        status = RunStatus(
            interrupted=any(d < total for d in done), chains_done=int(sum(d >= total for d in done)),
            steps_done=int(min(done)),
        )
        info = {"steps_done_per_chain": [int(d) for d in done], "inverse_mass_matrix_diag": np.asarray(inverse_masses)}
        return Posterior(
            method=self.name, kind=self.kind, declared_by=type(self), problem=problem, flat_draws=stats["z"], status=status,
            chain_stats=chain_stats, info=info,
        )


class _ChainsLoop(SamplerLoop):
    """One NUTS/HMC run for :func:`drive`: chains in lanes (one chain per device, or all chains
    vmapped), lanes in groups that advance together, one group after another."""

    def __init__(self, method: _MCMC, key, problem, session: Session):
        self.method, self.key, self.problem = method, key, problem
        self.config = method._config()
        dtype = problem.init_params.dtype
        self.tuning = (jnp.asarray(method.target_accept, dtype), jnp.asarray(method._trajectory_length(), dtype))
        chains = list(range(method.num_chains))
        self.capacity = _chunk_capacity(problem.num_params, np.dtype(dtype).itemsize)
        self.records = {c: {name: [] for name in STAT_NAMES} for c in chains}
        self.done = [0] * method.num_chains
        self.target = method.num_samples  # draws per chain: num_samples, or a multiple once the run extends
        self.saved_states: dict = {}
        resume = session.resume_state("mcmc")
        halved = False
        if resume is not None:
            self.done, self.saved_states, self.target = method._restore(resume, self.records, problem, self.tuning)
            halved = restored_halving(resume.progress)
        self.extension = Extension(method, session, rounds_done=self.target // method.num_samples, halved=halved)
        self.per_round = method.num_chains * method.num_samples * problem.num_params * np.dtype(dtype).itemsize
        devices = _devices.available(session.devices)
        if method.chain_method == "vectorized":
            self.groups = [[_Lane(chains, True, _devices.spread_devices(len(chains), devices))]]
        else:
            # Chain i runs on device i mod D; a group of D chains advances together, so with
            # several devices (GPUs, or CPU host devices via XLA_FLAGS) the chains run concurrently.
            # Each is a program of its own, so across hosts every process runs them on its own devices.
            devices = _devices.local_devices(devices)
            lanes = [_Lane([c], False, devices[c % len(devices)]) for c in chains]
            self.groups = [lanes[i : i + len(devices)] for i in range(0, len(lanes), len(devices))]
        # Vectorized chains share one loop, so the bars count steps of all chains at once.
        self.per_bar = 1 if method.chain_method == "vectorized" else method.num_chains
        self.lanes_by_chain: dict = {}
        self.pace = interrupt.ChunkPace(self.capacity, TARGET_CHUNK_S)

    @property
    def total(self) -> int:
        return self.method.num_warmup + self.target

    def bars(self) -> tuple:
        m = self.method
        label = f"{m.num_chains} chains{' in parallel' if m.chain_method == 'vectorized' else ''}"
        return (f"{m.name} warmup ({label})", self.per_bar * m.num_warmup,
                (f"{m.name} sampling ({label})", self.per_bar * self.target))

    def begin(self) -> None:
        # A resumed run's bars start where the checkpoint stopped (one bar position per lane).
        firsts = [lane.chains[0] for group in self.groups for lane in group]
        warmup = self.method.num_warmup
        _progress.advance(sum(min(self.done[c], warmup) for c in firsts), 0)
        _progress.advance(sum(max(self.done[c] - warmup, 0) for c in firsts), 1)

    def count(self) -> int:
        return sum(self.done)

    def round_over(self) -> bool:
        return all(d >= self.total for d in self.done)

    def advance(self) -> None:
        m, done, total = self.method, self.done, self.total
        # the first group with a chain short of its target; its lanes start (or resume) on first use
        live = next(lanes for lanes in ([lane for lane in group if done[lane.chains[0]] < total]
                                        for group in self.groups) if lanes)
        for lane in live:
            self.lanes_by_chain.update({c: lane for c in lane.chains})
            if lane.state is None:
                m._start_lane(lane, self.key, self.problem, self.tuning, self.config, self.saved_states)
        steps = self.pace.next_chunk()
        started = time.perf_counter()
        active = [min(steps, total - done[lane.chains[0]]) for lane in live]
        outputs = []
        for lane, n in zip(live, active):
            if lane.batched:
                outputs.append(_advance_many(self.config, self.capacity, self.problem, lane.state, jnp.asarray(n),
                                             *self.tuning, devices=lane.device))
            else:
                outputs.append(_advance_one(self.config, self.capacity, self.problem, lane.state, jnp.asarray(n),
                                            *self.tuning))
        outputs = [(state, jax.device_get(stats)) for state, stats in outputs]
        self.pace.record(max(active), time.perf_counter() - started)
        starts = [done[lane.chains[0]] for lane in live]
        for lane, n, (state, stats) in zip(live, active, outputs):
            m._collect(lane, n, stats, done, self.records, self.problem)
        for lane, (state, _) in zip(live, outputs):
            lane.state = state
        for start, n in zip(starts, active):
            warm = max(0, min(start + n, m.num_warmup) - start)
            _progress.advance(warm, 0)
            _progress.advance(n - warm, 1)

    def snapshot(self) -> tuple:
        return self.method._partial(self.problem, self.records, self.done, self.lanes_by_chain, self.saved_states,
                                    self.target, self.extension)

    def failed_partial(self):
        return self.snapshot()[0]

    def so_far(self):
        return self.snapshot()[0]

    def extended(self) -> None:
        _progress.extend(self.per_bar * self.target, 1)

    def finish(self) -> Posterior:
        posterior, state = self.snapshot()
        if posterior is None:
            raise Interrupted(
                f"{self.method.name}: interrupted during warmup, before the first draw; the state is kept — save it "
                "with .save(path) and resume with ppl.fit(..., resume=path)",
                state,
            )
        return posterior.replace(
            info={**posterior.info, **self.extension.info()}, resume_state=None if self.round_over() else state
        )


def _concat(parts: list):
    parts = [p for p in parts if p is not None and len(p)]
    return np.concatenate(parts) if parts else None


@dataclass(frozen=True)
class NUTS(_MCMC):
    """No-U-Turn sampler (Hoffman & Gelman 2014) with NumPyro's window adaptation."""

    name = "nuts"
    description = "No-U-Turn Hamiltonian Monte Carlo (NumPyro kernel), the reference sampler"

    max_tree_depth: int = 10

    def __post_init__(self):
        super().__post_init__()
        check_positive_int(self.name, "max_tree_depth", self.max_tree_depth)
        if self.max_tree_depth > MAX_TREE_DEPTH:
            # One draw can take 2^depth leapfrog steps, and a compiled step cannot be interrupted.
            raise OptionError(
                f"nuts: max_tree_depth={self.max_tree_depth} allows 2^{self.max_tree_depth} gradient evaluations per "
                f"draw, which would not finish; use at most {MAX_TREE_DEPTH} (the default 10 suits most models; "
                "raise it a little, or use dense_mass=True, when tree_depth_hits are reported)"
            )

    def _config(self) -> _ChainConfig:
        return _ChainConfig("NUTS", self.num_warmup, self.num_samples, self.max_tree_depth, self.dense_mass, self.init)


@dataclass(frozen=True)
class HMC(_MCMC):
    """Static-trajectory Hamiltonian Monte Carlo (Neal 2011) with NumPyro's window adaptation."""

    name = "hmc"
    description = "Hamiltonian Monte Carlo with a fixed trajectory length (NumPyro kernel)"

    # π/2, not NumPyro's 2π: with the mass matrix adapted to the posterior's scales a near-Gaussian
    # target oscillates with period 2π, so a 2π trajectory returns to where it started (default hmc
    # failed R-hat/ESS on 4 of 4 seeds of the linear fixture) while a quarter period gives nearly
    # independent draws (4 of 4 passed).
    trajectory_length: float = math.pi / 2

    def __post_init__(self):
        super().__post_init__()
        check_positive(self.name, "trajectory_length", self.trajectory_length)
        if self.trajectory_length > MAX_TRAJECTORY_LENGTH:
            # Each draw takes trajectory_length / step_size leapfrog steps inside one compiled step,
            # which Ctrl-C cannot interrupt.
            raise OptionError(
                f"hmc: trajectory_length={self.trajectory_length!r} would take trajectory_length / step_size leapfrog "
                f"steps per draw and not finish; use at most {MAX_TRAJECTORY_LENGTH:g} (the default is π/2), or nuts, "
                "which chooses the length itself"
            )

    def _config(self) -> _ChainConfig:
        # max_tree_depth does not apply to HMC; 10 only fills the field NumPyro reads for NUTS.
        return _ChainConfig("HMC", self.num_warmup, self.num_samples, 10, self.dense_mass, self.init)

    def _trajectory_length(self) -> float:
        return float(self.trajectory_length)
