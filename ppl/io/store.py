"""Run folders: writing them (``Posterior.save(path)``, checkpoints) and reading their files checked.

Building a Posterior back from a folder (``ppl.load``) is ``ppl.io.load``, above the Posterior; this
module sits below it and below the checkpoints, which write through it.

A run folder holds

* ``posterior.json`` — method, options, seed, the model's configuration, temperature, the site
  layout, scalar ``info``, the run's status and fingerprint (what resuming must match);
* ``arrays.npz`` — flat unconstrained draws, constrained draws (plain programs), the training data,
  the fitted approximation, array-valued ``info``, and the state to resume from (partial runs);
* ``diagnostics.json`` — the diagnostics as measured at save time (a load recomputes them from the
  draws; only a detached run, whose model cannot run, shows them, with the verdict decided again);
* optional extra files (the CLI's ``summary.json``);
* ``manifest.json`` — written last: the format version and the size and SHA-256 of every file.

**Committed as one unit.** Everything is written into a fresh hidden folder beside the target and
renamed into place; an existing run is first renamed aside and removed only after the new one is
in place. A reader therefore sees the old run or the new one, never a mixture. A lock file beside
the folder keeps a second writer out, and a folder that is not a ppl run is never written into.

**The checksums guard against accidents, not against someone who can write the folder** (who can
recompute them): what a load believes rests on the checks that the stored arrays are what the run
claims (method, kind, layout, draws of the stored approximation) and on recomputing the verdict.

**Loading never runs code the files name.** JSON and ``.npz`` (``allow_pickle=False``) only;
every value read is checked against the schema below (types, shapes, dtypes, sizes, checksums)
and any mismatch is one :class:`ppl.RunError` naming the folder and the file. Declarative models
are rebuilt from a closed list of classes. A plain NumPyro program is never imported: the run
loads *detached* (draws, diagnostics, metadata), and ``ppl.load(path, model=fn)`` re-attaches the
program (checked against the saved site layout). ``trust=True`` imports it by its recorded name,
for folders the caller wrote themselves.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import hashlib
import io
import json
import math
import os
import platform
import re
import shutil
import stat
import sys
import tempfile
import time
import zipfile
from importlib import metadata
from pathlib import Path
from typing import NamedTuple

import numpy as np
from jax.flatten_util import ravel_pytree

from ppl.core import registry
from ppl.core.errors import RunError
from ppl.core.records import RECORDS, to_saved
__all__ = ["RunTarget", "save_run", "save_posterior", "read_run_meta", "read_run_files", "run_lock", "fingerprint"]

FORMAT = "ppl-run"
FORMAT_VERSION = 3  # 3: typed run records (status, trace, chain_stats, evidence) apart from info
MANIFEST = "manifest.json"
META = "posterior.json"
ARRAYS = "arrays.npz"
DIAGNOSTICS = "diagnostics.json"
MAX_JSON_BYTES = 64 * 2**20
STATUSES = ("complete", "interrupted", "checkpoint", "failed")


# -- writing --------------------------------------------------------------------------------------
class RunTarget(NamedTuple):
    """Where checkpoints go: a run folder, plus extra JSON files saved with every checkpoint."""

    path: Path
    extra_files: dict


try:
    import fcntl
except ImportError:  # not a POSIX system: no advisory lock, one writer is then the caller's duty
    fcntl = None

_HELD: dict = {}


@contextlib.contextmanager
def run_lock(path):
    """Hold the writer's lock of run folder ``path`` (re-entrant within this process).

    The lock is an ``flock`` on ``.<name>.lock`` beside the folder, so it dies with the process that
    held it (a killed writer never leaves a stale lock). A second writer gets a :class:`RunError`.
    """
    # the resolved path: a symlinked folder and its target are one folder with one lock
    path = Path(os.path.realpath(path))
    key = str(path)
    if key in _HELD:
        _HELD[key][1] += 1
        try:
            yield
        finally:
            _HELD[key][1] -= 1
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(path.parent / f".{path.name}.lock", "a+")
    try:
        if fcntl is not None:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        raise RunError(
            f"{path}: another ppl process is writing this run folder right now; wait for it to finish or "
            "choose another output folder"
        ) from None
    _HELD[key] = [handle, 1]
    try:
        yield
    finally:
        _HELD[key][1] -= 1
        if _HELD[key][1] == 0:
            del _HELD[key]
            if fcntl is not None:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
            handle.close()


def check_writable_run(path: Path) -> None:
    """Refuse to write into something that is not (or not yet) a ppl run folder.

    A folder is replaced only when it is empty, or a ppl run (a valid manifest) holding nothing
    but the files its manifest lists: files ppl did not write are never deleted.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise RunError(f"{path} is an existing file, not a run folder; choose another path")
    if not path.is_dir():
        return
    try:
        present = set(os.listdir(path))
    except OSError as error:
        raise RunError(f"{path}: cannot be listed ({error.strerror})") from None
    if not present:
        return
    try:
        with open_snapshot(path) as snapshot:
            listed = set(snapshot.manifest["files"]) | {MANIFEST}
    except RunError:
        raise RunError(
            f"{path} exists and is not a ppl run folder (no valid {MANIFEST}); ppl will not write into it — choose "
            "another path"
        ) from None
    foreign = sorted(present - listed)
    if foreign:
        raise RunError(
            f"{path} holds files that are not part of its run ({', '.join(foreign[:5])}); ppl will not replace the "
            "folder and delete them — move them, or choose another path"
        )


COMPARISON_MANIFEST = "ppl-comparison.json"
COMPARISON_FORMAT = "ppl-comparison"


def comparison_entries(path: Path) -> tuple[str, list] | None:
    """(status, the entries ppl wrote) of the comparison folder ``path``, or None where ``path`` is
    absent or empty. Anything else — a ppl run, a folder without ppl's comparison manifest, or one
    holding entries the manifest does not list — is a :class:`RunError`: ppl replaces only what it
    can prove it wrote."""
    if path.exists() and not path.is_dir():
        raise RunError(f"{path} is an existing file, not a comparison folder; choose another path")
    try:
        present = set(os.listdir(path)) if path.is_dir() else set()
    except OSError as error:
        raise RunError(f"{path}: cannot be listed ({error.strerror})") from None
    if not present:
        return None
    if MANIFEST in present:
        raise RunError(f"{path} holds a ppl run (its {MANIFEST}), not a comparison; ppl compare will not replace it — "
                       "choose another folder")
    try:
        record = json.loads((path / COMPARISON_MANIFEST).read_bytes()[:MAX_JSON_BYTES])
        entries, status = record["entries"], record["status"]
        valid = (record.get("format") == COMPARISON_FORMAT and status in ("unfinished", "complete")
                 and isinstance(entries, list) and all(isinstance(e, str) and _PLAIN_NAME.fullmatch(e) for e in entries))
    except (OSError, ValueError, KeyError, TypeError):
        valid = False
    if not valid:
        raise RunError(f"{path} exists and is not a ppl comparison (no valid {COMPARISON_MANIFEST}); ppl will not "
                       "write into it — choose another folder")
    foreign = sorted(present - set(entries) - {COMPARISON_MANIFEST})
    if foreign:
        raise RunError(f"{path} holds files that ppl did not write ({', '.join(foreign[:5])}); ppl will not replace the "
                       "folder and delete them — move them, or choose another folder")
    return status, entries


def write_comparison_manifest(path: Path, status: str, entries) -> None:
    """Record (atomically) that ppl wrote ``entries`` of comparison folder ``path``."""
    record = {"format": COMPARISON_FORMAT, "format_version": 1, "status": status, "entries": sorted(entries)}
    staged = path / f".{COMPARISON_MANIFEST}.new"
    staged.write_bytes(_dump(record))
    os.replace(staged, path / COMPARISON_MANIFEST)


def remove_comparison(path: Path) -> None:
    """Delete the comparison folder ``path`` (checked by :func:`comparison_entries`): only the entries
    its manifest lists, each run folder among its fits only if it is a ppl run, then the folder."""
    found = comparison_entries(path)
    if found is None:
        return
    entries = [path / name for name in found[1]]
    for entry in entries:  # everything is checked before anything is deleted
        if entry.is_dir() and not entry.is_symlink():
            for child in entry.iterdir():
                if _STAGING.fullmatch(child.name):
                    continue  # a lock, or what a killed save left staged
                if not child.is_dir() or child.is_symlink():
                    raise RunError(f"{child} was not written by ppl; ppl will not delete it — move it, or choose another folder")
                check_writable_run(child)  # a ppl run holding nothing but its own files, or refused
    for entry in entries:
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        elif entry.exists() or entry.is_symlink():
            entry.unlink()
    (path / COMPARISON_MANIFEST).unlink()
    path.rmdir()


# what ppl leaves beside a run folder: its lock, and a save staged by a process killed mid-write
_STAGING = re.compile(r"\.[^/]+(\.lock|\.new-\w+|\.old-\w+)")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(2**20), b""):
            digest.update(block)
    return digest.hexdigest()


def _dump(obj) -> bytes:
    return json.dumps(jsonable(obj), indent=2, allow_nan=False).encode()


def save_run(
    path, posterior, *, resume_state=None, fingerprint=None, status=None, extra_files=None, with_diagnostics=True
) -> None:
    """Write a run folder as one unit: a posterior (or None for a state-only checkpoint), the state to
    resume from, the fingerprint resuming must match, and extra JSON files (name -> object)."""

    def write(staging: Path) -> None:
        meta, arrays, diagnostics = _collect(posterior, resume_state, fingerprint, status, with_diagnostics)
        with open(staging / ARRAYS, "wb") as handle:
            np.savez(handle, **arrays)
        (staging / META).write_bytes(_dump(meta))
        if diagnostics is not None:
            (staging / DIAGNOSTICS).write_bytes(_dump(diagnostics))
        for name, obj in (extra_files or {}).items():
            _check_extra_name(name)
            (staging / name).write_bytes(obj if isinstance(obj, bytes) else _dump(obj))

    _write_run(Path(path), write, "the fitted result is still in memory", "call save again")


def add_run_files(path, files: dict) -> None:
    """Add files to a saved run (or replace them), as one unit: ``files`` maps a name to bytes (a
    figure) or to an object saved as JSON. The run's other files are copied unchanged after checking
    them against its manifest, and the new ones join the manifest, so a reader sees the run with
    all of them or none, and a later write into the run (``ppl calibrate``) keeps them."""
    for name in files:
        _check_extra_name(name)
    path = Path(path)

    def write(staging: Path) -> None:
        with open_snapshot(path) as snapshot:
            if not snapshot.json(META).get("has_posterior"):
                raise RunError(f"{path}: this folder holds a checkpoint with no draws yet; finish the run first")
            for existing in snapshot.manifest["files"]:
                if existing not in files:
                    (staging / existing).write_bytes(snapshot.file(existing))
        for name, obj in files.items():
            (staging / name).write_bytes(obj if isinstance(obj, bytes) else _dump(obj))

    _write_run(path, write, f"the run is unchanged and {', '.join(files)} {'was' if len(files) == 1 else 'were'} not written",
               "try again")


def _check_extra_name(name: str) -> None:
    if name in (MANIFEST, META, ARRAYS, DIAGNOSTICS) or "/" in name:
        raise ValueError(f"extra run file name {name!r} is reserved or not a plain file name")


def _write_run(path: Path, write, kept: str, retry: str) -> None:
    """Stage a run folder beside ``path`` (``write(staging)`` puts its files there), add the manifest
    and swap it into place under the run's lock. ``kept`` and ``retry`` finish the error messages."""
    if path.is_symlink():
        # Save into the folder the link names (the link itself stays, and shares the lock).
        path = Path(os.path.realpath(path))
    with run_lock(path):
        check_writable_run(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise RunError(f"{path}: cannot create its parent folder ({error.strerror}); {kept}") from None
        for stale in path.parent.glob(f".{path.name}.new-*"):
            # Under the lock no other writer is staging: these were left by a killed process.
            shutil.rmtree(stale, ignore_errors=True)
        try:
            staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.new-", dir=path.parent))
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(staging, 0o777 & ~umask)  # a run folder gets the usual permissions, not mkdtemp's 0700
        except OSError as error:
            raise RunError(f"{path}: cannot write beside it ({error.strerror}); {kept}") from None
        try:
            write(staging)
            files = {
                p.name: {"bytes": p.stat().st_size, "sha256": _sha256(p)} for p in sorted(staging.iterdir())
            }
            manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "files": files}
            (staging / MANIFEST).write_bytes(_dump(manifest))
            for p in staging.iterdir():
                with open(p, "rb") as handle:
                    os.fsync(handle.fileno())
            _swap_into_place(staging, path)
        except OSError as error:
            shutil.rmtree(staging, ignore_errors=True)
            advice = "free space (or choose another folder)" if error.errno in (errno.ENOSPC, errno.EDQUOT) else "fix that"
            raise RunError(
                f"{path}: could not write the run ({error.strerror or error}); nothing was changed on disk and "
                f"{kept} — {advice} and {retry}"
            ) from error
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux ``renameat2(RENAME_EXCHANGE)``); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    result = renameat2(at_fdcwd, os.fsencode(str(a)), at_fdcwd, os.fsencode(str(b)), rename_exchange)
    if result == 0:
        return True
    if ctypes.get_errno() in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()), str(b))


def _swap_into_place(staging: Path, path: Path) -> None:
    """Put the staged folder at ``path``: a reader sees the old run or the new one, never a mix.

    Replacing an existing run swaps the two folders in one atomic step where the system can, so
    there is no moment without a run at ``path``; elsewhere the old run is renamed aside first (a
    crash in between leaves it at ``.<name>.old-*``, which ``ppl.load`` points to).
    """
    if not path.exists():
        os.rename(staging, path)
        return
    if _exchange(staging, path):
        shutil.rmtree(staging, ignore_errors=True)  # now holds the old run
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
    os.rmdir(aside)
    os.rename(path, aside)
    os.rename(staging, path)
    shutil.rmtree(aside, ignore_errors=True)


def save_posterior(posterior, path, *, extra_files=None, with_diagnostics=True) -> None:
    status = "complete"
    if posterior.status.failed:
        status = "failed"
    elif posterior.status.interrupted:
        status = "interrupted"
    save_run(
        path, posterior, resume_state=posterior.resume_state, fingerprint=posterior.fingerprint,
        status=status, extra_files=extra_files, with_diagnostics=with_diagnostics,
    )


def package_versions() -> dict:
    """Versions of Python and of the packages a run's numbers depend on."""
    versions = {"python": platform.python_version()}
    for name in ("ppl", "jax", "jaxlib", "numpyro", "optax", "blackjax", "arviz", "numpy"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def describe_model(model) -> str:
    """The model with all its settings, as a user would write it, or the program's dotted name."""
    if hasattr(model, "to_config"):
        return repr(model)
    return f"program {getattr(model, '__module__', '?')}.{getattr(model, '__qualname__', '?')}"


def provenance(problem, fitted=None, method=None) -> dict:
    """What ran, for the output and the saved run: the model with its settings, the number of
    data rows (the command line adds their source), the package versions.

    ``fitted``: the Problem the method's result is the posterior of. Where a method's option
    replaced part of the declared model (Laplace's ``prior_precision``), ``model`` is the model
    actually used, ``declared_model`` the one declared and ``replaced_by`` the options: nobody
    should read the run as the declared model's posterior."""
    record = {"model": describe_model(problem.model), "data": {"rows": problem.num_data}, "versions": package_versions()}
    used = None if fitted is None or fitted.model is None else describe_model(fitted.model)
    if used is not None and used != record["model"]:
        options = method.as_dict() if method is not None else {}
        named = [f"{k}={options[k]!r}" for k in getattr(method, "model_options", ()) if options.get(k) is not None]
        record.update(model=used, declared_model=record["model"], replaced_by=", ".join(named) or "the method's options",
                      replaced=model_difference(problem.model, fitted.model) or used)
    return record


def model_difference(declared, used) -> str | None:
    """The settings in which model ``used`` differs from ``declared``, as 'field=used (declared: …)'."""
    if type(declared) is not type(used) or not dataclasses.is_dataclass(declared):
        return None
    changed = [f"{f.name}={getattr(used, f.name)!r} (declared: {getattr(declared, f.name)!r})"
               for f in dataclasses.fields(declared) if getattr(declared, f.name) != getattr(used, f.name)]
    return ", ".join(changed) or None


def not_importable(model) -> str | None:
    """Why a plain program could not be imported again by its recorded name, or None if it can.

    Answered from the modules already imported (nothing is imported here): the recorded
    module and qualified name must lead back to this very function, and neither may be one that
    another process would resolve to something else (``__main__``, a notebook cell, a function
    defined inside another function, a lambda).
    """
    module, qualname = getattr(model, "__module__", None), getattr(model, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        return f"a {type(model).__name__} has no module-level name"
    if module == "__main__":
        return "it is defined in __main__ (a script run directly, or a notebook), which another process does not have"
    if "<lambda>" in qualname:
        return "it is a lambda"
    if "<locals>" in qualname:
        return "it is defined inside a function"
    obj = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if obj is not model:
        return f"{module}.{qualname} does not lead back to it (it was redefined, wrapped or renamed)"
    return None


def model_record(model) -> dict:
    if hasattr(model, "to_config"):
        return {"kind": "declarative", **model.to_config()}
    module, name = getattr(model, "__module__", None), getattr(model, "__qualname__", None)
    return {"kind": "function", "module": str(module), "qualname": str(name)}


def jsonable(value):
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return {"float": "nan" if value != value else ("inf" if value > 0 else "-inf")}
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return None


def unjson(value):
    if isinstance(value, dict):
        if set(value) == {"float"} and value["float"] in ("nan", "inf", "-inf"):
            return float(value["float"])
        return {k: unjson(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unjson(v) for v in value]
    return value


def fingerprint(problem, method_obj, seed_record) -> dict:
    """What a resumed run must share with the run that wrote its checkpoint."""
    digest = hashlib.sha256()
    data = problem.data_kind.named(problem.data)
    for name in sorted(data):
        array = np.ascontiguousarray(np.asarray(data[name]))
        digest.update(f"{name}:{array.dtype.str}:{array.shape}".encode())
        digest.update(array.tobytes())
    digest.update(json.dumps(jsonable(problem.spec.static_kwargs)).encode())
    return jsonable({
        "method": method_obj.name,
        "options": method_obj.as_dict(),
        "seed": seed_record,
        "model": model_record(problem.model),
        "data_sha256": digest.hexdigest(),
        "temperature": float(problem.temperature),
        "tempering": problem.tempering,
    })


def _collect(posterior, resume_state, fingerprint, status, with_diagnostics=True):
    arrays, diagnostics = {}, None
    meta = {
        "status": status or "complete",
        "fingerprint": fingerprint,
        "has_posterior": posterior is not None,
        "resume": None,
    }
    if resume_state is not None:
        meta["resume"] = {"kind": resume_state.kind, "progress": resume_state.progress, "num_leaves": len(resume_state.leaves)}
        for i, leaf in enumerate(resume_state.leaves):
            arrays[f"state/{i}"] = np.asarray(leaf)
        for key, value in resume_state.arrays.items():
            arrays[f"resume/{key}"] = np.asarray(value)
    if posterior is None:
        return meta, arrays, None
    problem = posterior.problem
    records = {}
    for name in RECORDS:
        value = getattr(posterior, name)
        if value is None:
            records[name] = None
            continue
        records[name], parts = to_saved(name, value)
        arrays.update({f"records/{name}/{field}": array for field, array in parts.items()})
    scalars = {}
    for key, value in posterior.info.items():
        if isinstance(value, np.ndarray) or (hasattr(value, "__array__") and not np.isscalar(value)):
            arrays[f"info/{key}"] = np.asarray(value)
        else:
            scalars[key] = jsonable(value)
    arrays["flat_draws"] = np.asarray(posterior.flat_draws)
    for key, value in problem.data_kind.named(problem.data).items():
        arrays[f"data/{key}"] = np.asarray(value)
    if getattr(posterior, "heldout", None) is not None:
        # the rows the verdict's held-out check predicts: a load recomputes the check from them
        arrays["heldout/X"], arrays["heldout/y"] = (np.asarray(a) for a in posterior.heldout)
    if not problem.data_kind.declarative:
        # A plain program's draws are saved constrained too: a detached load cannot constrain them.
        for name, value in posterior.draws.items():
            arrays[f"draws/{name}"] = np.asarray(value)
    if getattr(posterior, "local_guide", None) is not None:
        arrays["local/encoder"] = np.asarray(ravel_pytree(posterior.local_guide[1])[0])
    family = posterior.approximation
    if family is not None:
        for key, value in family.arrays().items():
            arrays[f"approximation/{key}"] = np.asarray(value)
    meta.update({
        "method": posterior.method,
        "kind": posterior.kind,
        "options": posterior.options,
        "seed": posterior.seed,
        "wall_time_s": posterior.wall_time_s,
        "records": records,
        "info": scalars,
        "model": model_record(problem.model),
        "static_kwargs": [[k, v, isinstance(v, tuple)] for k, v in problem.spec.static_kwargs],
        "temperature": float(problem.temperature),
        "tempering": problem.tempering,
        "approximation": None if family is None else family.kind,
        "provenance": jsonable(posterior.provenance),
        "sites": [[s.name, list(s.shape), list(s.unconstrained_shape)] for s in problem.sites],
        "deterministic": [[s.name, list(s.shape)] for s in problem.deterministic_sites],
        "function_sites": list(problem.function_sites),
        "num_chains": posterior.num_chains,
        "num_draws": posterior.num_draws,
    })
    if status != "checkpoint" and with_diagnostics:
        try:
            diagnostics = posterior.diagnostics().to_dict()
        except Exception as error:  # never lose a fitted result because a diagnostic failed
            meta["diagnostics_error"] = f"{type(error).__name__}: {error}"
    return meta, arrays, diagnostics


# -- reading --------------------------------------------------------------------------------------
class Schema:
    """Checks JSON values read from a run folder, with errors naming the file and the field."""

    def __init__(self, folder: Path, filename: str):
        self.where = f"{folder}/{filename}"

    def fail(self, field: str, wanted: str, value) -> RunError:
        shown = repr(value)
        shown = shown if len(shown) < 80 else shown[:77] + "..."
        return RunError(f"{self.where}: field {field!r} must be {wanted}, got {shown} — the file was edited or corrupted")

    def get(self, obj: dict, field: str, kinds, wanted: str, *, optional: bool = False):
        if field not in obj:
            if optional:
                return None
            raise RunError(f"{self.where}: field {field!r} is missing — the file was edited or corrupted")
        value = obj[field]
        if value is None and optional:
            return None
        if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
            raise self.fail(field, wanted, value)
        if not isinstance(value, kinds):
            raise self.fail(field, wanted, value)
        return value

    def scalar_tree(self, field: str, value, depth: int = 0):
        """A JSON value made only of scalars, lists and string-keyed dicts (no deeper than 6)."""
        if depth > 6:
            raise self.fail(field, "a shallow JSON value", "…")
        if isinstance(value, dict):
            return {str(k): self.scalar_tree(field, v, depth + 1) for k, v in value.items()}
        if isinstance(value, list):
            return [self.scalar_tree(field, v, depth + 1) for v in value]
        if isinstance(value, (str, int, float, bool)) or value is None:
            return value
        raise self.fail(field, "JSON scalars and lists", value)


class Snapshot:
    """The files of one run folder, read once each through one directory handle and checked
    against the folder's manifest: every byte parsed is a byte whose checksum was verified.

    Reading through a handle on the directory (``openat``) means a save that swaps a new run into
    place while we read cannot mix the two: we keep reading the folder we opened. Files are opened
    without following symlinks and must be regular files, so nothing outside the folder is read.
    """

    def __init__(self, folder: Path):
        self.folder = folder
        try:
            self.fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            leftovers = sorted(folder.parent.glob(f".{folder.name}.old-*")) if folder.parent.is_dir() else []
            if leftovers:
                raise RunError(
                    f"{folder} is missing, but a save over it was cut short: the previous run is intact at "
                    f"{leftovers[-1]}; rename it back to {folder.name}"
                ) from None
            raise RunError(f"{folder} does not exist; a saved run is a folder written by Posterior.save or ppl fit") from None
        except NotADirectoryError:
            raise RunError(f"{folder} is not a folder; a saved run is a folder written by Posterior.save or ppl fit") from None
        except OSError as error:
            raise RunError(f"{folder}: cannot be opened ({error.strerror})") from None
        self._verified: dict = {}
        try:
            self.manifest = self._read_manifest()
        except BaseException:
            self.close()
            raise

    def _replaced(self) -> bool:
        """Whether the folder we opened is no longer the one at its path (a save swapped it out)."""
        try:
            now = os.stat(self.folder, follow_symlinks=False)
        except OSError:
            return True
        opened = os.fstat(self.fd)
        return (now.st_dev, now.st_ino) != (opened.st_dev, opened.st_ino)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _raw(self, name: str, limit: int | None = None) -> bytes:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=self.fd)
        except FileNotFoundError:
            raise _Vanished(f"{self.folder}/{name} is missing — the run folder is incomplete") from None
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise RunError(f"{self.folder}/{name} is a symbolic link; a run folder holds only its own files") from None
            raise RunError(f"{self.folder}/{name}: cannot be read ({error.strerror})") from None
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise RunError(f"{self.folder}/{name} is not a regular file")
            if limit is not None and info.st_size > limit:
                raise RunError(f"{self.folder}/{name}: {info.st_size} bytes is too large for a run's {name}")
            return handle.read()

    def _read_manifest(self) -> dict:
        folder = self.folder
        try:
            raw = self._raw(MANIFEST, MAX_JSON_BYTES)
        except _Vanished:
            if self._replaced():
                # a save swapped a new run in and is deleting the folder we opened: read again
                raise
            try:
                os.stat(META, dir_fd=self.fd, follow_symlinks=False)
                old = True
            except OSError:
                old = False
            if old:
                raise RunError(
                    f"{folder}: {MANIFEST} is missing — the run was written by an older ppl (format 1), or its save "
                    "was interrupted before it was committed; re-fit it with this version"
                ) from None
            raise RunError(f"{folder} is not a saved ppl run (no {MANIFEST}); save one with post.save(path)") from None
        manifest = _parse_json(raw, folder, MANIFEST)
        schema = Schema(folder, MANIFEST)
        if not isinstance(manifest, dict):
            raise schema.fail("(top level)", "an object", manifest)
        if manifest.get("format") != FORMAT:
            raise schema.fail("format", repr(FORMAT), manifest.get("format"))
        version = manifest.get("format_version")
        if version != FORMAT_VERSION:
            raise RunError(
                f"{folder}/{MANIFEST}: run format version {version!r}, but this ppl reads version {FORMAT_VERSION}; "
                "load it with the ppl version that wrote it, or re-fit"
            )
        files = schema.get(manifest, "files", dict, "an object of file records")
        for required in (META, ARRAYS):
            if required not in files:
                raise RunError(f"{folder}/{MANIFEST}: does not list {required} — the folder is not a complete run")
        for name, record in files.items():
            if not _PLAIN_NAME.fullmatch(name) or name == MANIFEST:
                raise schema.fail("files", "plain file names", name)
            if not isinstance(record, dict):
                raise schema.fail(f"files.{name}", "an object", record)
            size = schema.get(record, "bytes", int, "a byte count")
            if size < 0:
                raise schema.fail(f"files.{name}.bytes", "a byte count", size)
            schema.get(record, "sha256", str, "a hex digest")
        return manifest

    def file(self, name: str) -> bytes:
        """The bytes of a file the manifest lists, after checking their size and checksum."""
        if name in self._verified:
            return self._verified[name]
        record = self.manifest["files"].get(name)
        if record is None:
            raise RunError(f"{self.folder}/{MANIFEST}: does not list {name}")
        raw = self._raw(name, record["bytes"])
        if len(raw) != record["bytes"]:
            raise RunError(
                f"{self.folder}/{name}: {len(raw)} bytes, but the manifest says {record['bytes']} — the file was "
                "truncated or replaced"
            )
        if hashlib.sha256(raw).hexdigest() != record["sha256"]:
            raise RunError(f"{self.folder}/{name}: its checksum does not match the manifest — the file was edited or corrupted")
        self._verified[name] = raw
        return raw

    def has(self, name: str) -> bool:
        return name in self.manifest["files"]

    def json(self, name: str):
        return _parse_json(self.file(name), self.folder, name)

    def arrays(self) -> dict:
        return _parse_arrays(self.file(ARRAYS), self.folder)


class _Vanished(RunError):
    """A file listed or expected is not there (possibly a save replaced the folder meanwhile)."""


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_<>][A-Za-z0-9_<>]*){0,20}")
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")
_SITE_NAME = re.compile(r"[A-Za-z_][\w.-]{0,99}")  # what a draws/<name> member of arrays.npz can hold
# The members a run's arrays.npz may hold (np.savez adds ".npy"); anything else is refused unread.
_ARRAY_NAME = re.compile(
    r"(flat_draws|data/[A-Za-z_]\w{0,99}|heldout/[Xy]|draws/[A-Za-z_][\w.-]{0,99}|approximation/[a-z_][a-z0-9_]{0,47}|"
    r"info/[A-Za-z_][\w.-]{0,99}|records/[a-z_]{1,20}/[a-z_]{1,40}|state/\d{1,6}|resume/[A-Za-z_][\w./-]{0,99}|local/encoder)\.npy"
)


def _parse_json(raw: bytes, folder: Path, name: str):
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError, ValueError) as error:
        reason = "nested too deeply" if isinstance(error, RecursionError) else str(error)[:200]
        raise RunError(f"{folder}/{name}: not valid JSON ({reason}) — the file was truncated or edited") from None


def _parse_arrays(raw: bytes, folder: Path) -> dict:
    """The arrays of a verified arrays.npz, each member checked before a byte of it is allocated:
    a known name, stored uncompressed (so the file's size bounds the memory), a plain numeric
    dtype, and a header whose shape matches the member's size."""
    where = f"{folder}/{ARRAYS}"
    arrays = {}
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as archive:
            for member in archive.infolist():
                if not _ARRAY_NAME.fullmatch(member.filename):
                    raise RunError(f"{where}: unexpected member {member.filename[:100]!r}; a run never stores it")
                if member.compress_type != zipfile.ZIP_STORED or member.file_size != member.compress_size:
                    raise RunError(f"{where}: member {member.filename!r} is compressed; a run stores arrays as they are")
                with archive.open(member) as handle:
                    version = np.lib.format.read_magic(handle)
                    if version == (1, 0):
                        shape, fortran, dtype = np.lib.format.read_array_header_1_0(handle)
                    elif version == (2, 0):
                        shape, fortran, dtype = np.lib.format.read_array_header_2_0(handle)
                    else:
                        raise RunError(f"{where}: member {member.filename!r} has an unknown array format {version}")
                    if dtype.kind not in "biuf" or dtype.hasobject or (dtype.kind == "f" and dtype.itemsize not in (4, 8)):
                        # ppl computes in float32 or float64 only: a float16 draw was never written by it
                        raise RunError(f"{where}: array {member.filename!r} has dtype {dtype}, which a run never stores")
                    count = math.prod(shape)
                    if count * dtype.itemsize != member.file_size - handle.tell():
                        raise RunError(
                            f"{where}: array {member.filename!r} declares shape {list(shape)} but holds "
                            f"{member.file_size - handle.tell()} bytes — the file was edited"
                        )
                    data = handle.read()
                array = np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C").copy()
                arrays[member.filename[: -len(".npy")]] = array
    except RunError:
        raise
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError, TypeError, SyntaxError) as error:
        raise RunError(f"{where}: cannot be read as saved arrays ({str(error)[:200]}) — the file was truncated or edited") from None
    return arrays


def open_snapshot(path) -> Snapshot:
    return Snapshot(Path(path))


def with_snapshot(path, read):
    """``read(snapshot)``, retried when a concurrent save replaced the folder while it was read.

    A save swaps the new run in and then deletes the old one's files; a reader holding the old folder
    sees them vanish. Under load a reader can lose that race several times in a row, so it retries
    with a growing pause (about 1.3 s in all) before reporting the folder incomplete.
    """
    attempts = 12
    for attempt in range(attempts):
        snapshot = None
        try:
            snapshot = open_snapshot(path)  # its manifest too can vanish under a save
            return read(snapshot)
        except _Vanished:
            if attempt == attempts - 1:
                raise
        finally:
            if snapshot is not None:
                snapshot.close()
        time.sleep(0.02 * attempt)


def read_run_meta(path) -> tuple[dict, dict | None, dict]:
    """(checked posterior.json, diagnostics record or None, manifest) of a run folder; imports nothing."""
    return with_snapshot(path, lambda snapshot: (*read_meta(snapshot), snapshot.manifest))


def read_run_files(path, extras: tuple = ()) -> tuple[dict, dict | None, dict]:
    """(checked posterior.json, diagnostics record or None, {name: parsed JSON} of the ``extras`` the
    manifest lists), all from one consistent snapshot of the folder, after checking the size and
    checksum of every file it lists; imports nothing."""

    def read(snapshot):
        for name in snapshot.manifest["files"]:
            snapshot.file(name)
        meta, diagnostics = read_meta(snapshot)
        return meta, diagnostics, {name: snapshot.json(name) for name in extras if snapshot.has(name)}

    return with_snapshot(path, read)


# Types of the info entries that diagnostics read (others are kept as they are).
# Types of every Diagnostics field, as read back from diagnostics.json.
_NUMBER = (int, float, type(None))
_DIAGNOSTIC_TYPES = {
    "method": str, "num_chains": int, "num_draws": int, "rhat_max": _NUMBER, "rhat_function_max": _NUMBER,
    "ess_bulk_min": _NUMBER, "ess_tail_min": _NUMBER, "divergences": (int, type(None)),
    "tree_depth_hits": (int, type(None)), "ebfmi_min": _NUMBER, "khat": _NUMBER, "khat_threshold": _NUMBER, "dispersion_min": _NUMBER, "psis_mean_shift": _NUMBER, "psis_sd_ratio": _NUMBER,
    "loo_khat_max": _NUMBER, "loo_khat_bad": (int, type(None)), "elpd_loo": _NUMBER, "elpd_loo_se": _NUMBER,
    "elpd_loo_pointwise": (list, type(None)), "elbo": _NUMBER, "iwae": _NUMBER, "log_evidence": _NUMBER,
    "wall_time_s": _NUMBER, "heldout_rows": (int, type(None)), "heldout_ll": _NUMBER, "heldout_baseline_ll": _NUMBER,
    "heldout_coverage_90": _NUMBER, "target": (str, type(None)), "warnings": list, "ok": bool, "notes": dict, "checks": list,
}
_CHECK_TYPES = {"field": (str,), "value": (int, float, bool, str, type(None)), "threshold": (int, float, type(None)),
                "passed": (bool,), "message": (str,)}



def read_meta(snapshot: Snapshot) -> tuple[dict, dict | None]:
    folder = snapshot.folder
    meta = snapshot.json(META)
    schema = Schema(folder, META)
    if not isinstance(meta, dict):
        raise schema.fail("(top level)", "an object", meta)
    meta = unjson(meta)
    status = schema.get(meta, "status", str, "a status")
    if status not in STATUSES:
        raise schema.fail("status", f"one of {STATUSES}", status)
    schema.get(meta, "has_posterior", bool, "true or false")
    if meta.get("fingerprint") is not None:
        schema.scalar_tree("fingerprint", schema.get(meta, "fingerprint", dict, "an object"))
    resume = schema.get(meta, "resume", dict, "an object", optional=True)
    if resume is not None:
        kind = schema.get(resume, "kind", str, "a loop kind")
        if kind not in ("optimize", "mcmc", "chains"):
            raise schema.fail("resume.kind", "'optimize', 'mcmc' or 'chains'", kind)
        schema.scalar_tree("resume.progress", schema.get(resume, "progress", dict, "an object"))
        leaves = schema.get(resume, "num_leaves", int, "a count")
        if not 0 <= leaves <= 100_000:
            raise schema.fail("resume.num_leaves", "a count", leaves)
    if meta["has_posterior"]:
        if schema.get(meta, "method", str, "a method name") not in registry.METHODS:
            # the method decides which kinds of posterior and which checks the run can have
            raise schema.fail("method", f"a registered method ({', '.join(registry.METHODS)})", meta["method"])
        schema.scalar_tree("options", schema.get(meta, "options", dict, "an object"))
        seed = schema.get(meta, "seed", (int, list), "an int or a key", optional=True)
        if isinstance(seed, list) and not (len(seed) == 2 and all(isinstance(v, int) and 0 <= v < 2**32 for v in seed)):
            raise schema.fail("seed", "an int or two 32-bit ints", seed)
        if isinstance(seed, int) and not 0 <= seed < 2**32:
            raise schema.fail("seed", "an int in [0, 2**32)", seed)
        wall = schema.get(meta, "wall_time_s", (int, float), "a non-negative number of seconds")
        if not (math.isfinite(wall) and wall >= 0):
            raise schema.fail("wall_time_s", "a non-negative number of seconds", wall)
        schema.scalar_tree("info", schema.get(meta, "info", dict, "an object"))
        schema.scalar_tree("provenance", schema.get(meta, "provenance", dict, "an object"))
        records = schema.scalar_tree("records", schema.get(meta, "records", dict, "an object"))
        if set(records) != set(RECORDS):
            raise schema.fail("records", f"an object with exactly the fields {sorted(RECORDS)}", sorted(records))
        if not isinstance(records["status"], dict):
            raise schema.fail("records.status", "an object", records["status"])
        for name, value in records.items():
            if value is not None and not isinstance(value, dict):
                raise schema.fail(f"records.{name}", "an object or null", value)
        model = schema.get(meta, "model", dict, "an object")
        schema.scalar_tree("model", model)
        if model.get("kind") not in ("declarative", "function"):
            raise schema.fail("model.kind", "'declarative' or 'function'", model.get("kind"))
        if model["kind"] == "function":
            for field in ("module", "qualname"):
                if not isinstance(model.get(field), str) or not _DOTTED.fullmatch(model[field]):
                    raise schema.fail(f"model.{field}", "a dotted Python name", model.get(field))
        for item in schema.get(meta, "static_kwargs", list, "a list"):
            if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str) and isinstance(item[2], bool)):
                raise schema.fail("static_kwargs", "[name, value, was_tuple] triples", item)
            schema.scalar_tree("static_kwargs", item[1])
        temperature = schema.get(meta, "temperature", (int, float), "a positive number")
        if not (math.isfinite(temperature) and temperature > 0):
            raise schema.fail("temperature", "a positive finite number", temperature)
        if schema.get(meta, "tempering", str, "a tempering mode") not in ("likelihood", "cold"):
            raise schema.fail("tempering", "'likelihood' or 'cold'", meta["tempering"])
        schema.get(meta, "approximation", str, "a family kind", optional=True)
        kind = schema.get(meta, "kind", str, "a posterior kind")
        allowed = _kinds_allowed(meta["method"], meta["approximation"], meta["options"], model)
        if kind not in allowed:
            # The kind decides which checks the diagnostics make: one edited to skip them (a sampler's
            # run relabelled "point" would skip R-hat) is refused, not believed.
            raise schema.fail(
                "kind", f"one of {', '.join(allowed) or '(none: the method and the approximation disagree)'} for method "
                f"{meta['method']!r} with approximation {meta['approximation']!r}", kind,
            )
        sites = schema.get(meta, "sites", list, "a list of sites")
        for site in sites:
            if not (
                isinstance(site, list) and len(site) == 3 and isinstance(site[0], str)
                and all(isinstance(s, list) and all(isinstance(d, int) and d >= 0 for d in s) for s in site[1:])
            ):
                raise schema.fail("sites", "[name, shape, unconstrained shape] triples", site)
        latent = {site[0] for site in sites}
        deterministic = schema.get(meta, "deterministic", list, "a list of deterministic sites")
        for site in deterministic:
            if not (
                isinstance(site, list) and len(site) == 2 and isinstance(site[0], str) and _SITE_NAME.fullmatch(site[0])
                and isinstance(site[1], list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in site[1])
            ):
                raise schema.fail("deterministic", "[name, shape] pairs", site)
        names = [site[0] for site in deterministic]
        if len(set(names)) != len(names) or latent & set(names):
            raise schema.fail("deterministic", "pairs with names unique among all sites", names)
        if meta["model"]["kind"] == "declarative" and deterministic:
            raise schema.fail("deterministic", "empty for a declarative model", names)
        function_sites = schema.get(meta, "function_sites", list, "a list of deterministic site names")
        if not all(isinstance(name, str) for name in function_sites) or len(set(function_sites)) != len(function_sites) \
                or not set(function_sites) <= set(names):
            # Function sites decide which R-hat judges convergence: names that are not deterministic
            # sites of the run would make a reloaded run diagnose differently.
            raise schema.fail("function_sites", f"distinct names among the deterministic sites {names}", function_sites)
        for field in ("num_chains", "num_draws"):
            if schema.get(meta, field, int, "a positive count") < 1:
                raise schema.fail(field, "a positive count", meta[field])
        claimed = _layout_of_options(kind, meta["options"])
        finished = status == "complete" and not records["status"].get("interrupted") and not records["status"].get("failed")
        held = (meta["num_chains"], meta["num_draws"])
        # a sampler that extends its run until its checks pass ends with a multiple of num_samples
        extended = (kind == "chains" and claimed is not None and bool(meta["options"].get("time_budget"))
                    and held[0] == claimed[0] and held[1] % claimed[1] == 0)
        if finished and claimed is not None and claimed != held and not extended:
            raise schema.fail(
                "num_chains/num_draws", f"{claimed[0]} chain(s) × {claimed[1]} draws (or a multiple of the draws, when "
                "time_budget let the run extend), as the run's options ask of a finished run", list(held),
            )
    diagnostics = None
    if snapshot.has(DIAGNOSTICS):
        diagnostics = snapshot.json(DIAGNOSTICS)
        check = Schema(folder, DIAGNOSTICS)
        if not isinstance(diagnostics, dict):
            raise check.fail("(top level)", "an object", diagnostics)
        diagnostics = unjson(check.scalar_tree("(record)", diagnostics))
        unknown = sorted(set(diagnostics) - set(_DIAGNOSTIC_TYPES))
        if unknown:
            raise check.fail("(fields)", "Diagnostics fields only", unknown)
        # runs saved before pointwise LOO values were kept have none
        diagnostics.setdefault("elpd_loo_pointwise", None)
        diagnostics.setdefault("target", None)  # runs saved before replaced models were recorded
        for field in ("heldout_rows", "heldout_ll", "heldout_baseline_ll", "heldout_coverage_90", "dispersion_min",
                      "psis_mean_shift", "psis_sd_ratio"):
            diagnostics.setdefault(field, None)  # runs saved before the held-out check
        for field, kinds in _DIAGNOSTIC_TYPES.items():
            value = diagnostics.get(field)
            allowed = kinds if isinstance(kinds, tuple) else (kinds,)
            if field not in diagnostics or not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
                raise check.fail(field, f"of type {'/'.join(k.__name__ for k in allowed)}", value)
        pointwise = diagnostics["elpd_loo_pointwise"]
        if pointwise is not None and not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in pointwise):
            raise check.fail("elpd_loo_pointwise", "a list of numbers", pointwise[:5])
        if not all(isinstance(w, str) for w in diagnostics["warnings"]):
            raise check.fail("warnings", "a list of strings", diagnostics["warnings"])
        if not all(isinstance(v, str) for v in diagnostics["notes"].values()):
            raise check.fail("notes", "an object of strings", diagnostics["notes"])
        for item in diagnostics["checks"]:
            if not (isinstance(item, dict) and set(item) == set(_CHECK_TYPES) and all(
                    isinstance(item[k], kinds) and (bool in kinds or not isinstance(item[k], bool))
                    for k, kinds in _CHECK_TYPES.items())):
                raise check.fail("checks", "a list of {field, value, threshold, passed, message} objects", item)
        for field in ("num_chains", "num_draws", "divergences", "tree_depth_hits", "loo_khat_bad", "wall_time_s",
                      "heldout_rows"):
            # counts and seconds are never negative (nor NaN): a detached run would show them as they are
            if diagnostics[field] is not None and not diagnostics[field] >= 0:
                raise check.fail(field, "a non-negative number", diagnostics[field])
        # ok is the conjunction of the checks: a file that says otherwise was edited
        if diagnostics["ok"] != all(item["passed"] for item in diagnostics["checks"]):
            raise check.fail("ok", "the conjunction of the checks' passed flags", diagnostics["ok"])
    return meta, diagnostics


def _kinds_allowed(method: str, family: str | None, options: dict, model: dict) -> tuple:
    """The posterior kinds a run of registered ``method`` with ``options`` and a saved approximation
    of kind ``family`` can have: what the approximation admits, narrowed to what the method declares
    for those options and that model (``Method.saved_kinds``: a point only where the method gives
    one, as MAP, or SVI with a point-mass guide)."""
    if family is None:
        by_family = ("chains", "members")
    elif family == "point":
        by_family = ("point",)
    else:
        by_family = ("mixture",) if family.startswith("mixture:") else ("independent",)
    fields = model.get("fields") if isinstance(model.get("fields"), dict) else {}
    declared = set(registry.get(method).saved_kinds(options, fields))
    return tuple(k for k in by_family if k in declared)


def _layout_of_options(kind: str, options: dict) -> tuple | None:
    """(chains, draws) that a finished run of posterior ``kind`` with ``options`` holds (None where the
    options do not say)."""
    if kind == "point":
        return 1, 1
    if kind in ("independent", "mixture") and isinstance(options.get("num_draws"), int):
        return 1, options["num_draws"]
    if kind == "members" and isinstance(options.get("num_members"), int):
        return options["num_members"], 1
    if kind == "chains" and isinstance(options.get("num_chains"), int) and isinstance(options.get("num_samples"), int):
        return options["num_chains"], options["num_samples"]
    return None


# Record fields that count something (steps, chains, tree depths) or measure a size: never negative.
