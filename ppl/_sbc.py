"""Simulation-based calibration (SBC) and its variational variant (VSBC).

**SBC** (Talts, Betancourt, Simpson, Vehtari & Gelman 2018, "Validating Bayesian inference
algorithms with simulation-based calibration", arXiv:1804.06788). For i = 1..N draw

    θ̃ᵢ ∼ p(θ),   ỹᵢ ∼ p(y | θ̃ᵢ),   θᵢ₁ … θᵢ_L ∼ q(θ | ỹᵢ)   (the fitted posterior).

Because p(θ) p(y | θ) = p(y) p(θ | y), θ̃ᵢ is itself a draw from p(θ | ỹᵢ); if q is that exact
posterior and its L draws are independent, θ̃ᵢ and the draws are exchangeable, so for every scalar
function f (here each scalar component θⱼ) the rank

    rᵢⱼ = #{l : f(θᵢₗ) < f(θ̃ᵢ)} ∈ {0, …, L}

is uniform on {0, …, L} (ties, which a point mass or a saturated transform can produce, are broken
uniformly at random, which keeps the rank uniform). The ranks are binned into B bins, B dividing
L + 1 so that every bin holds (L + 1)/B rank values and has probability 1/B exactly, and tested
with Pearson's χ² statistic

    X²ⱼ = Σ_b (c_jb − N/B)² / (N/B)   ~   χ²(B − 1) under uniformity,

one p-value per scalar parameter. The overall verdict is Bonferroni-corrected: it passes at level
α when every p-value exceeds α / P (P scalar parameters). Typical shapes of a failing histogram:
∪ — q too narrow (or autocorrelated draws, below); ∩ — q too wide; a slope — q biased.

Samplers return autocorrelated draws. Ranks against L *correlated* draws are not uniform even for
an exact sampler: the draws cluster, θ̃ falls outside the cluster too often, and the histogram is
∪-shaped. Talts et al. therefore thin the chain to about L effectively independent draws.
Here the stored draws (all chains) are thinned evenly down to L; the bulk effective sample size of
the stored draws is recorded per simulation (``SBCResult.min_ess``), and a note is added when it
falls below L (then run longer chains rather than trust a rejection). Density methods (exact, SVI)
get L fresh independent draws from q.

**VSBC** (Yao, Vehtari, Simpson & Gelman 2018, "Yes, but did it work?: Evaluating variational
inference", ICML). For a method with a density q, compute for every simulation the marginal
CDF value of the truth under q,

    pᵢⱼ = Pr_q(θⱼ ≤ θ̃ᵢⱼ),

estimated from M draws of q (p̂ = #{θⱼ ≤ θ̃ᵢⱼ}/M). If q is the exact posterior, pᵢⱼ is uniform;
Yao et al. use the weaker consequence that its distribution is symmetric about 1/2, which a q
*biased* in θⱼ breaks, and compare {pᵢⱼ} with {1 − pᵢⱼ} by the two-sample Kolmogorov–Smirnov
statistic. The binomial noise of p̂ does not disturb this: if p =ᵈ 1 − p then p̂ =ᵈ 1 − p̂.

Departure from Yao et al.: the two samples are mirror images, not independent, and the usual
two-sample KS p-value is then anti-conservative (for exactly uniform p and N = 200 it rejected
4.4% of 4000 simulated replications at nominal 1%). :func:`symmetry_test` keeps the statistic and computes its exact
null distribution instead: under symmetry the signs of pᵢ − ½ are fair coins given the distances
|pᵢ − ½|, and the statistic is the largest excursion of the walk of those signs.

VSBC is blind to a q of the right centre but the wrong width (mean-field VI on a Gaussian
posterior: p = Φ(z s_post / s_q), z ~ N(0, 1), is symmetric whatever s_q), which the rank test
catches; and it sees a biased q that the ranks may miss at a given N. Samplers have no q: their
VSBC is None with the reason.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from dataclasses import dataclass, field
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from numpyro import handlers
from scipy.stats import binom, chi2

from ppl._fit import fit, method_options as options_of
from ppl.core import progress
from ppl.core.data import validate_program_data
from ppl.core.errors import OptionError
from ppl.core.keys import as_key
from ppl.diagnostics import convergence

__all__ = ["sbc", "SBCResult", "default_num_bins", "symmetry_test", "chi_squared", "ranks_of"]

# Bins are chosen so that each expects at least this many ranks: Pearson's χ² approximation is
# adequate from about 5 expected counts (Cochran 1954); 10 leaves a margin.
MIN_EXPECTED_PER_BIN = 10
CHI2_APPROXIMATION_MIN = 5
DEFAULT_VSBC_DRAWS = 1000
BAND_LEVEL = 0.99  # the rank-histogram band: central 99% of a Binomial(N, 1/B) bin count


@dataclass(frozen=True, eq=False)
class SBCResult:
    """Ranks, uniformity tests and VSBC p-values of one SBC run.

    Attributes:
        method: the registry name of the fitted method.
        num_simulations: N, the number of simulated datasets.
        num_ranks: L, the number of posterior draws per simulation; ranks take values 0..L.
        num_bins: B, the number of histogram bins (B divides L + 1).
        param_names: one name per scalar parameter, ``"mu"`` or ``"theta[0]"`` (``"W[0,1]"``).
        ranks: (N, P) integer ranks.
        chi2: (P,) Pearson χ² statistics of the binned ranks, B − 1 degrees of freedom.
        pvalues: (P,) χ² p-values (uncorrected; ``passed`` applies Bonferroni).
        vsbc_statistics: (P,) KS distances between {pᵢⱼ} and {1 − pᵢⱼ} (Yao et al.'s VSBC), or None.
        vsbc_pvalues: (P,) exact p-values of those distances under symmetry (:func:`symmetry_test`),
            or None.
        vsbc_reason: why ``vsbc_pvalues`` is None (None when they exist).
        cdf_values: (N, P) the VSBC values pᵢⱼ = Pr_q(θⱼ ≤ θ̃ᵢⱼ), or None.
        min_ess: (N,) for samplers, the smallest bulk ESS over all parameters of each fit's stored
            draws (before thinning); None for methods that draw independently from q.
        notes: caveats found while running (autocorrelation, small expected counts).
    """

    method: str
    num_simulations: int
    num_ranks: int
    num_bins: int
    param_names: tuple
    ranks: np.ndarray
    chi2: np.ndarray
    pvalues: np.ndarray
    vsbc_statistics: np.ndarray | None = None
    vsbc_pvalues: np.ndarray | None = None
    vsbc_reason: str | None = None
    cdf_values: np.ndarray | None = None
    min_ess: np.ndarray | None = None
    notes: tuple = field(default=())

    @property
    def num_params(self) -> int:
        return len(self.param_names)

    @property
    def expected_count(self) -> float:
        """N / B, the expected number of ranks per bin under uniformity."""
        return self.num_simulations / self.num_bins

    def counts(self) -> np.ndarray:
        """(P, B) rank counts per bin."""
        return bin_counts(self.ranks, self.num_ranks, self.num_bins)

    def passed(self, alpha: float = 0.01) -> bool:
        """True when no χ² test rejects uniformity at the Bonferroni-corrected level α / P."""
        return bool(np.all(self.pvalues > _check_alpha(alpha) / self.num_params))

    def vsbc_passed(self, alpha: float = 0.01) -> bool | None:
        """True when no VSBC symmetry test rejects at α / P; None without VSBC (see ``vsbc_reason``)."""
        if self.vsbc_pvalues is None:
            return None
        return bool(np.all(self.vsbc_pvalues > _check_alpha(alpha) / self.num_params))

    def __str__(self) -> str:
        alpha = 0.01
        threshold = alpha / self.num_params
        vsbc = self.vsbc_passed(alpha)
        lines = [
            f"SBC of {self.method!r}: {self.num_simulations} simulations, ranks 0..{self.num_ranks}, "
            f"{self.num_bins} bins ({self.expected_count:g} expected per bin)",
            f"rank uniformity (chi2), Bonferroni alpha={alpha:g}/{self.num_params}: "
            + ("passed" if self.passed(alpha) else "FAILED"),
            f"VSBC symmetry (KS), Bonferroni alpha={alpha:g}/{self.num_params}: "
            + (f"n/a — {self.vsbc_reason}" if vsbc is None else ("passed" if vsbc else "FAILED")),
        ]
        width = max(9, *(len(name) for name in self.param_names))
        header = f"{'parameter':<{width}}  {'chi2':>8}  {'p':>9}  {'ranks':<5}"
        if vsbc is not None:
            header += f"  {'VSBC D':>6}  {'VSBC p':>9}  {'VSBC':<4}"
        lines.append(header)
        for j, name in enumerate(self.param_names):
            verdict = "ok" if self.pvalues[j] > threshold else "FAIL"
            row = f"{name:<{width}}  {self.chi2[j]:>8.2f}  {self.pvalues[j]:>9.3g}  {verdict:<5}"
            if vsbc is not None:
                verdict = "ok" if self.vsbc_pvalues[j] > threshold else "FAIL"
                row += f"  {self.vsbc_statistics[j]:>6.3f}  {self.vsbc_pvalues[j]:>9.3g}  {verdict:<4}"
            lines.append(row.rstrip())
        lines.extend(f"note: {note}" for note in self.notes)
        return "\n".join(lines)

    def plot(self, path, params=None, columns: int = 4) -> None:
        """Write a PNG of rank histograms to ``path``: one panel per scalar parameter (or the
        ``params`` named), the expected count N/B as a line and the central 99% band of a
        Binomial(N, 1/B) bin count shaded. Bars outside the band are drawn in red.

        A ∪ shape means q is too narrow (or the draws are autocorrelated), ∩ too wide, a slope
        biased (Talts et al. 2018, §4).
        """
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        names = list(self.param_names) if params is None else list(params)
        unknown = [name for name in names if name not in self.param_names]
        if unknown or not names:
            raise OptionError(f"params {unknown or names} are not among {list(self.param_names)}")
        counts = self.counts()
        tail = (1.0 - BAND_LEVEL) / 2.0
        low, high = binom.ppf([tail, 1.0 - tail], self.num_simulations, 1.0 / self.num_bins)
        columns = max(1, min(int(columns), len(names)))
        rows = math.ceil(len(names) / columns)
        figure = Figure(figsize=(max(2.6 * columns, 4.2), 2.2 * rows + 0.9), layout="constrained")
        FigureCanvasAgg(figure)
        axes = figure.subplots(rows, columns, squeeze=False)
        bin_width = (self.num_ranks + 1) / self.num_bins
        edges = np.arange(self.num_bins) * bin_width
        for panel, name in enumerate(names):
            axis = axes[panel // columns][panel % columns]
            j = self.param_names.index(name)
            outside = (counts[j] < low) | (counts[j] > high)
            axis.axhspan(low, high, color="0.85", zorder=0, label=f"{BAND_LEVEL:.0%} band")
            axis.axhline(self.expected_count, color="0.35", linewidth=1.0, zorder=1, label="expected")
            axis.bar(
                edges,
                counts[j],
                width=bin_width,
                align="edge",
                color=np.where(outside, "tab:red", "tab:blue").tolist(),
                edgecolor="white",
                linewidth=0.5,
                zorder=2,
            )
            axis.set_xlim(0, self.num_ranks + 1)
            axis.set_ylim(0, max(high, counts[j].max()) * 1.15)
            title = f"{name}\nchi2 p={self.pvalues[j]:.2g}"
            if self.vsbc_pvalues is not None:
                title += f", VSBC p={self.vsbc_pvalues[j]:.2g}"
            axis.set_title(title, fontsize=8)
            axis.tick_params(labelsize=7)
            if panel % columns == 0:
                axis.set_ylabel("count", fontsize=8)
            if panel + columns >= len(names):  # the lowest panel of its column
                axis.set_xlabel(f"rank (0..{self.num_ranks})", fontsize=8)
        for panel in range(len(names), rows * columns):
            axes[panel // columns][panel % columns].set_visible(False)
        figure.legend(
            *axes[0][0].get_legend_handles_labels(), loc="outside lower center", ncols=2, fontsize=7, frameon=False
        )
        figure.suptitle(
            f"SBC rank histograms of {self.method}\nN={self.num_simulations}, L={self.num_ranks}, "
            f"{self.num_bins} bins (red: outside the band)",
            fontsize=10,
        )
        figure.savefig(path, format="png", dpi=110)


def _check_alpha(alpha) -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 < alpha < 1.0:
        raise OptionError(f"alpha must lie in (0, 1), got {alpha!r}")
    return float(alpha)


def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise OptionError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def default_num_bins(num_simulations: int, num_ranks: int) -> int:
    """The largest B ≥ 2 dividing L + 1 with N / B ≥ ``MIN_EXPECTED_PER_BIN``.

    Dividing L + 1 makes every bin hold the same number of rank values, so each has probability
    exactly 1/B under uniformity; the expected count keeps Pearson's χ² approximation adequate
    while using as many bins as that allows (more bins resolve the histogram's shape).
    """
    candidates = [b for b in _divisors(num_ranks + 1) if b >= 2 and num_simulations / b >= MIN_EXPECTED_PER_BIN]
    if not candidates:
        raise OptionError(
            f"no bin count B >= 2 dividing num_ranks + 1 = {num_ranks + 1} gives {MIN_EXPECTED_PER_BIN} expected "
            f"ranks per bin with {num_simulations} simulations; run at least "
            f"{MIN_EXPECTED_PER_BIN * min(b for b in _divisors(num_ranks + 1) if b >= 2)} simulations, choose "
            "num_ranks so that num_ranks + 1 has small divisors (e.g. 99, 127), or pass num_bins"
        )
    return max(candidates)


def _divisors(n: int) -> list:
    return [b for b in range(1, n + 1) if n % b == 0]


def bin_counts(ranks: np.ndarray, num_ranks: int, num_bins: int) -> np.ndarray:
    """(P, B) counts of (N, P) ranks in B equal bins of the rank values 0..L."""
    per_bin = (num_ranks + 1) // num_bins
    bins = np.asarray(ranks) // per_bin
    return np.stack([np.bincount(bins[:, j], minlength=num_bins) for j in range(bins.shape[1])])


def chi_squared(ranks: np.ndarray, num_ranks: int, num_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Pearson χ² statistics and p-values (B − 1 degrees of freedom) of binned (N, P) ranks."""
    counts = bin_counts(ranks, num_ranks, num_bins)
    expected = np.asarray(ranks).shape[0] / num_bins
    statistic = np.sum(np.square(counts - expected), axis=1) / expected
    return statistic, chi2.sf(statistic, num_bins - 1)


def symmetry_test(values) -> tuple[float, float]:
    """Test that ``values`` (N,) in [0, 1] are symmetric about 1/2: Yao et al.'s KS statistic between
    {pᵢ} and {1 − pᵢ}, with its exact null distribution. Returns ``(statistic, pvalue)``.

    With dᵢ = pᵢ − ½, the two-sample KS statistic between the sample and its mirror image is

        D = max_t |Σ_{i : |dᵢ| ≥ t} sign(dᵢ)| / N,

    the largest excursion of the ±1 walk that takes the signs in order of decreasing |dᵢ| (read at
    the ends of groups of tied |dᵢ|). Under symmetry the signs are fair coins independent of the
    |dᵢ|, so conditionally on the |dᵢ| the walk is a simple random walk, and the p-value
    P(max |S| ≥ N·D) follows exactly from a recursion over its positions. (scipy's ``ks_2samp``
    p-value assumes two independent samples; for mirror images it is anti-conservative: for
    uniform p and N = 200 it rejected 4.4% of 4000 replications at nominal 1% and 1.4% at 0.1%.)
    """
    # Rounding: p and 1 − p computed in floating point must give the same |p − ½| to tie.
    offsets = np.round(np.asarray(values, dtype=float) - 0.5, 12)
    nonzero = offsets[offsets != 0.0]
    if nonzero.size == 0:
        return 0.0, 1.0
    order = np.argsort(-np.abs(nonzero), kind="stable")
    magnitude = np.abs(nonzero)[order]
    walk = np.cumsum(np.sign(nonzero[order]).astype(np.int64))
    group_end = np.append(magnitude[1:] != magnitude[:-1], True)
    excursion = int(np.max(np.abs(walk[group_end])))
    if excursion == 0:
        return 0.0, 1.0
    steps = nonzero.size
    # Probabilities of walk positions -steps-1 .. steps+1 for the paths that have stayed inside.
    positions = np.arange(-steps - 1, steps + 2)
    inside = np.abs(positions) < excursion
    probability = (positions == 0).astype(float)
    for step in range(steps):
        moved = np.zeros_like(probability)
        moved[1:-1] = 0.5 * (probability[:-2] + probability[2:])
        probability = np.where(inside, moved, 0.0) if group_end[step] else moved
    return excursion / offsets.size, float(min(1.0, max(0.0, 1.0 - probability.sum())))


def ranks_of(draws: np.ndarray, truth: np.ndarray, key) -> np.ndarray:
    """Rank of each component of ``truth`` (P,) among ``draws`` (L, P): #{draws < truth}, plus a
    uniform integer in 0..#{draws == truth} (from ``key``) so that ties keep the rank uniform."""
    below = np.sum(draws < truth[None, :], axis=0)
    ties = np.sum(draws == truth[None, :], axis=0)
    uniform = np.asarray(jax.random.uniform(key, truth.shape), dtype=np.float64)
    return below + np.floor(uniform * (ties + 1)).astype(np.int64)


def _component_names(name: str, shape: tuple) -> list:
    if not shape:
        return [name]
    return [f"{name}[{','.join(str(i) for i in index)}]" for index in np.ndindex(*shape)]


def _flatten(values: dict, sites: list, leading: int) -> np.ndarray:
    """Concatenate site arrays (leading, *shape) into (leading, P) in ``sites`` order."""
    return np.concatenate([np.asarray(values[name]).reshape(leading, -1) for name in sites], axis=1)


@contextlib.contextmanager
def _quiet_fits():
    # N fits would each draw their own progress bars; SBC silences them and restores the setting.
    previous = progress._STATE["enabled"]
    progress.enable(False)
    try:
        yield
    finally:
        progress.enable(previous)


def _check_observed_argument(model_fn, observed: str) -> None:
    try:
        parameters = inspect.signature(model_fn).parameters
    except (TypeError, ValueError):  # no introspectable signature: the first call will tell
        return
    if observed in parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    raise OptionError(
        f"observed={observed!r} is not an argument of the program; its arguments are {list(parameters)}, and "
        "sbc calls it with the observed site's name as the keyword"
    )


def _simulate(model_fn, call_kwargs: dict, observed: str, key) -> tuple[dict, np.ndarray]:
    """One prior-predictive draw: (θ̃ as dict latent site -> value, ỹ)."""
    call_text = f"model_fn(**data, {observed}=None)"
    try:
        trace = handlers.trace(handlers.seed(model_fn, rng_seed=key)).get_trace(**call_kwargs)
    except Exception as error:  # the user's program failing on its arguments: say which call
        raise OptionError(f"simulating with {call_text} failed ({type(error).__name__}: {error})") from error
    sample_sites = [name for name, site in trace.items() if site["type"] == "sample"]
    site = trace.get(observed)
    if site is None or site["type"] != "sample":
        raise OptionError(
            f"observed={observed!r} is not a sample site of the program; its sample sites are {sample_sites}"
        )
    if site["is_observed"]:
        raise OptionError(
            f"site {observed!r} is still observed when the program is called as {call_text}; the keyword that "
            "feeds the site must have the site's name"
        )
    latent = {
        name: np.asarray(s["value"])
        for name, s in trace.items()
        if s["type"] == "sample" and not s["is_observed"] and name != observed
    }
    if not latent:
        raise OptionError(f"the program has no latent sample sites besides {observed!r}; there is nothing to calibrate")
    return latent, np.asarray(site["value"])


VSBC_UNAVAILABLE = {
    "sampler": "{method!r} is a sampler: there is no density q whose CDF VSBC evaluates",
    "point": "{method!r} returned a point estimate: there is no density q whose CDF VSBC evaluates",
}


def _posterior_kind(post, method: str, num_ranks: int) -> str:
    """``"sampler"`` (stored draws only), ``"density"`` (a q to draw from) or ``"point"``."""
    if not post.has_density and post.kind in ("chains", "members"):
        stored = post.num_chains * post.num_draws
        if stored < num_ranks:
            raise OptionError(
                f"{method!r} stored {stored} draws ({post.num_chains} chains x {post.num_draws}), fewer than "
                f"num_ranks={num_ranks}; raise num_samples (ideally so that the effective sample size exceeds "
                "num_ranks) or lower num_ranks"
            )
        return "sampler"
    return "density" if post.has_density else "point"


def _posterior_draws(post, num_ranks: int, key) -> dict:
    """L draws per site, (L, *shape): thinned stored draws for samplers, fresh draws from q (or
    the point estimate) for methods with an approximation."""
    if post.approximation is not None:
        return post.sample(num_ranks, seed=key)
    total = post.num_chains * post.num_draws
    # Evenly spaced over the chain-major sequence of all chains: stride total/L >= 1.
    index = (np.arange(num_ranks) * total) // num_ranks
    return {name: value.reshape(total, *value.shape[2:])[index] for name, value in post.draws.items()}


def sbc(
    model_fn: Callable,
    method: str,
    num_simulations: int,
    seed: int | jax.Array,
    *,
    data: dict | None = None,
    observed: str = "y",
    num_ranks: int = 99,
    num_bins: int | None = None,
    vsbc_draws: int = DEFAULT_VSBC_DRAWS,
    **method_options,
) -> SBCResult:
    """Simulation-based calibration of ``method`` on the NumPyro program ``model_fn``.

    For each simulation i, with keys split from ``seed`` by ``fold_in(key, i)``: draw θ̃ and ỹ by
    running ``model_fn(**data, <observed>=None)`` under ``numpyro.handlers.seed``/``trace``, fit
    ``ppl.fit(model_fn, {**data, observed: ỹ}, method=method, **method_options)``, take L draws
    from the posterior (samplers: the stored draws of all chains thinned evenly to L — their
    autocorrelation must be low, see ``SBCResult.min_ess``; density methods: L fresh draws from q)
    and rank every scalar component of every latent site of θ̃ among them. Then Pearson's χ² test
    of the binned ranks and, for methods with a density q, Yao et al.'s VSBC symmetry test. See the
    module docstring for the mathematics.

    Every simulated dataset has the same shapes, so every fit after the first reuses the compiled
    programs (nothing is retraced).

    Args:
        model_fn: a plain NumPyro program taking its data and ``<observed>`` as keyword arguments.
        method: a registry name (``nuts``, ``hmc``, ``svi``, ``map``, ...).
        num_simulations: N ≥ 2.
        seed: an int or a JAX PRNG key; the same seed gives the same ranks, bit for bit.
        data: keyword arguments of the program other than ``observed`` (arrays are data, Python
            scalars, strings and tuples are static, as for ``ppl.fit``).
        observed: the name of the sample site (and keyword) that is simulated and then conditioned on.
        num_ranks: L, the number of posterior draws per simulation; ranks take values 0..L.
        num_bins: B, a divisor of L + 1; default :func:`default_num_bins`.
        vsbc_draws: M, the number of draws of q that estimate each VSBC value Pr_q(θⱼ ≤ θ̃ⱼ).
        **method_options: passed to ``ppl.fit`` (e.g. ``num_samples=400``, ``guide="full_rank"``).
            A sampler runs with ``time_budget=0`` unless given: exactly ``num_samples`` draws per chain.

    Returns:
        an :class:`SBCResult`; ``result.passed(alpha)`` is the Bonferroni-corrected verdict.

    Raises:
        OptionError: bad arguments (N < 2, L < 1, B not dividing L + 1, an unknown observed site,
            a sampler storing fewer than L draws, ...), before or at the first simulation.
    """
    if any(cls.__name__ == "SupervisedModel" for cls in type(model_fn).__mro__):
        raise OptionError(
            "sbc takes a plain NumPyro program called with keyword arguments; wrap a declarative model, e.g. "
            "def program(X, y=None): model(X, y)"
        )
    if not callable(model_fn):
        raise OptionError(f"model_fn must be a NumPyro program (a callable), got {type(model_fn).__name__}")
    if not isinstance(method, str):
        raise OptionError(f"method must be a registry name (a string), got {type(method).__name__}")
    num_simulations = _check_int("num_simulations", num_simulations, 2)
    num_ranks = _check_int("num_ranks", num_ranks, 1)
    vsbc_draws = _check_int("vsbc_draws", vsbc_draws, 1)
    if not isinstance(observed, str) or not observed:
        raise OptionError(f"observed must be the name of a sample site, got {observed!r}")
    if num_bins is None:
        num_bins = default_num_bins(num_simulations, num_ranks)
    else:
        num_bins = _check_int("num_bins", num_bins, 2)
        if (num_ranks + 1) % num_bins:
            divisors = [b for b in _divisors(num_ranks + 1) if b >= 2]
            raise OptionError(
                f"num_bins={num_bins} does not divide num_ranks + 1 = {num_ranks + 1}, so the bins would hold "
                f"unequal numbers of rank values; choose one of {divisors}"
            )
    data = {} if data is None else data
    if isinstance(data, dict) and observed in data:
        raise OptionError(
            f"data contains {observed!r}, the site that sbc simulates; pass only the program's other arguments"
        )
    arrays, static = validate_program_data(data)
    _check_observed_argument(model_fn, observed)
    call_kwargs = {**{name: jnp.asarray(value) for name, value in arrays.items()}, **static, observed: None}

    if "time_budget" in options_of(method):
        # a sampler takes exactly the draws it is asked for: SBC calibrates the sampler at that
        # length, and a run that extends until its checks pass would make every simulation's cost
        # (and number of draws) depend on its data
        method_options = {"time_budget": 0, **method_options}
    key = as_key(seed)
    y_shape = None
    with _quiet_fits():
        for i in range(num_simulations):
            prior_key, fit_key, draw_key, tie_key, vsbc_key = jax.random.split(jax.random.fold_in(key, i), 5)
            truth, y_sim = _simulate(model_fn, call_kwargs, observed, prior_key)
            if y_shape is None:
                y_shape = y_sim.shape
            elif y_sim.shape != y_shape:
                raise OptionError(
                    f"simulation {i} gave {observed!r} the shape {y_sim.shape}, the first gave {y_shape}; sbc needs "
                    "fixed-shape programs"
                )
            post = fit(model_fn, {**data, observed: y_sim}, method=method, seed=fit_key, **method_options)
            if post.status.interrupted:
                # A fit stopped by Ctrl-C returns what it had; ranks against it would be meaningless.
                raise KeyboardInterrupt(f"sbc interrupted during simulation {i} of {num_simulations}")
            if i == 0:
                kind = _posterior_kind(post, method, num_ranks)
                site_names = [site.name for site in post.problem.sites]
                if set(site_names) != set(truth):
                    raise OptionError(
                        f"the program's latent sites differ between simulating ({sorted(truth)}) and fitting "
                        f"({sorted(site_names)}); sbc needs the same latent sites in both"
                    )
                param_names = [n for name in site_names for n in _component_names(name, truth[name].shape)]
                ranks = np.zeros((num_simulations, len(param_names)), dtype=np.int64)
                cdf_values = np.zeros((num_simulations, len(param_names))) if kind == "density" else None
                min_ess = np.zeros(num_simulations) if kind == "sampler" else None
            flat_truth = _flatten(truth, site_names, 1)[0]
            draws = _flatten(_posterior_draws(post, num_ranks, draw_key), site_names, num_ranks)
            ranks[i] = ranks_of(draws, flat_truth, tie_key)
            if min_ess is not None:
                min_ess[i] = convergence.min_ess(list(post.latent_draws.values()), "bulk")
            if cdf_values is not None:
                q_draws = _flatten(post.sample(vsbc_draws, seed=vsbc_key), site_names, vsbc_draws)
                cdf_values[i] = np.mean(q_draws <= flat_truth[None, :], axis=0)

    statistic, pvalues = chi_squared(ranks, num_ranks, num_bins)
    vsbc_statistics = vsbc_pvalues = None
    if cdf_values is not None:
        vsbc_statistics, vsbc_pvalues = np.array([symmetry_test(column) for column in cdf_values.T]).T
    notes = []
    if num_simulations / num_bins < CHI2_APPROXIMATION_MIN:
        notes.append(
            f"{num_simulations / num_bins:g} expected ranks per bin (< {CHI2_APPROXIMATION_MIN}): the chi2 "
            "p-values are rough; use fewer bins or more simulations"
        )
    if min_ess is not None and np.any(min_ess < num_ranks):
        notes.append(
            f"in {int(np.sum(min_ess < num_ranks))} of {num_simulations} fits the smallest bulk ESS of the stored "
            f"draws (lowest {min_ess.min():.0f}) was below num_ranks={num_ranks}: the thinned draws are "
            "autocorrelated, which makes the rank histogram U-shaped even for a correct sampler — raise "
            "num_samples before trusting a rejection"
        )
    return SBCResult(
        method=method,
        num_simulations=num_simulations,
        num_ranks=num_ranks,
        num_bins=num_bins,
        param_names=tuple(param_names),
        ranks=ranks,
        chi2=statistic,
        pvalues=pvalues,
        vsbc_statistics=vsbc_statistics,
        vsbc_pvalues=vsbc_pvalues,
        vsbc_reason=None if kind == "density" else VSBC_UNAVAILABLE[kind].format(method=method),
        cdf_values=cdf_values,
        min_ess=min_ess,
        notes=tuple(notes),
    )
