"""Every registered method against a long multi-chain NUTS reference, on one BNN task.

    python -m examples.method_comparison [--out runs/method_comparison] [--seed 0] [--quick]

In the manner of Izmailov, Vikram, Hoffman & Wilson (2021), "What are Bayesian neural network
posteriors really like?": a long NUTS run is the reference posterior, and each method is scored by
how closely its predictive matches it on the test inputs — top-1 agreement and total variation —
beside its own test NLL and ECE, its PSIS k-hat (methods with a density) and its cost.

Task: ``breast_cancer`` (455 training and 114 test rows, 30 standardised inputs), a BNN with one
hidden layer of 8 tanh units (257 weights), Bernoulli likelihood. Reference: ``nuts`` with 4 chains
× 4000 draws after 1000 warmup steps. Every other registered method runs at its defaults through
``ppl.compare``; a method that does not accept the model is listed with its reason. A second,
independent NUTS run (another seed, the reference's settings) measures how far two runs of the reference
sampler itself disagree: the floor no method can be expected to go below.

Cost is each fit's warm wall time divided by that of one MAP training run (``method="map"`` at
its defaults). Compilation dominates a first fit of a model this small (a first MAP fit takes
about 9 s, a second 0.25 s), and which fits share compiled programs depends on the order they
run in, so every fit is repeated with the same options and seed and the second run is timed; the
first run's time, compilation included, is reported beside it. Writes ``method_comparison.png`` and
``method_comparison_table.md`` to ``--out``; ``--quick`` is a small instance (a shorter reference and
six methods) for the tests.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

import ppl
from examples._cli import parse, parser
from ppl.diagnostics import metrics as M
from ppl.models import BNN

MODEL = BNN(hidden=(8,), activation="tanh", likelihood="bernoulli")
REFERENCE = {"num_chains": 4, "num_warmup": 1000, "num_samples": 4000}
QUICK_REFERENCE = {"num_chains": 2, "num_warmup": 500, "num_samples": 1000}
QUICK_METHODS = ["map", "laplace", "svi", "ivon", "ensemble", "swag"]


def registered_methods() -> list[str]:
    from ppl.core import registry
    return [m for m in registry.METHODS if m != "nuts"]


def run(seed: int, quick: bool) -> dict:
    data = ppl.datasets.load("breast_cancer", seed=seed)
    methods = QUICK_METHODS if quick else registered_methods()
    problem = ppl.compile_problem(MODEL, data.train)
    accepted, refused = [], {}
    from ppl.core import registry
    for method in methods:  # what refuses this model says why before anything is fitted
        try:
            registry.create(method, {}).check(problem)
            accepted.append(method)
        except (ppl.OptionError, TypeError, ValueError) as error:
            refused[method] = str(error).split("\n")[0]
    reference = QUICK_REFERENCE if quick else REFERENCE
    result = ppl.compare(MODEL, data, methods=["nuts"] + accepted, reference="nuts", seed=seed,
                         options={"nuts": reference}, log=print)
    # the floor: a second, independent NUTS run against the reference
    second = ppl.fit(MODEL, data.train, method="nuts", seed=seed + 1, **reference)
    second_pred = second.predict(data.test.X, seed=seed)
    ref_pred = result.predictions["nuts"]
    # warm times: each fit again, same options and seed, its programs compiled by the first run
    warm = {}
    for method in result.posteriors:
        options = reference if method == "nuts" else {}
        warm[method] = ppl.fit(MODEL, data.train, method=method, seed=seed, **options).wall_time_s
    floor = {
        "agreement": M.agreement(second_pred, ref_pred),
        "total_variation": M.total_variation(second_pred, ref_pred),
        **M.classification_metrics(second_pred, data.test.y),
        "wall_time_s": second.wall_time_s,
        "rhat_function_max": second.diagnostics().rhat_function_max,
    }
    return {"result": result, "refused": refused, "floor": floor, "reference": reference, "data": data, "warm": warm}


def rows(outcome: dict) -> list[dict]:
    """One dict per method: the columns of the table, cost relative to MAP added."""
    result, warm = outcome["result"], outcome["warm"]
    map_seconds = warm["map"]
    table = []
    for row in result.rows:
        entry = {k: row.get(k) for k in ("method", "error", "ok", "agreement", "total_variation", "nll", "accuracy",
                                          "ece", "khat", "rhat_function_max", "wall_time_s")}
        entry["warm_s"] = warm.get(row["method"])
        entry["cost"] = None if entry["warm_s"] is None else entry["warm_s"] / map_seconds
        table.append(entry)
    floor = dict(outcome["floor"], method="nuts (second run)", error=None, ok=None, khat=None)
    floor["warm_s"] = floor["wall_time_s"]  # the reference's settings again: its programs are compiled already
    floor["cost"] = floor["warm_s"] / map_seconds
    table.insert(1, floor)
    return table


def _cell(value, spec: str) -> str:
    if value is None:
        return "—"
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    return format(float(value), spec)


def table(outcome: dict, entries: list[dict]) -> str:
    ref = outcome["reference"]
    lines = [
        f"Reference: nuts, {ref['num_chains']} chains × {ref['num_samples']} draws after {ref['num_warmup']} warmup "
        "steps. Agreement and TV are against it on the 114 test inputs. First fit: wall time with compilation; "
        "warm: the same fit repeated; cost: warm time over one warm MAP training run's.",
        "",
        "| method | passes own diagnostics | agreement | total variation | test NLL | accuracy | ECE | k-hat | R-hat f | "
        "first fit s | warm s | cost × MAP |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in entries:
        if e.get("error"):
            lines.append(f"| {e['method']} | failed: {e['error']} | — | — | — | — | — | — | — | {e['wall_time_s']:.1f} | — | — |")
            continue
        lines.append(
            f"| {e['method']} | {_cell(e['ok'], '')} | {_cell(e['agreement'], '.3f')} | {_cell(e['total_variation'], '.4f')} | "
            f"{_cell(e['nll'], '.4f')} | {_cell(e['accuracy'], '.3f')} | {_cell(e['ece'], '.4f')} | {_cell(e['khat'], '.2f')} | "
            f"{_cell(e['rhat_function_max'], '.3f')} | {e['wall_time_s']:.1f} | {e['warm_s']:.2f} | {e['cost']:.1f} |"
        )
    for method, why in outcome["refused"].items():
        lines.append(f"\nNot run: {method} ({why})")
    return "\n".join(lines) + "\n"


def figure(entries: list[dict], path: Path) -> None:
    """Three panels sharing one row per method: TV from the reference (with the two-NUTS floor), cost
    relative to MAP, and test NLL and ECE; bars of methods that fail their own diagnostics in red."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fitted = [e for e in entries if not e.get("error") and e["method"] != "nuts"]
    fitted.sort(key=lambda e: e["total_variation"])
    floor = next(e for e in entries if e["method"] == "nuts (second run)")
    reference = next(e for e in entries if e["method"] == "nuts")
    names = [e["method"] for e in fitted]
    colours = ["C2" if e["method"] == "nuts (second run)" else ("C0" if e["ok"] else "C3") for e in fitted]
    y = np.arange(len(fitted))
    fig, axes = plt.subplots(1, 3, figsize=(15, 5.8), sharey=True, constrained_layout=True,
                             gridspec_kw={"width_ratios": [1.1, 1, 1]})
    ax = axes[0]
    ax.barh(y, [e["total_variation"] for e in fitted], color=colours)
    ax.axvline(floor["total_variation"], color="C2", ls="--", lw=1)
    ax.set_xscale("log")
    ax.set_yticks(y, names)
    ax.invert_yaxis()
    ax.set_xlabel("total variation from the NUTS reference (log)")
    ax.set_title("Distance from the reference predictive")
    ax.legend(handles=[Patch(color="C2", label="a second NUTS run (dashed: the floor)"),
                       Patch(color="C0", label="passes its own diagnostics"), Patch(color="C3", label="fails them")],
              fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, frameon=False)

    ax = axes[1]
    ax.barh(y, [e["cost"] for e in fitted], color=colours)
    ax.axvline(reference["cost"], color="k", ls=":", lw=1)
    for row, e in zip(y, fitted):
        ax.text(e["cost"] * 1.1, row, f"{e['cost']:.1f}×", va="center", fontsize=8)
    ax.set_xscale("log")
    ax.set_xlim(right=max(e["cost"] for e in entries if e.get("cost")) * 4)
    ax.set_xlabel("warm wall time / one warm MAP run's (log)")
    ax.set_title(f"Cost (dotted: the reference, {reference['cost']:.0f}× MAP)")

    ax = axes[2]
    ax.barh(y - 0.2, [e["nll"] for e in fitted], height=0.4, color="C0", label="test NLL")
    ax.barh(y + 0.2, [e["ece"] for e in fitted], height=0.4, color="C1", label="test ECE")
    ax.axvline(reference["nll"], color="C0", ls=":", lw=1)
    ax.set_xlabel("lower is better")
    ax.set_title("Test NLL and ECE (dotted: the reference's NLL)")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, frameon=False)
    fig.suptitle("breast_cancer, BNN (8 tanh units): every method against a long NUTS run, closest first")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> dict:
    args = parse(parser(__doc__, "method_comparison", quick="a shorter reference and five methods (for the tests)"), argv)
    start = time.perf_counter()
    out = args.out
    outcome = run(args.seed, args.quick)
    entries = rows(outcome)
    text = table(outcome, entries)
    (out / "method_comparison_table.md").write_text(text)
    figure(entries, out / "method_comparison.png")
    print(text)
    print(f"wrote {out / 'method_comparison.png'} and {out / 'method_comparison_table.md'}")
    elapsed = time.perf_counter() - start
    print(f"total wall time: {elapsed:.0f} s")
    return {**outcome, "entries": entries, "seconds": elapsed}


if __name__ == "__main__":
    main()
