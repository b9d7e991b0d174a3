"""Run the benchmark suite in one process and write one JSON file of its tables.

    python -m bench.run_all [--quick] [--only overhead hardware] [--out bench/results/NAME.json]

Each benchmark is a module of this folder with ``run(quick, repeats) -> dict``; each also runs on
its own as ``python -m bench.NAME``. The file records the environment (versions of jax, jaxlib,
numpyro, optax and blackjax, the device) with the tables, so that runs on other days or machines
can be set side by side.
"""

from __future__ import annotations

import argparse
import importlib
import time

from bench import _harness

SUITE = ("overhead", "hardware", "scaling", "ensemble_vs_sequential", "nuts_vs_numpyro", "laplace_vs_laplace_torch", "at_scale")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="each benchmark's short form")
    parser.add_argument("--only", nargs="+", choices=SUITE, help="run these benchmarks only")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", help="JSON file (default: bench/results/run_all-<date>.json)")
    args = parser.parse_args(argv)
    environment = _harness.environment()
    result = {"environment": environment, "benchmarks": {}}
    for name in args.only or SUITE:
        start = time.perf_counter()
        print(f"== {name}", flush=True)
        out = importlib.import_module(f"bench.{name}").run(args.quick, args.repeats)
        out["wall_s"] = time.perf_counter() - start
        result["benchmarks"][name] = out
        print(_harness.render(out["tables"]), flush=True)
    path = args.out or f"bench/results/run_all-{environment['date'][:10]}.json"
    print(f"written {_harness.write(result, path)}")
    return result


if __name__ == "__main__":
    main()
