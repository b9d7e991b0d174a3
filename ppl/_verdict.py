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
"""

from __future__ import annotations

import math

import numpy as np

from ppl._errors import RunError
from ppl._results import THRESHOLDS, Check, Diagnostics

__all__ = ["rederive"]

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
}
# checks whose value is also a field of the record: the two must agree
_MIRRORED = ("rhat_max", "rhat_function_max", "divergences", "ebfmi_min", "khat")


def _same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and (a == b or (math.isnan(a) and math.isnan(b)))
    return a == b


def rederive(record: Diagnostics, *, kind: str, records: dict, flat_draws, where: str) -> Diagnostics:
    """``record`` (read from ``where``) with ``passed``, ``ok`` and the warnings decided again.

    ``records``: the run's checked records (status, trace, chain_stats, evidence); ``flat_draws``:
    the stored draws (chain, draw, parameter), whose count of non-finite draws the ``draws`` check
    must state.
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
    }
    required = {"draws", "status.failed", "status.interrupted"}
    if status.converged is not None:
        required.add("status.converged")
    if nonfinite == 0:
        if stats is not None and stats.diverging is not None:
            required.add("divergences")
        if stats is not None and stats.variance_inflation is not None:
            required.add("variance_inflation")
        if kind == "chains":
            required.add("num_draws" if record.num_draws < 4 else "stuck_chains")
        for field in _MIRRORED:
            if getattr(record, field) is not None and not (field == "rhat_max" and record.rhat_function_max is not None):
                required.add(field)
    seen, checks, messages = set(), [], {c.message for c in record.checks if c.message}
    for check in record.checks:
        field = check.field
        if field in seen:
            raise fail(field, "appears twice")
        seen.add(field)
        if field in facts and not _same(check.value, facts[field]):
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
