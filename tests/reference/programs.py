"""The posteriordb models as plain NumPyro programs, and the case table.

Each program follows the Stan code that posteriordb stores for the model (``model_name`` in
``posteriors/<posterior>.json``; the files are ``posterior_database/models/stan/<model>.stan`` in
stan-dev/posteriordb). Stan's transformed data (logs, indicator columns, centring) is computed on
the host by the case's ``make_data``, so the programs receive plain arrays. Parameter names are
Stan's, so ``posteriordb.select`` maps ``beta[1]`` to ``draws["beta"][..., 0]`` with no renaming.

Flat priors (Stan parameters without a sampling statement) are ``ImproperUniform`` with the
parameter's support: ``real`` for coefficients, ``positive`` for ``real<lower=0> sigma``, built by
:func:`flat`. ppl gives such sites a uniform(−2, 2) start in unconstrained space when it runs the
program to find its sites, as NumPyro's ``init_to_uniform`` does.

The mixture's ``ordered[2] mu; mu ~ normal(0, 2)`` is :class:`OrderedNormal`: support
``ordered_vector`` (so ppl maps it to unconstrained space with NumPyro's ordered transform, as
Stan does) and density ``2! · Π N(mu_k | 0, 2)`` on the ordered set — the law of two sorted iid
normal draws, which is proper, so it is a real prior site (not a likelihood ``factor``) and can be
sampled for ``init="prior"``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from jax.scipy.special import gammaln
from numpyro.distributions import constraints

__all__ = ["CASES", "Case", "OrderedNormal", "flat", "case"]


# -- building blocks ------------------------------------------------------------------------------
def flat(support=constraints.real, event_shape: tuple = ()) -> dist.ImproperUniform:
    """A flat prior over ``support`` with ``event_shape`` (see the module docstring)."""
    return dist.ImproperUniform(support, (), event_shape)


class OrderedNormal(dist.Distribution):
    """iid N(loc, scale²) draws sorted into increasing order: an ordered vector of length ``size``.

    Density ``size! · Π_k N(x_k | loc, scale²)`` on ``x_1 < … < x_size`` — Stan's
    ``ordered[K] x; x ~ normal(loc, scale)`` up to its (constant) normaliser.
    """

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    support = constraints.ordered_vector
    reparametrized_params = ["loc", "scale"]

    def __init__(self, loc, scale, size: int, *, validate_args=None):
        self.loc, self.scale, self.size = loc, scale, int(size)
        super().__init__(batch_shape=(), event_shape=(self.size,), validate_args=validate_args)

    def sample(self, key, sample_shape=()):
        eps = jax.random.normal(key, tuple(sample_shape) + (self.size,))
        return jnp.sort(self.loc + self.scale * eps, axis=-1)

    def log_prob(self, value):
        return jnp.sum(dist.Normal(self.loc, self.scale).log_prob(value), axis=-1) + gammaln(self.size + 1.0)


# -- the programs ---------------------------------------------------------------------------------
def blr(X, y):
    """posteriordb ``blr``: linear regression without intercept, N(0, 10²) coefficients, N⁺(0, 10²) sigma."""
    beta = numpyro.sample("beta", dist.Normal(0.0, 10.0).expand([X.shape[1]]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(10.0))
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Normal(X @ beta, sigma), obs=y)


def kilpisjarvi(x, y, pmualpha, psalpha, pmubeta, psbeta):
    """posteriordb ``kilpisjarvi``: y ~ N(alpha + beta·x, sigma²), normal priors on alpha and beta
    (their means and scales are data), flat sigma on (0, ∞)."""
    alpha = numpyro.sample("alpha", dist.Normal(pmualpha, psalpha))
    beta = numpyro.sample("beta", dist.Normal(pmubeta, psbeta))
    sigma = numpyro.sample("sigma", flat(constraints.positive))
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.Normal(alpha + beta * x, sigma), obs=y)


def flat_regression(X, y):
    """y ~ N(X·beta, sigma²) with flat priors on beta ∈ ℝᴷ and sigma > 0 (X holds Stan's columns,
    the constant first): posteriordb's ``logearn_interaction``, ``nes`` and ``logmesquite``."""
    beta = numpyro.sample("beta", flat(constraints.real, (X.shape[1],)))
    sigma = numpyro.sample("sigma", flat(constraints.positive))
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Normal(X @ beta, sigma), obs=y)


def diamonds(Xc, Y):
    """posteriordb ``diamonds`` (brms): Y ~ N(Intercept + Xc·b, sigma²) with Xc the centred non-constant
    columns, b ~ N(0, 1), Intercept ~ t₃(8, 10), sigma ~ half-t₃(0, 10)."""
    b = numpyro.sample("b", dist.Normal(0.0, 1.0).expand([Xc.shape[1]]).to_event(1))
    intercept = numpyro.sample("Intercept", dist.StudentT(3.0, 8.0, 10.0))
    sigma = numpyro.sample("sigma", dist.FoldedDistribution(dist.StudentT(3.0, 0.0, 10.0)))
    with numpyro.plate("data", Xc.shape[0]):
        numpyro.sample("Y", dist.Normal(intercept + Xc @ b, sigma), obs=Y)


def eight_schools_noncentered(y, sigma):
    """posteriordb ``eight_schools_noncentered``; theta = mu + tau·theta_trans is derived afterwards
    (:func:`_eight_schools_theta`), since ``Posterior.draws`` holds sample sites only."""
    theta_trans = numpyro.sample("theta_trans", dist.Normal(0.0, 1.0).expand([y.shape[0]]).to_event(1))
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu + tau * theta_trans, sigma), obs=y)


def low_dim_gauss_mix(y):
    """posteriordb ``low_dim_gauss_mix``: y ~ theta·N(mu₁, sigma₁²) + (1 − theta)·N(mu₂, sigma₂²),
    mu ordered with N(0, 2²) priors, sigma ~ N⁺(0, 2²), theta ~ Beta(5, 5)."""
    mu = numpyro.sample("mu", OrderedNormal(0.0, 2.0, 2))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0).expand([2]).to_event(1))
    theta = numpyro.sample("theta", dist.Beta(5.0, 5.0))
    # Components as a (1, 2) batch, so that the mixture broadcasts against (N,) data without
    # implicit rank promotion (the tests run with jax_numpy_rank_promotion="raise").
    mixing = dist.Categorical(probs=jnp.stack([theta, 1.0 - theta])[None, :])
    components = dist.Normal(mu[None, :], sigma[None, :])
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.MixtureSameFamily(mixing, components), obs=y)


# -- data: Stan's data and transformed data blocks -------------------------------------------------
def _f(values) -> np.ndarray:
    return np.asarray(values, dtype=float)


def _blr_data(raw: dict) -> dict:
    return {"X": _f(raw["X"]), "y": _f(raw["y"])}


def _kilpisjarvi_data(raw: dict) -> dict:
    # Prior means and scales are Python floats: static arguments of the program.
    return {
        "x": _f(raw["x"]),
        "y": _f(raw["y"]),
        **{k: float(raw[k]) for k in ("pmualpha", "psalpha", "pmubeta", "psbeta")},
    }


def _earnings_data(raw: dict) -> dict:
    height, male = _f(raw["height"]), _f(raw["male"])
    X = np.column_stack([np.ones_like(height), height, male, height * male])
    return {"X": X, "y": np.log(_f(raw["earn"]))}


def _nes_data(raw: dict) -> dict:
    age = np.asarray(raw["age_discrete"])
    columns = [
        np.ones(age.shape[0]),
        _f(raw["real_ideo"]),
        _f(raw["race_adj"]),
        _f(age == 2),
        _f(age == 3),
        _f(age == 4),
        _f(raw["educ1"]),
        _f(raw["gender"]),
        _f(raw["income"]),
    ]
    return {"X": np.column_stack(columns), "y": _f(raw["partyid7"])}


def _mesquite_data(raw: dict) -> dict:
    logs = [np.log(_f(raw[k])) for k in ("diam1", "diam2", "canopy_height", "total_height", "density")]
    X = np.column_stack([np.ones(len(raw["weight"])), *logs, _f(raw["group"])])
    return {"X": X, "y": np.log(_f(raw["weight"]))}


def _diamonds_data(raw: dict) -> dict:
    X = _f(raw["X"])
    if int(raw.get("prior_only", 0)):
        raise ValueError("diamonds data has prior_only set; the reference posterior conditions on Y")
    return {"Xc": X[:, 1:] - X[:, 1:].mean(axis=0), "Y": _f(raw["Y"])}


def _eight_schools_data(raw: dict) -> dict:
    return {"y": _f(raw["y"]), "sigma": _f(raw["sigma"])}


def _mixture_data(raw: dict) -> dict:
    return {"y": _f(raw["y"])}


def _eight_schools_theta(draws: dict) -> dict:
    theta = draws["mu"][..., None] + draws["tau"][..., None] * draws["theta_trans"]
    return {**draws, "theta": theta}


# -- the case table -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """One posteriordb posterior: our program, its data, how to read its draws, how to sample it.

    ``nuts`` are the ``ppl.fit(..., method="nuts")`` options the test and the bench use;
    ``derive`` adds Stan's transformed parameters to ``Posterior.draws``; ``slow`` marks the case
    for ``pytest -m slow``; ``expect_divergences`` documents a case whose divergences are expected
    (none are, at present).
    """

    posterior: str
    model: Callable
    make_data: Callable[[dict], dict]
    nuts: dict = field(default_factory=dict)
    derive: Callable[[dict], dict] | None = None
    slow: bool = True
    expect_divergences: bool = False
    note: str = ""

    def data(self) -> dict:
        from .posteriordb import load_data

        return self.make_data(load_data(self.posterior))

    def stan_draws(self, draws: dict, names) -> dict:
        """Our draws (``Posterior.draws``) as Stan name -> (chain, draw)."""
        from .posteriordb import select

        return select(self.derive(draws) if self.derive else draws, names)


_NUTS = {"num_chains": 4, "num_warmup": 1000, "num_samples": 1000}
_DENSE = {**_NUTS, "dense_mass": True}

CASES: dict[str, Case] = {
    c.posterior: c
    for c in [
        Case("sblri-blr", blr, _blr_data, dict(_NUTS), slow=False, note="independent inputs: diagonal mass suffices."),
        Case("sblrc-blr", blr, _blr_data, _DENSE, note="strongly correlated inputs: dense mass."),
        Case(
            "kilpisjarvi_mod-kilpisjarvi",
            kilpisjarvi,
            _kilpisjarvi_data,
            _DENSE,
            note="x is a calendar year (3952–4013 in this version of the data), so alpha and beta have "
            "posterior correlation −0.99999: dense mass.",
        ),
        Case(
            "earnings-logearn_interaction",
            flat_regression,
            _earnings_data,
            _DENSE,
            note="uncentred height and its interaction with male: correlated coefficients, dense mass.",
        ),
        Case("nes2000-nes", flat_regression, _nes_data, _DENSE, note="uncentred covariates: dense mass."),
        Case("mesquite-logmesquite", flat_regression, _mesquite_data, _DENSE, note="correlated log sizes: dense mass."),
        Case(
            "diamonds-diamonds",
            diamonds,
            _diamonds_data,
            _DENSE,
            note="N=5000, 26 highly correlated parameters. With dense mass NUTS takes about 20 s; with "
            "the default diagonal mass it took 530 s (2 shared cores) and 3569 of 4000 draws hit "
            "max_tree_depth=10 (step size 0.003–0.004), though the draws still matched the reference.",
        ),
        Case(
            "eight_schools-eight_schools_noncentered",
            eight_schools_noncentered,
            _eight_schools_data,
            {**_NUTS, "target_accept": 0.95},
            derive=_eight_schools_theta,
            note="non-centred funnel; target_accept 0.95 keeps it free of divergences; theta is derived "
            "from mu, tau, theta_trans.",
        ),
        Case(
            "low_dim_gauss_mix-low_dim_gauss_mix",
            low_dim_gauss_mix,
            _mixture_data,
            dict(_NUTS),
            note="two well-separated components; the ordering of mu removes label switching.",
        ),
    ]
}


def case(posterior: str) -> Case:
    return CASES[posterior]
