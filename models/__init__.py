"""Generative programs: declarative models and their priors.

Every model here is a frozen dataclass and a plain NumPyro model ``model(X, y=None)``.
"""

from __future__ import annotations

from ppl.models import priors
from ppl.models._base import Layer, SupervisedModel
from ppl.models.bnn import BNN
from ppl.models.regression import LinearRegression, LogisticRegression

__all__ = ["BNN", "LinearRegression", "LogisticRegression", "Layer", "SupervisedModel", "priors", "from_config"]

_CLASSES = {cls.__name__: cls for cls in (BNN, LinearRegression, LogisticRegression)}


def from_config(config: dict):
    """Rebuild a declarative model from ``model.to_config()``."""
    try:
        cls = _CLASSES[config["class"]]
    except KeyError:
        raise ValueError(f"unknown model class in config: {config.get('class')!r}; known: {sorted(_CLASSES)}") from None
    fields = dict(config["fields"])
    for name, value in fields.items():
        if isinstance(value, dict) and "prior" in value:
            value = dict(value)
            prior_cls = getattr(priors, value.pop("prior"))
            fields[name] = prior_cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in value.items()})
        elif isinstance(value, list):
            fields[name] = tuple(value)
    return cls(**fields)
