"""``ppl.compare``: fit several methods to one model and data, and set them side by side.

Every method is scored the same way: its wall time and uniform diagnostics (R-hat in weight and
function space, ESS, divergences, PSIS k-hat, PSIS-LOO with paired differences), its test metrics
(NLL, accuracy or RMSE, ECE, Brier), how well its uncertainty separates out-of-distribution inputs
(AUROC), how much abstaining on its most uncertain inputs buys (the area under the
accuracy–coverage curve), and how close its predictive is to a reference method's (agreement and
total variation, Izmailov et al. 2021; for regression the Wasserstein-1 distance).
"""

from __future__ import annotations

import math
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ppl._fit import differences, fingerprint_of
from ppl.core import registry
from ppl.core.cache import release_compiled
from ppl.core.errors import DataError, OptionError, ResumeError, did_you_mean
from ppl.core.problem import compile_problem
from ppl.datasets import Dataset, Split
from ppl.diagnostics import metrics as M
from ppl.diagnostics._arviz import compare_elpd
from ppl.diagnostics.compare_report import write_report
from ppl.io import store
from ppl.models import Network
import ppl

__all__ = ["compare", "Comparison", "ComparisonInterrupted"]

# Methods a default comparison leaves out: hmc repeats nuts with a fixed path length, and mh's
# random-walk proposals do not mix on a network's hundreds of weights.
NOT_BY_DEFAULT = ("hmc", "mh")


@dataclass
class Comparison:
    """The result of :func:`ppl.compare`.

    Attributes:
        rows: one dict per method, in the order fitted (see :data:`COLUMNS` for the keys); a method
            that failed or does not apply has ``error`` set and None elsewhere.
        posteriors: method -> fitted Posterior (only those that fitted).
        predictions, ood_predictions: method -> Prediction on the test and OOD inputs.
        shifts: method -> [{"shift": intensity, **metrics}] on the data's shifted test sets, if any.
        elpd: the paired PSIS-LOO comparison (``az.compare``), best first, or None.
        reference: the reference method's name, or None; notes: sentences the table ends with.
    """

    task: str
    data_name: str
    model: str
    seed: int
    reference: str | None
    rows: list = field(default_factory=list)
    posteriors: dict = field(default_factory=dict)
    predictions: dict = field(default_factory=dict)
    ood_predictions: dict = field(default_factory=dict)
    shifts: dict = field(default_factory=dict)
    shift_name: str | None = None
    elpd: list | None = None
    notes: list = field(default_factory=list)
    test: tuple | None = None

    def row(self, method: str) -> dict:
        for row in self.rows:
            if row["method"] == method:
                return row
        raise KeyError(f"no method {method!r} in this comparison; it has {', '.join(r['method'] for r in self.rows)}")

    def to_dict(self) -> dict:
        """The table, the paired elpd comparison and the notes, as plain JSON-ready data."""
        return {
            "data": self.data_name, "model": self.model, "task": self.task, "seed": self.seed,
            "reference": self.reference, "rows": [dict(row) for row in self.rows], "elpd": self.elpd,
            "shift_name": self.shift_name,
            "shifts": {name: [dict(entry) for entry in values] for name, values in self.shifts.items()},
            "notes": list(self.notes),
        }

    def table(self) -> str:
        """Two blocks of text — the fit and its diagnostics, then prediction — and the notes."""
        return format_table(self.to_dict())

    def __str__(self) -> str:
        return self.table()

    def write_report(self, folder) -> Path:
        """Write ``report.html`` with its PNG figures into ``folder``; returns the page's path."""
        return write_report(self, folder)


class ComparisonInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped :func:`ppl.compare` during a fit.

    ``method`` is the fit that was stopped and ``finished`` the methods fitted before it. With
    ``fits=`` given, nothing is lost: the finished fits and the stopped one's state are saved in
    ``fits`` and the same call continues from there. Uncaught, it behaves as any Ctrl-C.
    """

    def __init__(self, message: str, *, method: str, finished: list, fits):
        super().__init__(message)
        self.method, self.finished, self.fits = method, list(finished), fits


def compare(model, data=None, *, methods=None, reference: str | None = "nuts", seed, options: dict | None = None,
            test=None, ood=None, fits=None, log=None, devices=None) -> Comparison:
    """Fit each method to ``model`` and ``data`` and compare them.

    Args:
        model: a model from ``ppl.models``; or a dict of already fitted posteriors (name ->
            Posterior), which are then compared without fitting (``data`` is then the test data).
        data: a ``ppl.datasets`` Dataset (its train, test and ood splits are used) or training data
            ``(X, y)`` with ``test=(X, y)`` and ``ood=X`` given separately.
        methods: registry names; None means every registered method that accepts the model, less
            ``hmc`` and ``mh``. Unknown names and options are refused before anything runs.
        reference: the method whose predictive the others are measured against (fitted too if it
            is not in ``methods``); None for no reference. A reference that is not a Markov-chain
            sampler is allowed, and the notes say what that means.
        seed: the seed of every fit and prediction.
        options: method -> its options, e.g. ``{"nuts": {"num_chains": 2}}``.
        fits: a folder that keeps each fit as it ends (``fits/<method>``, a run folder that
            ``ppl.load`` reads). Called again with the same folder, a comparison reuses the fits
            already there and continues one that Ctrl-C stopped, so an interrupted comparison
            resumes where it stopped. A saved fit of other settings (model, data, options, seed) is
            refused before anything runs, naming what differs.
        log: called with one line of text as each method starts and ends (the CLI prints them).
        devices: the devices every fit runs on (as ``ppl.fit``'s ``devices``).

    A method that fails (a non-finite loss, a memory refusal, a model it does not support) becomes
    a row whose ``error`` says why; the others still run. Ctrl-C stops the comparison at the running
    fit's next chunk of steps and raises :class:`ComparisonInterrupted` (see ``fits``).

    >>> import ppl
    >>> from ppl.models import LinearRegression
    >>> data = ppl.datasets.load("linear", seed=0)
    >>> result = ppl.compare(LinearRegression(noise_scale=0.5), data, methods=["exact", "map"], reference="exact", seed=0)
    >>> result.row("exact")["wasserstein1"]
    0.0
    """
    log = log or (lambda line: None)
    options = dict(options or {})
    if isinstance(model, dict):
        return _compare_fitted(model, data, reference=reference, seed=seed, ood=ood)
    if isinstance(data, Dataset):
        train, test = data.train, (data.test if test is None else test)
        ood = data.ood.X if ood is None and data.ood is not None else ood
        name, dataset = data.name, data
    else:
        train, name, dataset = data, "data", None
    if test is not None and not isinstance(test, Split):
        test = Split(*test)
    _check_input_shapes(train, test, ood)
    chosen = chosen_methods(model, train, methods, reference, options)
    result = Comparison(task=_task(model), data_name=name, model=_model_name(model), seed=int(seed),
                        reference=reference, test=None if test is None else (np.asarray(test.X), np.asarray(test.y)),
                        shift_name=getattr(dataset, "shift_name", None))
    if methods is None:
        skipped = [f"{m} ({why})" for m, why in chosen["skipped"].items()]
        if skipped:
            result.notes.append("not run (they do not accept this model): " + "; ".join(skipped))

    saved = _saved_fits(fits, model, train, chosen["run"], seed, options)
    for method in chosen["run"]:
        path = None if fits is None else Path(fits) / method
        if saved.get(method) == "complete":
            # a declarative model is rebuilt from the saved configuration; a program or a network is passed back
            rebuilt = hasattr(model, "to_config") and not isinstance(model.bind(*train), Network)
            result.posteriors[method] = ppl.load(path, model=None if rebuilt else model)
            log(f"{method}: the fit saved in {path} is reused")
            continue
        resume = path if saved.get(method) == "partial" else None
        log(f"continuing {method} from {path} …" if resume else f"fitting {method} …")
        start = time.perf_counter()
        try:
            posterior = ppl.fit(model, train, method=method, seed=seed, resume=resume, devices=devices,
                                 **options.get(method, {}))
        except ppl.Interrupted as stop:  # before the method had anything to return
            if path is not None and stop.resume_state is not None:
                stop.save(path)
            raise _interrupted(method, list(result.posteriors), fits) from None
        except KeyboardInterrupt:
            raise _interrupted(method, list(result.posteriors), fits) from None
        except Exception as error:  # a failed method is a row that says why; the others still run
            result.rows.append(_failed_row(method, f"the fit failed: {_said(error)}", time.perf_counter() - start))
            log(f"  {method} failed: {_said(error)}")
            continue
        # judged on the test rows from here on: the fit saved below carries them (so ppl show reaches the
        # comparison's verdict), and the diagnostics it computes are the ones the scoring reads
        try:
            posterior = _judged_on(posterior, test)
        except Exception:  # rows it cannot take: the fit is saved as it is, and the scoring's row says why
            pass
        if path is not None:
            store.save_posterior(posterior, path)
        if posterior.status.interrupted:
            raise _interrupted(method, list(result.posteriors), fits)
        result.posteriors[method] = posterior
        log(f"  {method} done in {posterior.wall_time_s:.1f} s")
        # A finished fit's compiled programs (its steps, its warm-up) serve no later fit: each has its
        # own. Kept, they held 0.2 to 0.4 GB of the main job's peak memory by the last method; what
        # scoring needs (prediction, diagnostics) is compiled again once, from the persistent cache.
        release_compiled()
    started = time.perf_counter()
    log(f"scoring {len(result.posteriors)} fits on the test split (predictives, calibration, function-space diagnostics) …")
    _score(result, test, ood, seed, dataset)
    log(f"  scored in {time.perf_counter() - started:.1f} s")
    # The report predicts on a grid, another shape: the scoring's programs serve it no more than one
    # fit's serve the next.
    release_compiled()
    result.rows.sort(key=lambda r: chosen["run"].index(r["method"]))  # the order fitted, reference first
    return result


def _saved_fits(fits, model, train, methods, seed, options) -> dict:
    """method -> "complete" or "partial" for the fits already in the ``fits`` folder; a saved fit
    of other settings is refused here, before anything is fitted."""
    if fits is None:
        return {}

    folder = Path(fits)
    if folder.exists() and not folder.is_dir():
        raise OptionError(f"fits={str(folder)!r} is a file; give a folder (it is created if missing)")
    found = {}
    for method in methods:
        path = folder / method
        if not (path / "manifest.json").is_file():
            continue
        meta, _, _ = store.read_run_meta(path)
        now = fingerprint_of(model, train, method, seed=seed, **options.get(method, {}))
        differ = differences(meta.get("fingerprint") or {}, now)
        if differ:
            raise ResumeError(
                f"{path} holds a {method} fit of other settings — " + "; ".join(differ)
                + f" (the saved value first) — give another fits folder, or delete {path} to fit it afresh"
            )
        if meta.get("status") == "complete":
            found[method] = "complete"
        elif meta.get("status") in ("interrupted", "checkpoint"):
            found[method] = "partial"
        # a failed fit is fitted again (and fails again, saying why, if nothing changed)
    return found


def _interrupted(method: str, finished: list, fits) -> ComparisonInterrupted:
    where = (f"; the fits so far are saved in {fits}, and the same call continues from there" if fits is not None
             else "; pass fits=<folder> to keep fits across an interruption")
    return ComparisonInterrupted(f"interrupted while fitting {method} (finished: {', '.join(finished) or 'none'}){where}",
                                 method=method, finished=finished, fits=fits)


def _check_input_shapes(train, test, ood) -> None:
    """Refuse, before anything is fitted, test or OOD inputs whose shape per row differs from the
    training inputs' (another number of features, or another image size)."""
    if not isinstance(train, (tuple, list)) or len(train) != 2:
        return  # a program's data dict: its inputs are whatever the program reads
    row = np.shape(train[0])[1:]
    for name, X in (("test", None if test is None else test.X), ("ood", ood)):
        if X is not None and np.shape(X)[1:] != row:
            raise DataError(
                f"compare: the {name} inputs have shape {np.shape(X)} — {np.shape(X)[1:]} per row — but the training "
                f"inputs have {row} per row; give {name} inputs with the training inputs' columns (or image size)"
            )


def _compare_fitted(posteriors: dict, test, *, reference, seed, ood) -> Comparison:
    if not posteriors:
        raise OptionError("compare needs at least one posterior")
    first = next(iter(posteriors.values()))
    if reference is not None and reference not in posteriors:
        reference = None
    if test is not None and not isinstance(test, Split):
        test = Split(*test)
    result = Comparison(task=_task(first.problem.model), data_name="data", model=_model_name(first.problem.model),
                        seed=int(seed), reference=reference,
                        test=None if test is None else (np.asarray(test.X), np.asarray(test.y)))
    result.posteriors = dict(posteriors)
    _score(result, test, ood, seed, None)
    return result


def chosen_methods(model, train, methods, reference, options) -> dict:
    """Which methods run, in order (the reference first, so the others can be measured against it),
    and, for the default list, which were left out because they refuse the model and why."""
    if methods is not None:
        if isinstance(methods, str) or not all(isinstance(m, str) for m in methods):
            raise OptionError(f"methods must be a list of method names, got {methods!r}")
        unknown = [m for m in methods if m not in registry.METHODS]
        if unknown:
            raise OptionError(
                f"unknown method(s) {', '.join(map(repr, unknown))}{''.join(did_you_mean(m, registry.METHODS) for m in unknown)}; "
                f"valid methods: {', '.join(sorted(registry.METHODS))}"
            )
        if len(set(methods)) != len(methods):
            raise OptionError(f"methods lists a method twice: {methods}")
    if reference is not None and reference not in registry.METHODS:
        raise OptionError(f"unknown reference method {reference!r}; valid methods: {', '.join(sorted(registry.METHODS))}")
    stray = sorted(set(options) - set(methods or registry.METHODS) - {reference})
    if stray:
        raise OptionError(f"options are given for {', '.join(stray)}, which the comparison does not run")
    candidates = list(methods) if methods is not None else [m for m in registry.METHODS if m not in NOT_BY_DEFAULT]
    if reference is not None and reference not in candidates:
        candidates.append(reference)
    # Every method and its options are checked before anything is fitted.
    objects = {m: registry.create(m, dict(options.get(m, {}))) for m in candidates}
    skipped = {}
    if methods is None:
        problem = compile_problem(model, train)
        for m, method in objects.items():
            if m == reference:
                continue
            try:
                method.check(problem)
            except (OptionError, TypeError, ValueError) as error:
                skipped[m] = _said(error)
    run = [m for m in candidates if m not in skipped]
    if reference in run:
        run.remove(reference)
        run.insert(0, reference)
    return {"run": run, "skipped": skipped}


def _score(result: Comparison, test, ood, seed, dataset) -> None:
    """Fill the rows of the fitted posteriors (errors in one stage become that row's error);
    ``dataset``: the Dataset compared on (its target scaling and shifted test sets), or None."""
    fitted = [r["method"] for r in result.rows]  # failed fits already have their row
    scale = 1.0 if dataset is None else float(dataset.target_std)  # W1 in the target's own units
    reference_pred = None
    for method, posterior in result.posteriors.items():
        row = _failed_row(method, None, posterior.wall_time_s)
        try:
            posterior = result.posteriors[method] = _judged_on(posterior, test)
            _diagnostic_columns(row, posterior.diagnostics())
            if test is not None:
                prediction = posterior.predict(test.X, seed=seed)
                result.predictions[method] = prediction
                _test_columns(row, prediction, np.asarray(test.y), result.task, dataset)
                if ood is not None:
                    out = posterior.predict(np.asarray(ood), seed=seed)
                    result.ood_predictions[method] = out
                    scores = M.ood_auroc(prediction, out)
                    row["auroc_entropy"] = scores.get("auroc_entropy", scores.get("auroc_variance"))
                    row["auroc_mi"] = scores.get("auroc_mi", scores.get("auroc_epistemic"))
                if method == result.reference:
                    reference_pred = prediction
                if reference_pred is not None:
                    if result.task == "classification":
                        row["agreement"] = M.agreement(prediction, reference_pred)
                        row["total_variation"] = M.total_variation(prediction, reference_pred)
                    else:
                        row["wasserstein1"] = M.wasserstein1(prediction, reference_pred, seed=seed) * scale
            if getattr(dataset, "shifts", None):
                result.shifts[method] = M.shift_metrics(posterior, dataset, seed=seed)
        except KeyboardInterrupt:
            raise
        except Exception as error:
            row["error"] = f"scoring failed: {_said(error)}"
        if method in fitted:
            result.rows[fitted.index(method)] = row
        else:
            result.rows.append(row)
    _reference_notes(result)
    pointwise = {
        m: p.diagnostics().elpd_loo_pointwise for m, p in result.posteriors.items()
        if p.diagnostics().elpd_loo_pointwise is not None
    }
    if len(pointwise) >= 2:
        result.elpd = compare_elpd(pointwise)
        for entry in result.elpd:
            row = result.row(entry["method"])
            row["elpd_diff"], row["elpd_diff_se"] = entry["elpd_diff"], entry["dse"]


def _judged_on(posterior, test):
    """``posterior`` with the test rows held out, so that its verdict also judges the predictive on
    them (better than a trivial baseline, honest 90% intervals): an over-fitted posterior that its
    own draws cannot expose is caught there. Unchanged without test rows, for a model that predicts
    no targets, or when it already holds these rows (its cached diagnostics are then kept)."""
    if test is None or not _supervised(posterior):
        return posterior
    held = posterior.heldout
    X, y = np.asarray(test.X), np.asarray(test.y)
    if held is not None and held[0].shape == X.shape and np.array_equal(held[0], X.astype(held[0].dtype)) \
            and np.array_equal(held[1], y):
        return posterior
    return posterior.with_heldout(X, y)


def _supervised(posterior) -> bool:
    problem = posterior.problem
    return problem is not None and problem.is_declarative and problem.spec.kind != "unsupervised"


def _reference_notes(result: Comparison) -> None:
    reference = result.reference
    if reference is None:
        return
    if reference not in result.posteriors or reference not in result.predictions:
        if reference in [r["method"] for r in result.rows]:
            result.notes.append(f"the reference {reference} failed, so nothing is measured against it")
        return
    posterior = result.posteriors[reference]
    if posterior.kind != "chains":
        result.notes.append(
            f"the reference {reference} is not a Markov-chain sampler (its posterior is of kind {posterior.kind!r}): "
            "agreement and distance say how close a method comes to it, not to the exact posterior"
        )
    elif not posterior.diagnostics().ok:
        result.notes.append(
            f"the reference {reference} failed its own diagnostics: measure against it with care "
            f"({posterior.diagnostics().failed[0].message})"
        )


def _diagnostic_columns(row: dict, d) -> None:
    row.update(
        rhat_max=d.rhat_max, rhat_function_max=d.rhat_function_max, ess_bulk_min=d.ess_bulk_min,
        function_ess_bulk_min=next((c.value for c in d.checks if c.field == "function_ess_bulk_min"), None),
        divergences=d.divergences, khat=d.khat, khat_threshold=d.khat_threshold, elpd_loo=d.elpd_loo,
        elpd_loo_se=d.elpd_loo_se, loo_khat_bad=d.loo_khat_bad, ok=d.ok,
        problems=[check.message for check in d.failed], failed_checks=[check.field for check in d.failed],
    )


def _test_columns(row: dict, prediction, y, task: str, dataset) -> None:
    if task == "classification":
        row.update(M.classification_metrics(prediction, y))
        if prediction.member_probs is not None:
            row["selective_area"] = M.selective_prediction(prediction, y, score="entropy").area
        return
    metrics = M.regression_metrics(prediction, y)
    row.update(metrics if dataset is None else dataset.in_target_units(metrics))  # the target's own units


COLUMNS = (
    "method", "error", "wall_time_s", "rhat_max", "rhat_function_max", "ess_bulk_min", "function_ess_bulk_min",
    "divergences", "khat",
    "khat_threshold", "elpd_loo", "elpd_loo_se", "elpd_diff", "elpd_diff_se", "loo_khat_bad", "nll", "accuracy",
    "rmse", "ece", "brier", "coverage_90", "auroc_entropy", "auroc_mi", "selective_area", "agreement",
    "total_variation", "wasserstein1", "ok", "problems", "failed_checks",
)


def _failed_row(method: str, error: str | None, wall_time_s: float) -> dict:
    row = dict.fromkeys(COLUMNS)
    row.update(method=method, error=error, wall_time_s=float(wall_time_s))
    return row


def _said(error: Exception) -> str:
    text = str(error).strip() or type(error).__name__
    return text if len(text) < 600 else text[:600] + " …"


def _task(model) -> str:
    likelihood = getattr(model, "likelihood", None)
    if likelihood in ("bernoulli", "categorical") or type(model).__name__ == "LogisticRegression":
        return "classification"
    return "regression"


def _model_name(model) -> str:
    return type(model).__name__ if not callable(model) or hasattr(model, "__dataclass_fields__") else model.__name__


# -- the text table -----------------------------------------------------------------------------------

def _number(value, spec: str) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return format(value, spec)


def format_table(record: dict) -> str:
    """The comparison as text (from :meth:`Comparison.to_dict`, so a saved comparison prints the same)."""
    rows, task = record["rows"], record["task"]
    fit_columns = [
        ("method", lambda r: r["method"] + (" (ref)" if r["method"] == record["reference"] else "")),
        ("time s", lambda r: _number(r["wall_time_s"], ".1f")),
        ("R-hat w", lambda r: _number(r["rhat_max"], ".3f")),
        ("R-hat f", lambda r: _number(r["rhat_function_max"], ".3f")),
        ("ESS w", lambda r: _number(r["ess_bulk_min"], ".0f")),
        ("ESS f", lambda r: _number(r.get("function_ess_bulk_min"), ".0f")),
        ("div", lambda r: _number(r["divergences"], "d")),
        ("k-hat", lambda r: _number(r["khat"], ".2f")),
        ("elpd_loo ± SE", lambda r: "—" if r["elpd_loo"] is None else f"{r['elpd_loo']:.1f} ± {r['elpd_loo_se']:.1f}"),
        ("Δelpd ± SE", lambda r: "—" if r["elpd_diff"] is None else f"{-r['elpd_diff'] + 0.0:.1f} ± {r['elpd_diff_se']:.1f}"),
        ("ok", lambda r: _number(r["ok"], "")),
    ]
    if task == "classification":
        predict_columns = [
            ("method", lambda r: r["method"]),
            ("NLL", lambda r: _number(r["nll"], ".3f")), ("accuracy", lambda r: _number(r["accuracy"], ".3f")),
            ("ECE", lambda r: _number(r["ece"], ".3f")), ("Brier", lambda r: _number(r["brier"], ".3f")),
            ("AUROC H", lambda r: _number(r["auroc_entropy"], ".3f")),
            ("AUROC MI", lambda r: _number(r["auroc_mi"], ".3f")),
            ("sel. area", lambda r: _number(r["selective_area"], ".3f")),
            ("agree", lambda r: _number(r["agreement"], ".3f")), ("TV", lambda r: _number(r["total_variation"], ".3f")),
        ]
    else:
        predict_columns = [
            ("method", lambda r: r["method"]),
            ("NLL", lambda r: _number(r["nll"], ".3f")), ("RMSE", lambda r: _number(r["rmse"], ".3f")),
            ("cover 90%", lambda r: _number(r["coverage_90"], ".3f")),
            ("AUROC var", lambda r: _number(r["auroc_entropy"], ".3f")),
            ("AUROC epi", lambda r: _number(r["auroc_mi"], ".3f")),
            ("W1", lambda r: _number(r["wasserstein1"], ".3f")),
        ]
    title = f"compare — {record['model']} on {record['data']} ({task}), seed {record['seed']}"
    lines = [title, "", *textwrap.wrap(_reading(rows), 100), "", "fit and diagnostics:", *_grid(fit_columns, [r for r in rows if not r["error"]])]
    lines += ["", "test predictions" + (f" (agreement, TV and W1 against {record['reference']})"
                                        if record["reference"] else "") + ":",
              *_grid(predict_columns, [r for r in rows if not r["error"]])]
    failed = [r for r in rows if r["error"]]
    if failed:
        lines += ["", "failed:"] + [f"  {r['method']}: {r['error']}" for r in failed]
    untrusted = [r for r in rows if not r["error"] and r["ok"] is False]
    if untrusted:
        lines += ["", "did not pass their own diagnostics:"]
        for r in untrusted:
            lines += [f"  {r['method']}: {r['problems'][0]}"] + [f"  {' ' * len(r['method'])}  {p}" for p in r["problems"][1:]]
    notes = list(record["notes"])
    notes.append("R-hat w/f, ESS w/f: weight-space and function-space R-hat and bulk ESS (for a network the "
                 "function-space figures decide: its weights have symmetric modes that no chain need cross); k-hat: "
                 "PSIS k-hat of q against the posterior; Δelpd: paired PSIS-LOO difference from the best method, with "
                 "its standard error")
    if task == "classification":
        notes.append("AUROC H/MI: out-of-distribution inputs told apart by predictive entropy / mutual information; "
                     "sel. area: mean accuracy over the accuracy–coverage curve, abstaining on the most uncertain "
                     "inputs first")
    lines += [""] + [f"note: {n}" for n in notes]
    return "\n".join(lines)


# What a failed check says in a word, for the table's opening line (by the check's field).
_FLAGS = (
    ("khat", "k-hat: the approximation puts its mass where the posterior has little"),
    ("rhat", "R-hat: the chains disagree, they have not mixed"),
    ("ess", "ESS: too few effective draws"),
    ("temperature", "temperature: the draws are hotter or colder than the posterior"),
    ("variance_inflation", "step size: the draws are spread wider than the posterior"),
    ("dispersion", "under-dispersion: the approximation is narrower than the curvature allows"),
    ("psis", "moments: importance weights move the approximation's mean or sd"),
    ("heldout_coverage", "held-out intervals: the 90% intervals cover too few or too many test targets"),
    ("heldout", "held-out data: the predictive does worse than a trivial baseline"),
    ("divergences", "divergences: the sampler could not follow the posterior's curvature"),
)


def _reading(rows: list) -> str:
    """One paragraph for a newcomer: which methods can be trusted here, and why the others are
    flagged (the first failed check of each, in a word)."""
    fitted = [r for r in rows if not r["error"]]
    trusted = [r["method"] for r in fitted if r["ok"]]
    flagged: dict = {}
    for r in fitted:
        if r["ok"] is False:
            fields = r.get("failed_checks") or []
            reason = next((text for key, text in _FLAGS for f in fields if key in f),
                          f"{fields[0]}" if fields else "its run did not finish or converge")
            flagged.setdefault(reason, []).append(r["method"])
    parts = [f"In short: {len(trusted)} of {len(rows)} methods pass their own checks"
             + (f" and can be trusted here ({', '.join(trusted)})." if trusted else ".")]
    if flagged:
        count = sum(map(len, flagged.values()))
        reasons = "; ".join(f"{', '.join(methods)} — {reason}" for reason, methods in flagged.items())
        parts.append(f"{count} {'is' if count == 1 else 'are'} flagged, each for a measured reason given below the "
                     f"tables ({reasons}). A flag is the diagnostics doing their job: use a method that passed, or "
                     "follow the remedy named in the flag.")
    failed = [r["method"] for r in rows if r["error"]]
    if failed:
        parts.append(f"{', '.join(failed)} failed to run (the error is below).")
    return " ".join(parts)


def _grid(columns, rows) -> list[str]:
    cells = [[name for name, _ in columns]] + [[get(r) for _, get in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    out = []
    for k, row in enumerate(cells):
        out.append("  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
        if k == 0:
            out.append("  " + "  ".join("─" * w for w in widths))
    return out
