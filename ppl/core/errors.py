"""The exception types users catch."""

from __future__ import annotations

import difflib

__all__ = ["DataError", "OptionError", "NonFiniteError", "MemoryBudgetError", "RunError", "ResumeError"]


def did_you_mean(given, choices) -> str:
    """``" (did you mean 'nuts'?)"`` when ``given`` is a near miss of one of ``choices`` (a misspelt
    name), else ``""``: appended to an error that lists the valid names."""
    if not isinstance(given, str):
        return ""
    names = [str(c) for c in choices]
    lowered = {name.lower(): name for name in names}
    close = difflib.get_close_matches(given.lower(), list(lowered), n=1, cutoff=0.6)
    return f" (did you mean {lowered[close[0]]!r}?)" if close else ""


class DataError(ValueError):
    """The data handed to ``ppl.fit``/``ppl.evaluate`` is unusable; raised before any tracing."""


class OptionError(ValueError):
    """An unknown method, an unknown option, or an option value outside its valid set."""


class NonFiniteError(FloatingPointError):
    """Training produced a non-finite loss or parameter.

    ``last_finite_params`` holds the flat unconstrained parameters of the last finite chunk and
    ``step`` the first step whose loss was not finite, so nothing computed before is lost.
    """

    def __init__(self, message: str, *, step: int, last_finite_params=None, partial=None):
        super().__init__(message)
        self.step = step
        self.last_finite_params = last_finite_params
        # A Posterior of the last finite state (marked failed), when the method could build one.
        self.partial = partial


class MemoryBudgetError(MemoryError):
    """A request (stored draws, a dense matrix) would not fit in memory; refused up front."""


class RunError(ValueError):
    """A saved run folder cannot be used as asked: missing, corrupt, edited, of another format
    version, locked by another writer, or (for a plain NumPyro program) loaded without its program.
    The message names the folder and the file."""


class ResumeError(ValueError):
    """A checkpoint does not belong to the run being resumed (other data, model, method, options or
    seed), or its state does not fit this run; the message names what differs."""
