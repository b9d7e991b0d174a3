"""Ctrl-C that stops a long run at the next chunk boundary instead of wherever it lands.

A compiled chunk of steps cannot be interrupted from Python, and a ``KeyboardInterrupt`` raised at
an arbitrary bytecode could leave a half-updated state. While :func:`guard` is active, the first
SIGINT only sets a flag that the backends' chunk loops read between chunks: the loop stops, keeps
everything computed so far and returns a partial result marked interrupted. A second Ctrl-C raises
``KeyboardInterrupt`` at once, for a user who really wants out.

Outside the main thread (where Python cannot install signal handlers) the guard does nothing and
Ctrl-C behaves as usual.

The command line wraps each command in :func:`command`, which takes SIGINT and SIGTERM for the whole
command and remembers the first request until the command ends. Outside any guard there is no loop
to ask, so the signal raises ``KeyboardInterrupt`` at once (the command saves what exists and exits
128 + the signal's number: 130, 143); inside a guard it behaves as above. Python delivers a signal
at whatever Python code runs next, which may be a callback it cannot raise from (JAX's
garbage-collection callback, a ``__del__``): that ``KeyboardInterrupt`` is dropped as "Exception
ignored". The request stays recorded all the same (:func:`pending`), and the loops, which read it
before every chunk, and the command's own checks (:func:`raise_pending`) act on it — a request seen
once is never forgotten.

Across several processes (``jax.distributed``), every process runs the same compiled chunks, so
they must agree on each chunk's length and on when to stop: :meth:`ChunkPace.next_chunk` then
gathers every process's choice and stop flag, all take process 0's length, and all stop once any
of them was interrupted (``requested`` reports that agreed flag).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading

import numpy as np

__all__ = ["guard", "requested", "request", "command", "pending", "raise_pending", "exit_status"]

# requested: this process was asked to stop; agreed: the processes agreed that one was (several
# processes); depth: guards active; command: a command() scope holds the signals; signal: the number
# of the first signal that asked (None: none yet, or request() from code).
_STATE = {"requested": False, "agreed": False, "depth": 0, "command": False, "signal": None}


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


def pending() -> bool:
    """True once this process was asked to stop (a signal, or :func:`request`), or agreed with the
    others that one of them was — whether or not a loop has acted on it yet. Unlike
    :func:`requested` it never starts JAX, so a command may ask it before choosing its devices."""
    return _STATE["requested"] or _STATE["agreed"]


def raise_pending() -> None:
    """Raise ``KeyboardInterrupt`` if a stop is pending: where a command passes from one phase to the
    next, so that a request whose ``KeyboardInterrupt`` was dropped still stops it there."""
    if pending():
        raise KeyboardInterrupt


def exit_status() -> int:
    """The exit status of a command stopped by a signal: 128 + its number (130 for Ctrl-C, 143 for
    SIGTERM), or 130 for a stop requested by code."""
    return 128 + (_STATE["signal"] or signal.SIGINT)


def _handler(signum, frame):
    if _STATE["requested"]:
        raise KeyboardInterrupt
    request()


def _command_handler(signum, frame):
    first = not _STATE["requested"]
    _STATE["requested"] = True
    if _STATE["signal"] is None:
        _STATE["signal"] = signum
    if first and _STATE["depth"] > 0:
        return  # a guarded loop reads the flag at its next chunk boundary
    # No loop to ask (or a second signal: the user wants out now).
    raise KeyboardInterrupt


def _quiet_unraisable(unraisable, previous):
    # A KeyboardInterrupt raised in a callback Python cannot raise from is dropped; the request it
    # carried is recorded and acted on, so its "Exception ignored" traceback would only alarm.
    kind = unraisable.exc_type
    if isinstance(kind, type) and issubclass(kind, KeyboardInterrupt) and _STATE["requested"]:
        return
    previous(unraisable)


@contextlib.contextmanager
def command():
    """Hold SIGINT and SIGTERM for a whole command-line command (see the module's docstring).

    Within it, guards keep the request when they end, so a command asks :func:`pending` after its
    fit. A signal the process was started ignoring (a shell's background job ignores SIGINT) stays
    ignored. Outside the main thread it does nothing.
    """
    if threading.current_thread() is not threading.main_thread() or _STATE["command"] or _STATE["depth"]:
        yield  # main() called within another command or a guard: the outer scope decides
        return
    _STATE.update(requested=False, agreed=False, signal=None, command=True)
    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(signum) is not signal.SIG_IGN:
            previous[signum] = signal.signal(signum, _command_handler)
    hook = sys.unraisablehook
    sys.unraisablehook = lambda unraisable: _quiet_unraisable(unraisable, hook)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        sys.unraisablehook = hook
        _STATE.update(requested=False, agreed=False, command=False)


@contextlib.contextmanager
def guard():
    """Route SIGINT to the stop flag for the duration of the block (re-entrant)."""
    main = threading.current_thread() is threading.main_thread()
    # Within a command() its handler serves, and a request made before the guard (while the command
    # loaded its data, say) must survive it: only a bare guard starts and ends with a clean flag.
    bare = _STATE["depth"] == 0 and not _STATE["command"]
    if bare:
        _STATE["requested"] = _STATE["agreed"] = False
    previous = None
    # A process started with SIGINT ignored (a shell's background job) keeps ignoring it.
    if main and bare and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        previous = signal.signal(signal.SIGINT, _handler)
    _STATE["depth"] += 1
    try:
        yield
    finally:
        _STATE["depth"] -= 1
        if bare:
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
