"""Property (issue #28, item 12): a saved run, edited and resealed, is refused or loads consistently.

Anyone who can write a run folder can edit its files and recompute its manifest (``reseal``), so
the checksums prove nothing about who wrote the numbers. Loading must then either refuse the folder
with one :class:`ppl.RunError`, or give a posterior whose verdict is the one its stored contents
support. "Consistent" is judged by an oracle that does not trust the loader's own bookkeeping:

1. ``post.diagnostics()`` equals a fresh computation — ``compute_diagnostics(post)`` called directly
   for a run whose model is rebuilt; for a plain program loaded detached (it cannot be run) the
   saved record re-derived again, through the loader's other path to it (``saved_diagnostics``, what
   ``ppl show`` uses for a Network's run) and by ``rederive`` applied to the loaded verdict;
2. an edit that touched only ``diagnostics.json`` leaves the verdict (``ok`` and every check's
   ``passed``) as the untampered run's: that file is a record, never a source of judgement;
3. ``ok=True`` never comes with non-finite draws, a posterior kind the method cannot produce, or
   draws that ``stored_draws_mismatch`` rejects as not drawn from the stored approximation (read
   from the files by the test, so a detached load is held to it too).

Runs: one of every registered method on the conjugate linear model (a new method is enrolled
automatically), plus a VAE, an SVI flow guide, and Laplace (last layer), MoLA, an ensemble, SWAG
and MultiSWAG on a tiny BNN, and plain NumPyro programs loaded detached and re-attached. Edits: the
cases the issue names, each saved check edited in turn, and edits drawn from a seeded numpy
generator (deterministic: a failure names an edit that reproduces).
"""

from __future__ import annotations

import dataclasses
import io
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

from ppl.core import registry
from ppl.core.gaussian import stored_draws_mismatch
from ppl.diagnostics import compute_diagnostics
from ppl.models import BNN, VAE, LinearRegression
import ppl

from conftest import NOISE, PRIOR

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
from make_malicious_run import reseal  # noqa: E402  (what anyone who can write the folder can do)

META, ARRAYS, DIAGNOSTICS = "posterior.json", "arrays.npz", "diagnostics.json"
KINDS = ("point", "independent", "mixture", "chains", "members")

# Budgets that keep each linear fit to about a second; the verdicts they give (chains too short to
# pass R-hat and ESS, q's k-hat failing) are wanted: a failing check is what an edit would flip.
LINEAR_OPTIONS = {
    "exact": dict(num_draws=100),
    "map": dict(steps=50, optimizer="adam"),  # compiles fastest; L-BFGS runs in ensemble and the pre-trainings
    "nuts": dict(num_warmup=50, num_samples=50, num_chains=2),
    "hmc": dict(num_warmup=50, num_samples=50, num_chains=2),
    "svi": dict(steps=50, num_draws=100, num_particles=1, init="prior"),
    "laplace": dict(steps=200, num_draws=100, subset="all"),
    "mola": dict(steps=200, num_draws=100, num_members=2),
    "ensemble": dict(steps=200, num_members=2),
    "swag": dict(steps=100, swag_steps=40, collect_every=10, rank=3, num_draws=100),
    "multiswag": dict(steps=100, swag_steps=40, collect_every=10, rank=3, num_draws=100, num_members=2),
    "sgld": dict(num_warmup=100, num_samples=50, num_chains=2),
    "sghmc": dict(num_warmup=100, num_samples=50, num_chains=2),
    "cyclical_sgld": dict(num_samples=50, num_chains=2, num_cycles=2),
    "mh": dict(num_warmup=100, num_samples=50, num_chains=2),
}
BNN_OPTIONS = {
    # the full last-layer Hessian: KFAC's Kronecker factors are covered by the linear run (its "auto")
    "laplace": dict(steps=100, num_draws=100, subset="last_layer", hessian="full", prior_precision=1.0),
    "mola": dict(steps=150, num_draws=100, num_members=2, rank=3),
    "ensemble": dict(steps=150, num_members=2),
    "swag": dict(steps=100, swag_steps=40, collect_every=10, rank=3, num_draws=100),
    "multiswag": dict(steps=100, swag_steps=40, collect_every=10, rank=3, num_draws=100, num_members=2),
}


def program(y):
    """A plain NumPyro program with a constrained site (its saved draws differ from the flat ones)
    and a function site, so a detached load has both kinds of draws and function-space checks."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    numpyro.deterministic("f", 2.0 * mu)
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, sigma), obs=y)


@dataclasses.dataclass
class Run:
    name: str
    folder: Path
    model: object = None  # passed back as model= (a plain program re-attached); None: load as saved
    baseline: object = None  # the untampered run's diagnostics, as loading gives them

    @property
    def detached(self) -> bool:
        return json.loads((self.folder / META).read_text())["model"]["kind"] == "function" and self.model is None


FAST = ("exact", "map", "svi")


def _fits():
    """(name, thunk) of every run: every registered method, then the networks, VAE and programs."""
    linear = ppl.datasets.load("linear", seed=0).train
    lm = LinearRegression(prior_scale=PRIOR, noise_scale=NOISE)
    for method in sorted(registry.METHODS):
        # a method registered without a budget here runs with its defaults: slower, never skipped
        yield method, lambda m=method: ppl.fit(lm, linear, method=m, seed=0, **LINEAR_OPTIONS.get(m, {}))
    yield "svi flow", lambda: ppl.fit(lm, linear, method="svi", seed=0, guide="flow", steps=100, num_draws=100,
                                      num_particles=1, num_flows=1, init="prior")
    moons = ppl.datasets.load("two_moons", seed=0).train
    net = BNN(hidden=(4,), likelihood="bernoulli")
    for method, options in BNN_OPTIONS.items():
        yield f"bnn {method}", lambda m=method, o=options: ppl.fit(net, moons, method=m, seed=0, **o)
    digits = np.asarray(ppl.datasets.load("digits_binary", seed=0).train.X)[:100]
    vae = VAE(latent_dim=2, hidden=(8,))
    yield "vae svi", lambda: ppl.fit(vae, digits, method="svi", seed=0, steps=50)
    # Two program runs whose verdict passes (so ok=True must survive the oracle's third rule) and two
    # that fail (so an edit that made a failing check pass would show).
    y = np.random.default_rng(0).normal(0.5, 1.0, size=100)
    yield "program nuts", lambda: ppl.fit(program, {"y": y}, method="nuts", seed=0, num_warmup=100, num_samples=200,
                                          num_chains=2, function_sites=("f",))
    yield "program laplace", lambda: ppl.fit(program, {"y": y}, method="laplace", seed=0, steps=300, num_draws=100)
    yield "program nuts short", lambda: ppl.fit(program, {"y": y[:20]}, method="nuts", seed=0, num_warmup=50,
                                                num_samples=50, num_chains=2, function_sites=("f",))
    yield "program svi", lambda: ppl.fit(program, {"y": y[:20]}, method="svi", seed=0, steps=150, num_draws=100,
                                         num_particles=2, init="prior")


def _build(root: Path, fits) -> list:
    """Fit and save every run of ``fits`` under ``root``; a program's run is also loaded re-attached."""
    built = []
    for name, fit in fits:
        folder = root / name.replace(" ", "_")
        fit().save(folder)
        built.append(Run(name, folder))
        if name.startswith("program"):
            # the same folder re-attached to its program: diagnostics recomputed from the draws
            built.append(Run(f"{name} (model=)", folder, model=program))
    for run in built:
        run.baseline = _load(run.folder, run).diagnostics()
    return built


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every run fitted once and saved; each edit works on a copy."""
    return _build(tmp_path_factory.mktemp("runs"), _fits())


@pytest.fixture(scope="module")
def fast_runs(tmp_path_factory):
    """exact, map and svi on the linear model: the default tier's runs."""
    return _build(tmp_path_factory.mktemp("fast"), [(name, fit) for name, fit in _fits() if name in FAST])


def _load(folder, run):
    return ppl.load(folder) if run.model is None else ppl.load(folder, model=run.model)


# -- the run folder as data -------------------------------------------------------------------------
class Files:
    """A run folder's three files, parsed; ``write`` puts back the ones an edit touched, resealed."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.meta = json.loads((folder / META).read_text())
        self.diag = json.loads((folder / DIAGNOSTICS).read_text())
        with np.load(folder / ARRAYS, allow_pickle=False) as npz:
            self.arrays = {k: npz[k] for k in npz.files}
        self.touched: set = set()

    def write(self) -> None:
        for name, obj in ((META, self.meta), (DIAGNOSTICS, self.diag)):
            if name in self.touched:
                # allow_nan: a raw NaN token is what an editor (or json.dumps) writes; json.loads reads it
                (self.folder / name).write_text(json.dumps(obj, indent=1, allow_nan=True))
        if ARRAYS in self.touched:
            buffer = io.BytesIO()
            np.savez(buffer, **self.arrays)
            (self.folder / ARRAYS).write_bytes(buffer.getvalue())
        reseal(self.folder)

    def draw_keys(self) -> list:
        """Every stored copy of the draws: flat, and a plain program's constrained ones."""
        return [k for k in self.arrays if k == "flat_draws" or k.startswith("draws/")]


# -- edits ------------------------------------------------------------------------------------------
OTHER_STRINGS = sorted(registry.METHODS) + list(KINDS) + ["nosuch", "", "delta", "full", "point", "mixture:full:2"]


def _nodes(obj, path=()):
    """Every (path, value) in a JSON tree, containers included."""
    yield path, obj
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from _nodes(value, (*path, key))
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            yield from _nodes(value, (*path, i))


def _set(obj, path, value):
    for key in path[:-1]:
        obj = obj[key]
    obj[path[-1]] = value


def _mutate_json(obj, rng) -> str:
    """One random edit of one node of ``obj`` (in place); returns what it did."""
    nodes = [(p, v) for p, v in _nodes(obj) if p]
    path, value = nodes[rng.integers(len(nodes))]
    where = ".".join(map(str, path))
    if isinstance(value, bool):
        _set(obj, path, not value)
        return f"flip {where}"
    if isinstance(value, (int, float)):
        how = ["negate", "scale", "nan", "inf", "huge", "plus1", "zero", "raw_nan"][rng.integers(8)]
        new = {"negate": -value, "scale": value * 10, "nan": {"float": "nan"}, "inf": {"float": "inf"},
               "huge": 1e300, "plus1": value + 1, "zero": 0 * value, "raw_nan": float("nan")}[how]
        _set(obj, path, new)
        return f"{how} {where}"
    if isinstance(value, str):
        new = OTHER_STRINGS[rng.integers(len(OTHER_STRINGS))]
        _set(obj, path, new)
        return f"{where}={new!r}"
    if value is None:
        new = [0, True, "x", -1.0][rng.integers(4)]
        _set(obj, path, new)
        return f"{where}={new!r}"
    if isinstance(value, dict) and value:
        if set(value) == {"float"}:  # ppl's encoding of a non-finite float: make it finite again
            _set(obj, path, 0.5)
            return f"finite {where}"
        key = list(value)[rng.integers(len(value))]
        del value[key]
        return f"delete {where}.{key}"
    if isinstance(value, list) and value:
        if rng.random() < 0.5:
            _set(obj, path, [])
            return f"empty {where}"
        del value[rng.integers(len(value))]
        return f"drop an item of {where}"
    _set(obj, path, None)
    return f"null {where}"


def _mutate_arrays(arrays: dict, rng) -> str:
    key = sorted(arrays)[rng.integers(len(arrays))]
    a = arrays[key]
    how = ["shift", "scale", "nan", "float16", "drop", "shape", "int"][rng.integers(7)]
    if how in ("shift", "scale", "nan", "float16") and (a.dtype.kind != "f" or a.size == 0):
        how = "drop"
    if how == "shift":
        arrays[key] = a + 0.5
    elif how == "scale":
        arrays[key] = a * 3.0
    elif how == "nan":
        b = a.copy()
        b.reshape(-1)[rng.integers(a.size)] = np.nan
        arrays[key] = b
    elif how == "float16":
        arrays[key] = a.astype(np.float16)
    elif how == "drop":
        del arrays[key]
    elif how == "shape":
        arrays[key] = a.reshape(-1)[:-1] if a.size else np.zeros(1)
    else:
        arrays[key] = a.astype(np.int64) if a.dtype.kind == "f" else a.astype(np.float64) + 0.25
    return f"{how} {key}"


def _random_edit(rng):
    def edit(files: Files) -> str:
        target = [META, DIAGNOSTICS, ARRAYS][rng.integers(3)]
        files.touched.add(target)
        if target == ARRAYS:
            return _mutate_arrays(files.arrays, rng)
        return f"{target}: " + _mutate_json(files.meta if target == META else files.diag, rng)

    return edit


def _all_passed(files: Files) -> str:
    for check in files.diag["checks"]:
        check["passed"], check["message"] = True, ""
    files.diag["ok"], files.diag["warnings"] = True, []
    files.touched.add(DIAGNOSTICS)
    return "every check passed=true, ok=true"


def _no_checks(files: Files) -> str:
    files.diag["checks"], files.diag["ok"] = [], True
    files.touched.add(DIAGNOSTICS)
    return "checks: []"


def _shift_draws(files: Files) -> str:
    for key in files.draw_keys():
        files.arrays[key] = files.arrays[key] + 100.0
    files.touched.add(ARRAYS)
    return "draws +100"


def _nan_point(files: Files) -> str:
    for key in files.draw_keys() + [k for k in files.arrays if k in ("approximation/loc", "approximation/locs")]:
        b = files.arrays[key].astype(float)
        b.reshape(-1)[0] = np.nan
        files.arrays[key] = b
    files.touched.add(ARRAYS)
    return "NaN in the draws and the stored location"


def _relabel(method):
    def edit(files: Files) -> str:
        files.meta["method"] = method
        files.diag["method"] = method
        files.touched |= {META, DIAGNOSTICS}
        return f"method: {method!r}"

    return edit


def _float16_draws(files: Files) -> str:
    for key in files.draw_keys():
        files.arrays[key] = files.arrays[key].astype(np.float16)
    files.touched.add(ARRAYS)
    return "float16 draws"


def _num_draws_off(files: Files) -> str:
    files.meta["num_draws"] += 1
    files.touched.add(META)
    return "num_draws + 1"


def _num_draws_and_options(files: Files) -> str:
    # the layout the options claim moved along with it: only the stored arrays can contradict it
    files.meta["num_draws"] += 1
    for key in ("num_draws", "num_samples"):
        if isinstance(files.meta["options"].get(key), int):
            files.meta["options"][key] += 1
    files.diag["num_draws"] += 1
    files.touched |= {META, DIAGNOSTICS}
    return "num_draws + 1 (options and diagnostics too)"


def _negative_counts(files: Files) -> str:
    status = files.meta["records"]["status"]
    for key in ("steps_done", "chains_done"):
        if isinstance(status.get(key), int):
            status[key] = -status[key] - 1
    files.meta["wall_time_s"] = -1.0
    files.diag["wall_time_s"] = -1.0
    files.touched |= {META, DIAGNOSTICS}
    return "negative step counts and wall times"


def _negative_wall_diag(files: Files) -> str:
    files.diag["wall_time_s"] = -5.0
    files.touched.add(DIAGNOSTICS)
    return "negative wall time in diagnostics.json"


# What a detached load cannot measure again: a density run's k-hat needs log p, so the program. A
# forged k-hat (the check's value and the record's field edited together) is the one edit of
# diagnostics.json it cannot tell from a measurement; re-attaching the program (model=) recomputes it.
NEEDS_THE_MODEL = ("khat",)


def _check_edits(files: Files, detached: bool) -> list:
    """Edits of one saved check each: its value moved onto its threshold (which passes, whichever
    side the threshold bounds) alone and together with the record's field of that name, and the check
    dropped. A verdict re-derived from saved values must notice each, or recompute the value. A run
    loaded with its model never reads the file: there only the failing checks are edited (an edit
    that could turn its verdict, if loading ever read it), to keep the test short."""
    edits = []
    for i, check in enumerate(files.diag["checks"]):
        if not detached and check["passed"]:
            continue
        def on_threshold(files: Files, i=i, mirror=False) -> str:
            check = files.diag["checks"][i]
            if isinstance(check["threshold"], (int, float)):
                check["value"] = check["threshold"]
            elif isinstance(check["value"], bool):
                check["value"] = not check["value"]
            else:
                check["value"] = None if check["value"] else "edited"
            if mirror and check["field"] in files.diag:
                files.diag[check["field"]] = check["value"]
            check["passed"], check["message"] = True, ""
            files.diag["ok"] = all(c["passed"] for c in files.diag["checks"])
            files.touched.add(DIAGNOSTICS)
            return f"check {check['field']} := {check['value']!r}" + (" (record field too)" if mirror else "")

        def drop(files: Files, i=i) -> str:
            field = files.diag["checks"].pop(i)["field"]
            files.diag["ok"] = all(c["passed"] for c in files.diag["checks"])
            files.touched.add(DIAGNOSTICS)
            return f"check {field} dropped"

        edits += [(f"check {check['field']} value", on_threshold), (f"check {check['field']} dropped", drop)]
        if not (detached and check["field"] in NEEDS_THE_MODEL):
            edits.append((f"check {check['field']} value+field", lambda f, e=on_threshold: e(f, mirror=True)))
    return edits


NAMED = {  # the issue's cases, on every run
    "all passed": _all_passed, "checks: []": _no_checks, "draws +100": _shift_draws, "NaN point": _nan_point,
    "method nuts": _relabel("nuts"), "method map": _relabel("map"), "method nosuch": _relabel("nosuch"),
    "float16 draws": _float16_draws, "num_draws off": _num_draws_off, "num_draws all": _num_draws_and_options,
    "negative counts": _negative_counts, "negative wall (diag)": _negative_wall_diag,
}


# -- the oracle ---------------------------------------------------------------------------------------
def _verdict(diag) -> tuple:
    return diag.ok, tuple((c.field, c.passed) for c in diag.checks)


def _same(a, b) -> bool:
    return _verdict(a) == _verdict(b) and set(a.warnings) == set(b.warnings)


def _kinds_of(method: str) -> set:
    """The posterior kinds ``method`` can produce, from the registry (svi: a delta guide's point too)."""
    kinds = {registry.get(method).kind}
    return kinds | {"point"} if method == "svi" else kinds


def _family_kind(family) -> str:
    if family is None:
        return "samples"
    kind = family.kind
    return "point" if kind == "point" else "mixture" if kind.startswith("mixture:") else "independent"


def _stored(folder: Path):
    """(flat draws, the stored approximation or None) as the files hold them, read without the loader."""
    from ppl.core.gaussian import from_arrays

    meta = json.loads((folder / META).read_text())
    with np.load(folder / ARRAYS, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    flat = arrays["flat_draws"]
    if meta["approximation"] is None:
        return flat, None
    parts = {k[len("approximation/"):]: v for k, v in arrays.items() if k.startswith("approximation/")}
    return flat, from_arrays(meta["approximation"], parts, dim=flat.shape[-1])


def _inconsistency(run: Run, post, touched: set) -> str | None:
    """Why the loaded ``post`` of an edited copy of ``run`` is not consistent (None: it is)."""
    got = post.diagnostics()
    if post.problem is not None:
        fresh = compute_diagnostics(post)
        flat, family = np.asarray(post.flat_draws), post.approximation
    else:
        from ppl.io.load import saved_diagnostics
        from ppl.io.verdict import rederive

        try:
            fresh = saved_diagnostics(post._folder)  # the loader's other way to the same record (`ppl show`'s)
        except ppl.RunError as error:
            return f"loads, but saved_diagnostics refuses it: {error}"
        flat, family = _stored(Path(post._folder))
        records = {"status": post.status, "trace": post.trace, "chain_stats": post.chain_stats, "evidence": post.evidence}
        again = rederive(got, kind=post.kind, records=records, flat_draws=flat, where="(oracle)")
        if not _same(again, got):
            return f"deciding the loaded verdict again changes it: {_verdict(got)} -> {_verdict(again)}"
    if not _same(got, fresh):
        return f"diagnostics() {_verdict(got)} differ from a fresh computation {_verdict(fresh)}"
    if touched == {DIAGNOSTICS} and _verdict(got) != _verdict(run.baseline):
        return f"an edit of diagnostics.json alone changed the verdict {_verdict(run.baseline)} -> {_verdict(got)}"
    if got.ok:
        latent = [np.asarray(v) for k, v in post.draws.items() if k not in post.deterministic_sites]
        if not all(np.all(np.isfinite(d)) for d in [flat, *latent]):
            return "ok=True with non-finite draws"
        if post.kind not in _kinds_of(post.method):
            return f"ok=True for a {post.kind!r} posterior of method {post.method!r}"
        if _family_kind(family) not in ({"samples"} if post.kind in ("chains", "members") else {post.kind}):
            return f"ok=True for a {post.kind!r} posterior holding a {_family_kind(family)} approximation"
        if family is not None:
            why = stored_draws_mismatch(family, flat)
            if why is not None:
                return f"ok=True with draws the approximation rejects: {why}"
    return None


def _apply(run: Run, edit, scratch: Path):
    """(outcome, what the edit did, why inconsistent) of one edit on a fresh copy of ``run``."""
    folder = scratch / "copy"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(run.folder, folder)
    files = Files(folder)
    what = edit(files)
    files.write()
    try:
        post = _load(folder, run)
    except ppl.RunError:
        return "refused", what, None
    except Exception as error:  # noqa: BLE001 — any other error is neither a refusal nor a load
        return "inconsistent", what, f"loading raised {type(error).__name__}: {error}"
    try:
        why = _inconsistency(run, post, files.touched)
    except Exception as error:  # noqa: BLE001 — a loaded run whose diagnostics cannot be computed
        why = f"loaded, then its diagnostics raised {type(error).__name__}: {error}"
    return ("inconsistent" if why else "consistent"), what, why


CATEGORIES = ("named", "checks", "random")


def _table(counts: dict, seconds: dict) -> str:
    """Runs × edit categories: refused / loaded consistently / loaded inconsistently."""
    width = max(map(len, counts)) + 2
    head = "".join(f"{c:>14}" for c in CATEGORIES)
    lines = ["refused/consistent/inconsistent per run and kind of edit",
             f"{'run':{width}}{head}{'all':>14}{'seconds':>9}"]

    def cell(c: dict) -> str:
        return f"{c['refused']}/{c['consistent']}/{c['inconsistent']}"

    totals = {cat: {"refused": 0, "consistent": 0, "inconsistent": 0} for cat in (*CATEGORIES, "all")}
    for name, by_category in counts.items():
        row = {cat: by_category[cat] for cat in CATEGORIES}
        row["all"] = {k: sum(row[cat][k] for cat in CATEGORIES) for k in ("refused", "consistent", "inconsistent")}
        for cat, c in row.items():
            for k, v in c.items():
                totals[cat][k] += v
        lines.append(f"{name:{width}}" + "".join(f"{cell(row[cat]):>14}" for cat in (*CATEGORIES, "all"))
                     + f"{seconds[name]:>9.1f}")
    lines.append(f"{'total':{width}}" + "".join(f"{cell(totals[cat]):>14}" for cat in (*CATEGORIES, "all"))
                 + f"{sum(seconds.values()):>9.1f}")
    return "\n".join(lines)


# What the issue's cases must give on the default tier's runs: refused, except the edits of
# diagnostics.json (never read for a run with a model: it loads, its verdict recomputed) and
# relabelling a map run "map" (no edit at all).
EXPECTED = {"all passed": "consistent", "checks: []": "consistent"}


def test_the_issues_cases_are_refused_or_load_consistently(fast_runs, tmp_path):
    for run in fast_runs:
        assert _inconsistency(run, _load(run.folder, run), set()) is None, run.name
        for label, edit in NAMED.items():
            outcome, what, why = _apply(run, edit, tmp_path)
            wanted = "consistent" if label == f"method {run.name}" else EXPECTED.get(label, "refused")
            assert (outcome, why) == (wanted, None), (run.name, label, what, outcome, why)


RANDOM_EDITS = 20  # per run, beside the named ones and the check edits: ~40 edits each


@pytest.mark.slow  # ~3 minutes: 30 runs fitted, ~1200 edited copies loaded and diagnosed
def test_every_edit_of_every_run_is_refused_or_loads_consistently(runs, tmp_path):
    counts, seconds, failures = {}, {}, []
    for i, run in enumerate(runs):
        began = time.perf_counter()
        # untampered, the run loads and its verdict passes the oracle
        assert _inconsistency(run, _load(run.folder, run), set()) is None, run.name
        rng = np.random.default_rng(1000 + i)  # fixed per run: a failure names a reproducible edit
        edits = [("named", label, edit) for label, edit in NAMED.items()]
        edits += [("checks", label, edit) for label, edit in _check_edits(Files(run.folder), run.detached)]
        edits += [("random", f"random {j}", _random_edit(rng)) for j in range(RANDOM_EDITS)]
        counts[run.name] = {cat: {"refused": 0, "consistent": 0, "inconsistent": 0} for cat in CATEGORIES}
        for category, label, edit in edits:
            outcome, what, why = _apply(run, edit, tmp_path)
            counts[run.name][category][outcome] += 1
            if why:
                failures.append(f"{run.name} / {label} ({what}): {why}")
        seconds[run.name] = time.perf_counter() - began
    print()
    print(_table(counts, seconds))
    assert not failures, "\n".join(failures)
