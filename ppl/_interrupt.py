"""Ctrl-C that stops a long run at the next chunk boundary instead of wherever it lands.

A compiled chunk of steps cannot be interrupted from Python, and a ``KeyboardInterrupt`` raised at
an arbitrary bytecode could leave a half-updated state. While :func:`guard` is active, the first
SIGINT only sets a flag that the backends' chunk loops read between chunks: the loop stops, keeps
everything computed so far and returns a partial result marked interrupted. A second Ctrl-C raises
``KeyboardInterrupt`` at once, for a user who really wants out.

Outside the main thread (where Python cannot install signal handlers) the guard does nothing and
Ctrl-C behaves as usual.

Across several processes (``jax.distributed``), every process runs the same compiled chunks, so
they must agree on each chunk's length and on when to stop: :meth:`ChunkPace.next_chunk` then
gathers every process's choice and stop flag, all take process 0's length, and all stop once any
of them was interrupted (``requested`` reports that agreed flag).
"""

from __future__ import annotations

import contextlib
import signal
import threading

import numpy as np

__all__ = ["guard", "requested", "request"]

_STATE = {"requested": False, "agreed": False, "depth": 0}


def _processes() -> int:
    import jax

    return jax.process_count()


def requested() -> bool:
    """True once Ctrl-C was pressed inside the active guard (across processes: once the
    processes agreed that one of them was)."""
    return _STATE["agreed"] if _processes() > 1 else _STATE["requested"]


def request() -> None:
    """Ask the running loop to stop at its next chunk boundary (what the first Ctrl-C does)."""
    _STATE["requested"] = True


def _handler(signum, frame):
    if _STATE["requested"]:
        raise KeyboardInterrupt
    request()


@contextlib.contextmanager
def guard():
    """Route SIGINT to the stop flag for the duration of the block (re-entrant)."""
    main = threading.current_thread() is threading.main_thread()
    if _STATE["depth"] == 0:
        _STATE["requested"] = _STATE["agreed"] = False
    previous = None
    # A process started with SIGINT ignored (a shell's background job) keeps ignoring it.
    if main and _STATE["depth"] == 0 and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        previous = signal.signal(signal.SIGINT, _handler)
    _STATE["depth"] += 1
    try:
        yield
    finally:
        _STATE["depth"] -= 1
        if _STATE["depth"] == 0:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
            _STATE["requested"] = False


class ChunkPace:
    """Chunk lengths sized to wall time: about ``target_s`` per chunk, so Ctrl-C and checkpoints
    take effect within a couple of seconds whatever one step costs.

    The first chunk is a single step (its call also compiles, so its time says nothing about a
    step), the second a few steps, then each chunk is sized from a running estimate of the cost of
    a step. Results never depend on the chunking: the loops carry their state and keys.
    """

    def __init__(self, capacity: int, target_s: float = 0.5):
        self.capacity = int(capacity)
        self.target_s = float(target_s)
        self.seconds_per_step = None
        self.calls = 0

    def next_chunk(self) -> int:
        steps = self._own_choice()
        if _processes() > 1:
            from jax.experimental import multihost_utils

            votes = multihost_utils.process_allgather(np.asarray([steps, int(_STATE["requested"])], np.int64))
            steps = int(votes[0, 0])
            _STATE["agreed"] = _STATE["agreed"] or bool(votes[:, 1].any())
        return steps

    def _own_choice(self) -> int:
        if self.calls == 0:
            return 1
        if self.seconds_per_step is None:
            return min(8, self.capacity)
        return int(max(1, min(self.capacity, self.target_s / max(self.seconds_per_step, 1e-9))))

    def record(self, steps: int, seconds: float) -> None:
        self.calls += 1
        if self.calls == 1:
            return
        rate = seconds / max(int(steps), 1)
        # Steps get cheaper (NUTS after warmup tunes its step size) or dearer: follow recent chunks.
        self.seconds_per_step = rate if self.seconds_per_step is None else 0.5 * (self.seconds_per_step + rate)
