"""``Posterior``: the one result type every method returns."""

from __future__ import annotations

import dataclasses
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from functools import partial

from ppl.core import curvature
from ppl.core import registry
from ppl.core import vae
from ppl.core.data import validate_inputs, validate_supervised
from ppl.core.errors import MemoryBudgetError, OptionError, RunError
from ppl.core.guide import numpyro_guide
from ppl.core.keys import as_key, check_num_samples
from ppl.core.method import MEMORY_BUDGET_BYTES, Method
from ppl.core.problem import structure_trace
from ppl.core.records import RECORDS, ChainStats, Evidence, RunStatus, TrainingTrace
from ppl.core.results import POSTERIOR_KINDS, Prediction
from ppl.diagnostics import compute_diagnostics, to_inference_data
from ppl.diagnostics.summary import summary as parameter_summary
from ppl.io.store import not_importable, save_posterior
from ppl.models._base import REGRESSION_LIKELIHOODS

__all__ = ["Posterior", "PREDICT_MODES"]

PREDICT_MODES = ("mc", "linearized", "probit", "bridge")
_CHUNK = 64  # draws per vectorised chunk when mapping a function over many draws


# Module-level jitted maps over draws: the Problem is a pytree argument, so they compile once per
# problem layout and shape, whatever the data values.
@partial(jax.jit, static_argnames=("method",))
def _over_draws(problem, draws, method: str):
    """``problem.<method>`` mapped over draws (a leading axis), in vectorised chunks."""
    return jax.lax.map(getattr(problem, method), draws, batch_size=_CHUNK)


def _outputs(problem, u, X):
    """(network output, noise sd) for classification (the sd then 0); for regression the output is
    the predictive mean and the sd a scalar σ or one per input (heteroscedastic)."""
    params = problem.constrain(u)
    f = problem.apply(params, X)
    if problem.likelihood in REGRESSION_LIKELIHOODS:
        return problem.model.predictive_moments(f, params)
    return f, jnp.zeros(())


@jax.jit
def _loglik_rows(problem, flat, batch):
    """log p(y_i | θ_s) (S, n) of the rows in ``batch``, mapped over draws in vectorised chunks."""
    return jax.lax.map(lambda u: problem.pointwise_loglik(u, batch), flat, batch_size=_CHUNK)


@jax.jit
def _outputs_many(problem, flat, X):
    return jax.lax.map(lambda u: _outputs(problem, u, X), flat, batch_size=_CHUNK)


@partial(jax.jit, static_argnames=("sites",))
def _output_moments(problem, family, X, sites=None):
    """Mean f(μ) (B, C) and covariance J Σ Jᵀ (B, C, C) of the network linearised at the mean of a
    Gaussian ``family``; the Jacobians are taken over its free coordinates only (held by ``sites``)."""
    u = family.loc
    base = problem.constrain(u)
    f = curvature._network(problem, u, base, X)
    jac = curvature.output_jacobians(problem, u, X, family.active_index, base, sites)
    return f, family.output_covariance(jac)


def _linearized_outputs(problem, family, X):
    """``_output_moments`` over X in blocks of rows (:func:`_row_blocks`) sized so that each block's
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
    for rows, count in _row_blocks(X.shape[0], curvature.chunk_rows(outputs, free)):
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
    return np.asarray(_class_log_probs(likelihood, scaled[..., 0] if likelihood == "bernoulli" else scaled))


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
    """``compute(X)`` (a tuple of outputs) over blocks of rows of X (:func:`_row_blocks`), sized so
    that each block's outputs (``per_row`` numbers a row) stay under ``PREDICT_CHUNK_BYTES``. Output
    ``i`` is joined along ``axes[i]``, its row axis; ``None`` marks an output without one (taken from
    the first block)."""
    parts = []
    for index, count in _row_blocks(X.shape[0], PREDICT_CHUNK_BYTES // max(1, per_row * 8)):
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


def _row_blocks(n: int, rows: int):
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
    for index, count in _row_blocks(X.shape[0], rows):
        f, noise = jax.device_get(_outputs_many(problem, flat, X[index]))
        f = np.asarray(f)[:, :count]
        if noise_axis is not None:
            noise = np.asarray(noise)[:, :count]
        if task == "regression":
            part = _regression(np.asarray(f), np.asarray(noise))
        else:
            part = classification_prediction(np.asarray(_class_log_probs(problem.likelihood, f)))
        for name in names:  # the summaries only: the block's per-draw arrays go with ``part``
            parts[name].append(getattr(part, name))
    # Homoscedastic noise is per draw (S,), the same for every block: keep it, it is small.
    kept = None if task != "regression" or noise_axis is not None else np.asarray(noise, np.float64)
    return Prediction(task=task, member_noise=kept, **{name: np.concatenate(v) for name, v in parts.items()})


class Posterior:
    """The result of ``ppl.fit``: draws, the approximation (if it has one), and everything to
    diagnose, predict, export and save.

    Attributes:
        method: registry name of the method that produced it.
        kind: what the draws are, as the method declares it: ``"chains"`` (Markov chains),
            ``"independent"`` (draws from a fitted density), ``"point"``, ``"members"`` (an
            ensemble's separate optima, one per chain slot) or ``"mixture"``; the diagnostics read it.
        num_chains, num_draws: layout of ``draws``.
        draws: dict site -> array (chain, draw, *site_shape), constrained space: every latent site,
            then every ``numpyro.deterministic`` site of a plain program (recomputed from the latent
            draws by replaying the model on the training data).
        deterministic_sites: names of the deterministic sites among ``draws`` (plain programs).
        function_sites: the deterministic sites whose draws are the function space of the
            diagnostics (``ppl.fit(..., function_sites=...)``); empty otherwise.
        status: how the run ended (:class:`RunStatus`: interrupted, failed, converged, ...).
        trace: the optimisation's loss curve (:class:`TrainingTrace`), None for samplers.
        chain_stats: per-transition statistics of Markov chains (:class:`ChainStats`), else None.
        evidence: log evidence and bounds the method computed itself (:class:`Evidence`), else None.
        info: what is particular to one method (its guide, a prior precision, SWAG's snapshot
            count, ...); shared code reads only the typed records above.
        wall_time_s, seed, options: how it was produced.
        approximation: the fitted family (``Gaussian``, ``PointMass``) for density methods; None for
            samplers.
    """

    def __init__(
        self,
        *,
        method: str,
        kind: str,
        problem,
        flat_draws,
        status: RunStatus | None = None,
        trace: TrainingTrace | None = None,
        chain_stats: ChainStats | None = None,
        evidence: Evidence | None = None,
        info: dict | None = None,
        options: dict | None = None,
        seed=None,
        approximation=None,
        wall_time_s: float = 0.0,
    ):
        flat_draws = jnp.asarray(flat_draws)
        if flat_draws.ndim != 3 or flat_draws.shape[-1] != problem.num_params:
            raise ValueError(
                f"flat_draws must have shape (chain, draw, {problem.num_params}), got {flat_draws.shape}"
            )
        if kind not in POSTERIOR_KINDS:
            raise ValueError(f"kind={kind!r} is not one of {POSTERIOR_KINDS}")
        self.method = method
        self.kind = kind
        self.problem = problem
        self.flat_draws = flat_draws
        self.num_chains, self.num_draws = int(flat_draws.shape[0]), int(flat_draws.shape[1])
        self.status = RunStatus() if status is None else status
        self.trace, self.chain_stats, self.evidence = trace, chain_stats, evidence
        self.info = dict(info or {})
        self.options = dict(options or {})
        self.seed = seed
        self.approximation = approximation
        self.wall_time_s = float(wall_time_s)
        # Set for partial runs (interrupted, checkpoints): what ppl.fit(..., resume=...) continues from.
        self.resume_state = None
        # What a resumed run must share with this one (set by ppl.fit; None for hand-built results).
        self.fingerprint = None
        # What ran (model with its settings, data size and source, package versions); set by ppl.fit.
        self.provenance: dict = {}
        self.program = None  # a detached run's program name (see Posterior.detached)
        # (X, y) rows the fit never saw, checked by the diagnostics (see Posterior.hold_out)
        self.heldout = None
        # (guide, encoder parameters) of a model with local latents (a VAE fitted by svi)
        self.local_guide = None
        self.deterministic_sites = tuple(site.name for site in problem.deterministic_sites)
        self.function_sites = tuple(problem.function_sites)
        # Deterministic sites are computed here, in the same replay of the model that constrains
        # the latent draws (vectorised and jitted, in chunks of draws).
        constrained = _over_draws(problem, self._flat(), "constrain_all")
        self.draws = {
            name: np.asarray(value).reshape(self.num_chains, self.num_draws, *value.shape[1:])
            for name, value in constrained.items()
        }
        self._cache: dict = {}

    @classmethod
    def detached(cls, *, method, kind, draws, records, info, options, seed, wall_time_s, diagnostics, program, folder,
                 sampler, provenance, deterministic_sites=(), function_sites=()):
        """A loaded run of a plain NumPyro program whose program was not passed back.

        It holds the constrained draws, the saved diagnostics and the metadata. Everything that
        must run the model (prediction, densities, fresh draws, LOO, export) raises an error that
        says how to re-attach the program: ``ppl.load(path, model=fn)``.
        """
        self = cls.__new__(cls)
        self.method, self.problem, self.flat_draws, self.approximation = method, None, None, None
        self.kind = kind
        self.draws = {k: np.asarray(v) for k, v in draws.items()}
        self.deterministic_sites, self.function_sites = tuple(deterministic_sites), tuple(function_sites)
        first = next(iter(self.draws.values()))
        self.num_chains, self.num_draws = int(first.shape[0]), int(first.shape[1])
        self.status, self.trace, self.chain_stats, self.evidence = (records[name] for name in RECORDS)
        self.info, self.options, self.seed = dict(info), dict(options), seed
        self.wall_time_s = float(wall_time_s)
        self.resume_state = self.fingerprint = None
        self.provenance = dict(provenance)
        self.program, self._folder = program, folder
        self.local_guide = self.heldout = None
        # Stored draws of a sampler can be resampled without the model; draws from q cannot be made anew.
        self._detached_sampler = bool(sampler)
        self._cache = {} if diagnostics is None else {"diagnostics": diagnostics}
        return self

    # -- models with local latents (VAE) ----------------------------------------------------------
    def encode(self, X) -> tuple:
        """q(z | x) per row of X as (loc, scale), each (N, latent_dim). VAE posteriors only."""
        return vae.encode(self, X)

    def decode(self, z) -> np.ndarray:
        """E[x | z] for latents z (N, latent_dim). VAE posteriors only."""
        return vae.decode(self, z)

    def generate(self, n: int, *, seed) -> np.ndarray:
        """``n`` new data points from the fitted generative model. VAE posteriors only."""
        return vae.generate(self, n, seed)

    def reconstruct(self, X, *, seed) -> np.ndarray:
        """E[x | z], z ∼ q(z | x), per row of X. VAE posteriors only."""
        return vae.reconstruct(self, X, seed)

    def log_marginal(self, X, num_samples: int = 500, *, seed) -> np.ndarray:
        """Importance-sampled log p(x) per row of X (K = ``num_samples``). VAE posteriors only."""
        return vae.log_marginal(self, X, num_samples, seed)

    def local_model(self, X):
        """p(z | x) of the rows of X with the decoder fixed, as a program any method fits."""
        return vae.local_model(self, X)

    @property
    def is_detached(self) -> bool:
        return self.problem is None

    def _attached(self, what: str) -> None:
        if self.problem is None:
            raise RunError(
                f"{what} needs the model, and this run of the plain NumPyro program {self.program} was loaded "
                f"without it (loading never imports code named in a run folder): "
                f"ppl.load({self._folder!r}, model={self.program.rsplit('.', 1)[-1]}) re-attaches it"
            )

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}{tuple(v.shape[2:])}" for k, v in self.draws.items())
        detached = f", detached from {self.program}" if self.problem is None else ""
        return (
            f"Posterior(method={self.method!r}, chains={self.num_chains}, draws={self.num_draws}, "
            f"sites=[{shapes}]{detached})"
        )

    # -- draws -------------------------------------------------------------------------------------
    def _flat(self) -> jax.Array:
        return self.flat_draws.reshape(-1, self.flat_draws.shape[-1])

    @property
    def latent_draws(self) -> dict:
        """``draws`` of the latent sites only (the deterministic sites left out): the weight space
        that R-hat and ESS are computed in."""
        return {k: v for k, v in self.draws.items() if k not in self.deterministic_sites}

    @property
    def has_density(self) -> bool:
        return self.approximation is not None and self.approximation.has_density

    def _flat_sample(self, n: int, key) -> jax.Array:
        check_num_samples(n)
        self._attached("sampling")
        if self.has_density:
            return self.approximation.sample(key, int(n))
        flat = self._flat()
        total = flat.shape[0]
        index = jax.random.choice(key, total, (int(n),), replace=int(n) > total)
        return flat[index]

    def sample(self, n: int, *, seed) -> dict:
        """``n`` draws (dict site -> (n, *shape), constrained): fresh from q for density methods,
        resampled from the stored draws for samplers. Deterministic sites come with them."""
        if self.problem is None and self._detached_sampler:
            check_num_samples(n)
            total = self.num_chains * self.num_draws
            index = np.asarray(jax.random.choice(as_key(seed), total, (int(n),), replace=int(n) > total))
            return {k: v.reshape(total, *v.shape[2:])[index] for k, v in self.draws.items()}
        constrained = _over_draws(self.problem, self._flat_sample(n, as_key(seed)), "constrain_all")
        return {k: np.asarray(v) for k, v in constrained.items()}

    def log_prob(self, draws: dict) -> np.ndarray:
        """log q(θ) of constrained draws (dict site -> (n, *shape)) under the fitted approximation."""
        self._attached("log_prob")
        if not self.has_density:
            raise TypeError(
                f"method {self.method!r} has no density q(θ) (it is a sampler or a point estimate); "
                "log_prob is defined for methods with a fitted approximation (exact, svi with a Gaussian guide)"
            )
        missing = [s.name for s in self.problem.sites if s.name not in draws]
        if missing:
            raise KeyError(f"draws lack the sites {missing}; expected {[s.name for s in self.problem.sites]}")
        params = {s.name: jnp.asarray(draws[s.name], dtype=self.flat_draws.dtype) for s in self.problem.sites}
        flat = _over_draws(self.problem, params, "unconstrain")
        # Change of variables: q(θ) = q_u(u(θ)) / |det ∂θ/∂u|.
        return np.asarray(self.approximation.log_prob(flat) - _over_draws(self.problem, flat, "log_jacobian"))

    def as_numpyro_guide(self):
        """This posterior as a NumPyro guide function over the model's latent sites.

        Usable wherever NumPyro takes a guide: ``numpyro.infer.Predictive(model, guide=guide,
        num_samples=...)``, ``numpyro.infer.Trace_ELBO().loss(key, {}, model, guide, *args)``
        (its ELBO is the one ``diagnostics().elbo`` reports), or as a starting point elsewhere.
        It draws u from the fitted density q and records each site's constrained value, with the
        transforms' log-Jacobian, so its density over the sites is q(θ). Needs a posterior with a
        density (exact, svi with a Gaussian or flow guide, laplace, swag, mola), and a model
        without local latents.
        """
        self._attached("as_numpyro_guide")
        if not self.has_density:
            raise TypeError(
                f"method {self.method!r} ({self.kind}) has no density q(θ), so it cannot be a NumPyro guide; "
                "use a method with one (exact, svi, laplace, swag, mola), or numpyro.infer.Predictive with "
                "posterior_samples=post.sample(n, seed=...)"
            )
        if self.problem.local_sites:
            raise TypeError(
                "this model has local latents (a VAE): its guide includes the encoder, which the Posterior does "
                "not expose as a NumPyro guide; use post.local_model(X) for the local posterior of chosen rows"
            )
        return numpyro_guide(self.problem, self.approximation)

    # -- cached per-draw quantities used by diagnostics --------------------------------------------
    def pointwise_log_likelihood(self) -> np.ndarray | None:
        """log p(y_i | θ_s) for the stored draws and training data, shape (chain, draw, N); None when
        the model has no per-datum observations (``problem.spec.no_pointwise_reason`` says why)."""
        self._attached("the pointwise log likelihood")
        if self.problem.spec.no_pointwise_reason is not None:
            return None
        if "loglik" not in self._cache:
            values = np.asarray(_over_draws(self.problem, self._flat(), "pointwise_loglik"))
            self._cache["loglik"] = values.reshape(self.num_chains, self.num_draws, -1)
        return self._cache["loglik"]

    def pointwise_log_likelihood_chunks(self, max_bytes: int = BLOCK_BYTES):
        """``pointwise_log_likelihood`` as (S, n) blocks of consecutive observations (S draws,
        chains flattened), each of at most ``max_bytes``, computed one at a time and not kept:
        what PSIS-LOO reads, so that 100,000 observations × 1,000 draws (800 MB whole) take one
        block of memory at a time. Yields nothing when the model has no per-datum observations;
        one block (the whole array) when it is already computed, is small enough, or the model is
        a plain program (its data are the program's arguments, which ppl cannot cut into rows)."""
        self._attached("the pointwise log likelihood")
        if self.problem.spec.no_pointwise_reason is not None:
            return
        total = self.num_chains * self.num_draws
        rows = max(1, int(max_bytes) // (total * 8))
        n = self.problem.num_data
        by_rows = self.problem.is_declarative or self.problem.spec.kind == "unsupervised"
        if "loglik" in self._cache or not by_rows or rows >= n:
            yield self.pointwise_log_likelihood().reshape(total, -1)
            return
        flat = self._flat()
        for index, count in _row_blocks(n, rows):
            block = _loglik_rows(self.problem, flat, self.problem.batch(index))
            yield np.asarray(block, dtype=np.float64)[:, :count]

    def observed_data(self) -> dict:
        """Observed site values on the training data (dict name -> array), for the ArviZ export."""
        if self.problem.is_declarative:
            return {"y": np.asarray(self.problem.data[1])}
        args, kwargs = self.problem._call(self.problem.data)
        tr = structure_trace(self.problem.model, args, kwargs)
        return {name: np.asarray(tr[name]["value"]) for name in self.problem.spec.observed}

    def log_density_ratios(self) -> np.ndarray | None:
        """log p̃(θ_s, D) − log q(θ_s) over the stored draws (flattened); None without a density."""
        if not self.has_density or self.problem.local_sites:
            return None  # with local latents, log p̃(u, D) needs them integrated out (vae_report does)
        if "log_ratio" not in self._cache:
            flat = self._flat()
            log_q = np.asarray(self.approximation.log_prob(flat))
            self._cache["log_q"] = log_q
            self._cache["log_ratio"] = np.asarray(_over_draws(self.problem, flat, "logdensity_fn")) - log_q
        return self._cache["log_ratio"]

    def function_draws(self) -> np.ndarray | None:
        """The draws in function space: a declarative network's outputs on the fixed probe batch,
        (chain, draw, M[, C]); for a plain program, its ``function_sites`` flattened and joined,
        (chain, draw, M); None for a plain program without function sites."""
        if not self.problem.is_declarative:
            if not self.function_sites:
                return None
            parts = [self.draws[name].reshape(self.num_chains, self.num_draws, -1) for name in self.function_sites]
            return np.concatenate(parts, axis=-1)
        if "function" not in self._cache:
            f, _ = _outputs_many(self.problem, self._flat(), self.problem.probe_inputs())
            f = np.asarray(f)
            self._cache["function"] = f.reshape(self.num_chains, self.num_draws, *f.shape[1:])
        return self._cache["function"]

    def function_draws_chunks(self, X, max_bytes: int = BLOCK_BYTES):
        """The network's outputs at inputs ``X`` (N, D) under every stored draw, as
        (chain, draw, n, outputs) blocks of consecutive rows of at most ``max_bytes``, computed one
        at a time: function-space diagnostics over many inputs
        (:func:`ppl.diagnostics.function_rhat`) without the whole (draws × N) array.
        Outputs are those ``function_draws`` holds on the probe batch: logits for classification,
        the predictive mean for regression."""
        self._attached("function draws")
        self.problem._require_declarative("function draws at new inputs")
        X = self._new_inputs(X)
        flat = self._flat()
        width = max(1, self.problem.model.output_dim())
        for index, count in _row_blocks(X.shape[0], int(max_bytes) // (flat.shape[0] * width * 8)):
            f = np.asarray(jax.device_get(_outputs_many(self.problem, flat, X[index])[0]))[:, :count]
            yield f.reshape(self.num_chains, self.num_draws, count, -1)

    def _new_inputs(self, X) -> np.ndarray:
        """``X`` checked against the training inputs' per-row shape, in their dtype."""
        any_rank = getattr(self.problem.model, "accepts_array_inputs", False)
        # A NumPy array: converting on the host compiles nothing, whatever the number of rows.
        X = np.asarray(validate_inputs(X, any_rank=any_rank), dtype=self.problem.data[0].dtype)
        if X.shape[1:] != self.problem.data[0].shape[1:]:
            what = "features" if X.ndim == 2 else "as its per-row shape"
            raise OptionError(
                f"X has {X.shape[1:] if X.ndim > 2 else X.shape[1]} {what} but the model was fitted on "
                f"{self.problem.data[0].shape[1:] if X.ndim > 2 else self.problem.data[0].shape[1]}"
            )
        return X

    # -- prediction --------------------------------------------------------------------------------
    def predict(self, X, *, seed, num_samples: int | None = None, mode: str = "mc", keep_draws: bool = True) -> Prediction:
        """Posterior predictive at inputs ``X`` (N, D).

        ``mode="mc"`` pushes posterior draws through the network. The other modes use the network
        linearised at the approximation's mean, f(θ) ≈ f(μ) + J (θ − μ) (Immer et al. 2021), whose
        outputs are Gaussian, N(f(μ), J Σ Jᵀ), with J Σ Jᵀ computed by Σ's own structure:
        ``"linearized"`` draws outputs (logits for classification) from it (regression reports its
        exact mean and variance); ``"probit"`` (classification) gives σ(f / √(1 + π v / 8))
        (MacKay 1992; per class for softmax); ``"bridge"`` (classification) the mean of the
        Laplace-bridge Dirichlet (Hobbhahn et al. 2022). They need a Gaussian posterior or a mixture
        of Gaussians (averaged over components). With ``num_samples=None`` as many draws as stored.

        ``X`` must be prepared as the training inputs were. ``ppl.datasets`` standardises inputs
        with the training split's statistics (and ``diabetes`` its target), so for raw rows::

            data = ppl.datasets.load_file("train.csv", target="y", seed=0)   # or datasets.load(name)
            pred = post.predict((X_raw - data.input_mean) / data.input_std, seed=0)
            mean = pred.mean * data.target_std + data.target_mean          # regression, raw units
            lower, upper = pred.interval(0.9)                              # times target_std plus target_mean

        ``ppl predict RUN --data FILE`` does this from the scaling the run saved.

        Memory: the per-draw outputs are computed in chunks of rows of at most
        ``PREDICT_CHUNK_BYTES`` (256 MiB), and with ``keep_draws=True`` (the default) the result
        keeps them, S × N × C numbers (refused up front above 4 GiB). ``keep_draws=False``
        (``mode="mc"``) reduces each block of rows (``BLOCK_BYTES``, 32 MiB of per-draw numbers)
        to its per-input summaries (probabilities, entropy and its split; mean and variances)
        before the next, so memory is one block and its working copies plus O(N · C), whatever
        the number of draws. The prediction then has no ``member_*`` arrays, and what needs them
        (a regression ``interval`` or ``log_prob``, ``member_probs``) says so.
        """
        if mode not in PREDICT_MODES:
            raise OptionError(f"mode={mode!r} is not one of {PREDICT_MODES}")
        if not isinstance(keep_draws, (bool, np.bool_)):
            raise OptionError(f"keep_draws must be True or False, got {keep_draws!r}")
        if not keep_draws and mode != "mc":
            raise OptionError(
                f"keep_draws=False applies to mode='mc' (draws pushed through the network in chunks of rows); "
                f"mode={mode!r} computes its outputs' moments directly — leave keep_draws=True"
            )
        self._attached("predict")
        if not self.problem.is_declarative:
            raise TypeError(
                "predict needs a declarative model from ppl.models; for a plain NumPyro function use "
                "numpyro.infer.Predictive(model, posterior_samples=post.sample(n, seed=...))"
            )
        X = self._new_inputs(X)
        key = as_key(seed)
        gaussian = self.has_density and (
            hasattr(self.approximation, "output_covariance") or hasattr(self.approximation, "components")
        )
        if mode != "mc" and not gaussian:
            raise TypeError(
                f"mode={mode!r} needs a Gaussian posterior over weights (exact, laplace, svi with a Gaussian guide); "
                f"{self.method!r} has none (its approximation: "
                f"{getattr(self.approximation, 'kind', 'draws only')}) — use mode='mc'"
            )
        task = "regression" if self.problem.likelihood in REGRESSION_LIKELIHOODS else "classification"
        if mode in ("probit", "bridge") and task != "classification":
            raise OptionError(f"mode={mode!r} applies to classification; use 'linearized' for regression")
        if mode == "bridge" and self.problem.likelihood != "categorical":
            raise OptionError(
                "mode='bridge' maps a Gaussian over C ≥ 2 softmax logits to a Dirichlet; a bernoulli model has one "
                "logit, for which the bridge's mean is the MAP's sigmoid — use mode='probit', or "
                "likelihood='categorical' with two classes"
            )
        outputs = self.problem.model.output_dim()
        draws = self.num_chains * self.num_draws if num_samples is None else num_samples
        if keep_draws and mode in ("mc", "linearized"):
            # The per-draw outputs (S, N, C) in float64 are the result; refuse before computing them.
            _check_prediction_size(int(draws), X.shape[0], max(outputs, 2 if task == "classification" else 1))
        flat = self._flat() if num_samples is None else self._flat_sample(num_samples, key)
        if mode == "mc":
            # A heteroscedastic model's noise has a row axis (one σ per input); other noise has none.
            noise_axis = 1 if self.problem.likelihood == "heteroscedastic" else None
            if not keep_draws:
                return _summaries_by_rows(self.problem, flat, X, task, noise_axis)
            f, noise = _by_rows(
                lambda rows: _outputs_many(self.problem, flat, rows), X, flat.shape[0] * outputs, axes=(1, noise_axis)
            )
            if task == "regression":
                return _regression(np.asarray(f), np.asarray(noise))
            return classification_prediction(np.asarray(_class_log_probs(self.problem.likelihood, f)))
        components = _gaussian_components(self.approximation)
        moments = [(w, *_linearized_outputs(self.problem, q, X)) for w, q in components]
        if mode in ("probit", "bridge"):
            rule = _probit_log_probs if mode == "probit" else _bridge_log_probs
            # log Σ_m w_m p_m, in log space (a mixture of Laplace components weighs each one's rule)
            log_probs = np.logaddexp.reduce(
                np.stack([math.log(w) + rule(self.problem.likelihood, m, c).astype(np.float64) for w, m, c in moments]),
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
            logits = f[..., 0] if self.problem.likelihood == "bernoulli" else f
            return classification_prediction(np.asarray(_class_log_probs(self.problem.likelihood, logits)))
        # The mean outputs: all K of a multi-output model, else the first (the second of a
        # heteroscedastic model is log σ²).
        means = (lambda a: a) if self.problem.model.multi_output else (lambda a: a[..., 0])
        if self.problem.likelihood == "heteroscedastic":
            # each draw carries its own noise, and E[σ²] = e^(m + v/2)
            prediction = _regression(f[..., 0], np.exp(0.5 * f[..., 1]))
            aleatoric = sum(w * np.exp(m[:, 1] + 0.5 * c[:, 1, 1]) for w, m, c in moments)
        else:
            noise = np.asarray(_outputs_many(self.problem, flat, X[:1])[1])  # σ per draw (compiled once)
            prediction = _regression(means(f), noise)
            aleatoric = prediction.aleatoric_variance
        # The linearised predictive's moments are known exactly; report them, not their MC estimates.
        mean = sum(w * means(m) for w, m, _ in moments)
        second = sum(w * (means(np.diagonal(c, axis1=1, axis2=2)) + np.square(means(m))) for w, m, c in moments)
        epistemic = np.maximum(second - np.square(mean), 0.0)
        # One Gaussian over outputs plus a noise sd that is the same for every draw: the predictive
        # is exactly Gaussian, and its density is known in closed form.
        fixed_noise = self.problem.likelihood != "heteroscedastic" and float(np.ptp(prediction.member_noise)) == 0.0
        return dataclasses.replace(
            prediction, mean=mean, epistemic_variance=epistemic, aleatoric_variance=aleatoric,
            variance=epistemic + aleatoric, gaussian=len(moments) == 1 and fixed_noise,
        )

    # -- diagnostics, export, persistence ---------------------------------------------------------
    def remedy(self, topic: str) -> str:
        """What to try when a diagnostic check of ``topic`` fails (``"fit"``, ``"mixing"``,
        ``"steps"``), in the options of the method that ran (``Method.remedy``)."""
        return (registry.get(self.method) if self.method in registry.METHODS else Method).remedy(self, topic)

    @property
    def loss_label(self) -> str:
        """What the loss in ``trace`` is, in the words of the method that ran (``Method.loss_label``)."""
        return (registry.get(self.method) if self.method in registry.METHODS else Method).loss_label

    @property
    def round_length(self) -> int | None:
        """Steps per round of the run in ``trace`` (``Method.round_length``), or None."""
        return (registry.get(self.method) if self.method in registry.METHODS else Method).round_length(self)

    def hold_out(self, X, y):
        """Judge this run also on rows ``(X, y)`` it was not fitted on; returns the posterior.

        The diagnostics then check the predictive against a trivial baseline and the coverage of
        its 90% intervals (:mod:`ppl.diagnostics.heldout`), so a fit that over-fits its training
        rows is not called trustworthy. The rows are saved with the run, and the verdict is
        recomputed from them on every load. ``ppl.fit(..., validation=f)`` holds out a share of the
        training rows itself; ``ppl fit`` and ``ppl compare`` hold out their test split.
        """
        self._attached("hold_out")
        if not self.problem.is_declarative or self.problem.spec.kind == "unsupervised":
            raise TypeError(
                "hold_out needs a supervised declarative model from ppl.models (it predicts y from X); for a plain "
                "NumPyro program, score held-out data with numpyro.infer.Predictive"
            )
        X, y = validate_supervised(self.problem.model, (X, y), where="held-out data")
        if y is None or len(X) == 0:
            raise TypeError("hold_out needs at least one held-out row with its target: pass (X, y)")
        X = self._new_inputs(X)
        self.heldout = (np.asarray(X), np.asarray(y))
        self._cache.pop("diagnostics", None)
        return self

    def diagnostics(self):
        """The uniform :class:`ppl.Diagnostics` record (computed once, then cached)."""
        if "diagnostics" not in self._cache:
            self._attached("computing diagnostics")
            self._cache["diagnostics"] = compute_diagnostics(self)
        return self._cache["diagnostics"]

    def summary(self, prob: float = 0.9, exclude_deterministic: bool = True):
        """Per-parameter mean, sd, median, central ``prob`` interval, bulk ESS and R-hat, one row
        per scalar element of each site, in the shape of NumPyro's ``print_summary`` (print it).
        ESS and R-hat appear only where they apply to these draws (R-hat for Markov chains; ESS
        also for independent draws of an approximation; neither for a point or an ensemble). It
        reads the stored draws alone, so a run loaded without its program has one too."""
        return parameter_summary(self, prob, exclude_deterministic)

    def to_arviz(self):
        """``arviz.InferenceData`` with posterior, sample_stats, log_likelihood, observed_data."""
        self._attached("to_arviz")
        return to_inference_data(self)

    def save(self, path) -> None:
        """Write the run to folder ``path`` as one unit (staged beside it, then renamed into place);
        ``ppl.load`` reads it. An existing run there is replaced; any other folder is refused.

        Loading never imports a plain program, so ``ppl.load(path, model=fn)`` is how such a run
        gets its program back. A program that could not even be found by its name later (defined in
        ``__main__`` or a notebook, inside a function, or a lambda) is saved all the same, with a
        ``UserWarning`` that says so.
        """
        self._attached("save")
        save_posterior(self, path)
        if self.problem.spec.kind == "program":
            reason = not_importable(self.problem.model)
            if reason is not None:
                name = getattr(self.problem.model, "__name__", "fn")
                warnings.warn(
                    f"saved {path}, but its program {name!r} cannot be re-imported by name: {reason}. Loading the run "
                    f"gives its draws and saved diagnostics; for anything that runs the program (prediction, "
                    f"log densities, fresh draws, export) load it with ppl.load({str(path)!r}, model={name})",
                    UserWarning, stacklevel=2,
                )


def _class_log_probs(likelihood: str, f) -> np.ndarray:
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


def _regression(means: np.ndarray, noise: np.ndarray) -> Prediction:
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
