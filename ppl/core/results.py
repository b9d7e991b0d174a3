"""Result records every method returns: :class:`Prediction` and :class:`Diagnostics`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import NamedTuple

import numpy as np
from scipy.special import ndtr, ndtri

__all__ = ["Prediction", "Diagnostics", "Check", "THRESHOLDS", "POSTERIOR_KINDS"]

# What a posterior's draws are, as its method declares it; the diagnostics read it.
#   chains       Markov chains (R-hat and ESS across and within them)
#   independent  independent draws from a fitted density q (PSIS k-hat against the target)
#   point        one point (nothing to diagnose about spread)
#   members      an ensemble: independent optima on the chain axis, one draw each (their
#                disagreement is spread between modes, never a sampler failure)
#   mixture      independent draws from a mixture of fitted densities (k-hat as for independent)
POSTERIOR_KINDS = ("chains", "independent", "point", "members", "mixture")

THRESHOLDS = {
    "rhat": 1.01, "ess_per_chain": 100, "divergences": 0, "loo_khat": 0.7, "ebfmi": 0.3,
    # SG-MCMC: the predicted stationary-variance inflation of the discretisation and gradient noise
    "variance_inflation": 1.25,
    # SG-MCMC: the configurational temperature measured at the draws (1: draws from the target),
    # above it hotter (too spread out), below temperature_low colder (too concentrated)
    "temperature": 1.25, "temperature_low": 0.8,
}


@dataclass(frozen=True)
class Prediction:
    """Posterior-predictive summary at a batch of inputs.

    Classification: ``probs`` (N, C) posterior-predictive mean (Bernoulli: columns P(y=0), P(y=1))
    and ``log_probs``, its logarithm computed in log space (log-sigmoid or log-softmax per draw, then
    log-mean-exp over draws; ``log(probs)`` would be −inf where a probability underflows),
    ``member_probs`` and ``member_log_probs`` (S, N, C) per draw, ``entropy`` of the mean, ``aleatoric`` (expected entropy)
    and ``epistemic`` (mutual information), each (N,). The closed-form ``probit`` predictive has no
    per-draw probabilities: there ``member_probs``, ``member_log_probs``, ``aleatoric`` and
    ``epistemic`` are None, and ``predict(..., keep_draws=False)`` keeps no ``member_*`` arrays
    (the per-input summaries only; regression keeps ``member_noise`` when it is one sd per draw).
    Regression: ``mean`` (N,), total ``variance`` (N,) = ``epistemic_variance`` + ``aleatoric_variance``;
    ``member_means`` (S, N) and ``member_noise``, the noise sd per draw (S,) or, for a
    heteroscedastic model, per draw and input (S, N). Multi-output regression (K targets per input)
    adds a trailing axis K to each of these, and ``member_noise`` is (S, K).
    ``log_prob(y)`` gives the pointwise posterior-predictive log density (N,) (with K outputs, the
    joint density of the K targets of each input).
    """

    task: str  # "classification" or "regression"
    probs: np.ndarray | None = None
    log_probs: np.ndarray | None = None
    member_probs: np.ndarray | None = None
    member_log_probs: np.ndarray | None = None
    entropy: np.ndarray | None = None
    aleatoric: np.ndarray | None = None
    epistemic: np.ndarray | None = None
    mean: np.ndarray | None = None
    variance: np.ndarray | None = None
    epistemic_variance: np.ndarray | None = None
    aleatoric_variance: np.ndarray | None = None
    member_means: np.ndarray | None = None
    member_noise: np.ndarray | None = None
    # the predictive is exactly N(mean, variance) (a linearised Gaussian posterior with fixed noise):
    # log_prob then uses that density, not the Monte Carlo mixture of the draws
    gaussian: bool = False

    def noise_per_draw(self) -> np.ndarray:
        """``member_noise`` shaped to broadcast against ``member_means``: (S, 1) or (S, N) for one
        output, (S, 1, K) for K outputs."""
        if self.member_means is None:
            raise ValueError(
                "this prediction keeps no per-draw means (predict(..., keep_draws=False) reduced them to the mean and "
                "variances as it went); interval() and log_prob() of a Monte Carlo predictive need them — predict a "
                "batch of rows with keep_draws=True"
            )
        noise, means = np.asarray(self.member_noise), np.asarray(self.member_means)
        if noise.ndim == means.ndim:
            return noise
        if means.ndim == 3:
            return noise[:, None, :]
        return noise[:, None]

    def interval(self, level: float = 0.9) -> tuple[np.ndarray, np.ndarray]:
        """(lower, upper): the central ``level`` interval of each input's predictive (regression),
        the quantiles of the Monte Carlo mixture of N(f_s, σ_s²) found by bisection (of the
        Gaussian itself when the predictive is exactly Gaussian)."""
        if self.task != "regression":
            raise ValueError("interval() is for regression predictions; classification has probs and entropy")
        if not 0.0 < level < 1.0:
            raise ValueError(f"level must lie in (0, 1), got {level!r}")
        tail = (1.0 - level) / 2.0
        if self.gaussian:
            half = ndtri(1.0 - tail) * np.sqrt(self.variance)
            return self.mean - half, self.mean + half
        mu, sd = self.member_means, np.broadcast_to(self.noise_per_draw(), self.member_means.shape)
        bounds = []
        for q in (tail, 1.0 - tail):
            low, high = (mu - 10.0 * sd).min(axis=0), (mu + 10.0 * sd).max(axis=0)
            for _ in range(60):  # the bracket shrinks 2^60-fold: far below float resolution
                mid = 0.5 * (low + high)
                below = np.mean(ndtr((mid[None] - mu) / sd), axis=0) < q
                low, high = np.where(below, mid, low), np.where(below, high, mid)
            bounds.append(0.5 * (low + high))
        return bounds[0], bounds[1]

    def log_prob(self, y) -> np.ndarray:
        """log p(y_i | x_i, D) per point: log of the mean predictive probability/density."""
        y = np.asarray(y)
        if self.task == "classification":
            labels = y.astype(int)
            if labels.shape[0] != self.probs.shape[0]:
                raise ValueError(f"y has {labels.shape[0]} entries but the prediction covers {self.probs.shape[0]} inputs")
            if labels.min(initial=0) < 0 or labels.max(initial=0) >= self.probs.shape[1]:
                raise ValueError(f"labels must lie in 0..{self.probs.shape[1] - 1}; got {labels.min()}..{labels.max()}")
            log_probs = self.log_probs if self.log_probs is not None else np.log(self.probs)
            return log_probs[np.arange(labels.shape[0]), labels]
        if y.shape != self.mean.shape:
            raise ValueError(f"y has shape {y.shape} but the prediction's mean has shape {self.mean.shape}")
        if self.gaussian:
            log_dens = -0.5 * (np.square(y - self.mean) / self.variance + np.log(2 * math.pi * self.variance))
            return log_dens.sum(axis=-1) if log_dens.ndim == 2 else log_dens
        # Mixture over draws of N(y; f_s, σ_s²): exact for the Monte Carlo predictive. With K outputs
        # the K targets of an input are independent given a draw, so their log densities add.
        mu, sd = self.member_means, self.noise_per_draw()
        log_dens = -0.5 * np.square((y[None] - mu) / sd) - np.log(sd) - 0.5 * math.log(2 * math.pi)
        if log_dens.ndim == 3:
            log_dens = log_dens.sum(axis=-1)
        peak = log_dens.max(axis=0)
        return peak + np.log(np.mean(np.exp(log_dens - peak), axis=0))


class Check(NamedTuple):
    """One test the diagnostics made: which figure, its value, the threshold it was held to (None
    for a yes/no test), whether it passed, and — when it failed — what that means and what to do."""

    field: str  # a Diagnostics field ("rhat_function_max", "khat", ...) or a run record's ("status.converged")
    value: float | int | bool | str | None
    threshold: float | int | None
    passed: bool
    message: str


@dataclass
class Diagnostics:
    """One record, the same fields for every method; a field that does not apply is None, and
    ``notes`` says why. ``checks`` lists every test made (:class:`Check`) and ``ok`` is their
    conjunction; ``warnings`` hold the failed checks' messages, in words a user can act on, then
    advisory ones that fail nothing (tree depth hits, unreliable PSIS-LOO)."""

    method: str
    num_chains: int
    num_draws: int
    rhat_max: float | None = None
    rhat_function_max: float | None = None
    ess_bulk_min: float | None = None
    ess_tail_min: float | None = None
    divergences: int | None = None
    tree_depth_hits: int | None = None
    ebfmi_min: float | None = None
    khat: float | None = None
    khat_threshold: float | None = None
    # the smallest ratio of q's variance to the curvature's along any direction (diagnostics.dispersion)
    dispersion_min: float | None = None
    # q's moments against the posterior's, estimated from q's draws by PSIS: the largest mean shift
    # (in posterior sds) and the sd ratio farthest from 1 (diagnostics.report._moment_check)
    psis_mean_shift: float | None = None
    psis_sd_ratio: float | None = None
    loo_khat_max: float | None = None
    loo_khat_bad: int | None = None  # observations whose Pareto k exceeds 0.7 (elpd_loo unreliable for them)
    elpd_loo: float | None = None
    elpd_loo_se: float | None = None
    # per observation (N,): what the SE and paired differences between methods are computed from
    elpd_loo_pointwise: np.ndarray | None = field(default=None, repr=False)
    elbo: float | None = None
    iwae: float | None = None
    log_evidence: float | None = None
    wall_time_s: float | None = None
    # the held-out check (rows the fit never saw; diagnostics.heldout): mean log-likelihood per row, the
    # trivial baseline's, and the coverage of the central 90% predictive interval (regression)
    heldout_rows: int | None = None
    heldout_ll: float | None = None
    heldout_baseline_ll: float | None = None
    heldout_coverage_90: float | None = None
    # None when the run is the posterior of the declared model; otherwise which posterior it is
    # (an option such as Laplace's prior_precision replaced part of the model) — the verdict says it
    target: str | None = None
    warnings: list = field(default_factory=list)
    ok: bool = True
    notes: dict = field(default_factory=dict)
    checks: list = field(default_factory=list)

    def to_dict(self) -> dict:
        record = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.elpd_loo_pointwise is not None:
            record["elpd_loo_pointwise"] = [float(v) for v in self.elpd_loo_pointwise]
        record["checks"] = [c._asdict() for c in self.checks]
        return record

    @property
    def failed(self) -> list:
        """The checks that failed, in the order they were made."""
        return [c for c in self.checks if not c.passed]

    def verdict(self, held_out: str | None = None) -> str:
        """One line: trustworthy or not, the figure that decided it, and what to do next.

        Not trustworthy names the first failed check (its message carries the remedy) and how
        many more failed. Trustworthy names the checks that passed with their thresholds. An
        unreliable PSIS-LOO is explained in the same line: it concerns the elpd estimate, not the
        posterior, and K-fold cross-validation replaces it (``held_out``: a held-out figure to
        name there, such as "test NLL 0.091 per point").
        """
        if not self.ok:
            failed = self.failed
            more = f" (and {len(failed) - 1} more failed check(s), listed above)" if len(failed) > 1 else ""
            line = f"verdict: NOT trustworthy — {failed[0].message}{more}"
        else:
            passed = [_describe_check(c) for c in self.checks if c.passed and c.field in _CHECK_LABELS]
            basis = ", ".join(p for p in passed if p) or "no check applies"
            if self.num_chains * self.num_draws == 1:
                basis += "; a point estimate carries no posterior uncertainty"
            line = f"verdict: trustworthy — {basis}"
        if self.target is not None:
            line += f"; judged as {self.target}"
        if self.loo_khat_bad:
            line += (
                f"; PSIS-LOO is unreliable for {self.loo_khat_bad} observation(s) (Pareto k > 0.7) — that concerns "
                "the elpd_loo estimate, not the posterior: use ppl.kfold (ppl fit --kfold 10) or the held-out test "
                f"log-likelihood{f' ({held_out})' if held_out else ''} instead"
            )
        return line

    def __str__(self) -> str:
        return self.table() + "\n" + self.verdict()

    def table(self) -> str:
        """The record as text, without the verdict line. A note shared by several fields is written
        once, below the fields, and referred to by number."""
        # A note shared by several fields is written once, below the table, and referred to by number.
        shared: dict = {}
        for name, note in self.notes.items():
            if getattr(self, name, 0) is None:
                shared.setdefault(note, []).append(name)
        numbered = {note: i + 1 for i, note in enumerate(n for n, names in shared.items() if len(names) > 1)}
        rows = [f"Diagnostics — {self.method} ({self.num_chains} chain(s) × {self.num_draws} draws)"]
        width = max(len(f.name) for f in fields(self) if f.name != "elpd_loo_pointwise")  # heldout_baseline_ll
        for f in fields(self):
            if f.name in ("method", "num_chains", "num_draws", "warnings", "notes", "ok", "checks", "elpd_loo_pointwise"):
                continue
            value = getattr(self, f.name)
            if f.name == "target" and value is None:
                continue  # the declared model's posterior: nothing to say
            if value is None:
                note = self.notes.get(f.name, "")
                shown = f"—  [{numbered[note]}]" if note in numbered else "—  " + note
            elif isinstance(value, float):
                shown = f"{value:.4g}"
            else:
                shown = str(value)
            rows.append(f"  {f.name:<{width}} {shown}")
        rows.append(f"  {'ok':<{width}} {self.ok}")
        rows.extend(f"  [{i}] {note}" for note, i in numbered.items())
        # the first failed check's message is the verdict's; it is not repeated as a warning
        said = self.failed[0].message if self.failed else None
        rows.extend(f"  warning: {w}" for w in self.warnings if w != said)
        return "\n".join(rows)


# How the verdict names a passed check: (label, comparison with the threshold, number format)
_CHECK_LABELS = {
    "rhat_function_max": ("function-space R-hat", "≤", ".3f"), "rhat_max": ("R-hat", "≤", ".3f"),
    "ess_bulk_min": ("bulk ESS", "≥", ".0f"), "ess_tail_min": ("tail ESS", "≥", ".0f"),
    "function_ess_bulk_min": ("function-space bulk ESS", "≥", ".0f"),
    "function_ess_tail_min": ("function-space tail ESS", "≥", ".0f"),
    "divergences": ("divergences", None, "d"), "ebfmi_min": ("E-BFMI", "≥", ".2f"), "khat": ("PSIS k-hat", "≤", ".2f"),
    "variance_inflation": ("predicted variance inflation", "≤", ".3g"),
    "temperature": ("configurational temperature", "within", ".3g"),
    "status.converged": ("the optimisation converged", None, None),
    "dispersion_min": ("variance against the curvature's", "≥", ".2f"),
    "psis_mean_shift": ("PSIS mean shift (sds)", "≤", ".2f"),
    "psis_sd_ratio": ("PSIS sd ratio", "within", ".2f"),
    "heldout_ll": ("held-out log-likelihood", "≥ baseline", ".3g"),
    "heldout_coverage_90": ("held-out 90% coverage", "within", ".3f"),
}


def _describe_check(check: Check) -> str:
    label, comparison, number = _CHECK_LABELS[check.field]
    if number is None:
        return label
    if check.field == "divergences":
        return f"{check.value} {label}"
    if check.field == "heldout_ll":
        return f"{label} {check.value:.3g} ≥ baseline {check.threshold:.3g}"
    if check.field == "temperature":
        return f"{label} {check.value:.3g} within [{THRESHOLDS['temperature_low']:g}, {THRESHOLDS['temperature']:g}]"
    if check.field == "psis_sd_ratio":  # the threshold is the bound on the value's side of 1
        return f"{label} {check.value:.2f} ({'≥' if check.value < 1 else '≤'} {check.threshold:.2f})"
    if check.field == "heldout_coverage_90":
        return f"{label} {check.value:.3f} ({'≤' if check.value > 0.9 else '≥'} {check.threshold:.3f})"
    if check.field == "khat" and check.value == float("-inf"):
        return "q equals the posterior (constant log p − log q)"
    return f"{label} {check.value:{number}} {comparison} {check.threshold:{number if number != '.0f' else 'd'}}"


def finite_or_none(value) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None
