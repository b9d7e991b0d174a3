"""Prediction and diagnostics over 100,000 inputs and 1,000 draws: time and peak memory.

    python -m bench.at_scale [--quick] [--out FILE.json]

A BNN (8 → 16 tanh → 1 Bernoulli) is fitted by SGLD (4 chains × 250 draws = 1,000 draws) on a
synthetic classification set; then, each in a fresh process so that its peak resident memory is
its own:

- ``predict keep_draws=True``: the posterior predictive at N inputs with the per-draw
  probabilities kept (S × N × 2 float64, twice);
- ``predict keep_draws=False``: the same summaries, block by block;
- ``function_rhat``: R-hat of the network's output at each of the N inputs;
- ``PSIS-LOO``: the diagnostics' elpd_loo when the model was fitted on all N rows.

Reported: seconds of the operation (warm process, compilation included), the process's peak
resident memory, its resident memory after the fit, and the difference — what the operation
itself added. The whole (draws × N) array of one float64 quantity is 800 MB at N = 100,000.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from bench import _harness

OPERATIONS = ("predict keep_draws=True", "predict keep_draws=False", "function_rhat", "PSIS-LOO")

CHILD = """
import json, resource, sys, time
import numpy as np, ppl
from ppl.diagnostics import function_rhat
from ppl.models import BNN

def rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10

operation, n = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(0)
X = rng.standard_normal((n, 8)).astype(np.float32)
y = (X[:, 0] + 0.5 * X[:, 1] + 0.3 * rng.standard_normal(n) > 0).astype(np.int32)
rows = n if operation == "PSIS-LOO" else 2000
post = ppl.fit(BNN(hidden=(16,), likelihood="bernoulli"), (X[:rows], y[:rows]), method="sgld", seed=0,
               num_chains=4, num_samples=250, batch_size=128, progress_bar=False)
post.flat_draws.block_until_ready()
before = rss_mib()
start = time.perf_counter()
if operation == "PSIS-LOO":
    post.diagnostics()
elif operation == "function_rhat":
    function_rhat(post, X)
else:
    post.predict(X, seed=0, keep_draws=operation.endswith("True"))
seconds = time.perf_counter() - start
print("RESULT" + json.dumps({"seconds": seconds, "peak_mib": rss_mib(), "after_fit_mib": before,
                             "draws": post.num_chains * post.num_draws}))
"""


def measure(operation: str, n: int) -> dict:
    run = subprocess.run([sys.executable, "-c", CHILD, operation, str(n)], capture_output=True, text=True)
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT")]
    if not lines:
        raise RuntimeError(f"{operation} at N={n} failed:\n{run.stderr[-3000:]}")
    return json.loads(lines[0][len("RESULT"):])


def run(quick: bool = False, repeats: int = 1) -> dict:
    n = 20_000 if quick else 100_000
    rows = []
    for operation in OPERATIONS:
        r = measure(operation, n)
        rows.append([operation, n, r["draws"], r["seconds"], r["peak_mib"], r["after_fit_mib"],
                     r["peak_mib"] - r["after_fit_mib"]])
        print(f"  {operation}: {r['seconds']:.1f} s, peak {r['peak_mib']:.0f} MiB "
              f"(+{r['peak_mib'] - r['after_fit_mib']:.0f} over the fit)", flush=True)
    columns = ["operation", "inputs", "draws", "seconds", "peak MiB", "after fit MiB", "added MiB"]
    title = "prediction and diagnostics at scale (one fresh process each; peak resident memory)"
    return {"name": "at_scale", "tables": [_harness.table(title, columns, rows)]}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20,000 inputs instead of 100,000")
    parser.add_argument("--out", help="write the result as JSON here")
    args = parser.parse_args(argv)
    return _harness.report(run(args.quick), args.out)


if __name__ == "__main__":
    main()
