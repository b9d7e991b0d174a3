"""Samplers that run until they pass: the decision to continue a finished run for another round.

A Markov-chain method (nuts, hmc, mh, sgld, sghmc, cyclical_sgld) first takes the ``num_samples``
draws per chain it was asked for. If the run's own convergence checks then fail for a reason more
draws can cure (R-hat above 1.01 or bulk/tail ESS below 100 per chain, in function space for a
network), it continues the same chains for another ``num_samples`` draws, and again, until the
checks pass or the next round would overrun ``time_budget`` seconds (counted from the start of the
run), the memory the stored draws may take, or ``MAX_ROUNDS`` rounds. A run that stops on its
budget is an honest, longer run that still fails its checks, and its verdict says that the budget
was spent.

Which draws the result keeps: all of them while only ESS falls short (the chains are stationary
but too short). Once an R-hat check has failed, the chains may not have forgotten where they
started, and more draws would only dilute that transient, not remove it (measured: ``mh`` without
warmup on the conjugate fixture passed R-hat after two rounds with the intercept's mean 0.88 sd off,
the first round's draws included). From then on the first half of the rounds (rounded down) counts
as warmup and is left out of the result, the classic rule for runs of unknown burn-in; the later
half still grows with every round.

Which checks fail is the front end's business (``ppl.fit`` passes them in as
``Session.shortfall``), so the methods stay independent of the diagnostics.
"""

from __future__ import annotations

import time

from ppl.core.errors import OptionError, ResumeError

__all__ = ["Extension", "DEFAULT_TIME_BUDGET", "MAX_ROUNDS", "MAX_STORED_BYTES", "restored_halving"]

DEFAULT_TIME_BUDGET = 300.0  # seconds a sampler may run in all, extensions included
MAX_ROUNDS = 16  # the most draws a run may end with: 16 × num_samples per chain
MAX_STORED_BYTES = 2 * 2**30  # the most the stored draws of an extended run may take


class Extension:
    """The extension policy of one run: ``more(...)`` after each finished round says whether to
    continue, and ``info()`` what happened, for the Posterior's ``info``."""

    def __init__(self, method, session, rounds_done: int = 1, halved: bool = False):
        self.budget = method.time_budget
        self.num_samples = method.num_samples
        self.halved = halved  # an R-hat check has failed: the first half of the rounds is warmup
        self.shortfall = getattr(session, "shortfall", None)
        self.started = time.perf_counter()
        self.round_started = self.started
        self.rounds = rounds_done
        self.stop = "not needed" if self.shortfall is not None and self.budget else "off"

    def begin_round(self) -> None:
        self.round_started = time.perf_counter()

    def more(self, posterior, stored_bytes_per_round: int) -> bool:
        """Whether to sample another round, given the finished run so far."""
        if self.shortfall is None or not self.budget:
            return False
        failed = self.shortfall(posterior)
        if any("rhat" in check.field for check in failed):
            self.halved = True
        if not failed:
            self.stop = "passed" if self.rounds > 1 else "not needed"
            return False
        now = time.perf_counter()
        per_round = now - self.round_started
        rounds = self.rounds * needed_factor(failed)  # the rounds the checks would need in all
        if self.rounds >= MAX_ROUNDS:
            self.stop = f"round limit ({MAX_ROUNDS} × num_samples)"
        elif stored_bytes_per_round * (self.rounds + 1) > MAX_STORED_BYTES:
            self.stop = f"memory limit ({MAX_STORED_BYTES / 2**30:.0f} GiB of stored draws)"
        elif (now - self.started) + per_round > self.budget:
            self.stop = f"time budget ({self.budget:g} s)"
        elif min(rounds, MAX_ROUNDS) > self.rounds + 1 and (now - self.started) + per_round * (rounds - self.rounds) > self.budget:
            # not worth starting: at the rate the checks improve they would need far more time
            self.stop = (f"time budget ({self.budget:g} s): passing would take about {rounds:.0f} × num_samples draws, "
                         f"≈ {(now - self.started) + per_round * (rounds - self.rounds):.0f} s")
        else:
            self.rounds += 1
            return True
        return False

    def discarded(self) -> int:
        """Draws per chain that the result leaves out from the front of each chain."""
        return (self.rounds // 2) * self.num_samples if self.halved else 0

    def progress(self) -> dict:
        """What a checkpoint records of the extension, beside the draws target."""
        return {"discard_first_half": bool(self.halved)}

    def info(self) -> dict:
        return {"extension_rounds": int(self.rounds), "extension_stop": self.stop, "time_budget_s": self.budget,
                "draws_discarded": self.discarded()}


def restored_halving(progress: dict) -> bool:
    """The checkpoint's record of whether the run's first half of rounds is warmup."""
    value = progress.get("discard_first_half", False)
    if not isinstance(value, bool):
        raise ResumeError(f"the checkpoint's discard_first_half {value!r} is not true or false; start afresh without resume")
    return value


def needed_factor(failed) -> float:
    """How many times the draws so far the failed checks would need, if ESS grows in proportion to
    the draws and R-hat's excess over 1 shrinks in proportion to them."""
    factor = 1.0
    for check in failed:
        if check.field.startswith(("ess", "function_ess")) and check.value > 0:
            factor = max(factor, check.threshold / check.value)
        elif "rhat" in check.field and check.threshold > 1:
            factor = max(factor, (check.value - 1.0) / (check.threshold - 1.0))
        else:
            factor = float("inf")
    return factor


def check_time_budget(name: str, value) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or value == float("inf"):
        raise OptionError(
            f"{name}: time_budget must be a number of seconds ≥ 0 (0 or None: take exactly num_samples draws, never "
            f"extend), got {value!r}"
        )
