"""The core every layer builds on: errors, run records, random keys, data validation, the compiled
Problem and its sites, the Posterior, the Gaussian families and the curvature service, the method
protocol and registry, the objectives, and the run loop with its runtime (interrupt, progress,
devices, checkpoints, the compilation cache).

Nothing here imports a method, the API (``ppl.fit``, ``ppl.compare``, …) or the command line;
methods are reached through :mod:`ppl.core.registry`, by name.
"""
