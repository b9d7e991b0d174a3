"""The prior and noise scale the point-based methods fit with: ``prior_precision``.

A network trained to its MAP under a fixed, weak prior with a learned noise scale σ over-fits:
with more weights than rows, the training residual shrinks as training goes on, σ's mode follows
it, and every spread built on that point (Laplace, SWAG, an ensemble) inherits a noise scale
tens of times too small. On the UCI sets this gave held-out log-likelihoods of −300 to −300 000.

``map``, ``ensemble``, ``laplace``, ``mola``, ``swag`` and ``multiswag`` share one option for it:

* ``"auto"`` (the default): ``"marglik"`` for a declarative network with hidden layers, a Gaussian
  likelihood with one learned noise scale, and a Gaussian weight prior — the case that collapses;
  the model's own prior (None) for everything else.
* ``"marglik"``: tune one prior precision per dense layer and σ by maximising the Laplace
  evidence (type-II maximum likelihood; MacKay 1992, Immer et al. 2021) over all the network's
  weights with K-FAC curvature, starting from a MAP of ``steps`` L-BFGS iterations; the
  evidence's log-determinant penalises the weights a small σ needs, which the joint does not.
  The method then runs, unchanged, on the model with the tuned prior and σ fixed at its tuned
  value (``post.problem.model``), and the verdict says that it judges that posterior.
* None: the model's own prior; a number or one number per dense layer: that Gaussian precision.

``laplace`` with an explicit ``"marglik"`` keeps tuning over its own coordinates and curvature
(``subset``, ``hessian``); ``"auto"`` tunes over all weights, as the other methods do.
"""

from __future__ import annotations

import math

import jax
import numpy as np

from ppl._errors import OptionError

__all__ = ["parse", "resolve", "check", "prepare", "applies"]

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
    if not (model.has_layers and model.dense and model.gaussian_prior):
        return "the network's layers are not dense with a Gaussian prior (K-FAC evidence needs both)"
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
    import dataclasses

    from ppl.inference.laplace import _recompiled

    theirs, ours = getattr(init.problem, "model", None), problem.model
    if theirs is None or theirs == ours or type(theirs) is not type(ours) or not dataclasses.is_dataclass(ours):
        return problem
    names = {f.name for f in dataclasses.fields(ours)}
    kept = {k: getattr(ours, k) for k in ("prior", "prior_scale", "noise_scale") if k in names}
    if dataclasses.replace(theirs, **kept) != ours:
        return problem
    return _recompiled(problem, theirs)


def prepare(name: str, value, key, problem, *, steps: int, init: str = "prior") -> tuple:
    """``(target, info)``: the problem the method runs on — ``problem`` itself, the model with a
    given Gaussian prior, or the model with its prior and σ tuned by the evidence — and a record
    of the tuning for the posterior's ``info``."""
    from ppl.inference.laplace import _with_prior

    value = resolve(value, problem)
    if value is None:
        return problem, {}
    if not isinstance(value, str):
        return _with_prior(problem, value), {}
    return tuned(name, key, problem, steps=steps, init=init)


def tuned(name: str, key, problem, *, steps: int, init: str = "prior") -> tuple:
    """The evidence tuning over all of a network's weights with K-FAC curvature, from a MAP of
    ``min(steps, TUNE_STEPS)`` L-BFGS iterations (as many in each round): a short start is enough,
    as each round's MAP moves with the hyperparameters. Returns ``(target, info)``."""
    from ppl._checkpoint import Interrupted
    from ppl.inference import _curvature as curvature
    from ppl.inference.laplace import tune_evidence
    from ppl.inference.optimize import MAP

    tune_key = jax.random.fold_in(key, TUNE_STREAM)
    map_key, evidence_key = jax.random.split(tune_key)
    steps = min(int(steps), TUNE_STEPS)
    found = MAP(steps=steps, max_steps=steps, init=init, prior_precision=None).run(map_key, problem)
    if found.status.interrupted:
        raise Interrupted(f"{name}: interrupted while tuning the prior and noise scale (prior_precision='marglik')", None)
    index = np.flatnonzero(curvature.network_mask(problem))
    target, _, _, info = tune_evidence(
        evidence_key, problem, found.approximation.loc, index=index, hessian="kfac", rank=1,
        prior_structure="layer", steps=steps, rounds=TUNE_ROUNDS,
    )
    return target, {key_: value for key_, value in info.items() if key_ != "map_gradient_norm"}
