"""The compiled problem: one model + one dataset + one temperature, as a JAX pytree.

``compile_problem`` turns ``(model, data, temperature, tempering)`` into a :class:`Problem`, the only
thing a backend sees. A ``Problem`` is a registered pytree: its arrays (data, temperature) are
leaves and its :class:`ProblemSpec` (model, site layout, tempering mode) is static auxiliary data.
Backends therefore pass the whole problem into their module-level jitted functions, and a second
fit on same-shaped data hits the compilation cache instead of retracing.

All parameters are one flat vector ``u`` in unconstrained space. The log density is

    log p̃(u | batch) = a · log p(θ(u)) + b · (N / B) · Σ_batch log p(y_i | θ(u)) + log |det ∂θ/∂u|

with ``a = 1, b = 1/T`` for ``tempering="likelihood"`` and ``a = b = 1/T`` for ``"cold"``
(p(θ | D)^(1/T) in constrained space; the Jacobian is a change of variables and is not tempered).
Minibatch scaling N/B and tempering are applied here and nowhere else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from numpyro import handlers
from numpyro.distributions import Distribution, ImproperUniform, biject_to, constraints
from numpyro.infer.initialization import init_to_uniform
from numpyro.distributions.util import sum_rightmost

from ppl.core.data import validate_program_data, validate_supervised, validate_unsupervised
from ppl.core.errors import DataError, MemoryBudgetError, OptionError
from ppl.core.method import MEMORY_BUDGET_BYTES
from ppl.models._base import ACTIVATIONS, SupervisedModel

__all__ = ["Problem", "ProblemSpec", "Site", "DeterministicSite", "compile_problem", "TEMPERINGS", "trace_count"]

TEMPERINGS = ("likelihood", "cold")
PROBE_SIZE = 64
MEDIAN_DRAWS = 15

# Incremented each time a log density is traced (not when a cached executable runs): the
# conformance test reads it to prove that a second same-shaped fit does not recompile.
_TRACES = {"logdensity": 0}


def trace_count() -> int:
    """How many times any Problem's log density has been traced in this process."""
    return _TRACES["logdensity"]


class Site(NamedTuple):
    """A latent sample site: its constrained shape and the shape of its unconstrained block."""

    name: str
    shape: tuple
    unconstrained_shape: tuple

    @property
    def size(self) -> int:
        return int(math.prod(self.unconstrained_shape))


class DeterministicSite(NamedTuple):
    """A ``numpyro.deterministic`` site of a plain program: a function of the latent sites (and the
    data), recomputed from every draw and reported beside them."""

    name: str
    shape: tuple

    @property
    def size(self) -> int:
        return int(math.prod(self.shape))


class DataKind:
    """How a Problem holds and reads its data, one object per kind of model (``DATA_KINDS``, named
    by ``ProblemSpec.kind``): the model's call arguments for a batch, the rows of a minibatch (for the
    N/B scale), a subset of rows, the inputs, and the data as named arrays (what a saved run holds
    under ``data/`` and what its fingerprint digests)."""

    name: str = ""
    declarative = True  # a model from ppl.models: a network with inputs, outputs and a likelihood

    def call(self, batch, static_kwargs: tuple) -> tuple:
        """(args, kwargs) of the model for ``batch``."""
        raise NotImplementedError

    def batch_rows(self, batch) -> int | None:
        """Rows in a minibatch ``batch`` (the likelihood is scaled by N over it); None: whole data."""
        return None

    def take(self, data, indices):
        """Rows ``indices`` of the data."""
        raise TypeError(f"a {self.name} problem's data has no rows to take")

    def inputs(self, data):
        return data

    def named(self, data) -> dict:
        """The data as {name: array}."""
        raise NotImplementedError


class _Supervised(DataKind):
    name = "supervised"  # a declarative model of y given X, data (X, y)

    def call(self, batch, static_kwargs):
        X, y = batch
        return (X, y), {}

    def batch_rows(self, batch):
        return batch[0].shape[0]

    def take(self, data, indices):
        X, y = data
        return X[indices], y[indices]

    def inputs(self, data):
        return data[0]

    def named(self, data):
        return {"X": data[0], "y": data[1]}


class _Unsupervised(DataKind):
    name = "unsupervised"  # a declarative model of X alone (a VAE), data X

    def call(self, batch, static_kwargs):
        return (batch,), {}

    def batch_rows(self, batch):
        return batch.shape[0]

    def take(self, data, indices):
        return data[indices]

    def named(self, data):
        return {"X": data}


class _Program(DataKind):
    name = "program"  # a plain NumPyro function, data a dict of its keyword arguments
    declarative = False

    def call(self, batch, static_kwargs):
        return (), {**batch, **dict(static_kwargs)}

    def named(self, data):
        return dict(data)


DATA_KINDS = {kind.name: kind for kind in (_Supervised(), _Unsupervised(), _Program())}


@dataclass(frozen=True)
class ProblemSpec:
    """The static (hashable) half of a problem: what is compiled, not what is computed on."""

    model: Any
    # the data's kind, a key of DATA_KINDS: "supervised" (declarative model, data (X, y)),
    # "unsupervised" (declarative model of X alone, e.g. a VAE) or "program" (plain NumPyro function
    # with a dict of keyword arguments); ``Problem.data_kind`` is its strategy object
    kind: str
    tempering: str
    sites: tuple
    num_data: int | None
    static_kwargs: tuple = ()
    observed: tuple = ()  # names of the observed sites, in trace order
    # Why per-datum log-likelihoods (for PSIS-LOO) are unavailable; None when they are available.
    no_pointwise_reason: str | None = None
    # Local latent sites (inside the "data" plate, one row per datum; shapes are per datum). They
    # are not part of the flat vector u: a guide gives them per batch (unsupervised models only).
    local_sites: tuple = ()
    # ``numpyro.deterministic`` sites of a plain program (DeterministicSite), in trace order.
    deterministic: tuple = ()
    # Names of deterministic sites whose draws are the program's function space (function-space
    # R-hat); empty: weight-space diagnostics only. Left out of equality and hashing: it changes the
    # diagnostics, never what is computed, so naming function sites does not recompile anything.
    function_sites: tuple = field(default=(), compare=False)

    @property
    def num_params(self) -> int:
        return sum(site.size for site in self.sites)


class LogTerms(NamedTuple):
    log_prior: jax.Array
    log_likelihood: jax.Array  # summed over the batch, unscaled
    log_jacobian: jax.Array


@jax.tree_util.register_pytree_node_class
class Problem:
    """A model bound to data and a temperature. Backends only ever see this.

    Attributes:
        spec: the static :class:`ProblemSpec`.
        data: ``(X, y)`` for declarative models, a dict of arrays for plain NumPyro programs.
        temperature: scalar array T.
    """

    def __init__(self, spec: ProblemSpec, data, temperature):
        self.spec = spec
        self.data = data
        self.temperature = temperature

    def tree_flatten(self):
        return (self.data, self.temperature), self.spec

    @classmethod
    def tree_unflatten(cls, spec, children):
        return cls(spec, *children)

    # -- structure -------------------------------------------------------------------------------
    @property
    def model(self):
        return self.spec.model

    @property
    def tempering(self) -> str:
        return self.spec.tempering

    @property
    def num_data(self) -> int | None:
        return self.spec.num_data

    @property
    def num_params(self) -> int:
        return self.spec.num_params

    @property
    def sites(self) -> tuple:
        return self.spec.sites

    @property
    def data_kind(self) -> DataKind:
        """How this problem's data is held and read (call arguments, minibatches, rows, saving)."""
        return DATA_KINDS[self.spec.kind]

    @property
    def is_declarative(self) -> bool:
        """A supervised model from ppl.models: a network that predicts y from X."""
        return self.spec.kind == "supervised"

    @property
    def local_sites(self) -> tuple:
        return self.spec.local_sites

    @property
    def deterministic_sites(self) -> tuple:
        return self.spec.deterministic

    @property
    def function_sites(self) -> tuple:
        return self.spec.function_sites

    @property
    def num_local(self) -> int:
        """Size of one datum's flattened local latents (0 without local sites)."""
        return sum(site.size for site in self.spec.local_sites)

    @property
    def data_X(self) -> jax.Array:
        """The input/data array of a declarative model (supervised X, or an unsupervised model's X)."""
        return self.data_kind.inputs(self.data)

    @property
    def init_params(self) -> jax.Array:
        """A zero vector with the flat unconstrained layout (shape and dtype template)."""
        return jnp.zeros(self.num_params)

    @property
    def likelihood(self) -> str | None:
        return self.model.likelihood if self.is_declarative else None

    def layers(self):
        """Dense layers of a declarative model (for curvature and last-layer methods)."""
        self._require_declarative("layers")
        return self.model.layers(self.data[0].shape[-1])

    def network_sites(self) -> tuple:
        """Names of the real-valued sites the network reads (weights and biases), in site order."""
        self._require_declarative("network_sites")
        return self.model.network_sites(self.data[0].shape[-1])

    def parameter_groups(self) -> tuple:
        """((name, site names), ...): the network's layers, or a user network's parameter groups."""
        self._require_declarative("parameter_groups")
        return self.model.parameter_groups(self.data[0].shape[-1])

    def last_layer_sites(self) -> tuple | None:
        """Site names of the output layer, or None when the model does not know it."""
        self._require_declarative("last_layer_sites")
        return self.model.last_layer_sites(self.data[0].shape[-1])

    def apply(self, params: dict, X) -> jax.Array:
        """Network output (mean or logits) for constrained ``params`` at inputs ``X``."""
        self._require_declarative("apply")
        return self.model.apply(params, X)

    def probe_inputs(self) -> jax.Array:
        """The fixed probe batch of training inputs used for function-space diagnostics."""
        self._require_declarative("probe_inputs")
        return self.data[0][:PROBE_SIZE]

    def _require_declarative(self, what: str) -> None:
        if not self.is_declarative:
            raise TypeError(
                f"Problem.{what} needs a declarative model from ppl.models; this problem wraps the plain "
                f"NumPyro function {getattr(self.model, '__name__', self.model)!r}"
            )

    # -- flat parameter vector -------------------------------------------------------------------
    def unravel(self, u: jax.Array) -> dict:
        """Split a flat unconstrained vector into per-site unconstrained arrays."""
        out, start = {}, 0
        for site in self.sites:
            out[site.name] = jnp.reshape(u[start : start + site.size], site.unconstrained_shape)
            start += site.size
        return out

    def sites_of(self, columns) -> list[str]:
        """Names of the sites that own the flagged entries of a flat-vector mask (P,)."""
        columns, names, start = np.asarray(columns), [], 0
        for site in self.sites:
            if np.any(columns[start : start + site.size]):
                names.append(site.name)
            start += site.size
        return names

    def ravel(self, unconstrained: dict) -> jax.Array:
        return jnp.concatenate([jnp.ravel(unconstrained[site.name]) for site in self.sites])

    # -- the model run -----------------------------------------------------------------------------
    def _call(self, batch):
        return self.data_kind.call(batch, self.spec.static_kwargs)

    def _trace(self, u: jax.Array, batch, local: dict | None = None):
        params = self.unravel(u)
        jacobians = []

        def to_constrained(site):
            if local is not None and site["name"] in local:
                return local[site["name"]]  # local latents are real-valued: no transform
            if site["type"] != "sample" or site["is_observed"] or site["name"] not in params:
                return None
            raw = params[site["name"]]
            transform = biject_to(site["fn"].support)
            value = transform(raw)
            log_det = transform.log_abs_det_jacobian(raw, value)
            event_dims = jnp.ndim(log_det) - jnp.ndim(value) + len(site["fn"].event_shape)
            jacobians.append(jnp.sum(sum_rightmost(log_det, event_dims)))
            return value

        args, kwargs = self._call(batch)
        model = handlers.substitute(handlers.seed(self.model, rng_seed=0), substitute_fn=to_constrained)
        tr = handlers.trace(model).get_trace(*args, **kwargs)
        return tr, sum(jacobians, jnp.zeros(()))

    def constrain(self, u: jax.Array) -> dict:
        """Constrained site values for a flat unconstrained vector."""
        tr, _ = self._trace(u, self.data)
        return {site.name: tr[site.name]["value"] for site in self.sites}

    def constrain_all(self, u: jax.Array) -> dict:
        """Constrained latent site values and the ``numpyro.deterministic`` values they imply, in
        constrained space: the model replayed on the training data at ``u``."""
        tr, _ = self._trace(u, self.data)
        return {site.name: tr[site.name]["value"] for site in (*self.sites, *self.spec.deterministic)}

    def log_terms(self, u: jax.Array, batch=None) -> LogTerms:
        """Log prior, summed (unscaled) log likelihood of ``batch`` and log |Jacobian| at ``u``."""
        batch = self.data if batch is None else batch
        tr, log_jacobian = self._trace(u, batch)
        log_prior, log_lik = jnp.zeros(()), jnp.zeros(())
        for site in tr.values():
            if site["type"] != "sample":
                continue
            log_prob = _site_log_prob(site)
            if site["is_observed"]:
                log_lik = log_lik + jnp.sum(log_prob)
            else:
                log_prior = log_prior + jnp.sum(log_prob)
        return LogTerms(log_prior, log_lik, log_jacobian)

    def unravel_local(self, z: jax.Array) -> dict:
        """Split flat local latents (..., B, num_local) into per-site arrays (..., B, *site shape)."""
        out, start = {}, 0
        for site in self.local_sites:
            out[site.name] = jnp.reshape(z[..., start : start + site.size], (*z.shape[:-1], *site.shape))
            start += site.size
        return out

    def local_terms(self, u: jax.Array, z: jax.Array, batch=None) -> tuple:
        """(log prior of the global sites, their log Jacobian, per-datum local log prior (B,), per-datum
        log likelihood (B,)) at global ``u`` and flat local latents ``z`` (B, num_local) for the rows
        of ``batch``; none of it tempered or scaled (objectives weigh the terms with :meth:`weights`)."""
        _TRACES["logdensity"] += 1
        batch = self.data if batch is None else batch
        local = self.unravel_local(z)
        tr, log_jacobian = self._trace(u, batch, local)
        global_prior = jnp.zeros(())
        local_prior = jnp.zeros(z.shape[:-1])
        likelihood = jnp.zeros(z.shape[:-1])
        for site in tr.values():
            if site["type"] != "sample":
                continue
            log_prob = _site_log_prob(site)
            if site["is_observed"]:
                likelihood = likelihood + _per_datum(log_prob, z.shape[0])
            elif site["name"] in local:
                local_prior = local_prior + _per_datum(log_prob, z.shape[0])
            else:
                global_prior = global_prior + jnp.sum(log_prob)
        return global_prior, log_jacobian, local_prior, likelihood

    def local_log_joint(self, u: jax.Array, z: jax.Array, batch=None) -> jax.Array:
        """log p(x_i, z_i | θ(u)) per datum of ``batch``, shape (B,): what IWAE's log-sum-exp and the
        per-datum k-hat work on."""
        _, _, local_prior, likelihood = self.local_terms(u, z, batch)
        return local_prior + likelihood

    def local_reparam_log_likelihood(self, loc: jax.Array, scale: jax.Array, u: jax.Array, key, batch=None):
        """Log likelihood of ``batch`` (summed, unscaled) with every dense layer's pre-activations drawn
        from their Gaussian marginals (local reparameterisation, Kingma et al. 2015).

        Under independent Gaussian weights W ∼ N(loc, scale²) (flat vectors in u's layout), a layer's
        pre-activation for input h is N(h·μ_W + μ_b, h²·σ_W² + σ_b²), independently per datum: drawing
        it directly instead of one W per step gives each datum its own weight noise, which lowers the
        gradient's variance. Sites that are not dense-layer weights (a noise scale) take their values
        from the draw ``u``.
        """
        self._require_declarative("local_reparam_log_likelihood")
        _TRACES["logdensity"] += 1
        X, y = self.data if batch is None else batch
        mean, sd = self.unravel(loc), self.unravel(scale)
        tr, _ = self._trace(u, (X, y))
        params = {site.name: tr[site.name]["value"] for site in self.sites}
        h = X
        for i, layer in enumerate(self.layers()):
            shape = (layer.fan_in, layer.fan_out)
            m = h @ jnp.reshape(mean[layer.weight], shape)
            v = jnp.square(h) @ jnp.reshape(jnp.square(sd[layer.weight]), shape)
            if layer.bias is not None:
                m = m + jnp.reshape(mean[layer.bias], (1, layer.fan_out))
                v = v + jnp.reshape(jnp.square(sd[layer.bias]), (1, layer.fan_out))
            h = m + jnp.sqrt(v) * jax.random.normal(jax.random.fold_in(key, i), m.shape, dtype=m.dtype)
            if layer.activation is not None:
                h = ACTIVATIONS[layer.activation](h)
        f = self.model.squeeze(h)
        return jnp.sum(self.model.observation(f, params).log_prob(y))

    def log_jacobian(self, u: jax.Array) -> jax.Array:
        """log |det ∂θ/∂u| of the constraining transforms at ``u``."""
        return self._trace(u, self.data)[1]

    def weights(self, batch=None) -> tuple:
        """(prior weight, likelihood weight): tempering and the N/B minibatch scale, the only place
        they are applied. Local prior terms take the likelihood's weight (they are per datum)."""
        rows = None if batch is None else self.data_kind.batch_rows(batch)
        scale = 1.0 if rows is None else self.num_data / rows
        inv_t = 1.0 / self.temperature
        prior_weight = inv_t if self.tempering == "cold" else jnp.ones_like(inv_t)
        return prior_weight, inv_t * scale

    def _weighted_terms(self, u: jax.Array, batch) -> tuple:
        """(weighted log prior, weighted and scaled log likelihood, log Jacobian): the one place where
        tempering and minibatch scaling are applied."""
        _TRACES["logdensity"] += 1
        terms = self.log_terms(u, batch)
        prior_weight, lik_weight = self.weights(batch)
        return prior_weight * terms.log_prior, lik_weight * terms.log_likelihood, terms.log_jacobian

    def logdensity_fn(self, u: jax.Array, batch=None) -> jax.Array:
        """Tempered, minibatch-scaled log density of the flat unconstrained vector ``u``."""
        prior, likelihood, log_jacobian = self._weighted_terms(u, batch)
        # Summed in this order always: samplers' trajectories amplify last-bit differences.
        return prior + likelihood + log_jacobian

    def density_parts(self, u: jax.Array, batch=None, jacobian: bool = True) -> tuple:
        """``logdensity_fn`` split in two: (prior side, likelihood side).

        The prior side is the weighted log prior plus the log Jacobian (left out with
        ``jacobian=False``: then the sum is ``log_joint``), the likelihood side the tempered,
        minibatch-scaled log likelihood. Objectives that weigh the prior/KL side (β, KL warm-up)
        use the split.
        """
        prior, likelihood, log_jacobian = self._weighted_terms(u, batch)
        return (prior + log_jacobian if jacobian else prior), likelihood

    def log_joint(self, u: jax.Array, batch=None) -> jax.Array:
        """Like ``logdensity_fn`` without the Jacobian: its maximiser is the constrained-space MAP."""
        prior, likelihood, _ = self._weighted_terms(u, batch)
        return prior + likelihood

    def pointwise_loglik(self, u: jax.Array, batch=None) -> jax.Array:
        """Untempered log p(y_i | θ(u)) per data point, shape (N,) — the input to PSIS-LOO."""
        batch = self.data if batch is None else batch
        tr, _ = self._trace(u, batch)
        observed = [site for site in tr.values() if site["type"] == "sample" and site["is_observed"]]
        per_point = None
        for site in observed:
            log_prob = _site_log_prob(site)
            if jnp.ndim(log_prob) == 0:
                raise ValueError(f"observed site {site['name']!r} has no data dimension")
            log_prob = jnp.sum(jnp.reshape(log_prob, (log_prob.shape[0], -1)), axis=-1)
            if per_point is not None and per_point.shape != log_prob.shape:
                raise ValueError("observed sites disagree on the number of data points")
            per_point = log_prob if per_point is None else per_point + log_prob
        if per_point is None:
            raise ValueError("the model has no observed sites")
        return per_point

    def batch(self, indices: jax.Array):
        """Rows ``indices`` of the data (declarative models only)."""
        if not self.data_kind.declarative:
            self._require_declarative("batch")
        return self.data_kind.take(self.data, indices)

    def _unconstrain_trace(self, tr) -> jax.Array:
        # Each site is inverted with its own support in this trace: a support that depends on
        # another site (m ~ Uniform(0, a)) uses that draw's a.
        return self.ravel({s.name: biject_to(tr[s.name]["fn"].support).inv(tr[s.name]["value"]) for s in self.sites})

    def unconstrain(self, params: dict) -> jax.Array:
        """The flat unconstrained vector of one set of constrained site values."""
        args, kwargs = self._call(self.data)
        model = handlers.substitute(handlers.seed(self.model, rng_seed=0), data=params)
        return self._unconstrain_trace(handlers.trace(model).get_trace(*args, **kwargs))

    def init_position(self, key: jax.Array, strategy: str) -> jax.Array:
        """A flat unconstrained starting point: a ``prior`` draw, the ``median`` of prior draws,
        ``uniform`` on (-2, 2), ``zeros``, or a network's ``pretrained`` values (its other sites at
        the median start).

        An improper flat prior (``dist.ImproperUniform``), or any distribution that cannot be
        sampled, has no draws: under ``prior`` and ``median`` such a site starts uniform on (-2, 2)
        in unconstrained space, as ``uniform`` starts every site (NumPyro's ``init_to_uniform``);
        the model's other sites are drawn from their priors.
        """
        if strategy == "pretrained":
            # a network's trained values (from outside ppl); its other sites (σ) from the median start
            values = getattr(self.model, "pretrained_values", None)
            if values is None or not getattr(self.model, "pretrained", False):
                raise OptionError(
                    f"init='pretrained' starts from a network's trained values, and this {type(self.model).__name__} "
                    "holds none; build it with Network(..., pretrained=True) or Network.from_flax(module, params=...), "
                    "or use init='prior'"
                )
            start = self.unravel(self.init_position(key, "median"))
            start.update({name: jnp.asarray(value, self.init_params.dtype) for name, value in values().items()})
            return self.ravel(start)
        if strategy == "zeros":
            return self.init_params
        if strategy == "uniform":
            return jax.random.uniform(key, (self.num_params,), minval=-2.0, maxval=2.0)
        if strategy == "prior":
            return _prior_draws(self, key[None])[0]
        if strategy == "median":
            # Coordinate-wise median of 15 prior draws in unconstrained space (flat priors: uniform
            # draws on (-2, 2)): a central start that does not depend on one draw of a wide prior.
            return jnp.median(_prior_draws(self, jax.random.split(key, MEDIAN_DRAWS)), axis=0)
        raise OptionError(f"init={strategy!r} is not one of 'prior', 'median', 'uniform', 'zeros', 'pretrained'")


# What JAX raises when a program needs the concrete value of an array that is being traced (Python
# control flow on its data, or NumPy called on it): such a program is run op by op instead.
NEEDS_VALUES = (
    jax.errors.ConcretizationTypeError, jax.errors.TracerIntegerConversionError,
    jax.errors.TracerArrayConversionError, jax.errors.NonConcreteBooleanIndexError,
)


def _prior_draws(problem, keys) -> jax.Array:
    """Flat unconstrained prior draws of the model, one per key (rows of ``keys``): one compiled
    program, the model mapped over the keys. Run op by op, the draws of a one-layer BNN built a
    dozen small programs. A program that cannot be compiled or mapped (it needs its data's values,
    or calls something without a batching rule) is run op by op, key by key, which raises the
    program's own error if it has one."""
    try:
        return _prior_draws_compiled(problem, keys)
    except Exception:
        args, kwargs = problem._call(problem.data)
        return jnp.stack([problem._unconstrain_trace(trace_model(problem.model, k, args, kwargs)) for k in keys])


@jax.jit
def _prior_draws_compiled(problem, keys):
    args, kwargs = problem._call(problem.data)
    return jax.vmap(lambda k: problem._unconstrain_trace(trace_model(problem.model, k, args, kwargs)))(keys)


def _traced(work, eager):
    """``work()`` run under JAX's abstract evaluation, where array operations are traced and never
    compiled nor run: reading a model's structure (site names, shapes, supports) needs no values, and
    running the model op by op compiles one small program per distinct operation (55 for a one-layer
    BNN, half a second even when they come from the persistent cache). A program that needs its
    data's values runs ``eager()`` instead. ``work`` must return plain Python values."""
    result = []
    try:
        jax.eval_shape(lambda: result.append(work()))
    except NEEDS_VALUES:
        return eager()
    return result[0]


def _cannot_sample(fn) -> bool:
    """Whether a site's distribution has no ``sample``: an improper flat prior (``ImproperUniform``,
    possibly expanded, masked or made an event), or a log-density-only distribution of the user's."""
    while True:
        if isinstance(fn, ImproperUniform) or type(fn).sample is Distribution.sample:
            return True
        if not hasattr(fn, "base_dist"):
            return False
        fn = fn.base_dist


def _start_unsampleable(site):
    """A value for a latent site whose distribution cannot be sampled (an improper flat prior).

    The model still has to run to give a starting point, so such a site gets a uniform(−2, 2) draw
    in unconstrained space, as NumPyro's own ``init_to_uniform`` does. Every other site is left
    alone (None): it is drawn from its prior.
    """
    if site["type"] != "sample" or site["is_observed"] or site["fn"].support.is_discrete:
        return None
    if _cannot_sample(site["fn"]):
        return init_to_uniform(site)
    return None


def trace_model(model, key, args: tuple, kwargs: dict):
    """The trace of one forward run of ``model`` with its latent sites drawn from their priors
    (a site that cannot be sampled, such as an improper flat prior, gets a uniform start value)."""
    seeded = handlers.seed(model, rng_seed=key)
    return handlers.trace(handlers.substitute(seeded, substitute_fn=_start_unsampleable)).get_trace(*args, **kwargs)


def _placeholder(site, allocated: list):
    """A stand-in value for a continuous latent site: the constraining transform of zeros in
    unconstrained space (0 on the real line, 1 for a positive site, an interval's midpoint, the
    uniform simplex). Valid in the site's support and of its shape, and nothing is sampled.

    ``allocated`` holds the number of values the trace's placeholders take so far; a site that
    takes them beyond the memory budget is refused before its zeros are allocated."""
    if site["type"] != "sample" or site["is_observed"]:
        return None
    fn = site["fn"]
    if fn.support.is_discrete:
        return None  # drawn, so that discovery can refuse it with its own message
    transform = biject_to(fn.support)
    shape = tuple(int(d) for d in tuple(site["kwargs"].get("sample_shape") or ()) + tuple(fn.shape()))
    unconstrained = tuple(int(d) for d in transform.inverse_shape(shape))
    dtype = jnp.result_type(float)
    _count_values(site["name"], shape, max(math.prod(shape), math.prod(unconstrained)), dtype.itemsize, allocated)
    return transform(jnp.zeros(unconstrained, dtype=dtype))


def _count_values(name: str, shape: tuple, count: int, itemsize: int, allocated: list) -> None:
    """Add a site's ``count`` values to ``allocated[0]``; refuse when one draw of every site so far
    would pass the memory budget. Python ints throughout: a site of 2**32 values or more is counted
    exactly, where a 32-bit count would wrap round and report a wrong size."""
    allocated[0] += count
    size = allocated[0] * itemsize
    if size > MEMORY_BUDGET_BYTES:
        before = allocated[0] - count
        with_others = f", with the {before} values of the sites before it," if before else ""
        raise MemoryBudgetError(
            f"site {name!r} of shape {shape} holds {count} values{with_others} so one draw of the model's "
            f"parameters alone needs {size / 2**30:.1f} GiB ({allocated[0]} values × {itemsize} bytes; limit "
            f"{MEMORY_BUDGET_BYTES / 2**30:.0f} GiB); no method could store or update it — declare smaller sites "
            "(narrower or fewer layers)"
        )


def _check_configured_size(layers: list) -> None:
    """Refuse dense ``layers`` ((weight, bias or None, fan_in, fan_out), ...) whose widths alone ask for
    more values than the memory budget — before the model runs, since its priors allocate arrays of
    each weight's shape (an edited ``hidden=65536,65536`` would otherwise try for 16 GiB at once)."""
    itemsize, allocated = jnp.result_type(float).itemsize, [0]
    for weight, bias, fan_in, fan_out in layers:
        _count_values(weight, (int(fan_in), int(fan_out)), int(fan_in) * int(fan_out), itemsize, allocated)
        if bias is not None:
            _count_values(bias, (int(fan_out),), int(fan_out), itemsize, allocated)


def structure_trace(model, args: tuple, kwargs: dict):
    """One run of ``model`` that reveals its sites without sampling any latent one: each latent site
    holds a placeholder in its support (see ``_placeholder``). Improper priors and distributions
    without ``sample`` run like any other; the observed sites hold the data."""
    seeded = handlers.seed(model, rng_seed=0)
    allocated = [0]
    placeholder = lambda site: _placeholder(site, allocated)  # noqa: E731
    return handlers.trace(handlers.substitute(seeded, substitute_fn=placeholder)).get_trace(*args, **kwargs)


def _per_datum(log_prob, num: int) -> jax.Array:
    """A site's log density summed to one number per datum (its leading axis is the data plate)."""
    if jnp.ndim(log_prob) == 0 or log_prob.shape[0] != num:
        raise ValueError("a site inside the data plate has no per-datum leading axis")
    return jnp.sum(jnp.reshape(log_prob, (num, -1)), axis=-1)


def _site_log_prob(site) -> jax.Array:
    log_prob = site["fn"].log_prob(site["value"])
    if site.get("mask") is not None:
        log_prob = jnp.where(site["mask"], log_prob, 0.0)
    if site.get("scale") is not None:
        log_prob = site["scale"] * log_prob
    return log_prob


def compile_problem(
    model, data, *, temperature: float = 1.0, tempering: str = "likelihood", function_sites=None
) -> Problem:
    """Validate ``data`` for ``model`` (on the host, before any tracing) and build the Problem.

    ``function_sites`` (plain NumPyro programs only): names of ``numpyro.deterministic`` sites that
    hold the program's function (a hand-written network's outputs). Their draws serve as the
    function space of the diagnostics (``rhat_function_max``), as a declarative network's outputs
    on its probe inputs do.
    """
    function_sites = _function_site_names(function_sites)
    if tempering not in TEMPERINGS:
        raise OptionError(f"tempering={tempering!r} is not one of {TEMPERINGS}")
    try:
        valid = (
            not isinstance(temperature, (bool, np.bool_))
            and isinstance(temperature, (int, float, np.integer, np.floating))
            and math.isfinite(float(temperature))
            and temperature > 0
        )
    except OverflowError:  # an int beyond float range
        valid = False
    if not valid:
        raise OptionError(f"temperature must be a positive finite number, got {temperature!r}")

    if getattr(model, "unsupervised", False):
        X = validate_unsupervised(model, data)
        _check_configured_size([(w, b, fan_in, fan_out) for w, b, fan_in, fan_out in model.decoder_sites(X.shape[1])])
        arrays = jnp.asarray(X, dtype=float)
        kind, static, num_data = "unsupervised", (), int(X.shape[0])
    elif isinstance(model, SupervisedModel):
        X, y = validate_supervised(model, data)
        if y is None:
            raise DataError("data must include targets y to fit a supervised model; got (X, None)")
        model = model.bind(X, y)
        # Dense layers declared by widths; a Network's (and a CNN's) parameter template exists already.
        if not model.accepts_array_inputs and hasattr(model, "layers"):
            _check_configured_size([(layer.weight, layer.bias, layer.fan_in, layer.fan_out)
                                    for layer in model.layers(X.shape[1])])
        arrays = (jnp.asarray(X, dtype=float), jnp.asarray(y))
        kind, static, num_data = "supervised", (), int(X.shape[0])
    elif callable(model):
        program_arrays, static_kwargs = validate_program_data(data)
        arrays = {k: jnp.asarray(v) for k, v in program_arrays.items()}
        kind, static, num_data = "program", tuple(sorted(static_kwargs.items())), None
    else:
        raise OptionError(
            f"model must be a ppl.models model or a NumPyro model function, got {type(model).__name__}"
        )

    if function_sites and kind != "program":
        raise OptionError(
            f"function_sites={function_sites!r} is for plain NumPyro programs; a {type(model).__name__} from "
            "ppl.models has its own function space (its network's outputs on the first 64 training inputs) — "
            "drop function_sites"
        )
    spec = ProblemSpec(model, kind, tempering, (), num_data, static)
    problem = Problem(spec, arrays, jnp.asarray(float(temperature)))
    sites, observed, no_pointwise, local_sites, deterministic = _discover_sites(problem)
    known = {site.name for site in deterministic}
    unknown = [name for name in function_sites if name not in known]
    if unknown:
        latent = {site.name for site in sites}
        what = ", ".join(
            f"{name!r} is a latent sample site" if name in latent else f"{name!r} is not a site of the program"
            for name in unknown
        )
        raise OptionError(
            f"function_sites must name numpyro.deterministic sites of the program: {what}. Its deterministic sites "
            f"are {sorted(known) or 'none'} — record the network's outputs with numpyro.deterministic('f', ...) "
            "and pass function_sites=('f',)"
        )
    spec = ProblemSpec(
        model, kind, tempering, sites, num_data, static, observed, no_pointwise, local_sites, deterministic,
        function_sites,
    )
    return Problem(spec, arrays, jnp.asarray(float(temperature)))


def _function_site_names(value) -> tuple:
    """``function_sites`` as a tuple of names (one name may be given as a string)."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = (value,)
    if not isinstance(value, (tuple, list)) or not all(isinstance(name, str) for name in value):
        raise OptionError(
            f"function_sites must be a tuple of numpyro.deterministic site names, e.g. ('f',); got {value!r}"
        )
    if len(set(value)) != len(value):
        raise OptionError(f"function_sites names a site twice: {tuple(value)!r}")
    return tuple(value)


def _discover_sites(problem: Problem) -> tuple:
    return _traced(lambda: _read_sites(problem, abstract=True), lambda: _read_sites(problem, abstract=False))


def _read_sites(problem: Problem, abstract: bool) -> tuple:
    args, kwargs = problem._call(problem.data)
    try:
        tr = structure_trace(problem.model, args, kwargs)
    except MemoryBudgetError:
        raise  # a site too large to hold, refused with its size: not a failure of the program on its data
    except Exception as error:  # a user's program failing on its own data: say where
        if abstract and isinstance(error, NEEDS_VALUES):
            raise  # the program needs its data's values: _traced runs it again, op by op
        raise DataError(
            f"running the model on the data failed ({type(error).__name__}: {error}); check that the data "
            "match the model's arguments and that the model runs on them (ppl ran it once with every latent site "
            "at a value inside its support — 0 on the real line, 1 for a positive site — sampling nothing)"
        ) from error
    sites, local_sites, deterministic = [], [], []
    for site in tr.values():
        if site["type"] == "deterministic" and problem.spec.kind == "program":
            deterministic.append(DeterministicSite(site["name"], tuple(jnp.shape(site["value"]))))
            continue
        if site["type"] == "plate" and site["args"][1] is not None and site["args"][1] < site["args"][0]:
            raise OptionError(
                f"plate {site['name']!r} subsamples {site['args'][1]} of {site['args'][0]} items; ppl draws and "
                "scales minibatches itself, and inside ppl a subsampling plate would reuse one fixed subsample. "
                "Use a full plate (and a declarative ppl.models model with batch_size= for minibatches)"
            )
        if site["type"] != "sample" or site["is_observed"]:
            continue
        if site["fn"].support.is_discrete:
            raise OptionError(
                f"latent site {site['name']!r} is discrete; ppl's methods need continuous latent variables "
                "— marginalise it out (or enumerate it) in the model"
            )
        shape = tuple(jnp.shape(site["value"]))
        in_data_plate = any(frame.name == "data" for frame in site["cond_indep_stack"])
        if problem.spec.kind == "unsupervised" and in_data_plate:
            if site["fn"].support is not constraints.real and site["fn"].support != constraints.real_vector:
                raise OptionError(
                    f"local latent site {site['name']!r} has support {site['fn'].support}; ppl's amortised "
                    "guides give real-valued local latents — reparameterise it onto the real line"
                )
            local_sites.append(Site(site["name"], shape[1:], shape[1:]))
            continue
        transform = biject_to(site["fn"].support)
        sites.append(Site(site["name"], shape, tuple(transform.inverse_shape(shape))))
    if not sites:
        raise OptionError("the model has no latent sample sites; there is nothing to infer")
    observed = [s for s in tr.values() if s["type"] == "sample" and s["is_observed"]]
    if not observed:
        raise DataError("the model observed no data: pass the targets (y) so that it conditions on them")
    leading = {jnp.shape(_site_log_prob(s))[:1] for s in observed}
    no_pointwise = None
    if () in leading:
        names = [s["name"] for s in observed if jnp.ndim(_site_log_prob(s)) == 0]
        no_pointwise = (
            f"observed site(s) {', '.join(names)} have no per-datum dimension (a scalar factor, or an event "
            "without a plate): put per-datum observations in a plate to get PSIS-LOO"
        )
    elif len(leading) > 1:
        no_pointwise = "observed sites disagree on the number of data points, so per-datum terms are undefined"
    if local_sites:
        no_pointwise = (
            "the model has local latents: log p(x_i) integrates them out, which PSIS-LOO over global draws "
            "cannot do — ppl.vae_report estimates log p(x) by importance sampling"
        )
    return tuple(sites), tuple(s["name"] for s in observed), no_pointwise, tuple(local_sites), tuple(deterministic)
