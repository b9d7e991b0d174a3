"""Progress bars, updated once per chunk of steps (never a device sync per step).

Backends call :func:`task` around a unit of work and :func:`advance` with the number of steps done
since the last call. Inside a jitted loop, :func:`tick_every` sends one host callback per chunk;
the callback is a module-level function that reads the currently active bar, so a cached
executable from an earlier fit reports to the current bar.
"""

from __future__ import annotations

import contextlib
import sys

import jax
import jax.numpy as jnp

__all__ = ["enable", "enabled", "task", "advance", "tick_every"]

_STATE = {"enabled": None, "bar": None, "tasks": ()}


def enable(flag: bool | None = True) -> None:
    """Force progress bars on (True), off (False), or back to auto (None: on when stderr is a TTY)."""
    _STATE["enabled"] = flag


@contextlib.contextmanager
def setting(flag: bool | None):
    """Within the block, progress bars follow ``flag`` (None: leave the current setting)."""
    if flag is None:
        yield
        return
    before = _STATE["enabled"]
    _STATE["enabled"] = flag
    try:
        yield
    finally:
        _STATE["enabled"] = before


def enabled() -> bool:
    flag = _STATE["enabled"]
    return sys.stderr.isatty() if flag is None else bool(flag)


@contextlib.contextmanager
def task(description: str, total: int, *more: tuple[str, int]):
    """Show bars while the block runs (a no-op when disabled): one for ``total`` steps, and one per
    extra ``(description, total)`` phase, e.g. warmup then sampling."""
    phases = ((description, total), *more)
    if not enabled() or all(t <= 0 for _, t in phases):
        yield
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    # Bars go to stderr: stdout holds the results, and stays clean when redirected to a file.
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), transient=False,
        console=Console(stderr=True),
    ) as bar:
        previous = (_STATE["bar"], _STATE["tasks"])
        _STATE["bar"] = bar
        _STATE["tasks"] = tuple(bar.add_task(d, total=t) for d, t in phases)
        try:
            yield
        finally:
            _STATE["bar"], _STATE["tasks"] = previous


def advance(steps: int, phase: int = 0) -> None:
    bar = _STATE["bar"]
    if bar is not None:
        bar.advance(_STATE["tasks"][phase], int(steps))


def extend(total: int, phase: int = 0) -> None:
    """Raise bar ``phase``'s total to ``total`` steps (a run that continues past its planned length)."""
    bar = _STATE["bar"]
    if bar is not None:
        bar.update(_STATE["tasks"][phase], total=int(total))


def _host_tick(steps, phase) -> None:
    advance(int(steps), int(phase))


def tick_every(step: jax.Array, chunk: int, total: int, phase: int = 0) -> None:
    """From inside a jitted loop of ``total`` steps: advance bar ``phase`` by ``chunk`` every
    ``chunk``-th step (0-based ``step``), and by the remainder at the last step."""
    remainder = total % chunk
    done = (step + 1) % chunk == 0
    last = (step == total - 1) & (remainder != 0)
    jax.lax.cond(
        done | last,
        lambda: jax.debug.callback(_host_tick, jnp.where(done, chunk, remainder), jnp.asarray(phase)),
        lambda: None,
    )
