"""``mola``: a mixture of last-layer Laplace approximations (Eschenhagen et al. 2021).

M networks are trained to M different MAPs from M prior draws by ``method="ensemble"`` (one
compiled program, full-batch L-BFGS on the model's log joint); around each, a last-layer Laplace approximation
is built exactly as ``method="laplace", subset="last_layer"`` builds it, and the result is the
uniform :class:`~ppl.core.gaussian.Mixture` of the M Gaussians. The modes explore
different basins (what a deep ensemble gives), the Laplace components add uncertainty within
each (what bounds a ReLU network's confidence far from the data); predict with
``mode="probit"`` (per component, averaged) as the paper does, or ``"linearized"``/``"mc"``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ppl.core.checkpoint import Session
from ppl.core.errors import OptionError
from ppl.core.gaussian import Mixture, draw
from ppl.core.method import Method, check_choice, check_positive_int
from ppl.core.posterior import Posterior
from ppl.inference import _empirical_bayes as empirical_bayes
from ppl.inference.ensemble import member_keys, train_members
from ppl.inference.laplace import HESSIANS, Laplace, centred_gaussian
from ppl.inference.optimize import mode_config, mode_stationarity

__all__ = ["MoLA"]


@dataclass(frozen=True)
class MoLA(Method):
    """Mixture of last-layer Laplace approximations around ``num_members`` MAP networks.

    ``hessian``, ``prior_precision`` (as for ``map``: ``"auto"`` tunes a regression network's prior
    and learned σ by the evidence once, for all members; None: the model's prior) and
    ``rank`` are those of ``laplace`` (``hessian="auto"``: the exact GGN of the last layer up to
    ``laplace.FULL_MAX`` weights, K-FAC above); ``steps`` bounds each member's L-BFGS iterations.
    """

    name = "mola"
    kind = "mixture"
    loss_label = "negative log joint (each member's MAP search)"
    model_options = ("prior_precision",)
    description = "mixture of last-layer Laplace approximations around M MAP networks trained as one program"

    num_members: int = 5
    hessian: str = "auto"
    prior_precision: Any = "auto"
    rank: int = 20
    num_draws: int = 1000
    steps: int = 2000
    init: str = "prior"

    def __post_init__(self):
        super().__post_init__()
        check_positive_int(self.name, "num_members", self.num_members)
        check_choice(self.name, "hessian", self.hessian, HESSIANS)
        object.__setattr__(self, "prior_precision", empirical_bayes.parse(self.name, self.prior_precision))
        check_choice(self.name, "init", self.init, ("prior", "uniform"))
        self._laplace()  # validates the shared options

    def _laplace(self) -> Laplace:
        return Laplace(
            subset="last_layer", hessian=self.hessian, prior_precision=None, rank=self.rank,
            num_draws=self.num_draws, steps=self.steps, init=self.init,
        )

    def stored_draws(self) -> int:
        return self.num_draws

    def check(self, problem) -> None:
        if not problem.is_declarative:
            raise OptionError(f"{self.name}: a mixture of last-layer Laplace needs a network from ppl.models")
        empirical_bayes.check(self.name, self.prior_precision, problem)
        self._laplace().check(problem)

    def run(self, key, problem, session: Session | None = None) -> Posterior:
        self.check(problem)
        session = session or Session()
        laplace = self._laplace()
        # one prior (tuned once under "auto" for a regression network with a learned σ) for every member
        target, tuned = empirical_bayes.prepare(self.name, self.prior_precision, key, problem, steps=self.steps,
                                                init=self.init, session=session)
        start_key, curve_key, draw_key = jax.random.split(key, 3)
        found = train_members(start_key, target, mode_config(self.steps, optimizer="lbfgs"),
                              num_members=self.num_members, init=self.init, session=session.inner())
        modes = found.flat_draws[:, 0]
        keys = member_keys(start_key, self.num_members)
        index = laplace.free_index(target)
        hessian = laplace.structure(target)[1]
        components, evidences, norms, failed, shifts = [], [], [], [], []
        for m in range(self.num_members):
            status, _, judged = mode_stationarity(target, modes[m], keys[m], None, f"member {m}'s L-BFGS")
            norms.append(judged["map_gradient_norm"])
            if not status.converged:
                failed.append(f"member {m}: {status.convergence}")
            family, log_z, centring = centred_gaussian(target, modes[m], index, hessian, self.rank,
                                                       jax.random.fold_in(curve_key, m))
            shifts.append(centring["mode_shift_sd"])
            components.append(family)
            evidences.append(np.nan if log_z is None else log_z)
        mixture = Mixture(tuple(components), jnp.full(self.num_members, -math.log(self.num_members), target.init_params.dtype))
        # A Ctrl-C during the members' search stays recorded: the diagnostics then fail the result.
        status = found.status._replace(converged=not failed, convergence="; ".join(failed) or "settled")
        info = {
            "hessian": hessian,
            "subset": "last_layer",
            "num_free": int(len(index)),
            "member_log_evidence": np.asarray(evidences),
            "member_gradient_norm": np.asarray(norms),
            "member_mode_shift_sd": np.asarray(shifts, dtype=float),
            **tuned,
        }
        flat = draw(mixture, draw_key, self.num_draws)
        return Posterior(
            method=self.name, kind=self.kind, declared_by=type(self), problem=target, flat_draws=flat[None],
            status=status, trace=found.trace,
            info=info, approximation=mixture,
        )
