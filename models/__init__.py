"""Generative programs: declarative models and their priors.

Every model here is a frozen dataclass and a plain NumPyro model ``model(X, y=None)``.
"""

from __future__ import annotations

import dataclasses

from ppl.models import priors
from ppl.models._base import Layer, SupervisedModel
from ppl.models.bnn import BNN
from ppl.models.cnn import CNN
from ppl.models.network import Network
from ppl.models.regression import LinearRegression, LogisticRegression
from ppl.models.vae import VAE

__all__ = ["BNN", "CNN", "Network", "VAE", "LinearRegression", "LogisticRegression", "Layer", "SupervisedModel", "priors", "from_config"]

_CLASSES = {cls.__name__: cls for cls in (BNN, LinearRegression, LogisticRegression, VAE)}


def from_config(config: dict):
    """Rebuild a declarative model from ``model.to_config()``.

    Only the classes above can be named, only their declared fields are accepted, and every value
    goes through the class's own validation: a configuration read from disk cannot reach anything else.
    """
    if not isinstance(config, dict) or not isinstance(config.get("fields"), dict):
        raise ValueError("a model configuration must be an object with 'class' and 'fields'")
    if config.get("class") == "Network":
        raise ValueError(
            "a Network's apply_fn is code, which ppl never rebuilds from files; a saved Network run keeps its "
            "record but cannot be re-attached — refit the model in the session that defines apply_fn"
        )
    cls = _CLASSES.get(config.get("class")) if isinstance(config.get("class"), str) else None
    if cls is None:
        raise ValueError(f"unknown model class in config: {config.get('class')!r}; known: {sorted(_CLASSES)}")
    allowed = {f.name for f in dataclasses.fields(cls)}
    fields = dict(config["fields"])
    unknown = sorted(set(fields) - allowed)
    if unknown:
        raise ValueError(f"{cls.__name__} has no field(s) {unknown}")
    for name, value in fields.items():
        if isinstance(value, dict):
            if name != "prior":
                raise ValueError(f"field {name!r}: {value!r} is an object, and only the field 'prior' takes one")
            fields[name] = priors.prior_from_record(value)
        elif isinstance(value, list):
            fields[name] = tuple(value)
    return cls(**fields)
