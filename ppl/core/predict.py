"""The posterior predictive: a Posterior's draws, or its Gaussian over weights, pushed through the
network at new inputs, and the summaries a :class:`~ppl.Prediction` holds.

``predictive`` serves ``Posterior.predict``; the compiled maps over draws (``outputs_many``) and the
blocks of rows (``row_blocks``, padded to a few sizes so that a new number of inputs rarely compiles a
new program) also serve the Posterior's function-space draws. Every function here reads the compiled
Problem and flat draws only, never a Posterior.
"""

from __future__ import annotations

import dataclasses
import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from ppl.core import curvature
from ppl.core.errors import MemoryBudgetError, OptionError
from ppl.core.method import MEMORY_BUDGET_BYTES
from ppl.core.results import Prediction
from ppl.models._base import REGRESSION_LIKELIHOODS

__all__ = [
    "PREDICT_MODES", "DRAW_CHUNK", "PREDICT_CHUNK_BYTES", "BLOCK_BYTES", "task_of", "check_options", "check_request", "predictive",
    "outputs_many", "row_blocks", "linearized_outputs", "class_log_probs", "entropy_of", "classification_prediction",
    "regression_prediction",
]

PREDICT_MODES = ("mc", "linearized", "probit", "bridge")
DRAW_CHUNK = 64  # draws per vectorised chunk when mapping a function over many draws


def _outputs(problem, u, X):
    """(network output, noise sd) for classification (the sd then 0); for regression the output is
    the predictive mean and the sd a scalar σ or one per input (heteroscedastic)."""
    params = problem.constrain(u)
    f = problem.apply(params, X)
    if problem.likelihood in REGRESSION_LIKELIHOODS:
        return problem.model.predictive_moments(f, params)
    return f, jnp.zeros(())



@jax.jit
def outputs_many(problem, flat, X):
    return jax.lax.map(lambda u: _outputs(problem, u, X), flat, batch_size=DRAW_CHUNK)


@partial(jax.jit, static_argnames=("sites",))
def _output_moments(problem, family, X, sites=None):
    """Mean f(μ) (B, C) and covariance J Σ Jᵀ (B, C, C) of the network linearised at the mean of a
    Gaussian ``family``; the Jacobians are taken over its free coordinates only (held by ``sites``)."""
    u = family.loc
    base = problem.constrain(u)
    f = curvature._network(problem, u, base, X)
    jac = curvature.output_jacobians(problem, u, X, family.active_index, base, sites)
    return f, family.output_covariance(jac)


def linearized_outputs(problem, family, X):
    """``_output_moments`` over X in blocks of rows (:func:`row_blocks`) sized so that each block's
    Jacobians stay within the curvature service's chunk budget."""
    index = family.active_index
    free = problem.num_params if index is None else int(index.shape[0])
    outputs = problem.model.output_dim()
    sites = None
    if index is not None:
        columns = np.zeros(problem.num_params, bool)
        columns[np.asarray(index)] = True
        sites = tuple(problem.sites_of(columns))
    means, covs = [], []
    for rows, count in row_blocks(X.shape[0], curvature.chunk_rows(outputs, free)):
        f, cov = jax.device_get(_output_moments(problem, family, X[rows], sites))
        means.append(f[:count])
        covs.append(cov[:count])
    return np.concatenate(means), np.concatenate(covs)


def _gaussian_components(approximation) -> list:
    """[(weight, Gaussian)]: one for a Gaussian, the components of a Mixture."""
    if hasattr(approximation, "components"):
        return list(zip(np.asarray(approximation.weights), approximation.components))
    return [(1.0, approximation)]


def _sample_outputs(key, mean, cov, n: int) -> np.ndarray:
    """n draws (n, N, C) from N(mean_i, cov_i) per input (a symmetric square root: cov may be singular)."""
    values, vectors = np.linalg.eigh(cov)
    root = vectors * np.sqrt(np.maximum(values, 0.0))[:, None, :]
    eps = np.asarray(jax.random.normal(key, (n, *mean.shape), dtype=jnp.float64 if mean.dtype == np.float64 else None))
    return mean[None] + np.einsum("ncd,snd->snc", root, eps.astype(mean.dtype))


def _probit_log_probs(likelihood: str, mean, cov) -> np.ndarray:
    """Log class probabilities of MacKay's probit approximation; for C classes each logit is scaled
    by its own variance."""
    variance = np.diagonal(cov, axis1=-2, axis2=-1)
    scaled = mean / np.sqrt(1.0 + math.pi * variance / 8.0)
    return np.asarray(class_log_probs(likelihood, scaled[..., 0] if likelihood == "bernoulli" else scaled))


def _bridge_log_probs(likelihood: str, mean, cov) -> np.ndarray:
    """Log class probabilities of the Laplace bridge (Hobbhahn, Kristiadi & Hennig 2022): the Dirichlet whose Laplace
    approximation in the softmax basis matches the Gaussian over logits, and its mean.

    Softmax ignores a shift common to all logits, so the Gaussian is first conditioned on Σ_c f_c = 0
    (μ ← μ − Σ1 (1ᵀμ)/(1ᵀΣ1), Σ ← Σ − Σ11ᵀΣ/(1ᵀΣ1)); then with C classes
    α_c = (1 − 2/C + e^{μ_c} Σ_k e^{−μ_k} / C²) / Σ_cc, evaluated in log space."""
    row = cov.sum(axis=-1)  # Σ1, (N, C)
    total = np.maximum(row.sum(axis=-1, keepdims=True), np.finfo(np.float64).tiny)
    mean = mean - row * mean.sum(axis=-1, keepdims=True) / total
    variance = np.diagonal(cov, axis1=-2, axis2=-1) - np.square(row) / total
    C = mean.shape[-1]
    variance = np.maximum(variance, np.finfo(np.float64).tiny)
    lse = np.logaddexp.reduce(-mean, axis=-1, keepdims=True)
    constant = np.log(1.0 - 2.0 / C) if C > 2 else -np.inf
    log_alpha = np.logaddexp(constant, mean + lse - 2.0 * np.log(C)) - np.log(variance)
    return log_alpha - np.logaddexp.reduce(log_alpha, axis=-1, keepdims=True)


PREDICT_CHUNK_BYTES = 256 * 2**20  # device memory one chunk of inputs may take for its outputs
# One block of per-draw numbers in the paths that reduce as they go (predict(keep_draws=False),
# PSIS-LOO, function-space R-hat): their working copies are a small multiple of it, so peak memory
# stays a few hundred MB however many inputs and draws (docs/performance.md has the measurements).
BLOCK_BYTES = 32 * 2**20


def _check_prediction_size(num_draws: int, num_inputs: int, outputs: int) -> None:
    size = num_draws * num_inputs * outputs * 8
    if size > MEMORY_BUDGET_BYTES:
        raise MemoryBudgetError(
            f"predict: {num_draws} draws × {num_inputs} inputs × {outputs} outputs need {size / 2**30:.1f} GiB "
            f"(limit {MEMORY_BUDGET_BYTES / 2**30:.0f} GiB); pass num_samples= fewer draws, predict on batches of X, "
            "or use mode='probit' (no per-draw outputs)"
        )


def _by_rows(compute, X, per_row: int, axes: tuple):
    """``compute(X)`` (a tuple of outputs) over blocks of rows of X (:func:`row_blocks`), sized so
    that each block's outputs (``per_row`` numbers a row) stay under ``PREDICT_CHUNK_BYTES``. Output
    ``i`` is joined along ``axes[i]``, its row axis; ``None`` marks an output without one (taken from
    the first block)."""
    parts = []
    for index, count in row_blocks(X.shape[0], PREDICT_CHUNK_BYTES // max(1, per_row * 8)):
        outputs = jax.device_get(compute(X[index]))
        parts.append(tuple(out if axis is None else np.take(out, np.arange(count), axis=axis)
                           for out, axis in zip(outputs, axes)))
    if len(parts) == 1:
        return parts[0]
    return tuple(
        parts[0][i] if axis is None else np.concatenate([p[i] for p in parts], axis=axis) for i, axis in enumerate(axes)
    )


def _row_bucket(n: int) -> int:
    """The number of rows ``n`` rows are padded to: the next of 8, 12, 16, 24, 32, 48, … (2^k and
    3·2^(k−1)), so that inputs of a new size rarely need a new compiled program, and at most a third
    of the rows computed are padding."""
    size = 8
    while size < n:
        size = size * 3 // 2 if size & (size - 1) == 0 else size * 4 // 3
    return size


def row_blocks(n: int, rows: int):
    """(row indices, rows that count) for blocks of ``rows`` consecutive rows out of ``n`` (at most
    ``rows``, at most :func:`_row_bucket` of ``n``); the last block repeats the final row up to the
    common size, so one compiled shape serves every block, and every ``n`` in a bucket."""
    rows = max(1, min(int(rows), _row_bucket(n)))
    for start in range(0, n, rows):
        yield np.minimum(np.arange(start, start + rows), n - 1), min(rows, n - start)


def _summaries_by_rows(problem, flat, X, task: str, noise_axis) -> Prediction:
    """The Monte Carlo predictive's per-input summaries, chunk of rows by chunk: each chunk's
    per-draw outputs (at most ``PREDICT_CHUNK_BYTES``) are reduced before the next is computed."""
    outputs = problem.model.output_dim()
    rows = BLOCK_BYTES // max(1, flat.shape[0] * max(outputs, 2) * 8)
    names = ("mean", "variance", "epistemic_variance", "aleatoric_variance") if task == "regression" else (
        "probs", "log_probs", "entropy", "aleatoric", "epistemic")
    parts = {name: [] for name in names}
    for index, count in row_blocks(X.shape[0], rows):
        f, noise = jax.device_get(outputs_many(problem, flat, X[index]))
        f = np.asarray(f)[:, :count]
        if noise_axis is not None:
            noise = np.asarray(noise)[:, :count]
        if task == "regression":
            part = regression_prediction(np.asarray(f), np.asarray(noise))
        else:
            part = classification_prediction(np.asarray(class_log_probs(problem.likelihood, f)))
        for name in names:  # the summaries only: the block's per-draw arrays go with ``part``
            parts[name].append(getattr(part, name))
    # Homoscedastic noise is per draw (S,), the same for every block: keep it, it is small.
    kept = None if task != "regression" or noise_axis is not None else np.asarray(noise, np.float64)
    return Prediction(task=task, member_noise=kept, **{name: np.concatenate(v) for name, v in parts.items()})


def task_of(problem) -> str:
    """``"regression"`` or ``"classification"``: what the problem's likelihood predicts."""
    return "regression" if problem.likelihood in REGRESSION_LIKELIHOODS else "classification"


def check_options(mode: str, keep_draws) -> None:
    """``mode`` and ``keep_draws`` of a ``predict`` call, checked before anything is computed."""
    if mode not in PREDICT_MODES:
        raise OptionError(f"mode={mode!r} is not one of {PREDICT_MODES}")
    if not isinstance(keep_draws, (bool, np.bool_)):
        raise OptionError(f"keep_draws must be True or False, got {keep_draws!r}")
    if not keep_draws and mode != "mc":
        raise OptionError(
            f"keep_draws=False applies to mode='mc' (draws pushed through the network in chunks of rows); "
            f"mode={mode!r} computes its outputs' moments directly — leave keep_draws=True"
        )


def check_request(problem, approximation, method: str, X, mode: str, keep_draws: bool, draws: int) -> None:
    """Refuse, before any draw is taken, a mode the posterior or the likelihood does not support and
    per-draw outputs over the memory budget. ``approximation``: the Gaussian (or mixture) over
    weights, None for draws only."""
    gaussian = approximation is not None and (
        hasattr(approximation, "output_covariance") or hasattr(approximation, "components")
    )
    if mode != "mc" and not gaussian:
        raise TypeError(
            f"mode={mode!r} needs a Gaussian posterior over weights (exact, laplace, svi with a Gaussian guide); "
            f"{method!r} has none (its approximation: "
            f"{getattr(approximation, 'kind', 'draws only')}) — use mode='mc'"
        )
    task = task_of(problem)
    if mode in ("probit", "bridge") and task != "classification":
        raise OptionError(f"mode={mode!r} applies to classification; use 'linearized' for regression")
    if mode == "bridge" and problem.likelihood != "categorical":
        raise OptionError(
            "mode='bridge' maps a Gaussian over C ≥ 2 softmax logits to a Dirichlet; a bernoulli model has one "
            "logit, for which the bridge's mean is the MAP's sigmoid — use mode='probit', or "
            "likelihood='categorical' with two classes"
        )
    outputs = problem.model.output_dim()
    if keep_draws and mode in ("mc", "linearized"):
        # The per-draw outputs (S, N, C) in float64 are the result; refuse before computing them.
        _check_prediction_size(int(draws), X.shape[0], max(outputs, 2 if task == "classification" else 1))


def predictive(problem, approximation, flat, X, key, *, mode: str, keep_draws: bool) -> Prediction:
    """The predictive at inputs ``X`` from ``flat`` draws (S, P) (or, for the linearised modes,
    ``approximation``'s Gaussian over outputs, with ``flat`` giving the noise per draw); see
    ``Posterior.predict`` for the modes."""
    task = task_of(problem)
    outputs = problem.model.output_dim()
    draws = flat.shape[0]
    if mode == "mc":
        # A heteroscedastic model's noise has a row axis (one σ per input); other noise has none.
        noise_axis = 1 if problem.likelihood == "heteroscedastic" else None
        if not keep_draws:
            return _summaries_by_rows(problem, flat, X, task, noise_axis)
        f, noise = _by_rows(
            lambda rows: outputs_many(problem, flat, rows), X, flat.shape[0] * outputs, axes=(1, noise_axis)
        )
        if task == "regression":
            return regression_prediction(np.asarray(f), np.asarray(noise))
        return classification_prediction(np.asarray(class_log_probs(problem.likelihood, f)))
    components = _gaussian_components(approximation)
    moments = [(w, *linearized_outputs(problem, q, X)) for w, q in components]
    if mode in ("probit", "bridge"):
        rule = _probit_log_probs if mode == "probit" else _bridge_log_probs
        # log Σ_m w_m p_m, in log space (a mixture of Laplace components weighs each one's rule)
        log_probs = np.logaddexp.reduce(
            np.stack([math.log(w) + rule(problem.likelihood, m, c).astype(np.float64) for w, m, c in moments]),
            axis=0,
        )
        probs = np.exp(log_probs)
        # A closed-form predictive has no per-draw probabilities, so no aleatoric/epistemic split.
        return Prediction(task="classification", probs=probs, log_probs=log_probs, entropy=entropy_of(probs, log_probs))
    # linearized: draws of the outputs from each component's Gaussian over outputs
    pick_key, *keys = jax.random.split(jax.random.fold_in(key, 1), len(moments) + 1)
    pick = np.asarray(jax.random.categorical(pick_key, jnp.log(jnp.asarray([w for w, _, _ in moments])), shape=(draws,)))
    f = np.zeros((draws, X.shape[0], outputs))
    for m, ((_, mean, cov), k) in enumerate(zip(moments, keys)):
        chosen = np.flatnonzero(pick == m)
        if chosen.size:
            f[chosen] = _sample_outputs(k, mean, cov, chosen.size)
    if task == "classification":
        logits = f[..., 0] if problem.likelihood == "bernoulli" else f
        return classification_prediction(np.asarray(class_log_probs(problem.likelihood, logits)))
    # The mean outputs: all K of a multi-output model, else the first (the second of a
    # heteroscedastic model is log σ²).
    means = (lambda a: a) if problem.model.multi_output else (lambda a: a[..., 0])
    if problem.likelihood == "heteroscedastic":
        # each draw carries its own noise, and E[σ²] = e^(m + v/2)
        prediction = regression_prediction(f[..., 0], np.exp(0.5 * f[..., 1]))
        aleatoric = sum(w * np.exp(m[:, 1] + 0.5 * c[:, 1, 1]) for w, m, c in moments)
    else:
        noise = np.asarray(outputs_many(problem, flat, X[:1])[1])  # σ per draw (compiled once)
        prediction = regression_prediction(means(f), noise)
        aleatoric = prediction.aleatoric_variance
    # The linearised predictive's moments are known exactly; report them, not their MC estimates.
    mean = sum(w * means(m) for w, m, _ in moments)
    second = sum(w * (means(np.diagonal(c, axis1=1, axis2=2)) + np.square(means(m))) for w, m, c in moments)
    epistemic = np.maximum(second - np.square(mean), 0.0)
    # One Gaussian over outputs plus a noise sd that is the same for every draw: the predictive
    # is exactly Gaussian, and its density is known in closed form.
    fixed_noise = problem.likelihood != "heteroscedastic" and float(np.ptp(prediction.member_noise)) == 0.0
    return dataclasses.replace(
        prediction, mean=mean, epistemic_variance=epistemic, aleatoric_variance=aleatoric,
        variance=epistemic + aleatoric, gaussian=len(moments) == 1 and fixed_noise,
    )


def class_log_probs(likelihood: str, f) -> np.ndarray:
    """Log class probabilities from logits, in log space: in float32, 1 − sigmoid(17) is 0 and its
    log −inf, while log sigmoid(−17) = −log(1 + e^17) is −17. In NumPy: the logits are already on the
    host, and a JAX operation here would compile anew for every new number of inputs."""
    f = np.asarray(f)
    if likelihood == "bernoulli":
        return np.stack([-np.logaddexp(0.0, f), -np.logaddexp(0.0, -f)], axis=-1).astype(f.dtype, copy=False)
    shifted = f - np.max(f, axis=-1, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))


def entropy_of(p: np.ndarray, log_p: np.ndarray) -> np.ndarray:
    """−Σ p log p over the last axis from both p and its log (a class of probability 0 adds 0)."""
    return -np.sum(p * np.maximum(log_p, -np.finfo(log_p.dtype).max), axis=-1)


def classification_prediction(member_log_probs: np.ndarray) -> Prediction:
    """Summaries of S draws of log class probabilities (S, N, C); the predictive mean's log is the
    log-mean-exp over the draws, so a confident wrong draw costs its logit, not a clipped log 0.
    (Shifted by the largest draw rather than reduced pairwise with ``logaddexp``: the same to
    rounding, twice as fast on a report's 6,400-point grid under 4,000 draws.)"""
    member_log_probs = member_log_probs.astype(np.float64)
    top = np.max(member_log_probs, axis=0)
    top = np.where(np.isfinite(top), top, 0.0)  # a class every draw gives probability 0 stays at log 0 = −inf
    log_probs = top + np.log(np.mean(np.exp(member_log_probs - top), axis=0))
    member_probs = np.exp(member_log_probs)
    probs = np.exp(log_probs)
    entropy = entropy_of(probs, log_probs)
    aleatoric = entropy_of(member_probs, member_log_probs).mean(axis=0)
    return Prediction(
        task="classification",
        probs=probs,
        log_probs=log_probs,
        member_probs=member_probs,
        member_log_probs=member_log_probs,
        entropy=entropy,
        aleatoric=aleatoric,
        epistemic=np.maximum(entropy - aleatoric, 0.0),
    )


def regression_prediction(means: np.ndarray, noise: np.ndarray) -> Prediction:
    """Summaries of S draws of means (S, N) or (S, N, K) with noise sds per draw: (S,), per draw and
    input (S, N) (heteroscedastic), or per draw and output (S, K) (multi-output)."""
    means, noise = means.astype(np.float64), noise.astype(np.float64)
    prediction = Prediction(task="regression", member_means=means, member_noise=noise)
    aleatoric = np.broadcast_to(np.mean(np.square(prediction.noise_per_draw()), axis=0), means.shape[1:]).copy()
    epistemic = means.var(axis=0)
    return dataclasses.replace(
        prediction,
        mean=means.mean(axis=0),
        variance=epistemic + aleatoric,
        epistemic_variance=epistemic,
        aleatoric_variance=aleatoric,
    )
