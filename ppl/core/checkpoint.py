"""Checkpoints and resumption: what a method's chunk loop hands to disk and takes back.

A long loop (optimisation steps, MCMC steps) carries a state pytree between compiled chunks. A
:class:`ResumeState` is that state flattened to plain arrays, plus the loop's progress counters and
the results gathered so far. It is saved inside a run folder (``ppl.io.store``) and read back without
unpickling anything: the tree structure is rebuilt by the method itself from its own options, and
each stored leaf must match the rebuilt structure's shape and dtype.

A :class:`Session` is what ``ppl.fit`` gives a method besides the key and the Problem: the run's
context, passed down as a value (never read from module state) to every loop the method runs — how
often to checkpoint, where the checkpoint goes, the state to resume from, the devices the programs
run on, how progress is shown, and whether a stop was requested.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import jax
import numpy as np

from ppl.core import interrupt
from ppl.core.errors import ResumeError, RunError
from ppl.io.store import save_run

__all__ = ["ResumeState", "Session", "Interrupted", "restore_tree"]


class ResumeState(NamedTuple):
    """Everything a method needs to continue a run exactly where it stopped.

    kind: the loop that wrote it (``"optimize"``, ``"mcmc"``, or ``"chains"`` for the whitened
        SG-MCMC and Metropolis chains).
    progress: JSON-able counters (steps done, per chain).
    leaves: the carried state pytree's leaves (host arrays), in ``tree_flatten`` order.
    arrays: results gathered so far (losses, draws, per-step statistics), name -> array.
    """

    kind: str
    progress: dict
    leaves: list
    arrays: dict


def restore_tree(template, leaves: list, what: str):
    """``template``'s tree structure with ``leaves`` put back, after checking every leaf.

    ``template`` is a pytree of arrays or ``jax.ShapeDtypeStruct`` built by the method from its own
    options (never from the file), so a checkpoint can only fill in numbers, not choose structure.
    """
    expected, treedef = jax.tree_util.tree_flatten(template)
    if len(expected) != len(leaves):
        raise ResumeError(
            f"the checkpoint's {what} has {len(leaves)} arrays but this run's has {len(expected)}: it was "
            "written by another method, version or configuration; start afresh without resume"
        )
    restored = []
    for i, (want, got) in enumerate(zip(expected, leaves)):
        got = np.asarray(got)
        if tuple(got.shape) != tuple(np.shape(want)) or got.dtype != np.dtype(want.dtype):
            raise ResumeError(
                f"the checkpoint's {what} array {i} is {got.dtype}{list(got.shape)} but this run needs "
                f"{np.dtype(want.dtype)}{list(np.shape(want))} (another float precision, model size or option); "
                "resume with the settings that wrote it, or start afresh"
            )
        restored.append(got)
    return jax.tree_util.tree_unflatten(treedef, restored)


@dataclass
class Session:
    """The context of one ``ppl.fit`` call, which every method's loops receive as a value.

    ``checkpoint_every``: steps between checkpoints (None: never). ``write(posterior, state)`` persists
    a partial result (``posterior`` may be None when nothing is sampled yet). ``resume``: the state
    to continue from, or None. ``devices``: the devices the run's programs run on (None: all of
    ``jax.devices()``). ``progress``: how progress is shown (as ``ppl.fit``'s ``progress_bar``: True,
    False, ``"lines"``, ``"auto-lines"``; None: the process's setting). ``stop``: asked between
    chunks whether to stop (``ppl.fit``: whether Ctrl-C or SIGTERM arrived).
    """

    checkpoint_every: int | None = None
    write: Callable | None = None
    resume: ResumeState | None = None
    tag: dict = field(default_factory=dict)  # progress entries every state of this session carries
    # posterior -> the failed convergence checks that more draws could cure (None: a sampler never
    # extends its run); ppl.fit sets it, so that the methods need not know the diagnostics
    shortfall: Callable | None = None
    devices: tuple | None = None
    progress: bool | str | None = None
    stop: Callable[[], bool] = interrupt.requested
    _last: int = field(default=0, repr=False)

    def inner(self) -> "Session":
        """The context of a run inside the method (a Laplace fit's MAP, a mixture's members): the
        same devices, progress display and stop request, without checkpoints or a state to resume."""
        return Session(devices=self.devices, progress=self.progress, stop=self.stop)

    def resumed_phase(self) -> str | None:
        """The phase the state to resume from was written in (None: no state, or a one-phase method)."""
        return None if self.resume is None else self.resume.progress.get("phase")

    def phase(self, name: str, *, partial_results: bool = True, **note) -> "Session":
        """The session of one phase of a method that runs several loops in turn (SWAG: the MAP
        pre-training, then the SGD trajectory). Its states are tagged with the phase (and ``note``,
        JSON scalars the later phases need, such as the pre-training's verdict), and it resumes
        only a state of that phase. With ``partial_results=False`` its checkpoints hold the state
        alone: a pre-training's partial MAP is no result of the method."""
        resume = self.resume if self.resumed_phase() == name else None
        write = self.write
        if write is not None and not partial_results:
            def write(posterior, state, _write=self.write):
                _write(None, state)
        return Session(self.checkpoint_every, write, resume, {**self.tag, "phase": name, **note}, self.shortfall,
                       self.devices, self.progress, self.stop)

    def stamp(self, state: ResumeState) -> ResumeState:
        """``state`` with this session's tag in its progress."""
        return state if not self.tag else state._replace(progress={**state.progress, **self.tag})

    def resume_state(self, kind: str) -> ResumeState | None:
        if self.resume is None:
            return None
        if self.resume.kind != kind:
            raise ResumeError(
                f"the checkpoint holds a {self.resume.kind!r} loop's state but this method runs a {kind!r} loop"
            )
        return self.resume

    def start_count(self, steps_done: int) -> None:
        self._last = steps_done

    def maybe_checkpoint(self, steps_done: int, build: Callable) -> None:
        """Write a checkpoint when ``checkpoint_every`` steps passed since the last one.

        ``build()`` returns ``(partial posterior or None, ResumeState)``; it is called only when due.
        """
        if self.checkpoint_every is None or self.write is None:
            return
        if steps_done - self._last >= self.checkpoint_every:
            self._last = steps_done
            posterior, state = build()
            self.write(posterior, state)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped a run before it had a single draw or step to return.

    Nothing is lost: ``resume_state`` holds the run's state, ``save(path)`` writes it as a
    checkpoint folder, and ``ppl.fit(..., resume=path)`` (or ``ppl fit --resume DIR``) continues it.
    Uncaught, it behaves as any Ctrl-C.
    """

    def __init__(self, message: str, resume_state: ResumeState):
        super().__init__(message)
        self.resume_state = resume_state
        self.fingerprint = None

    def save(self, path) -> None:
        if self.resume_state is None:
            raise RunError(f"nothing to save: {self} — this method keeps no state to resume from; run it again")

        save_run(path, None, resume_state=self.resume_state, fingerprint=self.fingerprint, status="interrupted")
