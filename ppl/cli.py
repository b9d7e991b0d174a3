"""The ``ppl`` command line: fit, compare, show, predict, calibrate, datasets, methods.

Bad input or usage exits with status 2 and writes nothing.
"""

from __future__ import annotations

import argparse
import json
import dataclasses
import sys
import typing
from pathlib import Path

from ppl._cache import CACHE_ENV, use_compilation_cache
from ppl._errors import DataError, MemoryBudgetError, NonFiniteError, OptionError, ResumeError, RunError, did_you_mean

MODELS = ("linear", "logistic", "bnn", "vae")
TASKS = ("regression", "classification")
TASK_HELP = (
    "what a .csv/.npz file's target is (default: guessed — text labels, or at most 20 distinct integers 0..K-1, "
    "make a classification; other numbers a regression)"
)


class UsageError(Exception):
    """Bad command-line input: reported on stderr, exit status 2, nothing written."""


class _Parser(argparse.ArgumentParser):
    """argparse with a "did you mean" for a misspelt choice (a model, a subcommand, a score)."""

    def error(self, message):
        import re

        found = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if found:
            message += did_you_mean(found.group(1), re.findall(r"'([^']*)'", found.group(2)) or found.group(2).split(", "))
        super().error(message)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ppl", description="Bayesian inference for neural-network weights.")
    parser.add_argument("--version", action="version", version=f"ppl {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    fit = sub.add_parser("fit", help="fit a model, print diagnostics and test metrics, save the run")
    fit.add_argument("--model", choices=MODELS, help="required unless --resume")
    fit.add_argument("--data", help="a dataset name (see `ppl datasets`) or a .csv/.npz file; required unless --resume")
    fit.add_argument(
        "--target", metavar="COLUMN",
        help="the column of a CSV file to predict; required when the file has more than two columns "
        "(with two, the last is the target)",
    )
    fit.add_argument("--split", type=_split_number, metavar="K",
                     help="which canonical train/test split of a UCI set (default 0; UCI sets only)")
    fit.add_argument("--task", choices=TASKS, help=TASK_HELP)
    fit.add_argument("--method", help="a method name (see `ppl methods`; default nuts)")
    fit.add_argument("--seed", type=_seed, help="default 0")
    fit.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="a model option (e.g. hidden=32,32) or method option (e.g. num_samples=500); repeatable",
    )
    fit.add_argument(
        "--out", help="run directory (default: a new runs/<data>-<model>-<method>-seed<N>[-K] folder, never an existing one)"
    )
    fit.add_argument("--force", action="store_true", help="replace the run already in --out")
    fit.add_argument("--no-progress", action="store_true", help="hide the progress bars (and, when output is not a terminal, the progress lines)")
    fit.add_argument(
        "--kfold", type=_at_least_two, metavar="K",
        help="also estimate the elpd by K-fold cross-validation on the training rows (K more fits of the same method)",
    )
    fit.add_argument(
        "--devices", type=_positive, metavar="N", help=DEVICES_HELP,
    )
    fit.add_argument(
        "--checkpoint-every", type=_positive, metavar="N",
        help="write a resumable checkpoint to the output folder every N steps (optimiser steps or MCMC steps)",
    )
    fit.add_argument(
        "--resume", metavar="DIR",
        help="continue the interrupted or checkpointed run in DIR (its model, data, method and options are reused; "
        "any you give must match)",
    )
    comp = sub.add_parser(
        "compare",
        help="fit several methods to one model and data, print one table and write report.html with figures "
        "(with no options: a BNN on two_moons, every method that accepts it, NUTS as the reference)",
    )
    comp.add_argument("--model", choices=MODELS, help="default bnn")
    comp.add_argument("--data", help=f"a dataset name or a .csv/.npz file (default {COMPARE_DATA})")
    comp.add_argument("--split", type=_split_number, metavar="K",
                      help="which canonical train/test split of a UCI set (default 0; UCI sets only)")
    comp.add_argument("--target", metavar="COLUMN", help="the column of a CSV file to predict (as for ppl fit)")
    comp.add_argument("--task", choices=TASKS, help=TASK_HELP)
    comp.add_argument(
        "--methods", help="comma-separated method names (default: every registered method that accepts the model, "
        "less hmc and mh)",
    )
    comp.add_argument("--reference", help="the method the others are measured against, or 'none' "
                      "(default nuts; fitted too when not in --methods)")
    comp.add_argument("--seed", type=_seed, help="default 0")
    comp.add_argument(
        "--set", action="append", default=[], metavar="[METHOD.]KEY=VALUE",
        help="a model option (hidden=16) or one method's option (nuts.num_chains=2); repeatable",
    )
    comp.add_argument(
        "--devices", type=_positive, metavar="N", help=DEVICES_HELP,
    )
    comp.add_argument("--out", help="report folder (default: a new runs/compare-<data>-<model>-seed<N>[-K] folder)")
    comp.add_argument("--force", action="store_true", help="replace the report (or unfinished comparison) in --out")
    comp.add_argument(
        "--resume", metavar="DIR",
        help="continue the comparison that Ctrl-C stopped in DIR: the fits it finished are reused, the one it "
        "stopped continues (its settings are reused; any you give must match)",
    )
    show = sub.add_parser("show", help="print a saved run")
    show.add_argument("path", help="a run folder, or any file inside one")
    show.add_argument(
        "--plots", action="store_true",
        help="also write PNG figures into the run folder: trace and rank plots (samplers), the loss curve "
        "(optimisers), the predictive over the inputs (1-D regression, 2-D classification)",
    )
    predict = sub.add_parser(
        "predict", help="predict new rows with a saved run, prepared as its training data was (raw units in and out)"
    )
    predict.add_argument("run", help="a run folder written by ppl fit")
    predict.add_argument(
        "--data", required=True,
        help="a .csv (columns by name, as in training; a target column, if present, is scored) or .npz file of raw "
        "rows, or a dataset name (its test split)",
    )
    predict.add_argument("--out", help="CSV file to write (default: standard output)")
    predict.add_argument("--seed", type=_seed, default=0, help="seed of the predictive draws (default 0)")
    predict.add_argument("--num-samples", type=_positive, help="posterior draws to use (default: all stored)")
    predict.add_argument("--level", type=float, default=0.9, help="central predictive interval (regression; default 0.9)")
    predict.add_argument("--uncalibrated", action="store_true",
                         help="ignore the calibration that ppl calibrate saved in the run")
    predict.add_argument("--keep-columns", metavar="NAMES",
                         help="copy these columns of the --data CSV (comma-separated names, or 'all'), verbatim, in "
                         "front of the predictions, so that they can be joined back (an id column, say)")
    calib = sub.add_parser(
        "calibrate",
        help="fit a temperature (classifiers) and, with --alpha, split-conformal sets or intervals to a saved run on "
        "held-out labelled rows; saved into the run, where ppl predict applies it and ppl show prints it",
    )
    calib.add_argument("run", help="a run folder written by ppl fit")
    calib.add_argument(
        "--data", required=True,
        help="a .csv or .npz file of labelled rows in raw units (as for ppl predict) that the run was not fitted on",
    )
    calib.add_argument("--alpha", type=float, help="also build split-conformal sets (classification) or intervals "
                       "(regression) with miscoverage ALPHA, e.g. 0.1 for 90%% coverage")
    calib.add_argument("--score", choices=("aps", "lac", "residual"),
                       help="conformal score (default aps for classifiers, residual for regression)")
    calib.add_argument("--no-temperature", action="store_true", help="skip temperature scaling (classifiers)")
    calib.add_argument("--seed", type=_seed, default=0, help="seed of the predictive draws and of the row split (default 0)")
    calib.add_argument("--num-samples", type=_positive, help="posterior draws to use (default: all stored)")
    for command in (fit, comp, show, predict, calib):  # the commands that compile programs
        command.add_argument(
            "--no-cache", action="store_true",
            help=f"compile afresh and keep nothing on disk (default: compiled programs are kept in "
            f"{CACHE_ENV} or ~/.cache/ppl/jax, so that the next run with the same shapes starts sooner; "
            f"{CACHE_ENV}=off also turns this off)",
        )
    sub.add_parser("datasets", help="list the bundled datasets")
    sub.add_parser("methods", help="list the methods with their options and defaults")
    return parser


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("ppl")
    except metadata.PackageNotFoundError:
        import ppl

        return ppl.__version__


def _seed(text: str) -> int:
    value = int(text)
    if not 0 <= value < 2**32:
        raise argparse.ArgumentTypeError(f"seed must be an integer in [0, 2**32), got {value}")
    return value


def _at_least_two(text: str) -> int:
    value = int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"must be an integer of at least 2, got {value}")
    return value


def _split_number(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"a split number is 0 or more, got {value}")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def _model_class(name: str):
    from ppl.models import BNN, VAE, LinearRegression, LogisticRegression

    return {"linear": LinearRegression, "logistic": LogisticRegression, "bnn": BNN, "vae": VAE}[name]


def _split_settings(settings: list[str], model_cls, method_cls, prefix: str = "") -> tuple[dict, dict]:
    """``--set`` items as (model options, method options); ``prefix`` ("nuts.") is how ppl compare's
    items named their method, for messages."""
    from ppl.inference._base import parse_value

    model_fields = {f.name for f in dataclasses.fields(model_cls)}
    method_fields = set(method_cls.option_defaults())
    model_hints = typing.get_type_hints(model_cls)
    model_opts, method_opts = {}, {}
    given = {}
    for item in settings:
        if "=" not in item:
            raise UsageError(f"--set {(prefix + item)!r}: expected KEY=VALUE")
        key, text = item.split("=", 1)
        if key in given:
            # Keeping the last one silently would run with a value the user may not have meant.
            raise UsageError(
                f"--set {prefix}{key} is given twice ({(prefix + given[key])!r}, then {(prefix + item)!r}); give each "
                "option once"
            )
        given[key] = item
        if key in model_fields and key != "prior":
            model_opts[key] = parse_value(text, model_hints[key], f"model option {key}")
        elif key in method_fields:
            method_opts[key] = method_cls.parse_option(key, text)
        else:
            raise UsageError(
                f"--set {key}: not an option of {model_cls.__name__} ({', '.join(sorted(model_fields - {'prior'}))}) "
                f"nor of method {method_cls.name!r} ({', '.join(sorted(method_fields))})"
                f"{did_you_mean(key, sorted(model_fields - {'prior'}) + sorted(method_fields))}"
            )
    return model_opts, method_opts


def _load_data(args):
    from ppl import datasets

    if Path(args.data).suffix in (".csv", ".npz"):
        if getattr(args, "split", None) is not None:
            raise UsageError(f"--split applies to the UCI sets' canonical splits, not to the file {args.data}")
        if args.model == "vae":
            for option, value in (("--target", args.target), ("--task", args.task)):
                if value is not None:
                    raise UsageError(f"--model vae models the data alone, with no target: drop {option}")
            data = datasets.load_file(args.data, seed=args.seed, task="unsupervised")
        else:
            if args.target is not None and Path(args.data).suffix == ".npz":
                raise UsageError(f"--target names a CSV column, but {args.data} is a .npz file: its targets are the array y")
            data = datasets.load_file(args.data, target=args.target, seed=args.seed, task=args.task)
        print(_safe(_describe_file(args, data)))
        if args.model != "vae":
            # Recorded in invocation.json, so that a resume reads the target as this run did even if
            # the guess were made differently.
            args.task = data.task
        if data.target is not None:
            args.target = data.target  # recorded in invocation.json, so a resume reads the same column
        return data
    if args.data not in datasets.names():
        raise UsageError(f"--data {args.data!r} is neither a dataset ({', '.join(datasets.names())}) nor a .csv/.npz "
                         f"file{did_you_mean(args.data, datasets.names())}")
    split = getattr(args, "split", None)
    if split is not None and args.data not in datasets.UCI_FOLDERS:
        raise UsageError(f"--split {split}: only the UCI sets ({', '.join(datasets.UCI_FOLDERS)}) have canonical splits; "
                         f"{args.data!r} is split by --seed")
    data = datasets.load(args.data, split=split or 0) if args.data in datasets.UCI_FOLDERS else datasets.load(
        args.data, seed=args.seed)
    if args.task is not None and args.task != data.task:
        raise UsageError(f"--task {args.task}: the dataset {args.data!r} has the task {data.task}; --task chooses how a "
                         ".csv/.npz file's target is read — drop it for a named dataset")
    return data


def _describe_file(args, data) -> str:
    """One line on what was read from a data file: rows, the target column and how it was chosen, the classes."""
    rows = data.train.X.shape[0] + data.test.X.shape[0]
    inputs = data.train.X.shape[1]
    if args.model == "vae":
        return f"data: {args.data} — {rows} rows × {inputs} columns, all modelled as data (no target)"
    if data.target is None:
        target = "target: the array y"
    elif args.target is None:
        target = f"target column {data.target!r} (the last of its 2 columns; name another with --target)"
    else:
        target = f"target column {data.target!r}"
    task = data.task if args.task is not None or data.classes is not None else f"{data.task} (guessed; --task sets it)"
    line = f"data: {args.data} — {rows} rows, {inputs} input column{'s' if inputs != 1 else ''}; {target}; {task}"
    if data.classes is not None:
        shown = ", ".join(f"{k} = {label!r}" for k, label in enumerate(data.classes[:10]))
        more = f", … ({len(data.classes) - 10} more)" if len(data.classes) > 10 else ""
        line += f", text labels encoded as classes {shown}{more}"
    elif data.num_classes is not None:
        line += f", {data.num_classes} classes"
    return line


def _kind_of(data) -> str:
    """What a dataset's targets are, for a message that refuses a model."""
    if data.task == "classification":
        return f"{data.name} has {data.num_classes} class{'es' if data.num_classes != 1 else ''}"
    if data.task == "regression":
        return f"{data.name} is a regression dataset (continuous targets)"
    return f"{data.name} is {data.task} (no targets)"


def _build_model(args, data, model_opts):
    cls = _model_class(args.model)
    if args.model == "linear" and data.task != "regression":
        raise UsageError(f"--model linear needs a regression dataset; {data.name} is {data.task}")
    if args.model == "logistic" and (data.task != "classification" or data.num_classes != 2):
        remedy = {
            "classification": "use --model bnn (its likelihood is categorical for more than two classes)",
            "regression": "use --model linear or --model bnn",
        }.get(data.task, "use --model vae")
        raise UsageError(f"--model logistic needs binary labels; {_kind_of(data)} — {remedy}")
    if args.model == "vae" and data.task == "classification" and data.name != "digits_binary":
        raise UsageError(f"--model vae models unlabelled data; use digits_binary or a .csv/.npz file, not {data.name}")
    if args.model == "bnn" and "likelihood" not in model_opts:
        if data.task == "regression":
            model_opts["likelihood"] = "gaussian"
        else:
            model_opts["likelihood"] = "bernoulli" if data.num_classes == 2 else "categorical"
    if model_opts.get("likelihood") == "categorical" and "num_classes" not in model_opts:
        # Classes counted over the whole dataset: one seen only in the test split still has a logit.
        model_opts["num_classes"] = data.num_classes
    try:
        return cls(**model_opts)
    except ValueError as error:
        raise UsageError(f"model options: {error}") from None


INVOCATION = "invocation.json"
DEVICES_HELP = (
    "run on N devices (GPUs, or N CPU host devices on a CPU): chains and ensemble members are split over them, "
    "a single run's minibatches and particles partitioned over them (default: every device JAX sees)"
)
COMPARE_DATA = "two_moons"


COMPARE_DEFAULTS = {"model": "bnn", "data": COMPARE_DATA, "reference": "nuts", "seed": 0}
FITS = "fits"  # the report folder's sub-folder holding each method's fit as a run folder


def _compare(args) -> int:
    import time

    import ppl
    from ppl import _interrupt, _io, _progress
    from ppl._compare import _chosen_methods

    _request_devices(args.devices)
    from ppl.inference import registry

    if args.resume:
        _apply_compare_resume(args)
    for key, value in COMPARE_DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    methods = None if args.methods is None else [m.strip() for m in args.methods.split(",") if m.strip()]
    if methods is not None and not methods:
        raise UsageError("--methods is empty; give comma-separated method names (see ppl methods)")
    reference = None if args.reference.lower() == "none" else args.reference
    for name in (methods or []) + ([reference] if reference else []):
        registry.get(name)  # unknown names are refused before anything runs
    model_settings, method_settings = [], {}
    for item in args.set:
        key = item.split("=", 1)[0]
        if "." in key:
            method, rest = item.split(".", 1)
            if methods is not None and method not in methods and method != reference:
                raise UsageError(f"--set {item!r}: method {method!r} is not among the methods compared")
            method_settings.setdefault(method, []).append(rest)
        else:
            if key not in {f.name for f in dataclasses.fields(_model_class(args.model))}:
                raise UsageError(
                    f"--set {item!r}: {key!r} is not an option of the model"
                    f"{did_you_mean(key, [f.name for f in dataclasses.fields(_model_class(args.model))])}; a method's "
                    "option takes its name first, as in --set nuts.num_chains=2"
                )
            model_settings.append(item)
    model_opts, _ = _split_settings(model_settings, _model_class(args.model), registry.get("map"))
    options = {}
    for method, items in method_settings.items():
        cls = registry.get(method)
        unknown = [i for i in items if "=" in i and i.split("=", 1)[0] not in cls.option_defaults()]
        if unknown:
            key = unknown[0].split("=", 1)[0]
            raise UsageError(f"--set {method}.{unknown[0]}: not an option of method {method!r} "
                             f"({', '.join(sorted(cls.option_defaults()))}){did_you_mean(key, cls.option_defaults())}")
        options[method] = _split_settings(items, _model_class(args.model), cls, prefix=f"{method}.")[1]
    if args.model == "vae":
        raise UsageError("ppl compare scores test predictions; a VAE has none — compare VAEs with ppl fit and their "
                         "test ELBO")
    data = _load_data(args)
    model = _build_model(args, data, model_opts)
    _chosen_methods(model, data.train, methods, reference, options)  # every method and option, before fitting
    out = Path(args.resume) if args.resume else _compare_folder(args, data)
    _check_writable_parent(out)
    # The writer's lock of `ppl fit` (on the resolved path): a fit and a comparison never write one folder at once.
    with _io.run_lock(out):
        if not args.resume:
            if _owned_comparison(out) is not None:
                _io.remove_comparison(out)  # ppl's own report or unfinished comparison, replaced as --force asked
            out.mkdir(parents=True, exist_ok=True)
            (out / INVOCATION).write_text(json.dumps(_compare_invocation(args), indent=1))
            _io.write_comparison_manifest(out, "unfinished", [INVOCATION, FITS])
        elif not (out / _io.COMPARISON_MANIFEST).exists():
            _io.write_comparison_manifest(out, "unfinished", [INVOCATION, FITS])  # started by an older ppl
        _progress.enable("lines")  # a line on stderr every few seconds beside the comparison's own log
        started = time.perf_counter()
        try:
            result = ppl.compare(model, data, methods=methods, reference=reference, seed=args.seed, options=options,
                                 fits=out / FITS, log=lambda line: print(line, flush=True), devices=args.devices)
            _interrupt.raise_pending()  # a Ctrl-C dropped while the methods were scored: no report from it
            _commit_report(result, out)
        except KeyboardInterrupt as stop:
            during = f"while fitting {stop.method}" if isinstance(stop, ppl.ComparisonInterrupted) else "before the report"
            print(f"interrupted {during}; the fits so far are saved in {out / FITS} — continue with: "
                  f"ppl compare --resume {out}", file=sys.stderr)
            return _interrupt.exit_status()
    elapsed = time.perf_counter() - started
    print()
    print(_safe(result.table()))
    print()
    print(f"report: {out / 'report.html'} (figures beside it; comparison.json holds the table, {FITS}/ each method's "
          f"fit); {elapsed:.0f} s in all")
    return 0


def _owned_comparison(out: Path):
    """(status, entries) of ppl's own comparison in ``out``, None for an absent or empty folder; any
    other folder is refused (a UsageError saying why)."""
    from ppl import _io

    try:
        return _io.comparison_entries(out)
    except RunError as error:
        raise UsageError(f"--out {error}") from None


def _commit_report(result, out: Path) -> None:
    """Write the comparison's report beside ``out``, then swap it in with the fits and the invocation.

    Whenever the process dies (a kill, a power cut), ``out`` is the unfinished comparison (which
    ``ppl compare --resume`` continues), absent for the instant of the swap, or the whole report —
    never half a report, and never an empty folder that neither resuming nor a new comparison
    recognises. A Ctrl-C waits for the swap, which would otherwise strand the fits in a hidden folder.
    Files that appeared in ``out`` meanwhile are not ppl's: the report then joins them, and they stay.
    """
    import os
    import shutil
    import tempfile

    from ppl import _interrupt, _io

    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    shutil.copymode(out, staging)  # the report folder keeps the usual permissions, not mkdtemp's 0700
    aside = staging.with_name(staging.name + "-old")
    ours = {FITS, INVOCATION, _io.COMPARISON_MANIFEST}
    try:
        result.write_report(staging)
        entries = [p.name for p in staging.iterdir()] + [name for name in (FITS, INVOCATION) if (out / name).exists()]
        _io.write_comparison_manifest(staging, "complete", entries)
        others = sorted(set(os.listdir(out)) - ours)
        with _interrupt.guard():
            if others:
                print(f"ppl compare: {out} gained files that ppl did not write ({', '.join(others[:5])}); the report "
                      "is added beside them", file=sys.stderr)
                for name in [p.name for p in staging.iterdir() if p.name != _io.COMPARISON_MANIFEST]:
                    os.replace(staging / name, out / name)
                os.replace(staging / _io.COMPARISON_MANIFEST, out / _io.COMPARISON_MANIFEST)
                return
            # out moves aside whole, so until the last rename it is still the resumable comparison.
            os.replace(out, aside)
            for name in (FITS, INVOCATION):
                if (aside / name).exists():
                    os.replace(aside / name, staging / name)
            os.replace(staging, out)
    except BaseException:
        if aside.exists() and not out.exists():  # the swap failed half-way: put the comparison back
            for name in (FITS, INVOCATION):
                if (staging / name).exists():
                    os.replace(staging / name, aside / name)
            os.replace(aside, out)
        shutil.rmtree(staging, ignore_errors=True)  # (only once nothing of the comparison is left in it)
        raise
    finally:
        if staging.exists() and not aside.exists():
            shutil.rmtree(staging, ignore_errors=True)
    if aside.exists():
        # the old folder holds only its manifest now; anything else in it arrived since, and is kept
        (aside / _io.COMPARISON_MANIFEST).unlink(missing_ok=True)
        try:
            aside.rmdir()
        except OSError:
            print(f"ppl compare: files that arrived during the swap are kept in {aside}", file=sys.stderr)


def _compare_invocation(args) -> dict:
    return {
        "command": "compare", "model": args.model, "data": args.data, "target": args.target, "split": args.split,
        "task": args.task, "methods": args.methods, "reference": args.reference, "seed": args.seed,
        "set": list(args.set),
    }


def _valid_compare_invocation(saved) -> bool:
    def text_or_none(value):
        return value is None or (isinstance(value, str) and len(value) < 4096)

    return (
        isinstance(saved, dict)
        # task: recorded since --task came; an older comparison without it guesses again, as it did
        and set(saved) - {"task"} == {"command", "model", "data", "target", "split", "methods", "reference", "seed", "set"}
        and saved.get("task") in (None, *TASKS)
        and saved["command"] == "compare"
        and saved["model"] in MODELS
        and isinstance(saved["data"], str) and len(saved["data"]) < 4096
        and all(text_or_none(saved[key]) for key in ("target", "methods", "reference"))
        and _split_or_none(saved["split"])
        and isinstance(saved["seed"], int) and not isinstance(saved["seed"], bool) and 0 <= saved["seed"] < 2**32
        and isinstance(saved["set"], list) and all(isinstance(item, str) and len(item) < 4096 for item in saved["set"])
    )


def _apply_compare_resume(args) -> None:
    """Fill the comparison's arguments from the unfinished one in --resume; refuse any given one that differs."""
    from ppl import _io

    folder = Path(args.resume)
    if args.out is not None and Path(args.out).resolve() != folder.resolve():
        raise UsageError(f"--resume {folder} continues in its own folder; drop --out {args.out}")
    if args.force:
        raise UsageError("--resume continues a comparison and --force starts one afresh; give one of them")
    if not folder.is_dir():
        raise UsageError(f"--resume {folder}: no such folder")
    if (folder / _io.COMPARISON_MANIFEST).exists():  # a comparison started by an older ppl has none
        owned = _owned_comparison(folder)
        if owned is not None and owned[0] == "complete":
            raise UsageError(f"--resume {folder}: this comparison finished (its report.html is there); nothing to continue")
    if (folder / "report.html").exists():
        raise UsageError(f"--resume {folder}: this comparison finished (its report.html is there); nothing to continue")
    try:
        saved = json.loads((folder / INVOCATION).read_text())
    except (OSError, ValueError):
        saved = None
    if not _valid_compare_invocation(saved):
        raise RunError(f"--resume {folder}: no valid {INVOCATION} of `ppl compare`; only a comparison that "
                       "`ppl compare` started can be continued")
    differences = []
    _take_saved_arguments(args, {k: v for k, v in saved.items() if k != "command"}, differences)
    if differences:
        raise ResumeError(f"{folder} was started differently — " + "; ".join(differences) + " — drop or match them")


def _compare_folder(args, data) -> Path:
    """The report folder: --out (refused when it holds anything but a report or an unfinished
    comparison, and either of those without --force), or a new numbered folder under runs/."""
    if args.out is not None:
        out = Path(args.out)
        status = (_owned_comparison(out) or (None,))[0]
        if status == "complete" and not args.force:
            raise UsageError(f"--out {out} already holds a report; choose another folder, or add --force to replace it")
        if status == "unfinished" and not args.force:
            raise UsageError(f"--out {out} holds a comparison that did not finish; continue it with "
                             f"ppl compare --resume {out}, or add --force to start afresh")
        return out
    split = "" if args.split is None else f"-split{args.split}"
    return _unused_folder(Path("runs") / f"compare-{data.name}{split}-{args.model}-seed{args.seed}")


def _invocation(args) -> dict:
    return {
        "model": args.model, "data": args.data, "target": args.target, "split": args.split, "task": args.task,
        "method": args.method, "seed": args.seed, "set": list(args.set),
    }


def _valid_invocation(saved) -> bool:
    def text_or_none(value):
        return value is None or (isinstance(value, str) and len(value) < 4096)

    return (
        isinstance(saved, dict)
        # split: since 0.1; task: since --task came (an older run without it guesses again, as it did)
        and set(saved) - {"split", "task"} == {"model", "data", "target", "method", "seed", "set"}
        and _split_or_none(saved.get("split"))
        and saved.get("task") in (None, *TASKS)
        and saved["model"] in MODELS
        and isinstance(saved["data"], str)
        and text_or_none(saved["target"])
        and text_or_none(saved["method"])
        and isinstance(saved["seed"], int) and not isinstance(saved["seed"], bool) and 0 <= saved["seed"] < 2**32
        and isinstance(saved["set"], list) and all(isinstance(item, str) for item in saved["set"])
    )


def _split_or_none(value) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 10**6)


def _apply_resume(args) -> None:
    """Fill the fit's arguments from the run being resumed; refuse any given one that differs."""
    from ppl._io import read_run_files

    folder = Path(args.resume)
    meta, _, extras = read_run_files(folder, (INVOCATION,))  # checked against the manifest, like every run file
    saved = extras.get(INVOCATION)
    model = meta.get("fingerprint", {}).get("model") if isinstance(meta.get("fingerprint"), dict) else None
    if saved is None and isinstance(model, dict) and model.get("kind") == "function":
        raise RunError(
            f"{folder}: a run of the plain NumPyro program {model.get('module')}.{model.get('qualname')}, which the "
            "command line cannot run; resume it in Python: ppl.fit(<the program>, data, method=..., seed=..., "
            f"resume={str(folder)!r})"
        )
    if not _valid_invocation(saved):
        raise RunError(f"{folder}: no valid {INVOCATION}; only runs written by `ppl fit` resume from the command line")
    differences = []
    _take_saved_arguments(args, saved, differences)
    if differences:
        raise ResumeError(f"{folder} was fitted differently — " + "; ".join(differences) + " — drop or match them")
    if args.out is None:
        args.out = str(folder)


def _take_saved_arguments(args, saved: dict, differences: list) -> None:
    """Fill the arguments not given from a saved invocation; note each given one that differs."""
    for key, value in saved.items():
        given = getattr(args, key)
        if given in (None, []):
            setattr(args, key, value)
        elif given != value:
            differences.append(f"--{key}: the run used {value!r}, now {given!r}")


def _request_devices(count) -> None:
    """``--devices N``. JAX gives a CPU one device unless asked for more before its first operation,
    so ask for N now (accelerators are unaffected: JAX then lists those). Once JAX has started (the
    CLI called in a process that already used it) it keeps the devices it has; ``ppl.fit`` then
    refuses an N above them, saying so."""
    import jax

    if count is not None:
        try:
            jax.config.update("jax_num_cpu_devices", int(count))
        except RuntimeError:
            pass


def _fit(args) -> int:
    import ppl
    from ppl import _interrupt, _io, _progress
    from ppl._posterior import derived_key
    from ppl.inference import registry

    _request_devices(args.devices)

    if args.resume:
        _apply_resume(args)
    if args.model is None or args.data is None:
        raise UsageError("ppl fit needs --model and --data (or --resume DIR to continue a run)")
    args.method = args.method or "nuts"
    args.seed = 0 if args.seed is None else args.seed
    method_cls = registry.get(args.method)
    model_opts, method_opts = _split_settings(args.set, _model_class(args.model), method_cls)
    data = _load_data(args)
    model = _build_model(args, data, model_opts)
    # Start-up is over: a Ctrl-C whose KeyboardInterrupt was dropped on the way stops here, before
    # the folder is touched.
    _interrupt.raise_pending()
    out = _out_folder(args, data)
    _check_out(out)
    # bars (on stderr) when stderr is a terminal, else a plain line every few seconds; never with --no-progress
    _progress.enable(False if args.no_progress else "auto-lines")
    invocation = _invocation(args)
    posterior = diagnostics = None
    record, extras = {"data": data.name, "model": args.model, "metrics": {}}, {}
    with _io.run_lock(out):
        try:
            # Through the fit and its diagnostics, a first Ctrl-C (or SIGTERM) only asks the running
            # loop to stop: the result reached is still diagnosed and saved. A second one skips to
            # saving what there is.
            with _interrupt.guard():
                if args.resume is None and (out / "manifest.json").is_file():
                    _io.read_run_meta(out)  # a corrupt folder is reported, not silently replaced
                target = _io.RunTarget(out, {INVOCATION: invocation})
                try:
                    posterior = ppl.fit(
                        model, data.train.X if args.model == "vae" else data.train, method=args.method,
                        seed=args.seed, checkpoint=target if args.checkpoint_every else None,
                        checkpoint_every=args.checkpoint_every, resume=args.resume, devices=args.devices,
                        **method_opts,
                    )
                except ppl.Interrupted as stop:
                    _io.save_run(out, None, resume_state=stop.resume_state, fingerprint=stop.fingerprint,
                                 status="interrupted", extra_files={INVOCATION: invocation})
                    print(f"interrupted before the first draw; the state is saved in {out} — continue with: "
                          f"ppl fit --resume {out}", file=sys.stderr)
                    return _interrupt.exit_status()
                except NonFiniteError as error:
                    if error.partial is not None:
                        _io.save_posterior(error.partial, out, extra_files={INVOCATION: invocation})
                        print(f"the last finite state is saved in {out} (marked failed)", file=sys.stderr)
                    raise
                posterior.provenance["data"].update(_data_source(args, data))
                if args.model != "vae" and len(data.test.X):
                    # the verdict also judges the predictive on the test split (ppl.diagnostics.heldout)
                    posterior.hold_out(*data.test)
                diagnostics = posterior.diagnostics()
            record["diagnostics"] = diagnostics.to_dict()
            if posterior.status.interrupted:
                # An interrupted run is saved at once: test metrics of a partial result can wait.
                record["skipped"] = "test metrics, as the run was interrupted (resuming it to the end computes them)"
            else:
                # No loop is left to ask: from here a Ctrl-C stops the test metrics at once, and one
                # pressed during the diagnostics stops them before they start.
                _interrupt.raise_pending()
                test_key = derived_key(args.seed, TEST_STREAM)
                if args.model == "vae":
                    from ppl.diagnostics.vae import vae_report

                    # Held-out quality of the VAE (the amortisation gap needs extra fits: ppl.diagnostics.vae_report).
                    record["metrics"] = vae_report(posterior, data.test.X, seed=test_key, gap_points=0).to_dict()
                    extras[VAE_FIGURE] = _vae_figure(posterior, data, test_key)
                else:
                    try:
                        record["metrics"] = ppl.evaluate(posterior, data.test, seed=test_key)
                    except MemoryBudgetError as error:
                        # The fit is worth keeping even when its test predictions would not fit in memory.
                        print(f"ppl fit: test metrics skipped: {error}", file=sys.stderr)
                if args.kfold:
                    if args.model == "vae":
                        raise UsageError("--kfold scores held-out targets; a VAE has none (see its test ELBO instead)")
                    cv = ppl.kfold(model, data.train, method=args.method, k=min(args.kfold, len(data.train.X)),
                                   seed=args.seed, **method_opts)
                    # A fold whose fit a Ctrl-C cut short scores nothing: drop them all.
                    _interrupt.raise_pending()
                    record["kfold"] = {"k": cv.k, "elpd": cv.elpd, "se": cv.se, "fits_ok": list(cv.fits_ok)}
        except KeyboardInterrupt:
            if posterior is None:
                raise  # stopped before the fit returned: main says so (a checkpoint, if any, is on disk)
            if diagnostics is None:
                with _interrupt.guard():  # a further Ctrl-C here would lose the fit: it waits for the save
                    _io.save_posterior(posterior, out, extra_files={INVOCATION: invocation}, with_diagnostics=False)
                print(f"interrupted; the result is saved in {out} without diagnostics (ppl.load computes them)",
                      file=sys.stderr)
                return _interrupt.exit_status()
            record["metrics"], extras = {}, {}
            record.pop("kfold", None)
            record["skipped"] = ("test metrics" + (" and k-fold" if args.kfold else "")
                                 + ", interrupted before they finished")
        with _interrupt.guard():  # a Ctrl-C during the save waits for it (a second one cuts it short)
            _io.save_posterior(posterior, out, extra_files={INVOCATION: invocation, "summary.json": record, **extras})
    _print_lines([
        *_what_ran(args.method, posterior.options, args.seed, posterior.provenance, posterior.info),
        *_loo_up_front(args.model, getattr(model, "likelihood", None)),
        diagnostics.table(),
        *_metrics_lines(record),
        *_kfold_lines(record),
        *_skipped_lines(record),
        f"saved to {out}",
        diagnostics.verdict(_held_out(record)),
    ])
    if posterior.status.interrupted:
        print(f"interrupted: the saved run is partial (see the warning above); continue with: ppl fit --resume {out}",
              file=sys.stderr)
        return _interrupt.exit_status()
    if "skipped" in record:
        print(f"interrupted: the fit is complete and saved in {out} with its diagnostics; skipped: {record['skipped']}",
              file=sys.stderr)
        return _interrupt.exit_status()
    return 0


VAE_FIGURE = "vae.png"
# The random stream of a fit's test metrics and figures, split from --seed: the fit itself uses the
# seed's own key, so the test draws neither repeat the fit's nor reach outside [0, 2**32).
TEST_STREAM = 1


def _vae_figure(posterior, data, seed) -> bytes:
    """PNG bytes: test images and their reconstructions, samples, and (2-D latents) the encoded test set."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    X = np.asarray(data.test.X)
    side = int(round(np.sqrt(X.shape[1])))
    square = side * side == X.shape[1]
    shown = X[:8]
    rows = [("test data", shown), ("reconstructions", posterior.reconstruct(shown, seed=seed)),
            ("samples", posterior.generate(8, seed=seed))]
    two_d = posterior.problem.model.latent_dim == 2
    fig = plt.figure(figsize=(10, 4.2 + (4.0 if two_d else 0.0)))
    grid = fig.add_gridspec(3 + (3 if two_d else 0), 8)
    for r, (label, images) in enumerate(rows):
        for c in range(8):
            ax = fig.add_subplot(grid[r, c])
            image = images[c].reshape(side, side) if square else images[c][None, :]
            ax.imshow(image, cmap="gray_r", vmin=0, vmax=1, aspect="equal" if square else "auto")
            ax.set_xticks([]), ax.set_yticks([])
            if c == 0:
                ax.set_ylabel(label, fontsize=8)
    if two_d:
        ax = fig.add_subplot(grid[3:, 1:7])
        loc, _ = posterior.encode(X)
        points = ax.scatter(loc[:, 0], loc[:, 1], c=data.test.y, cmap="tab10", s=8)
        ax.set_xlabel("z₁ (encoder mean)"), ax.set_ylabel("z₂")
        ax.set_title("test set in latent space (colour: label)", fontsize=9)
        fig.colorbar(points, ax=ax)
    fig.suptitle(f"VAE on {data.name}", fontsize=10)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def _out_folder(args, data) -> Path:
    """The run folder: --out (refused when it already holds a run, unless --force or --resume), or
    a new numbered folder under runs/ that no earlier run occupies."""
    if args.out is not None:
        out = Path(args.out)
        if (out / "manifest.json").exists() and not (args.force or args.resume):
            raise UsageError(
                f"--out {out} already holds a run; choose another folder, or add --force to replace it"
            )
        return out
    return _unused_folder(Path("runs") / f"{data.name}-{args.model}-{args.method}-seed{args.seed}")


def _unused_folder(base: Path) -> Path:
    """``base``, or ``base-2``, ``base-3``, … : the first that does not exist yet."""
    out, number = base, 1
    while out.exists():
        number += 1
        out = base.with_name(f"{base.name}-{number}")
    return out


def _check_out(out: Path) -> None:
    """Refuse an output path that could not be written, before anything is fitted."""
    from ppl._io import check_writable_run

    try:
        check_writable_run(out)
    except RunError as error:
        raise UsageError(f"--out {error}") from None
    _check_writable_parent(out)


def _check_writable_parent(out: Path) -> None:
    """Refuse ``out`` when the nearest folder that exists above it (or itself) is not writable."""
    import os

    parent = out
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise UsageError(f"--out {out}: {parent} is not a writable directory")


def _data_source(args, data) -> dict:
    """Where the command line's data came from and how it was prepared: what ``ppl predict`` needs to
    prepare raw rows the same way (input and target scaling, column names, class labels)."""
    import numpy as np

    is_file = Path(args.data).suffix in (".csv", ".npz")
    source = {
        "source": str(Path(args.data).resolve()) if is_file else args.data, "task": data.task,
        "test_rows": int(len(data.test.X)), "target": data.target, "features": data.features,
        "classes": data.classes, "target_mean": float(data.target_mean), "target_std": float(data.target_std),
    }
    if data.split is not None:
        source["split"] = int(data.split)
    if data.input_mean is not None:
        source["input_mean"] = np.asarray(data.input_mean, dtype=float).tolist()
        source["input_std"] = np.asarray(data.input_std, dtype=float).tolist()
    return source


def _scaling_text(data: dict) -> str | None:
    inputs = data.get("input_std")
    scaled_inputs = isinstance(inputs, list) and (any(v != 1.0 for v in inputs) or any(data.get("input_mean") or []))
    scaled_target = data.get("target_mean", 0.0) != 0.0 or data.get("target_std", 1.0) != 1.0
    parts = [name for name, scaled in (("inputs", scaled_inputs), ("target", scaled_target)) if scaled]
    if not parts:
        return None
    return f"{' and '.join(parts)} standardised with the training split's mean and sd"


def _shown_option(key: str, value, info: dict) -> str:
    """``key=value``, and for a choice left to the method (``"auto"``, None) what the run chose when
    its record says (``hessian='full' (from 'auto')``)."""
    chosen = info.get(key)
    if (value == "auto" or value is None) and isinstance(chosen, (str, int, float)) and not isinstance(chosen, bool) \
            and chosen != value:
        return f"{key}={chosen!r} (from {value!r})"
    return f"{key}={value!r}"


def _what_ran(method: str, options: dict, seed, provenance: dict, info: dict | None = None) -> list[str]:
    """Lines saying what ran: the model with its settings, the data, the method with its options
    (with the choices it resolved, from the run's ``info``), the seed and the package versions."""
    data = provenance.get("data") or {}
    source = data.get("source")
    rows = data.get("rows")
    described = f"{source}: " if source else ""
    described += f"{rows} training rows" if rows is not None else "the training data"
    if data.get("test_rows") is not None:
        described += f", {data['test_rows']} test rows"
    if data.get("target"):
        described += f"; target column {data['target']!r}"
    if _scaling_text(data):
        described += f"; {_scaling_text(data)}"
    shown_options = ", ".join(_shown_option(k, v, info or {}) for k, v in options.items())
    versions = ", ".join(f"{k} {v}" for k, v in (provenance.get("versions") or {}).items())
    replaced = []
    if provenance.get("declared_model"):
        replaced = [f"  replaced  by {provenance['replaced_by']}: {provenance.get('replaced')} — the posterior of the "
                    "model above, not of the declared one"]
    return [
        "what ran:",
        f"  model     {provenance.get('model', '?')}",
        *replaced,
        f"  data      {described}",
        f"  method    {method}({shown_options})",
        f"  seed      {seed}",
        f"  versions  {versions or 'not recorded'}",
    ]


def _metrics_lines(record: dict) -> list[str]:
    metrics = record.get("metrics") or {}
    if not metrics:
        return []
    lines = [f"test metrics — {record.get('data', '?')} / {record.get('model', '?')}:"]
    for key, value in metrics.items():
        if isinstance(value, float):
            shown = f"{value:.4f}"
        elif isinstance(value, int) and not isinstance(value, bool):
            shown = str(value)
        else:
            shown = "—" if value is None else repr(value)
        lines.append(f"  {key:<18} {shown}")
    return lines


def _skipped_lines(record: dict) -> list[str]:
    skipped = record.get("skipped")
    # summary.json is read from disk: anything but the sentence written here is left out
    return [f"skipped: {skipped}"] if isinstance(skipped, str) and len(skipped) < 300 else []


def _kfold_lines(record: dict) -> list[str]:
    cv = record.get("kfold")
    number = (int, float)
    # summary.json is read from disk: anything but the shape written here is left out
    if not (isinstance(cv, dict) and isinstance(cv.get("elpd"), number) and isinstance(cv.get("se"), number)
            and isinstance(cv.get("k"), int) and isinstance(cv.get("fits_ok"), list)):
        return []
    failed = [str(i) for i, ok in enumerate(cv.get("fits_ok") or []) if not ok]
    line = f"elpd_kfold {cv['elpd']:.2f} ± {cv['se']:.2f} ({cv['k']}-fold cross-validation on the training rows)"
    if failed:
        line += f"; the fits of fold(s) {', '.join(failed)} failed their own diagnostics"
    return [line]


def _held_out(record: dict) -> str | None:
    nll = (record.get("metrics") or {}).get("nll")
    return f"test NLL {nll:.4f} per point" if isinstance(nll, float) else None


def _loo_up_front(model: str, likelihood) -> list[str]:
    """BNN classifiers: most points' Pareto k exceeds 0.7, so say it before the numbers."""
    if model == "bnn" and likelihood in ("bernoulli", "categorical"):
        return [
            "note: for a BNN classifier PSIS-LOO is unreliable for most points (Pareto k > 0.7) whatever the "
            "method; the held-out test log-likelihood (test NLL below) is the primary figure of predictive fit, "
            "and ppl fit --kfold K gives cross-validated elpd"
        ]
    return []


def _print_lines(lines) -> None:
    """Plain lines, never re-wrapped or styled (the layout holds when stdout is not a terminal);
    text read from a run folder is shown with control characters escaped."""
    for line in lines:
        print(_safe(line))


def _safe(text) -> str:
    """Text read from a run folder, with control characters (terminal escapes) shown escaped."""
    return "".join(c if c.isprintable() or c == "\n" else repr(c)[1:-1] for c in str(text))


def _run_folder(path: Path) -> Path:
    """The run folder at ``path``, or the one holding the file ``path`` names."""
    if path.is_dir() or not path.exists():
        return path
    for parent in path.resolve().parents:
        if (parent / "manifest.json").is_file():
            return parent
    raise RunError(f"{path} is a file, and no folder above it holds a saved ppl run; give the run folder")


def _plots(posterior, path: Path) -> list[str]:
    """Write the run's figures into its folder, as files of the run (its manifest lists them, so
    that ``ppl calibrate`` and a later ``--plots`` keep or replace them)."""
    import tempfile

    from ppl import _io
    from ppl.diagnostics.plots import write_plots

    # a plain program's run loads detached (its program is never imported): trace, rank and loss
    # plots come from the saved draws and records, the predictive needs the model
    with tempfile.TemporaryDirectory() as scratch:
        figures = {p.name: p.read_bytes() for p in write_plots(posterior, scratch)}
    if not figures:
        return ["figures: none applies to this run"]
    _io.add_run_files(path, figures)
    return ["figures: " + ", ".join(str(path / name) for name in figures)]


def _show(args) -> int:
    """Print a saved run. Nothing the folder names is imported, and no saved verdict is believed: a
    run of a ppl model is loaded and diagnosed again from its stored draws; a run whose model cannot
    be run here (a Network's, a plain program's) shows its saved figures with the verdict decided
    again from them."""
    import ppl
    from ppl._calibrate import CALIBRATION_FILE
    from ppl._io import read_run_files, saved_diagnostics

    path = _run_folder(Path(args.path))
    meta, diagnostics, extras = read_run_files(path, ("summary.json", CALIBRATION_FILE))
    status = meta["status"]
    if not meta["has_posterior"]:
        progress = (meta.get("resume") or {}).get("progress")
        _print_lines([
            f"{path}: {status} run with no draws yet (progress {progress}); continue with: ppl fit --resume {path}",
            "verdict: not assessed — a checkpoint with no draws yet",
        ])
        return 0
    model = meta["model"]
    network = model["kind"] == "declarative" and model.get("class") == "Network"
    if network:
        fields = model.get("fields") if isinstance(model.get("fields"), dict) else {}
        described = (f"Network (apply function {str(fields.get('apply_fn'))[:200]}, likelihood "
                     f"{str(fields.get('likelihood'))[:40]}; reloads in Python given the model: ppl.load(path, model=...))")
    elif model["kind"] == "declarative":
        from ppl.models import from_config

        try:
            described = repr(from_config(model))  # the same check ppl.load makes, without running anything
        except (ValueError, TypeError, KeyError) as error:
            raise RunError(f"{path}/posterior.json: the model configuration is invalid ({error})") from None
    else:
        described = f"program {model['module']}.{model['qualname']}"
    # the model is described from the checked record that loading uses, never from free text
    provenance = {**meta["provenance"], "model": described}
    sites = ", ".join(f"{name}{tuple(shape)}" for name, shape, _ in meta["sites"])
    lines = [
        f"{path}: {meta['method']} — {meta['num_chains']} chain(s) × {meta['num_draws']} draws, status {status}",
        *_what_ran(meta["method"], meta["options"], meta["seed"], provenance, meta["info"]),
        f"  sites     {sites}",
    ]
    if meta["deterministic"]:
        lines.append("  deterministic sites: " + ", ".join(f"{name}{tuple(shape)}" for name, shape in meta["deterministic"]))
    if meta["function_sites"]:
        lines.append(f"  function sites (function-space R-hat): {', '.join(meta['function_sites'])}")
    if meta.get("resume") and model["kind"] == "function":
        lines.append(
            f"resumable: progress {meta['resume']['progress']} — continue in Python with: "
            f"ppl.fit(<the program>, data, method=..., seed=..., resume={str(path)!r})"
        )
    elif meta.get("resume"):
        lines.append(f"resumable: progress {meta['resume']['progress']} — continue with: ppl fit --resume {path}")
    summary = extras.get("summary.json")
    summary = summary if isinstance(summary, dict) and isinstance(summary.get("metrics"), dict) else {}
    posterior = None if network else ppl.load(path)  # a plain program's run loads detached
    if posterior is None:
        record = saved_diagnostics(path)
    elif posterior.is_detached and diagnostics is None:
        record = None
    else:
        # recomputed from the stored draws; a detached run's are its saved figures, judged again on load
        record = posterior.diagnostics()
    if record is not None:
        if model.get("class") == "BNN":
            lines.extend(_loo_up_front("bnn", model.get("fields", {}).get("likelihood")))
        lines.append(record.table())
    lines.extend(_metrics_lines(summary))
    lines.extend(_kfold_lines(summary))
    lines.extend(_skipped_lines(summary))
    if CALIBRATION_FILE in extras:
        lines.append(_calibration_line(extras[CALIBRATION_FILE], model, path / CALIBRATION_FILE))
    if model.get("class") == "VAE" and (path / VAE_FIGURE).is_file():
        lines.append(f"figure (test data, reconstructions, samples; latent space for 2-D latents): {path / VAE_FIGURE}")
    if args.plots and network:
        lines.append("figures: a Network's forward pass is code that ppl show never imports; in Python, "
                     f"ppl.load({str(path)!r}, model=<the network>) gives the posterior to plot")
    elif args.plots:
        lines.extend(_plots(posterior, path))
    if record is not None:
        lines.append(record.verdict(_held_out(summary)))
    elif model["kind"] == "function":
        # Computing them would run the program, which ppl show never imports: say what is known, then why not more.
        _print_lines(lines)
        raise RunError(_safe(
            f"{path}: no diagnostics saved ({meta.get('diagnostics_error') or 'a checkpoint, or an interrupted save'}), "
            f"and computing them needs the program {model['module']}.{model['qualname']}, which ppl show never "
            f"imports — in Python: ppl.load({str(path)!r}, model=<the program>).diagnostics()"
        ))
    else:
        why = meta.get("diagnostics_error") or "a checkpoint, or an interrupted save"
        lines.append(f"verdict: not assessed — no diagnostics saved ({why}); ppl.load computes them")
    _print_lines(lines)
    return 0


def _calibration_line(record, model: dict, where: Path) -> str:
    """What ``ppl calibrate`` saved in the run, checked as loading checks it."""
    from ppl._calibrate import calibration_from_record
    from ppl.models._base import REGRESSION_LIKELIHOODS

    likelihood = (model.get("fields") or {}).get("likelihood")
    task = "regression" if likelihood in REGRESSION_LIKELIHOODS else "classification"
    calibration = calibration_from_record(None, record, str(where), task=task)
    return f"calibration (ppl calibrate; ppl predict applies it): {calibration}"


def _preparation(data: dict, num_features: int, where: Path) -> dict:
    """The saved preparation of the training rows, checked (it is read from disk)."""
    import math

    def numbers(value, length):
        return (isinstance(value, list) and len(value) == length
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value))

    def names(value, length=None):
        return value is None or (isinstance(value, list) and all(isinstance(v, str) for v in value)
                                 and (length is None or len(value) == length))

    prep = {"mean": None, "std": None, "target_mean": 0.0, "target_std": 1.0,
            "features": data.get("features"), "target": data.get("target"), "classes": data.get("classes")}
    if "input_mean" in data or "input_std" in data:
        if not (numbers(data.get("input_mean"), num_features) and numbers(data.get("input_std"), num_features)
                and all(v > 0 for v in data["input_std"])):
            raise RunError(f"{where}/posterior.json: the saved input scaling is not {num_features} finite means and positive sds")
        prep["mean"], prep["std"] = data["input_mean"], data["input_std"]
    for key in ("target_mean", "target_std"):
        if key in data:
            if not numbers([data[key]], 1) or (key == "target_std" and data[key] <= 0):
                raise RunError(f"{where}/posterior.json: the saved {key} is not a finite (positive) number")
            prep[key] = float(data[key])
    if not (names(prep["features"], num_features) and names(prep["classes"])
            and (prep["target"] is None or isinstance(prep["target"], str))):
        raise RunError(f"{where}/posterior.json: the saved column names or class labels are malformed")
    return prep


def _supervised_run(folder: Path, command: str, extra: str | None = None):
    """(posterior, the saved preparation of its training rows, the run's file ``extra`` or None) of a
    saved run of a supervised ppl model."""
    from ppl import _io

    posterior, file = _io.load_with(folder, extra)
    problem = posterior.problem
    if problem is None or not problem.is_declarative or problem.spec.kind == "unsupervised":
        raise UsageError(f"ppl {command} needs a supervised model from ppl.models; {folder} holds a {posterior.method} run "
                         "of another kind (for a NumPyro program use numpyro.infer.Predictive with its draws)")
    num_features = int(problem.data_X.shape[1])
    return posterior, _preparation(posterior.provenance.get("data") or {}, num_features, folder), file


def _kept_columns(data: str, names: str | None, num_rows: int) -> dict:
    """{name: the column's cells as written} of ``--keep-columns`` from the ``--data`` CSV."""
    if names is None:
        return {}
    if Path(data).suffix != ".csv":
        raise UsageError(f"--keep-columns copies columns of a .csv file; --data {data} is not one (a .npz file or a "
                         "dataset's test split has no columns beyond its inputs)")
    import csv

    try:
        with open(data, newline="", encoding="utf-8-sig") as handle:
            records = list(csv.reader(handle))
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise UsageError(f"--keep-columns: {data} cannot be read again ({error})") from None
    header = [cell.strip() for cell in records[0]] if records else []
    wanted = header if names.strip() == "all" else [name.strip() for name in names.split(",") if name.strip()]
    missing = [name for name in wanted if name not in header]
    if missing or not wanted:
        raise UsageError(f"--keep-columns: {data} has no column {', '.join(map(repr, missing)) or 'named'}"
                         f"{''.join(did_you_mean(name, header) for name in missing)}; its columns are "
                         f"{', '.join(header)} (or give 'all')")
    rows = [record for record in records[1:] if record]  # blank lines are skipped, as in reading the inputs
    if len(rows) != num_rows:
        raise UsageError(f"--keep-columns: {data} has {len(rows)} rows with cells, but {num_rows} were predicted")
    return {name: [row[header.index(name)] if header.index(name) < len(row) else "" for row in rows] for name in wanted}


def _raw_rows(data: str, posterior, prep: dict, command: str):
    """(X prepared as the training rows were, y in raw units or None, a description) of ``--data``:
    a .csv/.npz file of raw rows, or (ppl predict only) a dataset name for its test split."""
    import numpy as np

    from ppl import datasets

    num_features = int(posterior.problem.data_X.shape[1])
    if Path(data).suffix in (".csv", ".npz"):
        raw, y = datasets.read_rows(data, num_features=num_features, features=prep["features"],
                                    target=prep["target"], classes=prep["classes"])
        described = f"{data}: {len(raw)} rows"
    elif data in datasets.names() and command == "calibrate":
        raise UsageError(f"--data {data}: a dataset name stands for its test split, which must stay unseen to score "
                         "the calibrated run; give held-out labelled rows as a .csv or .npz file instead")
    elif data in datasets.names():
        seed = posterior.seed if isinstance(posterior.seed, int) else 0
        if data in datasets.UCI_FOLDERS:
            saved = posterior.provenance.get("data") or {}
            split = saved.get("split") if saved.get("source") == data and _split_or_none(saved.get("split")) else None
            ds = datasets.load(data, split=split or 0)
            picked = f"split {split or 0}"
        else:
            ds = datasets.load(data, seed=seed)
            picked = f"seed {seed}"
        if ds.input_mean is None or ds.test.X.shape[1] != num_features:
            raise UsageError(f"--data {data}: its rows have {ds.test.X.shape[1]} columns; the run was fitted on {num_features}")
        raw = np.asarray(ds.test.X) * np.asarray(ds.input_std) + np.asarray(ds.input_mean)
        y = np.asarray(ds.test.y, dtype=float)
        if ds.task == "regression":
            y = y * ds.target_std + ds.target_mean
        described = f"the test split of {data} ({picked}): {len(raw)} rows"
    else:
        raise UsageError(f"--data {data!r} is neither a dataset ({', '.join(datasets.names())}) nor a .csv/.npz "
                         f"file{did_you_mean(data, datasets.names())}")
    if prep["mean"] is None:
        X = raw
        described += "; the run records no input scaling (fitted through the API), so rows are used as they are"
    else:
        X = (raw - np.asarray(prep["mean"])) / np.asarray(prep["std"])
    return X, y, described


def _predict(args) -> int:
    """Predict raw rows with a saved run: prepare them as its training rows were, report in raw units."""
    from ppl._calibrate import CALIBRATION_FILE, Conformal, calibration_from_record

    folder = _run_folder(Path(args.run))
    posterior, prep, record = _supervised_run(folder, "predict", CALIBRATION_FILE)
    if not 0.0 < args.level < 1.0:
        raise UsageError(f"--level must lie in (0, 1), got {args.level}")
    X, y, described = _raw_rows(args.data, posterior, prep, "predict")
    kept = _kept_columns(args.data, args.keep_columns, len(X))
    calibration = None
    if record is not None and not args.uncalibrated:
        calibration = calibration_from_record(posterior, record, f"{folder}/{CALIBRATION_FILE}")
        if args.num_samples is not None and calibration.num_samples != args.num_samples:
            raise UsageError(
                f"--num-samples {args.num_samples}: the run's calibration was fitted with "
                f"{calibration.num_samples or 'all stored'} draws and holds only for those; leave --num-samples out, "
                "or pass --uncalibrated"
            )
    sets = None
    if calibration is None:
        prediction = posterior.predict(X, seed=args.seed, num_samples=args.num_samples)
    elif isinstance(calibration, Conformal):
        # one prediction serves both the probabilities and the sets
        prediction = calibration._predict(X, args.seed)
        sets = calibration._sets_from(prediction, args.seed)
    else:
        prediction = calibration.predict(X, seed=args.seed)
    columns, summary = _prediction_columns(prediction, y, prep, args.level, sets, calibration if sets is not None else None)
    clash = sorted(set(kept) & set(columns))
    if clash:
        raise UsageError(f"--keep-columns: {', '.join(map(repr, clash))} would repeat the name of a prediction column; "
                         "rename that column in the file, or leave it out")
    columns = {**kept, **columns}
    header = list(columns)
    rows = zip(*(columns[name] for name in header))
    import csv
    import io

    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(header)
    writer.writerows([f"{v:.6g}" if isinstance(v, float) else v for v in row] for row in rows)
    if args.out:
        Path(args.out).write_text(text.getvalue())
    else:
        sys.stdout.write(text.getvalue())
    report = sys.stdout if args.out else sys.stderr
    print(_safe(f"predicted {described} with {folder} ({posterior.method})"
                + (f"; written to {args.out}" if args.out else "")), file=report)
    if calibration is not None:
        print(_safe(f"  calibrated as ppl calibrate saved it (--uncalibrated ignores it): {calibration}"), file=report)
    elif record is not None:
        print("  --uncalibrated: the run's saved calibration is not applied", file=report)
    for line in summary:
        print(_safe(line), file=report)
    return 0


def _calibrate(args) -> int:
    """Fit a temperature and/or conformal sets to a saved run on held-out rows and save them into it."""
    import numpy as np

    import ppl
    from ppl import _io
    from ppl._calibrate import CALIBRATION_FILE, _supervised_task, calibration_record

    folder = _run_folder(Path(args.run))
    posterior, prep, _ = _supervised_run(folder, "calibrate")
    regression = _supervised_task(posterior, "ppl calibrate") == "regression"
    temperature = not args.no_temperature and not regression
    if args.alpha is None and not temperature:
        raise UsageError(
            "nothing to calibrate: " + ("a regression run has no temperature to fit; " if regression else "")
            + "give --alpha (e.g. --alpha 0.1) for split-conformal " + ("intervals" if regression else "sets")
        )
    if args.score is not None and args.alpha is None:
        raise UsageError(f"--score {args.score} chooses the conformal score; give --alpha as well")
    X, y, described = _raw_rows(args.data, posterior, prep, "calibrate")
    if y is None:
        raise UsageError(f"--data {args.data}: has no target column {prep['target']!r}; calibrating needs the labels")
    y = y if not regression else (y - prep["target_mean"]) / prep["target_std"]
    y = y.astype(np.int64) if not regression else y
    lines = [f"calibrating {folder} ({posterior.method}) on {described}"]
    if temperature and args.alpha is not None:
        # The conformal threshold needs points the temperature was not fitted on: split the rows in two.
        order = np.random.default_rng(args.seed).permutation(len(X))
        half = len(X) // 2
        first, second = order[:half], order[half:]
        lines.append(f"  the rows are split in two at random (seed {args.seed}): {len(first)} fit the temperature, "
                     f"{len(second)} the conformal threshold")
    else:
        first = second = np.arange(len(X))
    result = None
    if temperature:
        result = ppl.calibrate(posterior, (X[first], y[first]), seed=args.seed, num_samples=args.num_samples)
        lines.append(str(result))
    if args.alpha is not None:
        base = result if result is not None else posterior
        options = {} if result is not None else {"num_samples": args.num_samples}
        result = ppl.conformal(base, (X[second], y[second]), alpha=args.alpha, seed=args.seed, score=args.score, **options)
        lines.append(str(result))
    _io.add_run_files(folder, {CALIBRATION_FILE: calibration_record(result)})
    lines.append(f"saved to {folder / CALIBRATION_FILE}; ppl predict {folder} now applies it, and ppl show prints it")
    _print_lines([_safe(line) for line in lines])
    return 0


def _prediction_columns(prediction, y, prep: dict, level: float, sets=None, conformal=None) -> tuple[dict, list[str]]:
    """CSV columns of a prediction in the data's own units (and a summary when targets are known);
    ``sets`` are a :class:`Conformal`'s sets or intervals for the same rows, ``conformal`` that object."""
    import numpy as np

    columns, summary = {}, []
    target = None if conformal is None else f"{1 - conformal.alpha:.3g}"
    if prediction.task == "regression":
        scale, shift = prep["target_std"], prep["target_mean"]
        lower, upper = prediction.interval(level)
        outputs = prediction.mean.shape[1] if prediction.mean.ndim == 2 else None
        for k in range(outputs or 1):
            pick = (lambda a: a[:, k]) if outputs else (lambda a: a)
            suffix = f"_{k}" if outputs else ""
            columns[f"mean{suffix}"] = (pick(prediction.mean) * scale + shift).tolist()
            columns[f"sd{suffix}"] = (np.sqrt(pick(prediction.variance)) * scale).tolist()
            percent = f"{level * 100:g}"
            columns[f"lower_{percent}{suffix}"] = (pick(lower) * scale + shift).tolist()
            columns[f"upper_{percent}{suffix}"] = (pick(upper) * scale + shift).tolist()
            columns[f"epistemic_sd{suffix}"] = (np.sqrt(pick(prediction.epistemic_variance)) * scale).tolist()
            columns[f"aleatoric_sd{suffix}"] = (np.sqrt(pick(prediction.aleatoric_variance)) * scale).tolist()
            if sets is not None:
                columns[f"conformal_lower{suffix}"] = (pick(sets[0]) * scale + shift).tolist()
                columns[f"conformal_upper{suffix}"] = (pick(sets[1]) * scale + shift).tolist()
        if y is not None and sets is not None:
            inside = (y >= sets[0] * scale + shift) & (y <= sets[1] * scale + shift)
            inside = inside.all(axis=1) if inside.ndim == 2 else inside
            summary.append(f"  conformal intervals (target coverage {target}): coverage {inside.mean():.3f}, mean width "
                           f"{np.mean((sets[1] - sets[0]) * scale):.4g}")
        if y is not None:
            log_density = prediction.log_prob((y - shift) / scale) - (outputs or 1) * np.log(scale)
            columns["log_predictive"] = log_density.tolist()
            inside = (y >= lower * scale + shift) & (y <= upper * scale + shift)
            summary.append(
                f"  nll {-log_density.mean():.4f} (per row, in the target's units), "
                f"rmse {np.sqrt(np.mean(np.square(prediction.mean * scale + shift - y))):.4g}, "
                f"coverage of the {level:.0%} intervals {inside.mean():.3f}"
            )
        return columns, summary
    labels = prep["classes"] or [str(c) for c in range(prediction.probs.shape[1])]
    for c, label in enumerate(labels):
        columns[f"p_{label}"] = prediction.probs[:, c].tolist()
    columns["predicted"] = [labels[i] for i in np.argmax(prediction.probs, axis=1)]
    columns["entropy"] = prediction.entropy.tolist()
    if prediction.aleatoric is not None:
        columns["aleatoric"] = prediction.aleatoric.tolist()
        columns["epistemic"] = prediction.epistemic.tolist()
    if sets is not None:
        columns["conformal_set"] = ["|".join(label for label, inside in zip(labels, row) if inside) for row in sets]
        if y is not None:
            covered = sets[np.arange(len(y)), y.astype(int)]
            summary.append(f"  conformal sets (target coverage {target}): coverage {covered.mean():.3f}, mean size "
                           f"{sets.sum(axis=1).mean():.3g}, empty {np.mean(sets.sum(axis=1) == 0):.3f}")
    if y is not None:
        log_density = prediction.log_prob(y)
        columns["log_predictive"] = log_density.tolist()
        accuracy = float(np.mean(np.argmax(prediction.probs, axis=1) == y.astype(int)))
        summary.append(f"  nll {-log_density.mean():.4f} per row, accuracy {accuracy:.4f}")
    return columns, summary


def _datasets(args) -> int:
    from ppl.datasets import DESCRIPTIONS

    for name, text in DESCRIPTIONS.items():
        print(f"{name:<15} {text}")
    return 0


def _methods(args) -> int:
    from ppl._methods_text import METHODS_TEXT  # written from the classes; see ppl/_catalogue.py

    print(METHODS_TEXT, end="")
    return 0


def main(argv=None) -> int:
    from ppl import _interrupt

    handlers = {"fit": _fit, "compare": _compare, "show": _show, "predict": _predict, "calibrate": _calibrate,
                "datasets": _datasets, "methods": _methods}
    name = "ppl"  # "ppl fit", "ppl show", … once the arguments are parsed
    # Ctrl-C and SIGTERM (a scheduler, `timeout`, a container stop) are the command's from its first
    # moment to its last: each is remembered until acted on, and ends the command with 128 + its number.
    with _interrupt.command():
        try:
            args = _parser().parse_args(argv)
            name = f"ppl {args.command}"
            if not getattr(args, "no_cache", True):
                use_compilation_cache()
            code = handlers[args.command](args)
            if code == 0 and _interrupt.pending():
                # The signal came as the command finished, or its KeyboardInterrupt was dropped where
                # nothing read the request: the output is complete, but a caller must still see the stop.
                print(f"{name}: interrupted as it finished; what it printed and saved is complete",
                      file=sys.stderr)
                return _interrupt.exit_status()
            return code
        except (UsageError, DataError, OptionError, MemoryBudgetError, RunError, ResumeError) as error:
            print(f"{name}: error: {error}", file=sys.stderr)
            return 2
        except NonFiniteError as error:
            print(f"{name}: training failed: {error}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print(f"{name}: interrupted before there was anything to save", file=sys.stderr)
            return _interrupt.exit_status()
        except BrokenPipeError:
            # the reader went away (`ppl methods | head`): stop quietly, as other command-line tools do
            import os

            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0


if __name__ == "__main__":
    sys.exit(main())
