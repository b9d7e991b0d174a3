"""Weight priors for the declarative models.

Each prior turns one weight or bias site into a NumPyro distribution. The object is a frozen
dataclass, so a model that holds it stays hashable (jit caches key on it).

>>> from ppl.models import BNN
>>> from ppl.models.priors import FanIn
>>> model = BNN(hidden=(32,), likelihood="bernoulli", prior=FanIn(scale=1.0))
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpyro.distributions as dist

__all__ = ["Prior", "Isotropic", "PerLayer", "FanIn", "ScaleMixture", "ByName"]


class Prior:
    """Base class: ``distribution(layer, kind, shape, fan_in, name)`` for one site.

    ``layer`` counts dense layers (a Network's parameter groups) from the input (0, 1, ...),
    ``kind`` is ``"weight"`` or ``"bias"``, ``shape`` the site's shape, ``fan_in`` the layer's
    number of inputs and ``name`` the site's name (``w0``, ``conv_1.kernel``).
    """

    def distribution(self, layer: int, kind: str, shape: tuple, fan_in: int, name: str = "") -> dist.Distribution:
        raise NotImplementedError

    @property
    def gaussian(self) -> bool:
        """Whether every site gets a zero-mean Gaussian (what Laplace's closed forms need)."""
        return True

    def components(self) -> tuple:
        """The priors that actually give sites their distributions (itself, or a ByName's rules')."""
        return (self,)

    def _normal(self, scale: float, shape: tuple) -> dist.Distribution:
        return dist.Normal(jnp.zeros(shape), scale).to_event(len(shape))


def _check_positive(name: str, value: float) -> None:
    if isinstance(value, bool) or not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")


@dataclass(frozen=True)
class Isotropic(Prior):
    """Every weight and bias ~ N(0, scale²)."""

    scale: float = 1.0

    def __post_init__(self):
        _check_positive("Isotropic.scale", self.scale)

    def distribution(self, layer, kind, shape, fan_in, name=""):
        return self._normal(self.scale, shape)


@dataclass(frozen=True)
class PerLayer(Prior):
    """Layer ``i`` gets N(0, scales[i]²) on its weights and biases (one scale per dense layer)."""

    scales: tuple = (1.0,)

    def __post_init__(self):
        if isinstance(self.scales, (str, bytes)) or not isinstance(self.scales, (tuple, list)):
            raise ValueError(f"PerLayer.scales must be a tuple of positive numbers, one per layer; got {self.scales!r}")
        for i, s in enumerate(self.scales):
            _check_positive(f"PerLayer.scales[{i}]", s)
        object.__setattr__(self, "scales", tuple(float(s) for s in self.scales))
        for i, s in enumerate(self.scales):
            _check_positive(f"PerLayer.scales[{i}]", s)

    def distribution(self, layer, kind, shape, fan_in, name=""):
        if layer >= len(self.scales):
            raise ValueError(
                f"PerLayer has {len(self.scales)} scales but the network has a layer {layer}; "
                "give one scale per dense layer (hidden layers + output)"
            )
        return self._normal(self.scales[layer], shape)


@dataclass(frozen=True)
class FanIn(Prior):
    """Weights ~ N(0, scale²/fan_in) (variance-preserving, Neal 1996); biases ~ N(0, bias_scale²)."""

    scale: float = 1.0
    bias_scale: float = 1.0

    def __post_init__(self):
        _check_positive("FanIn.scale", self.scale)
        _check_positive("FanIn.bias_scale", self.bias_scale)

    def distribution(self, layer, kind, shape, fan_in, name=""):
        if kind == "bias":
            return self._normal(self.bias_scale, shape)
        return self._normal(self.scale / math.sqrt(fan_in), shape)


@dataclass(frozen=True)
class ScaleMixture(Prior):
    """Each weight ~ π N(0, scale1²) + (1 − π) N(0, scale2²) (Blundell et al. 2015)."""

    pi: float = 0.5
    scale1: float = 1.0
    scale2: float = 0.0025

    def __post_init__(self):
        if not 0.0 < self.pi < 1.0:
            raise ValueError(f"ScaleMixture.pi must lie in (0, 1), got {self.pi!r}")
        _check_positive("ScaleMixture.scale1", self.scale1)
        _check_positive("ScaleMixture.scale2", self.scale2)

    def distribution(self, layer, kind, shape, fan_in, name=""):
        return _ScaleMixtureNormal(self.pi, self.scale1, self.scale2, shape).to_event(len(shape))

    @property
    def gaussian(self) -> bool:
        return False


@dataclass(frozen=True)
class ByName(Prior):
    """Priors chosen by site name: each site gets the prior of the first rule whose shell-style
    pattern (``fnmatch``: ``conv_*``, ``out.*``, ``w?``) matches its name, and ``default`` when none
    does. A pattern that matches no site of the model is refused when the model is built.

    >>> from ppl.models.priors import ByName, FanIn, Isotropic
    >>> prior = ByName(rules=(("conv_*", FanIn()), ("out.*", Isotropic(0.5))), default=Isotropic(1.0))
    """

    rules: tuple = ()
    default: Prior = Isotropic(1.0)

    def __post_init__(self):
        rules = []
        for i, rule in enumerate(self.rules if isinstance(self.rules, (tuple, list)) else [self.rules]):
            if not (isinstance(rule, (tuple, list)) and len(rule) == 2 and isinstance(rule[0], str) and rule[0]):
                raise ValueError(f"ByName.rules[{i}] must be a (pattern, prior) pair with a non-empty pattern, got {rule!r}")
            pattern, prior = rule
            if not isinstance(prior, Prior) or isinstance(prior, ByName):
                raise ValueError(
                    f"ByName.rules[{i}] ({pattern!r}): the prior must be Isotropic, PerLayer, FanIn or ScaleMixture, "
                    f"got {type(prior).__name__}"
                )
            rules.append((pattern, prior))
        if not isinstance(self.default, Prior) or isinstance(self.default, ByName):
            raise ValueError(f"ByName.default must be Isotropic, PerLayer, FanIn or ScaleMixture, got {self.default!r}")
        object.__setattr__(self, "rules", tuple(rules))

    def choose(self, name: str) -> Prior:
        for pattern, prior in self.rules:
            if fnmatch.fnmatchcase(name, pattern):
                return prior
        return self.default

    def distribution(self, layer, kind, shape, fan_in, name=""):
        return self.choose(name).distribution(layer, kind, shape, fan_in, name)

    @property
    def gaussian(self) -> bool:
        return all(prior.gaussian for prior in self.components())

    def components(self) -> tuple:
        return tuple(prior for _, prior in self.rules) + (self.default,)

    def check_names(self, names, model: str) -> None:
        """Refuse a rule that matches none of ``names`` (a typo would otherwise go unnoticed)."""
        for pattern, _ in self.rules:
            if not any(fnmatch.fnmatchcase(name, pattern) for name in names):
                raise ValueError(
                    f"ByName rule {pattern!r} matches no site of the {model}; its sites are {', '.join(names)}"
                )

    def record(self) -> dict:
        """Plain JSON-able form (``ppl.models.from_config`` rebuilds it)."""
        return {"prior": "ByName", "rules": [[pattern, prior_record(prior)] for pattern, prior in self.rules],
                "default": prior_record(self.default)}


def prior_record(prior: Prior) -> dict:
    """A prior as plain JSON-able data: its class name and fields."""
    if isinstance(prior, ByName):
        return prior.record()
    return {"prior": type(prior).__name__,
            **{k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(prior).items()}}


def prior_from_record(record, nested: bool = False) -> Prior:
    """Rebuild a prior from :func:`prior_record`'s form; only the classes here can be named, and
    every value goes through the class's own validation."""
    classes = {cls.__name__: cls for cls in (Isotropic, PerLayer, FanIn, ScaleMixture)}
    if not isinstance(record, dict):
        raise ValueError(f"a prior record must be an object, got {type(record).__name__}")
    record = dict(record)
    name = record.pop("prior", None)
    if name == "ByName" and not nested:
        if set(record) != {"rules", "default"} or not isinstance(record["rules"], list):
            raise ValueError("a ByName prior record has exactly 'rules' (a list) and 'default'")
        rules = []
        for rule in record["rules"]:
            if not (isinstance(rule, list) and len(rule) == 2 and isinstance(rule[0], str)):
                raise ValueError(f"a ByName rule record is [pattern, prior], got {rule!r}")
            rules.append((rule[0], prior_from_record(rule[1], nested=True)))
        return ByName(tuple(rules), prior_from_record(record["default"], nested=True))
    cls = classes.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ValueError(f"{name!r} is not a known prior ({sorted(classes) + ([] if nested else ['ByName'])})")
    fields = {f.name for f in dataclasses.fields(cls)}
    if set(record) - fields:
        raise ValueError(f"{cls.__name__} has no field(s) {sorted(set(record) - fields)}")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in record.items()})


class _ScaleMixtureNormal(dist.Distribution):
    """Elementwise π N(0, s1²) + (1 − π) N(0, s2²) with batch shape ``shape``."""

    support = dist.constraints.real
    reparametrized_params = []

    def __init__(self, pi, scale1, scale2, shape):
        self.pi, self.scale1, self.scale2 = pi, scale1, scale2
        super().__init__(batch_shape=tuple(shape))

    def sample(self, key, sample_shape=()):
        key_pick, key_normal = jax.random.split(key)
        shape = tuple(sample_shape) + self.batch_shape
        pick = jax.random.bernoulli(key_pick, self.pi, shape)
        return jax.random.normal(key_normal, shape) * jnp.where(pick, self.scale1, self.scale2)

    def log_prob(self, value):
        first = math.log(self.pi) + dist.Normal(0.0, self.scale1).log_prob(value)
        second = math.log(1.0 - self.pi) + dist.Normal(0.0, self.scale2).log_prob(value)
        return jnp.logaddexp(first, second)
