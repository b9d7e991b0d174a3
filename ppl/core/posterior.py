"""``Posterior``: the one result type every method returns."""

from __future__ import annotations

import copy
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from functools import partial

from ppl.core import predict
from ppl.core import vae
from ppl.core.data import validate_inputs, validate_supervised
from ppl.core.errors import OptionError, RunError
from ppl.core.guide import numpyro_guide
from ppl.core.keys import as_key, check_num_samples
from ppl.core.method import Method
from ppl.core.problem import structure_trace
from ppl.core.records import RECORDS, ChainStats, Evidence, RunRecord, RunStatus, TrainingTrace
from ppl.core.results import POSTERIOR_KINDS, Prediction
from ppl.diagnostics import compute_diagnostics, to_inference_data
from ppl.diagnostics.summary import summary as parameter_summary
from ppl.io.store import not_importable, save_posterior

__all__ = ["Posterior"]


# Module-level jitted maps over draws: the Problem is a pytree argument, so they compile once per
# problem layout and shape, whatever the data values.
@partial(jax.jit, static_argnames=("method",))
def _over_draws(problem, draws, method: str):
    """``problem.<method>`` mapped over draws (a leading axis), in vectorised chunks."""
    return jax.lax.map(getattr(problem, method), draws, batch_size=predict.DRAW_CHUNK)


@jax.jit
def _loglik_rows(problem, flat, batch):
    """log p(y_i | θ_s) (S, n) of the rows in ``batch``, mapped over draws in vectorised chunks."""
    return jax.lax.map(lambda u: problem.pointwise_loglik(u, batch), flat, batch_size=predict.DRAW_CHUNK)


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
        wall_time_s, seed, options, fingerprint, provenance: how it was produced (from the
            :class:`ppl.core.records.RunRecord` that ``ppl.fit`` or the loader passes).
        approximation: the fitted family (``Gaussian``, ``PointMass``) for density methods; None for
            samplers.
        resume_state: what ``ppl.fit(..., resume=...)`` continues from (partial runs), else None.
        declared_by: the :class:`ppl.core.method.Method` class that speaks for the run: its
            declaration supplies the remedies the diagnostics print, the loss's label and the
            round length of the loss figure. The method passes its own class; the loader the
            registered class of the saved method's name; the base ``Method`` otherwise.
        heldout: ``(X, y)`` rows the fit never saw, which the diagnostics check (see ``with_heldout``).

    A Posterior is frozen: it is built once, by the method (from its result) or by the loader, and
    never patched; setting an attribute raises an error. What is added later — the run record
    (``ppl.fit``), held-out rows (``with_heldout``) — makes a new Posterior that shares the draws.
    """

    # the fields a new Posterior may have in place of this one's (see replace)
    _REPLACEABLE = ("status", "trace", "evidence", "chain_stats", "info", "resume_state", "heldout", "record")

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
        approximation=None,
        record: RunRecord | None = None,
        resume_state=None,
        local_guide=None,
        declared_by: type[Method] = Method,
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
        self.approximation = approximation
        self.declared_by = declared_by
        self._take_record(record)
        # Partial runs (interrupted, checkpoints): what ppl.fit(..., resume=...) continues from.
        self.resume_state = resume_state
        self.program = None  # a detached run's program name (see Posterior.detached)
        # (X, y) rows the fit never saw, checked by the diagnostics (see Posterior.with_heldout)
        self.heldout = None
        # (guide, encoder parameters) of a model with local latents (a VAE fitted by svi)
        self.local_guide = local_guide
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
        self._frozen = True

    def _take_record(self, record: RunRecord | None) -> None:
        record = RunRecord() if record is None else record
        self.record = record
        self.seed, self.options = record.seed, dict(record.options or {})
        self.wall_time_s, self.fingerprint = float(record.wall_time_s), record.fingerprint
        self.provenance = dict(record.provenance or {})
        if record.devices > 1:
            self.info = {**self.info, "devices": int(record.devices)}

    def __setattr__(self, name, value):
        if getattr(self, "_frozen", False):
            raise AttributeError(
                f"a Posterior is frozen: its {name!r} cannot be set. A run's result is built once; "
                "post.with_heldout(X, y) returns a new Posterior judged on held-out rows, and "
                "ppl.fit(..., **options) fits again with other settings"
            )
        object.__setattr__(self, name, value)

    def replace(self, **changes) -> Posterior:
        """A new Posterior equal to this one but for ``changes``: the run ``record`` (what ``ppl.fit``
        passes), ``status``, ``trace``, ``evidence``, ``chain_stats``, ``info``, ``resume_state`` or ``heldout``
        (checked rows: use :meth:`with_heldout`). It shares the draws and approximation, and what
        this one computed from them alone; its diagnostics, which read the other fields, are not
        carried over."""
        unknown = set(changes) - set(self._REPLACEABLE)
        if unknown:
            raise TypeError(f"Posterior.replace: {sorted(unknown)} cannot be replaced; only {', '.join(self._REPLACEABLE)}")
        new = copy.copy(self)
        object.__setattr__(new, "_frozen", False)
        if "record" in changes:
            new.info = {k: v for k, v in new.info.items() if k != "devices"}
            new._take_record(changes.pop("record"))
        for name, value in changes.items():
            setattr(new, name, dict(value) if name == "info" else value)
        # what depends on the draws alone (log-likelihoods, PSIS log-ratios, function draws) is kept;
        # the diagnostics read the replaced fields, and are computed anew
        new._cache = {name: value for name, value in self._cache.items() if name != "diagnostics"}
        new._frozen = True
        return new

    @classmethod
    def detached(cls, *, method, kind, draws, records, info, options, seed, wall_time_s, diagnostics, program, folder,
                 sampler, provenance, deterministic_sites=(), function_sites=(), declared_by: type[Method] = Method):
        """A loaded run of a plain NumPyro program whose program was not passed back.

        It holds the constrained draws, the saved diagnostics and the metadata. Everything that
        must run the model (prediction, densities, fresh draws, LOO, export) raises an error that
        says how to re-attach the program: ``ppl.load(path, model=fn)``.
        """
        self = cls.__new__(cls)
        self.method, self.problem, self.flat_draws, self.approximation = method, None, None, None
        self.kind, self.declared_by = kind, declared_by
        self.draws = {k: np.asarray(v) for k, v in draws.items()}
        self.deterministic_sites, self.function_sites = tuple(deterministic_sites), tuple(function_sites)
        first = next(iter(self.draws.values()))
        self.num_chains, self.num_draws = int(first.shape[0]), int(first.shape[1])
        self.status, self.trace, self.chain_stats, self.evidence = (records[name] for name in RECORDS)
        self.info = dict(info)
        self._take_record(RunRecord(seed=seed, options=options, wall_time_s=wall_time_s, provenance=provenance))
        self.resume_state = None
        self.program, self._folder = program, folder
        self.local_guide = self.heldout = None
        # Stored draws of a sampler can be resampled without the model; draws from q cannot be made anew.
        self._detached_sampler = bool(sampler)
        self._cache = {} if diagnostics is None else {"diagnostics": diagnostics}
        self._frozen = True
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

    def pointwise_log_likelihood_chunks(self, max_bytes: int = predict.BLOCK_BYTES):
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
        for index, count in predict.row_blocks(n, rows):
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
            f, _ = predict.outputs_many(self.problem, self._flat(), self.problem.probe_inputs())
            f = np.asarray(f)
            self._cache["function"] = f.reshape(self.num_chains, self.num_draws, *f.shape[1:])
        return self._cache["function"]

    def function_draws_chunks(self, X, max_bytes: int = predict.BLOCK_BYTES):
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
        for index, count in predict.row_blocks(X.shape[0], int(max_bytes) // (flat.shape[0] * width * 8)):
            f = np.asarray(jax.device_get(predict.outputs_many(self.problem, flat, X[index])[0]))[:, :count]
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
        (``mode="mc"``) reduces each block of rows (``predict.BLOCK_BYTES``, 32 MiB of per-draw numbers)
        to its per-input summaries (probabilities, entropy and its split; mean and variances)
        before the next, so memory is one block and its working copies plus O(N · C), whatever
        the number of draws. The prediction then has no ``member_*`` arrays, and what needs them
        (a regression ``interval`` or ``log_prob``, ``member_probs``) says so.
        """
        predict.check_options(mode, keep_draws)
        self._attached("predict")
        if not self.problem.is_declarative:
            raise TypeError(
                "predict needs a declarative model from ppl.models; for a plain NumPyro function use "
                "numpyro.infer.Predictive(model, posterior_samples=post.sample(n, seed=...))"
            )
        X = self._new_inputs(X)
        key = as_key(seed)
        approximation = self.approximation if self.has_density else None
        draws = self.num_chains * self.num_draws if num_samples is None else num_samples
        predict.check_request(self.problem, approximation, self.method, X, mode, keep_draws, int(draws))
        flat = self._flat() if num_samples is None else self._flat_sample(num_samples, key)
        return predict.predictive(self.problem, approximation, flat, X, key, mode=mode, keep_draws=keep_draws)

    # -- diagnostics, export, persistence ---------------------------------------------------------
    def remedy(self, topic: str) -> str:
        """What to try when a diagnostic check of ``topic`` fails (``"fit"``, ``"mixing"``,
        ``"steps"``), in the options of the method that ran (``Method.remedy``)."""
        return self.declared_by.remedy(self, topic)

    @property
    def loss_label(self) -> str:
        """What the loss in ``trace`` is, in the words of the method that ran (``Method.loss_label``)."""
        return self.declared_by.loss_label

    @property
    def round_length(self) -> int | None:
        """Steps per round of the run in ``trace`` (``Method.round_length``), or None."""
        return self.declared_by.round_length(self)

    def with_heldout(self, X, y) -> Posterior:
        """This run, judged also on rows ``(X, y)`` it was not fitted on: a new Posterior sharing
        these draws (a Posterior is frozen), whose diagnostics include the held-out check.

        The diagnostics then check the predictive against a trivial baseline and the coverage of
        its 90% intervals (:mod:`ppl.diagnostics.heldout`), so a fit that over-fits its training
        rows is not called trustworthy. The rows are saved with the run, and the verdict is
        recomputed from them on every load. ``ppl.fit(..., validation=f)`` holds out a share of the
        training rows itself; ``ppl fit`` and ``ppl compare`` hold out their test split.
        """
        self._attached("with_heldout")
        if not self.problem.is_declarative or self.problem.spec.kind == "unsupervised":
            raise TypeError(
                "with_heldout needs a supervised declarative model from ppl.models (it predicts y from X); for a plain "
                "NumPyro program, score held-out data with numpyro.infer.Predictive"
            )
        X, y = validate_supervised(self.problem.model, (X, y), where="held-out data")
        if y is None or len(X) == 0:
            raise TypeError("with_heldout needs at least one held-out row with its target: pass (X, y)")
        X = self._new_inputs(X)
        return self.replace(heldout=(np.asarray(X), np.asarray(y)))

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
