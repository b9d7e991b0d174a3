"""``batch_ensemble``: M members that share each layer's weights up to rank-1 factors (Wen, Tran & Ba 2020).

Member m's weights in layer l are W_l ∘ (r_{m,l} s_{m,l}ᵀ): one shared matrix W_l (fan_in × fan_out)
and two vectors per member, r (fan_in) and s (fan_out). Everything else — biases, a learned noise
scale, a user network's parameters outside its declared layers — is each member's own. A member
therefore costs fan_in + fan_out numbers per layer instead of fan_in · fan_out.

All members train together, as one MAP problem: the objective is the sum of the members' negative
log joints, each taken at the member's effective parameters (so each member's prior applies to its
effective weights, as in a deep ensemble), minimised by ``map``'s optimiser over (W, r, s, the
members' own parameters). The result is a ``members`` Posterior like ``ensemble``'s: member m's
effective parameters are its draw, and prediction, saving and the diagnostics are those of an
ensemble. With a model that declares no dense layers, nothing is shared and it is an ensemble
trained on the summed objective.

Initialisation, as the paper: W from the model's initialisation (``init``), r and s random signs
(±1), so that the members start as sign-flipped copies of one network and differ from the first
step; each member's own parameters from its own draw of ``init``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ppl.core import curvature
from ppl.core.checkpoint import Session
from ppl.core.posterior import Posterior
from ppl.inference.ensemble import Ensemble, member_keys
from ppl.inference.optimize import (
    full_gradient, gradient_evidence, has_moved, round_convergence, run_to_posterior,
)

__all__ = ["BatchEnsemble", "Sharing", "sharing"]


class Sharing(NamedTuple):
    """Where the shared weights lie in u: ``shared`` (P,) flags the layers' weight coordinates, and
    for each coordinate ``rows``/``cols`` index its row in the concatenated r and its column in the
    concatenated s (0 elsewhere). ``num_rows``/``num_cols``: the lengths of r and s."""

    shared: jax.Array
    rows: jax.Array
    cols: jax.Array
    num_rows: int
    num_cols: int

    def member(self, params, m):
        """Member m's effective flat parameters."""
        factor = params["r"][m][self.rows] * params["s"][m][self.cols]
        return jnp.where(self.shared, params["shared"] * factor, params["own"][m])

    def members(self, params):
        """(M, P): every member's effective parameters."""
        return jax.vmap(lambda m: self.member(params, m))(jnp.arange(params["own"].shape[0]))


def sharing(problem) -> Sharing:
    """The shared coordinates of ``problem``'s declared layers (none without declared layers)."""
    size = problem.num_params
    shared = np.zeros(size, bool)
    rows, cols = np.zeros(size, np.int32), np.zeros(size, np.int32)
    row_offset = col_offset = 0
    if problem.is_declarative and problem.model.has_layers:
        offsets = curvature.site_offsets(problem)
        for layer in problem.layers():
            start, count = offsets[layer.weight]
            index = np.arange(count)
            # the weight site is row-major (fan_in, fan_out) (a kernel: (..., fan_out), fan_in its other axes)
            shared[start : start + count] = True
            rows[start : start + count] = row_offset + index // layer.fan_out
            cols[start : start + count] = col_offset + index % layer.fan_out
            row_offset += layer.fan_in
            col_offset += layer.fan_out
    return Sharing(jnp.asarray(shared), jnp.asarray(rows), jnp.asarray(cols), max(row_offset, 1), max(col_offset, 1))


@dataclass(frozen=True)
class MembersLoss:
    """Σ_m −log p(θ_m, D) at every member's effective parameters θ_m (hashable: a static argument)."""

    def __call__(self, params, problem, key, batch, step=None):
        members = sharing(problem).members(params)  # the layout is structure: constants of the program
        return -jnp.sum(jax.vmap(lambda u: problem.log_joint(u, batch))(members))


@dataclass(frozen=True)
class BatchEnsemble(Ensemble):
    """M members sharing each layer's weights up to rank-1 factors, trained as one MAP problem.

    Options are those of ``ensemble``: ``map``'s (the optimiser, its budget and the prior, tuned
    once for every member) and ``num_members``.
    """

    name: ClassVar[str] = "batch_ensemble"
    kind: ClassVar[str] = "members"
    loss_label: ClassVar[str] = "negative log joint, summed over the members"
    description: ClassVar[str] = (
        "BatchEnsemble: M members sharing each layer's weights up to rank-1 factors, trained as one program"
    )

    num_members: int = 4  # the paper's

    def run(self, key, problem, session: Session | None = None) -> Posterior:
        self.check(problem)
        problem, tuned = self.target(key, problem, session)
        layout = sharing(problem)
        start = self.starting_point(key, problem, layout)
        config = self.config()
        objective = MembersLoss()
        run_key = jax.random.fold_in(key, 1)
        start_norm = float(full_gradient(objective, problem, start, run_key)[1])

        def judged(params, losses):
            return round_convergence(
                losses, config.steps, config.budget, moved=has_moved(start, params),
                stochastic=config.batch_size is not None,
                **gradient_evidence(objective, problem, params, run_key, start_norm),
            )

        def build(params, losses):
            status, trace = judged(params, losses)
            members = layout.members(params)
            info = {"optimizer": config.optimizer, "shared_fraction": float(np.mean(np.asarray(layout.shared))), **tuned}
            return Posterior(
                method=self.name, kind=self.kind, declared_by=type(self), problem=problem,
                flat_draws=members[:, None, :], status=status,
                trace=trace, info=info,
            )

        return run_to_posterior(objective, config, problem, start, run_key, learning_rate=self.learning_rate,
                                label=self.name, session=session, build=build, judged=judged)

    def starting_point(self, key, problem, layout: Sharing) -> dict:
        keys = member_keys(jax.random.fold_in(key, 2), self.num_members)
        own = jnp.stack([problem.init_position(k, self.init) for k in keys])
        sign_r, sign_s = jax.random.split(jax.random.fold_in(key, 3))
        dtype = own.dtype
        r = jax.random.rademacher(sign_r, (self.num_members, layout.num_rows), dtype)
        s = jax.random.rademacher(sign_s, (self.num_members, layout.num_cols), dtype)
        return {"shared": own[0], "r": r, "s": s, "own": own}
