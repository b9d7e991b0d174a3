"""A fitted posterior with a density, as a NumPyro guide.

The guide draws the flat unconstrained vector u from the fitted family q (one auxiliary sample
site, ``_ppl_u``), maps it to every latent site's constrained value, and records those values as
``Delta`` sites. The log |det ∂θ/∂u| of the constraining transforms is put on the first of them,
so the guide's density over the model's sites is q(θ) = q_u(u) / |det ∂θ/∂u| — what NumPyro's
``Trace_ELBO`` needs for log p(θ, D) − log q(θ). This is the shape of NumPyro's own
``AutoContinuous`` guides, with ppl's family in place of theirs.
"""

from __future__ import annotations

import math

import numpyro
import numpyro.distributions as dist
from numpyro import handlers
from numpyro.distributions import constraints

__all__ = ["FamilyDistribution", "numpyro_guide", "FLAT_SITE"]

FLAT_SITE = "_ppl_u"


class FamilyDistribution(dist.Distribution):
    """A ppl family over the flat vector (any approximation with a density: the Gaussian family,
    mixtures, flows) as a NumPyro distribution with event shape (P,)."""

    arg_constraints: dict = {}
    support = constraints.real_vector

    def __init__(self, family, dim: int):
        self.family = family
        super().__init__(batch_shape=(), event_shape=(int(dim),))

    def sample(self, key, sample_shape=()):
        count = math.prod(sample_shape)
        draws = self.family.sample(key, max(count, 1))
        return draws.reshape(tuple(sample_shape) + self.event_shape)

    def log_prob(self, value):
        return self.family.log_prob(value)


def numpyro_guide(problem, family):
    """The guide function (it accepts and ignores the model's arguments)."""
    dim = problem.num_params

    def guide(*args, **kwargs):
        u = numpyro.sample(FLAT_SITE, FamilyDistribution(family, dim), infer={"is_auxiliary": True})
        # The Problem runs the model internally to constrain u; blocked, so none of those inner
        # sites reach the trace the guide is recorded in.
        with handlers.block():
            values = problem.constrain(u)
            log_jacobian = problem.log_jacobian(u)
        for i, site in enumerate(problem.sites):
            value = values[site.name]
            numpyro.sample(
                site.name,
                dist.Delta(value, log_density=-log_jacobian if i == 0 else 0.0, event_dim=value.ndim),
            )

    return guide
