"""Time to a first result: each command in a new process, cold (an empty compilation cache) and
warm (the cache the cold run filled), with its wall time and peak memory.

    python -m bench.first_result                  # imports, listing commands, a MAP fit, ppl compare
    python -m bench.first_result --quick          # without ppl compare (a minute instead of ten)
    python -m bench.first_result --out bench/results/first_result.json

What a user waits for on a small problem is mostly Python importing and XLA compiling, which only a
new process shows, so every row runs a fresh ``python``; peak memory is the process's maximum
resident set (``wait4``'s ``ru_maxrss``). ``import numpyro`` is the peer of ``import ppl``; the
cold/warm ratio is the persistent cache's effect. The cache goes in a temporary folder
(``PPL_COMPILATION_CACHE``), so the user's own cache is neither used nor touched.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import _harness

PY = sys.executable
MAP_FIT = ["-m", "ppl.cli", "fit", "--model", "bnn", "--data", "two_moons", "--method", "map", "--no-progress"]
COMPARE = ["-m", "ppl.cli", "compare"]  # output is not a terminal here, so no bars


def measure(argv: list, env: dict, cwd: Path) -> dict:
    """Wall seconds, peak resident memory (MB) and exit status of ``python argv`` in a new process."""
    start = time.perf_counter()
    process = subprocess.Popen([PY, *argv], env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    process.stdout.close()
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 1):  # 1: a comparison in which some methods fail their checks
        raise RuntimeError(f"{' '.join(argv)} exited {code}:\n{output.decode(errors='replace')[-2000:]}")
    return {"wall_s": wall, "peak_mb": usage.ru_maxrss / 1024, "exit": code, "output": output.decode(errors="replace")}


def run(quick: bool = False, repeats: int = 1) -> dict:
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        env = {**os.environ, "PPL_COMPILATION_CACHE": str(folder / "cache")}

        def row(label: str, argv: list, runs: int = 3) -> dict:
            best = min((measure(argv, env, folder) for _ in range(runs)), key=lambda r: r["wall_s"])
            rows.append([label, "", best["wall_s"], best["peak_mb"]])
            return best

        numpyro = row("import numpyro", ["-c", "import numpyro"])
        ppl_import = row("import ppl", ["-c", "import ppl"])
        row("import ppl; ppl.fit (loads JAX and the methods)", ["-c", "import ppl; ppl.fit; import ppl.inference.optimize"])
        for command in ("--help", "datasets", "methods"):
            row(f"ppl {command}", ["-m", "ppl.cli", command])
        jobs = [("ppl fit --method map (two_moons BNN)", MAP_FIT)]
        if not quick:
            jobs.append(("ppl compare (the main job)", COMPARE))
        ratios, outputs = {}, {}
        for label, argv in jobs:
            cold = measure([*argv, "--out", str(folder / "runs" / f"{len(rows)}-cold")], env, folder)
            warm = measure([*argv, "--out", str(folder / "runs" / f"{len(rows)}-warm")], env, folder)
            rows.append([label, "cold", cold["wall_s"], cold["peak_mb"]])
            rows.append([label, "warm", warm["wall_s"], warm["peak_mb"]])
            ratios[label] = warm["wall_s"] / cold["wall_s"]
            outputs[label] = cold["output"]
    tables = [
        _harness.table("Time to a first result (each row a new process)", ["command", "cache", "wall s", "peak MB"], rows),
        _harness.table(
            "Ratios",
            ["measure", "ratio"],
            [["import ppl / import numpyro", ppl_import["wall_s"] / numpyro["wall_s"]]]
            + [[f"{label}: warm / cold", ratio] for label, ratio in ratios.items()],
        ),
    ]
    return {"tables": tables, "outputs": outputs}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="leave ppl compare out")
    parser.add_argument("--out", help="also write the tables as JSON here")
    args = parser.parse_args(argv)
    result = run(args.quick)
    for label, text in result["outputs"].items():
        print(f"-- what the cold run of {label} printed:\n{text}")
    return _harness.report(result, args.out)


if __name__ == "__main__":
    main()
