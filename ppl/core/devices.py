"""Several devices: which ones a fit uses, and the two ways ppl spreads its work over them.

``ppl.fit(..., devices=N)`` (the CLI's ``--devices N``) runs the method on the first N of
``jax.devices()``; without it a fit uses all of them, which on a plain CPU machine is one. The
choice travels with the run's context (``Session.devices``) to every loop the method runs, so no
method takes an option of its own for it, and every registered method is served the same way.
Functions here given ``devices=None`` use all of ``jax.devices()``.

Everything here is JAX's own machinery; nothing in ppl moves arrays between devices by hand.

* **Independent runs** (chains, ensemble and MultiSWAG members): :func:`spread` splits their
  leading axis evenly over the devices with ``shard_map``. Each device runs its share exactly
  as one device would run all of them, so the results do not depend on the number of devices.
* **One run over many data points and particles** (svi, map, swag, the SVI start of a guide):
  :func:`run_mesh` lays the devices out as a two-axis mesh, ``particles × data``, and
  :func:`shard_rows` / :func:`shard_particles` place sharding constraints on the minibatch's rows
  and on the guide's draws inside the compiled step. XLA's SPMD partitioner then splits the
  forward and backward passes over both axes and sums the gradient across devices (an
  all-reduce); the parameters stay replicated. Only the order of that final sum changes, so a
  run equals the one-device run up to floating-point rounding. Random draws are generated
  shard by shard with the same bits (``jax_threefry_partitionable``, JAX's default).

On several hosts, ``jax.distributed.initialize()`` before the first fit makes ``jax.devices()``
list every host's devices, and every process runs the same fit (JAX's multi-controller model).
Both kinds of spreading then cross hosts unchanged; the results of spread runs are gathered onto
every device so each process can read them, and :func:`local` brings what the host-side loops
keep between chunks onto the process's own first device. Sequential chains, which are separate
programs on one device each, stay on each process's own devices (:func:`local_devices`).
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ppl.core.errors import OptionError

__all__ = ["resolve", "available", "spread", "run_mesh", "constrained", "shard_rows", "shard_particles", "spread_devices",
           "local", "local_devices", "replicate"]

# The mesh of the program being traced (set by `constrained` around tracing, read by the sharding
# constraints inside the compiled step): trace-time state, never a run's setting.
_MESH: contextvars.ContextVar = contextvars.ContextVar("ppl_trace_mesh", default=None)


def resolve(devices) -> tuple:
    """The devices a fit runs on: ``None`` → all of ``jax.devices()``; an int N → the first N;
    a sequence of ``jax.Device`` → those."""
    listed = jax.devices()
    if devices is None:
        return tuple(listed)
    if isinstance(devices, (int, np.integer)) and not isinstance(devices, bool):
        count = int(devices)
        if count < 1:
            raise OptionError(f"devices={count}: give a positive number of devices (or None for all {len(listed)})")
        if count > len(listed):
            platform = listed[0].platform
            how = (
                "on a CPU, ask JAX for more host devices before it starts: jax.config.update('jax_num_cpu_devices', "
                f"{count}) first thing, or XLA_FLAGS=--xla_force_host_platform_device_count={count} (the CLI's "
                "--devices does this itself)"
                if platform == "cpu" else "use at most that many, or run on a machine with more"
            )
            raise OptionError(f"devices={count}, but JAX sees {len(listed)} {platform} device(s); {how}")
        return tuple(listed[:count])
    try:
        chosen = tuple(devices)
    except TypeError:
        raise OptionError(
            f"devices={devices!r}: give a number of devices, a list of jax.Device, or None for all of them"
        ) from None
    if not chosen or not all(isinstance(d, jax.Device) for d in chosen):
        raise OptionError(f"devices={devices!r}: a list of devices must hold jax.Device objects (from jax.devices())")
    return chosen


def available(devices: tuple | None = None) -> tuple:
    """The devices a run uses: those given, or all of ``jax.devices()``."""
    return tuple(jax.devices()) if devices is None else tuple(devices)


def _shard_map(fun, **options):
    """``shard_map`` without its replication check (the runs' loops mix per-run values with
    replicated ones), under the name and option each supported JAX version gives it."""
    shard_map = getattr(jax, "shard_map", None)
    if shard_map is None:
        from jax.experimental.shard_map import shard_map
    check = "check_vma" if "check_vma" in inspect.signature(shard_map).parameters else "check_rep"
    return shard_map(fun, **options, **{check: False})


def spread_devices(count: int, devices: tuple | None = None) -> tuple:
    """The devices ``count`` independent runs are spread over: as few as give each device the
    fewest runs (5 runs on 4 devices: 3 devices of 2, not 4 with 3 padded)."""
    devices = available(devices)
    if jax.process_count() > 1:
        # Every process takes part in every program, so each needs devices in it: all of them,
        # the runs padded (the padding's results are dropped).
        return tuple(devices)
    per_device = -(-count // len(devices))
    return tuple(devices[: -(-count // per_device)])


def spread(fun, devices: tuple | None, split: tuple, whole: tuple = ()):
    """``fun(*split, *whole)``, with the leading axis of every array in ``split`` (one axis of
    independent runs, the same length throughout) divided evenly over ``devices`` by
    ``shard_map``; ``whole`` is given to every device as it is. The axis is padded with copies of
    its last entry to a multiple of the device count, and those results are dropped. With one
    device (or None) this is just the call. Use it inside ``jit`` with ``devices`` static."""
    if devices is None or len(devices) <= 1:
        return fun(*split, *whole)
    count = jax.tree_util.tree_leaves(split)[0].shape[0]
    pad = -count % len(devices)
    padded = jax.tree_util.tree_map(
        lambda x: jnp.concatenate([x, jnp.repeat(x[-1:], pad, axis=0)]) if pad else x, split
    )
    mesh = Mesh(np.asarray(devices), ("runs",))
    out = _shard_map(
        fun, mesh=mesh, in_specs=(P("runs"),) * len(split) + (P(),) * len(whole), out_specs=P("runs"),
    )(*padded, *whole)
    # The results are gathered onto every device (an all-gather of run states, small beside a
    # chunk's steps), so each process can read them: across hosts, an array split over other
    # processes' devices cannot be fetched.
    replicated = NamedSharding(mesh, P())
    return jax.tree_util.tree_map(lambda x: jax.lax.with_sharding_constraint(x[:count], replicated), out)


def local(tree):
    """``tree`` on this process's first device: arrays that span several processes' devices
    (results replicated by :func:`spread` or by a run over a multi-host mesh) are fetched from
    this process's copy; others are moved device to device. What the host-side loops hold between
    chunks, so that it mixes with the rest of the fit's arrays."""
    here = jax.local_devices()[0]

    def move(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return jax.device_put(np.asarray(x), here)
        return jax.device_put(x, here)

    return jax.tree_util.tree_map(move, tree)


def replicate(tree, devices: tuple):
    """``tree`` copied onto every one of ``devices``, the input of a chunk that spans them. Across
    processes each one supplies its own (identical) copy, as JAX's multi-controller model asks;
    arrays are not sent between hosts."""
    sharding = NamedSharding(Mesh(np.asarray(devices), ("runs",)), P())
    if jax.process_count() == 1:
        return jax.device_put(tree, sharding)
    return jax.tree_util.tree_map(lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x)), tree)


def local_devices(devices: tuple) -> tuple:
    """Those of ``devices`` this process can run work on by itself (all of them on one host)."""
    mine = {d.id for d in jax.local_devices()}
    return tuple(d for d in devices if d.id in mine) or tuple(jax.local_devices()[:1])


def run_mesh(devices: tuple | None, particles: int = 1) -> Mesh | None:
    """The ``particles × data`` mesh one run's steps are partitioned over, or None on one device.

    The particle axis takes the largest share of the devices that divides the number of
    particles (the draws then split evenly); the data axis takes the rest."""
    devices = available(devices)
    if len(devices) <= 1:
        return None
    along_particles = math.gcd(max(int(particles), 1), len(devices))
    return Mesh(np.asarray(devices).reshape(along_particles, len(devices) // along_particles), ("particles", "data"))


@contextlib.contextmanager
def constrained(mesh: Mesh | None):
    """While tracing the body, :func:`shard_rows` and :func:`shard_particles` constrain to ``mesh``
    (with None they do nothing). The mesh must also be a static argument of the compiled function,
    so that a program traced for one mesh is never reused for another."""
    token = _MESH.set(mesh)
    try:
        yield
    finally:
        _MESH.reset(token)


def _constrain(tree, axis: str):
    mesh = _MESH.get()
    if mesh is None or mesh.shape[axis] == 1:
        return tree
    return jax.tree_util.tree_map(
        lambda x: jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(axis))) if jnp.ndim(x) else x, tree
    )


def shard_rows(tree):
    """Every array of ``tree`` (data rows on the leading axis) split over the mesh's data axis."""
    return _constrain(tree, "data")


def shard_particles(draws):
    """The guide's draws (particles on the leading axis) split over the mesh's particle axis."""
    return _constrain(draws, "particles")
