"""NUTS through ``ppl.fit`` against posteriordb's gold-standard reference posteriors.

Nine posteriors (``tests/reference/programs.py`` has the models and the reasons for each sampler
setting). For every reference parameter (Stan name, 10 × 1000 reference draws) the test asserts

* posteriordb's rule: |Δmean| / ref_sd < 0.25;
* |Δmean| ≤ 4 MCSE, with MCSE = sqrt(sd²/ESS + ref_sd²/ref_ESS) the standard error of the
  difference of two independent Monte Carlo means (ESS for the mean, ArviZ, of our 4 × 1000 draws
  and of the reference's 10 × 1000). Why 4: under a correct sampler |Δ|/MCSE is roughly a standard
  normal, and the suite checks 79 parameters; P(max |z| > 4) ≈ 79 · 6.3e-5 ≈ 0.5% per seed,
  whereas a 3-MCSE bound would fail about one seed in five (79 · 0.0027) and ESS estimates are
  themselves uncertain by 10–20%. At our ESS (≥ 600 here) 4 MCSE is ≤ 0.17 ref_sd, so this is
  the tighter of the two checks — the one that catches a small bias the 0.25-sd rule would pass;
* sd ratio within 10%: |sd / ref_sd − 1| ≤ 0.10;
* R-hat ≤ 1.01 and no divergent transitions (no case is expected to diverge; a case that is would
  set ``expect_divergences`` and document why).

Fixed seed (0), float64 (conftest). Margins, measured over seeds 0–3 on all nine posteriors:
|Δmean|/ref_sd ≤ 0.09, |Δmean| ≤ 2.9 MCSE, sd ratios 0.95–1.06, R-hat ≤ 1.009, no divergences.
The data lives outside the repository (``../shared/data`` or ``$PPL_SHARED_DATA``); without it
every test here skips with the reason. ``sblri-blr`` (5–9 s) runs by default; the other eight are
``@pytest.mark.slow`` (``pytest -m slow``: 80–130 s on two shared cores).
"""

from __future__ import annotations

import jax
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

from numpyro.distributions import constraints

from ppl.core.problem import trace_model
import ppl
from reference import posteriordb, programs

MEAN_SD_TOL = 0.25  # posteriordb: |Δmean| / ref_sd
MCSE_MULTIPLE = 4.0  # |Δmean| ≤ 4 MCSE of the difference (see the module docstring)
SD_RATIO_TOL = 0.10  # |sd / ref_sd − 1|
RHAT_MAX = 1.01
SEED = 0


def _skip_without(posterior: str | None = None) -> None:
    reason = posteriordb.missing_reason(posterior)
    if reason is not None:
        pytest.skip(reason)


def _cases():
    for name, case in programs.CASES.items():
        yield pytest.param(name, id=name, marks=[pytest.mark.slow] if case.slow else [])


def test_parse_stan_name():
    assert posteriordb.parse_stan_name("sigma") == ("sigma", ())
    assert posteriordb.parse_stan_name("beta[1]") == ("beta", (0,))
    assert posteriordb.parse_stan_name("b[2,10]") == ("b", (1, 9))
    with pytest.raises(ValueError):
        posteriordb.parse_stan_name("beta[1")
    draws = {"beta": np.arange(24.0).reshape(2, 3, 4), "sigma": np.ones((2, 3))}
    picked = posteriordb.select(draws, ["beta[4]", "sigma"])
    np.testing.assert_array_equal(picked["beta[4]"], draws["beta"][:, :, 3])
    with pytest.raises(KeyError, match="needs site 'tau'"):
        posteriordb.select(draws, ["tau"])


@pytest.mark.parametrize("posterior", list(programs.CASES))
def test_programs_match_posteriordb_metadata(posterior):
    """Cheap, runs by default: each program traces on its data, and its sites (plus the derived
    quantities) cover exactly the reference's parameters, with posteriordb's dimensions."""
    _skip_without(posterior)
    case = programs.CASES[posterior]
    meta = posteriordb.load_metadata(posterior)
    reference = posteriordb.load_reference(posterior)
    assert {name: len(values) for name, values in reference.items()} == dict.fromkeys(reference, 10)
    assert {values.shape for values in reference.values()} == {(10, 1000)}
    data = case.data()

    def latent_values():
        tr = trace_model(case.model, 0, (), data)  # as ppl runs it: flat priors get a start value
        return {n: s["value"] for n, s in tr.items() if s["type"] == "sample" and not s["is_observed"]}

    # Shapes only (abstract evaluation): tracing the program eagerly costs seconds on big data.
    shapes = jax.eval_shape(latent_values)
    draws = {name: np.zeros((1, 1, *value.shape)) for name, value in shapes.items()}
    stan = case.stan_draws(draws, reference)  # raises on an unknown site or a wrong rank
    assert set(stan) == set(reference)
    sizes: dict[str, int] = {}
    for name in reference:
        site, _ = posteriordb.parse_stan_name(name)
        sizes[site] = sizes.get(site, 0) + 1
    assert sizes == meta["dimensions"]
    derived = case.derive(draws) if case.derive else draws
    for site, size in sizes.items():
        assert int(np.prod(derived[site].shape[2:], dtype=int)) == size, site


@pytest.mark.parametrize("posterior", list(_cases()))
def test_nuts_matches_reference_posterior(posterior):
    _skip_without(posterior)
    case = programs.CASES[posterior]
    reference = posteriordb.load_reference(posterior)
    post = ppl.fit(case.model, case.data(), method="nuts", seed=SEED, **case.nuts)
    diagnostics = post.diagnostics()
    rows = posteriordb.compare(case.stan_draws(post.draws, reference), reference)
    report = "\n".join(str(row) for row in rows)

    assert diagnostics.rhat_max <= RHAT_MAX, f"R-hat {diagnostics.rhat_max:.4f}\n{report}"
    if not case.expect_divergences:
        assert diagnostics.divergences == 0, f"{diagnostics.divergences} divergences\n{report}"
    failures = [
        f"{row.name}: {why}"
        for row in rows
        for why, bad in (
            (f"|Δmean|/ref_sd = {row.z_sd:.3f} ≥ {MEAN_SD_TOL}", not row.z_sd < MEAN_SD_TOL),
            (f"|Δmean| = {row.z_mcse:.2f} MCSE > {MCSE_MULTIPLE}", not row.z_mcse <= MCSE_MULTIPLE),
            (f"sd ratio {row.sd_ratio:.3f} off by more than {SD_RATIO_TOL:.0%}", not abs(row.sd_ratio - 1.0) <= SD_RATIO_TOL),
        )
        if bad
    ]
    assert not failures, "\n".join(failures) + "\n" + report


def test_plain_improper_uniform_program():
    def model(y):
        mu = numpyro.sample("mu", dist.ImproperUniform(constraints.real, (), ()))
        sigma = numpyro.sample("sigma", dist.ImproperUniform(constraints.positive, (), ()))
        with numpyro.plate("data", y.shape[0]):
            numpyro.sample("y", dist.Normal(mu, sigma), obs=y)

    y = np.array([0.3, -1.2, 0.8, 2.1, -0.4, 0.9, 1.5, -0.7])
    post = ppl.fit(model, {"y": y}, method="nuts", seed=SEED, num_chains=2, num_warmup=300, num_samples=500)
    diag = post.diagnostics()
    assert diag.divergences == 0
    # Flat priors: the posterior of mu is centred at the sample mean; allow five Monte Carlo errors.
    mu = post.draws["mu"]
    mcse = mu.std() / np.sqrt(diag.ess_bulk_min)
    assert abs(mu.mean() - y.mean()) < 5 * mcse, (mu.mean(), y.mean(), mcse)


SVI_CASES = ("sblri-blr", "sblrc-blr", "kilpisjarvi_mod-kilpisjarvi", "earnings-logearn_interaction",
             "mesquite-logmesquite")
SVI_SD_RATIO_TOL = 0.15  # variational inference under-disperses a little on skewed scales (sigma)


@pytest.mark.parametrize(
    "posterior", [pytest.param(name, id=name, marks=[] if name == "sblri-blr" else [pytest.mark.slow]) for name in SVI_CASES]
)
def test_default_full_rank_svi_matches_reference_posterior(posterior):
    """SVI with every option at its default except ``guide="full_rank"``, as a user would try it on a
    posterior with N(0, 10²) or flat priors, badly scaled and correlated inputs: it must land on the
    reference (|Δmean|/ref_sd < 0.25, sd within 15%) and say so itself (``ok``, ``converged``)."""
    _skip_without(posterior)
    case = programs.CASES[posterior]
    reference = posteriordb.load_reference(posterior)
    post = ppl.fit(case.model, case.data(), method="svi", seed=SEED, guide="full_rank", num_draws=4000)
    diagnostics = post.diagnostics()
    rows = posteriordb.compare(case.stan_draws(post.draws, reference), reference)
    report = "\n".join(str(row) for row in rows)
    assert post.status.converged, post.status.convergence
    assert diagnostics.ok, f"{diagnostics.warnings}\n{report}"
    for row in rows:
        assert row.z_sd < MEAN_SD_TOL, f"{row.name}: |Δmean|/ref_sd = {row.z_sd:.3f}\n{report}"
        assert abs(row.sd_ratio - 1.0) <= SVI_SD_RATIO_TOL, f"{row.name}: sd ratio {row.sd_ratio:.3f}\n{report}"


# The verdict against quality: a run is good when every mean is within half a reference sd and every sd
# within [0.8, 1.25] of the reference's; ok must say the same. These three runs said ok=True on bad answers:
# mean-field SVI's sds 0.005×, 0.22× and 0.47× the reference (k-hat 0.29–0.65 could not see it), and Laplace's
# sigma on mesquite 0.82 sd off (k-hat 0.47). The curvature at q's mean (dispersion_min) and PSIS-corrected
# moments (psis_mean_shift, psis_sd_ratio) now fail them.
GOOD_MEAN, GOOD_SD = 0.5, (0.8, 1.25)
SILENT_CASES = [
    ("kilpisjarvi_mod-kilpisjarvi", "svi", {"guide": "mean_field"}, "dispersion_min"),
    ("mesquite-logmesquite", "svi", {"guide": "mean_field"}, "dispersion_min"),
    ("sblrc-blr", "svi", {"guide": "mean_field"}, "dispersion_min"),
    ("mesquite-logmesquite", "laplace", {}, "psis_mean_shift"),
]


@pytest.mark.slow
@pytest.mark.parametrize("posterior, method, options, check", SILENT_CASES,
                         ids=[f"{p}-{m}{'-' + o['guide'] if o else ''}" for p, m, o, _ in SILENT_CASES])
def test_the_verdict_fails_answers_far_from_the_reference(posterior, method, options, check):
    _skip_without(posterior)
    case = programs.CASES[posterior]
    reference = posteriordb.load_reference(posterior)
    post = ppl.fit(case.model, case.data(), method=method, seed=SEED, **options)
    rows = posteriordb.compare(case.stan_draws(post.draws, reference), reference)
    good = all(row.z_sd <= GOOD_MEAN and GOOD_SD[0] <= row.sd_ratio <= GOOD_SD[1] for row in rows)
    diagnostics = post.diagnostics()
    assert not good, "\n".join(str(row) for row in rows)
    assert not diagnostics.ok and check in [c.field for c in diagnostics.failed], diagnostics.warnings


@pytest.mark.slow
@pytest.mark.parametrize("posterior", ["kilpisjarvi_mod-kilpisjarvi", "sblrc-blr", "sblri-blr", "earnings-logearn_interaction"])
def test_svi_at_its_defaults_is_good_and_says_so(posterior):
    # guide="auto" is full-rank on these small models: the answer is good and the verdict agrees.
    _skip_without(posterior)
    case = programs.CASES[posterior]
    reference = posteriordb.load_reference(posterior)
    post = ppl.fit(case.model, case.data(), method="svi", seed=SEED)
    rows = posteriordb.compare(case.stan_draws(post.draws, reference), reference)
    report = "\n".join(str(row) for row in rows)
    assert post.info.get("guide", "full_rank") == "full_rank"
    assert all(row.z_sd <= GOOD_MEAN and GOOD_SD[0] <= row.sd_ratio <= GOOD_SD[1] for row in rows), report
    assert post.diagnostics().ok, f"{post.diagnostics().warnings}\n{report}"
