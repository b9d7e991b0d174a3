"""The exception types users catch."""

from __future__ import annotations

__all__ = ["DataError", "OptionError", "NonFiniteError", "MemoryBudgetError"]


class DataError(ValueError):
    """The data handed to ``ppl.fit``/``ppl.evaluate`` is unusable; raised before any tracing."""


class OptionError(ValueError):
    """An unknown method, an unknown option, or an option value outside its valid set."""


class NonFiniteError(FloatingPointError):
    """Training produced a non-finite loss or parameter.

    ``last_finite_params`` holds the flat unconstrained parameters of the last finite chunk and
    ``step`` the first step whose loss was not finite, so nothing computed before is lost.
    """

    def __init__(self, message: str, *, step: int, last_finite_params=None):
        super().__init__(message)
        self.step = step
        self.last_finite_params = last_finite_params


class MemoryBudgetError(MemoryError):
    """A request (stored draws, a dense matrix) would not fit in memory; refused up front."""
