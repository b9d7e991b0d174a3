"""The ``ppl`` command line: fit, show, datasets, methods.

Bad input or usage exits with status 2 and writes nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import typing
from pathlib import Path

from ppl._errors import DataError, MemoryBudgetError, NonFiniteError, OptionError

MODELS = ("linear", "logistic", "bnn")


class UsageError(Exception):
    """Bad command-line input: reported on stderr, exit status 2, nothing written."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ppl", description="Bayesian inference for neural-network weights.")
    sub = parser.add_subparsers(dest="command", required=True)
    fit = sub.add_parser("fit", help="fit a model, print diagnostics and test metrics, save the run")
    fit.add_argument("--model", choices=MODELS, required=True)
    fit.add_argument("--data", required=True, help="a dataset name (see `ppl datasets`) or a .csv/.npz file")
    fit.add_argument("--target", help="target column of a CSV file (default: the last column)")
    fit.add_argument("--method", default="nuts", help="a method name (see `ppl methods`)")
    fit.add_argument("--seed", type=_seed, default=0)
    fit.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="a model option (e.g. hidden=32,32) or method option (e.g. num_samples=500); repeatable",
    )
    fit.add_argument("--out", help="run directory (default: runs/<data>-<model>-<method>-seed<N>)")
    fit.add_argument("--no-progress", action="store_true", help="hide progress bars")
    show = sub.add_parser("show", help="print a saved run")
    show.add_argument("path")
    sub.add_parser("datasets", help="list the bundled datasets")
    sub.add_parser("methods", help="list the methods with their options and defaults")
    return parser


def _seed(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"seed must be a non-negative integer, got {value}")
    return value


def _model_class(name: str):
    from ppl.models import BNN, LinearRegression, LogisticRegression

    return {"linear": LinearRegression, "logistic": LogisticRegression, "bnn": BNN}[name]


def _split_settings(settings: list[str], model_cls, method_cls) -> tuple[dict, dict]:
    from ppl.inference._base import parse_value

    model_fields = {f.name for f in dataclasses.fields(model_cls)}
    method_fields = set(method_cls.option_defaults())
    model_hints = typing.get_type_hints(model_cls)
    model_opts, method_opts = {}, {}
    for item in settings:
        if "=" not in item:
            raise UsageError(f"--set {item!r}: expected KEY=VALUE")
        key, text = item.split("=", 1)
        if key in model_fields and key != "prior":
            model_opts[key] = parse_value(text, model_hints[key], f"model option {key}")
        elif key in method_fields:
            method_opts[key] = method_cls.parse_option(key, text)
        else:
            raise UsageError(
                f"--set {key}: not an option of {model_cls.__name__} ({', '.join(sorted(model_fields - {'prior'}))}) "
                f"nor of method {method_cls.name!r} ({', '.join(sorted(method_fields))})"
            )
    return model_opts, method_opts


def _load_data(args):
    from ppl import datasets

    if Path(args.data).suffix in (".csv", ".npz"):
        return datasets.load_file(args.data, target=args.target, seed=args.seed)
    if args.data not in datasets.names():
        raise UsageError(f"--data {args.data!r} is neither a dataset ({', '.join(datasets.names())}) nor a .csv/.npz file")
    return datasets.load(args.data, seed=args.seed)


def _build_model(args, data, model_opts):
    cls = _model_class(args.model)
    if args.model == "linear" and data.task != "regression":
        raise UsageError(f"--model linear needs a regression dataset; {data.name} is {data.task}")
    if args.model == "logistic" and (data.task != "classification" or data.num_classes != 2):
        raise UsageError(f"--model logistic needs binary labels; {data.name} has {data.num_classes or 'continuous'} targets")
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


def _fit(args) -> int:
    import ppl
    from ppl import _progress
    from ppl.inference import registry

    method_cls = registry.get(args.method)
    model_opts, method_opts = _split_settings(args.set, _model_class(args.model), method_cls)
    data = _load_data(args)
    model = _build_model(args, data, model_opts)
    out = Path(args.out or f"runs/{data.name}-{args.model}-{args.method}-seed{args.seed}")
    _check_out(out)
    _progress.enable(not args.no_progress)
    posterior = ppl.fit(model, data.train, method=args.method, seed=args.seed, **method_opts)
    diagnostics = posterior.diagnostics()
    metrics = ppl.evaluate(posterior, data.test, seed=args.seed + 1)
    posterior.save(out)
    from ppl._io import write_atomic

    record = {"data": data.name, "model": args.model, "metrics": metrics, "diagnostics": _jsonable(diagnostics.to_dict())}
    write_atomic(out / "summary.json", lambda f: f.write(json.dumps(record, indent=2).encode()))
    _print_run(record, diagnostics)
    print(f"saved to {out}")
    if posterior.info.get("interrupted"):
        print("interrupted: the saved run is partial (see the warning above)", file=sys.stderr)
        return 130
    return 0


def _check_out(out: Path) -> None:
    """Refuse an output path that could not be written, before anything is fitted."""
    import os

    if out.exists():
        if not out.is_dir():
            raise UsageError(f"--out {out} is an existing file, not a directory; choose another path")
        if any(out.iterdir()) and not (out / "posterior.json").is_file():
            raise UsageError(f"--out {out} exists and is not a ppl run directory; choose another")
    parent = out
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise UsageError(f"--out {out}: {parent} is not a writable directory")


def _jsonable(obj):
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and obj != obj:
        return None
    if isinstance(obj, float) and obj in (float("inf"), float("-inf")):
        return str(obj)
    return obj


def _print_run(record: dict, diagnostics) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(str(diagnostics))
    table = Table(title=f"test metrics — {record['data']} / {record['model']}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in record["metrics"].items():
        table.add_row(key, f"{value:.4f}")
    console.print(table)


def _show(args) -> int:
    import ppl

    path = Path(args.path)
    if not (path / "posterior.json").is_file():
        raise UsageError(f"{path} is not a saved ppl run (no posterior.json)")
    posterior = ppl.load(path)
    summary = json.loads((path / "summary.json").read_text()) if (path / "summary.json").is_file() else None
    print(repr(posterior))
    print(f"options: {posterior.options}")
    if summary:
        _print_run(summary, posterior.diagnostics())
    else:
        print(posterior.diagnostics())
    return 0


def _datasets(args) -> int:
    from ppl.datasets import DESCRIPTIONS

    for name, text in DESCRIPTIONS.items():
        print(f"{name:<15} {text}")
    return 0


def _methods(args) -> int:
    from ppl.inference import registry

    for name, description, options in registry.describe():
        print(f"{name:<8} {description}")
        for key, value in options.items():
            print(f"           {key} = {value!r}")
    return 0


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    handlers = {"fit": _fit, "show": _show, "datasets": _datasets, "methods": _methods}
    try:
        return handlers[args.command](args)
    except (UsageError, DataError, OptionError, MemoryBudgetError) as error:
        print(f"ppl {args.command}: error: {error}", file=sys.stderr)
        return 2
    except NonFiniteError as error:
        print(f"ppl {args.command}: training failed: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
