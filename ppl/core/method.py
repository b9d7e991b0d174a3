"""What every method shares: the options dataclass base and option parsing for the CLI."""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import ClassVar

import numpy as np

from ppl.core.errors import MemoryBudgetError, OptionError, did_you_mean

__all__ = [
    "Method",
    "check_choice",
    "check_init_posterior",
    "check_positive_int",
    "check_positive",
    "check_option_types",
    "check_stored_draws",
    "check_dense_matrix",
    "MEMORY_BUDGET_BYTES",
]

# What one request (stored draws, a dense matrix) may take before it is refused up front.
MEMORY_BUDGET_BYTES = 4 * 2**30
MAX_INT_OPTION = 2**31


@dataclasses.dataclass(frozen=True)
class Method:
    """A method is a frozen, hashable options dataclass with ``run(key, problem) -> Posterior``.

    Subclasses set ``name`` and ``description`` and declare their options as dataclass fields with
    defaults; ``__post_init__`` validates them (raising :class:`ppl.OptionError`).
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    # What the result's draws are (one of ppl.core.results.POSTERIOR_KINDS); the diagnostics read it.
    kind: ClassVar[str] = ""
    # Whether the method serves models with local latents (a VAE's per-datum z) as a whole.
    supports_local: ClassVar[bool] = False
    # Options that, when set, fit a changed model (Laplace's prior_precision replaces the declared
    # prior): the run is then recorded and judged as the posterior of the model actually used.
    model_options: ClassVar[tuple] = ()
    # What the loss in the result's trace is, for the figures that plot it.
    loss_label: ClassVar[str] = "loss"
    # Whether a run can be checkpointed and resumed (``ppl.fit``'s ``checkpoint_every`` and
    # ``resume``): its loops write their state through the session. A method computed in one step, or
    # whose inner runs are not worth resuming, says False and fit refuses those options for it.
    resumable: ClassVar[bool] = False

    def __post_init__(self):
        check_option_types(self)

    @classmethod
    def saved_kinds(cls, options: dict, model_fields: dict) -> tuple:
        """The posterior kinds a run with ``options`` (as saved) of a model whose saved record has
        ``model_fields`` can produce: what the loader lets a saved run claim. A method whose
        options change the kind (svi with a point-mass guide) overrides this."""
        return (cls.kind,)

    @classmethod
    def remedy(cls, posterior, topic: str) -> str:
        """What to try when a check fails, in the method's own options. ``topic``: ``"fit"`` (the
        approximation misses the posterior: k-hat), ``"mixing"`` (R-hat or ESS), ``"steps"`` (the
        optimisation did not converge), ``"temperature"`` (SG-MCMC draws hotter than the target), ``"cold"`` (colder: too concentrated), ``"heldout"`` (the predictive fails on held-out rows), ``"heldout_wide"`` (its intervals are wider than the held-out errors). Methods override it with advice about their options."""
        if topic == "fit":
            return "try method='nuts' (or a richer approximation)"
        if topic == "mixing":
            return extended_remedy(posterior, "raise num_warmup and num_samples (or lower step_size)")
        if topic == "temperature":
            return "lower step_size, raise batch_size, or use method='nuts' (its Metropolis test corrects the step)"
        if topic == "cold":
            return "raise num_warmup (the chains may not have spread out from where they started), or use method='nuts'"
        if topic == "heldout":
            return (
                "the fit over-fits its training rows (a noise scale shrunk to the training residual, or a prior too weak "
                "for the data) or did not reach its posterior: compare method='nuts', or set a stronger prior"
            )
        if topic == "heldout_wide":
            return (
                "the spread exceeds the held-out errors (a Gaussian noise scale fitted to heavy-tailed residuals, or "
                "members or draws that disagree more than the data warrant): compare method='map' or 'laplace', and for "
                "intervals with guaranteed coverage calibrate them on held-out rows with ppl.conformal(post, (X, y), "
                "seed=0) (ppl calibrate RUN --data ROWS --alpha 0.1)"
            )
        steps = (posterior.options or {}).get("steps")
        return f"raise steps{f' (now {steps})' if steps else ''}, or adjust learning_rate"

    @classmethod
    def round_length(cls, posterior) -> int | None:
        """Steps in one round of a run that is judged in rounds (the loss figure marks where each new
        round began), or None. Most optimisers run rounds of ``steps``."""
        steps = (posterior.options or {}).get("steps")
        return steps if isinstance(steps, int) and not isinstance(steps, bool) else None

    @classmethod
    def remeasure(cls, posterior, key):
        """The loaded run ``posterior`` with what the run measured at its draws and its verdict
        reads measured again (``key``: the run's own, from its seed), in place of the stored numbers:
        loading never trusts a stored verdict or a number that decides one. Most methods store none
        and return it as it is."""
        return posterior

    def stored_draws(self) -> int:
        """How many draws of the flat parameter vector the result will hold (for the memory check).
        A sampler that extends its run (``time_budget``) may end with more; see ``_extend``."""
        return 1

    def run(self, key, problem, session=None):  # pragma: no cover - abstract
        """The Posterior of ``problem``. ``session`` (a ``ppl.core.checkpoint.Session``; None: a default
        one) is the run's context: checkpoints and the state to resume from, the devices, the
        progress display and the stop request; every loop the method runs receives it (or, for a run
        inside the method, ``session.inner()``)."""
        raise NotImplementedError

    def check(self, problem) -> None:
        """Method-specific checks against the problem, before anything is compiled."""

    @classmethod
    def option_defaults(cls) -> dict:
        return {f.name: f.default for f in dataclasses.fields(cls)}

    @classmethod
    def parse_option(cls, key: str, text: str):
        """Convert ``--set key=text`` to the option's declared type."""
        hints = typing.get_type_hints(cls)
        if key not in hints:
            raise OptionError(f"{cls.name} has no option {key!r}{did_you_mean(key, cls.option_defaults())}; valid options: "
                              f"{', '.join(cls.option_defaults())}")
        return parse_value(text, hints[key], f"{cls.name} option {key}")

    def as_dict(self) -> dict:
        """The options as a JSON-able record; an option holding a fitted Posterior (``init=``) is
        described in words (its method, seed and size), not stored."""
        return {f.name: _describe(getattr(self, f.name)) for f in dataclasses.fields(self)}


def _describe(value):
    flat = getattr(value, "flat_draws", None)
    if flat is None or not hasattr(value, "method"):
        return value
    draws = np.asarray(flat)
    return (
        f"{value.method} posterior (seed {value.seed}, {draws.shape[0]} chain(s) × {draws.shape[1]} draw(s) of "
        f"{draws.shape[2]} parameters, mean |θ| {np.abs(draws).mean():.6g})"
    )


def parse_value(text: str, hint, where: str):
    args = typing.get_args(hint)
    optional = type(None) in args
    if optional and text.lower() in ("none", "null"):
        return None
    base = next((a for a in args if a is not type(None)), hint) if args else hint
    try:
        if base is bool:
            if text.lower() in ("true", "1", "yes"):
                return True
            if text.lower() in ("false", "0", "no"):
                return False
            raise ValueError(text)
        if base is int:
            return int(text)
        if base is float:
            return float(text)
        if typing.get_origin(base) is tuple or base is tuple:
            if text.strip() == "()":
                return ()  # said outright: no entries (a VAE's linear decoder, decoder_hidden=())
            parts = text.split(",")
            if len(parts) > 1 and not parts[-1].strip() and parts[-2].strip():
                parts = parts[:-1]  # "32," is (32,), as Python spells a one-entry tuple
            if not all(part.strip() for part in parts):
                # An empty entry was dropped before, so "hidden=," quietly built a network without
                # hidden layers while "hidden=0" is refused.
                raise OptionError(
                    f"{where}: {text!r} has an empty entry; give comma-separated integers such as 32,32 "
                    "(or () for none)"
                )
            return tuple(int(part) for part in parts)
        return text
    except OptionError:
        raise
    except ValueError:
        raise OptionError(f"{where}: cannot read {text!r} as {getattr(base, '__name__', base)}") from None


def check_init_posterior(method: str, init, problem, what: str, kinds: tuple = (), chains: int | None = None) -> None:
    """A Posterior given as ``init=`` must be of this model (the same sites and shapes), of one of
    ``kinds`` (any when empty) and, when given, have ``chains`` chains; else an OptionError that says
    ``what`` was expected and what was given."""
    theirs = None if init.problem is None else [(s.name, s.shape) for s in init.problem.sites]
    ours = [(s.name, s.shape) for s in problem.sites]
    if theirs != ours or (kinds and init.kind not in kinds) or (chains is not None and init.num_chains != chains):
        raise OptionError(
            f"{method}: init must be {what} (sites {ours}); got a {init.method!r} Posterior ({init.kind}, "
            f"{init.num_chains} chain(s)) with sites {theirs}"
        )


def check_choice(method: str, option: str, value, choices) -> None:
    if value not in choices:
        raise OptionError(f"{method}: {option}={value!r} is not one of {', '.join(map(repr, choices))}"
                          f"{did_you_mean(value, choices)}")


def check_positive_int(method: str, option: str, value, allow_zero: bool = False) -> None:
    low = 0 if allow_zero else 1
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < low:
        raise OptionError(f"{method}: {option} must be an integer ≥ {low}, got {value!r}")


def check_positive(method: str, option: str, value) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float, np.integer, np.floating))
        or not math.isfinite(float(value))
        or not value > 0
    ):
        raise OptionError(f"{method}: {option} must be a positive finite number, got {value!r}")


def _type_name(kind) -> str:
    return {bool: "True or False", int: "an integer", float: "a finite number", str: "a string"}.get(
        kind, getattr(kind, "__name__", str(kind))
    )


def check_option_types(options) -> None:
    """Every option of a method dataclass has its declared type, and every number is finite.

    ``dense_mass="no"`` would otherwise read as True, ``target_accept="high"`` fail deep inside a
    comparison, and ``trajectory_length=inf`` hang the sampler.
    """
    cls = type(options)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        value = getattr(options, f.name)
        hint = hints.get(f.name)
        args = typing.get_args(hint)
        optional = type(None) in args
        kinds = [a for a in args if a is not type(None)] if args else [hint]
        if value is None and optional:
            continue
        kind = kinds[0] if len(kinds) == 1 else None
        where = f"{cls.name}: option {f.name}"
        if kind is bool:
            if not isinstance(value, (bool, np.bool_)):
                raise OptionError(f"{where} must be True or False, got {value!r}")
        elif kind is int:
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
                raise OptionError(f"{where} must be an integer, got {value!r}")
            if not -MAX_INT_OPTION < int(value) < MAX_INT_OPTION:
                # Step counters are 32-bit integers inside the compiled loops.
                raise OptionError(f"{where} must be below 2**31, got {value!r}")
        elif kind is float:
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise OptionError(f"{where} must be a number, got {value!r}")
            try:
                finite = math.isfinite(float(value))
            except OverflowError:  # an int beyond float range, e.g. 10**400
                finite = False
            if not finite:
                raise OptionError(f"{where} must be finite, got {value!r}")
        elif kind is str:
            if not isinstance(value, str):
                raise OptionError(f"{where} must be a string, got {value!r}")
        elif kind is not None and kind not in (typing.Any,) and isinstance(kind, type):
            if not isinstance(value, kind):
                raise OptionError(f"{where} must be {_type_name(kind)}, got {value!r}")


def check_stored_draws(method: str, num_draws: int, num_params: int, itemsize: int, num_deterministic: int = 0) -> None:
    """Refuse a result whose stored draws would not fit in memory, before anything runs. A plain
    program's ``numpyro.deterministic`` values are stored with every draw and count too."""
    size = int(num_draws) * (int(num_params) + int(num_deterministic)) * int(itemsize)
    if size > MEMORY_BUDGET_BYTES:
        extra = (
            f" and {num_deterministic} values of numpyro.deterministic sites (record fewer or smaller ones)"
            if num_deterministic else ""
        )
        raise MemoryBudgetError(
            f"{method}: storing {num_draws} draws × {num_params} parameters{extra} needs {size / 2**30:.1f} GiB "
            f"(limit {MEMORY_BUDGET_BYTES / 2**30:.0f} GiB); lower num_draws/num_samples or num_chains, or "
            "keep fewer draws (a density method samples more later with post.sample)"
        )


def check_dense_matrix(method: str, what: str, dim: int, itemsize: int, *, copies: int = 1, alternatives: str) -> None:
    """Refuse a dense ``dim × dim`` matrix (covariance, mass matrix) that would not fit in memory."""
    size = int(copies) * int(dim) ** 2 * int(itemsize)
    if size > MEMORY_BUDGET_BYTES:
        raise MemoryBudgetError(
            f"{method}: {what} over {dim} parameters needs {size / 2**30:.1f} GiB "
            f"({copies} × {dim}² × {itemsize} bytes; limit {MEMORY_BUDGET_BYTES / 2**30:.0f} GiB); use {alternatives}"
        )


def extended_remedy(posterior, advice: str) -> str:
    """``advice`` for a chain that failed to mix, preceded by how far the run extended itself and
    why it stopped (see ``ppl.core.extend``), when it could."""
    info = getattr(posterior, "info", None) or {}
    stop = info.get("extension_stop")
    if not isinstance(stop, str) or stop in ("off", "not needed", "passed"):
        return advice
    rounds = info.get("extension_rounds")
    ran = f"the run extended itself to {rounds} × num_samples draws per chain and " if isinstance(rounds, int) and rounds > 1 else "the run "
    return f"{ran}stopped on its {stop} — raise time_budget, or {advice}"
