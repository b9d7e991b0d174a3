"""``ensemble``: a deep ensemble, M MAP estimates from independent initialisations.

The members are trained together by :func:`ppl.inference.optimize.minimize` with its members
axis: one compiled program (vmapped for gradient steps, so the members' matrix products run as
one batched product; one member after the other for L-BFGS), split over the devices when JAX has
several (accelerators, or CPU cores exposed with ``jax_num_cpu_devices``). Member m draws its
initial point and its minibatches from its own key, ``fold_in(seed, m)`` for m ≥ 1 and the seed
itself for member 0, so member 0 is the ``map`` run with the same seed and options, and member m
does not depend on how many members there are.

The result's kind is ``"members"``: the members sit on the chain axis (M chains of one draw), and
the diagnostics report their disagreement as the spread between modes, never as chains that
failed to mix. Predictions average the members' predictive distributions (Lakshminarayanan et
al. 2017); there is no density over weights, so k-hat, ELBO and the linearised predictives do not
apply.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from ppl.core.checkpoint import Session
from ppl.core.errors import OptionError
from ppl.core.method import check_positive_int
from ppl.core.posterior import Posterior
from ppl.inference.map import MAP
from ppl.inference.optimize import (
    NegativeLogJoint, OptimizerConfig, full_gradient, gradient_evidence, has_moved, minimize, round_convergence,
)

__all__ = ["Ensemble", "member_keys", "train_members", "members_record"]


def member_keys(key, num_members: int) -> jax.Array:
    """(M, 2) keys: the seed's own key for member 0, ``fold_in(key, m)`` for member m ≥ 1."""
    return jnp.stack([key if m == 0 else jax.random.fold_in(key, m) for m in range(num_members)])


@dataclass(frozen=True)
class Ensemble(MAP):
    """M MAP estimates from independent initialisations, trained as one program.

    Options are those of ``map`` (the same optimiser for every member) and ``num_members``.
    """

    name: ClassVar[str] = "ensemble"
    kind: ClassVar[str] = "members"
    loss_label: ClassVar[str] = "negative log joint (each member)"
    description: ClassVar[str] = (
        "deep ensemble: M MAP estimates from independent initialisations, trained as one compiled program"
    )

    num_members: int = 5

    def __post_init__(self):
        super().__post_init__()
        check_positive_int(self.name, "num_members", self.num_members)
        check_distinct_starts(self.name, self.init, self.num_members)

    def stored_draws(self) -> int:
        return int(self.num_members)

    def run(self, key, problem, session: Session | None = None) -> Posterior:
        self.check(problem)
        # one tuning of the prior and noise scale (prior_precision), shared by the members: member 0 stays the map run
        problem, tuned = self.target(key, problem, session)
        return train_members(key, problem, self.config(), num_members=self.num_members,
                             learning_rate=self.learning_rate, init=self.init, session=session, info=tuned)


def check_distinct_starts(name: str, init, num_members: int) -> None:
    """Refuse a start shared by every member: an ensemble's spread comes from its members' starts."""
    if init == "pretrained" and num_members > 1:
        raise OptionError(
            f"{name}: init='pretrained' would start all {num_members} members at the same trained weights, and the "
            "members' spread comes from their different starts; use init='prior' (or method='laplace', which builds "
            "on the trained weights)"
        )


def train_members(key, problem, config: OptimizerConfig, *, num_members: int, learning_rate: float = 0.01,
                  init: str = "prior", session: Session | None = None, info: dict | None = None) -> Posterior:
    """The ``ensemble`` method's run on ``problem`` as given (its prior already chosen): M MAP
    searches under ``config`` from starts drawn by ``init``, trained as one program, each until it
    settles or the budget is spent; a ``members`` Posterior (member m's mode at ``flat_draws[m, 0]``)
    whose ``info`` adds ``info``. Member 0 is :func:`~ppl.inference.optimize.fit_mode`'s run with
    the same key. Methods that start from several modes (MoLA, MultiSWAG, SG-MCMC's anchors) call it."""
    keys = member_keys(key, num_members)
    check_distinct_starts("ensemble", init, num_members)
    # As map does for its one run: split each member's key into its initial point and its steps.
    split = jax.vmap(jax.random.split)(keys)
    init_keys, run_keys = split[:, 0], split[:, 1]
    starts = jnp.stack([problem.init_position(k, init) for k in init_keys])
    objective = NegativeLogJoint()
    start_norms = [float(full_gradient(objective, problem, starts[m], run_keys[m])[1]) for m in range(num_members)]

    def judge_members(params, losses, stopped):
        # A member that settled was frozen at that step: it is judged on its run up to there.
        return [round_convergence(
            losses[m, : stopped[m] or losses.shape[-1]], config.steps, config.budget,
            moved=has_moved(starts[m], params[m]), stochastic=config.batch_size is not None,
            **gradient_evidence(objective, problem, params[m], run_keys[m], start_norms[m]),
        ) for m in range(num_members)]

    def build(params, losses, stopped):
        judged = judge_members(params, losses, stopped)
        return Posterior(
            method=Ensemble.name, kind=Ensemble.kind, declared_by=Ensemble, problem=problem, flat_draws=params[:, None, :],
            **members_record(judged, losses), info={"optimizer": config.optimizer, **(info or {})},
        )

    result = minimize(
        objective, config, problem, starts, run_keys, learning_rate=learning_rate, label="ensemble",
        session=session, build=build, members=num_members,
        judge=lambda params, losses, stopped: [
            status.converged and not status.interrupted for status, _ in judge_members(params, losses, stopped)
        ],
    )
    return build(result.params, result.losses, result.stopped).replace(resume_state=result.resume_state)


def members_record(judged: list, losses) -> dict:
    """The ``status`` and ``trace`` of M members' runs, each judged by ``loss_convergence``: the
    run converged when every member did (the status names those that did not); the trace holds
    the (M, steps) losses and each figure's worst value over the members."""
    failed = [f"member {m}: {status.convergence}" for m, (status, _) in enumerate(judged) if not status.converged]
    first = judged[0][0]
    status = first._replace(
        converged=not failed, convergence="; ".join(failed) or "settled",
        interrupted=any(bool(s.interrupted) for s, _ in judged), steps_done=int(np.shape(losses)[-1]),
    )

    def worst(field, pick):
        values = [getattr(trace, field) for _, trace in judged if getattr(trace, field) is not None]
        return float(pick(values)) if values else None

    trace = judged[0][1]._replace(
        losses=np.asarray(losses), final_loss=worst("final_loss", max), loss_slope=worst("loss_slope", min),
        loss_slope_se=worst("loss_slope_se", max), loss_noise=worst("loss_noise", max),
        grad_norm=worst("grad_norm", max), gradient_t_max=worst("gradient_t_max", max),
    )
    return {"status": status, "trace": trace}
