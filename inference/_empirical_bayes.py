"""The prior and noise scale the point-based methods fit with: ``prior_precision``.

A network trained to its MAP under a fixed, weak prior with a learned noise scale σ over-fits:
with more weights than rows, the training residual shrinks as training goes on, σ's mode follows
it, and every spread built on that point (Laplace, SWAG, an ensemble) inherits a noise scale
tens of times too small. On the UCI sets this gave held-out log-likelihoods of −300 to −300 000.

``map``, ``ensemble``, ``laplace``, ``mola``, ``swag`` and ``multiswag`` share one option for it:

* ``"auto"`` (the default): ``"marglik"`` for a network with hidden layers (a ``ppl.models`` BNN
  or CNN, or a ``Network`` from any JAX function, Flax or Equinox module), a Gaussian likelihood
  with one learned noise scale, and a Gaussian weight prior — the case that collapses; the
  model's own prior (None) for everything else.
* ``"marglik"``: tune one prior precision per layer (per parameter group of a ``Network``) and σ
  by maximising the Laplace evidence (type-II maximum likelihood; MacKay 1992, Immer et al. 2021)
  over all the network's weights, with the curvature :func:`tuning_structure` picks (K-FAC where
  the network declares its layers, the diagonal GGN where it does not), starting
  from a MAP of ``steps`` L-BFGS iterations; the
  evidence's log-determinant penalises the weights a small σ needs, which the joint does not.
  The method then runs, unchanged, on the model with the tuned prior and σ fixed at its tuned
  value (``post.problem.model``), and the verdict says that it judges that posterior.
* None: the model's own prior; a number or one number per dense layer: that Gaussian precision.

``laplace`` with an explicit ``"marglik"`` keeps tuning over its own coordinates and curvature
(``subset``, ``hessian``); ``"auto"`` tunes over all weights, as the other methods do.

The evidence maximisation (:func:`tune_evidence`) lives here, below every method that offers the
option: it builds on the curvature service and on ``map``'s climb
(:func:`ppl.inference.optimize.fit_mode`), never on a method's own module.
"""

from __future__ import annotations

import dataclasses
import math
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ppl.core import curvature
from ppl.core.checkpoint import Interrupted, Session
from ppl.core.errors import OptionError
from ppl.core.problem import compile_problem
from ppl.inference import _curvatures as structures
from ppl.inference.optimize import OptimizerConfig, fit_mode, mode_stationarity

__all__ = [
    "parse", "resolve", "check", "applies", "prepare", "tuned", "tuning_structure", "init_target", "recompiled", "with_prior", "tune_evidence",
]

TUNE_STREAM = 7  # the random stream (folded into the method's key) of the tuning
TUNE_ROUNDS = 10  # alternations of MAP steps and evidence maximisation
TUNE_STEPS = 200  # L-BFGS iterations of the first MAP and of each round's (at most the method's steps)


def parse(name: str, value):
    """The option normalised: None, ``"auto"``, ``"marglik"``, a float or a tuple of floats
    (from the command line also ``"2.0"`` or ``"1.0,4.0"``)."""
    if isinstance(value, str) and value not in ("auto", "marglik"):
        try:
            parts = [float(p) for p in value.split(",")]
        except ValueError:
            raise OptionError(
                f"{name}: prior_precision={value!r}; use 'auto', 'marglik', None, a number, or one number per layer"
            ) from None
        value = parts[0] if len(parts) == 1 else tuple(parts)
    if value is None or isinstance(value, str):
        return value
    values = np.atleast_1d(np.asarray(value, dtype=object))
    if values.ndim != 1 or not all(
        isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
        and math.isfinite(float(v)) and v > 0 for v in values
    ):
        raise OptionError(
            f"{name}: prior_precision must be 'auto', 'marglik', None (the model's prior), a positive number or one "
            f"positive number per dense layer; got {value!r}"
        )
    return float(values[0]) if np.ndim(value) == 0 else tuple(map(float, values))


def applies(problem) -> str | None:
    """None when ``"auto"`` tunes this problem's prior and σ; otherwise why it keeps the model's prior."""
    if not problem.is_declarative or problem.spec.kind != "supervised":
        return "not a supervised network from ppl.models"
    model = problem.model
    if problem.likelihood != "gaussian" or model.noise_scale is not None or model.multi_output:
        return "the noise scale is fixed or the likelihood is not Gaussian with one learned noise scale"
    if len(problem.parameter_groups()) < 2:
        return "a model without hidden layers cannot interpolate its training rows"
    if not model.gaussian_prior:
        return "the network's prior is not Gaussian (the evidence tunes a Gaussian prior's precisions)"
    if not any(site.name == "sigma" for site in problem.sites):
        return "the model has no noise site 'sigma'"
    return None


def resolve(value, problem):
    """``"auto"`` resolved for ``problem``; any other value as it is."""
    if value != "auto":
        return value
    return "marglik" if applies(problem) is None else None


def check(name: str, value, problem) -> None:
    """Refuse, before any work, a ``prior_precision`` this problem cannot take."""
    value = resolve(value, problem)
    if value is None:
        return
    if not problem.is_declarative:
        raise OptionError(
            f"{name}: prior_precision applies to the Gaussian weight priors of ppl.models networks; a plain program "
            "declares its own prior — change it in the program"
        )
    model = problem.model
    if not model.gaussian_prior:
        raise OptionError(
            f"{name}: prior_precision={value!r} replaces a Gaussian prior's precision, but this model's prior "
            f"({type(model.prior).__name__}) is not Gaussian — use prior_precision=None (the model's own prior), or a "
            "Gaussian prior (Isotropic, PerLayer, FanIn)"
        )
    layers = problem.parameter_groups()
    if isinstance(value, tuple) and len(value) != len(layers):
        raise OptionError(
            f"{name}: prior_precision gives {len(value)} values but the network has {len(layers)} layers "
            f"({', '.join(n for n, _ in layers)}); give one per layer or a single number"
        )
    if value == "marglik" and model.multi_output and model.noise_scale is None:
        raise OptionError(
            f"{name}: marglik tunes one Gaussian noise scale, but this model learns {model.num_outputs} (one per output); "
            "fix them with BNN(noise_scale=...) (a number or one per output), or give prior_precision a number "
            "instead of 'marglik'"
        )
    if value == "marglik" and problem.likelihood == "gaussian" and model.noise_scale is None:
        if not any(s.name == "sigma" for s in problem.sites):
            raise OptionError(f"{name}: marglik expected the model's noise site 'sigma'")


def init_target(problem, init):
    """The problem to continue on from a Posterior given as ``init=``: its own model on this data
    when that is the declared model with another prior or noise scale (a ``map`` fitted with a
    tuned prior), so that building on a tuned run keeps its tuning; else ``problem``."""
    theirs, ours = getattr(init.problem, "model", None), problem.model
    if theirs is None or theirs == ours or type(theirs) is not type(ours) or not dataclasses.is_dataclass(ours):
        return problem
    names = {f.name for f in dataclasses.fields(ours)}
    kept = {k: getattr(ours, k) for k in ("prior", "prior_scale", "noise_scale") if k in names}
    if dataclasses.replace(theirs, **kept) != ours:
        return problem
    return recompiled(problem, theirs)


def prepare(name: str, value, key, problem, *, steps: int, init: str = "prior", session: Session | None = None) -> tuple:
    """``(target, info)``: the problem the method runs on — ``problem`` itself, the model with a
    given Gaussian prior, or the model with its prior and σ tuned by the evidence — and a record
    of the tuning for the posterior's ``info``."""
    value = resolve(value, problem)
    if value is None:
        return problem, {}
    if not isinstance(value, str):
        return with_prior(problem, value), {}
    return tuned(name, key, problem, steps=steps, init=init, session=session)


def tuning_structure(problem) -> str:
    """The curvature the default tuning takes: K-FAC where the network declares its layers (a
    ppl.models BNN or CNN, a Flax module of Dense and Conv layers), the diagonal
    GGN for a network that does not (a plain JAX function, an Equinox module). Not the exact GGN,
    even where it fits: with more weights than rows its evidence collapses σ with the residual
    (0.005 against a true 0.5 on 60 rows), and on UCI (``python -m bench.network_tuning``) it left
    the first layer's prior up to 260 times weaker than K-FAC's and generalised worse (yacht −1.45
    and −1.73 against K-FAC's −0.97 and −1.23; a plain-function network's 90% coverage 0.58 on
    yacht, 0.71 on concrete). The diagonal's log-determinant bounds the exact one from above, so
    it charges a small σ more, never less: it over-estimates σ (about 2× on yacht)."""
    return "kfac" if problem.model.has_layers else "diag"


def tuned(name: str, key, problem, *, steps: int, init: str = "prior", session: Session | None = None) -> tuple:
    """The evidence tuning over all of a network's weights (curvature by :func:`tuning_structure`), from a MAP of
    ``min(steps, TUNE_STEPS)`` L-BFGS iterations (as many in each round): a short start is enough,
    as each round's MAP moves with the hyperparameters. Returns ``(target, info)``. The MAP runs in
    ``session``'s context (devices, progress, stop request), without checkpoints."""
    tune_key = jax.random.fold_in(key, TUNE_STREAM)
    map_key, evidence_key = jax.random.split(tune_key)
    steps = min(int(steps), TUNE_STEPS)
    # the map method's climb with the model's own prior: L-BFGS on the full data, exactly `steps` iterations
    found = fit_mode(map_key, problem, OptimizerConfig("lbfgs", steps, max_steps=steps), init=init,
                     session=None if session is None else session.inner())
    if found.status.interrupted:
        raise Interrupted(f"{name}: interrupted while tuning the prior and noise scale (prior_precision='marglik')", None)
    index = np.flatnonzero(curvature.network_mask(problem))
    target, _, _, info = tune_evidence(
        evidence_key, problem, found.approximation.loc, index=index, hessian=tuning_structure(problem), rank=1,
        prior_structure="layer", steps=steps, rounds=TUNE_ROUNDS,
    )
    return target, {key_: value for key_, value in info.items() if key_ != "map_gradient_norm"}


# -- marginal likelihood over the prior precision (and σ) --------------------------------------------
HYPER_STEPS = 200  # L-BFGS iterations on the hyperparameters in one marglik round
MARGLIK_RTOL = 1e-4  # rounds stop once no hyperparameter moves by more than this (relative)


def tune_evidence(key, problem, u, *, index, hessian: str, rank: int, prior_structure: str, steps: int,
                  rounds: int, movable: np.ndarray | None = None) -> tuple:
    """Type-II maximum likelihood (MacKay 1992; Immer et al. 2021): alternate the MAP under the
    current hyperparameters (``steps`` L-BFGS iterations), the curvature at it over the coordinates
    ``index`` in structure ``hessian``, and the maximisation of the Laplace evidence over one prior
    precision per layer (one in all with ``prior_structure="scalar"``) and over a learned Gaussian
    noise scale σ, for at most ``rounds`` rounds. Returns ``(target, u_target, status, info)``: the
    model with the tuned prior (and σ fixed at its tuned value) compiled as a problem, the mode on
    it, its stationarity and a record of the tuning. ``movable`` (a mask over the flat coordinates;
    None: every weight) limits the weights the MAP moves: the others are held where ``u`` has them."""
    model = problem.model
    layers = curvature.group_slices(problem)
    slices = curvature.layer_slices(problem) if model.has_layers else None
    groups = np.full(problem.num_params, -1)
    for l, (start, size) in enumerate(layers):
        groups[start : start + size] = l if prior_structure == "layer" else 0
    num_groups = len(layers) if prior_structure == "layer" else 1
    weights = groups >= 0 if movable is None else (groups >= 0) & np.asarray(movable, bool)
    sigma_at = _sigma_index(problem)
    prior_diag = np.asarray(curvature.prior_precision_diagonal(problem, u))
    log_alpha = np.array([np.log(np.mean(prior_diag[groups == g])) for g in range(num_groups)])
    log_sigma = float(u[sigma_at]) if sigma_at is not None else None
    arrays = _MarglikArrays(
        groups=jnp.asarray(np.where(weights, groups, 0)), weights=jnp.asarray(weights, u.dtype),
        free=jnp.asarray(index),
    )
    evidences = []
    for round_ in range(rounds):
        alpha_coord = jnp.exp(jnp.asarray(log_alpha))[arrays.groups] * arrays.weights
        if sigma_at is not None:
            u = u.at[sigma_at].set(log_sigma)
        u = _map_with_hypers(problem, u, arrays.weights, alpha_coord, steps)
        old = np.r_[log_alpha, [] if log_sigma is None else [log_sigma]]
        with curvature.float64():
            pieces = structures.likelihood_pieces(
                problem, u, index, hessian, rank, jax.random.fold_in(key, round_), slices
            )
            log_alpha, log_sigma, evidence = _maximise_evidence(
                problem, u, arrays, hessian, pieces, log_alpha, log_sigma, sigma_at
            )
        evidences.append(evidence)
        new = np.r_[log_alpha, [] if log_sigma is None else [log_sigma]]
        if np.max(np.abs(new - old)) < MARGLIK_RTOL:
            break
    alpha_coord = jnp.exp(jnp.asarray(log_alpha))[arrays.groups] * arrays.weights
    if sigma_at is not None:
        u = u.at[sigma_at].set(log_sigma)
    u = _map_with_hypers(problem, u, arrays.weights, alpha_coord, steps)
    alphas = np.exp(log_alpha)
    per_layer = tuple(float(alphas[l if num_groups > 1 else 0]) for l in range(len(layers)))
    tuned = model.with_prior_scales(tuple(1.0 / math.sqrt(a) for a in per_layer))
    if log_sigma is not None:
        tuned = tuned.with_noise_scale(math.exp(log_sigma))
    target = recompiled(problem, tuned)
    flat = problem.unravel(u)
    u_target = target.ravel({s.name: flat[s.name] for s in target.sites})
    if movable is not None:  # on the target's coordinates (σ, fixed there, is no longer one)
        held = problem.unravel(jnp.asarray(movable, u.dtype))
        movable = np.asarray(target.ravel({s.name: held[s.name] for s in target.sites})) > 0
    status, _, stationary = mode_stationarity(target, u_target, key, None, "marglik's MAP", movable=movable)
    info = {
        "prior_precision": list(per_layer),
        "marglik_rounds": len(evidences),
        "marglik_evidence": np.asarray(evidences),
        **stationary,
    }
    if log_sigma is not None:
        info["noise_scale"] = math.exp(log_sigma)
    return target, u_target, status, info


def recompiled(problem, model):
    X, y = problem.data
    return compile_problem(
        model, (np.asarray(X), np.asarray(y)), temperature=float(problem.temperature), tempering=problem.tempering
    )


def with_prior(problem, precision):
    layers = problem.parameter_groups()
    values = (precision,) * len(layers) if isinstance(precision, float) else precision
    return recompiled(problem, problem.model.with_prior_scales(tuple(1.0 / math.sqrt(v) for v in values)))


def _sigma_index(problem):
    """The flat coordinate of a learned Gaussian noise scale (log σ), or None."""
    if problem.likelihood != "gaussian" or problem.model.noise_scale is not None:
        return None
    start = 0
    for site in problem.sites:
        if site.name == "sigma":
            return start
        start += site.size
    return None


class _MarglikArrays(NamedTuple):
    """Per-coordinate layer groups, the network-weight mask and the free coordinates (a pytree)."""

    groups: jax.Array
    weights: jax.Array
    free: jax.Array


@partial(jax.jit, static_argnames=("steps",))
def _map_with_hypers(problem, u, weight_mask, alpha_coord, steps: int):
    """The mode over the coordinates where ``weight_mask`` is 1, every other coordinate held at u,
    under a Gaussian prior with per-coordinate precisions ``alpha_coord`` (an array, so new values
    never recompile); L-BFGS from u until the gradient vanishes or ``steps`` iterations."""
    prior_weight, lik_weight = problem.weights(None)

    def loss(v):
        full = jnp.where(weight_mask > 0, v, u)
        log_lik = problem.log_terms(full).log_likelihood
        return -(lik_weight * log_lik - 0.5 * prior_weight * jnp.sum(alpha_coord * jnp.square(full)))

    return _lbfgs(loss, u, steps, 1e-10, mask=weight_mask)


STALLED = 5  # L-BFGS iterations in a row without a gain above the float's resolution end a search


def _lbfgs(loss, x, steps: int, tol: float, mask=None, bound=None):
    """L-BFGS (optax, zoom line search) on ``loss`` from ``x`` inside one ``while_loop``, until the
    gradient norm is at most ``tol``, ``STALLED`` iterations in a row lower the loss by no more than
    the float's resolution (10 ulps of max(|loss|, 1): in float32 a gradient tolerance of 1e-10 is
    out of reach, and the line search then spends many passes per iteration standing still — on a
    pretrained CNN's last layer 200 iterations took 87 s against 10 s for the first 50, for a loss
    1.5e-4 lower), or ``steps`` iterations. ``mask`` (0/1 per coordinate) holds coordinates fixed;
    ``bound`` clips the iterate to [−bound, bound]."""
    optimizer = optax.lbfgs()
    value_and_grad = optax.value_and_grad_from_state(loss)
    mask = jnp.ones_like(x) if mask is None else mask

    resolution = 10 * float(jnp.finfo(x.dtype).eps)

    def body(carry):
        v, state, i, _, previous, stalled = carry
        value, grad = value_and_grad(v, state=state)
        grad = grad * mask
        updates, state = optimizer.update(grad, state, v, value=value, grad=grad, value_fn=loss)
        new = v + updates * mask
        new = new if bound is None else jnp.clip(new, -bound, bound)
        gained = previous - value > resolution * jnp.maximum(jnp.abs(value), 1.0)
        return new, state, i + 1, jnp.linalg.norm(grad), value, jnp.where(gained, 0, stalled + 1)

    def cond(carry):
        return (carry[2] < steps) & (carry[3] > tol) & (carry[5] < STALLED)

    inf = jnp.asarray(jnp.inf, x.dtype)
    init = (x, optimizer.init(x), jnp.asarray(0), inf, inf, jnp.asarray(0))
    return jax.lax.while_loop(cond, body, init)[0]


def _maximise_evidence(problem, u, arrays, hessian, pieces, log_alpha, log_sigma, sigma_at) -> tuple:
    """Maximise the Laplace evidence over log α (and log σ) at a fixed mode and curvature."""
    learn_sigma = sigma_at is not None
    sigma0 = jnp.exp(u[sigma_at]) if learn_sigma else jnp.ones((), u.dtype)
    residual = _residual_sq(problem, u) if learn_sigma else jnp.zeros((), u.dtype)
    fixed_lik = _log_likelihood(problem, u)
    start = jnp.asarray(np.r_[log_alpha, [log_sigma] if learn_sigma else []], curvature.wide(u.dtype))
    best, evidence = _evidence_optimum(
        problem, u, arrays, pieces, start, sigma0, residual, fixed_lik, hessian=hessian, learn_sigma=learn_sigma,
        num_alpha=len(log_alpha),
    )
    best = np.asarray(best)
    return best[: len(log_alpha)], (float(best[-1]) if learn_sigma else None), float(evidence)


@jax.jit
def _log_likelihood(problem, u):
    return problem.log_terms(u).log_likelihood


@jax.jit
def _residual_sq(problem, u):
    X, y = problem.data
    f = problem.apply(problem.constrain(u), X)
    return jnp.sum(jnp.square(y - f))


@partial(jax.jit, static_argnames=("hessian", "learn_sigma", "num_alpha"))
def _evidence_optimum(problem, u, arrays, pieces, start, sigma0, residual, fixed_lik, *, hessian, learn_sigma, num_alpha):
    prior_weight, lik_weight = problem.weights(None)
    n = problem.num_data
    theta = u[arrays.free]
    groups = arrays.groups[arrays.free]
    structure = structures.structure(hessian)

    def log_evidence(h):
        alpha = jnp.exp(h[:num_alpha])[groups]
        if learn_sigma:
            sigma = jnp.exp(h[-1])
            scale = jnp.square(sigma0 / sigma)
            log_lik = -0.5 * residual / sigma**2 - n * jnp.log(sigma) - 0.5 * n * math.log(2 * math.pi)
        else:
            scale, log_lik = 1.0, fixed_lik
        log_det = structure.log_det(pieces, lik_weight * scale, prior_weight * alpha)
        log_prior = 0.5 * jnp.sum(jnp.log(alpha / (2 * math.pi)) - alpha * jnp.square(theta))
        return lik_weight * log_lik + prior_weight * log_prior - 0.5 * log_det + 0.5 * theta.shape[0] * math.log(2 * math.pi)

    h = _lbfgs(lambda h: -log_evidence(h), start, HYPER_STEPS, 1e-9, bound=30.0)
    return h, log_evidence(h)
