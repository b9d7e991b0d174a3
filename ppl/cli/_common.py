"""What the commands share: reading --data and --set, building the model, output folders, resumed
arguments, and the lines that say what ran and how it scored."""

from __future__ import annotations

import dataclasses
import os
import typing
from pathlib import Path

import jax

from ppl import datasets
from ppl.cli._arguments import UsageError
from ppl.core.errors import RunError, did_you_mean
from ppl.core.method import parse_value
from ppl.models import BNN, VAE, LinearRegression, LogisticRegression


INVOCATION = "invocation.json"


VAE_FIGURE = "vae.png"


def model_class(name: str):
    return {"linear": LinearRegression, "logistic": LogisticRegression, "bnn": BNN, "vae": VAE}[name]


def split_settings(settings: list[str], model_cls, method_cls, prefix: str = "") -> tuple[dict, dict]:
    """``--set`` items as (model options, method options); ``prefix`` ("nuts.") is how ppl compare's
    items named their method, for messages."""
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


def load_data(args):
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
        print(safe(_describe_file(args, data)))
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


def build_model(args, data, model_opts):
    cls = model_class(args.model)
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


def split_or_none(value) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 10**6)


def take_saved_arguments(args, saved: dict, differences: list) -> None:
    """Fill the arguments not given from a saved invocation; note each given one that differs."""
    for key, value in saved.items():
        given = getattr(args, key)
        if given in (None, []):
            setattr(args, key, value)
        elif given != value:
            differences.append(f"--{key}: the run used {value!r}, now {given!r}")


def request_devices(count) -> None:
    """``--devices N``. JAX gives a CPU one device unless asked for more before its first operation,
    so ask for N now (accelerators are unaffected: JAX then lists those). Once JAX has started (the
    CLI called in a process that already used it) it keeps the devices it has; ``ppl.fit`` then
    refuses an N above them, saying so."""
    if count is not None:
        try:
            jax.config.update("jax_num_cpu_devices", int(count))
        except RuntimeError:
            pass


def unused_folder(base: Path) -> Path:
    """``base``, or ``base-2``, ``base-3``, … : the first that does not exist yet."""
    out, number = base, 1
    while out.exists():
        number += 1
        out = base.with_name(f"{base.name}-{number}")
    return out


def check_writable_parent(out: Path) -> None:
    """Refuse ``out`` when the nearest folder that exists above it (or itself) is not writable."""
    parent = out
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise UsageError(f"--out {out}: {parent} is not a writable directory")


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
    if (value == "auto" or value is None) and _plain_choice(chosen) and chosen != value:
        return f"{key}={_choice_text(chosen)} (from {value!r})"
    return f"{key}={value!r}"


def _plain_choice(value) -> bool:
    """A resolved choice worth printing: a name, a number, or a short list of numbers (one per layer)."""
    if isinstance(value, (list, tuple)):
        return 0 < len(value) <= 8 and all(_plain_choice(v) and not isinstance(v, str) for v in value)
    return isinstance(value, (str, int, float)) and not isinstance(value, bool)


def _choice_text(value) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_choice_text(v) for v in value) + "]"
    return f"{value:.4g}" if isinstance(value, float) else repr(value)


def what_ran(method: str, options: dict, seed, provenance: dict, info: dict | None = None) -> list[str]:
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


def metrics_lines(record: dict) -> list[str]:
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


def skipped_lines(record: dict) -> list[str]:
    skipped = record.get("skipped")
    # summary.json is read from disk: anything but the sentence written here is left out
    return [f"skipped: {skipped}"] if isinstance(skipped, str) and len(skipped) < 300 else []


def kfold_lines(record: dict) -> list[str]:
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


def held_out(record: dict) -> str | None:
    nll = (record.get("metrics") or {}).get("nll")
    return f"test NLL {nll:.4f} per point" if isinstance(nll, float) else None


def loo_up_front(model: str, likelihood) -> list[str]:
    """BNN classifiers: most points' Pareto k exceeds 0.7, so say it before the numbers."""
    if model == "bnn" and likelihood in ("bernoulli", "categorical"):
        return [
            "note: for a BNN classifier PSIS-LOO is unreliable for most points (Pareto k > 0.7) whatever the "
            "method; the held-out test log-likelihood (test NLL below) is the primary figure of predictive fit, "
            "and ppl fit --kfold K gives cross-validated elpd"
        ]
    return []


def print_lines(lines) -> None:
    """Plain lines, never re-wrapped or styled (the layout holds when stdout is not a terminal);
    text read from a run folder is shown with control characters escaped."""
    for line in lines:
        print(safe(line))


def safe(text) -> str:
    """Text read from a run folder, with control characters (terminal escapes) shown escaped."""
    return "".join(c if c.isprintable() or c == "\n" else repr(c)[1:-1] for c in str(text))


def run_folder(path: Path) -> Path:
    """The run folder at ``path``, or the one holding the file ``path`` names."""
    if path.is_dir() or not path.exists():
        return path
    for parent in path.resolve().parents:
        if (parent / "manifest.json").is_file():
            return parent
    raise RunError(f"{path} is a file, and no folder above it holds a saved ppl run; give the run folder")
