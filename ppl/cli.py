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

from ppl._errors import DataError, MemoryBudgetError, NonFiniteError, OptionError, ResumeError, RunError

MODELS = ("linear", "logistic", "bnn", "vae")


class UsageError(Exception):
    """Bad command-line input: reported on stderr, exit status 2, nothing written."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ppl", description="Bayesian inference for neural-network weights.")
    sub = parser.add_subparsers(dest="command", required=True)
    fit = sub.add_parser("fit", help="fit a model, print diagnostics and test metrics, save the run")
    fit.add_argument("--model", choices=MODELS, help="required unless --resume")
    fit.add_argument("--data", help="a dataset name (see `ppl datasets`) or a .csv/.npz file; required unless --resume")
    fit.add_argument("--target", help="target column of a CSV file (default: the last column)")
    fit.add_argument("--method", help="a method name (see `ppl methods`; default nuts)")
    fit.add_argument("--seed", type=_seed, help="default 0")
    fit.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="a model option (e.g. hidden=32,32) or method option (e.g. num_samples=500); repeatable",
    )
    fit.add_argument("--out", help="run directory (default: runs/<data>-<model>-<method>-seed<N>)")
    fit.add_argument("--no-progress", action="store_true", help="hide progress bars")
    fit.add_argument(
        "--checkpoint-every", type=_positive, metavar="N",
        help="write a resumable checkpoint to the output folder every N steps (optimiser steps or MCMC steps)",
    )
    fit.add_argument(
        "--resume", metavar="DIR",
        help="continue the interrupted or checkpointed run in DIR (its model, data, method and options are reused; "
        "any you give must match)",
    )
    show = sub.add_parser("show", help="print a saved run")
    show.add_argument("path")
    sub.add_parser("datasets", help="list the bundled datasets")
    sub.add_parser("methods", help="list the methods with their options and defaults")
    return parser


def _seed(text: str) -> int:
    value = int(text)
    if not 0 <= value < 2**32:
        raise argparse.ArgumentTypeError(f"seed must be an integer in [0, 2**32), got {value}")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def _model_class(name: str):
    from ppl.models import BNN, VAE, LinearRegression, LogisticRegression

    return {"linear": LinearRegression, "logistic": LogisticRegression, "bnn": BNN, "vae": VAE}[name]


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
        if args.model == "vae":
            if args.target is not None:
                raise UsageError("--model vae models the data alone: drop --target")
            return datasets.load_file(args.data, seed=args.seed, task="unsupervised")
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


def _invocation(args) -> dict:
    return {
        "model": args.model, "data": args.data, "target": args.target, "method": args.method,
        "seed": args.seed, "set": list(args.set),
    }


def _valid_invocation(saved) -> bool:
    def text_or_none(value):
        return value is None or (isinstance(value, str) and len(value) < 4096)

    return (
        isinstance(saved, dict)
        and set(saved) == {"model", "data", "target", "method", "seed", "set"}
        and saved["model"] in MODELS
        and isinstance(saved["data"], str)
        and text_or_none(saved["target"])
        and text_or_none(saved["method"])
        and isinstance(saved["seed"], int) and not isinstance(saved["seed"], bool) and 0 <= saved["seed"] < 2**32
        and isinstance(saved["set"], list) and all(isinstance(item, str) for item in saved["set"])
    )


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
    for key, value in saved.items():
        given = getattr(args, key)
        if given in (None, []):
            setattr(args, key, value)
        elif given != value:
            differences.append(f"--{key}: the run used {value!r}, now {given!r}")
    if differences:
        raise ResumeError(f"{folder} was fitted differently — " + "; ".join(differences) + " — drop or match them")
    if args.out is None:
        args.out = str(folder)


def _fit(args) -> int:
    import ppl
    from ppl import _interrupt, _io, _progress
    from ppl.inference import registry

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
    out = Path(args.out or f"runs/{data.name}-{args.model}-{args.method}-seed{args.seed}")
    _check_out(out)
    _progress.enable(not args.no_progress)
    invocation = _invocation(args)
    # From here to the save, a first Ctrl-C only asks the running loop to stop: the result reached
    # is still diagnosed and saved. A second one skips to saving what there is.
    with _io.run_lock(out), _interrupt.guard():
        if args.resume is None and (out / "manifest.json").is_file():
            _io.read_run_meta(out)  # a corrupt folder is reported, not silently replaced
        target = _io.RunTarget(out, {INVOCATION: invocation})
        try:
            posterior = ppl.fit(
                model, data.train.X if args.model == "vae" else data.train, method=args.method, seed=args.seed,
                checkpoint=target if args.checkpoint_every else None, checkpoint_every=args.checkpoint_every,
                resume=args.resume, **method_opts,
            )
        except ppl.Interrupted as stop:
            _io.save_run(out, None, resume_state=stop.resume_state, fingerprint=stop.fingerprint,
                         status="interrupted", extra_files={INVOCATION: invocation})
            print(f"interrupted before the first draw; the state is saved in {out} — continue with: ppl fit --resume {out}",
                  file=sys.stderr)
            return 130
        except NonFiniteError as error:
            if error.partial is not None:
                _io.save_posterior(error.partial, out, extra_files={INVOCATION: invocation})
                print(f"the last finite state is saved in {out} (marked failed)", file=sys.stderr)
            raise
        try:
            diagnostics = posterior.diagnostics()
            # An interrupted run is saved at once: test metrics of a partial result can wait.
            interrupted = posterior.status.interrupted or _interrupt.requested()
            metrics, extras = {}, {}
            if not interrupted and args.model == "vae":
                from ppl.diagnostics.vae import vae_report

                # Held-out quality of the VAE (the amortisation gap needs extra fits: ppl.diagnostics.vae_report).
                metrics = vae_report(posterior, data.test.X, seed=args.seed + 1, gap_points=0).to_dict()
                extras[VAE_FIGURE] = _vae_figure(posterior, data, args.seed + 1)
            elif not interrupted:
                try:
                    metrics = ppl.evaluate(posterior, data.test, seed=args.seed + 1)
                except MemoryBudgetError as error:
                    # The fit is worth keeping even when its test predictions would not fit in memory.
                    print(f"ppl fit: test metrics skipped: {error}", file=sys.stderr)
            record = {"data": data.name, "model": args.model, "metrics": metrics, "diagnostics": diagnostics.to_dict()}
            _io.save_posterior(posterior, out, extra_files={INVOCATION: invocation, "summary.json": record, **extras})
        except KeyboardInterrupt:
            _io.save_posterior(posterior, out, extra_files={INVOCATION: invocation}, with_diagnostics=False)
            print(f"interrupted; the result is saved in {out} without diagnostics (ppl.load computes them)",
                  file=sys.stderr)
            return 130
    _print_run(record, diagnostics)
    print(f"saved to {out}")
    if posterior.status.interrupted:
        print(f"interrupted: the saved run is partial (see the warning above); continue with: ppl fit --resume {out}",
              file=sys.stderr)
        return 130
    return 0


VAE_FIGURE = "vae.png"


def _vae_figure(posterior, data, seed: int) -> bytes:
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


def _check_out(out: Path) -> None:
    """Refuse an output path that could not be written, before anything is fitted."""
    import os

    from ppl._io import check_writable_run

    try:
        check_writable_run(out)
    except RunError as error:
        raise UsageError(f"--out {error}") from None
    parent = out
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise UsageError(f"--out {out}: {parent} is not a writable directory")


def _print_run(record: dict, diagnostics) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    # Text read from a run folder is shown as is, never interpreted as rich markup.
    console = Console()
    console.print(str(diagnostics), markup=False, highlight=False)
    table = Table(title=Text(f"test metrics — {record.get('data', '?')} / {record.get('model', '?')}"))
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in record["metrics"].items():
        if isinstance(value, float):
            shown = f"{value:.4f}"
        elif isinstance(value, int) and not isinstance(value, bool):
            shown = str(value)
        else:
            shown = "—" if value is None else repr(value)
        table.add_row(Text(_safe(key)), Text(_safe(shown)))
    console.print(table)


def _safe(text) -> str:
    """Text read from a run folder, with control characters (terminal escapes) shown escaped."""
    return "".join(c if c.isprintable() or c == "\n" else repr(c)[1:-1] for c in str(text))


def _show(args) -> int:
    """Print a saved run from its files alone: nothing is imported, compiled or recomputed."""
    from ppl._io import _diagnostics_from, read_run_files

    path = Path(args.path)
    meta, diagnostics, extras = read_run_files(path, ("summary.json",))
    status = meta["status"]
    if not meta["has_posterior"]:
        progress = (meta.get("resume") or {}).get("progress")
        print(_safe(f"{path}: {status} run with no draws yet (progress {progress}); continue with: ppl fit --resume {path}"))
        return 0
    model = meta["model"]
    if model["kind"] == "declarative":
        from ppl.models import from_config

        try:
            from_config(model)  # the same check ppl.load makes, without running anything
        except (ValueError, TypeError, KeyError) as error:
            raise RunError(f"{path}/posterior.json: the model configuration is invalid ({error})") from None
        described = model["class"]
    else:
        described = f"program {model['module']}.{model['qualname']}"
    sites = ", ".join(f"{name}{tuple(shape)}" for name, shape, _ in meta["sites"])
    lines = [
        f"{path}: {meta['method']} on {described} — {meta['num_chains']} chain(s) × {meta['num_draws']} draws, "
        f"status {status}",
        f"sites: {sites}",
    ]
    if meta["deterministic"]:
        lines.append("deterministic sites: " + ", ".join(f"{name}{tuple(shape)}" for name, shape in meta["deterministic"]))
    if meta["function_sites"]:
        lines.append(f"function sites (function-space R-hat): {', '.join(meta['function_sites'])}")
    lines.append(f"options: {meta['options']}")
    if meta.get("resume") and model["kind"] == "function":
        lines.append(
            f"resumable: progress {meta['resume']['progress']} — continue in Python with: "
            f"ppl.fit(<the program>, data, method=..., seed=..., resume={str(path)!r})"
        )
    elif meta.get("resume"):
        lines.append(f"resumable: progress {meta['resume']['progress']} — continue with: ppl fit --resume {path}")
    print(_safe("\n".join(lines)))
    summary = extras.get("summary.json")
    record = None if diagnostics is None else _diagnostics_from(
        {k: _safe(v) if isinstance(v, str) else v for k, v in diagnostics.items()}, path
    )
    if record is not None:
        record.warnings = [_safe(w) for w in record.warnings]
        record.notes = {_safe(k): _safe(v) for k, v in record.notes.items()}
    if isinstance(summary, dict) and isinstance(summary.get("metrics"), dict) and record is not None:
        _print_run({k: _safe(v) if isinstance(v, str) else v for k, v in summary.items()}, record)
    if model.get("class") == "VAE" and (path / VAE_FIGURE).is_file():
        print(_safe(f"figure (test data, reconstructions, samples; latent space for 2-D latents): {path / VAE_FIGURE}"))
    elif record is not None:
        print(record)
    elif model["kind"] == "function":
        # Computing them would run the program, which ppl show never imports.
        raise RunError(_safe(
            f"{path}: no diagnostics saved ({meta.get('diagnostics_error') or 'a checkpoint, or an interrupted save'}), "
            f"and computing them needs the program {model['module']}.{model['qualname']}, which ppl show never "
            f"imports — in Python: ppl.load({str(path)!r}, model=<the program>).diagnostics()"
        ))
    else:
        print(_safe(f"no diagnostics saved ({meta.get('diagnostics_error') or 'a checkpoint, or an interrupted save'})"))
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
    except (UsageError, DataError, OptionError, MemoryBudgetError, RunError, ResumeError) as error:
        print(f"ppl {args.command}: error: {error}", file=sys.stderr)
        return 2
    except NonFiniteError as error:
        print(f"ppl {args.command}: training failed: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"ppl {args.command}: interrupted before there was anything to save", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
