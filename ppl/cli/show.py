"""``ppl show``: print a saved run, its verdict decided again from what is stored."""

from __future__ import annotations

import tempfile
from pathlib import Path

from ppl._calibrate import CALIBRATION_FILE, calibration_from_record
from ppl.core.errors import RunError
from ppl.io import store
from ppl.io.load import saved_diagnostics
from ppl.io.store import read_run_files
import ppl
from ppl.cli._common import (
    VAE_FIGURE, held_out, kfold_lines, loo_up_front, metrics_lines, print_lines, run_folder, safe,
    skipped_lines, what_ran,
)
from ppl.diagnostics.plots import write_plots
from ppl.models import from_config
from ppl.models._base import REGRESSION_LIKELIHOODS


def run(args) -> int:
    """Print a saved run. Nothing the folder names is imported, and no saved verdict is believed: a
    run of a ppl model is loaded and diagnosed again from its stored draws; a run whose model cannot
    be run here (a Network's, a plain program's) shows its saved figures with the verdict decided
    again from them."""
    path = run_folder(Path(args.path))
    meta, diagnostics, extras = read_run_files(path, ("summary.json", CALIBRATION_FILE))
    status = meta["status"]
    if not meta["has_posterior"]:
        progress = (meta.get("resume") or {}).get("progress")
        print_lines([
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
        *what_ran(meta["method"], meta["options"], meta["seed"], provenance, meta["info"]),
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
            lines.extend(loo_up_front("bnn", model.get("fields", {}).get("likelihood")))
        lines.append(record.table())
    lines.extend(metrics_lines(summary))
    lines.extend(kfold_lines(summary))
    lines.extend(skipped_lines(summary))
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
        lines.append(record.verdict(held_out(summary)))
    elif model["kind"] == "function":
        # Computing them would run the program, which ppl show never imports: say what is known, then why not more.
        print_lines(lines)
        raise RunError(safe(
            f"{path}: no diagnostics saved ({meta.get('diagnostics_error') or 'a checkpoint, or an interrupted save'}), "
            f"and computing them needs the program {model['module']}.{model['qualname']}, which ppl show never "
            f"imports — in Python: ppl.load({str(path)!r}, model=<the program>).diagnostics()"
        ))
    else:
        why = meta.get("diagnostics_error") or "a checkpoint, or an interrupted save"
        lines.append(f"verdict: not assessed — no diagnostics saved ({why}); ppl.load computes them")
    print_lines(lines)
    return 0


def _plots(posterior, path: Path) -> list[str]:
    """Write the run's figures into its folder, as files of the run (its manifest lists them, so
    that ``ppl calibrate`` and a later ``--plots`` keep or replace them)."""
    # a plain program's run loads detached (its program is never imported): trace, rank and loss
    # plots come from the saved draws and records, the predictive needs the model
    with tempfile.TemporaryDirectory() as scratch:
        figures = {p.name: p.read_bytes() for p in write_plots(posterior, scratch)}
    if not figures:
        return ["figures: none applies to this run"]
    store.add_run_files(path, figures)
    return ["figures: " + ", ".join(str(path / name) for name in figures)]


def _calibration_line(record, model: dict, where: Path) -> str:
    """What ``ppl calibrate`` saved in the run, checked as loading checks it."""
    likelihood = (model.get("fields") or {}).get("likelihood")
    task = "regression" if likelihood in REGRESSION_LIKELIHOODS else "classification"
    calibration = calibration_from_record(None, record, str(where), task=task)
    return f"calibration (ppl calibrate; ppl predict applies it): {calibration}"
