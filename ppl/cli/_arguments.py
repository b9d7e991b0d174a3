"""The command line's arguments: the parser, its value checks and the choices it offers.

Imports nothing heavy: parsing (and ``ppl --help``) runs before any command module is loaded.
"""

from __future__ import annotations

import argparse
import re
from importlib import metadata

from ppl.core.cache import CACHE_ENV
from ppl.core.errors import did_you_mean
import ppl


MODELS = ("linear", "logistic", "bnn", "vae")


TASKS = ("regression", "classification")


TASK_HELP = (
    "what a .csv/.npz file's target is (default: guessed — text labels, or at most 20 distinct integers 0..K-1, "
    "make a classification; other numbers a regression)"
)


DEVICES_HELP = (
    "run on N devices (GPUs, or N CPU host devices on a CPU): chains and ensemble members are split over them, "
    "a single run's minibatches and particles partitioned over them (default: every device JAX sees)"
)


COMPARE_DATA = "two_moons"


class UsageError(Exception):
    """Bad command-line input: reported on stderr, exit status 2, nothing written."""


class _Parser(argparse.ArgumentParser):
    """argparse with a "did you mean" for a misspelt choice (a model, a subcommand, a score)."""

    def error(self, message):
        found = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if found:
            message += did_you_mean(found.group(1), re.findall(r"'([^']*)'", found.group(2)) or found.group(2).split(", "))
        super().error(message)


def parse_arguments(parser: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """``parser.parse_args(argv)``, but an unknown flag is reported by the subcommand it was given
    to, with its usage, a "did you mean" for a near miss of one of its flags, and the flags it has."""
    args, extra = parser.parse_known_args(argv)
    if not extra:
        return args
    command = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[args.command]
    flags = sorted({s for action in command._actions for s in action.option_strings if s.startswith("--")})
    unknown = [e.split("=", 1)[0] for e in extra if e.startswith("-")]
    hints = "".join(did_you_mean(flag, flags) for flag in unknown[:1])
    command.error(f"unrecognized arguments: {' '.join(extra)}{hints}; the options of ppl {args.command} are "
                  f"{', '.join(flags)}")


def require_model_and_data(args) -> None:
    """``ppl fit`` fits nothing without both (a resumed run takes them from the run it continues)."""
    if args.model is None or args.data is None:
        raise UsageError("ppl fit needs --model and --data (or --resume DIR to continue a run)")


def build_parser() -> argparse.ArgumentParser:
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
    comp.add_argument("--no-progress", action="store_true",
                      help="hide the progress lines of each fit (the comparison's own log stays)")
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
    try:
        return metadata.version("ppl")
    except metadata.PackageNotFoundError:
        return ppl.__version__


def _integer(low: int, high: int | None, rule: str):
    """An argparse ``type``: an integer in [low, high) (no upper end when ``high`` is None), refused
    with ``rule``; text that is no integer at all reads "invalid integer value: 'abc'"."""

    def parse(text: str) -> int:
        value = int(text)
        if value < low or (high is not None and value >= high):
            raise argparse.ArgumentTypeError(f"{rule}, got {value}")
        return value

    parse.__name__ = "integer"  # the word argparse puts in "invalid integer value"
    return parse


_seed = _integer(0, 2**32, "seed must be an integer in [0, 2**32)")
_at_least_two = _integer(2, None, "must be an integer of at least 2")
_split_number = _integer(0, None, "a split number is 0 or more")
_positive = _integer(1, None, "must be a positive integer")
