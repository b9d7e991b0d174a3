"""Does mean-field VI inflate a wide BNN's predictive intervals? Width 16 against width 512.

    python -m examples.bnn_width [--out runs/bnn_width] [--seed 0] [--quick]

For conjugate linear regression, mean-field VI gives each coefficient the variance 1/(Σ⁻¹)_pp, and
when the number of parameters grows while the data's information stays fixed, its predictive
variance in the data's direction climbs towards the prior's while the exact one stays small
(Odgers, Riegler, Swaroop & Fortuin 2026; Coker et al. 2022 for wide mean-field BNNs). This example
measures the same on a BNN.

Data: ``ppl.datasets.load("sinusoid", seed=seed)``, y = sin(3x) + N(0, 0.1²) with x in [-3, -1] ∪
[1, 3] (inputs standardised by the library); the gap (-1, 1) is ``data.ood``.

Model at both widths: ``BNN(hidden=(H,), activation="tanh", noise_scale=0.1)`` with the prior
w0, b0 ~ N(0, 4²) (first layer, fan-in 1 at every width) and w1 ~ N(0, 1/H), b1 ~ N(0, 1) (output
layer, fan-in scaled), so that the prior covariance of the network's output, E[f(x) f(x')], is the
same at H = 16 and H = 512 (and the prior tends to a Gaussian process as H grows; Neal 1996). The
noise is fixed at the data's own 0.1, so every difference between intervals is epistemic.

Methods at each width: mean-field SVI (``method="svi", guide="mean_field"``, the library's defaults
otherwise) and a NUTS reference (``method="nuts"``: the defaults, 4 chains × 1000 draws, at width
16; 4 chains × 200 draws after 200 warm-up steps at width 512, where every transition reaches
the maximum tree depth and the defaults would take 7 to 10 minutes on 2 CPU cores).

Writes ``bnn_width.png`` (each width's data, predictive means and 90% intervals of both methods
over the training range, the gap and beyond; and the ratio MFVI/NUTS of the epistemic sd and of the
90% interval width along x) and ``bnn_width_table.md`` (every number measured in this run) to
``--out``. ``--quick`` is a small instance for the tests: SVI for 5000 steps without further rounds
(``max_steps=5000``), NUTS 2 chains × 200 draws at width 16 and 2 × 60 at width 512.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

import ppl
from examples._cli import parse, parser
from ppl.models import BNN
from ppl.models.priors import ByName, FanIn, Isotropic

WIDTHS = (16, 512)
NOISE = 0.1  # the sinusoid's own noise sd, fixed in the model
FIRST_LAYER_SCALE = 4.0  # w0, b0 ~ N(0, 4²): tanh units whose transitions are sharp enough for sin(3x)
LEVEL = 0.9
PRIOR_DRAWS = 2000

FULL = {
    "svi": {"guide": "mean_field"},
    "nuts": {16: {}, 512: {"num_chains": 4, "num_warmup": 200, "num_samples": 200}},
}
QUICK = {
    "svi": {"guide": "mean_field", "steps": 5000, "max_steps": 5000},
    "nuts": {16: {"num_chains": 2, "num_warmup": 200, "num_samples": 200},
             512: {"num_chains": 2, "num_warmup": 60, "num_samples": 60}},
}


def prior():
    """The same function-space prior covariance at every width (module docstring)."""
    return ByName(
        rules=(("w0", Isotropic(FIRST_LAYER_SCALE)), ("b0", Isotropic(FIRST_LAYER_SCALE))),
        default=FanIn(scale=1.0, bias_scale=1.0),
    )


def make_model(width: int) -> BNN:
    return BNN(hidden=(width,), activation="tanh", likelihood="gaussian", prior=prior(), noise_scale=NOISE)


def num_weights(width: int) -> int:
    return 3 * width + 1  # w0 (1, H), b0 (H,), w1 (H, 1), b1 (1,)


def fit_all(data, seed: int, settings: dict) -> dict:
    runs = {}
    for width in WIDTHS:
        for label, method, options in (
            ("MFVI", "svi", settings["svi"]),
            ("NUTS", "nuts", settings["nuts"][width]),
        ):
            start = time.perf_counter()
            post = ppl.fit(make_model(width), data.train, method=method, seed=seed, progress_bar=False, **options)
            seconds = time.perf_counter() - start
            runs[(width, label)] = {"post": post, "seconds": seconds, "options": options}
            print(f"width {width:4d} {label}: {seconds:.1f} s", flush=True)
    return runs


def grids(data) -> dict:
    """Standardised inputs: inside the training range (the gap excluded), the gap, and a plotting grid."""
    mean, std = float(data.input_mean[0]), float(data.input_std[0])
    inside = np.r_[np.linspace(-3.0, -1.0, 60), np.linspace(1.0, 3.0, 60)]
    plot = np.linspace(-3.8, 3.8, 241)
    return {
        "inside": ((inside - mean) / std)[:, None],
        "gap": np.asarray(data.ood.X),
        "plot": ((plot - mean) / std)[:, None],
        "plot_raw": plot,
        "mean": mean,
        "std": std,
    }


def summarise(post, X, seed: int) -> dict:
    pred = post.predict(X, seed=seed)
    lower, upper = pred.interval(LEVEL)
    return {"mean": pred.mean, "lower": lower, "upper": upper, "width": upper - lower,
            "epistemic_sd": np.sqrt(pred.epistemic_variance)}


def prior_interval_width(width: int, X, seed: int) -> float:
    """Mean 90% interval width of the prior predictive y = f(x) + N(0, σ²) at X, by Monte Carlo."""
    rng = np.random.default_rng(seed)
    x = np.asarray(X)[:, 0]
    ys = []
    for _ in range(PRIOR_DRAWS // 200):
        w0 = FIRST_LAYER_SCALE * rng.standard_normal((200, width))
        b0 = FIRST_LAYER_SCALE * rng.standard_normal((200, width))
        w1 = rng.standard_normal((200, width)) / np.sqrt(width)
        b1 = rng.standard_normal((200, 1))
        f = np.einsum("sh,snh->sn", w1, np.tanh(x[None, :, None] * w0[:, None, :] + b0[:, None, :])) + b1
        ys.append(f + NOISE * rng.standard_normal(f.shape))
    ys = np.concatenate(ys)
    tail = (1.0 - LEVEL) / 2.0
    return float(np.mean(np.quantile(ys, 1.0 - tail, axis=0) - np.quantile(ys, tail, axis=0)))


def measure(runs: dict, data, seed: int) -> dict:
    g = grids(data)
    results = {}
    for key, run in runs.items():
        post = run["post"]
        inside, gap, plot = (summarise(post, g[name], seed + 1) for name in ("inside", "gap", "plot"))
        metrics = ppl.evaluate(post, data.test, seed=seed + 1)
        record = {
            "width_inside": float(inside["width"].mean()),
            "width_gap": float(gap["width"].mean()),
            "sd_inside": float(inside["epistemic_sd"].mean()),
            "sd_gap": float(gap["epistemic_sd"].mean()),
            "nll": float(metrics["nll"]),
            "rmse": float(metrics["rmse"]),
            "coverage_90": float(metrics["coverage_90"]),
            "seconds": run["seconds"],
            "plot": plot,
        }
        diag = post.diagnostics()
        record["checks"] = "library checks: all pass" if diag.ok else "failed checks: " + ", ".join(
            c.field if not isinstance(c.value, (int, float)) or isinstance(c.value, bool)
            else f"{c.field} {c.value:.4g} (threshold {c.threshold:.3g})" for c in diag.failed
        )
        if key[1] == "NUTS":
            record.update(rhat_max=float(diag.rhat_max), rhat_function_max=float(diag.rhat_function_max),
                          divergences=int(diag.divergences), tree_depth_hits=int(diag.tree_depth_hits),
                          ess_bulk_min=float(diag.ess_bulk_min),
                          draws=f"{post.num_chains} × {post.num_draws}")
        else:
            status = post.status
            record.update(steps=int(status.steps_done), convergence=status.convergence or "—")
        results[key] = record
    for width in WIDTHS:
        mf, ref = results[(width, "MFVI")], results[(width, "NUTS")]
        results[(width, "ratio")] = {
            "width_inside": mf["width_inside"] / ref["width_inside"],
            "width_gap": mf["width_gap"] / ref["width_gap"],
            "sd_inside": mf["sd_inside"] / ref["sd_inside"],
            "sd_gap": mf["sd_gap"] / ref["sd_gap"],
        }
        results[(width, "prior")] = {"width_inside": prior_interval_width(width, g["inside"], seed),
                                     "width_gap": prior_interval_width(width, g["gap"], seed)}
    results["grids"] = g
    return results


def table(results: dict) -> str:
    rows = [
        "| width | weights | method | 90% interval width, inside the training range | 90% interval width, in the gap "
        "| epistemic sd, inside | epistemic sd, gap | test NLL | test RMSE | test coverage_90 | wall s | run diagnostics |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for width in WIDTHS:
        for label in ("MFVI", "NUTS"):
            r = results[(width, label)]
            if label == "NUTS":
                diag = (f"{r['draws']} draws; R-hat max {r['rhat_max']:.2f} (weights), {r['rhat_function_max']:.3f} "
                        f"(function); bulk ESS min {r['ess_bulk_min']:.0f}; {r['divergences']} divergences; "
                        f"{r['tree_depth_hits']} max-depth hits; {r['checks']}")
            else:
                diag = f"{r['steps']} steps; {r['convergence']}; {r['checks']}"
            rows.append(
                f"| {width} | {num_weights(width)} | {label} | {r['width_inside']:.3f} | {r['width_gap']:.3f} | "
                f"{r['sd_inside']:.3f} | {r['sd_gap']:.3f} | {r['nll']:.3f} | {r['rmse']:.3f} | {r['coverage_90']:.3f} | "
                f"{r['seconds']:.1f} | {diag} |"
            )
        p = results[(width, "prior")]
        rows.append(f"| {width} | {num_weights(width)} | prior (no data) | {p['width_inside']:.3f} | "
                    f"{p['width_gap']:.3f} | — | — | — | — | — | — | {PRIOR_DRAWS} prior draws (Monte Carlo) |")
    rows += [
        "",
        "| width | ratio MFVI / NUTS: 90% width, inside | 90% width, gap | epistemic sd, inside | epistemic sd, gap |",
        "|---|---|---|---|---|",
    ]
    for width in WIDTHS:
        r = results[(width, "ratio")]
        rows.append(f"| {width} | {r['width_inside']:.2f} | {r['width_gap']:.2f} | {r['sd_inside']:.2f} | "
                    f"{r['sd_gap']:.2f} |")
    return "\n".join(rows)


def figure(results: dict, data, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    g = grids(data) if "grids" not in results else results["grids"]
    x = g["plot_raw"]
    x_train = np.asarray(data.train.X)[:, 0] * g["std"] + g["mean"]
    fig, axes = plt.subplots(1, 3, figsize=(16.5, 4.8), constrained_layout=True)
    colours = {"MFVI": "tab:orange", "NUTS": "tab:blue"}
    for ax, width in zip(axes[:2], WIDTHS):
        ax.axvspan(-1.0, 1.0, color="0.92", zorder=0)
        ax.text(0.0, 2.55, "gap (no data)", ha="center", fontsize=9, color="0.35")
        for label in ("NUTS", "MFVI"):
            plot = results[(width, label)]["plot"]
            ax.fill_between(x, plot["lower"], plot["upper"], color=colours[label], alpha=0.25,
                            label=f"{label}: 90% interval")
            ax.plot(x, plot["mean"], color=colours[label], lw=1.8, label=f"{label}: mean")
        ax.plot(x, np.sin(3.0 * x), color="k", lw=0.8, ls=":", label="sin(3x)")
        ax.scatter(x_train, data.train.y, s=8, c="k", alpha=0.6, label="training data", zorder=3)
        ratio = results[(width, "ratio")]
        ax.set_title(f"width {width} ({num_weights(width)} weights): MFVI / NUTS 90% width\n"
                     f"inside ×{ratio['width_inside']:.2f}, gap ×{ratio['width_gap']:.2f}", fontsize=10)
        ax.set_xlabel("x")
        ax.set_ylim(-3.0, 3.0)
        ax.set_xlim(x[0], x[-1])
    axes[0].set_ylabel("y")
    axes[0].legend(loc="lower left", fontsize=7.5, ncol=2)
    ax = axes[2]
    ax.axvspan(-1.0, 1.0, color="0.92", zorder=0)
    ratios = []
    for width, colour in zip(WIDTHS, ("tab:green", "tab:red")):
        mf, ref = results[(width, "MFVI")]["plot"], results[(width, "NUTS")]["plot"]
        ratios += [mf["epistemic_sd"] / ref["epistemic_sd"], mf["width"] / ref["width"]]
        ax.plot(x, ratios[-2], color=colour, lw=1.8, label=f"width {width}: epistemic sd")
        ax.plot(x, ratios[-1], color=colour, lw=1.4, ls="--", label=f"width {width}: 90% width")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_yscale("log")
    ax.set_ylim(min(r.min() for r in ratios) / 1.5, max(r.max() for r in ratios) * 8.0)  # room for the legend
    ax.set_xlim(x[0], x[-1])
    ax.set_xlabel("x")
    ax.set_ylabel("MFVI / NUTS")
    ax.set_title("ratio MFVI / NUTS along x (gap shaded)", fontsize=10)
    ax.legend(fontsize=8, loc="upper center", ncol=2)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> dict:
    args = parse(parser(__doc__, "bnn_width", quick="a small instance (shorter runs), for the tests"), argv)
    start = time.perf_counter()
    out = args.out
    data = ppl.datasets.load("sinusoid", seed=args.seed)
    runs = fit_all(data, args.seed, QUICK if args.quick else FULL)
    results = measure(runs, data, args.seed)
    text = table(results)
    (out / "bnn_width_table.md").write_text(text + "\n")
    figure(results, data, out / "bnn_width.png")
    print(text)
    print(f"wrote {out / 'bnn_width.png'} and {out / 'bnn_width_table.md'}")
    results["runs"] = runs
    print(f"total wall time: {time.perf_counter() - start:.1f} s")
    return results


if __name__ == "__main__":
    main()
