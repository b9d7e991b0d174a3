"""``ppl.load(path)``: a run folder back as a Posterior, its verdict recomputed from the stored draws.

The folder's files are read and checked by ``ppl.io.store`` (schema, sizes, checksums); this module
rebuilds the model from its closed list of classes, the Problem, the stored approximation and the
records, and decides the verdict again. It never imports a program the files name unless the
caller passes ``trust=True`` for a folder they wrote.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from ppl.core import registry
from ppl.core.checkpoint import ResumeState
from ppl.core.errors import DataError, OptionError, RunError
from ppl.core.gaussian import from_arrays, stored_draws_mismatch
from ppl.core.keys import as_key
from ppl.core.posterior import Posterior
from ppl.core.problem import Problem, compile_problem
from ppl.core.records import RECORDS, RunRecord, from_saved
from ppl.core.results import Check, Diagnostics
from ppl.io.store import ARRAYS, DIAGNOSTICS, META, Schema, Snapshot, describe_model, jsonable, model_difference, read_meta, with_snapshot
from ppl.io.verdict import measure_chains, rederive
from ppl.models import Network, from_config
from ppl.models._base import SupervisedModel
from ppl.models.priors import prior_from_record

__all__ = ["load", "load_with", "load_run", "saved_diagnostics"]


def _diagnostics_from(record: dict, folder: Path):
    """The Diagnostics record of a diagnostics.json that ``read_meta`` checked field by field."""
    pointwise = record["elpd_loo_pointwise"]
    return Diagnostics(**{**record, "checks": [Check(**item) for item in record["checks"]],
                          "elpd_loo_pointwise": None if pointwise is None else np.asarray(pointwise, dtype=float)})


def saved_diagnostics(path):
    """The diagnostics saved in run folder ``path`` (None if it has none), the verdict decided again
    from the saved values: for runs whose model cannot be run here (a Network's run, read without its
    forward pass). A run that loads with its model should be diagnosed with ``ppl.load(path).diagnostics()``."""

    def read(snapshot):
        meta, diagnostics = read_meta(snapshot)
        if diagnostics is None or not meta["has_posterior"]:
            return None
        arrays = snapshot.arrays()
        num_params = sum(int(np.prod(s[2], dtype=np.int64)) for s in meta["sites"])
        flat = _check_array(snapshot.folder, arrays, "flat_draws", (meta["num_chains"], meta["num_draws"], num_params))
        records = _records(snapshot.folder, meta, arrays)
        if meta["model"]["kind"] == "function":  # a plain program's run: judged as a detached load judges it
            draws = _program_draws(snapshot.folder, meta, arrays, flat)
            return rederived_diagnostics(diagnostics, meta, records, flat, snapshot.folder,
                                         measured=_measured_chains(meta, arrays, draws, flat))
        return rederived_diagnostics(diagnostics, meta, records, flat, snapshot.folder, arrays=arrays)

    return with_snapshot(path, read)


def _program_draws(folder: Path, meta: dict, arrays: dict, flat: np.ndarray) -> dict:
    """A plain program's stored (constrained) draws by site, checked against the layout and the flat draws."""
    draws = {}
    finite = np.all(np.isfinite(flat), axis=-1)  # (chain, draw)
    for name, shape, _ in meta["sites"]:
        draws[name] = _check_array(folder, arrays, f"draws/{name}", (meta["num_chains"], meta["num_draws"], *shape))
        # The verdict counts the non-finite flat draws; a constrained copy edited to NaN or inf where
        # they are finite would be shown and summarised beside a verdict that never saw it.
        values = draws[name].reshape(meta["num_chains"], meta["num_draws"], -1)
        if np.any(finite & ~np.all(np.isfinite(values), axis=-1)):
            raise RunError(f"{folder}/{ARRAYS}: array 'draws/{name}' holds non-finite values where the flat draws are "
                           "finite — the file was edited")
    for name, shape in meta["deterministic"]:  # a deterministic site may hold integers or flags
        draws[name] = _check_array(
            folder, arrays, f"draws/{name}", (meta["num_chains"], meta["num_draws"], *shape), kinds="biuf"
        )
    return draws


def _measured_chains(meta: dict, arrays: dict, draws: dict, flat: np.ndarray):
    """The chain checks of a plain program's sampler run, measured again from its stored draws (None
    for other kinds): a detached load cannot run the program, but R-hat and ESS need only the draws."""
    if meta["kind"] != "chains":
        return None
    return measure_chains(method=meta["method"], options=meta["options"], info=_info(meta, arrays), draws=draws,
                          latent=tuple(name for name, _, _ in meta["sites"]),
                          function_sites=tuple(meta["function_sites"]), flat_draws=flat)


def rederived_diagnostics(record: dict, meta: dict, records: dict, flat: np.ndarray, folder: Path, measured=None,
                          arrays: dict | None = None):
    """The saved diagnostics of a run that cannot be recomputed here, with the verdict decided again
    from the saved values and from what the stored draws measure (``measured``; see :mod:`ppl.io.verdict`)."""
    if (record["method"], record["num_chains"], record["num_draws"]) != (meta["method"], meta["num_chains"], meta["num_draws"]):
        raise RunError(
            f"{folder}/{DIAGNOSTICS}: describes a {record['method']} run of {record['num_chains']} chain(s) × "
            f"{record['num_draws']} draws, but {META} a {meta['method']} run of {meta['num_chains']} × {meta['num_draws']} "
            "— the file was edited or belongs to another run"
        )
    heldout_targets = None
    if arrays is not None and ("heldout/X" in arrays or "heldout/y" in arrays):
        if "heldout/X" not in arrays or "heldout/y" not in arrays:
            raise RunError(f"{folder}/{ARRAYS}: held-out rows are saved without their "
                           f"{'targets' if 'heldout/X' in arrays else 'inputs'} — the file was edited")
        heldout_targets = int(np.size(_check_array(folder, arrays, "heldout/y", kinds="biuf")))
    return rederive(_diagnostics_from(record, folder), kind=meta["kind"], records=records, flat_draws=flat,
                    where=f"{folder}/{DIAGNOSTICS}", measured=measured, heldout_targets=heldout_targets)


def _check_array(folder: Path, arrays: dict, key: str, shape=None, *, kinds="f") -> np.ndarray:
    if key not in arrays:
        raise RunError(f"{folder}/{ARRAYS}: array {key!r} is missing — the file was edited or belongs to another run")
    value = arrays[key]
    if value.dtype.kind not in kinds:
        raise RunError(f"{folder}/{ARRAYS}: array {key!r} has dtype {value.dtype}; expected {'float' if kinds == 'f' else kinds}")
    if shape is not None and tuple(value.shape) != tuple(shape):
        raise RunError(f"{folder}/{ARRAYS}: array {key!r} has shape {list(value.shape)}; expected {list(shape)}")
    return value


def _resume_state(meta: dict, arrays: dict, folder: Path):
    record = meta.get("resume")
    if record is None:
        return None
    leaves = [_check_array(folder, arrays, f"state/{i}", kinds="biuf") for i in range(record["num_leaves"])]
    extra = {k[len("resume/"):]: v for k, v in arrays.items() if k.startswith("resume/")}
    return ResumeState(record["kind"], record["progress"], leaves, extra)


def _static_kwargs(meta: dict) -> dict:
    return {k: tuple(v) if was_tuple and isinstance(v, list) else v for k, v, was_tuple in meta["static_kwargs"]}


def _import_program(record: dict, folder: Path):
    try:
        obj = importlib.import_module(record["module"])
        for part in record["qualname"].split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError, TypeError, ValueError) as error:
        raise RunError(
            f"{folder}: the run's program {record.get('module')}.{record.get('qualname')} cannot be imported "
            f"({error}); pass it instead: ppl.load(path, model=fn)"
        ) from None
    if not callable(obj):
        raise RunError(f"{folder}: {record['module']}.{record['qualname']} is not callable")
    return obj


def load_run(path, *, model=None, trust: bool = False, extra: str | None = None):
    """(Posterior or None, ResumeState or None, meta) of a run folder. See :func:`load`. With ``extra``
    (a file name), a fourth item: that file's parsed JSON from the same snapshot, or None if absent."""
    if not isinstance(path, (str, os.PathLike)):
        raise RunError(f"a run folder is a path (str or pathlib.Path), got {type(path).__name__}")

    def read(snapshot):
        loaded = _load_from(snapshot, model, trust)
        if extra is None:
            return loaded
        return (*loaded, snapshot.json(extra) if snapshot.has(extra) else None)

    return with_snapshot(path, read)


def _given_network(model, record: dict, data, folder, tuned: bool = False):
    """The Network a run was fitted with, as the caller passed it back (``model=``), checked against
    the saved record: a Network's apply function is code, which loading never imports or calls by name.

    A run whose prior (and σ) were tuned by the evidence (``tuned``) was fitted on the caller's
    network with those values: they are taken from the record (plain numbers and a prior record,
    each validated as it is rebuilt), and the rest must match."""
    fields = record.get("fields") if isinstance(record.get("fields"), dict) else {}
    if model is None:
        raise RunError(
            f"{folder}: a run of a Network (apply function {fields.get('apply_fn', '?')}), whose forward pass is code that "
            "ppl never imports from a file; load it with model= the same model built again: the CNN(...), "
            "Network.from_flax(module, ...), Network.from_equinox(module, ...) or Network(apply_fn, template, ...) "
            "it was fitted with"
        )
    try:
        given = model.bind(*data) if hasattr(model, "bind") else model
    except (ValueError, TypeError, DataError) as error:
        raise RunError(f"{folder}: the model given does not take the saved data ({error})") from None
    if not isinstance(given, Network):
        raise RunError(f"{folder}: this run is of a Network; model= must be a Network or a CNN, got {type(model).__name__}")
    if tuned:
        given = _network_with_prior_of(given, fields, folder)
    mine = given.to_config()["fields"]
    legacy = f"ppl.models.network.{type(given.apply_fn).__name__}"
    if fields.get("apply_fn") == legacy and getattr(given.apply_fn, "origin", None):
        # runs saved before adapters recorded the module's class named only the adapter
        fields = {**fields, "apply_fn": mine["apply_fn"]}
    differ = [f"{key}: saved {fields.get(key)!r}, given {mine.get(key)!r}" for key in sorted(set(fields) | set(mine))
              if _plain(fields.get(key)) != _plain(mine.get(key))]
    if differ:
        raise RunError(f"{folder}: the model given is not the Network this run was fitted with — " + "; ".join(differ))
    return given


def _network_with_prior_of(network, fields: dict, folder):
    """``network`` with the prior, prior scale and noise scale a saved record's ``fields`` give
    (each rebuilt from plain data and validated by the Network itself)."""
    try:
        prior = fields.get("prior")
        return dataclasses.replace(
            network, prior=None if prior is None else prior_from_record(prior),
            prior_scale=fields.get("prior_scale", network.prior_scale),
            noise_scale=fields.get("noise_scale", network.noise_scale),
        )
    except (ValueError, TypeError, OptionError) as error:
        raise RunError(f"{folder}: the saved prior or noise scale of the Network is not valid ({error})") from None


def _plain(value):
    """``value`` as it reads back from JSON (tuples become lists), for comparing records."""
    return json.loads(json.dumps(jsonable(value)))


def _declared_num_params(model, X) -> int:
    """How many parameters a declarative model has on inputs X, from its configuration alone.

    Checked against the saved layout before the model is run: a configuration edited to huge
    widths is refused without allocating anything.
    """
    total = sum(layer.fan_in * layer.fan_out + (layer.fan_out if layer.bias else 0) for layer in model.layers(X.shape[-1]))
    noise = (model.num_outputs if model.multi_output else 1) if model.likelihood == "gaussian" and model.noise_scale is None else 0
    return total + noise


_COUNTS = {
    "status": ("steps_done", "chains_done"), "trace": ("kl_warmup", "grad_norm", "loss_noise"),
    "chain_stats": ("max_tree_depth", "leapfrog_cap", "variance_inflation", "temperature"),
}


def _records(folder: Path, meta: dict, arrays: dict) -> dict:
    """The typed run records, each field checked against its declared type; arrays of chain
    statistics must match the draws' (chain, draw) layout."""
    schema, records = Schema(folder, META), {}
    chains, draws = meta["num_chains"], meta["num_draws"]
    for name in RECORDS:
        prefix = f"records/{name}/"
        parts = {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}
        if meta["records"][name] is None:
            if parts:
                raise RunError(f"{folder}/{ARRAYS}: arrays {sorted(parts)} belong to the absent record {name!r}")
            records[name] = None
            continue
        record = from_saved(name, meta["records"][name], parts, schema.fail)
        for field in _COUNTS.get(name, ()):
            value = getattr(record, field)
            if value is not None and value < 0:
                raise schema.fail(f"records.{name}.{field}", "a non-negative count", value)
        if name == "evidence" and record.closed_form and meta["method"] != "exact":
            # a closed form makes constant log p − log q read as a perfect fit: only exact has one
            raise schema.fail("records.evidence.closed_form", "false for a method without a closed form", True)
        for field, value in parts.items():
            if name == "trace":  # losses: (steps,), or (members, steps)
                fits, wanted = value.ndim in (1, 2), "a 1-D or 2-D array"
            else:  # chain statistics: per transition (chain, draw) or per chain
                shapes = ((chains,),) if field == "step_size" else ((chains, draws), (chains,))
                fits, wanted = tuple(value.shape) in shapes, f"shape {' or '.join(str(list(s)) for s in shapes)}"
            if not fits:
                raise RunError(f"{folder}/{ARRAYS}: array 'records/{name}/{field}' has shape {list(value.shape)}; expected {wanted}")
        records[name] = record
    return records


def _load_from(snapshot: Snapshot, model, trust: bool):
    folder = snapshot.folder
    meta, diagnostics = read_meta(snapshot)
    arrays = snapshot.arrays()
    resume = _resume_state(meta, arrays, folder)
    if not meta["has_posterior"]:
        return None, resume, meta
    record = meta["model"]
    sites = meta["sites"]
    # Python ints: an int64 product of edited shapes wraps round (2**32 × 2**32 is 0) or overflows.
    num_params = sum(math.prod(s[2]) for s in sites)
    flat = _check_array(folder, arrays, "flat_draws", (meta["num_chains"], meta["num_draws"], num_params))
    if record["kind"] == "declarative" and record.get("class") == "Network":
        X = _check_array(folder, arrays, "data/X")
        data = (X, _check_array(folder, arrays, "data/y", kinds="biuf"))
        # only a method that can replace the prior (its model_options) may bring one of its own
        tunes = "prior_precision" in getattr(registry.get(meta["method"]), "model_options", ())
        model = _given_network(model, record, data, folder, tuned=tunes and "prior_precision" in meta.get("info", {}))
    elif record["kind"] == "declarative":
        if model is not None:
            raise RunError(f"{folder}: this run's model is a declarative {record.get('class')}; load it without model=")
        X = _check_array(folder, arrays, "data/X")
        try:
            model = from_config(record)
        except (ValueError, TypeError, KeyError, DataError) as error:
            raise RunError(f"{folder}/{META}: the model configuration is invalid ({error})") from None
        # a model of inputs alone (a VAE) says how many global parameters it has; a supervised one binds to y
        unsupervised = not isinstance(model, SupervisedModel)
        data = X if unsupervised else (X, _check_array(folder, arrays, "data/y", kinds="biuf"))
        try:
            if X.ndim != 2:
                declared = -1
            elif unsupervised:
                declared = model.num_global_params(X.shape[1])
            else:
                declared = _declared_num_params(model.bind(*data), X)
        except (ValueError, TypeError, KeyError, DataError) as error:
            raise RunError(f"{folder}/{META}: the model configuration is invalid ({error})") from None
        if declared != num_params:
            raise RunError(
                f"{folder}/{META}: the model configuration describes {declared} parameters on the saved data, but "
                f"the saved draws have {num_params} — the file was edited"
            )
    else:
        data = {k[len("data/"):]: v for k, v in arrays.items() if k.startswith("data/")}
        if model is None and trust:
            model = _import_program(record, folder)
        if model is None:
            draws = _program_draws(folder, meta, arrays, flat)
            records = _records(folder, meta, arrays)
            # The saved approximation needs no program to be checked: draws edited apart from it (shifted,
            # swapped for another run's) are refused as on an attached load.
            _stored_approximation(folder, meta, arrays, flat, num_params, flat.dtype)
            measured = None if diagnostics is None else _measured_chains(meta, arrays, draws, flat)
            return Posterior.detached(
                method=meta["method"], kind=meta["kind"], draws=draws, records=records,
                info=_info(meta, arrays), options=meta["options"],
                seed=meta["seed"], wall_time_s=meta["wall_time_s"],
                # without the program nothing can be recomputed: the saved values are judged again
                diagnostics=None if diagnostics is None else rederived_diagnostics(diagnostics, meta, records, flat, folder,
                                                                                   measured=measured),
                program=f"{record['module']}.{record['qualname']}", folder=str(folder),
                sampler=meta["kind"] in ("chains", "members"), provenance=meta["provenance"],
                deterministic_sites=tuple(name for name, _ in meta["deterministic"]),
                function_sites=tuple(meta["function_sites"]), declared_by=registry.get(meta["method"]),
            ), resume, meta
        if not callable(model):
            raise RunError(f"model= must be the NumPyro program the run was fitted with, got {type(model).__name__}")
        data.update(_static_kwargs(meta))
    try:
        problem = compile_problem(model, data, temperature=meta["temperature"], tempering=meta["tempering"])
    except (ValueError, TypeError) as error:
        raise RunError(f"{folder}: the saved data do not fit the model ({error})") from None
    layout = [[s.name, list(s.shape), list(s.unconstrained_shape)] for s in problem.sites]
    if layout != sites:
        raise RunError(
            f"{folder}: the program's latent sites {[s[0] for s in layout]} (shapes {[s[1] for s in layout]}) differ from "
            f"the saved run's {[s[0] for s in sites]} (shapes {[s[1] for s in sites]}); pass the program it was fitted with"
        )
    deterministic = [[s.name, list(s.shape)] for s in problem.deterministic_sites]
    if deterministic != meta["deterministic"]:
        raise RunError(
            f"{folder}: the program's deterministic sites {deterministic} differ from the saved run's "
            f"{meta['deterministic']}; pass the program it was fitted with"
        )
    if meta["function_sites"]:
        # Checked against the saved deterministic sites, which the program has just been shown to have.
        spec = dataclasses.replace(problem.spec, function_sites=tuple(meta["function_sites"]))
        problem = Problem(spec, problem.data, problem.temperature)
    family = _stored_approximation(folder, meta, arrays, flat, num_params, problem.init_params.dtype)
    posterior = Posterior(
        method=meta["method"], kind=meta["kind"], problem=problem, flat_draws=flat.astype(problem.init_params.dtype, copy=False),
        **_records(folder, meta, arrays), info=_info(meta, arrays), approximation=family,
        record=RunRecord(
            seed=meta["seed"], options=meta["options"], wall_time_s=meta["wall_time_s"],
            fingerprint=meta.get("fingerprint"), provenance=_replacement_from_records(meta, problem.model, folder),
        ),
        resume_state=resume,
        local_guide=_local_guide(folder, problem, meta, arrays) if problem.local_sites else None,
        declared_by=registry.get(meta["method"]),
    )
    posterior = _remeasure(posterior, meta["seed"])
    if "heldout/X" in arrays or "heldout/y" in arrays:
        posterior = _with_saved_heldout(posterior, arrays, folder)
    # diagnostics.json is never read back into the run: diagnostics() recomputes them from the draws
    return posterior, resume, meta


def _remeasure(posterior, seed):
    """The method measures again what it measured at the draws and its verdict reads (SG-MCMC's
    temperature), with the run's own key when the seed is saved: no stored number decides a verdict."""
    key = as_key(0 if seed is None else seed if isinstance(seed, int) else jnp.asarray(seed, dtype=jnp.uint32))
    return registry.get(posterior.method).remeasure(posterior, key)


def _with_saved_heldout(posterior, arrays: dict, folder: Path):
    """The saved held-out rows, checked as new held-out data would be (the verdict is recomputed
    from them; a run saved with them cannot lose them unnoticed)."""
    if "heldout/X" not in arrays or "heldout/y" not in arrays:
        raise RunError(f"{folder}/{ARRAYS}: held-out rows are saved without their {'targets' if 'heldout/X' in arrays else 'inputs'}"
                       " — the file was edited")
    X = _check_array(folder, arrays, "heldout/X")
    y = _check_array(folder, arrays, "heldout/y", kinds="biuf")
    try:
        return posterior.with_heldout(X, y)
    except (ValueError, TypeError, DataError) as error:
        raise RunError(f"{folder}/{ARRAYS}: the saved held-out rows do not fit the model ({error})") from None


def _replacement_from_records(meta: dict, used, folder: Path) -> dict:
    """The saved provenance, with what says whether an option replaced part of the declared model
    derived again from the records that decide it — the model fitted against the model in the
    fingerprint (what the user declared) — never read from the provenance's own words."""
    provenance = {k: v for k, v in meta["provenance"].items() if k not in ("declared_model", "replaced", "replaced_by")}
    declared_record = (meta.get("fingerprint") or {}).get("model")
    if not isinstance(declared_record, dict) or _plain(declared_record) == _plain(meta["model"]):
        return provenance
    try:
        if declared_record.get("class") == "Network" and isinstance(used, Network):
            # the code is the caller's; what an option replaced (the prior, σ) is plain data in the record
            fields = declared_record.get("fields") if isinstance(declared_record.get("fields"), dict) else {}
            declared = _network_with_prior_of(used, fields, folder)
        else:
            declared = from_config(declared_record)
    except (ValueError, TypeError, KeyError) as error:
        raise RunError(f"{folder}/{META}: the fingerprint's model configuration is invalid ({error})") from None
    method = registry.get(meta["method"])
    named = [f"{k}={meta['options'][k]!r}" for k in method.model_options if meta["options"].get(k) is not None]
    if not named:
        raise RunError(f"{folder}/{META}: the model fitted differs from the one declared, but no option of "
                       f"{meta['method']} replaces part of a model — the file was edited")
    provenance.update(model=describe_model(used), declared_model=describe_model(declared), replaced_by=", ".join(named),
                      replaced=model_difference(declared, used) or describe_model(used))
    return provenance


def _stored_approximation(folder: Path, meta: dict, arrays: dict, flat: np.ndarray, num_params: int, dtype):
    """The saved approximation q (None where the run has none), rebuilt with every array checked, and
    the stored draws checked to be draws of it (in ``dtype``, the precision the run computes in)."""
    if meta["approximation"] is None:
        return None
    parts = {k[len("approximation/"):]: v for k, v in arrays.items() if k.startswith("approximation/")}
    try:
        family = from_arrays(meta["approximation"], parts, dim=num_params)
    except (ValueError, TypeError, KeyError) as error:
        raise RunError(f"{folder}/{ARRAYS}: the saved approximation is invalid ({error})") from None
    mismatch = stored_draws_mismatch(family, flat.astype(dtype, copy=False))
    if mismatch is not None:
        raise RunError(f"{folder}/{ARRAYS}: array 'flat_draws' does not hold draws of the saved approximation "
                       f"({mismatch}) — the file was edited or mixes two runs")
    return family


def _local_guide(folder, problem, meta: dict, arrays: dict):
    """The amortised guide of a model with local latents: structure from the (checked) method options
    and model, numbers from ``local/encoder`` (its size must match exactly)."""
    try:
        guide = registry.create(meta["method"], meta["options"]).guide_object(problem)
    except Exception as error:  # noqa: BLE001 — any failure here is a bad file
        raise RunError(f"{folder}/{META}: the saved options do not describe a guide ({error})") from None
    template = jax.eval_shape(lambda: guide.local.init(jax.random.PRNGKey(0), problem.init_params.dtype))
    zeros = jax.tree_util.tree_map(lambda leaf: np.zeros(leaf.shape, leaf.dtype), template)
    flat, unravel = ravel_pytree(zeros)
    saved = _check_array(folder, arrays, "local/encoder", tuple(flat.shape))
    if not np.all(np.isfinite(saved)):
        raise RunError(f"{folder}/{ARRAYS}: array 'local/encoder' holds non-finite values")
    return guide, unravel(saved.astype(flat.dtype, copy=False))


def _info(meta: dict, arrays: dict) -> dict:
    info = dict(meta["info"])
    info.update({k[len("info/"):]: v for k, v in arrays.items() if k.startswith("info/")})
    return info


def load(path, *, model=None, trust: bool = False):
    """Load a run written by ``Posterior.save`` or ``ppl fit``; it predicts and diagnoses like the original.

    Nothing named in the folder is imported or called. A run of a declarative model loads complete.
    A run of a plain NumPyro program loads *detached* — draws, diagnostics and metadata — unless
    the program is passed back (``model=fn``, checked against the saved site layout) or
    ``trust=True`` asks to import it by the recorded name (only for folders you wrote yourself).
    Any corrupt, truncated, edited or partial folder raises one :class:`ppl.RunError` naming the file.
    """
    return load_with(path, None, model=model, trust=trust)[0]


def load_with(path, extra: str | None, *, model=None, trust: bool = False):
    """(the posterior as :func:`load` gives it, the parsed JSON of the run's file ``extra`` or None
    where the run has no such file), both read from one snapshot of the folder."""
    loaded = load_run(path, model=model, trust=trust, extra=extra)
    posterior, meta = loaded[0], loaded[2]
    if posterior is None:
        progress = (meta.get("resume") or {}).get("progress")
        raise RunError(
            f"{path}: this folder holds a checkpoint with no draws yet (progress {progress}); continue it with "
            "ppl.fit(..., resume=path) or `ppl fit --resume DIR`"
        )
    return posterior, (loaded[3] if extra is not None else None)
