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
from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.infer.hmc import hmc

from ppl import _progress
from ppl._errors import MemoryBudgetError, OptionError
from ppl._posterior import Posterior
from ppl.inference._base import Method, check_choice, check_positive, check_positive_int

__all__ = ["NUTS", "HMC"]

INITS = ("uniform", "prior", "zeros")
CHAIN_METHODS = ("sequential", "vectorized")
MAX_DRAW_BYTES = 4 * 2**30
_PROGRESS_CHUNKS = 20


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


def _chain(config: _ChainConfig, problem, key, target_accept, trajectory_length):
    # target_accept and trajectory_length are arrays: tuning them does not recompile.
    init_key, run_key = jax.random.split(key)
    position = problem.init_position(init_key, config.init)
    init_kernel, sample_kernel = hmc(potential_fn_gen=_potential_fn_gen, algo=config.algo)
    state = init_kernel(
        position,
        config.num_warmup,
        dense_mass=config.dense_mass,
        target_accept_prob=target_accept,
        max_tree_depth=config.max_tree_depth,
        trajectory_length=trajectory_length,
        model_args=(problem,),
        rng_key=run_key,
    )
    warmup_every = max(1, math.ceil(config.num_warmup / _PROGRESS_CHUNKS))
    sample_every = max(1, math.ceil(config.num_samples / _PROGRESS_CHUNKS))

    def warmup_step(state, step):
        _progress.tick_every(step, warmup_every, config.num_warmup, phase=0)
        return sample_kernel(state, model_args=(problem,)), None

    def sample_step(state, step):
        _progress.tick_every(step, sample_every, config.num_samples, phase=1)
        state = sample_kernel(state, model_args=(problem,))
        stats = (state.z, state.diverging, state.num_steps, state.accept_prob, state.energy)
        return state, stats

    state, _ = jax.lax.scan(warmup_step, state, jnp.arange(config.num_warmup))
    state, stats = jax.lax.scan(sample_step, state, jnp.arange(config.num_samples))
    adapt = state.adapt_state
    return stats, adapt.step_size, adapt.inverse_mass_matrix


_chain_jit = jax.jit(_chain, static_argnames=("config",))


@partial(jax.jit, static_argnames=("config",))
def _chains_vectorized(config, problem, keys, target_accept, trajectory_length):
    return jax.vmap(lambda k: _chain(config, problem, k, target_accept, trajectory_length))(keys)


@dataclass(frozen=True)
class _MCMC(Method):
    num_warmup: int = 500
    num_samples: int = 1000
    num_chains: int = 4
    target_accept: float = 0.8
    dense_mass: bool = False
    init: str = "uniform"
    chain_method: str = "sequential"

    def __post_init__(self):
        check_positive_int(self.name, "num_warmup", self.num_warmup, allow_zero=True)
        check_positive_int(self.name, "num_samples", self.num_samples)
        check_positive_int(self.name, "num_chains", self.num_chains)
        if not 0.0 < self.target_accept < 1.0:
            raise OptionError(f"{self.name}: target_accept must lie in (0, 1), got {self.target_accept!r}")
        check_choice(self.name, "init", self.init, INITS)
        check_choice(self.name, "chain_method", self.chain_method, CHAIN_METHODS)

    def _config(self) -> _ChainConfig:
        raise NotImplementedError

    def _trajectory_length(self) -> float:
        return 2 * math.pi  # unused by NUTS; NumPyro's default

    def check(self, problem) -> None:
        size = self.num_chains * self.num_samples * problem.num_params * np.dtype(problem.init_params.dtype).itemsize
        if size > MAX_DRAW_BYTES:
            raise MemoryBudgetError(
                f"{self.name}: storing {self.num_chains} chains × {self.num_samples} draws × {problem.num_params} "
                f"parameters needs {size / 2**30:.1f} GiB (limit {MAX_DRAW_BYTES / 2**30:.0f} GiB); lower "
                "num_samples or num_chains, or use a method that stores fewer draws (svi, map)"
            )

    def run(self, key, problem) -> Posterior:
        self.check(problem)
        config = self._config()
        keys = [jax.random.fold_in(key, i) for i in range(self.num_chains)]
        # Vectorized chains share one loop, so the bars count steps of all chains at once.
        together = self.chain_method == "vectorized"
        per_bar = 1 if together else self.num_chains
        label = f"{self.num_chains} chains{' in parallel' if together else ''}"
        with _progress.task(
            f"{self.name} warmup ({label})",
            per_bar * self.num_warmup,
            (f"{self.name} sampling ({label})", per_bar * self.num_samples),
        ):
            dtype = problem.init_params.dtype
            tuning = (jnp.asarray(self.target_accept, dtype), jnp.asarray(self._trajectory_length(), dtype))
            if self.chain_method == "vectorized":
                stats, step_size, inverse_mass = _chains_vectorized(config, problem, jnp.stack(keys), *tuning)
            else:
                # Chain i runs on device i mod D. Dispatch is asynchronous, so with several devices
                # (GPUs, or CPU host devices via XLA_FLAGS=--xla_force_host_platform_device_count)
                # the chains run concurrently; each is the same compiled program, so the draws do
                # not depend on the placement.
                devices = jax.devices()
                results = []
                try:
                    for i, k in enumerate(keys):
                        placed = jax.device_put((problem, k, tuning), devices[i % len(devices)])
                        results.append(_chain_jit(config, placed[0], placed[1], *placed[2]))
                        if len(devices) == 1:
                            # One device runs one chain at a time anyway; waiting here lets Ctrl-C
                            # keep the chains already finished.
                            jax.block_until_ready(results[-1])
                except KeyboardInterrupt:
                    results = [r for r in results if all(x.is_ready() for x in jax.tree_util.tree_leaves(r))]
                    if not results:
                        raise
                results = jax.device_get(results)
                stats, step_size, inverse_mass = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *results)
        positions, diverging, num_steps, accept_prob, energy = (np.asarray(x) for x in stats)
        info = {
            "interrupted": positions.shape[0] < self.num_chains,
            "chains_done": int(positions.shape[0]),
            "diverging": diverging,
            "num_steps": num_steps,
            "accept_prob": accept_prob,
            "energy": energy,
            "divergences": int(diverging.sum()),
            "step_size": np.asarray(step_size),
            "inverse_mass_matrix_diag": np.asarray(
                inverse_mass if inverse_mass.ndim == 2 else jnp.diagonal(inverse_mass, axis1=-2, axis2=-1)
            ),
            "mean_accept_prob": float(accept_prob.mean()),
        }
        if config.algo == "NUTS":
            info["tree_depth_hits"] = int((num_steps >= 2**config.max_tree_depth - 1).sum())
            info["max_tree_depth"] = config.max_tree_depth
        return Posterior(method=self.name, problem=problem, flat_draws=positions, info=info)


@dataclass(frozen=True)
class NUTS(_MCMC):
    """No-U-Turn sampler (Hoffman & Gelman 2014) with NumPyro's window adaptation."""

    name = "nuts"
    description = "No-U-Turn Hamiltonian Monte Carlo (NumPyro kernel), the reference sampler"

    max_tree_depth: int = 10

    def __post_init__(self):
        super().__post_init__()
        check_positive_int(self.name, "max_tree_depth", self.max_tree_depth)

    def _config(self) -> _ChainConfig:
        return _ChainConfig("NUTS", self.num_warmup, self.num_samples, self.max_tree_depth, self.dense_mass, self.init)


@dataclass(frozen=True)
class HMC(_MCMC):
    """Static-trajectory Hamiltonian Monte Carlo (Neal 2011) with NumPyro's window adaptation."""

    name = "hmc"
    description = "Hamiltonian Monte Carlo with a fixed trajectory length (NumPyro kernel)"

    trajectory_length: float = 2 * math.pi

    def __post_init__(self):
        super().__post_init__()
        check_positive(self.name, "trajectory_length", self.trajectory_length)

    def _config(self) -> _ChainConfig:
        # max_tree_depth does not apply to HMC; 10 only fills the field NumPyro reads for NUTS.
        return _ChainConfig("HMC", self.num_warmup, self.num_samples, 10, self.dense_mass, self.init)

    def _trajectory_length(self) -> float:
        return float(self.trajectory_length)
