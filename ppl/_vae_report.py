"""``ppl.vae_report``: how good is a fitted VAE, and how good is its encoder?

All per-datum numbers are averages over the rows of the X passed in (use held-out data for
generalisation). With q(z | x) the encoder and K draws z_k ∼ q(z | x) per datum:

* ``log_px`` — log (1/K) Σ_k p(x, z_k) / q(z_k | x) with K = ``num_samples`` (500): the
  importance-sampled log marginal likelihood (Burda et al. 2016);
* ``elbo`` — E_q[log p(x, z) − log q(z | x)]; ``iwae`` — the same log-mean-exp with K = 100;
* ``khat_median``, ``khat_frac_above_0_7`` — PSIS k-hat of each datum's weights p(x, z)/q(z | x):
  above 0.7 the encoder misses that datum's posterior tails and ``log_px`` is unreliable there;
* ``active_units`` — latents whose encoder mean varies across data with variance > 0.01
  (Burda et al.'s activity statistic);
* ``rate`` — mean KL(q(z | x) ‖ p(z)) (closed form); ``distortion`` — −E_q log p(x | z) = −elbo − rate;
* the amortisation gap on ``gap_points`` rows (Cremer et al. 2018): the best per-datum Gaussian
  q*(z | x), fitted by ``svi`` (full rank) on the local model with the decoder fixed, against the
  encoder — ``amortization_gap`` = ELBO(q*) − ELBO(encoder), nats per datum — and the encoder's
  means against the exact local posterior from ``nuts`` (``encoder_mean_error``: mean |Δ| / posterior
  sd; ``encoder_sd_ratio``: mean encoder sd / posterior sd).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import jax
import numpy as np
from scipy.special import logsumexp

from ppl._fit import fit
from ppl.core import vae
from ppl.core.keys import as_key
from ppl.diagnostics import _arviz

__all__ = ["vae_report", "VAEReport"]

IWAE_K = 100
KHAT_LIMIT = 0.7
ACTIVE_VARIANCE = 0.01


@dataclass
class VAEReport:
    num_data: int
    num_samples: int
    log_px: float
    elbo: float
    iwae: float
    khat_median: float
    khat_frac_above_0_7: float
    active_units: int
    latent_dim: int
    rate: float
    distortion: float
    gap_points: int
    amortization_gap: float | None
    encoder_mean_error: float | None
    encoder_sd_ratio: float | None

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def __str__(self) -> str:
        rows = [f"VAE report — {self.num_data} data points, K = {self.num_samples} importance samples (nats per datum)"]
        for f in fields(self):
            value = getattr(self, f.name)
            shown = "—  (gap_points=0)" if value is None else (f"{value:.4g}" if isinstance(value, float) else str(value))
            rows.append(f"  {f.name:<22} {shown}")
        return "\n".join(rows)


def vae_report(post, X, *, seed, num_samples: int = 500, gap_points: int = 20) -> VAEReport:
    """Quality of a fitted VAE on data ``X`` (see the module docstring)."""
    if isinstance(gap_points, bool) or not isinstance(gap_points, (int, np.integer)) or gap_points < 0:
        raise ValueError(f"gap_points must be a non-negative integer, got {gap_points!r}")
    if num_samples < IWAE_K:
        raise ValueError(f"num_samples must be at least {IWAE_K} (the IWAE estimate uses {IWAE_K}), got {num_samples}")
    key = as_key(seed)
    weight_key, gap_key, fit_key = jax.random.split(key, 3)
    X = np.asarray(X)
    log_w, _, _ = vae.importance_weights(post, X, num_samples, weight_key)
    per_elbo = log_w.mean(axis=0)
    log_px = logsumexp(log_w, axis=0) - np.log(num_samples)
    iwae = logsumexp(log_w[:IWAE_K], axis=0) - np.log(IWAE_K)
    _, khats = _arviz.psis(log_w.T)  # one Pareto fit per datum, vectorised over data
    loc, scale = post.encode(X)
    kl = 0.5 * np.sum(np.square(loc) + np.square(scale) - 1.0 - 2.0 * np.log(scale), axis=1)
    rate = float(kl.mean())
    gap = mean_error = sd_ratio = None
    rows = min(int(gap_points), X.shape[0])
    if rows:
        chosen = np.sort(np.asarray(jax.random.permutation(gap_key, X.shape[0]))[:rows])
        local = post.local_model(X[chosen])
        svi_key, nuts_key = jax.random.split(fit_key)
        best = fit(local, method="svi", seed=svi_key, guide="full_rank")
        gap = float((best.diagnostics().elbo - per_elbo[chosen].sum()) / rows)
        exact = fit(local, method="nuts", seed=nuts_key, num_chains=2, num_warmup=500, num_samples=500)
        z = exact.draws["z"].reshape(-1, rows, loc.shape[1])
        mean_error = float(np.mean(np.abs(loc[chosen] - z.mean(axis=0)) / z.std(axis=0)))
        sd_ratio = float(np.mean(scale[chosen] / z.std(axis=0)))
    return VAEReport(
        num_data=int(X.shape[0]),
        num_samples=int(num_samples),
        log_px=float(log_px.mean()),
        elbo=float(per_elbo.mean()),
        iwae=float(iwae.mean()),
        khat_median=float(np.median(khats)),
        khat_frac_above_0_7=float(np.mean(khats > KHAT_LIMIT)),
        active_units=int(np.sum(np.var(loc, axis=0) > ACTIVE_VARIANCE)),
        latent_dim=int(loc.shape[1]),
        rate=rate,
        distortion=float(-per_elbo.mean() - rate),
        gap_points=rows,
        amortization_gap=gap,
        encoder_mean_error=mean_error,
        encoder_sd_ratio=sd_ratio,
    )
