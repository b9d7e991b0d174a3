"""A saved verdict, derived again from the saved values: what loading does where it cannot recompute.

``ppl.load`` recomputes a run's diagnostics from its stored draws whenever the model is at hand.
A run of a plain NumPyro program loaded without its program (and ``ppl show`` of a Network's run,
whose forward pass is never imported) cannot run the model, so its ``diagnostics.json`` is all
there is. Its numbers are then taken as the record of what was measured, but nothing *judged* is
read: every check's ``passed`` is decided again from its value with this version's thresholds,
``ok`` is their conjunction, the warnings are the failed checks' messages, and the checks that
must be there for this kind of run (how it ended, its draws, its sampler's divergences, its
k-hat) must be there. A check whose value contradicts the record's own field, the run records in
``posterior.json`` or the stored draws is a :class:`ppl.RunError` naming the file and the field.

What the stored arrays do determine is measured again rather than read: a plain program's run
stores its draws, so its chain checks (R-hat, ESS in weight or function space, stuck chains) are
computed from them by the code that computes them for a loaded run (:func:`measure_chains`), and
E-BFMI comes from the stored energies. A saved value that differs from the measurement, or a chain
check the draws do not call for (or one missing that they do), was edited. Only what needs the
model itself (a density run's k-hat, ELBO) is still taken from the file.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from ppl.core.errors import RunError
from ppl.core.method import Method
from ppl.core.registry import METHODS, get
from ppl.core.results import THRESHOLDS, Check, Diagnostics, finite_or_none
from ppl.diagnostics.dispersion import THRESHOLD
from ppl.diagnostics.heldout import LEVEL, coverage_range
from ppl.diagnostics.report import MOMENT_SES, MOMENT_SHIFT, SD_RATIO, chain_checks, Findings, ebfmi

__all__ = ["rederive", "measure_chains"]

_UPPER = {  # value ≤ threshold passes
    "rhat_max": lambda n: THRESHOLDS["rhat"], "rhat_function_max": lambda n: THRESHOLDS["rhat"],
    "divergences": lambda n: THRESHOLDS["divergences"], "variance_inflation": lambda n: THRESHOLDS["variance_inflation"],
    "draws": lambda n: 0, "stuck_chains": lambda n: 0,
    "khat": lambda n: min(1.0 - 1.0 / math.log10(n), 0.7) if n > 1 else None,
}
_LOWER = {  # value ≥ threshold passes (n: chains, for the ESS thresholds per chain)
    "ess_bulk_min": lambda n: THRESHOLDS["ess_per_chain"] * n, "ess_tail_min": lambda n: THRESHOLDS["ess_per_chain"] * n,
    "function_ess_bulk_min": lambda n: THRESHOLDS["ess_per_chain"] * n,
    "function_ess_tail_min": lambda n: THRESHOLDS["ess_per_chain"] * n,
    "ebfmi_min": lambda n: THRESHOLDS["ebfmi"],
    "dispersion_min": lambda n: _dispersion_threshold(),
}
# checks whose value is also a field of the record: the two must agree
_MIRRORED = ("rhat_max", "rhat_function_max", "divergences", "ebfmi_min", "khat", "dispersion_min", "psis_mean_shift",
             "psis_sd_ratio")


def _dispersion_threshold() -> float:
    return THRESHOLD


def _moment_bounds(field: str, value: float) -> tuple:
    """The thresholds a PSIS moment check can have: its base bound widened by at most MOMENT_SES
    standard errors of √Σw² ≤ 1 (the weights themselves need the model, so the saved threshold is
    held to that range and the value to the saved threshold)."""
    if field == "psis_mean_shift":
        return MOMENT_SHIFT, MOMENT_SHIFT + MOMENT_SES
    if value < 1:
        return SD_RATIO[0] * math.exp(-MOMENT_SES), SD_RATIO[0]
    return SD_RATIO[1], SD_RATIO[1] * math.exp(MOMENT_SES)


# the chain checks and the record fields that measure_chains computes from the stored draws
_CHAIN_CHECKS = ("rhat_max", "rhat_function_max", "ess_bulk_min", "ess_tail_min", "function_ess_bulk_min",
                 "function_ess_tail_min", "stuck_chains", "num_draws")
_CHAIN_RECORD = ("rhat_max", "rhat_function_max", "ess_bulk_min", "ess_tail_min")


def _same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and (a == b or (math.isnan(a) and math.isnan(b)))
    return a == b


def _measured_same(saved, measured) -> bool:
    """A saved figure against the same figure computed again: equal up to rounding (another numpy
    or ArviZ version may differ in the last bits), counts exactly; a bool or a string never matches."""
    if measured is None or saved is None or isinstance(saved, bool) or not isinstance(saved, (int, float)):
        return saved is None and measured is None
    if isinstance(measured, int):
        return not isinstance(saved, float) and saved == measured
    return math.isclose(saved, measured, rel_tol=1e-6, abs_tol=1e-9) or (math.isinf(saved) and saved == measured)


def measure_chains(*, method: str, options: dict, info: dict, draws: dict, latent: tuple, function_sites: tuple,
                   flat_draws) -> Diagnostics:
    """The chain checks of a plain program's run (kind "chains"), computed from its stored draws:
    ``draws`` by site (constrained, as saved), ``latent`` the names of its latent sites,
    ``flat_draws`` (chain, draw, parameter). The same function as for a loaded run makes them, on a
    stand-in holding what it reads, so the two cannot drift apart."""
    flat = np.asarray(flat_draws)
    chains, count = int(flat.shape[0]), int(flat.shape[1])
    functions = None
    if function_sites:
        functions = np.concatenate([np.asarray(draws[name]).reshape(chains, count, -1) for name in function_sites], axis=-1)
    stand_in = SimpleNamespace(
        method=method, options=options, info=info, num_chains=chains, num_draws=count, flat_draws=flat,
        latent_draws={name: draws[name] for name in latent}, function_draws=lambda: functions,
        problem=SimpleNamespace(is_declarative=False, function_sites=tuple(function_sites)),
    )
    stand_in.remedy = lambda topic: (get(method) if method in METHODS else Method).remedy(stand_in, topic)
    record = Diagnostics(method=method, num_chains=chains, num_draws=count)
    nonfinite = int(np.sum(~np.all(np.isfinite(flat), axis=-1)))
    chain_checks(stand_in, Findings(record), nonfinite)
    return record


def rederive(record: Diagnostics, *, kind: str, records: dict, flat_draws, where: str,
             measured: Diagnostics | None = None, heldout_targets: int | None = None) -> Diagnostics:
    """``record`` (read from ``where``) with ``passed``, ``ok`` and the warnings decided again.

    ``records``: the run's checked records (status, trace, chain_stats, evidence); ``flat_draws``:
    the stored draws (chain, draw, parameter), whose count of non-finite draws the ``draws`` check
    must state; ``measured``: the chain checks computed again from the stored draws
    (:func:`measure_chains`; None where the run does not store what they need, a Network's run);
    ``heldout_targets``: the number of held-out targets stored with the run (None: none stored),
    which the coverage check's bounds depend on. The held-out figures themselves need the model's
    predictive and are taken from the record; what they are held to is decided again.
    """

    def fail(field: str, why: str) -> RunError:
        return RunError(f"{where}: check {field!r} {why} — the file was edited; delete it and run again, or load the "
                        "run with its model so its diagnostics are recomputed from the draws")

    status, trace, stats = records["status"], records["trace"], records["chain_stats"]
    total = record.num_chains * record.num_draws
    nonfinite = int(np.sum(~np.all(np.isfinite(flat_draws), axis=-1)))
    facts = {  # what the run itself says each check's value is
        "draws": nonfinite, "status.failed": status.failed or None, "status.interrupted": status.interrupted,
        "status.converged": status.converged,
        "divergences": None if stats is None else stats.divergences,
        "variance_inflation": None if stats is None else stats.variance_inflation,
        "temperature": None if stats is None else stats.temperature,
    }

    energy = None if stats is None else stats.energy
    if energy is not None and np.shape(energy)[-1] >= 2:
        # the stored energies give E-BFMI: a saved value (and its mirror) edited to pass is caught
        facts["ebfmi_min"] = finite_or_none(np.min(ebfmi(np.asarray(energy, dtype=float))))
    if trace is not None and trace.kl_warmup:
        # the KL warm-up check's value is the steps the run made, which its records state
        facts["trace.kl_warmup"] = int(status.steps_done if status.steps_done is not None else np.shape(trace.losses)[-1])
    required = {"draws", "status.failed", "status.interrupted"}
    required |= {field for field in ("ebfmi_min", "trace.kl_warmup") if facts.get(field) is not None}
    if measured is not None:
        # Measured again from the stored draws: the saved figures must be these, and exactly the
        # chain checks these draws call for must be there (a dropped ESS check would drop its failure).
        for field in _CHAIN_RECORD:
            if not _measured_same(getattr(record, field), getattr(measured, field)):
                raise fail(field, f"is {getattr(record, field)!r} in the record where the stored draws give "
                                  f"{getattr(measured, field)!r}")
        made = {check.field: check.value for check in measured.checks}
        for check in record.checks:
            if check.field in _CHAIN_CHECKS and check.field not in made:
                raise fail(check.field, "is there although the stored draws do not call for it")
            if check.field in made and not _measured_same(check.value, made[check.field]):
                raise fail(check.field, f"states {check.value!r} where the stored draws give {made[check.field]!r}")
        required |= set(made)
    if status.converged is not None:
        required.add("status.converged")
    if nonfinite == 0:
        if stats is not None and stats.diverging is not None:
            required.add("divergences")
        if stats is not None and stats.variance_inflation is not None:
            required.add("variance_inflation")
        if stats is not None and stats.temperature is not None:
            required.add("temperature")
        if kind == "chains":
            required.add("num_draws" if record.num_draws < 4 else "stuck_chains")
        for field in _MIRRORED:
            if getattr(record, field) is not None and not (field == "rhat_max" and record.rhat_function_max is not None):
                required.add(field)
        if heldout_targets is not None:
            required.add("heldout_ll")
            if record.heldout_coverage_90 is not None:
                required.add("heldout_coverage_90")
    seen, checks, messages = set(), [], {c.message for c in record.checks if c.message}
    for check in record.checks:
        field = check.field
        if field in seen:
            raise fail(field, "appears twice")
        seen.add(field)
        if field in facts and not (_measured_same if field == "ebfmi_min" else _same)(check.value, facts[field]):
            raise fail(field, f"states {check.value!r} where the run's own records and draws give {facts[field]!r}")
        if field in _MIRRORED and not _same(check.value, getattr(record, field)):
            raise fail(field, f"states {check.value!r} but the record's {field} is {getattr(record, field)!r}")
        value = check.value
        if field in _UPPER or field in _LOWER:
            threshold = (_UPPER.get(field) or _LOWER[field])(total if field == "khat" else record.num_chains)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or threshold is None:
                raise fail(field, f"holds {value!r}, which is not a number to hold to a threshold")
            passed = value <= threshold if field in _UPPER else value >= threshold
            passed = bool(passed) and not math.isnan(value)
            shown = f"{field} = {value:.4g} against the threshold {threshold:.4g}"
        elif field == "temperature":
            if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value):
                raise fail(field, f"holds {value!r}, which is not a number to hold to a threshold")
            threshold = THRESHOLDS["temperature"] if value >= 1.0 else THRESHOLDS["temperature_low"]
            passed = THRESHOLDS["temperature_low"] <= value <= THRESHOLDS["temperature"]
            shown = (f"{field} = {value:.4g} outside [{THRESHOLDS['temperature_low']:g}, "
                     f"{THRESHOLDS['temperature']:g}]")
        elif field in ("psis_mean_shift", "psis_sd_ratio"):
            threshold = check.threshold
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) \
                    or not isinstance(threshold, (int, float)):
                raise fail(field, f"holds {value!r} against {threshold!r}, which are not numbers to compare")
            low, high = _moment_bounds(field, value)
            if not low - 1e-12 <= threshold <= high + 1e-12:
                raise fail(field, f"has the threshold {threshold!r}, outside the {low:.4g}–{high:.4g} it can take")
            passed = value >= threshold if field == "psis_sd_ratio" and value < 1 else value <= threshold
            shown = f"{field} = {value:.4g} against the threshold {threshold:.4g}"
        elif field in ("heldout_ll", "heldout_coverage_90"):
            if heldout_targets is None:
                raise fail(field, "is there although the run stores no held-out rows")
            if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value):
                raise fail(field, f"holds {value!r}, which is not a number to hold to a threshold")
            if field == "heldout_ll":
                # the record keeps a finite log-likelihood only; -inf (a target the predictive rules out) is None there
                if not _same(float(value), record.heldout_ll if record.heldout_ll is not None else float("-inf")):
                    raise fail(field, f"states {value!r} but the record's heldout_ll is {record.heldout_ll!r}")
                threshold = record.heldout_baseline_ll
                if not isinstance(threshold, (int, float)) or isinstance(threshold, bool) or not math.isfinite(threshold):
                    raise fail(field, f"is held to the baseline {threshold!r}, which is not a finite number")
                passed = value >= threshold
                shown = f"held-out log-likelihood {value:.4g} per row, below the trivial baseline's {threshold:.4g}"
            else:
                if not _same(float(value), record.heldout_coverage_90) or not 0.0 <= value <= 1.0:
                    raise fail(field, f"states {value!r} but the record's heldout_coverage_90 is "
                                      f"{record.heldout_coverage_90!r}")
                low, high = coverage_range(heldout_targets)
                threshold = high if value > LEVEL else low
                passed = low <= value <= high
                shown = f"held-out 90% coverage {value:.4g} outside the {low:.4g}–{high:.4g} allowed for {heldout_targets} targets"
        elif field == "num_draws":
            threshold, passed, shown = 4, False, f"only {value} draw(s) per chain: too few to assess convergence"
        elif field == "status.failed":
            threshold, passed, shown = None, not value, f"the run failed: {value}"
        elif field == "status.interrupted":
            threshold, passed, shown = None, value is False, "the run was interrupted: a partial result"
        elif field == "status.converged":
            threshold, passed, shown = None, value is True, "the optimisation did not converge"
        elif field == "trace.kl_warmup":
            threshold = None if trace is None else trace.kl_warmup
            if threshold is None or not isinstance(value, int) or isinstance(value, bool):
                raise fail(field, "is there although the run records no KL warm-up")
            passed, shown = value >= threshold, f"the run stopped during KL warm-up (step {value} of {threshold})"
        else:
            raise fail(field, "is not a check this version of ppl makes")
        message = "" if passed else (check.message or f"{shown} (decided again on load from the saved value)")
        checks.append(Check(field, value, threshold, bool(passed), message))
    missing = sorted(required - seen)
    if missing:
        raise fail(missing[0], "is missing although it applies to this run")
    failed = [c.message for c in checks if not c.passed]
    # advisory warnings (tree depth, unreliable LOO) fail nothing and are kept as they were saved
    advisory = [w for w in record.warnings if w not in messages]
    return Diagnostics(**{**record.__dict__, "checks": checks, "ok": not failed, "warnings": failed + advisory})
