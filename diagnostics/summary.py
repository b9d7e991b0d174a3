"""A per-parameter summary in the shape of NumPyro's ``print_summary``: one row per scalar element
of each latent site, with its mean, sd, median, a central interval, bulk ESS and R-hat.

Which of ESS and R-hat apply depends on what the draws are (the same reading as the ArviZ export):
Markov chains get both; independent draws of a fitted approximation get the ESS of the draws split
into chains, and no R-hat (independent draws have R-hat 1 by construction, which says nothing about
the fit: k-hat in ``diagnostics()`` does); a point or an ensemble's members get neither. The
interval is the equal-tailed one (quantiles (1 − prob)/2 and (1 + prob)/2), not NumPyro's HPDI.
"""

from __future__ import annotations

import math
import textwrap
from typing import NamedTuple

import numpy as np

from ppl.diagnostics import _arviz
from ppl.diagnostics.report import export_layout

__all__ = ["Summary", "summary"]


class Summary(NamedTuple):
    """``print(summary)`` gives the table; ``rows`` holds the numbers, name -> {column: value}
    (None where a column does not apply to these draws)."""

    rows: dict
    prob: float
    divergences: int | None
    note: str

    @property
    def columns(self) -> tuple:
        return _columns(self.prob)

    def __str__(self) -> str:
        width = max([len(name) for name in self.rows] + [8]) + 2
        lines = [" " * width + "".join(f"{c:>10}" for c in self.columns)]
        for name, row in self.rows.items():
            cells = "".join(f"{_cell(row[c], c):>10}" for c in self.columns)
            lines.append(f"{name:>{width}}{cells}")
        if self.divergences is not None:
            lines += ["", f"Number of divergences: {self.divergences}"]
        lines += ["", textwrap.fill(self.note, 100)]
        return "\n".join(lines)


def _columns(prob: float) -> tuple:
    return ("mean", "std", "median", f"{50 * (1 - prob):.1f}%", f"{50 * (1 + prob):.1f}%", "n_eff", "r_hat")


def _cell(value, column: str) -> str:
    if value is None:
        return "—"
    if not math.isfinite(value):
        return str(value)
    if column == "n_eff":
        return f"{value:.2f}"
    return f"{value:.2f}" if abs(value) >= 0.01 or value == 0 else f"{value:.2e}"


def summary(posterior, prob: float = 0.9, exclude_deterministic: bool = True) -> Summary:
    """The summary of ``posterior``'s latent sites (and its deterministic ones with
    ``exclude_deterministic=False``), ``prob`` the mass of the central interval."""
    if isinstance(prob, bool) or not isinstance(prob, (int, float)) or not 0 < prob < 1:
        raise ValueError(f"summary: prob must be a number in (0, 1), got {prob!r}")

    chains, note = export_layout(posterior)
    mixing = posterior.kind == "chains"
    sampled = posterior.kind in ("chains", "independent", "mixture")  # draws whose ESS means something
    names = _columns(prob)
    draws = posterior.latent_draws if exclude_deterministic else posterior.draws
    low, high = 0.5 * (1 - prob), 0.5 * (1 + prob)
    rows: dict = {}
    for site, value in draws.items():
        value = np.asarray(value, dtype=float)
        shape = value.shape[2:]
        columns = value.reshape(chains, -1, int(np.prod(shape, dtype=int)))
        pooled = columns.reshape(-1, columns.shape[-1])
        ess = _arviz.ess(columns, "bulk") if sampled and columns.shape[1] >= 4 else None
        rhat = _arviz.rhat(columns) if mixing else None
        quantiles = np.quantile(pooled, [0.5, low, high], axis=0)
        for i in range(columns.shape[-1]):
            name = site if not shape else f"{site}[{','.join(map(str, np.unravel_index(i, shape)))}]"
            rows[name] = dict(zip(names, (
                float(pooled[:, i].mean()), float(pooled[:, i].std(ddof=1)) if len(pooled) > 1 else 0.0,
                float(quantiles[0, i]), float(quantiles[1, i]), float(quantiles[2, i]),
                None if ess is None else float(ess[i]), None if rhat is None else float(rhat[i]),
            )))
    stats = posterior.chain_stats
    divergences = None if stats is None else stats.divergences
    return Summary(rows, float(prob), None if divergences is None else int(divergences), note)
