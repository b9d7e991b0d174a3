"""Build the uniform :class:`ppl.Diagnostics` record and the ArviZ export for any Posterior."""

from __future__ import annotations

import numpy as np
from scipy.special import logsumexp

from ppl.core.results import THRESHOLDS, Check, Diagnostics, finite_or_none
from ppl.diagnostics import _arviz
from ppl.diagnostics._arviz import psis
from ppl.diagnostics.convergence import max_rhat, min_ess
from ppl.diagnostics.dispersion import THRESHOLD, dispersion_min
from ppl.diagnostics.heldout import COVERAGE_SLACK, LEVEL, TAIL, coverage_range, heldout_scores
from ppl.diagnostics.psis import khat, khat_threshold, psis_loo

__all__ = ["compute_diagnostics", "to_inference_data", "convergence_shortfall"]

MIN_PSIS_DRAWS = 20
IWAE_K = 100  # importance samples per IWAE estimate in Diagnostics.iwae
MIN_CHAIN_DRAWS = 4  # rank-normalised split R-hat and ESS need at least this many draws per chain


def _has_hidden_layers(problem) -> bool:
    return problem.is_declarative and len(problem.parameter_groups()) > 1


def _judged_in_function_space(problem) -> bool:
    """Whether weight space is unidentifiable, so that function space decides convergence: a
    declarative network with hidden layers, or a plain program that names its function sites."""
    return _has_hidden_layers(problem) or bool(problem.function_sites)


NO_FUNCTION_SITES = (
    "plain NumPyro program without function_sites: convergence is judged in weight space only (rhat_max). "
    "For a hand-written neural network that R-hat is inflated even for a perfect sampler, because hidden units "
    "can be permuted and their signs flipped without changing the function, so chains settle in relabelled "
    "copies of the same mode; record the network's outputs with numpyro.deterministic('f', ...) and pass "
    "function_sites=('f',) to ppl.fit to get function-space R-hat"
)


class Findings:
    """What the diagnostics found, as they go: a structured :class:`Check` for every threshold
    tested (``ok`` is their conjunction), advisory warnings that fail nothing, and notes on fields
    that do not apply."""

    def __init__(self, record: Diagnostics):
        self.record = record

    def check(self, field: str, value, threshold, passed: bool, message: str) -> bool:
        """Record one test; ``message`` says what was found and what to do, and is shown when it failed."""
        self.record.checks.append(Check(field, value, threshold, bool(passed), "" if passed else message))
        if not passed:
            self.record.warnings.append(message)
        return bool(passed)

    def warn(self, message: str) -> None:
        self.record.warnings.append(message)

    def note(self, fields, why: str) -> None:
        for field in (fields,) if isinstance(fields, str) else fields:
            self.record.notes[field] = why


_CHAIN_FIELDS = ("rhat_max", "rhat_function_max", "ess_bulk_min", "ess_tail_min")


def compute_diagnostics(posterior) -> Diagnostics:
    """The uniform record: the checks that apply to the posterior's declared kind, then those of
    its run records (how the run ended, its approximation's fit, PSIS-LOO)."""
    record = Diagnostics(
        method=posterior.method,
        num_chains=posterior.num_chains,
        num_draws=posterior.num_draws,
        wall_time_s=posterior.wall_time_s,
        target=_target(posterior.provenance),
    )
    found = Findings(record)
    if record.target is None:
        found.note("target", "the posterior of the declared model (no option replaced part of it)")
    nonfinite = _nonfinite_draws(posterior)
    found.check(
        "draws", nonfinite, 0, nonfinite == 0,
        f"{nonfinite} draw(s) hold NaN or inf: the run is broken and its summaries are not assessed — check the "
        "model's log density for overflow or invalid parameter values",
    )
    # What the draws are is declared by the method (Posterior.kind), never guessed from their layout:
    # an ensemble's members sit on the chain axis but are not Markov chains.
    if posterior.kind == "chains":
        chain_checks(posterior, found, nonfinite)
    elif posterior.kind == "members":
        _member_notes(posterior, record.notes)
    else:
        found.note(_CHAIN_FIELDS, (
            "a point estimate has no spread to diagnose" if not posterior.has_density
            else "draws are independent samples from the fitted approximation q, not Markov chains"
        ))
    _transition_checks(posterior.chain_stats, found, posterior.remedy)
    log_ratios = _density_checks(posterior, found)
    _run_checks(posterior, found)
    _loo(posterior, found, nonfinite, log_ratios)
    _heldout_checks(posterior, found, nonfinite)
    record.ok = all(c.passed for c in record.checks)
    return record


# The checks more draws from the same chains can cure (a sampler extends its run while one fails).
MIXING_FIELDS = ("rhat_max", "rhat_function_max", "ess_bulk_min", "ess_tail_min", "function_ess_bulk_min",
                 "function_ess_tail_min")


def convergence_shortfall(posterior) -> list:
    """The Markov-chain checks (:class:`ppl.Check`) of ``posterior`` that fail and that more draws
    could cure (R-hat, bulk and tail ESS, in function space where that decides): the question a
    sampler asks before extending its run. Empty when they pass, or when the draws are broken."""
    if posterior.kind != "chains" or _nonfinite_draws(posterior):
        return []
    record = Diagnostics(method=posterior.method, num_chains=posterior.num_chains, num_draws=posterior.num_draws,
                         wall_time_s=posterior.wall_time_s, target=None)
    found = Findings(record)
    chain_checks(posterior, found, 0)
    return [c for c in record.checks if not c.passed and c.field in MIXING_FIELDS]


def _target(provenance: dict) -> str | None:
    """Which posterior the run is, when an option replaced part of the declared model (None: the
    declared model's)."""
    declared = (provenance or {}).get("declared_model")
    if not isinstance(declared, str):
        return None
    return (f"the posterior with {provenance.get('replaced')}, set by {provenance.get('replaced_by')}: not the declared "
            "model's posterior")


def chain_checks(posterior, found: Findings, nonfinite: int) -> None:
    """Markov chains: R-hat and ESS in weight and function space, stuck chains."""
    record, problem = found.record, posterior.problem
    if nonfinite:
        found.note(_CHAIN_FIELDS, "not assessed: the draws hold NaN or inf")
        return
    if posterior.num_draws < MIN_CHAIN_DRAWS:
        found.note(_CHAIN_FIELDS, f"not assessed: R-hat and ESS need at least {MIN_CHAIN_DRAWS} draws per chain")
        found.check(
            "num_draws", posterior.num_draws, MIN_CHAIN_DRAWS, False,
            f"only {posterior.num_draws} draw(s) per chain: too few to assess convergence — raise num_samples",
        )
        return
    info = posterior.info or {}
    if isinstance(info.get("extension_stop"), str) and info["extension_stop"] != "off":
        rounds = info.get("extension_rounds")
        found.note("num_draws", (
            f"the run extended itself to {rounds} × num_samples draws per chain ({info['extension_stop']}; "
            f"time_budget {info.get('time_budget_s')} s)" if isinstance(rounds, int) and rounds > 1 else
            f"num_samples draws per chain; the run would have extended itself until R-hat and ESS passed "
            f"({info['extension_stop']}; time_budget {info.get('time_budget_s')} s)"
        ))
    arrays = list(posterior.latent_draws.values())
    multi_chain = posterior.num_chains >= 2
    record.rhat_max = max_rhat(arrays) if multi_chain else None
    record.ess_bulk_min = min_ess(arrays, "bulk")
    record.ess_tail_min = min_ess(arrays, "tail")
    functions = posterior.function_draws()
    if functions is not None:
        broken = int(np.sum(~np.all(np.isfinite(np.reshape(functions, (*np.shape(functions)[:2], -1))), axis=-1)))
        if broken:
            # finite weights whose outputs overflow: R-hat and ESS would silently skip those outputs
            found.note(_CHAIN_FIELDS, "not assessed: some draws give non-finite outputs")
            found.check(
                "function_draws", broken, 0, False,
                f"{broken} draw(s) give non-finite {'network outputs' if problem.is_declarative else 'function sites'} "
                "(their weights grew until the outputs overflowed): the chains diverged — lower step_size, or use nuts",
            )
            return
    if functions is not None and multi_chain:
        record.rhat_function_max = max_rhat([functions])
    elif functions is None:
        found.note("rhat_function_max", NO_FUNCTION_SITES)
    symmetric = _judged_in_function_space(problem)
    if not multi_chain:
        found.note(("rhat_max", "rhat_function_max"), "R-hat compares chains: run num_chains ≥ 2")
    elif symmetric and problem.is_declarative:
        found.note("rhat_max", (
            "weight-space R-hat of a network with hidden layers is inflated by permutation and sign "
            "symmetries even for a perfect sampler; judge convergence by rhat_function_max"
        ))
    elif symmetric:
        found.note("rhat_max", (
            f"weight-space R-hat, reported only: the program names function sites ({', '.join(problem.function_sites)}), "
            "so convergence is judged by rhat_function_max on their draws (a network's weights are inflated by "
            "permutation and sign symmetries even for a perfect sampler)"
        ))
    if functions is not None and multi_chain and not problem.is_declarative:
        found.note("rhat_function_max", f"R-hat of the draws of the function sites {', '.join(problem.function_sites)}")
    # Without hidden layers weights are identifiable and both R-hats count; with them, only the
    # function-space one does.
    for field, label in (("rhat_function_max", "function-space R-hat"), ("rhat_max", "R-hat")):
        value = getattr(record, field)
        if value is None or (symmetric and field == "rhat_max"):
            continue
        found.check(
            field, value, THRESHOLDS["rhat"], value <= THRESHOLDS["rhat"],
            f"{label} {value:.3f} > {THRESHOLDS['rhat']}: chains disagree — {_next_step(posterior, 'mixing')}",
        )
    ess_needed = THRESHOLDS["ess_per_chain"] * posterior.num_chains
    if not symmetric:
        for field, label in (("ess_bulk_min", "bulk"), ("ess_tail_min", "tail")):
            value = getattr(record, field)
            if value is not None:
                found.check(
                    field, value, ess_needed, value >= ess_needed,
                    f"{label} ESS {value:.0f} < {ess_needed} (100 per chain): estimates are noisy — "
                    f"{_next_step(posterior, 'mixing')}",
                )
    else:
        found.note(("ess_bulk_min", "ess_tail_min"), "weight-space ESS; see the note on rhat_max")
        outputs = "the network's outputs" if problem.is_declarative else "the function sites' values"
        if functions is not None:
            # Weight-space ESS says nothing for such networks; the network's outputs still must
            # be sampled well enough, with one chain as with several.
            for label in ("bulk", "tail"):
                value = min_ess([functions], label)
                if value is None:
                    continue
                record.notes[f"ess_{label}_min"] += f"; function-space {label} ESS {value:.0f}"
                found.check(
                    f"function_ess_{label}_min", value, ess_needed, value >= ess_needed,
                    f"function-space {label} ESS {value:.0f} < {ess_needed} (100 per chain): {outputs} "
                    f"are estimated from too few effective draws — {_next_step(posterior, 'mixing')}",
                )
    stuck = _stuck_chains(posterior)
    found.check(
        "stuck_chains", len(stuck), 0, not stuck,
        f"chain(s) {', '.join(map(str, stuck))} never moved in some parameters (constant draws): the sampler is "
        "stuck — check the initial values and the step size (divergences), or reparameterise",
    )


def _transition_checks(stats, found: Findings, remedy) -> None:
    """Per-transition statistics of Markov chains: divergences, tree depth, E-BFMI, and the
    predicted variance inflation and measured temperature of a stochastic-gradient chain
    (``remedy(topic)``: the method's advice)."""
    record = found.record
    if stats is None or stats.diverging is None:
        found.note("divergences", "only Hamiltonian samplers diverge")
    else:
        record.divergences = stats.divergences
        found.check(
            "divergences", record.divergences, THRESHOLDS["divergences"], record.divergences <= THRESHOLDS["divergences"],
            f"{record.divergences} divergent transitions after warmup: the sampler missed part of the posterior — "
            "raise target_accept or reparameterise",
        )
    if stats is None or stats.tree_depth_hits is None:
        found.note("tree_depth_hits", "only NUTS builds trees")
    else:
        record.tree_depth_hits = stats.tree_depth_hits
        if record.tree_depth_hits:
            found.warn(
                f"{record.tree_depth_hits} transitions hit max_tree_depth={stats.max_tree_depth}: an efficiency "
                "problem, not a validity one — raise max_tree_depth or use dense_mass"
            )
    if stats is not None and stats.leapfrog_cap_hits:
        found.warn(
            f"{stats.leapfrog_cap_hits} transitions were cut at {stats.leapfrog_cap} leapfrog steps: the adapted step "
            "size is tiny against trajectory_length, so the posterior is badly scaled — rescale the parameters or "
            "data, or use nuts"
        )
    if stats is not None and stats.energy is not None and np.shape(stats.energy)[-1] >= 2:
        record.ebfmi_min = finite_or_none(np.min(ebfmi(np.asarray(stats.energy, dtype=float))))
        if record.ebfmi_min is None:
            found.note("ebfmi_min", "the energies are constant or not finite")
        else:
            found.check(
                "ebfmi_min", record.ebfmi_min, THRESHOLDS["ebfmi"], record.ebfmi_min >= THRESHOLDS["ebfmi"],
                f"E-BFMI {record.ebfmi_min:.2f} < {THRESHOLDS['ebfmi']}: the momentum resampling barely moves the "
                "energy, so the sampler explores the posterior's tails poorly (a funnel-like geometry) — "
                "reparameterise (non-centred), or rescale the parameters",
            )
    else:
        found.note("ebfmi_min", "only Hamiltonian samplers record energies")
    inflation = None if stats is None else stats.variance_inflation
    if inflation is not None:
        found.check(
            "variance_inflation", inflation, THRESHOLDS["variance_inflation"],
            inflation <= THRESHOLDS["variance_inflation"],
            f"the step size and the minibatch gradient noise inflate the stationary variance by a predicted factor "
            f"{inflation:.3g} (standard deviations {np.sqrt(inflation):.3g}×) against the posterior's: the draws are "
            "too spread out — lower step_size, raise batch_size, or check the data for outliers",
        )
    temperature = None if stats is None else stats.temperature
    if temperature is not None:
        hot = temperature >= 1.0 or not np.isfinite(temperature)
        bound = THRESHOLDS["temperature"] if hot else THRESHOLDS["temperature_low"]
        measured = (f"the draws' configurational temperature, mean |∇log p|² over mean −Δlog p, is {temperature:.3g} "
                    "where draws from the posterior give 1: ")
        found.check(
            "temperature", temperature, bound, THRESHOLDS["temperature_low"] <= temperature <= THRESHOLDS["temperature"],
            measured + (
                "they are spread about that many times too wide (in variance) along the posterior's sharpest "
                f"directions — the step's discretisation error or the gradient noise heats the chains; {remedy('temperature')}"
                if hot else
                "they are about that many times too concentrated (in variance) along the posterior's sharpest "
                f"directions — the chains sit nearer a mode than the posterior does; {remedy('cold')}"
            ),
        )


def _density_checks(posterior, found: Findings):
    """The approximation q against the target: ELBO, IWAE and PSIS k-hat. Returns the log density
    ratios log p − log q of the draws (None without a density)."""
    record, notes, evidence = found.record, found.record.notes, posterior.evidence
    total_draws = posterior.num_chains * posterior.num_draws
    log_ratios = posterior.log_density_ratios()
    if log_ratios is not None:
        record.elbo = finite_or_none(np.mean(log_ratios))
        groups = log_ratios.size // IWAE_K
        if groups:
            # IWAE_K from the stored draws: the mean of log-mean-exp over disjoint groups of K.
            grouped = np.reshape(log_ratios[: groups * IWAE_K], (groups, IWAE_K))
            record.iwae = finite_or_none(np.mean(logsumexp(grouped, axis=1) - np.log(IWAE_K)))
        else:
            notes["iwae"] = f"IWAE with K={IWAE_K} needs at least {IWAE_K} draws; raise num_draws"
    elif evidence is not None and evidence.elbo is not None:
        # A model with local latents: the bounds on log p(D) were estimated after training with
        # fresh draws of each datum's latents (svi records them).
        record.elbo, record.iwae = finite_or_none(evidence.elbo), finite_or_none(evidence.iwae)
    if evidence is not None and evidence.log_evidence is not None:
        record.log_evidence = float(evidence.log_evidence)
    else:
        notes["log_evidence"] = "only closed-form methods give the log evidence"
    if log_ratios is None:
        reason = {
            "chains": "samplers have no density q(θ)", "members": "an ensemble of optima has no density q(θ)",
        }.get(posterior.kind, "a point estimate has no density")
        if posterior.problem is not None and posterior.problem.local_sites:
            reason = "the model has local latents: see ppl.vae_report for per-datum k-hat"
        found.note(("khat", "khat_threshold", *_MOMENT_FIELDS), reason)
        if record.elbo is None:
            found.note(("elbo", "iwae"), reason)
        return None
    if total_draws < MIN_PSIS_DRAWS:
        found.note(("khat", "khat_threshold", *_MOMENT_FIELDS), f"PSIS needs at least {MIN_PSIS_DRAWS} draws; raise num_draws")
        return log_ratios
    record.khat_threshold = khat_threshold(total_draws)
    degenerate = False
    if not np.all(np.isfinite(log_ratios)):
        record.khat = float("inf")
        notes["khat"] = "log p − log q is not finite for some draws of q"
    elif np.ptp(log_ratios) <= 1e-10 * max(1.0, float(np.abs(log_ratios).max())):
        if evidence is not None and evidence.closed_form:
            # q is the exact posterior (a closed form): the ratios are constant by construction.
            record.khat = float("-inf")
            notes["khat"] = "log p − log q is constant over the draws: q is the exact posterior (closed form)"
        elif _equals_target(log_ratios, posterior._cache.get("log_q", np.zeros(1))):
            # q spreads (its own density varies over its draws) and still matches the target up
            # to a constant at every draw: q is the posterior (a Gaussian guide on a Gaussian
            # posterior). Importance weights are all equal; there is no tail to fit.
            record.khat = float("-inf")
            notes["khat"] = "log p − log q is constant over q's spread-out draws: q equals the posterior"
        else:
            # Draws that do not vary (a spread collapsed below rounding) also give constant
            # ratios; that q is degenerate. So is a target so large in magnitude that its
            # differences across q's draws fall below float resolution.
            degenerate = True
            record.khat = float("inf")
            notes["khat"] = "log p − log q is constant over the draws: q is degenerate (its spread is ~0)"
            found.check(
                "khat", record.khat, record.khat_threshold, False,
                "log p − log q is constant over q's draws, which only a closed-form posterior achieves: q is "
                "degenerate (collapsed scales, or draws that do not vary) and its uncertainty is meaningless — "
                "lower learning_rate or use more steps",
            )
    else:
        record.khat = khat(log_ratios)
    if not degenerate:
        found.check(
            "khat", record.khat, record.khat_threshold, record.khat <= record.khat_threshold,
            f"PSIS k-hat {_apart(record.khat, record.khat_threshold)}: the approximation q misses the posterior's "
            f"tails — do not trust its uncertainty; {_next_step(posterior, 'fit')}",
        )
    _dispersion_check(posterior, found, degenerate)
    if not degenerate and np.isfinite(record.khat) and record.khat <= record.khat_threshold:
        _moment_check(posterior, found, log_ratios)
    else:
        found.note(("psis_mean_shift", "psis_sd_ratio"), (
            "log p − log q is constant over the draws: q is the posterior, and its moments need no correction"
            if record.khat == float("-inf")
            else "k-hat is above its threshold (or not finite): importance sampling cannot correct q's moments"
        ))
    return log_ratios


_MOMENT_FIELDS = ("dispersion_min", "psis_mean_shift", "psis_sd_ratio")


MOMENT_SHIFT = 0.5  # the largest |posterior mean − q's mean| allowed, in posterior sds
SD_RATIO = (0.8, 1.25)  # the range q's sd may take, as a multiple of the posterior's
MOMENT_SES = 3.0  # each bound is widened by this many Monte Carlo standard errors of its estimate


def _moment_check(posterior, found: Findings, log_ratios) -> None:
    """q's means and sds against the posterior's, estimated from q's own draws by Pareto-smoothed
    importance sampling — reliable exactly when k-hat passes (Yao et al. 2018). A q whose tails are
    fine can still be shifted or too narrow (a Laplace approximation of a skewed noise scale); the
    moments say so. Each coordinate's bound is widened by ``MOMENT_SES`` standard errors of the
    importance-sampling estimate (√Σw² in sds), so that hundreds of coordinates do not fail by chance."""
    smoothed, _ = psis(log_ratios)
    weights = np.exp(smoothed - np.logaddexp.reduce(smoothed))
    values = _constrained_columns(posterior)
    if values is None or values.shape[0] != weights.shape[0]:
        found.note(("psis_mean_shift", "psis_sd_ratio"), "the draws' constrained values are not available")
        return
    mean_q, sd_q = values.mean(axis=0), values.std(axis=0)
    mean_p = weights @ values
    sd_p = np.sqrt(np.maximum(weights @ np.square(values - mean_p), 0.0))
    spread = sd_p > 1e-12 * np.maximum(np.abs(mean_p), 1.0)
    if not spread.any():
        found.note(("psis_mean_shift", "psis_sd_ratio"), "no coordinate varies over the weighted draws")
        return
    se = float(np.sqrt(np.sum(np.square(weights))))  # the weighted mean's SE, in sds
    shift = np.abs(mean_p - mean_q)[spread] / sd_p[spread]
    ratio = sd_q[spread] / sd_p[spread]
    record = found.record
    worst = int(np.argmax(shift))
    record.psis_mean_shift = float(shift[worst])
    found.check(
        "psis_mean_shift", float(shift[worst]), MOMENT_SHIFT + MOMENT_SES * se, shift[worst] <= MOMENT_SHIFT + MOMENT_SES * se,
        f"q's mean sits {shift[worst]:.2f} posterior sds from the posterior's (estimated from q's draws by PSIS, "
        f"allowed {MOMENT_SHIFT} + {MOMENT_SES:g} × {se:.2f} for its error): q is shifted off the posterior — "
        f"{_next_step(posterior, 'fit')}",
    )
    farthest = int(np.argmax(np.abs(np.log(ratio))))
    low, high = SD_RATIO[0] * np.exp(-MOMENT_SES * se), SD_RATIO[1] * np.exp(MOMENT_SES * se)
    record.psis_sd_ratio = float(ratio[farthest])
    found.check(
        "psis_sd_ratio", float(ratio[farthest]), float(low if ratio[farthest] < 1 else high),
        low <= ratio[farthest] <= high,
        f"q's sd is {ratio[farthest]:.2f}× the posterior's in one coordinate (estimated from q's draws by PSIS; "
        f"allowed {low:.2f}–{high:.2f}): q's spread is {'too narrow' if ratio[farthest] < 1 else 'too wide'} — "
        f"{_next_step(posterior, 'fit')}",
    )


def _constrained_columns(posterior) -> np.ndarray | None:
    """The latent draws in constrained space as one (S, K) matrix, or None without them."""
    draws = getattr(posterior, "draws", None) or {}
    latent = {s.name for s in posterior.problem.sites} if posterior.problem is not None else set(draws)
    parts = [np.asarray(v, dtype=float).reshape(posterior.num_chains * posterior.num_draws, -1)
             for name, v in draws.items() if name in latent]
    return np.concatenate(parts, axis=1) if parts else None


def _dispersion_check(posterior, found: Findings, degenerate: bool) -> None:
    """q's spread against the curvature at its mean (:mod:`ppl.diagnostics.dispersion`): what
    k-hat cannot see when q is much narrower than the posterior."""
    evidence = posterior.evidence
    if evidence is not None and evidence.closed_form:
        found.note("dispersion_min", "q is the closed-form posterior")
        return
    if degenerate or posterior.approximation is None:
        found.note("dispersion_min", "no Gaussian approximation with a spread to compare")
        return
    ratio, why = dispersion_min(posterior.problem, posterior.approximation)
    if ratio is None:
        found.note("dispersion_min", why)
        return
    found.record.dispersion_min = ratio
    found.check(
        "dispersion_min", ratio, THRESHOLD, ratio >= THRESHOLD,
        f"q's variance is {ratio:.3g} of the variance the curvature at its mean implies in some direction (sd "
        f"{ratio ** 0.5:.2g}×; allowed down to {THRESHOLD:g}, sd 0.5×): q is too narrow — the correlations it leaves "
        f"out (mean-field) or its fitted scale shrink it; {_next_step(posterior, 'fit')}",
    )


def _run_checks(posterior, found: Findings) -> None:
    """How the run ended: failed, interrupted, not converged, stopped during KL warm-up."""
    status, trace = posterior.status, posterior.trace
    found.check(
        "status.failed", status.failed or None, None, not status.failed,
        f"the run failed and this is its last finite state: {status.failed}",
    )
    done = (f"{status.chains_done} chain(s) finished" if status.chains_done is not None
            else f"{status.steps_done} steps done")
    found.check(
        "status.interrupted", status.interrupted, None, not status.interrupted,
        f"the run was interrupted (Ctrl-C): this is a partial result — {done}",
    )
    if status.converged is not None:
        found.check(
            "status.converged", status.converged, None, status.converged,
            f"the optimisation did not converge: {status.convergence or 'the loss did not settle'} — "
            f"{_next_step(posterior, 'steps')}",
        )
    if trace is not None and trace.kl_warmup:
        warmup = int(trace.kl_warmup)
        steps = int(status.steps_done if status.steps_done is not None else np.shape(trace.losses)[-1])
        if found.check(
            "trace.kl_warmup", steps, warmup, steps >= warmup,
            f"the run stopped during KL warm-up (step {steps} of {warmup}): it optimised a down-weighted prior/KL "
            "side, not the bound — resume it or train longer than kl_warmup",
        ):
            found.warn(
                f"KL warm-up weighted the prior/KL side below its value for the first {warmup} steps: losses recorded "
                "then are not the bound (the final objective is)"
            )


def _loo(posterior, found: Findings, nonfinite: int, log_ratios) -> None:
    """PSIS-LOO: its elpd and the worst Pareto k. Unreliable LOO warns; it does not fail ``ok``
    (it is a statement about the estimate of predictive fit, not about the posterior)."""
    record, problem = found.record, posterior.problem
    total_draws = posterior.num_chains * posterior.num_draws
    loo_unavailable = problem.spec.no_pointwise_reason
    fields = ("elpd_loo", "elpd_loo_se", "elpd_loo_pointwise", "loo_khat_max", "loo_khat_bad")
    if nonfinite:
        found.note(fields, "not assessed: the draws hold NaN or inf")
        return
    if total_draws == 1:
        found.note(fields, "PSIS-LOO needs posterior draws; a point estimate has one")
        return
    if total_draws < MIN_PSIS_DRAWS:
        found.note(fields, f"PSIS-LOO needs at least {MIN_PSIS_DRAWS} draws")
        return
    if loo_unavailable is not None:
        found.note(fields, loo_unavailable)
        return
    # Blocks of observations, one at a time: the whole (draws × N) array is never held.
    flat = posterior.pointwise_log_likelihood_chunks()
    if posterior.kind == "chains":
        elpd, se, k, pointwise = psis_loo(flat, reff=_arviz.relative_efficiency(list(posterior.draws.values())))
    else:
        usable = record.khat is not None and record.khat <= record.khat_threshold
        elpd, se, k, pointwise = psis_loo(flat, log_correction=log_ratios if usable else None)
        if not usable and log_ratios is not None:
            record.notes["elpd_loo"] = (
                "q is too far from the posterior (k-hat above its threshold) to correct by; LOO uses q's draws as is"
            )
    record.elpd_loo, record.elpd_loo_se = finite_or_none(elpd), finite_or_none(se)
    if record.elpd_loo is None:
        record.notes["elpd_loo_se"] = record.notes["elpd_loo_pointwise"] = "elpd_loo is not finite"
    else:
        record.elpd_loo_pointwise = np.asarray(pointwise, dtype=float)
    record.loo_khat_max = None if np.isnan(np.max(k)) else float(np.max(k))
    record.loo_khat_bad = int(np.sum(k > THRESHOLDS["loo_khat"]))
    if record.loo_khat_max == float("-inf"):
        record.notes["loo_khat_max"] = "every observation's importance weights are bounded (no Pareto tail to fit)"
    if record.loo_khat_bad:
        found.warn(
            f"PSIS-LOO k-hat > 0.7 for {record.loo_khat_bad} of {k.shape[0]} observation(s): elpd_loo is unreliable "
            "for them (a statement about the estimate, not the posterior) — use K-fold cross-validation "
            "(ppl.kfold, or ppl fit --kfold 10) or the held-out test log-likelihood"
        )


_HELDOUT_FIELDS = ("heldout_rows", "heldout_ll", "heldout_baseline_ll", "heldout_coverage_90")


def _heldout_checks(posterior, found: Findings, nonfinite: int) -> None:
    """The predictive on rows the fit never saw, against the trivial baseline and its own 90%
    intervals (:mod:`ppl.diagnostics.heldout`)."""
    heldout = getattr(posterior, "heldout", None)
    if heldout is None:
        found.note(_HELDOUT_FIELDS, (
            "no held-out rows: give ppl.fit(..., validation=0.1), or post.with_heldout(X_test, y_test), to check the "
            "predictive on data the fit never saw"
        ))
        return
    if nonfinite:
        found.note(_HELDOUT_FIELDS, "the draws are not finite, so nothing is predicted from them")
        return

    record = found.record
    scores = heldout_scores(posterior, *heldout)
    record.heldout_rows = scores["rows"]
    record.heldout_ll = finite_or_none(scores["ll"])
    record.heldout_baseline_ll = scores["baseline_ll"]
    ll = scores["ll"] if np.isfinite(scores["ll"]) else float("-inf")
    regression = "coverage" in scores
    baseline = ("a Gaussian with the training targets' mean and sd" if regression
                else "the training labels' class frequencies")
    found.check(
        "heldout_ll", ll, scores["baseline_ll"], ll >= scores["baseline_ll"],
        f"the held-out log-likelihood {ll:.4g} per row over {scores['rows']} rows is below the trivial baseline's "
        f"{scores['baseline_ll']:.4g} ({baseline}, which ignores the inputs): the predictive is worse than no model — "
        f"{_next_step(posterior, 'heldout')}",
    )
    if regression:
        record.heldout_coverage_90 = scores["coverage"]
        coverage, targets = scores["coverage"], scores["targets"]
        low, high = coverage_range(targets)
        wide = coverage > LEVEL
        missed = round((1.0 - coverage) * targets)
        if wide:
            finding = (f"only {missed} of {targets} held-out targets fall outside their central 90% predictive intervals "
                       f"(coverage {coverage:.2%}): intervals that miss {1 - LEVEL - COVERAGE_SLACK:.0%} of the targets "
                       f"would miss so few with probability under {TAIL:g}, so the allowed coverage is at most "
                       f"{high:.2%}: the predictive spread is too wide")
        else:
            finding = (f"{coverage:.1%} of {targets} held-out targets lie in their central 90% predictive intervals, "
                       f"below the {low:.1%} allowed (3 binomial standard errors plus {COVERAGE_SLACK:.0%} under 90%): "
                       "the predictive spread is too narrow")
        found.check(
            "heldout_coverage_90", coverage, high if wide else low, low <= coverage <= high,
            f"{finding} — {_next_step(posterior, 'heldout_wide' if wide else 'heldout')}",
        )
    else:
        found.note("heldout_coverage_90", "classification: no predictive interval (see the log-likelihood)")


def _apart(value: float, threshold: float) -> str:
    """'value > threshold' with as many decimals as it takes to tell them apart (up to 4)."""
    for digits in (2, 3, 4):
        if f"{value:.{digits}f}" != f"{threshold:.{digits}f}":
            break
    return f"{value:.{digits}f} > {threshold:.{digits}f}"


def _next_step(posterior, topic: str) -> str:
    """The next thing to try for a failed check: the method's own advice."""
    return posterior.remedy(topic)


def _member_notes(posterior, notes: dict) -> None:
    """An ensemble: members are separate optima, so chain diagnostics do not apply; their
    disagreement is reported as what it is, the spread between modes."""
    why = (
        "ensemble members are separate optima (one per chain slot), not Markov chains: R-hat and ESS do not apply"
    )
    for field in ("rhat_max", "rhat_function_max", "ess_bulk_min", "ess_tail_min"):
        notes[field] = why
    functions = posterior.function_draws()
    if functions is not None and posterior.num_chains >= 2:
        spread = float(np.mean(np.std(np.asarray(functions, dtype=float)[:, 0], axis=0)))
        notes["rhat_function_max"] += (
            f"; the members' network outputs on the probe inputs differ by sd {spread:.3g} on average — "
            "between-mode disagreement, the ensemble's epistemic spread, not a failure"
        )


def ebfmi(energy: np.ndarray) -> np.ndarray:
    """Energy Bayesian fraction of missing information per chain (Betancourt 2016), energies (chain, draw):
    E-BFMI = Σ_t (E_t − E_{t−1})² / Σ_t (E_t − Ē)². Below 0.3 the sampler explores poorly."""
    energy = np.atleast_2d(energy)
    # Scale each chain by its largest energy: squares of energies near 1e300 would overflow.
    unit = np.max(np.abs(energy), axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        energy = energy / np.where(unit > 0, unit, 1.0)
        spread = np.sum(np.square(energy - energy.mean(axis=1, keepdims=True)), axis=1)
        return np.sum(np.square(np.diff(energy, axis=1)), axis=1) / spread


def _nonfinite_draws(posterior) -> int:
    return int(np.sum(~np.all(np.isfinite(np.asarray(posterior.flat_draws)), axis=-1)))


def _stuck_chains(posterior) -> list[int]:
    if posterior.num_draws < 2:
        return []
    flat = np.asarray(posterior.flat_draws)
    constant = np.all(flat == flat[:, :1, :], axis=1)  # (chain, parameter)
    return [int(c) for c in np.flatnonzero(constant.any(axis=1))]


def _dims(posterior, loglik_name: str) -> dict:
    dims = {loglik_name: ["obs_id"]}
    if loglik_name != "y" and posterior.problem.is_declarative:
        dims["y"] = ["obs_id"]
    problem = posterior.problem
    if problem.is_declarative and problem.model.dense:
        for layer in problem.layers():
            if posterior.draws[layer.weight].ndim == 4:
                dims[layer.weight] = [f"{layer.weight}_in", f"{layer.weight}_out"]
            else:
                dims[layer.weight] = ["feature"]
            if layer.bias is not None and posterior.draws[layer.bias].ndim == 3:
                dims[layer.bias] = [f"{layer.weight}_out"]
    return dims


def to_inference_data(posterior):
    """ArviZ InferenceData: posterior, sample_stats, log_likelihood, observed_data and, for a
    supervised model from ppl.models, posterior_predictive (one replicate of the training targets per
    draw, so ``az.plot_ppc`` works); named dims. An ensemble's members are exported as the draws of
    one chain (they are separate optima, not chains). Independent draws of a fitted q (svi, laplace,
    swag, mola, exact) are split into ``EXPORT_CHAINS`` chains, so that ArviZ's summary computes ESS
    and MCSE instead of warning that one chain is too few; the posterior group's ``ppl_draws``
    attribute says what the draws are and which diagnostics apply."""
    problem, chain_stats = posterior.problem, posterior.chain_stats
    chains, note = export_layout(posterior)

    def layout(array):
        array = np.asarray(array)
        return array.reshape(chains, -1, *array.shape[2:])
    stats = {}
    if chain_stats is not None:
        # ArviZ's names for the per-transition statistics (chain, draw)
        for name, value in (("diverging", chain_stats.diverging), ("n_steps", chain_stats.num_steps),
                            ("acceptance_rate", chain_stats.accept_prob), ("energy", chain_stats.energy)):
            if value is not None and np.shape(value) == (posterior.num_chains, posterior.num_draws):
                stats[name] = layout(value)
    log_ratios = posterior.log_density_ratios()
    if log_ratios is not None:
        stats["log_ratio"] = layout(log_ratios.reshape(posterior.num_chains, posterior.num_draws))
    observed = posterior.observed_data()
    # One pointwise log-likelihood: named after the observed site, or "joint" when several observed
    # sites are summed per datum.
    loglik = posterior.pointwise_log_likelihood()
    name = problem.spec.observed[0] if len(problem.spec.observed) == 1 else "joint"
    data = _arviz.inference_data(
        posterior={site: layout(value) for site, value in posterior.draws.items()},
        sample_stats=stats,
        log_likelihood={} if loglik is None else {name: layout(loglik)},
        posterior_predictive={k: layout(v) for k, v in _replicates(posterior).items()},
        observed_data=observed,
        dims=_dims(posterior, name),
    )
    data.posterior.attrs.update({"ppl_method": posterior.method, "ppl_draws": note})
    return data


EXPORT_CHAINS = 4  # the chains that independent draws are split into for ArviZ


def export_layout(posterior) -> tuple:
    """(chains to export, what the draws are and which of ArviZ's diagnostics apply to them)."""
    total = posterior.num_chains * posterior.num_draws
    if posterior.kind == "chains":
        return posterior.num_chains, (f"{posterior.num_chains} Markov chains of {posterior.num_draws} draws: R-hat, ESS "
                                      "and MCSE apply (for a network, to its outputs rather than its weights)")
    if posterior.kind == "members":
        return 1, (f"{total} separately trained optima, exported as the draws of one chain: their spread is the "
                   "ensemble's, and R-hat, ESS and MCSE do not apply: summarise them with "
                   "az.summary(data, kind='stats')")
    if posterior.kind == "point" or total < 2 * EXPORT_CHAINS:
        return posterior.num_chains, ("a point estimate (or too few draws): no spread to diagnose; "
                                      "az.summary(data, kind='stats') shows the values")
    chains = EXPORT_CHAINS if total % EXPORT_CHAINS == 0 else (2 if total % 2 == 0 else 1)
    return chains, (f"{total} independent draws of the fitted approximation q ({posterior.method}), split into "
                    f"{chains} chains of {total // chains} so that ESS and MCSE apply; R-hat of independent draws is 1 "
                    "by construction and says nothing about how well q fits the posterior: PSIS k-hat does (ppl's "
                    "diagnostics; sample_stats.log_ratio holds log p − log q per draw)")


def _replicates(posterior) -> dict:
    """{"y": (chain, draw, N[, K])}: one draw of the training targets from the likelihood at each
    posterior draw (a supervised model from ppl.models; otherwise nothing)."""
    problem = posterior.problem
    if not problem.is_declarative or problem.spec.kind == "unsupervised":
        return {}
    X = np.asarray(problem.data[0])
    prediction = posterior.predict(X, seed=0)
    rng = np.random.default_rng(0 if not isinstance(posterior.seed, int) else posterior.seed)
    if prediction.task == "classification":
        cumulative = np.cumsum(prediction.member_probs, axis=-1)
        uniform = rng.random(cumulative.shape[:-1] + (1,))
        values = np.minimum((uniform > cumulative).sum(axis=-1), cumulative.shape[-1] - 1)
    else:
        noise = np.broadcast_to(prediction.noise_per_draw(), prediction.member_means.shape)
        values = prediction.member_means + noise * rng.standard_normal(prediction.member_means.shape)
    return {"y": values.reshape(posterior.num_chains, posterior.num_draws, *values.shape[1:])}


def _equals_target(log_ratios: np.ndarray, log_q: np.ndarray) -> bool:
    """Do constant log ratios mean q equals the target? Only if q itself spreads (log q varies over its
    draws) and the ratios are constant to a small fraction of that variation, in absolute terms: a
    log density near 1e300 is "constant" relative to itself while meaning nothing."""
    spread = float(np.ptp(log_q))
    tolerance = 1e-8 * max(1.0, spread)
    resolution = 1e-15 * float(np.max(np.abs(log_ratios)))  # what float64 can still tell apart there
    target_spread = float(np.ptp(np.asarray(log_ratios) + np.asarray(log_q)))
    return (
        spread > 1e-6
        and resolution <= tolerance
        and float(np.ptp(log_ratios)) <= tolerance
        and abs(target_spread - spread) <= 1e-6 * spread
    )
