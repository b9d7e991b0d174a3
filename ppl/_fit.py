"""``ppl.fit``: validate, compile the Problem once, hand it to the registered method."""

from __future__ import annotations

import time

from ppl._posterior import as_key, seed_record
from ppl._problem import compile_problem

__all__ = ["fit"]


def fit(model, data, method: str = "nuts", *, seed, temperature: float = 1.0, tempering: str = "likelihood", **options):
    """Fit ``model`` to ``data`` with the registered ``method``; returns a :class:`ppl.Posterior`.

    Args:
        model: a declarative model from ``ppl.models`` or any NumPyro model function.
        data: ``(X, y)`` for supervised models; a dict of keyword arguments for a plain NumPyro
            function. Validated on the host before anything is traced.
        method: a registry name (``ppl methods`` lists them with their options).
        seed: an int or a JAX PRNG key. Same seed, same result, bit for bit on one machine.
        temperature, tempering: ``"likelihood"`` multiplies the log likelihood by 1/T (tempered
            posterior); ``"cold"`` multiplies the whole log joint by 1/T (p(θ|D)^(1/T)).
        **options: the method's options (unknown ones raise an error listing the valid ones).

    >>> import ppl
    >>> from ppl.models import LinearRegression
    >>> data = ppl.datasets.load("linear", seed=0)
    >>> post = ppl.fit(LinearRegression(noise_scale=0.5), data.train, method="exact", seed=0)
    >>> post.diagnostics().log_evidence < 0
    True
    """
    from ppl.inference import registry

    key = as_key(seed)
    method_obj = registry.create(method, options)
    problem = compile_problem(model, data, temperature=temperature, tempering=tempering)
    method_obj.check(problem)
    start = time.perf_counter()
    posterior = method_obj.run(key, problem)
    posterior.wall_time_s = time.perf_counter() - start
    posterior.seed = seed_record(seed)
    posterior.options = method_obj.as_dict()
    posterior.info.setdefault("temperature", float(temperature))
    posterior.info.setdefault("tempering", tempering)
    return posterior
