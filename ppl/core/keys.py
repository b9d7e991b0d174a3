"""Random keys from seeds: every random stream of ppl starts here, never from global state."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ppl.core.errors import OptionError

__all__ = ["as_key", "derived_key", "seed_record", "check_num_samples"]


def as_key(seed) -> jax.Array:
    """A raw uint32 PRNG key from an int seed or a JAX key (typed or raw). Never global state."""
    if isinstance(seed, (bool, np.bool_)):
        raise OptionError(f"seed must be an int or a JAX PRNG key, got {seed!r}")
    if isinstance(seed, (int, np.integer)):
        if not 0 <= int(seed) < 2**32:
            # JAX in its default 32-bit mode keeps only the low 32 bits: larger seeds would collide.
            raise OptionError(
                f"seed must be an integer in [0, 2**32), got {seed!r}; for more streams pass a JAX key "
                "(jax.random.key(n)) or derive seeds with jax.random.fold_in"
            )
        return jax.random.PRNGKey(int(seed))
    if isinstance(seed, jax.Array):
        if jnp.issubdtype(seed.dtype, jax.dtypes.prng_key):
            return jax.random.key_data(seed)
        if seed.shape == (2,) and seed.dtype == jnp.uint32:
            return seed
    raise OptionError(f"seed must be an int or a JAX PRNG key, got {type(seed).__name__}")


def derived_key(seed, purpose: int) -> jax.Array:
    """The key of one further random stream of ``seed`` (the test metrics after a fit, a figure):
    ``fold_in(key, purpose)``. Never ``seed + purpose``: that leaves [0, 2**32) for the largest seeds
    and reuses the next seed's own stream."""
    return jax.random.fold_in(as_key(seed), purpose)


def seed_record(seed):
    return int(seed) if isinstance(seed, (int, np.integer)) else [int(v) for v in np.asarray(as_key(seed))]


def check_num_samples(n) -> None:
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 1:
        raise OptionError(f"the number of samples must be a positive integer, got {n!r}")
