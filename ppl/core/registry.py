"""The method registry: a plain dict from name to ``"module:Class"``, resolved lazily.

Adding a method is one file in ``inference/`` and one line here; the conformance test in
``tests/test_conformance.py`` is parametrised over this table and enrols it automatically.
"""

from __future__ import annotations

import importlib

from ppl.core.errors import OptionError, did_you_mean
from ppl.core.method import check_option_types

__all__ = ["METHODS", "get", "create", "describe"]

METHODS = {
    "exact": "ppl.inference.exact:Exact",
    "map": "ppl.inference.map:MAP",
    "nuts": "ppl.inference.mcmc:NUTS",
    "hmc": "ppl.inference.mcmc:HMC",
    "svi": "ppl.inference.svi:SVI",
    "ivon": "ppl.inference.ivon:IVON",
    "laplace": "ppl.inference.laplace:Laplace",
    "mola": "ppl.inference.mola:MoLA",
    "ensemble": "ppl.inference.ensemble:Ensemble",
    "batch_ensemble": "ppl.inference.batch_ensemble:BatchEnsemble",
    "swag": "ppl.inference.swag:SWAG",
    "multiswag": "ppl.inference.swag:MultiSWAG",
    "sgld": "ppl.inference.sgmcmc:SGLD",
    "sghmc": "ppl.inference.sgmcmc:SGHMC",
    "cyclical_sgld": "ppl.inference.sgmcmc:CyclicalSGLD",
    "mh": "ppl.inference.mh:MH",
}


def get(name: str):
    """The method class registered as ``name``."""
    if name not in METHODS:
        raise OptionError(f"unknown method {name!r}{did_you_mean(name, METHODS)}; valid methods: {', '.join(sorted(METHODS))}")
    module, cls = METHODS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def create(name: str, options: dict):
    """Instantiate method ``name`` with ``options``; unknown options are listed with the valid ones."""
    cls = get(name)
    valid = cls.option_defaults()
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise OptionError(
            f"method {name!r} has no option(s) {', '.join(map(repr, unknown))}"
            f"{''.join(did_you_mean(k, valid) for k in unknown)}; valid options: "
            + ", ".join(f"{k}={v!r}" for k, v in valid.items())
        )

    method = cls(**options)
    # Also here, so a method whose __post_init__ forgets super() still gets its options checked.
    check_option_types(method)
    return method


def describe() -> list[tuple[str, str, dict]]:
    """(name, one-line description, options with defaults) for every registered method."""
    return [(name, get(name).description, get(name).option_defaults()) for name in METHODS]
