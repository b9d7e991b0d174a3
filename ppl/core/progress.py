"""Progress bars, updated once per chunk of steps (never a device sync per step).

Backends call :func:`task` around a unit of work and :func:`advance` with the number of steps done
since the last call. Inside a jitted loop, :func:`tick_every` sends one host callback per chunk;
the callback is a module-level function that reads the currently active bar, so a cached
executable from an earlier fit reports to the current bar.

Whether progress shows is the run's own setting, carried by its context (``Session.progress``,
from ``ppl.fit``'s ``progress_bar``) and handed to :func:`task` by the run loop; :func:`enable` sets
the process's default, which a run without a setting of its own follows (the command line sets it).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time

import jax
import jax.numpy as jnp

__all__ = ["enable", "enabled", "task", "advance", "tick_every"]

_STATE = {"enabled": None, "bar": None, "tasks": ()}
HEARTBEAT_S = 10.0  # seconds between plain progress lines


def enable(flag: bool | str | None = True) -> None:
    """Force progress bars on (True), off (False), or back to auto (None: on when stderr is a TTY).
    ``"lines"``: a plain line on stderr every ``HEARTBEAT_S`` seconds instead of bars (``ppl compare``,
    which prints its own log); ``"auto-lines"``: bars on a terminal, else those lines (``ppl fit``)."""
    _STATE["enabled"] = flag


def enabled() -> bool:
    return _mode() is not None


def _mode(flag: bool | str | None = None) -> str | None:
    """"bars", "lines" or None (silent) under ``flag``, or under the process's setting when None."""
    flag = _STATE["enabled"] if flag is None else flag
    if flag == "lines":
        return "lines"
    if flag == "auto-lines":
        return "bars" if sys.stderr.isatty() else "lines"
    on = sys.stderr.isatty() if flag is None else bool(flag)
    return "bars" if on else None


@contextlib.contextmanager
def task(description: str, total: int, *more: tuple[str, int], mode: bool | str | None = None):
    """Show progress while the block runs (a no-op when disabled): one bar for ``total`` steps, and
    one per extra ``(description, total)`` phase, e.g. warmup then sampling. Until the first chunk
    reports, the work is compiling (or running its first chunk), and the bar says so beside the time
    elapsed; as plain lines, every ``HEARTBEAT_S`` seconds. ``mode``: the run's own setting (as
    :func:`enable` takes it); None follows the process's setting."""
    phases = ((description, total), *more)
    mode = _mode(mode)
    if mode is None or all(t <= 0 for _, t in phases):
        yield
        return
    if mode == "lines":
        bar = _Lines(phases)
        with bar:
            previous = (_STATE["bar"], _STATE["tasks"])
            _STATE["bar"], _STATE["tasks"] = bar, tuple(range(len(phases)))
            try:
                yield
            finally:
                _STATE["bar"], _STATE["tasks"] = previous
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn
    from rich.text import Text

    first = []  # the first phase's task: the later ones wait for it rather than compile

    class Starting(ProgressColumn):
        def render(self, task):
            starting = first and task.id == first[0] and not task.completed and not task.finished
            return Text("compiling…" if starting else "", style="dim")

    # Bars go to stderr: stdout holds the results, and stays clean when redirected to a file.
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), Starting(),
        transient=False, console=Console(stderr=True),
    ) as bar:
        previous = (_STATE["bar"], _STATE["tasks"])
        _STATE["bar"] = bar
        _STATE["tasks"] = tuple(bar.add_task(d, total=t) for d, t in phases)
        first.append(_STATE["tasks"][0])
        try:
            yield
        finally:
            _STATE["bar"], _STATE["tasks"] = previous


class _Lines:
    """Progress as plain lines on stderr, for output that is not a terminal: a background thread
    writes one every ``HEARTBEAT_S`` seconds (nothing for work that ends sooner), with the phase, its
    count and the time elapsed, or "compiling" before the first chunk reports."""

    def __init__(self, phases):
        self.phases = [[description, int(total), 0] for description, total in phases]
        self.started = time.monotonic()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="ppl-progress", daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stopped.set()
        self.thread.join()

    def advance(self, task: int, steps: int) -> None:
        self.phases[task][2] += int(steps)

    def update(self, task: int, total: int) -> None:
        self.phases[task][1] = int(total)

    def line(self) -> str:
        elapsed = f"{time.monotonic() - self.started:.0f} s"
        if not any(done for _, _, done in self.phases):
            return f"  {self.phases[0][0]}: compiling, {elapsed}"
        description, total, done = next((p for p in self.phases if p[2] < p[1]), self.phases[-1])
        return f"  {description}: {min(done, total)}/{total}, {elapsed}"

    def _run(self) -> None:
        while not self.stopped.wait(HEARTBEAT_S):
            print(self.line(), file=sys.stderr, flush=True)


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
