"""Strict JAX for every test: float64, rank promotion raises; warnings are errors (pyproject)."""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("MPLBACKEND", "Agg")

import warnings  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

# ArviZ writes a once-a-day stamp file when first imported on a new day, through one fixed temporary
# name: two xdist workers importing it at the same moment race on that file and one fails to
# collect its module (seen on 2026-12-06: FileNotFoundError on daily_warning.tmp). The controller
# loads this file before it starts the workers, so importing ArviZ here writes the stamp once and
# the workers only read it.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", FutureWarning)
    import arviz  # noqa: E402, F401

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")

import ppl  # noqa: E402
from ppl.core.cache import CACHE_ENV, release_compiled  # noqa: E402
from ppl.models import LinearRegression  # noqa: E402

# One persistent compilation cache for the whole suite: the xdist workers, the command-line runs in
# subprocesses, the programs rebuilt after each module's clear_caches below and the slow tier after
# the default one all load what another already compiled (measured: test_posterior and test_laplace
# in 138 s without the cache, 136 s filling it, 55 s from it). It lives outside the repository,
# where a later run on the same machine finds it; JAX keys each program by its text, options and
# version, so an entry from older code is never used, only evicted.
_TEST_CACHE = os.environ.get("PPL_TEST_COMPILATION_CACHE") or os.path.join(
    tempfile.gettempdir(), f"ppl-tests-jax-cache-{os.getuid() if hasattr(os, 'getuid') else 'user'}")
os.environ[CACHE_ENV] = _TEST_CACHE
ppl.use_compilation_cache(_TEST_CACHE, max_bytes=4 * 1024**3)

NOISE = 0.5
PRIOR = 1.0


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drop JAX's compiled programs after each test module.

    Every compiled XLA:CPU program keeps memory mappings alive; the whole suite compiles thousands
    of them in one process and, without this, reached Linux's default limit of 65,530 mappings per
    process (measured: 54,500 by two thirds of the run), after which the compiler's next mmap fails
    and the process dies with a segmentation fault. A module's programs are not needed by the next.
    """
    yield
    release_compiled()


def closed_form(X, y, prior_scale=PRIOR, noise_scale=NOISE, temperature=1.0, tempering="likelihood"):
    """Exact posterior of LinearRegression (bias last), in closed form (Bishop 2006 §3.3, §3.5), and log evidence."""
    n, d = X.shape
    A = np.hstack([X, np.ones((n, 1))])
    lik = 1.0 / temperature
    prior = 1.0 / temperature if tempering == "cold" else 1.0
    precision = prior * np.eye(d + 1) / prior_scale**2 + lik * A.T @ A / noise_scale**2
    cov = np.linalg.inv(precision)
    mean = cov @ (lik * A.T @ y / noise_scale**2)
    # Untempered log evidence: y ~ N(0, σ²I + s² A Aᵀ).
    K = noise_scale**2 * np.eye(n) + prior_scale**2 * A @ A.T
    sign, logdet = np.linalg.slogdet(K)
    log_evidence = -0.5 * (y @ np.linalg.solve(K, y) + logdet + n * np.log(2 * np.pi))
    return {"mean": mean, "cov": cov, "precision": precision, "log_evidence": log_evidence}


def flat_params(draws):
    """(chain, draw, D+1) array of w then b, matching closed_form's ordering."""
    return np.concatenate([draws["w"], draws["b"][..., None]], axis=-1)


@pytest.fixture(scope="session")
def linear_data():
    return ppl.datasets.load("linear", seed=0)


@pytest.fixture(scope="session")
def linear_model():
    return LinearRegression(prior_scale=PRIOR, noise_scale=NOISE)


@pytest.fixture(scope="session")
def linear_truth(linear_data):
    X, y = linear_data.train
    return closed_form(np.asarray(X), np.asarray(y, dtype=float))


@pytest.fixture
def load_example():
    """load_example(name) -> the module ``examples.<name>`` (the examples folder is not part of the
    installed package; it is imported from the repository root, as ``python -m examples.NAME`` runs it)."""
    import importlib
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)
    return lambda name: importlib.import_module(f"examples.{name}")
