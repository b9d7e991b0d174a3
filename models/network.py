"""A network the user brings: any pure ``apply(params, X)`` over a pytree of parameters.

``Network(apply_fn, params_template, likelihood=...)`` makes every floating-point array leaf of
``params_template`` one sample site with a prior, and observes the targets through the same
likelihoods as ``BNN``. Inside ppl it is a declarative model like the others: the Problem, MAP,
samplers, SVI, SWAG, ensembles and the GGN-based Laplace all see ``apply`` and the site layout.

Site names are the leaf's path in the tree, its keys joined with ``"."``: the leaf
``params["dense_0"]["kernel"]`` is the site ``"dense_0.kernel"``, the second element of a list
``params["layers"][1]["w"]`` is ``"layers.1.w"``, an attribute of a dataclass or NamedTuple node
is named by the attribute. Sites come in the tree's own flattening order (dict keys sorted), so
names and order are stable across runs.

Parameter groups ("layers" for the per-layer priors and Laplace's per-layer prior precision) are
the leaves that share a parent node: ``dense_0.kernel`` and ``dense_0.bias`` form the group
``dense_0``; a leaf at the top of the tree is a group by itself.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro

from ppl.core.errors import DataError, OptionError
from ppl.models._base import (
    ACTIVATIONS, LIKELIHOODS, OBSERVED_SITE, Layer, SupervisedModel, check_choice, check_scale, image_patches,
)
from ppl.models.priors import ByName, FanIn, Isotropic, PerLayer, Prior, prior_record

__all__ = ["Network", "Leaf"]

MAX_INFERRED_CLASSES = 10_000
_RESERVED = ("sigma", OBSERVED_SITE)
_COMPONENT = re.compile(r"^[A-Za-z0-9_\-]+$")


class Leaf(NamedTuple):
    """One parameter array of the network: its site name, shape, group and prior role.

    ``kind`` is ``"weight"`` for arrays of two or more dimensions (fan-in = the product of all axes
    but the last, the output axis in JAX's layout: (fan_in, fan_out) for a dense kernel,
    (height, width, in, out) for a convolution) and ``"bias"`` for vectors and scalars.
    """

    name: str
    shape: tuple
    group: int
    kind: str
    fan_in: int


def _key_name(entry, where: str) -> str:
    if isinstance(entry, jax.tree_util.DictKey):
        key = entry.key
    elif isinstance(entry, jax.tree_util.SequenceKey):
        key = entry.idx
    elif isinstance(entry, jax.tree_util.GetAttrKey):
        key = entry.name
    elif isinstance(entry, jax.tree_util.FlattenedIndexKey):
        key = entry.key
    else:
        key = str(entry)
    text = str(key)
    if not _COMPONENT.match(text):
        raise OptionError(
            f"Network.params_template: the key {key!r} at {where or 'the top of the tree'} cannot be part of a site "
            "name (letters, digits, '_' and '-' only; '.' joins the path) — rename that key"
        )
    return text


def _describe(leaf) -> str:
    return f"{type(leaf).__name__}" + (f" of dtype {leaf.dtype}" if hasattr(leaf, "dtype") else f" {leaf!r}")


def _layout(template) -> tuple:
    """(treedef, leaves) of a parameter template, validated: floating, finite arrays, unique names."""
    try:
        pairs, treedef = jax.tree_util.tree_flatten_with_path(template)
    except Exception as error:  # a tree JAX cannot flatten
        raise OptionError(f"Network.params_template is not a JAX pytree ({type(error).__name__}: {error})") from None
    if not pairs:
        raise OptionError("Network.params_template has no array leaves; give the network's parameters, e.g. {'w': jnp.zeros((3, 1))}")
    names, leaves, parents = [], [], []
    for path, value in pairs:
        parts = []
        for entry in path:
            parts.append(_key_name(entry, ".".join(parts)))
        name = ".".join(parts) if parts else "params"
        if not isinstance(value, (np.ndarray, jax.Array)):
            raise OptionError(
                f"Network.params_template[{name!r}] is a {_describe(value)}, not an array; every leaf is a parameter — "
                "make it an array (jnp.asarray), or close over a constant inside apply_fn instead of putting it in the tree"
            )
        if isinstance(value, jax.core.Tracer):
            raise OptionError(f"Network.params_template[{name!r}] is a traced value; build the Network outside jit")
        if not jnp.issubdtype(value.dtype, jnp.floating):
            raise OptionError(
                f"Network.params_template[{name!r}] has dtype {value.dtype}; parameters must be floating-point — "
                "integer or boolean settings belong inside apply_fn (closed over), not in the parameter tree"
            )
        if value.size == 0:
            raise OptionError(f"Network.params_template[{name!r}] is empty (shape {tuple(value.shape)}); drop it from the tree")
        if not bool(np.all(np.isfinite(np.asarray(value)))):
            raise OptionError(
                f"Network.params_template[{name!r}] holds non-finite values (NaN or Inf); the template gives shapes "
                "and must be a finite array (zeros will do)"
            )
        if name in _RESERVED:
            raise OptionError(
                f"Network.params_template has a leaf named {name!r}, which ppl reserves for "
                f"{'the noise scale' if name == 'sigma' else 'the observations'}; nest or rename it"
            )
        names.append(name)
        parents.append(".".join(parts[:-1]) if len(parts) > 1 else name)
        leaves.append(tuple(int(d) for d in value.shape))
    seen = set()
    for name in names:
        if name in seen:
            raise OptionError(f"Network.params_template has two leaves named {name!r}; rename one of their keys")
        seen.add(name)
    group_of, out = {}, []
    for name, shape, parent in zip(names, leaves, parents):
        group = group_of.setdefault(parent, len(group_of))
        kind = "weight" if len(shape) >= 2 else "bias"
        fan_in = int(math.prod(shape[:-1])) if kind == "weight" else 1
        out.append(Leaf(name, shape, group, kind, fan_in))
    return treedef, tuple(out), tuple(group_of)


def _digest(template) -> str:
    """A fingerprint of a template's values (shapes, dtypes and bytes of every leaf, in tree order)."""
    h = hashlib.sha256()
    for value in jax.tree_util.tree_leaves(template):
        array = np.ascontiguousarray(np.asarray(value))
        h.update(f"{array.dtype.str}{array.shape}".encode())
        h.update(array.tobytes())
    return h.hexdigest()[:16]


def _declared_layers(network) -> tuple:
    """``apply_fn.layers()`` checked against the template: each names a weight leaf of two or more
    axes and a bias leaf (or None) of the weight's output size."""
    shapes = {leaf.name: leaf.shape for leaf in network.leaves}
    declared = network.apply_fn.layers()
    out = []
    for entry in declared:
        if not (isinstance(entry, tuple) and len(entry) == 3):
            raise OptionError(
                f"Network.apply_fn.layers() must give (weight site, bias site or None, activation or None) per layer; "
                f"got {entry!r}"
            )
        weight, bias, activation = entry
        if weight not in shapes or len(shapes[weight]) < 2:
            raise OptionError(
                f"Network.apply_fn.layers() names the weight {weight!r}, which is not a parameter leaf of two or more "
                f"axes; the leaves are {', '.join(shapes)}"
            )
        fan_out = shapes[weight][-1]
        if bias is not None and shapes.get(bias) != (fan_out,):
            raise OptionError(
                f"Network.apply_fn.layers() names the bias {bias!r} for {weight!r}, which is not a leaf of shape "
                f"({fan_out},); the leaves are {', '.join(f'{n} {shapes[n]}' for n in shapes)}"
            )
        if activation is not None and activation not in ACTIVATIONS:
            raise OptionError(f"Network.apply_fn.layers(): activation {activation!r} is not one of {tuple(ACTIVATIONS)}")
        out.append(Layer(weight, bias, math.prod(shapes[weight][:-1]), fan_out, activation))
    return tuple(out)


@dataclass(frozen=True)
class Network(SupervisedModel):
    """A Bayesian network from any pure JAX function ``apply_fn(params, X) -> outputs``.

    Every array leaf of ``params_template`` becomes a sample site named by its path
    (``"dense_0.kernel"``) with the prior of its group; the template's values are not used, only
    its structure, shapes and float types. The outputs are the likelihood's natural parameter:
    (N,) or (N, 1) for ``gaussian`` (the mean) and ``bernoulli`` (the logit), (N, C) logits for
    ``categorical`` (C is read from the outputs), (N, 2) mean and log-variance for
    ``heteroscedastic``, (N, K) for Gaussian regression on K targets.

    Args:
        apply_fn: a pure function of (parameter tree, inputs); inputs are X as given to ``ppl.fit``
            (N, ...) — 2-D rows, or images (N, H, W, C).
        params_template: a pytree of floating-point arrays with the parameters' shapes.
        likelihood: ``gaussian``, ``bernoulli``, ``categorical`` or ``heteroscedastic``.
        prior_scale: scale of the isotropic N(0, s²) prior used when ``prior`` is None.
        prior: a ``ppl.models.priors`` object; ``PerLayer`` counts the parameter groups in tree
            order, ``FanIn`` reads each weight's fan-in from its shape (all axes but the last).
        noise_scale: fixed Gaussian noise σ, or None to learn it (a ``sigma`` site).
        last_layer: the path prefix of the output layer's parameters (``"dense_2"``), or a tuple
            of prefixes: the coordinates that ``laplace`` with ``subset="last_layer"`` (and
            ``mola``) cover. A prefix matches whole path components (``"dense"`` does not match
            ``"dense_2.kernel"``). Without it the output layer is unknown: ``laplace`` then
            defaults to ``subset="all"`` and refuses ``"last_layer"``.
        pretrained: the template's values are trained weights (from outside ppl) rather than
            shapes only: methods then may start from them (``init="pretrained"``), and ``laplace``
            does by default, refining only the coordinates it covers (its ``subset``, and σ) and
            holding every other weight at its trained value — Laplace on part of a pretrained
            network. ``from_flax(module, params=...)`` sets it.

    Layer structure (optional; what ``laplace``'s ``hessian="kfac"`` needs): an ``apply_fn`` that
    also has ``layers()`` — ((weight site, bias site or None, activation or None), ...) from input to
    output — and ``forward(params, X, taps=None) -> (outputs, inputs)`` declares its layers. A layer
    computes ``inputs[l] @ weight.reshape(fan_in, fan_out) (+ bias)`` at each of its rows:
    ``inputs[l]`` is (B, fan_in) for a dense layer or (B, R, fan_in) for a layer applied at R
    locations (a convolution's patches), and ``taps[l]``, shaped like that pre-activation
    ((B, fan_out) or (B, R, fan_out)), is added to it. :class:`ppl.models.CNN`'s apply function is
    one.

    >>> import jax.numpy as jnp
    >>> from ppl.models import Network
    >>> def mlp(p, X):
    ...     return jnp.tanh(X @ p["hidden"]["w"] + p["hidden"]["b"]) @ p["out"]["w"] + p["out"]["b"]
    >>> template = {"hidden": {"w": jnp.zeros((4, 16)), "b": jnp.zeros(16)},
    ...             "out": {"w": jnp.zeros((16, 1)), "b": jnp.zeros(1)}}
    >>> model = Network(mlp, template, likelihood="bernoulli", last_layer="out")
    """

    apply_fn: Callable = None
    params_template: Any = field(default=None, compare=False, repr=False)
    likelihood: str = "gaussian"
    prior_scale: float = 1.0
    prior: Prior | None = None
    noise_scale: float | None = None
    last_layer: str | tuple | None = None
    num_classes: int | None = None
    num_outputs: int | None = None
    pretrained: bool = False
    # derived from the template: what equality, hashing and compiled programs depend on
    treedef: Any = field(init=False, repr=False)
    leaves: tuple = field(init=False, repr=False)
    groups: tuple = field(init=False)
    values_digest: str = field(init=False, repr=False)  # of a pretrained template's values ('' otherwise)

    accepts_array_inputs = True  # X may be (N, ...) of any rank, not only (N, D)

    def __post_init__(self):
        if self.apply_fn is None or not callable(self.apply_fn):
            raise OptionError(
                f"Network.apply_fn must be a function apply(params, X) -> outputs, got {type(self.apply_fn).__name__}"
            )
        try:
            hash(self.apply_fn)
        except TypeError:
            raise OptionError(
                "Network.apply_fn must be hashable (a function, or a functools.partial of hashable arguments): "
                "compiled programs are cached on it"
            ) from None
        if self.params_template is None:
            raise OptionError("Network needs params_template: a pytree of arrays with the parameters' shapes")
        treedef, leaves, groups = _layout(self.params_template)
        object.__setattr__(self, "treedef", treedef)
        object.__setattr__(self, "leaves", leaves)
        object.__setattr__(self, "groups", groups)
        if not isinstance(self.pretrained, (bool, np.bool_)):
            raise OptionError(
                f"Network.pretrained must be True (the template's values are trained weights to start from) or False "
                f"(only its shapes are used), got {self.pretrained!r}"
            )
        object.__setattr__(self, "pretrained", bool(self.pretrained))
        # two pretrained networks of one layout but other values are different models: starts read the values
        object.__setattr__(self, "values_digest", _digest(self.params_template) if self.pretrained else "")
        check_choice("Network.likelihood", self.likelihood, LIKELIHOODS)
        check_scale("Network.prior_scale", self.prior_scale)
        check_scale("Network.noise_scale", self.noise_scale, allow_none=True)
        if self.noise_scale is not None and self.likelihood != "gaussian":
            raise OptionError(f"Network.noise_scale applies only to likelihood='gaussian', not {self.likelihood!r}")
        if self.prior is not None and not isinstance(self.prior, Prior):
            raise OptionError(
                f"Network.prior must be a ppl.models.priors object (Isotropic, PerLayer, FanIn, ScaleMixture, "
                f"ByName), got {type(self.prior).__name__}"
            )
        if isinstance(self.prior, ByName):
            try:
                self.prior.check_names(self.site_names, "Network")
            except ValueError as error:
                raise OptionError(str(error)) from None
        per_layer = [p for p in (self.prior.components() if self.prior is not None else ()) if isinstance(p, PerLayer)]
        if per_layer and len(per_layer[0].scales) != len(groups):
            raise OptionError(
                f"Network.prior is PerLayer with {len(per_layer[0].scales)} scales but the template has {len(groups)} "
                f"parameter groups ({', '.join(groups)}); give one scale per group, in that order"
            )
        if isinstance(self.last_layer, list):
            object.__setattr__(self, "last_layer", tuple(self.last_layer))
        if self.last_layer is not None:
            prefixes = (self.last_layer,) if isinstance(self.last_layer, str) else self.last_layer
            if not isinstance(prefixes, tuple) or not prefixes or not all(isinstance(p, str) for p in prefixes):
                raise OptionError(
                    f"Network.last_layer must be a path prefix (a string) or a tuple of them, got {self.last_layer!r}"
                )
            missing = [p for p in prefixes if not any(n == p or n.startswith(p + ".") for n in self.site_names)]
            if missing:
                raise OptionError(
                    f"Network.last_layer={missing[0]!r} matches no parameter; it is a path prefix of the output "
                    f"layer's leaves — one of the groups {', '.join(map(repr, groups))}"
                )
        if self.num_classes is not None and (self.likelihood != "categorical" or int(self.num_classes) < 2):
            raise OptionError("Network.num_classes applies to likelihood='categorical' and must be at least 2")

    # -- structure ------------------------------------------------------------------------------------
    def pretrained_values(self) -> dict:
        """The trained values of a ``pretrained`` network, by site name (what ``init="pretrained"``
        starts from)."""
        if not self.pretrained:
            raise OptionError(
                "this Network holds no trained values (pretrained=False: its template gives shapes only); build it with "
                "Network(apply_fn, trained_params, pretrained=True) or Network.from_flax(module, ..., params=trained)"
            )
        values = jax.tree_util.tree_leaves(self.params_template)
        return {leaf.name: np.asarray(value) for leaf, value in zip(self.leaves, values)}

    @property
    def site_names(self) -> tuple:
        return tuple(leaf.name for leaf in self.leaves)

    def _last_names(self) -> tuple:
        prefixes = (self.last_layer,) if isinstance(self.last_layer, str) else tuple(self.last_layer)
        return tuple(n for n in self.site_names if any(n == p or n.startswith(p + ".") for p in prefixes))

    def network_sites(self, input_dim=None) -> tuple:
        return self.site_names

    def parameter_groups(self, input_dim=None) -> tuple:
        return tuple(
            (group, tuple(leaf.name for leaf in self.leaves if leaf.group == g)) for g, group in enumerate(self.groups)
        )

    def last_layer_sites(self, input_dim=None) -> tuple | None:
        return self._last_names() if self.last_layer is not None else None

    @property
    def has_layers(self) -> bool:
        fn = self.apply_fn
        return (callable(getattr(fn, "layers", None)) and callable(getattr(fn, "forward", None))
                and getattr(fn, "layer_problem", None) is None)

    @property
    def layer_problem(self) -> str:
        """Why this network's layer structure is unknown ('' when it is known)."""
        if self.has_layers:
            return ""
        return getattr(self.apply_fn, "layer_problem", None) or "its apply_fn does not declare layers() and forward()"

    def layers(self, input_dim=None) -> tuple:
        """The layers ``apply_fn`` declares (see the class docstring), as :class:`Layer` records whose
        fan-in is the weight's size over its last axis (k·k·C_in for a convolution)."""
        if not self.has_layers:
            raise OptionError(
                f"this needs the network's layer structure (K-FAC curvature), which is unknown for this Network's "
                f"parameters ({', '.join(self.groups)}): {self.layer_problem} — for laplace use hessian='full', 'diag' "
                "or 'lowrank' (the generic GGN works for any network), or give apply_fn layers() and forward() "
                "(see ppl.models.Network)"
            )
        return _declared_layers(self)

    @property
    def dense(self) -> bool:
        # a Network's layers, even when declared, may be convolutions: not a stack of dense matmuls
        return False

    def forward(self, params: dict, X, taps=None) -> tuple:
        """(output, inputs) from ``apply_fn.forward`` on the parameter tree (K-FAC's pass)."""
        out, inputs = self.apply_fn.forward(self._tree(params), X, taps)
        return (out if jnp.ndim(out) == 1 else self.squeeze(out)), list(inputs)

    def _tree(self, params: dict):
        return jax.tree_util.tree_unflatten(self.treedef, [params[leaf.name] for leaf in self.leaves])

    def apply(self, params: dict, X):
        out = self.apply_fn(self._tree(params), X)
        if jnp.ndim(out) == 1:
            return out
        return self.squeeze(out)

    def squeeze(self, h):
        if self.likelihood in ("categorical", "heteroscedastic") or self.multi_output:
            return h
        return h[..., 0]

    def output_shape(self, X) -> tuple:
        """The shape of ``apply_fn``'s output on inputs ``X`` (traced abstractly, nothing computed)."""
        shapes = jax.tree_util.tree_unflatten(
            self.treedef, [jax.ShapeDtypeStruct(leaf.shape, jnp.result_type(float)) for leaf in self.leaves]
        )
        try:
            out = jax.eval_shape(self.apply_fn, shapes, jax.ShapeDtypeStruct(np.shape(X), jnp.result_type(float)))
        except Exception as error:
            raise DataError(
                f"Network.apply_fn failed on inputs of shape {tuple(np.shape(X))} with the template's parameters "
                f"({type(error).__name__}: {error}); check that apply_fn(params, X) runs on a batch of these inputs"
            ) from None
        if not isinstance(out, jax.ShapeDtypeStruct):
            raise DataError(
                f"Network.apply_fn returned a {type(out).__name__}; it must return one array of outputs (N, C) or (N,)"
            )
        return tuple(out.shape)

    def bind(self, X, y):
        rows = min(int(np.shape(X)[0]), 2)
        shape = self.output_shape(X[:rows])
        if len(shape) not in (1, 2) or shape[0] != rows:
            raise DataError(
                f"Network.apply_fn returned outputs of shape {shape} for {rows} input rows; it must return (N,) or "
                "(N, C), one row per input"
            )
        width = 1 if len(shape) == 1 else shape[1]
        name = f"Network(likelihood={self.likelihood!r})"
        if self.likelihood == "categorical":
            if width < 2:
                raise DataError(f"{name}: apply_fn returns {width} output per input; categorical needs C ≥ 2 logits")
            if width > MAX_INFERRED_CLASSES:
                raise DataError(f"{name}: apply_fn returns {width} logits per input, more than {MAX_INFERRED_CLASSES} classes")
            if self.num_classes is not None and self.num_classes != width:
                raise DataError(f"{name}: num_classes={self.num_classes} but apply_fn returns {width} logits per input")
            if y is not None and np.size(y) and int(np.max(y)) >= width:
                bad = int(np.flatnonzero(np.asarray(y) >= width)[0])
                raise DataError(
                    f"y[{bad}] = {int(np.asarray(y)[bad])} but apply_fn returns {width} logits (classes 0..{width - 1}); "
                    "widen the output layer or recode the labels"
                )
            return dataclasses.replace(self, num_classes=width)
        if self.likelihood == "heteroscedastic":
            if width != 2:
                raise DataError(f"{name}: apply_fn returns {width} outputs per input; heteroscedastic needs 2 (mean, log-variance)")
            return self
        if self.likelihood == "gaussian" and y is not None and np.ndim(y) == 2:
            if width != np.shape(y)[1]:
                raise DataError(f"{name}: y has {np.shape(y)[1]} target columns but apply_fn returns {width} outputs per input")
            return dataclasses.replace(self, num_outputs=int(np.shape(y)[1]))
        if width != 1:
            what = "one logit (the log-odds of class 1)" if self.likelihood == "bernoulli" else "one mean"
            hint = " — for C classes use likelihood='categorical'" if self.likelihood == "bernoulli" else ""
            raise DataError(
                f"{name}: apply_fn returns {width} outputs per input, but this likelihood takes {what} per input, "
                f"shape (N,) or (N, 1){hint}"
            )
        return self

    # -- priors -----------------------------------------------------------------------------------------
    @property
    def _prior(self) -> Prior:
        return self.prior if self.prior is not None else Isotropic(self.prior_scale)

    def with_prior_scales(self, scales: tuple):
        if len(scales) != len(self.groups):
            raise OptionError(
                f"Network has {len(self.groups)} parameter groups ({', '.join(self.groups)}); got {len(scales)} prior scales"
            )
        return dataclasses.replace(self, prior=PerLayer(tuple(float(s) for s in scales)))

    def to_config(self) -> dict:
        """A JSON-able description (for the run's fingerprint and provenance). It names ``apply_fn``
        but cannot rebuild it: ``ppl.models.from_config`` refuses a Network."""
        fn = self.apply_fn
        prior = self.prior
        if isinstance(prior, Prior):
            prior = prior_record(prior)
        fields = {
            "apply_fn": getattr(fn, "origin", None)
            or f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}",
            "leaves": [[leaf.name, list(leaf.shape)] for leaf in self.leaves],
            "likelihood": self.likelihood, "prior_scale": self.prior_scale, "prior": prior,
            "noise_scale": self.noise_scale, "last_layer": self.last_layer, "num_classes": self.num_classes,
            "num_outputs": self.num_outputs,
        }
        if self.pretrained:  # (absent otherwise, so that runs saved before the option load unchanged)
            fields.update(pretrained=True, values_digest=self.values_digest)
        return {"class": "Network", "fields": fields}

    # -- adapters (optional extras: pip install "ppl[flax]" or "ppl[equinox]") ----------------------------
    @classmethod
    def from_flax(cls, module, example_input=None, *, params=None, **options) -> "Network":
        """A Network from a Flax module, NNX or Linen; ``options`` are Network's (``likelihood``,
        ``prior``, ``last_layer``...). ``params``: trained parameter values to build on (a Linen
        ``params`` collection or ``{"params": ...}`` variables; for NNX ``nnx.state(module,
        nnx.Param)`` or its pure dict), which makes the network ``pretrained``; their tree must be
        the module's own.

        - **NNX** (``flax.nnx.Module``, already built with its ``Rngs``): its ``nnx.Param`` variables
          are the template, named by attribute path (``l1.kernel``, ``layers.0.kernel``), and the
          network is the module rebuilt from them (``nnx.merge``) and called on X.
          ``example_input`` is not needed.
        - **Linen** (``flax.linen.Module``): ``module.init`` on ``example_input`` gives the ``params``
          collection, named by Flax's own paths (``Dense_0.kernel``), and the network is
          ``module.apply({"params": params}, X)``. Flax initialises the template with a fixed key;
          its values are not used.

        Modules with state besides parameters (BatchNorm statistics, Dropout's random streams,
        caches) are refused: ppl's posterior covers parameters only.
        """
        try:
            import flax.linen as linen
            from flax import nnx
        except ImportError:
            raise OptionError("Network.from_flax needs Flax: pip install flax (or the 'flax' extra of ppl)") from None
        params_given = params
        if isinstance(module, nnx.Module):
            graph, params, rest = nnx.split(module, nnx.Param, ...)
            others = sorted({".".join(map(str, path)) for path, _ in nnx.to_flat_state(rest)})
            if others:
                raise OptionError(
                    f"Network.from_flax: {type(module).__name__} holds state besides nnx.Param ({', '.join(others)}); "
                    "ppl infers parameters only — remove the mutable state (BatchNorm, Dropout's Rngs) from the module"
                )
            template = nnx.to_pure_dict(params)
            if not jax.tree_util.tree_leaves(template):
                raise OptionError(f"Network.from_flax: {type(module).__name__} has no parameters")
            if params_given is not None:
                trained = nnx.to_pure_dict(params_given) if isinstance(params_given, nnx.State) else params_given
                template = _trained_tree(module, template, trained)
                options = {**options, "pretrained": True}
            paths, treedef = jax.tree_util.tree_flatten_with_path(params)
            # the State's leaf paths end in the Variable's `.value`; the pure dict's stop before it
            keys = tuple(tuple(_key_of(entry) for entry in path[:-1]) for path, _ in paths)
            net = cls(_NnxApply(graph, treedef, keys), template, **options)
            plan, paths, problem = _nnx_layers(module, net.site_names, net.last_layer)
            return dataclasses.replace(net, apply_fn=_NnxApply(graph, treedef, keys, plan, paths, problem or None,
                                                                type(module)))
        if not isinstance(module, linen.Module):
            raise OptionError(
                f"Network.from_flax takes a flax.nnx or flax.linen Module, got {type(module).__name__}; for another "
                "kind of network pass Network(apply_fn, params_template) yourself"
            )
        if example_input is None:
            raise OptionError("Network.from_flax: a Linen module is initialised on an example: pass example_input=X[:2]")
        variables = module.init(jax.random.PRNGKey(0), jnp.asarray(example_input, dtype=jnp.result_type(float)))
        others = sorted(set(variables) - {"params"})
        if others:
            raise OptionError(
                f"Network.from_flax: {type(module).__name__} has variable collections {others} besides 'params'; "
                "ppl infers parameters only — remove the mutable state (e.g. BatchNorm) from the module"
            )
        if "params" not in variables:
            raise OptionError(f"Network.from_flax: {type(module).__name__} has no parameters")
        template = variables["params"]
        if params_given is not None:
            trained = params_given
            if isinstance(trained, dict) and set(trained) == {"params"}:
                trained = trained["params"]  # the variables dict module.init returns
            template = _trained_tree(module, template, trained)
            options = {**options, "pretrained": True}
        net = cls(_FlaxApply(module), template, **options)
        example = jnp.asarray(example_input, dtype=jnp.result_type(float))
        plan, problem = _linen_layers(module, example, net.site_names, net.last_layer)
        return dataclasses.replace(net, apply_fn=_FlaxApply(module, plan, problem or None))

    @classmethod
    def from_equinox(cls, module, *, batched: bool = False, **options) -> "Network":
        """A Network from an Equinox module: its floating-point arrays are the parameters (named by
        attribute path, e.g. ``layers.0.weight``), everything else is held fixed. Equinox layers
        take one example, so the module is mapped over the rows of X unless ``batched=True``.
        ``pretrained=True`` when the module's values are trained weights to build on.

        Equinox stores a linear layer's weight as (out, in), so the fan-in rule of ``FanIn``
        (all axes but the last) does not fit it; use ``Isotropic`` or ``PerLayer`` priors.
        """
        try:
            import equinox as eqx
        except ImportError:
            raise OptionError("Network.from_equinox needs Equinox: pip install equinox (or the 'equinox' extra of ppl)") from None
        if not isinstance(module, eqx.Module):
            raise OptionError(f"Network.from_equinox takes an equinox.Module, got {type(module).__name__}")
        prior = options.get("prior")
        if isinstance(prior, Prior) and any(isinstance(p, FanIn) for p in prior.components()):
            raise OptionError(
                "Network.from_equinox: a FanIn prior reads fan-in from the last axis but Equinox weights are "
                "(out, in); use Isotropic or PerLayer"
            )
        params, static = eqx.partition(module, eqx.is_inexact_array)
        return cls(_EquinoxApply(static, bool(batched)), params, **options)

    # -- the NumPyro program ------------------------------------------------------------------------------
    def __call__(self, X, y=None):
        params = {}
        for leaf in self.leaves:
            params[leaf.name] = numpyro.sample(
                leaf.name, self._prior.distribution(leaf.group, leaf.kind, leaf.shape, leaf.fan_in, leaf.name)
            )
        params.update(self._sample_noise())
        return self._observe(X, y, params)


def _trained_tree(module, template, trained):
    """``trained`` (a Flax parameter tree) checked against the module's own ``template``: the same
    paths and shapes, as arrays (Network checks that they are finite floating-point numbers)."""
    name = type(module).__name__
    try:
        theirs = jax.tree_util.tree_flatten_with_path(trained)
    except Exception as error:
        raise OptionError(f"Network.from_flax: params is not a parameter tree ({type(error).__name__}: {error})") from None

    def shapes(pairs):
        return {jax.tree_util.keystr(path): tuple(np.shape(value)) for path, value in pairs}

    want, got = shapes(jax.tree_util.tree_flatten_with_path(template)[0]), shapes(theirs[0])
    if want != got:
        missing = sorted(set(want) - set(got))
        extra = sorted(set(got) - set(want))
        wrong = sorted(k for k in set(want) & set(got) if want[k] != got[k])
        parts = ([f"missing {', '.join(missing[:4])}"] if missing else []) + (
            [f"not in the module {', '.join(extra[:4])}"] if extra else []) + (
            [f"{k} is {got[k]}, the module's is {want[k]}" for k in wrong[:4]])
        raise OptionError(
            f"Network.from_flax: params does not match {name}'s parameters ({'; '.join(parts)}); pass the trained "
            "parameters of this module (for Linen the 'params' collection of module.init/apply)"
        )
    return jax.tree_util.tree_map(jnp.asarray, trained)


def _origin(cls, library: str) -> str:
    """How a saved run names an adapted module: its class, which loading needs built again."""
    return f"{cls.__module__}.{cls.__qualname__} ({library} module)"


# -- the layers of a Flax module, for K-FAC ------------------------------------------------------------
class _KnownLayer(NamedTuple):
    """A Flax Dense/Linear or Conv layer K-FAC can treat: its parameters ``{prefix}.kernel`` (and
    ``{prefix}.bias``), and for a convolution the side of its square kernel."""

    prefix: str
    kernel_size: int  # 0: a dense layer
    bias: bool


def _conv_problem(prefix: str, conv) -> str | None:
    """Why a Flax convolution is not one K-FAC-expand can treat here (None: it is): a 2-D square
    kernel at stride 1 with 'SAME' padding, no dilation, one feature group and no mask."""
    size = tuple(np.atleast_1d(conv.kernel_size))
    checks = [
        (len(size) == 2 and size[0] == size[1], f"kernel {size} is not a square 2-D kernel"),
        (all(int(v) == 1 for v in np.atleast_1d(conv.strides or 1)), f"strides {conv.strides}"),
        (isinstance(conv.padding, str) and conv.padding.upper() == "SAME", f"padding {conv.padding!r}"),
        (all(int(v) == 1 for v in np.atleast_1d(conv.kernel_dilation or 1)), f"kernel_dilation {conv.kernel_dilation}"),
        (all(int(v) == 1 for v in np.atleast_1d(conv.input_dilation or 1)), f"input_dilation {conv.input_dilation}"),
        (conv.feature_group_count == 1, f"feature_group_count {conv.feature_group_count}"),
        (getattr(conv, "mask", None) is None, "a kernel mask"),
    ]
    wrong = [why for ok, why in checks if not ok]
    return f"{prefix} ({', '.join(wrong)})" if wrong else None


def _layer_plan(found: list, site_names: tuple, last_layer) -> tuple:
    """(layers, problem): the known layers from ``found`` — (prefix, "dense" | "conv", module) in
    call order — and '' when K-FAC can cover the network, else why not, naming the layers and
    parameters it cannot treat. The declared last layer goes last (the output layer)."""
    layers, unsupported, named = [], [], set()
    for prefix, kind, module in found:
        problem = _conv_problem(prefix, module) if kind == "conv" else None
        if problem is not None:
            unsupported.append(problem)
            named.update(_site(prefix, leaf) for leaf in ("kernel", "bias"))
            continue
        size = int(np.atleast_1d(module.kernel_size)[0]) if kind == "conv" else 0
        layers.append(_KnownLayer(prefix, size, bool(module.use_bias)))
    covered = {_site(layer.prefix, leaf) for layer in layers for leaf in ("kernel", "bias")}
    unsupported += [name for name in site_names if name not in covered | named]
    if unsupported:
        return (), ("K-FAC here covers Flax Dense/Linear layers and stride-1 'SAME' convolutions, and not "
                    + ", ".join(unsupported))
    layers.sort(key=lambda layer: layer.prefix in _prefixes(last_layer))  # stable: call order otherwise
    return tuple(layers), ""


class _Taps:
    """One K-FAC forward pass through a Flax module: records each known layer's input rows and adds
    its tap to the layer's output (see ``Network``: layers() and forward())."""

    def __init__(self, layers: tuple, taps):
        self.layers, self.taps = layers, taps
        self.index = {layer.prefix: i for i, layer in enumerate(layers)}
        self.inputs = [None] * len(layers)

    def __call__(self, prefix: str, x, call):
        i = self.index[prefix]
        if self.inputs[i] is not None:
            raise OptionError(
                f"K-FAC: layer {prefix!r} is applied more than once in one pass (shared weights); K-FAC needs "
                "each layer once — use hessian='full', 'diag' or 'lowrank'"
            )
        size = self.layers[i].kernel_size
        rows = image_patches(x, size) if size else x
        if rows.ndim > 2:
            rows = jnp.reshape(rows, (rows.shape[0], -1, rows.shape[-1]))
        self.inputs[i] = rows
        out = call(x)
        return out if self.taps is None else out + jnp.reshape(self.taps[i], out.shape)

    def result(self, out) -> tuple:
        missing = [layer.prefix for layer, h in zip(self.layers, self.inputs) if h is None]
        if missing:
            raise OptionError(f"K-FAC: the layers {', '.join(missing)} were not applied in the forward pass")
        return out, self.inputs


def _site(prefix: str, leaf: str) -> str:
    return f"{prefix}.{leaf}" if prefix else leaf


def _declares(layers: tuple) -> tuple:
    return tuple((_site(layer.prefix, "kernel"), _site(layer.prefix, "bias") if layer.bias else None, None)
                 for layer in layers)


def _linen_layers(module, example, site_names: tuple, last_layer) -> tuple:
    """The Dense and Conv layers a Linen module applies, found by tracing it on ``example`` (no
    arithmetic is done), in call order; see _layer_plan."""
    import flax.linen as linen

    found = []

    def record(next_fun, args, kwargs, context):
        kind = {linen.Dense: "dense", linen.Conv: "conv"}.get(type(context.module))
        if kind is not None and context.method_name == "__call__":
            found.append((".".join(map(str, context.module.path)), kind, context.module))
        return next_fun(*args, **kwargs)

    with linen.intercept_methods(record):
        jax.eval_shape(module.init, jax.random.PRNGKey(0), example)
    prefixes = _prefixes(last_layer)
    if found and prefixes and not any(found[-1][0] == p or found[-1][0].startswith(p + ".") for p in prefixes):
        # traced in call order, the output layer is known: a wrong name would put a Gaussian on a hidden layer
        raise OptionError(
            f"Network.from_flax: last_layer={last_layer!r} is not the output layer: the layer applied last is "
            f"{found[-1][0]!r} (Linen numbers submodules in the order they are built, which need not be the order "
            "they are applied); name that one"
        )
    return _layer_plan(found, site_names, last_layer)


def _prefixes(last_layer) -> tuple:
    return (last_layer,) if isinstance(last_layer, str) else tuple(last_layer or ())


@dataclass(frozen=True)
class _FlaxApply:
    """``(params, X) -> module.apply({"params": params}, X)``, hashable by the module's value; with
    the Dense and Conv layers it applies declared for K-FAC (``layer_problem`` says why not)."""

    module: Any
    plan: tuple = ()
    layer_problem: str | None = None

    @property
    def origin(self) -> str:
        return _origin(type(self.module), "Flax Linen")

    def __call__(self, params, X):
        return self.module.apply({"params": params}, X)

    def layers(self) -> tuple:
        return _declares(self.plan)

    def forward(self, params, X, taps=None) -> tuple:
        import flax.linen as linen

        tap = _Taps(self.plan, taps)

        def intercept(next_fun, args, kwargs, context):
            prefix = ".".join(map(str, context.module.path))
            if context.method_name == "__call__" and prefix in tap.index:
                return tap(prefix, args[0], lambda x: next_fun(x, *args[1:], **kwargs))
            return next_fun(*args, **kwargs)

        with linen.intercept_methods(intercept):
            out = self.module.apply({"params": params}, X)
        return tap.result(out)


def _key_of(entry):
    """The plain key of one step of a pytree path (a dict key, a sequence index or an attribute)."""
    for attribute in ("key", "idx", "name"):
        if hasattr(entry, attribute):
            return getattr(entry, attribute)
    raise OptionError(f"Network.from_flax: cannot read the parameter path step {entry!r}")


@dataclass(frozen=True)
class _NnxApply:
    """An NNX module rebuilt from a dict of parameters (its ``nnx.to_pure_dict`` layout) and called
    on X; hashable by the module's graph definition and the parameters' layout."""

    graph: Any
    treedef: Any
    keys: tuple  # each parameter's key path in the pure dict, in the State's leaf order
    plan: tuple = ()  # the Linear and Conv layers, for K-FAC
    paths: tuple = ()  # each planned layer's path of attributes and indices in the module
    layer_problem: str | None = None
    module_class: Any = None

    @property
    def origin(self) -> str | None:
        return None if self.module_class is None else _origin(self.module_class, "Flax NNX")

    def _module(self, params):
        from flax import nnx

        leaves = []
        for path in self.keys:
            value = params
            for key in path:
                value = value[key]
            leaves.append(value)
        return nnx.merge(self.graph, jax.tree_util.tree_unflatten(self.treedef, leaves))

    def __call__(self, params, X):
        return self._module(params)(X)

    def layers(self) -> tuple:
        return _declares(self.plan)

    def forward(self, params, X, taps=None) -> tuple:
        module = self._module(params)  # a fresh module, so its layers can be wrapped in place
        tap = _Taps(self.plan, taps)
        for layer, path in zip(self.plan, self.paths):
            parent = module
            for key in path[:-1]:
                parent = _step(parent, key)
            wrapped = _TappedCall(tap, layer.prefix, _step(parent, path[-1]))
            if isinstance(path[-1], int):
                parent[path[-1]] = wrapped
            else:
                setattr(parent, path[-1], wrapped)
        return tap.result(module(X))


def _step(node, key):
    return node[key] if isinstance(key, int) else getattr(node, key)


@dataclass(frozen=True)
class _TappedCall:
    """A layer's call routed through the K-FAC recorder."""

    tap: Any
    prefix: str
    layer: Any

    def __call__(self, x):
        return self.tap(self.prefix, x, self.layer)


def _nnx_layers(module, site_names: tuple, last_layer) -> tuple:
    """(plan, paths, problem) for an NNX module's Linear and Conv layers (see _layer_plan), in the
    module's graph order with the declared last layer last."""
    from flax import nnx

    found, paths = [], {}
    for path, node in nnx.iter_graph(module):
        kind = {nnx.Linear: "dense", nnx.Conv: "conv"}.get(type(node))
        if kind is not None and path:
            prefix = ".".join(map(str, path))
            found.append((prefix, kind, node))
            paths[prefix] = tuple(path)
    plan, problem = _layer_plan(found, site_names, last_layer)
    return plan, tuple(paths[layer.prefix] for layer in plan), problem


@dataclass(frozen=True)
class _EquinoxApply:
    """The Equinox module rebuilt from the parameters and its fixed part, called on X."""

    static: Any
    batched: bool

    @property
    def origin(self) -> str:
        return _origin(type(self.static), "Equinox")
    # K-FAC works on (in, out) weights with the bias beside them; Equinox keeps (out, in)
    layer_problem = ("Equinox keeps a Linear layer's weight as (out, in), and K-FAC here needs (in, out) "
                     "weights with their bias, as Flax and ppl's networks keep them")

    def __call__(self, params, X):
        import equinox as eqx

        model = eqx.combine(params, self.static)
        return model(X) if self.batched else jax.vmap(model)(X)
