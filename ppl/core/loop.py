"""One run loop for every method that steps in compiled chunks.

The optimiser (``map``, ``svi``, the ensemble's members, SWAG's trajectory), the NUTS/HMC chains
and the whitened SG-MCMC and Metropolis chains all run the same way: compiled chunks of steps
between which the host looks at what came back. What happens between chunks is the same for all of
them and lives here, once: the progress bars, Ctrl-C (a request is honoured between chunks, never
inside one), checkpoints when they are due, a non-finite stop with the results so far attached to
the error, and rounds: when a round's steps or draws are done, the method judges the run so far and
either stops or sets the next round's target (an optimiser runs another ``steps`` until its loss
settles; a sampler draws another ``num_samples`` until its mixing checks pass, see ``_extend``).

What differs is in a :class:`Loop`, the split BlackJAX makes between a kernel and the loop that
drives it: ``begin`` (what runs before the first chunk: a sampler's warmup), ``advance`` (one
chunk: run it, keep its results, raise :class:`ppl.NonFiniteError` on a non-finite state),
``snapshot`` (the partial result and the state to resume from, for a checkpoint) and ``finish``
(the result, or :class:`ppl.core.checkpoint.Interrupted` when there is none). ``resumable`` says
whether the loop's state can be written and continued; the driver writes checkpoints only then.
"""

from __future__ import annotations

from typing import ClassVar

from ppl.core import interrupt, progress
from ppl.core.errors import NonFiniteError

__all__ = ["Loop", "SamplerLoop", "drive"]


class Loop:
    """A method's loop as :func:`drive` sees it. Subclasses hold the loop's state as attributes."""

    resumable: ClassVar[bool] = True

    def bars(self) -> tuple:
        """The arguments of ``_progress.task``: (label, total) and any further (label, total) bars."""
        raise NotImplementedError

    def begin(self) -> None:
        """What runs inside the progress bars before the first chunk (a resumed run's bars are
        advanced to where it stopped; a sampler warms up)."""

    def count(self) -> int:
        """Steps or draws done so far: what checkpoints are spaced by."""
        raise NotImplementedError

    def round_over(self) -> bool:
        """Whether the current round's target is reached (the run then stops or extends)."""
        raise NotImplementedError

    def next_round(self) -> bool:
        """Judge the run at the end of a round: False stops it, True means the next round's target
        is set and the run goes on."""
        return False

    def advance(self) -> None:
        """Run one chunk and keep what it returned."""
        raise NotImplementedError

    def snapshot(self) -> tuple:
        """(partial Posterior or None, ResumeState) of the run so far, for a checkpoint."""
        raise NotImplementedError

    def failed_partial(self):
        """The partial result to attach to a NonFiniteError that ``advance`` raised without one."""
        return None

    def finish(self):
        """The run's result once the loop stopped (its rounds done, or Ctrl-C)."""
        raise NotImplementedError


class SamplerLoop(Loop):
    """A Markov-chain loop whose rounds are ``num_samples`` draws per chain: at a round's end the
    extension policy (``_extend.Extension``) judges the draws so far and may ask for another round.
    Subclasses set ``method``, ``extension``, ``target`` (draws per chain aimed at) and
    ``per_round`` (bytes one round of stored draws takes), and define ``so_far()`` (the draws so far
    as a Posterior, without a finished run's extra measurements) and ``extended()`` (the bars grow
    to the new target)."""

    def next_round(self) -> bool:
        if not self.extension.more(self.so_far(), self.per_round):
            return False
        # the checks failed for want of draws: the same chains continue for another round
        self.target += self.method.num_samples
        self.extension.begin_round()
        self.extended()
        return True

    def so_far(self):
        raise NotImplementedError

    def extended(self) -> None:
        raise NotImplementedError


def drive(loop: Loop, session):
    """Run ``loop`` to its end: chunks until a round is over, then the loop's own judgement of
    whether to go on; between chunks, the session's stop request and checkpoints. The progress bars
    follow ``session.progress``. Returns ``loop.finish()``."""
    session.start_count(loop.count())
    with progress.task(*loop.bars(), mode=session.progress), interrupt.guard():
        loop.begin()
        while not session.stop():
            if loop.round_over():
                if loop.next_round():
                    continue
                break
            try:
                loop.advance()
            except NonFiniteError as error:
                if getattr(error, "partial", None) is None:
                    error.partial = loop.failed_partial()
                if error.partial is not None and not error.partial.status.failed:
                    error.partial = error.partial.replace(status=error.partial.status._replace(failed=str(error)))
                raise
            if loop.resumable:
                session.maybe_checkpoint(loop.count(), loop.snapshot)
    return loop.finish()
