"""``ppl fit``: fit one method, print its diagnostics and test metrics, save the run."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np

from ppl.cli._arguments import MODELS, TASKS, UsageError, require_model_and_data
from ppl.core import interrupt, progress
from ppl.core.errors import MemoryBudgetError, NonFiniteError, ResumeError, RunError
from ppl.core.keys import derived_key
from ppl.io import store
import ppl
from ppl.cli._common import (
    INVOCATION, VAE_FIGURE, build_model, check_writable_parent, held_out, kfold_lines, load_data,
    loo_up_front, metrics_lines, model_class, print_lines, request_devices, skipped_lines, split_or_none,
    split_settings, take_saved_arguments, unused_folder, what_ran,
)
from ppl._vae_report import vae_report
from ppl.core import registry
# The random stream of a fit's test metrics and figures, split from --seed: the fit itself uses the
# seed's own key, so the test draws neither repeat the fit's nor reach outside [0, 2**32).
TEST_STREAM = 1


def run(args) -> int:
    request_devices(args.devices)

    if args.resume:
        _apply_resume(args)
    require_model_and_data(args)
    args.method = args.method or "nuts"
    args.seed = 0 if args.seed is None else args.seed
    method_cls = registry.get(args.method)
    model_opts, method_opts = split_settings(args.set, model_class(args.model), method_cls)
    data = load_data(args)
    model = build_model(args, data, model_opts)
    # Start-up is over: a Ctrl-C whose KeyboardInterrupt was dropped on the way stops here, before
    # the folder is touched.
    interrupt.raise_pending()
    out = _out_folder(args, data)
    _check_out(out)
    # bars (on stderr) when stderr is a terminal, else a plain line every few seconds; never with --no-progress
    progress.enable(False if args.no_progress else "auto-lines")
    invocation = _invocation(args)
    posterior = diagnostics = None
    record, extras = {"data": data.name, "model": args.model, "metrics": {}}, {}
    with store.run_lock(out):
        try:
            # Through the fit and its diagnostics, a first Ctrl-C (or SIGTERM) only asks the running
            # loop to stop: the result reached is still diagnosed and saved. A second one skips to
            # saving what there is.
            with interrupt.guard():
                if args.resume is None and (out / "manifest.json").is_file():
                    store.read_run_meta(out)  # a corrupt folder is reported, not silently replaced
                target = store.RunTarget(out, {INVOCATION: invocation})
                try:
                    posterior = ppl.fit(
                        model, data.train.X if args.model == "vae" else data.train, method=args.method,
                        seed=args.seed, checkpoint=target if args.checkpoint_every else None,
                        checkpoint_every=args.checkpoint_every, resume=args.resume, devices=args.devices,
                        **method_opts,
                    )
                except ppl.Interrupted as stop:
                    store.save_run(out, None, resume_state=stop.resume_state, fingerprint=stop.fingerprint,
                                 status="interrupted", extra_files={INVOCATION: invocation})
                    print(f"interrupted before the first draw; the state is saved in {out} — continue with: "
                          f"ppl fit --resume {out}", file=sys.stderr)
                    return interrupt.exit_status()
                except NonFiniteError as error:
                    if error.partial is not None:
                        store.save_posterior(error.partial, out, extra_files={INVOCATION: invocation})
                        print(f"the last finite state is saved in {out} (marked failed)", file=sys.stderr)
                    raise
                provenance = {**posterior.provenance, "data": {**posterior.provenance["data"], **_data_source(args, data)}}
                posterior = posterior.replace(record=posterior.record._replace(provenance=provenance))
                if args.model != "vae" and len(data.test.X):
                    # the verdict also judges the predictive on the test split (ppl.diagnostics.heldout)
                    posterior = posterior.with_heldout(*data.test)
                diagnostics = posterior.diagnostics()
            record["diagnostics"] = diagnostics.to_dict()
            if posterior.status.interrupted:
                # An interrupted run is saved at once: test metrics of a partial result can wait.
                record["skipped"] = "test metrics, as the run was interrupted (resuming it to the end computes them)"
            else:
                # No loop is left to ask: from here a Ctrl-C stops the test metrics at once, and one
                # pressed during the diagnostics stops them before they start.
                interrupt.raise_pending()
                test_key = derived_key(args.seed, TEST_STREAM)
                if args.model == "vae":
                    # Held-out quality of the VAE (the amortisation gap needs extra fits: ppl.vae_report).
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
                    interrupt.raise_pending()
                    record["kfold"] = {"k": cv.k, "elpd": cv.elpd, "se": cv.se, "fits_ok": list(cv.fits_ok)}
        except KeyboardInterrupt:
            if posterior is None:
                raise  # stopped before the fit returned: main says so (a checkpoint, if any, is on disk)
            if diagnostics is None:
                with interrupt.guard():  # a further Ctrl-C here would lose the fit: it waits for the save
                    store.save_posterior(posterior, out, extra_files={INVOCATION: invocation}, with_diagnostics=False)
                print(f"interrupted; the result is saved in {out} without diagnostics (ppl.load computes them)",
                      file=sys.stderr)
                return interrupt.exit_status()
            record["metrics"], extras = {}, {}
            record.pop("kfold", None)
            record["skipped"] = ("test metrics" + (" and k-fold" if args.kfold else "")
                                 + ", interrupted before they finished")
        with interrupt.guard():  # a Ctrl-C during the save waits for it (a second one cuts it short)
            store.save_posterior(posterior, out, extra_files={INVOCATION: invocation, "summary.json": record, **extras})
    print_lines([
        *what_ran(args.method, posterior.options, args.seed, posterior.provenance, posterior.info),
        *loo_up_front(args.model, getattr(model, "likelihood", None)),
        diagnostics.table(),
        *metrics_lines(record),
        *kfold_lines(record),
        *skipped_lines(record),
        f"saved to {out}",
        diagnostics.verdict(held_out(record)),
    ])
    if posterior.status.interrupted:
        print(f"interrupted: the saved run is partial (see the warning above); continue with: ppl fit --resume {out}",
              file=sys.stderr)
        return interrupt.exit_status()
    if "skipped" in record:
        print(f"interrupted: the fit is complete and saved in {out} with its diagnostics; skipped: {record['skipped']}",
              file=sys.stderr)
        return interrupt.exit_status()
    return 0


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
        and split_or_none(saved.get("split"))
        and saved.get("task") in (None, *TASKS)
        and saved["model"] in MODELS
        and isinstance(saved["data"], str)
        and text_or_none(saved["target"])
        and text_or_none(saved["method"])
        and isinstance(saved["seed"], int) and not isinstance(saved["seed"], bool) and 0 <= saved["seed"] < 2**32
        and isinstance(saved["set"], list) and all(isinstance(item, str) for item in saved["set"])
    )


def _apply_resume(args) -> None:
    """Fill the fit's arguments from the run being resumed; refuse any given one that differs."""
    folder = Path(args.resume)
    meta, _, extras = store.read_run_files(folder, (INVOCATION,))  # checked against the manifest, like every run file
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
    take_saved_arguments(args, saved, differences)
    if differences:
        raise ResumeError(f"{folder} was fitted differently — " + "; ".join(differences) + " — drop or match them")
    if args.out is None:
        args.out = str(folder)


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
    return unused_folder(Path("runs") / f"{data.name}-{args.model}-{args.method}-seed{args.seed}")


def _check_out(out: Path) -> None:
    """Refuse an output path that could not be written, before anything is fitted."""
    try:
        store.check_writable_run(out)
    except RunError as error:
        raise UsageError(f"--out {error}") from None
    check_writable_parent(out)


def _data_source(args, data) -> dict:
    """Where the command line's data came from and how it was prepared: what ``ppl predict`` needs to
    prepare raw rows the same way (input and target scaling, column names, class labels)."""
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


def _vae_figure(posterior, data, seed) -> bytes:
    """PNG bytes: test images and their reconstructions, samples, and (2-D latents) the encoded test set."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
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
