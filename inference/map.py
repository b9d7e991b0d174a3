"""``map``: the maximum a posteriori point estimate.

The method's options and its prior choice (``prior_precision``, :mod:`ppl.inference._empirical_bayes`)
live here; the climb itself is :func:`ppl.inference.optimize.fit_mode`, shared with the prior tuning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ppl.core.checkpoint import Session
from ppl.core.data import check_batch_size
from ppl.core.errors import OptionError
from ppl.core.method import Method, check_choice, check_positive, check_positive_int
from ppl.core.posterior import Posterior
from ppl.inference import _empirical_bayes as empirical_bayes
from ppl.inference.optimize import INITS, OPTIMIZERS, OptimizerConfig, budget_of, check_budget, fit_mode, mode_config

__all__ = ["MAP"]


@dataclass(frozen=True)
class MAP(Method):
    """Maximum a posteriori point estimate (constrained-space mode of the tempered posterior).

    ``optimizer="auto"`` takes L-BFGS with a zoom line search for full-batch data (it converges to
    machine precision on smooth problems; ``learning_rate`` is then unused) and Adam with a cosine
    schedule for minibatches.

    Training runs until its convergence test passes, within a budget: after ``steps`` steps the
    run is judged, and one that has not settled goes on in further rounds of ``steps`` (Adam's
    cosine schedule restarts each round) until it settles or ``max_steps`` are done (None:
    ``MAX_ROUNDS`` × ``steps``; ``max_steps=steps`` gives exactly ``steps``).

    ``prior_precision`` (:mod:`ppl.inference._empirical_bayes`): ``"auto"`` tunes the prior and
    the noise scale of a regression network with a learned σ by the Laplace evidence before the
    run (a MAP under the declared prior collapses σ to the training residual), and keeps the
    model's prior otherwise; None, ``"marglik"``, a number or one per layer as for ``laplace``.
    """

    name = "map"
    resumable = True
    kind = "point"
    loss_label = "negative log joint"
    model_options = ("prior_precision",)
    description = "maximum a posteriori point estimate by optax (L-BFGS full batch, Adam minibatch)"

    steps: int = 2000
    learning_rate: float = 0.01
    batch_size: int | None = None
    optimizer: str = "auto"
    init: str = "prior"
    max_steps: int | None = None
    prior_precision: Any = "auto"

    def __post_init__(self):
        super().__post_init__()
        check_positive_int(self.name, "steps", self.steps)
        check_budget(self.name, self.steps, self.max_steps)
        check_positive(self.name, "learning_rate", self.learning_rate)
        check_choice(self.name, "optimizer", self.optimizer, OPTIMIZERS)
        check_choice(self.name, "init", self.init, INITS)
        if self.optimizer == "lbfgs" and self.batch_size is not None:
            raise OptionError("map: optimizer='lbfgs' needs full-batch data; use 'adam' (or 'auto') with batch_size")
        object.__setattr__(self, "prior_precision", empirical_bayes.parse(self.name, self.prior_precision))

    def check(self, problem) -> None:
        check_batch_size(self.batch_size, problem.num_data)
        empirical_bayes.check(self.name, self.prior_precision, problem)

    def target(self, key, problem, session: Session | None = None) -> tuple:
        """(the problem to run on, a record for ``info``): the model with the prior
        ``prior_precision`` sets (tuned by the evidence under ``"auto"``/``"marglik"``)."""
        return empirical_bayes.prepare(self.name, self.prior_precision, key, problem, steps=self.steps, init=self.init,
                                       session=session)

    def config(self) -> OptimizerConfig:
        return mode_config(self.steps, self.batch_size, self.optimizer, self.max_steps)

    def budget(self) -> int:
        return budget_of(self.steps, self.max_steps)

    def run(self, key, problem, session: Session | None = None) -> Posterior:
        self.check(problem)
        problem, tuned = self.target(key, problem, session)
        return fit_mode(key, problem, self.config(), learning_rate=self.learning_rate, init=self.init, session=session,
                        info=tuned, declared_by=type(self))
