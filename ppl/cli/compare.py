"""``ppl compare``: fit several methods to one model and data, and write the report."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from ppl._compare import chosen_methods
from ppl.cli._arguments import COMPARE_DATA, MODELS, TASKS, UsageError
from ppl.core import interrupt, progress
from ppl.core.errors import ResumeError, RunError, did_you_mean
from ppl.io import store
import ppl
from ppl.cli._common import (
    INVOCATION, build_model, check_writable_parent, load_data, model_class, request_devices, safe,
    split_or_none, split_settings, take_saved_arguments, unused_folder,
)
from ppl.core import registry
COMPARE_DEFAULTS = {"model": "bnn", "data": COMPARE_DATA, "reference": "nuts", "seed": 0}


FITS = "fits"  # the report folder's sub-folder holding each method's fit as a run folder


def run(args) -> int:
    request_devices(args.devices)
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
            if key not in {f.name for f in dataclasses.fields(model_class(args.model))}:
                raise UsageError(
                    f"--set {item!r}: {key!r} is not an option of the model"
                    f"{did_you_mean(key, [f.name for f in dataclasses.fields(model_class(args.model))])}; a method's "
                    "option takes its name first, as in --set nuts.num_chains=2"
                )
            model_settings.append(item)
    model_opts, _ = split_settings(model_settings, model_class(args.model), registry.get("map"))
    options = {}
    for method, items in method_settings.items():
        cls = registry.get(method)
        unknown = [i for i in items if "=" in i and i.split("=", 1)[0] not in cls.option_defaults()]
        if unknown:
            key = unknown[0].split("=", 1)[0]
            raise UsageError(f"--set {method}.{unknown[0]}: not an option of method {method!r} "
                             f"({', '.join(sorted(cls.option_defaults()))}){did_you_mean(key, cls.option_defaults())}")
        options[method] = split_settings(items, model_class(args.model), cls, prefix=f"{method}.")[1]
    if args.model == "vae":
        raise UsageError("ppl compare scores test predictions; a VAE has none — compare VAEs with ppl fit and their "
                         "test ELBO")
    data = load_data(args)
    model = build_model(args, data, model_opts)
    chosen_methods(model, data.train, methods, reference, options)  # every method and option, before fitting
    out = Path(args.resume) if args.resume else _compare_folder(args, data)
    check_writable_parent(out)
    # The writer's lock of `ppl fit` (on the resolved path): a fit and a comparison never write one folder at once.
    with store.run_lock(out):
        if not args.resume:
            if _owned_comparison(out) is not None:
                store.remove_comparison(out)  # ppl's own report or unfinished comparison, replaced as --force asked
            out.mkdir(parents=True, exist_ok=True)
            (out / INVOCATION).write_text(json.dumps(_compare_invocation(args), indent=1))
            store.write_comparison_manifest(out, "unfinished", [INVOCATION, FITS])
        elif not (out / store.COMPARISON_MANIFEST).exists():
            store.write_comparison_manifest(out, "unfinished", [INVOCATION, FITS])  # started by an older ppl
        # a line on stderr every few seconds beside the comparison's own log, unless --no-progress
        progress.enable(False if args.no_progress else "lines")
        started = time.perf_counter()
        try:
            result = ppl.compare(model, data, methods=methods, reference=reference, seed=args.seed, options=options,
                                 fits=out / FITS, log=lambda line: print(line, flush=True), devices=args.devices)
            interrupt.raise_pending()  # a Ctrl-C dropped while the methods were scored: no report from it
            _commit_report(result, out)
        except KeyboardInterrupt as stop:
            during = f"while fitting {stop.method}" if isinstance(stop, ppl.ComparisonInterrupted) else "before the report"
            print(f"interrupted {during}; the fits so far are saved in {out / FITS} — continue with: "
                  f"ppl compare --resume {out}", file=sys.stderr)
            return interrupt.exit_status()
    elapsed = time.perf_counter() - started
    print()
    print(safe(result.table()))
    print()
    print(f"report: {out / 'report.html'} (figures beside it; comparison.json holds the table, {FITS}/ each method's "
          f"fit); {elapsed:.0f} s in all")
    return 0


def _owned_comparison(out: Path):
    """(status, entries) of ppl's own comparison in ``out``, None for an absent or empty folder; any
    other folder is refused (a UsageError saying why)."""
    try:
        return store.comparison_entries(out)
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
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    shutil.copymode(out, staging)  # the report folder keeps the usual permissions, not mkdtemp's 0700
    aside = staging.with_name(staging.name + "-old")
    ours = {FITS, INVOCATION, store.COMPARISON_MANIFEST}
    try:
        result.write_report(staging)
        entries = [p.name for p in staging.iterdir()] + [name for name in (FITS, INVOCATION) if (out / name).exists()]
        store.write_comparison_manifest(staging, "complete", entries)
        others = sorted(set(os.listdir(out)) - ours)
        with interrupt.guard():
            if others:
                print(f"ppl compare: {out} gained files that ppl did not write ({', '.join(others[:5])}); the report "
                      "is added beside them", file=sys.stderr)
                for name in [p.name for p in staging.iterdir() if p.name != store.COMPARISON_MANIFEST]:
                    os.replace(staging / name, out / name)
                os.replace(staging / store.COMPARISON_MANIFEST, out / store.COMPARISON_MANIFEST)
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
        (aside / store.COMPARISON_MANIFEST).unlink(missing_ok=True)
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
        and split_or_none(saved["split"])
        and isinstance(saved["seed"], int) and not isinstance(saved["seed"], bool) and 0 <= saved["seed"] < 2**32
        and isinstance(saved["set"], list) and all(isinstance(item, str) and len(item) < 4096 for item in saved["set"])
    )


def _apply_compare_resume(args) -> None:
    """Fill the comparison's arguments from the unfinished one in --resume; refuse any given one that differs."""
    folder = Path(args.resume)
    if args.out is not None and Path(args.out).resolve() != folder.resolve():
        raise UsageError(f"--resume {folder} continues in its own folder; drop --out {args.out}")
    if args.force:
        raise UsageError("--resume continues a comparison and --force starts one afresh; give one of them")
    if not folder.is_dir():
        raise UsageError(f"--resume {folder}: no such folder")
    if (folder / store.COMPARISON_MANIFEST).exists():  # a comparison started by an older ppl has none
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
    take_saved_arguments(args, {k: v for k, v in saved.items() if k != "command"}, differences)
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
    return unused_folder(Path("runs") / f"compare-{data.name}{split}-{args.model}-seed{args.seed}")
