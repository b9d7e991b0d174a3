"""Build the uniform :class:`ppl.Diagnostics` record and the ArviZ export for any Posterior."""

from __future__ import annotations

import numpy as np

from ppl._results import THRESHOLDS, Diagnostics, finite_or_none
from ppl.diagnostics import _arviz
from ppl.diagnostics.convergence import max_rhat, min_ess
from ppl.diagnostics.psis import khat, khat_threshold, psis_loo
from scipy.special import logsumexp

__all__ = ["compute_diagnostics", "to_inference_data"]

MIN_PSIS_DRAWS = 20
IWAE_K = 100  # importance samples per IWAE estimate in Diagnostics.iwae
MIN_CHAIN_DRAWS = 4  # rank-normalised split R-hat and ESS need at least this many draws per chain


def _has_hidden_layers(problem) -> bool:
    return problem.is_declarative and len(problem.layers()) > 1


def compute_diagnostics(posterior) -> Diagnostics:
    info, problem = posterior.info, posterior.problem
    record = Diagnostics(
        method=posterior.method,
        num_chains=posterior.num_chains,
        num_draws=posterior.num_draws,
        wall_time_s=posterior.wall_time_s,
    )
    notes, warnings = record.notes, record.warnings
    total_draws = posterior.num_chains * posterior.num_draws
    # What the draws are is declared by the method (Posterior.kind), never guessed from their layout:
    # an ensemble's members sit on the chain axis but are not Markov chains.
    is_sampler = posterior.kind == "chains"

    failed: list[str] = []  # the checks that set ok = False (each also has a warning)

    def fail(message: str) -> None:
        warnings.append(message)
        failed.append(message)

    nonfinite = _nonfinite_draws(posterior)
    if nonfinite:
        fail(
            f"{nonfinite} draw(s) hold NaN or inf: the run is broken and its summaries are not assessed — check the "
            "model's log density for overflow or invalid parameter values"
        )

    # -- Markov-chain convergence ------------------------------------------------------------------
    if is_sampler and nonfinite:
        for field in ("rhat_max", "rhat_function_max", "ess_bulk_min", "ess_tail_min"):
            notes[field] = "not assessed: the draws hold NaN or inf"
    elif is_sampler and posterior.num_draws < MIN_CHAIN_DRAWS:
        for field in ("rhat_max", "rhat_function_max", "ess_bulk_min", "ess_tail_min"):
            notes[field] = f"not assessed: R-hat and ESS need at least {MIN_CHAIN_DRAWS} draws per chain"
        fail(
            f"only {posterior.num_draws} draw(s) per chain: too few to assess convergence — raise num_samples"
        )
    elif is_sampler:
        arrays = list(posterior.draws.values())
        multi_chain = posterior.num_chains >= 2
        record.rhat_max = max_rhat(arrays) if multi_chain else None
        record.ess_bulk_min = min_ess(arrays, "bulk")
        record.ess_tail_min = min_ess(arrays, "tail")
        functions = posterior.function_draws()
        if functions is not None and multi_chain:
            record.rhat_function_max = max_rhat([functions])
        elif functions is None:
            notes["rhat_function_max"] = "plain NumPyro program: no network outputs to probe"
        symmetric = _has_hidden_layers(problem)
        if not multi_chain:
            notes["rhat_max"] = notes["rhat_function_max"] = "R-hat compares chains: run num_chains ≥ 2"
        elif symmetric:
            notes["rhat_max"] = (
                "weight-space R-hat of a network with hidden layers is inflated by permutation and sign "
                "symmetries even for a perfect sampler; judge convergence by rhat_function_max"
            )
        # Without hidden layers weights are identifiable and both R-hats count; with them, only the
        # function-space one does. One warning names the worst.
        candidates = [("function-space R-hat", record.rhat_function_max)]
        if not symmetric:
            candidates.append(("R-hat", record.rhat_max))
        label, worst = max(((n, v) for n, v in candidates if v is not None), key=lambda c: c[1], default=(None, None))
        if worst is not None and worst > THRESHOLDS["rhat"]:
            fail(
                f"{label} {worst:.3f} > {THRESHOLDS['rhat']}: chains disagree — run longer "
                "(num_warmup, num_samples) or reparameterise"
            )
        ess_needed = THRESHOLDS["ess_per_chain"] * posterior.num_chains
        for field, label in (("ess_bulk_min", "bulk"), ("ess_tail_min", "tail")):
            value = getattr(record, field)
            if value is not None and value < ess_needed and not symmetric:
                fail(
                    f"{label} ESS {value:.0f} < {ess_needed} (100 per chain): estimates are noisy — draw more samples"
                )
        if symmetric:
            notes["ess_bulk_min"] = notes["ess_tail_min"] = "weight-space ESS; see the note on rhat_max"
            if functions is not None:
                # Weight-space ESS says nothing for such networks; the network's outputs still must
                # be sampled well enough, with one chain as with several.
                for label in ("bulk", "tail"):
                    value = min_ess([functions], label)
                    if value is None:
                        continue
                    notes[f"ess_{label}_min"] += f"; function-space {label} ESS {value:.0f}"
                    if value < ess_needed:
                        fail(
                            f"function-space {label} ESS {value:.0f} < {ess_needed} (100 per chain): the network's "
                            "outputs are estimated from too few effective draws — draw more samples"
                        )
        stuck = _stuck_chains(posterior)
        if stuck:
            fail(
                f"chain(s) {', '.join(map(str, stuck))} never moved in some parameters (constant draws): the sampler "
                "is stuck — check the initial values and the step size (divergences), or reparameterise"
            )
    elif posterior.kind == "members":
        _member_notes(posterior, notes)
    else:
        why = (
            "a point estimate has no spread to diagnose"
            if not posterior.has_density
            else "draws are independent samples from the fitted approximation q, not Markov chains"
        )
        for field in ("rhat_max", "rhat_function_max", "ess_bulk_min", "ess_tail_min"):
            notes[field] = why

    if "diverging" in info:
        record.divergences = int(info["divergences"])
        if record.divergences > THRESHOLDS["divergences"]:
            fail(
                f"{record.divergences} divergent transitions after warmup: the sampler missed part of the "
                "posterior — raise target_accept or reparameterise"
            )
    else:
        notes["divergences"] = "only Hamiltonian samplers diverge"
    if "tree_depth_hits" in info:
        record.tree_depth_hits = int(info["tree_depth_hits"])
        if record.tree_depth_hits:
            warnings.append(
                f"{record.tree_depth_hits} transitions hit max_tree_depth={info['max_tree_depth']}: "
                "an efficiency problem, not a validity one — raise max_tree_depth or use dense_mass"
            )
    else:
        notes["tree_depth_hits"] = "only NUTS builds trees"
    if info.get("leapfrog_cap_hits"):
        warnings.append(
            f"{info['leapfrog_cap_hits']} transitions were cut at {info['max_leapfrog_steps']} leapfrog steps: the "
            "adapted step size is tiny against trajectory_length, so the posterior is badly scaled — rescale the "
            "parameters or data, or use nuts"
        )
    if "energy" in info and np.shape(info["energy"])[-1] >= 2:
        record.ebfmi_min = finite_or_none(np.min(ebfmi(np.asarray(info["energy"], dtype=float))))
        if record.ebfmi_min is not None and record.ebfmi_min < THRESHOLDS["ebfmi"]:
            fail(
                f"E-BFMI {record.ebfmi_min:.2f} < {THRESHOLDS['ebfmi']}: the momentum resampling barely moves the "
                "energy, so the sampler explores the posterior's tails poorly (a funnel-like geometry) — reparameterise "
                "(non-centred), or rescale the parameters"
            )
        elif record.ebfmi_min is None:
            notes["ebfmi_min"] = "the energies are constant or not finite"
    else:
        notes["ebfmi_min"] = "only Hamiltonian samplers record energies"

    # -- the approximation against the target --------------------------------------------------------
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
    elif "elbo_estimate" in info:
        # A model with local latents: the bounds on log p(D) were estimated after training with
        # fresh draws of each datum's latents (svi records them).
        record.elbo = finite_or_none(info["elbo_estimate"])
        record.iwae = finite_or_none(info["iwae_estimate"])
    if log_ratios is not None and total_draws < MIN_PSIS_DRAWS:
        notes["khat"] = notes["khat_threshold"] = f"PSIS needs at least {MIN_PSIS_DRAWS} draws; raise num_draws"
    elif log_ratios is not None:
        record.khat_threshold = khat_threshold(total_draws)
        if not np.all(np.isfinite(log_ratios)):
            record.khat = float("inf")
            notes["khat"] = "log p − log q is not finite for some draws of q"
        elif np.ptp(log_ratios) <= 1e-10 * max(1.0, float(np.abs(log_ratios).max())):
            if info.get("closed_form"):
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
                record.khat = float("inf")
                notes["khat"] = "log p − log q is constant over the draws: q is degenerate (its spread is ~0)"
                fail(
                    "log p − log q is constant over q's draws, which only a closed-form posterior achieves: q is "
                    "degenerate (collapsed scales, or draws that do not vary) and its uncertainty is meaningless — "
                    "lower learning_rate or use more steps"
                )
        else:
            record.khat = khat(log_ratios)
        if record.khat > record.khat_threshold and not notes.get("khat", "").endswith("(its spread is ~0)"):
            fail(
                f"PSIS k-hat {record.khat:.2f} > {record.khat_threshold:.2f}: the approximation q misses the "
                "posterior's tails — do not trust its uncertainty; try a richer guide or NUTS"
            )
    else:
        reason = {
            "chains": "samplers have no density q(θ)", "members": "an ensemble of optima has no density q(θ)",
        }.get(posterior.kind, "a point estimate has no density")
        if posterior.problem is not None and posterior.problem.local_sites:
            reason = "the model has local latents: see ppl.diagnostics.vae_report for per-datum k-hat"
        notes["khat"] = notes["khat_threshold"] = reason
        if record.elbo is None:
            notes["elbo"] = notes["iwae"] = reason
        log_ratios = None
    if info.get("kl_warmup"):
        warmup, done = int(info["kl_warmup"]), int(info.get("steps_done", len(info.get("losses", ()))))
        if done < warmup:
            fail(
                f"the run stopped during KL warm-up (step {done} of {warmup}): it optimised a down-weighted prior/KL "
                "side, not the bound — resume it or train longer than kl_warmup"
            )
        else:
            record.warnings.append(
                f"KL warm-up weighted the prior/KL side below its value for the first {warmup} steps: losses recorded "
                "then are not the bound (the final objective is)"
            )
    inflation = info.get("variance_inflation")
    if inflation is not None and inflation > THRESHOLDS["variance_inflation"]:
        fail(
            f"the step size and the minibatch gradient noise inflate the stationary variance by a predicted factor "
            f"{inflation:.3g} (standard deviations {np.sqrt(inflation):.3g}×) against the posterior's: the draws are too "
            "spread out — lower step_size, raise batch_size, or check the data for outliers"
        )
    if "log_evidence" in info:
        record.log_evidence = float(info["log_evidence"])
    else:
        notes["log_evidence"] = "only closed-form methods give the log evidence"
    if info.get("failed"):
        fail(f"the run failed and this is its last finite state: {info['failed']}")
    if info.get("interrupted"):
        fail(
            "the run was interrupted (Ctrl-C): this is a partial result — "
            + (f"{info['chains_done']} chain(s) finished" if "chains_done" in info else f"{info.get('steps_done')} steps done")
        )
    if info.get("converged") is False:
        fail(
            f"the optimisation did not converge: {info.get('convergence', 'the loss did not settle')} — raise steps, "
            "or adjust learning_rate"
        )

    # -- PSIS-LOO ------------------------------------------------------------------------------------
    loo_unavailable = problem.spec.no_pointwise_reason
    if nonfinite:
        notes["elpd_loo"] = notes["loo_khat_max"] = "not assessed: the draws hold NaN or inf"
    elif total_draws == 1:
        notes["elpd_loo"] = notes["loo_khat_max"] = "PSIS-LOO needs posterior draws; a point estimate has one"
    elif total_draws < MIN_PSIS_DRAWS:
        notes["elpd_loo"] = notes["loo_khat_max"] = f"PSIS-LOO needs at least {MIN_PSIS_DRAWS} draws"
    elif loo_unavailable is not None:
        notes["elpd_loo"] = notes["loo_khat_max"] = loo_unavailable
    else:
        loglik = posterior.pointwise_log_likelihood()
        flat = loglik.reshape(total_draws, -1)
        if is_sampler:
            elpd, _, k = psis_loo(flat, reff=_arviz.relative_efficiency(list(posterior.draws.values())))
        else:
            usable = record.khat is not None and record.khat <= record.khat_threshold
            elpd, _, k = psis_loo(flat, log_correction=log_ratios if usable else None)
            if not usable and log_ratios is not None:
                notes["elpd_loo"] = (
                    "q is too far from the posterior (k-hat above its threshold) to correct by; LOO uses q's draws as is"
                )
        record.elpd_loo = finite_or_none(elpd)
        record.loo_khat_max = None if np.isnan(np.max(k)) else float(np.max(k))
        if record.loo_khat_max == float("-inf"):
            notes["loo_khat_max"] = "every observation's importance weights are bounded (no Pareto tail to fit)"
        if record.loo_khat_max is not None and record.loo_khat_max > THRESHOLDS["loo_khat"]:
            bad = int(np.sum(k > THRESHOLDS["loo_khat"]))
            warnings.append(
                f"PSIS-LOO k-hat > 0.7 for {bad} observation(s): elpd_loo is unreliable for them — "
                "use K-fold cross-validation or more draws"
            )

    record.ok = not failed
    return record


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
    if problem.is_declarative:
        for layer in problem.layers():
            if posterior.draws[layer.weight].ndim == 4:
                dims[layer.weight] = [f"{layer.weight}_in", f"{layer.weight}_out"]
            else:
                dims[layer.weight] = ["feature"]
            if layer.bias is not None and posterior.draws[layer.bias].ndim == 3:
                dims[layer.bias] = [f"{layer.weight}_out"]
    return dims


def to_inference_data(posterior):
    """ArviZ InferenceData: posterior, sample_stats, log_likelihood, observed_data, named dims."""
    info, problem = posterior.info, posterior.problem
    stats = {}
    if "diverging" in info:
        stats = {
            "diverging": info["diverging"],
            "n_steps": info["num_steps"],
            "acceptance_rate": info["accept_prob"],
            "energy": info["energy"],
        }
    log_ratios = posterior.log_density_ratios()
    if log_ratios is not None:
        stats["log_ratio"] = log_ratios.reshape(posterior.num_chains, posterior.num_draws)
    observed = posterior.observed_data()
    # One pointwise log-likelihood: named after the observed site, or "joint" when several observed
    # sites are summed per datum.
    loglik = posterior.pointwise_log_likelihood()
    name = problem.spec.observed[0] if len(problem.spec.observed) == 1 else "joint"
    return _arviz.inference_data(
        posterior=posterior.draws,
        sample_stats=stats,
        log_likelihood={} if loglik is None else {name: loglik},
        observed_data=observed,
        dims=_dims(posterior, name),
    )


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
