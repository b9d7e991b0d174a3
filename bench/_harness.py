"""What every benchmark of the suite shares: the environment record, the machine's measured
matrix-product peak, timing with compilation apart from warm runs, tables, and the JSON file.

A benchmark module exposes ``run(quick: bool) -> dict`` (its tables and notes) and a ``main()``
that prints them; ``python -m bench.run_all`` runs them all in one process and writes one JSON file.
Ratios, not absolute times, are the result: a 2-core virtual machine's speed varies from day to
day by a factor of two, so every comparison is measured side by side in the same process.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp

PACKAGES = ("jax", "jaxlib", "numpyro", "optax", "blackjax", "arviz", "ppl")


def environment() -> dict:
    """Versions, device and machine, recorded with every result."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    device = jax.devices()[0]
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": versions,
        "platform": device.platform,
        "device": getattr(device, "device_kind", str(device)),
        "devices": jax.device_count(),
        "cpu_count": os.cpu_count(),
        "machine": f"{platform.system()} {platform.machine()}, Python {platform.python_version()}",
        "x64": bool(jax.config.jax_enable_x64),
    }


def matmul_peak(size: int = 2000, repeats: int = 7) -> float:
    """The float32 dense matrix product's rate on this machine now, in FLOP/s (median of repeats):
    the hardware bar the other rates are read against."""
    a = jax.random.normal(jax.random.PRNGKey(0), (size, size), jnp.float32)
    b = jax.random.normal(jax.random.PRNGKey(1), (size, size), jnp.float32)
    product = jax.jit(lambda x, y: x @ y)
    product(a, b).block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        product(a, b).block_until_ready()
        times.append(time.perf_counter() - start)
    return 2.0 * size**3 / statistics.median(times)


def timed(fn: Callable[[], object], repeats: int = 3) -> dict:
    """Wall seconds of ``fn``: its first call (compilation included) and the median of ``repeats``
    warm calls after it; ``compile_s`` is their difference."""
    start = time.perf_counter()
    fn()
    first = time.perf_counter() - start
    warm = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        warm.append(time.perf_counter() - start)
    median = statistics.median(warm)
    return {"first_s": first, "warm_s": median, "compile_s": max(first - median, 0.0), "warm_all_s": warm}


def per_step(fit: Callable[[int], object], short: int, repeats: int = 3, target_s: float = 3.0,
             most: int = 200000) -> dict:
    """Seconds per step of ``fit(steps)`` (a whole run of that many steps), warm: the difference
    between fits of ``short`` and ``short + extra`` steps over ``extra``, so that what a run does
    once (its start, its draws, its diagnostics) cancels. ``extra`` is sized from a pilot so that
    it takes about ``target_s``: the once-per-run work jitters by tens of milliseconds, which
    must stay small beside the difference. ``compile_s`` is the first call's excess over a warm one."""
    start = time.perf_counter()
    fit(short)
    first = time.perf_counter() - start
    pilot = short + 64
    times = []
    for steps in (short, pilot):
        start = time.perf_counter()
        fit(steps)
        times.append(time.perf_counter() - start)
    rough = max((times[1] - times[0]) / (pilot - short), 1e-6)
    extra = int(min(max(target_s / rough, 64), most))
    a = timed(lambda: fit(short), repeats)
    b = timed(lambda: fit(short + extra), repeats)
    seconds = max(b["warm_s"] - a["warm_s"], 1e-12) / extra
    return {"per_step_s": seconds, "extra_steps": extra, "fit_fixed_s": a["warm_s"] - short * seconds,
            "compile_s": max(first - a["warm_s"], 0.0)}


def table(title: str, columns: list, rows: list) -> dict:
    return {"title": title, "columns": list(columns), "rows": [list(row) for row in rows]}


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return "—" if value is None else str(value)


def render(tables: list) -> str:
    """The tables as aligned text."""
    out = []
    for t in tables:
        cells = [[_cell(v) for v in row] for row in t["rows"]]
        widths = [max(len(str(c)), *(len(row[i]) for row in cells)) if cells else len(str(c))
                  for i, c in enumerate(t["columns"])]
        out.append(t["title"])
        out.append("  " + "  ".join(str(c).rjust(w) for c, w in zip(t["columns"], widths)))
        out.append("  " + "  ".join("─" * w for w in widths))
        out.extend("  " + "  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells)
        out.append("")
    return "\n".join(out)


def write(result: dict, path: str | os.PathLike) -> Path:
    """``result`` as JSON at ``path`` (folders made)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=float))
    return path


def report(measured: dict, out: str | os.PathLike | None = None) -> dict:
    """A benchmark's ``main`` ending: ``measured`` (its ``run`` result) with the environment,
    printed as tables and, with ``out``, written as JSON."""
    result = {"environment": environment(), **measured}
    print(render(result["tables"]))
    if out:
        print(f"written {write(result, out)}")
    return result
