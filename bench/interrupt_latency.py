"""How long Ctrl-C takes to stop a run, by method, on the issue's own case (digits, a BNN).

For each method, starts ``ppl.fit`` in this process, sends SIGINT to it after a delay long enough
to be past compilation, and reports the time from the signal to the end of the loop (the last chunk
reported) and to ``ppl.fit`` returning its partial result, next to the median chunk time measured
from the progress reports. Run:

    python bench/interrupt_latency.py
"""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np

from ppl.core import progress
from ppl.models import BNN
import ppl

CASES = [
    ("nuts", dict(num_samples=20000, num_chains=1)),
    ("hmc", dict(num_samples=20000, num_chains=1)),
    ("svi", dict(steps=200000)),
    ("map", dict(steps=200000, batch_size=64)),
]


def main() -> None:
    data = ppl.datasets.load("digits", seed=0)
    model = BNN(hidden=(32,), activation="tanh", likelihood="categorical")
    print(f"{'method':<6} {'signal→loop stop (s)':>21} {'signal→return (s)':>18} {'median chunk (s)':>17} {'steps done':>14}")
    for method, options in CASES:
        stamps = []
        real = progress.advance

        def advance(steps, phase=0):
            stamps.append(time.perf_counter())
            real(steps, phase)

        progress.advance = advance
        sent = {}

        def press():
            sent["at"] = time.perf_counter()
            os.kill(os.getpid(), signal.SIGINT)

        timer = threading.Timer(20.0, press)
        timer.start()
        try:
            post = ppl.fit(model, data.train, method=method, seed=0, **options)
            done = post.status.steps_done
        except ppl.Interrupted as stop:  # still in warmup: nothing to return but the state
            done = f"{stop.resume_state.progress['steps_done']} (warmup)"
        finally:
            progress.advance = real
            timer.cancel()
        returned = time.perf_counter()
        gaps = np.diff(np.unique(np.round(stamps, 4)))
        # The loop stops at the end of the chunk in flight (its last progress report); what follows
        # is building the partial result (the first call of some functions compiles them).
        stopped = max(stamps) - sent["at"]
        print(
            f"{method:<6} {stopped:>21.2f} {returned - sent['at']:>18.2f} {np.median(gaps[len(gaps) // 2:]):>17.2f} "
            f"{str(done):>14}"
        )


if __name__ == "__main__":
    main()
