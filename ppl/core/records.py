"""Typed run records: what a method reports about its run, in the fields the diagnostics, the
command line and saving read.

A method fills the records that apply to it and leaves the others None; ``Posterior.info`` keeps
only what is particular to one method (its guide's name, a Laplace prior precision, SWAG's
snapshot count) and is never read by shared code. Each record is a NamedTuple (immutable; build a
changed copy with ``_replace``), and saving checks every field against the types declared here.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

__all__ = ["RunStatus", "TrainingTrace", "ChainStats", "Evidence", "RECORDS"]


class RunStatus(NamedTuple):
    """How the run ended. Every Posterior has one (``posterior.status``).

    ``converged`` is None for methods that do not optimise; ``convergence`` then is empty.
    ``steps_done`` counts optimisation steps (optimisers) or stored draws per chain (SG-MCMC,
    ``mh``); ``chains_done`` counts finished NUTS/HMC chains.
    """

    interrupted: bool = False  # stopped before its planned work was done (Ctrl-C): a partial result
    failed: str = ""  # the error that stopped it; the draws are then its last finite state
    steps_done: int | None = None
    chains_done: int | None = None
    converged: bool | None = None
    convergence: str = ""  # why it did not converge, or "settled"


class TrainingTrace(NamedTuple):
    """An optimisation's loss curve and the figures its convergence verdict used.

    ``losses`` is (steps,), or (members, steps) for an ensemble's members trained together.
    The figures are those of :func:`ppl.inference.optimize.loss_convergence` (None where a test
    did not apply); for an ensemble they are the worst member's.
    """

    losses: np.ndarray
    final_loss: float | None = None
    loss_slope: float | None = None
    loss_slope_se: float | None = None
    loss_noise: float | None = None
    grad_norm: float | None = None  # full-batch gradient norm at the end (deterministic objectives)
    gradient_t_max: float | None = None  # stationarity of a stochastic objective
    kl_warmup: int | None = None  # steps over which the KL/prior side was ramped up (svi)


class ChainStats(NamedTuple):
    """Per-transition statistics of Markov chains (each array (chain, draw), per chain or a number).

    NUTS/HMC fill the Hamiltonian fields; SG-MCMC records its step size, the predicted
    stationary-variance inflation of its discretisation and gradient noise, and the configurational
    temperature measured at its draws (1 for draws from the target; above 1, too spread out);
    ``mh`` its acceptance rate and proposal scale per chain.
    """

    accept_prob: np.ndarray | None = None
    diverging: np.ndarray | None = None
    num_steps: np.ndarray | None = None
    energy: np.ndarray | None = None
    step_size: np.ndarray | None = None
    max_tree_depth: int | None = None
    leapfrog_cap: int | None = None  # HMC's cap on leapfrog steps per transition
    variance_inflation: float | None = None
    temperature: float | None = None

    @property
    def divergences(self) -> int | None:
        return None if self.diverging is None else int(np.sum(self.diverging))

    @property
    def tree_depth_hits(self) -> int | None:
        """Transitions whose tree reached ``max_tree_depth`` (NUTS)."""
        if self.max_tree_depth is None or self.num_steps is None:
            return None
        return int(np.sum(np.asarray(self.num_steps) >= 2**self.max_tree_depth - 1))

    @property
    def leapfrog_cap_hits(self) -> int | None:
        """Transitions cut at ``leapfrog_cap`` leapfrog steps (HMC)."""
        if self.leapfrog_cap is None or self.num_steps is None:
            return None
        return int(np.sum(np.asarray(self.num_steps) >= self.leapfrog_cap))


class Evidence(NamedTuple):
    """Bounds on or values of log p(D) the method computed itself.

    ``log_evidence``: exact (a closed form) or the Laplace estimate. ``elbo``/``iwae``: estimates
    made after training for a model with local latents (whose bounds the diagnostics cannot form
    from the global draws alone). ``closed_form``: the approximation is the exact posterior.
    """

    log_evidence: float | None = None
    elbo: float | None = None
    iwae: float | None = None
    closed_form: bool = False


class RunRecord(NamedTuple):
    """How a run was produced, which ``ppl.fit`` (or the loader) passes to the method's result: the
    seed as printed, the method's options, the wall time, what a resumed run must share with it
    (``fingerprint``), what ran (``provenance``: the model with its settings, the data's size and
    source, package versions) and the number of devices it ran on."""

    seed: object = None
    options: dict | None = None
    wall_time_s: float = 0.0
    fingerprint: str | None = None
    provenance: dict | None = None
    devices: int = 1


# name on Posterior -> record type, in the order they are saved
RECORDS = {"status": RunStatus, "trace": TrainingTrace, "chain_stats": ChainStats, "evidence": Evidence}

_ARRAY_FIELDS = {("trace", "losses"), ("chain_stats", "accept_prob"), ("chain_stats", "diverging"),
                 ("chain_stats", "num_steps"), ("chain_stats", "energy"), ("chain_stats", "step_size")}
_SCALAR_TYPES = {
    "bool": (bool,), "bool | None": (bool, type(None)), "str": (str,), "int | None": (int, type(None)),
    "float | None": (int, float, type(None)),
}


def is_array_field(record: str, name: str) -> bool:
    return (record, name) in _ARRAY_FIELDS


def scalar_types(record: str, name: str) -> tuple:
    """The JSON types a saved scalar field may have (booleans are not ints here)."""
    declared = RECORDS[record].__annotations__[name]
    return _SCALAR_TYPES[getattr(declared, "__forward_arg__", declared)]


def to_saved(record: str, value) -> tuple[dict, dict]:
    """(JSON scalars, arrays) of one record for saving."""
    scalars, arrays = {}, {}
    for name, field in value._asdict().items():
        if is_array_field(record, name):
            if field is not None:
                arrays[name] = np.asarray(field)
        elif isinstance(field, (float, np.floating)) and not math.isfinite(float(field)):
            scalars[name] = {"float": "nan" if field != field else ("inf" if field > 0 else "-inf")}
        else:
            scalars[name] = field.item() if isinstance(field, np.generic) else field
    return scalars, arrays


def from_saved(record: str, scalars: dict, arrays: dict, fail) -> NamedTuple:
    """Rebuild one record from what :func:`to_saved` wrote; ``fail(field, expected, value)``
    returns the error to raise for a field of the wrong type or an unknown one."""
    cls = RECORDS[record]
    values = {}
    for name, value in scalars.items():
        if name not in cls._fields or is_array_field(record, name):
            raise fail(f"{record}.{name}", f"one of the fields of {cls.__name__}", name)
        if isinstance(value, dict) and set(value) == {"float"} and value["float"] in ("nan", "inf", "-inf"):
            value = float(value["float"])
        kinds = scalar_types(record, name)
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise fail(f"{record}.{name}", " or ".join(k.__name__ for k in kinds), value)
        values[name] = value
    for name, value in arrays.items():
        if not is_array_field(record, name):
            raise fail(f"{record}.{name}", f"one of the array fields of {cls.__name__}", name)
        if value.dtype.kind not in "biuf":
            raise fail(f"{record}.{name}", "a numeric array", str(value.dtype))
        values[name] = value
    missing = [name for name in cls._fields if name not in values and name not in cls._field_defaults]
    if missing:
        # a required field (a trace's losses) dropped from the file: refused, not a TypeError from cls()
        raise fail(f"{record}.{missing[0]}", "present (it has no default)", None)
    return cls(**values)
