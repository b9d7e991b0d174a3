"""The only module that imports ArviZ: a move to ArviZ 1.x touches this file alone."""

from __future__ import annotations

import contextlib
import warnings

import numpy as np
import scipy.fft
import scipy.special

__all__ = ["rhat", "ess", "psis", "relative_efficiency", "inference_data", "plot_chains", "compare_elpd"]


def _az():
    """ArviZ, imported on first use: R-hat and ESS are computed here without it, so a fit whose
    diagnostics need nothing else (a MAP fit's) does not pay its half second of import."""
    import arviz

    return arviz


@contextlib.contextmanager
def _quiet():
    """ArviZ warns (and numpy divides by zero) on degenerate chains — constant, very short, or
    with more chains than draws. ppl reports those cases itself, so silence them here."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def rhat(array: np.ndarray) -> np.ndarray:
    """Rank-normalised split R-hat (max of bulk and folded; Vehtari et al. 2021) per component of
    (chain, draw, ...), as ``az.rhat(method="rank")`` computes it, vectorised over the components.

    ArviZ's own loops over components in Python at about a millisecond each, which takes minutes
    for function-space R-hat at 100,000 inputs; the same estimator over all columns at once takes
    a fraction of a second (a test pins agreement with ArviZ to rounding). Components with a NaN,
    or arrays of fewer than 2 chains or 4 draws, give NaN, as in ArviZ.
    """
    array = np.asarray(array, dtype=float)
    chains, draws = array.shape[:2]
    shape = array.shape[2:]
    if chains < 2 or draws < 4:
        return np.full(shape, np.nan)
    half = draws // 2
    columns = array.reshape(chains, draws, -1)
    split = np.concatenate([columns[:, :half], columns[:, draws - half :]], axis=0)  # (2C, half, M)
    folded = np.abs(split - np.median(split.reshape(-1, split.shape[-1]), axis=0))
    with _quiet():
        value = np.maximum(_split_rhat(_z_scale(split)), _split_rhat(_z_scale(folded)))
    value[np.isnan(columns).any(axis=(0, 1))] = np.nan
    return value.reshape(shape)


def _z_scale(split: np.ndarray) -> np.ndarray:
    """Normal scores of the pooled draws' average ranks, per column (Blom's offset 3/8)."""
    pooled = np.ascontiguousarray(split.reshape(-1, split.shape[-1]).T)  # (M, S): each column's draws contiguous
    scores = scipy.special.ndtri((_average_ranks(pooled) - 0.375) / (pooled.shape[1] + 0.25))
    return scores.T.reshape(split.shape)


def _average_ranks(rows: np.ndarray) -> np.ndarray:
    """1-based ranks along each row, ties sharing their average rank (``scipy.stats.rankdata``'s
    "average", which runs several times slower over many rows)."""
    n = rows.shape[-1]
    order = np.argsort(rows, axis=-1)
    ordered = np.take_along_axis(rows, order, axis=-1)
    starts = np.ones(ordered.shape, dtype=bool)
    starts[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    if starts.all():  # no ties (continuous draws): the ranks are the positions
        average = np.broadcast_to(np.arange(1.0, n + 1.0), ordered.shape)
    else:
        position = np.arange(n)
        ends = np.ones(ordered.shape, dtype=bool)
        ends[:, :-1] = starts[:, 1:]
        first = np.maximum.accumulate(np.where(starts, position, 0), axis=-1)
        last = np.minimum.accumulate(np.where(ends, position, n - 1)[:, ::-1], axis=-1)[:, ::-1]
        average = (first + last) / 2.0 + 1.0
    ranks = np.empty(ordered.shape)
    np.put_along_axis(ranks, order, average, axis=-1)
    return ranks


def _split_rhat(split: np.ndarray) -> np.ndarray:
    """Classic R-hat of (chain, draw, M) per column: between- against within-chain variance."""
    draws = split.shape[1]
    between = draws * np.var(split.mean(axis=1), axis=0, ddof=1)
    within = np.mean(np.var(split, axis=1, ddof=1), axis=0)
    return np.sqrt((between / within + draws - 1) / draws)


TAIL_PROBABILITIES = (0.05, 0.95)  # tail ESS: the smaller ESS of the indicators of these two quantiles


def ess(array: np.ndarray, method: str) -> np.ndarray:
    """Bulk, tail or mean effective sample size per component of (chain, draw, ...), as
    ``az.ess(method=...)`` computes it (Vehtari et al. 2021), vectorised over the components.

    ArviZ estimates each component in a Python loop, at about 4 ms a component for 4 × 1000 draws;
    the diagnostics of the main job's samplers spent 48 s there (201 weights and the function-space
    outputs of four samplers, again after every extension round). Here every component goes
    through one FFT and one array pass; a test pins agreement with ArviZ to rounding.

    * ``"bulk"``: the ESS of the split chains' rank-normalised draws (normal scores of their
      pooled ranks);
    * ``"tail"``: the smaller of the ESS of the indicators I(x ≤ q) for the 5% and 95% quantiles q
      of the pooled draws (R's type-7 quantile, as ArviZ's);
    * ``"mean"``: the ESS of the split chains' draws themselves (PSIS-LOO's relative efficiency).

    A component with a NaN, or an array of fewer than 4 draws, gives NaN, as in ArviZ.
    """
    array = np.asarray(array, dtype=float)
    if method not in ("bulk", "tail", "mean"):
        raise ValueError(f"ess: method must be 'bulk', 'tail' or 'mean', got {method!r}")
    chains, draws = array.shape[:2]
    shape = array.shape[2:]
    if draws < 4 or chains < 1:
        return np.full(shape, np.nan)
    columns = array.reshape(chains, draws, -1)
    half = draws // 2
    split = np.concatenate([columns[:, :half], columns[:, draws - half :]], axis=0)  # (2C, half, M)
    with _quiet():
        if method == "bulk":
            value = _geyer_ess(_z_scale(split))
        elif method == "mean":
            value = _geyer_ess(split)
        else:
            pooled = columns.reshape(-1, columns.shape[-1])
            value = np.minimum(*(_geyer_ess((split <= np.quantile(pooled, p, axis=0)).astype(float))
                                 for p in TAIL_PROBABILITIES))
    value[np.isnan(columns).any(axis=(0, 1))] = np.nan
    return value.reshape(shape)


def _geyer_ess(split: np.ndarray) -> np.ndarray:
    """ESS of (chain, draw, M) per column: the chains' combined autocorrelations (Vehtari et al.
    2021, eq. 10), summed in pairs up to the first pair whose sum is not positive (Geyer's initial
    positive sequence) after the pair sums are made non-increasing (his initial monotone sequence).
    A column that is constant to float resolution has ESS = its number of draws."""
    chains, n, columns = split.shape
    size = chains * n
    centred = split - split.mean(axis=1, keepdims=True)
    length = scipy.fft.next_fast_len(2 * n)
    spectrum = np.fft.rfft(centred, n=length, axis=1)
    autocov = np.fft.irfft(spectrum * np.conjugate(spectrum), n=length, axis=1)[:, :n] / n  # (C, n, M)
    mean_var = autocov[:, 0].mean(axis=0) * n / (n - 1.0)
    var_plus = mean_var * (n - 1.0) / n
    if chains > 1:
        var_plus = var_plus + np.var(split.mean(axis=1), axis=0, ddof=1)
    rho = 1.0 - (mean_var - autocov.mean(axis=0)) / var_plus  # (n, M), rho[0] = 1 up to rounding
    rho[0] = 1.0
    # Pair j holds lags 2j and 2j + 1. Pair k ≥ 1 is looked at while lag 2k − 1 < n − 3 and every
    # pair before it had a positive sum; ``looked`` counts them (max_t = 2 looked − 1).
    bound = max(0, -(-(n - 2) // 2) - 1)  # the k ≥ 1 with 2k − 1 < n − 3
    sums = rho[0 : 2 * bound + 1 : 2] + rho[1 : 2 * bound + 2 : 2]  # pairs 0 .. bound, (bound + 1, M)
    stop = sums[:bound] <= 0.0
    looked = np.where(stop.any(axis=0), stop.argmax(axis=0), bound) if bound else np.zeros(columns, dtype=int)
    # Pairs 0 .. looked − 1 count in full, made non-increasing (Geyer's initial monotone sequence).
    monotone = np.minimum.accumulate(sums[:bound], axis=0) if bound else np.zeros((0, columns))
    total = np.sum(np.where(np.arange(bound)[:, None] < looked[None, :], monotone, 0.0), axis=0)
    # Then the even lag of the last pair looked at: kept when that pair's sum was not negative, or
    # when it is positive itself (lag 0, = 1, when no pair was looked at).
    cols = np.arange(columns)
    even = rho[2 * looked, cols]
    tail = np.where((looked == 0) | (sums[looked, cols] >= 0.0) | (even > 0.0), even, 0.0)
    tau = -1.0 + 2.0 * total + tail
    tau = np.maximum(tau, 1.0 / np.log10(size))
    value = size / tau
    constant = (split.max(axis=(0, 1)) - split.min(axis=(0, 1))) < np.finfo(float).resolution
    value = np.where(constant, float(size), value)
    return np.where(np.isnan(tau) & ~constant, np.nan, value)


def psis(log_ratios: np.ndarray, reff: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Pareto-smoothed log weights and k-hat. ``log_ratios`` (..., S): log target − log proposal.

    ArviZ's ``psislw`` takes the log importance *ratios* (it is called with −log-likelihood in
    LOO); ppl always passes log p − log q, never its negative.
    """
    log_ratios = np.asarray(log_ratios, dtype=float)
    rows = np.atleast_2d(log_ratios)
    smoothed = rows - np.logaddexp.reduce(rows, axis=-1, keepdims=True)
    bounded, sparse = _degenerate_tails(rows, reff)
    khat = np.where(bounded, -np.inf, np.inf)
    fit = ~(bounded | sparse)
    if fit.any():
        # The Pareto fit's profile likelihood overflows harmlessly for light (k < 0) tails.
        with np.errstate(over="ignore"):
            fitted, k = _az().psislw(rows[fit], reff=reff)
        smoothed[fit], khat[fit] = np.asarray(fitted), np.asarray(k)
    if log_ratios.ndim == 1:
        return smoothed[0], khat[0]
    return smoothed, khat


BOUNDED_LOG_RANGE = 0.1


def _degenerate_tails(rows: np.ndarray, reff: float) -> tuple[np.ndarray, np.ndarray]:
    """Rows where a Pareto fit to the right tail is meaningless, split by what they mean.

    ``bounded`` (k = -inf, no smoothing): all log ratios lie within ``BOUNDED_LOG_RANGE`` (weights
    within ~10% of each other, so their variance is at most (e^0.1 − 1)²/4 ≈ 0.003 and the true k
    is ≤ 0; the scale-free fit to exceedances spread over many decades, 1e-2 … 1e-14, reports a
    spurious k > 1), or the largest ratio equals the cutoff ratio to float precision (a flat top:
    a confident classifier gives p(y_i | θ) = 1 to the last bit under most draws).

    ``sparse`` (k = inf, as ArviZ reports for four or fewer tail draws): the tail that ArviZ selects
    has too few distinguishable exceedances to fit — one or a few draws dominate, or the cutoff
    underflows because the largest ratio beats the rest by more than ~708 nats. The estimate then
    rests on a handful of draws and is unreliable. ArviZ itself would divide by zero on some of
    these rows.
    """
    num_draws = rows.shape[-1]
    tail_size = int(np.ceil(min(0.2 * num_draws, 3.0 * np.sqrt(num_draws / reff))))
    shifted = np.sort(rows - rows.max(axis=-1, keepdims=True), axis=-1)  # max is 0
    raw_cutoff = shifted[:, -tail_size - 1]
    flat_top = raw_cutoff >= -1e-12
    bounded = (shifted[:, 0] >= -BOUNDED_LOG_RANGE) | flat_top
    cutoff = np.maximum(raw_cutoff, np.log(np.finfo(float).tiny))
    sparse = np.zeros(rows.shape[0], dtype=bool)
    for i in np.flatnonzero(~bounded):
        tail = shifted[i][shifted[i] > cutoff[i]]  # ArviZ's tail: strictly above the cutoff
        exceed = np.exp(tail) - np.exp(cutoff[i])
        sparse[i] = tail.size <= 4 or exceed[int(tail.size / 4 + 0.5) - 1] <= 0.0
    return bounded, sparse


def relative_efficiency(arrays) -> float:
    """Relative MCMC efficiency for PSIS-LOO as ``az.loo`` computes it: the mean "mean" ESS over every
    posterior component, divided by the number of draws. ``arrays``: (chain, draw, ...) per site."""
    values = np.concatenate([np.ravel(ess(a, "mean")) for a in arrays])
    chains, draws = np.shape(arrays[0])[:2]
    reff = float(np.nanmean(values) / (chains * draws))
    return reff if np.isfinite(reff) and reff > 0 else 1.0


def inference_data(*, posterior: dict, sample_stats: dict, log_likelihood: dict, posterior_predictive: dict,
                   observed_data: dict, dims: dict):
    """Build ``arviz.InferenceData`` from dicts of (chain, draw, ...) arrays."""
    return _az().from_dict(
        posterior=posterior,
        sample_stats=sample_stats or None,
        log_likelihood=log_likelihood or None,
        posterior_predictive=posterior_predictive or None,
        observed_data=observed_data or None,
        dims=dims,
    )


def plot_chains(draws: dict, path, *, kind: str):
    """A trace plot (``kind="trace"``: density and trace per series) or rank plot of scalar series
    (name -> (chain, draw)), saved as a PNG at ``path``; returns the path."""
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    data = _az().from_dict(posterior={name: np.asarray(value, dtype=float) for name, value in draws.items()})
    with _quiet():
        if kind == "trace":
            axes = _az().plot_trace(data, compact=False, figsize=(9, 1.7 * len(draws)))
        else:
            axes = _az().plot_rank(data, figsize=(3.2 * min(3, len(draws)), 2.6 * -(-len(draws) // 3)))
    figure = np.ravel(axes)[0].figure
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def compare_elpd(pointwise: dict) -> list[dict]:
    """Paired PSIS-LOO comparison of several methods by ``az.compare`` from ppl's own pointwise
    elpd values (name -> (N,), the same N observations for every method): one dict per method,
    best first, with ``elpd_loo``, ``se``, ``elpd_diff`` (from the best) and ``dse``, the standard
    error of that paired difference, √N · sd(elpd_best,i − elpd_m,i), smaller than the two SEs
    together because both methods score the same observations.

    ppl computes the pointwise values itself (for draws from an approximation q they carry the
    p/q correction, which ``az.loo`` would not apply), so ArviZ receives them as ``ELPDData``.
    """
    from arviz.stats.stats_utils import ELPDData
    import xarray as xr

    sizes = {name: np.shape(values) for name, values in pointwise.items()}
    if len(set(sizes.values())) != 1:
        raise ValueError(f"paired elpd differences need the same observations for every method; got shapes {sizes}")
    records = {}
    for name, values in pointwise.items():
        values = np.asarray(values, dtype=float)
        n = values.shape[0]
        records[name] = ELPDData(
            data=[float(values.sum()), float(np.sqrt(n * values.var())), np.nan, 0, n, False,
                  xr.DataArray(values, dims=["observation"]), xr.DataArray(np.zeros(n), dims=["observation"]),
                  "log", 0.7],
            index=["elpd_loo", "se", "p_loo", "n_samples", "n_data_points", "warning", "loo_i", "pareto_k", "scale",
                   "good_k"],
        )
    with _quiet():
        table = _az().compare(records, ic="loo", method="stacking", scale="log")
    return [
        {"method": str(name), "rank": int(row["rank"]), "elpd_loo": float(row["elpd_loo"]), "se": float(row["se"]),
         "elpd_diff": float(row["elpd_diff"]), "dse": float(row["dse"]), "weight": float(row["weight"])}
        for name, row in table.iterrows()
    ]
