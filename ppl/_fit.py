"""``ppl.fit``: validate, compile the Problem once, hand it to the registered method."""

from __future__ import annotations

import dataclasses
import os
import time
import warnings

import jax
import numpy as np

from ppl.core import devices as _devices, registry
from ppl.core import interrupt
from ppl.core.checkpoint import Interrupted, Session
from ppl.core.data import validate_supervised
from ppl.core.errors import NonFiniteError, OptionError, ResumeError
from ppl.core.keys import as_key, derived_key, seed_record
from ppl.core.method import check_stored_draws
from ppl.core.posterior import Posterior
from ppl.core.problem import compile_problem
from ppl.core.records import RunRecord
from ppl.diagnostics.report import convergence_shortfall
from ppl.io import load, store
from ppl.models import SupervisedModel

__all__ = ["fit", "fingerprint_of"]


def fit(
    model,
    data=None,
    method: str = "nuts",
    *,
    seed,
    temperature: float = 1.0,
    tempering: str = "likelihood",
    function_sites=None,
    checkpoint=None,
    checkpoint_every: int | None = None,
    resume=None,
    progress_bar: bool | None = None,
    devices=None,
    validation: float | None = None,
    **options,
):
    """Fit ``model`` to ``data`` with the registered ``method``; returns a :class:`ppl.Posterior`.

    Args:
        model: a declarative model from ``ppl.models`` or any NumPyro model function.
        data: ``(X, y)`` for supervised models; ``X`` alone for a VAE; a dict of keyword arguments
            for a plain NumPyro function (None: it takes none). Validated on the host before anything
            is traced.
        method: a registry name (``ppl methods`` lists them with their options).
        seed: an int in [0, 2**32) or a JAX PRNG key. Same seed, same result, bit for bit on one machine.
        temperature, tempering: ``"likelihood"`` multiplies the log likelihood by 1/T (tempered
            posterior); ``"cold"`` multiplies the whole log joint by 1/T (p(θ|D)^(1/T)).
        function_sites: for a plain NumPyro program, names of ``numpyro.deterministic`` sites that
            hold its function (a hand-written network's outputs, e.g. ``("f",)``). The diagnostics
            then judge convergence in function space, by ``rhat_function_max`` on their draws, as for
            a declarative network with hidden layers; without them a program gets weight-space
            R-hat only. Changes the diagnostics, never the draws.
        checkpoint, checkpoint_every: write the run's state to folder ``checkpoint`` every
            ``checkpoint_every`` steps (optimisation steps, or MCMC steps of all chains together),
            as a loadable partial run.
        resume: a checkpoint folder (or a partial ``Posterior``, or a caught ``ppl.Interrupted``) to
            continue from. It must come from the same model, data, method, options, seed and
            temperature; anything else is refused, naming what differs. The resumed run equals the
            uninterrupted one bit for bit on the same machine.
        progress_bar: show progress bars (True), hide them (False), or show them when stderr is a
            terminal (None), as NumPyro's ``progress_bar``.
        devices: the devices to run on: a number N (the first N of ``jax.devices()``), a list of
            ``jax.Device``, or None for all of them (one, on a plain CPU machine). Chains and
            ensemble members are split over them; a single run's minibatch rows and particles are
            partitioned over them, its gradient summed across them. The result equals the
            one-device run up to floating-point rounding; a run may be resumed on other devices.
        validation: a share of the training rows (0 < f ≤ 0.5) to hold out, chosen at random from
            ``seed``: the method fits the rest, and the diagnostics check the predictive on the rows
            held out (better than a trivial baseline, honest 90% intervals; see
            :meth:`Posterior.with_heldout`). Declarative supervised models only.
        **options: the method's options (unknown ones raise an error listing the valid ones).

    Ctrl-C stops a running method at its next chunk of steps (within about a second) and returns a
    partial result marked interrupted (``posterior.status.interrupted``) that ``resume=`` continues; before
    anything was sampled it raises :class:`ppl.Interrupted`, which holds the state to resume.

    >>> import ppl
    >>> from ppl.models import LinearRegression
    >>> data = ppl.datasets.load("linear", seed=0)
    >>> post = ppl.fit(LinearRegression(noise_scale=0.5), data.train, method="exact", seed=0)
    >>> post.diagnostics().log_evidence < 0
    True
    """
    if progress_bar is not None and not isinstance(progress_bar, bool):
        raise OptionError(f"progress_bar must be True, False or None (bars when stderr is a terminal), got {progress_bar!r}")
    key = as_key(seed)
    chosen = _devices.resolve(devices)
    method_obj = registry.create(method, options)
    if checkpoint_every is not None:
        if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, (int, np.integer)) or checkpoint_every < 1:
            raise OptionError(f"checkpoint_every must be a positive integer (steps), got {checkpoint_every!r}")
        if checkpoint is None:
            raise OptionError("checkpoint_every needs checkpoint=<folder> to write to")
    if checkpoint is not None:
        if not isinstance(checkpoint, store.RunTarget):
            checkpoint = store.RunTarget(checkpoint, {})
        store.check_writable_run(checkpoint.path)
    heldout = None
    if validation is not None:
        data, heldout = _split_validation(model, data, validation, seed)
    _warn_if_labels_fit_as_numbers(model, data)
    problem = compile_problem(model, data, temperature=temperature, tempering=tempering, function_sites=function_sites)
    if problem.local_sites and not method_obj.supports_local:
        raise OptionError(
            f"method {method!r} cannot serve this model as a whole: it has {problem.num_data} × "
            f"{problem.num_local} local latents ({', '.join(s.name for s in problem.local_sites)}), which only "
            "method='svi' amortises. To fit the exact local posterior p(z | x) of chosen data points with the "
            f"decoder fixed, fit svi first and then ppl.fit(post.local_model(X[:20]), method={method!r}, seed=0)"
        )
    # Every method's stored draws are checked here, before anything is compiled or allocated.
    check_stored_draws(
        method, method_obj.stored_draws(), problem.num_params, problem.init_params.dtype.itemsize,
        num_deterministic=sum(site.size for site in problem.deterministic_sites),
    )
    method_obj.check(problem)
    print_seed = seed_record(seed)
    fingerprint = store.fingerprint(problem, method_obj, print_seed)
    # the run's context, passed to the method as a value: what it checkpoints and resumes, the
    # devices its programs run on, how progress shows, and the stop request (Ctrl-C, SIGTERM)
    session = Session(shortfall=_convergence_shortfall, devices=chosen, progress=progress_bar)
    if not method_obj.resumable and (resume is not None or checkpoint_every is not None):
        raise OptionError(f"method {method!r} computes its result in one step: there is nothing to checkpoint or resume")
    if resume is not None:
        session.resume = _resume_state(resume, fingerprint)

    def recorded(posterior, elapsed):
        """The method's result with the run record (and the held-out rows) passed to it."""
        provenance = store.provenance(problem, posterior.problem, method_obj)
        if heldout is not None:
            provenance["validation"] = {"fraction": float(validation), "rows": int(len(heldout[0]))}
        posterior = posterior.replace(record=RunRecord(
            seed=print_seed, options=method_obj.as_dict(), wall_time_s=elapsed, fingerprint=fingerprint,
            provenance=provenance, devices=len(chosen),
        ))
        return posterior if heldout is None else posterior.with_heldout(*heldout)

    start = time.perf_counter()
    if checkpoint_every is not None:
        session.checkpoint_every = int(checkpoint_every)

        def write(posterior, state):
            if posterior is not None:
                posterior = recorded(posterior, time.perf_counter() - start)
            store.save_run(
                checkpoint.path, posterior, resume_state=state, fingerprint=fingerprint, status="checkpoint",
                extra_files=checkpoint.extra_files,
            )

        session.write = write
    # Compiling the problem takes seconds, during which the command line's Ctrl-C (or SIGTERM) only
    # set the flag: stop before the method starts rather than at its first chunk.
    interrupt.raise_pending()
    try:
        # The guard covers the whole run, not only its loop: a Ctrl-C while the result is being
        # assembled stops nothing and loses nothing.
        with interrupt.guard():
            posterior = method_obj.run(key, problem, session)
    except Interrupted as error:
        error.fingerprint = fingerprint
        raise
    except NonFiniteError as error:
        if error.partial is not None:
            error.partial = recorded(error.partial, time.perf_counter() - start)
        raise
    return recorded(posterior, time.perf_counter() - start)


def _convergence_shortfall(posterior) -> list:
    """What a sampler asks before extending its run (see ``ppl.core.extend``)."""
    return convergence_shortfall(posterior)


VALIDATION_STREAM = 2  # the random stream (split from the seed) that picks the held-out rows


MAX_LABELS = 10  # integer targets 0..K−1 with K up to this look like class labels


def _warn_if_labels_fit_as_numbers(model, data) -> None:
    """Warn when a regression likelihood is about to fit what look like class labels: integer (or
    boolean) targets that are exactly 0, 1, …, K − 1. ``BNN()``'s default likelihood is Gaussian, so
    ``ppl.fit(BNN(), two_moons.train)`` would otherwise fit a regression to the labels in silence
    (the command line picks the likelihood from the data; Python takes the model as declared)."""
    if getattr(model, "likelihood", None) != "gaussian" or not isinstance(data, (tuple, list)) or len(data) != 2:
        return
    y = np.asarray(data[1]) if data[1] is not None else None
    if y is None or y.ndim != 1 or y.dtype.kind not in "biu":
        return
    values = np.unique(y)
    if 2 <= values.size <= MAX_LABELS and np.array_equal(values, np.arange(values.size)):
        classes = "two classes: likelihood='bernoulli'" if values.size == 2 else "likelihood='categorical'"
        warnings.warn(
            f"the targets y are the integers 0..{values.size - 1}, which look like class labels, but "
            f"{type(model).__name__}'s likelihood is 'gaussian': they will be fitted as real numbers (regression). "
            f"For classification declare {classes}; for integer-valued regression pass y as floats to silence this",
            UserWarning, stacklevel=3,
        )


def _split_validation(model, data, fraction, seed) -> tuple:
    """(training rows, held-out rows): ``fraction`` of the rows of ``data`` held out at random."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float, np.floating)) or not 0 < fraction <= 0.5:
        raise OptionError(f"validation must be a share of the training rows in (0, 0.5], e.g. 0.1; got {fraction!r}")
    if not isinstance(model, SupervisedModel):
        raise OptionError(
            "validation= holds out rows of (X, y) for a supervised model from ppl.models; for a plain NumPyro program "
            "split the data yourself and score the held-out part with numpyro.infer.Predictive"
        )
    X, y = validate_supervised(model, data)
    if y is None:
        raise OptionError("validation= needs targets: pass data=(X, y)")
    n = len(X)
    held = int(round(float(fraction) * n))
    if held < 1 or n - held < 2:
        raise OptionError(
            f"validation={fraction} of {n} rows holds out {held} and fits {n - held}: it needs at least one held-out "
            "row and two to fit — give more data or a different share"
        )

    order = np.asarray(jax.random.permutation(derived_key(seed, VALIDATION_STREAM), n))
    keep, out = np.sort(order[held:]), np.sort(order[:held])
    return (X[keep], y[keep]), (X[out], y[out])


def _resume_state(resume, fingerprint: dict):
    """The ResumeState in ``resume`` after checking that it belongs to this run."""
    if isinstance(resume, Interrupted):
        state, theirs = resume.resume_state, resume.fingerprint
    elif isinstance(resume, Posterior):
        state, theirs = resume.resume_state, resume.fingerprint
    elif isinstance(resume, (str, os.PathLike)):
        _, state, meta = load.load_run(resume)
        theirs = meta.get("fingerprint")
    else:
        raise OptionError(
            f"resume= takes a run folder, a partial Posterior or a caught ppl.Interrupted, got {type(resume).__name__}"
        )
    if state is None:
        raise ResumeError(f"{resume!r} holds no state to resume: the run it records already finished")
    if theirs is None:
        raise ResumeError(f"{resume!r} does not record which run wrote it, so it cannot be checked; start afresh")
    differences = _differences(theirs, store.unjson(fingerprint))
    if differences:
        raise ResumeError(
            "the checkpoint belongs to another run — " + "; ".join(differences)
            + " — resume with the same model, data, method, options, seed and temperature, or start afresh"
        )
    return state


def _differences(saved: dict, now: dict, prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(saved) | set(now)):
        a, b = saved.get(key), now.get(key)
        name = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            out.extend(_differences(a, b, f"{name}."))
        elif a != b:
            if key == "data_sha256":
                out.append("the training data differ (another dataset, split, order or float precision)")
            else:
                out.append(f"{name}: checkpoint {a!r}, now {b!r}")
    return out


def fingerprint_of(model, data, method: str, *, seed, temperature: float = 1.0, tempering: str = "likelihood",
                   function_sites=None, **options) -> dict:
    """What a fit of these arguments records as its identity (``Posterior.fingerprint``), without running it.

    A saved run whose fingerprint equals this one is that fit: ``ppl.compare(..., fits=)`` reuses it.
    """
    method_obj = registry.create(method, options)
    problem = compile_problem(model, data, temperature=temperature, tempering=tempering, function_sites=function_sites)
    return store.unjson(store.fingerprint(problem, method_obj, seed_record(seed)))


def method_options(method: str) -> tuple[str, ...]:
    """The option names that the registered ``method`` takes (an unknown name: the registry's error)."""
    return tuple(f.name for f in dataclasses.fields(registry.get(method)))


def differences(saved: dict, now: dict) -> list[str]:
    """What differs between two fingerprints, in words (empty when they describe the same fit)."""
    return _differences(saved, now)
