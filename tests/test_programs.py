"""Plain NumPyro programs: flat (improper) priors, ``numpyro.deterministic`` sites in the draws and
the export, function-space R-hat from named function sites, and saving programs that cannot be
imported again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.distributions import constraints

from ppl.cli import main
from ppl.diagnostics import _arviz
from ppl.io import store
import ppl

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
from make_malicious_run import reseal  # noqa: E402


class LogDensityOnly(dist.Distribution):
    """A standard normal that can only be evaluated, never sampled (as a user's own density might be)."""

    support = constraints.real

    def __init__(self):
        super().__init__(batch_shape=(), event_shape=())

    def log_prob(self, value):
        return -0.5 * value**2


def _flat(support, batch=(), event=()):
    return lambda: numpyro.sample("x", dist.ImproperUniform(support, batch, event))


def _in_plate():
    with numpyro.plate("groups", 4):
        return numpyro.sample("x", dist.ImproperUniform(constraints.real, (), ()))


# (site's distribution, its shape, its unconstrained shape)
FLAT_SITES = {
    "real": (_flat(constraints.real), (), ()),
    "positive": (_flat(constraints.positive), (), ()),
    "interval": (_flat(constraints.interval(-1.0, 3.0)), (), ()),
    "event": (_flat(constraints.real_vector, event=(3,)), (3,), (3,)),
    "simplex": (_flat(constraints.simplex, event=(3,)), (3,), (2,)),
    "batch": (_flat(constraints.positive, batch=(2,)), (2,), (2,)),
    "plate": (_in_plate, (4,), (4,)),
    "to_event": (lambda: numpyro.sample("x", dist.ImproperUniform(constraints.real, (2,), ()).to_event(1)), (2,), (2,)),
    "no_sample": (lambda: numpyro.sample("x", LogDensityOnly()), (), ()),
}


def _program(site):
    def program(y):
        x = site()
        anchor = numpyro.sample("anchor", dist.Normal(100.0, 1.0))  # a proper prior beside it
        with numpyro.plate("data", y.shape[0]):
            numpyro.sample("y", dist.Normal(jnp.sum(x) + anchor, 1.0), obs=y)

    return program


@pytest.mark.parametrize("name", sorted(FLAT_SITES))
def test_flat_priors_are_discovered_without_sampling_and_start_uniform(name):
    site, shape, unconstrained = FLAT_SITES[name]
    problem = ppl.compile_problem(_program(site), {"y": np.array([100.5, 101.0, 99.0])})
    assert [(s.name, s.shape, s.unconstrained_shape) for s in problem.sites] == [
        ("x", shape, unconstrained), ("anchor", (), ()),
    ]
    size = int(np.prod(unconstrained))
    for strategy in ("prior", "median"):
        starts = np.stack([np.asarray(problem.init_position(jax.random.PRNGKey(k), strategy)) for k in range(3)])
        # The flat site starts uniform on (-2, 2) in unconstrained space; the proper one is drawn from
        # its prior N(100, 1), which a uniform start could never give.
        assert np.all(np.abs(starts[:, :size]) < 2.0), (strategy, starts)
        assert np.all(np.abs(starts[:, size] - 100.0) < 6.0), (strategy, starts)
        assert len({tuple(row) for row in starts}) == 3  # a start depends on its key
    assert np.all(np.isfinite(np.asarray(problem.logdensity_fn(problem.init_position(jax.random.PRNGKey(0), "uniform")))))


def test_each_data_kind_reads_its_own_data():
    # one strategy per kind of model: the model's call, a minibatch's N/B scale, rows, the saved names
    from ppl.core.problem import DATA_KINDS
    from ppl.models import VAE, LinearRegression

    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(40, 3)), rng.normal(size=40)

    def coin(flips):
        p = numpyro.sample("p", dist.Beta(1.0, 1.0))
        numpyro.sample("obs", dist.Bernoulli(p), obs=flips)

    problems = {
        "supervised": ppl.compile_problem(LinearRegression(), (X, y)),
        "unsupervised": ppl.compile_problem(VAE(latent_dim=2, hidden=(4,), likelihood="gaussian"), X),
        "program": ppl.compile_problem(coin, {"flips": np.ones(7)}),
    }
    assert set(DATA_KINDS) == set(problems)
    for name, problem in problems.items():
        kind = problem.data_kind
        assert kind is DATA_KINDS[name] and kind.name == problem.spec.kind == name
        saved = kind.named(problem.data)
        if name == "program":
            assert set(saved) == {"flips"} and problem.weights(problem.data)[1] == 1.0
            with pytest.raises(TypeError, match="needs a declarative model"):
                problem.batch(np.arange(3))
            continue
        rows = problem.batch(np.arange(10))
        assert np.shape(kind.inputs(rows))[0] == 10 and kind.batch_rows(rows) == 10
        assert float(problem.weights(rows)[1]) == 4.0  # 40 rows seen through 10
        assert set(saved) == ({"X", "y"} if name == "supervised" else {"X"})
        args, kwargs = kind.call(rows, problem.spec.static_kwargs)
        assert len(args) == (2 if name == "supervised" else 1) and not kwargs


def test_a_program_that_fails_on_its_data_is_still_reported():
    def broken(y):
        x = numpyro.sample("x", dist.ImproperUniform(constraints.real_vector, (), (3,)))
        with numpyro.plate("data", y.shape[0]):
            numpyro.sample("y", dist.Normal(x, 1.0), obs=y)  # (3,) against (5,): the program's own bug

    with pytest.raises(ppl.DataError, match="sampling nothing"):
        ppl.compile_problem(broken, {"y": np.zeros(5)})


def flat_regression(X, y=None):
    w = numpyro.sample("w", dist.ImproperUniform(constraints.real_vector, (), (X.shape[1],)))
    sigma = numpyro.sample("sigma", dist.ImproperUniform(constraints.positive, (), ()))
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Normal(X @ w, sigma), obs=y)


def test_map_under_flat_priors_is_least_squares():
    # Under flat priors the constrained-space MAP is the maximum-likelihood estimate, in closed form:
    # w = (XᵀX)⁻¹Xᵀy and σ² = RSS / N.
    rng = np.random.default_rng(3)
    X = np.column_stack([np.ones(40), rng.normal(size=40)])
    y = X @ np.array([0.5, -1.5]) + 0.4 * rng.normal(size=40)
    post = ppl.fit(flat_regression, {"X": X, "y": y}, method="map", seed=0)
    w, *_ = np.linalg.lstsq(X, y, rcond=None)
    sigma = np.sqrt(np.mean((y - X @ w) ** 2))
    np.testing.assert_allclose(post.draws["w"][0, 0], w, atol=1e-6)
    np.testing.assert_allclose(post.draws["sigma"][0, 0], sigma, atol=1e-6)


def coin(flips):
    # Flat prior on an interval: the posterior of p is Beta(k + 1, n − k + 1).
    p = numpyro.sample("p", dist.ImproperUniform(constraints.unit_interval, (), ()))
    numpyro.deterministic("odds", p / (1.0 - p))
    numpyro.deterministic("both", jnp.stack([p, 1.0 - p]))
    with numpyro.plate("data", flips.shape[0]):
        numpyro.sample("flips", dist.Bernoulli(probs=p), obs=flips)


FLIPS = np.array([1, 0, 1, 1, 0, 1, 1, 1, 0, 1, 1, 0, 1, 1, 1, 0, 1, 1, 0, 1], dtype=float)


@pytest.fixture(scope="module")
def coin_nuts():
    return ppl.fit(coin, {"flips": FLIPS}, method="nuts", seed=1, num_chains=2, num_warmup=300, num_samples=1000)


def test_deterministic_sites_are_in_the_draws_sample_and_export(coin_nuts):
    post = coin_nuts
    p = post.draws["p"]
    assert p.shape == (2, 1000) and post.draws["odds"].shape == (2, 1000) and post.draws["both"].shape == (2, 1000, 2)
    assert post.deterministic_sites == ("odds", "both") and set(post.latent_draws) == {"p"}
    np.testing.assert_allclose(post.draws["odds"], p / (1.0 - p), rtol=1e-12)
    np.testing.assert_allclose(post.draws["both"], np.stack([p, 1.0 - p], axis=-1), rtol=1e-12)
    # The flat prior over (0, 1) sampled from its uniform start: the mean of Beta(k+1, n-k+1) within 4 MCSE.
    k, n = FLIPS.sum(), FLIPS.size
    mcse = p.std() / np.sqrt(_arviz.ess(p, "bulk"))
    assert abs(p.mean() - (k + 1) / (n + 2)) < 4 * mcse

    fresh = post.sample(50, seed=2)
    assert fresh["both"].shape == (50, 2)
    np.testing.assert_allclose(fresh["odds"], fresh["p"] / (1.0 - fresh["p"]), rtol=1e-12)

    import arviz as az

    idata = post.to_arviz()
    assert idata.posterior["both"].shape == (2, 1000, 2)
    np.testing.assert_array_equal(idata.posterior["odds"].values, post.draws["odds"])
    # ppl's PSIS-LOO still equals ArviZ's on the export, deterministic sites included.
    loo = az.loo(idata)
    assert abs(loo.elpd_loo - post.diagnostics().elpd_loo) < 1e-6 * abs(loo.elpd_loo)
    # Weight-space R-hat and ESS are over the latent sites: p alone.
    diag = post.diagnostics()
    assert diag.ess_bulk_min == pytest.approx(_arviz.ess(p, "bulk").min())


def test_deterministic_sites_of_a_density_method_follow_fresh_draws():
    post = ppl.fit(coin, {"flips": FLIPS}, method="laplace", seed=0)
    np.testing.assert_allclose(post.draws["odds"], post.draws["p"] / (1.0 - post.draws["p"]), rtol=1e-12)
    fresh = post.sample(20, seed=3)
    np.testing.assert_allclose(fresh["both"][:, 1], 1.0 - fresh["p"], rtol=1e-12)
    # log q of draws given with their deterministic values: those are ignored, not refused.
    assert np.all(np.isfinite(post.log_prob(fresh)))


def test_integer_deterministic_sites_are_saved_and_loaded_as_integers(tmp_path):
    post = ppl.fit(counted, {"values": np.array([0.4, 1.2, 0.9])}, method="map", seed=0)
    assert post.draws["above"].dtype.kind in "iu" and post.draws["above"].shape == (1, 1)
    post.save(tmp_path / "r")
    loaded = ppl.load(tmp_path / "r")
    assert loaded.is_detached
    np.testing.assert_array_equal(loaded.draws["above"], post.draws["above"])
    assert loaded.draws["above"].dtype == post.draws["above"].dtype


def counted(values):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    numpyro.deterministic("above", jnp.sum(values > mu).astype(jnp.int32))
    with numpyro.plate("data", values.shape[0]):
        numpyro.sample("obs", dist.Normal(mu, 1.0), obs=values)


# -- function-space R-hat ------------------------------------------------------------------------
def signed(x, y=None):
    """y = w² x: w and −w give the same function, as a hidden unit's sign flip does in a network."""
    w = numpyro.sample("w", dist.Normal(0.0, 3.0))
    f = numpyro.deterministic("f", w**2 * x)
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.Normal(f, 0.3), obs=y)


def _signed_data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=50)
    return {"x": x, "y": 4.0 * x + 0.3 * rng.normal(size=50)}


# time_budget=0: without function sites the weight-space R-hat fails, and the run must not extend
# (the comparison needs the same draws with and without them)
SIGNED_FIT = dict(method="nuts", seed=0, num_chains=4, num_warmup=300, num_samples=1000, time_budget=0)


@pytest.fixture(scope="module")
def signed_runs():
    with_sites = ppl.fit(signed, _signed_data(), function_sites=("f",), **SIGNED_FIT)
    without = ppl.fit(signed, _signed_data(), **SIGNED_FIT)
    return with_sites, without


def test_function_sites_judge_a_symmetric_program_in_function_space(signed_runs):
    with_sites, without = signed_runs
    # The same draws: function sites change the diagnostics, never the run. Chains 0 and 1 settled at
    # w ≈ −2, chains 2 and 3 at w ≈ +2 (their uniform starts had those signs), and no chain crosses.
    np.testing.assert_array_equal(with_sites.draws["w"], without.draws["w"])
    assert np.all(np.sign(with_sites.draws["w"].mean(axis=1)) == [-1, -1, 1, 1])
    blind, seeing = without.diagnostics(), with_sites.diagnostics()
    assert blind.rhat_max > 1.5 and not blind.ok
    assert blind.rhat_function_max is None
    note = blind.notes["rhat_function_max"]
    assert "weight space only" in note and "sign" in note and "function_sites=('f',)" in note
    assert seeing.rhat_max == blind.rhat_max and "reported only" in seeing.notes["rhat_max"]
    assert seeing.rhat_function_max is not None and seeing.rhat_function_max <= 1.01
    assert seeing.ok, seeing.warnings
    assert {c.field for c in seeing.checks} >= {"rhat_function_max", "function_ess_bulk_min", "function_ess_tail_min"}
    assert "rhat_max" not in {c.field for c in seeing.checks}
    np.testing.assert_array_equal(with_sites.function_draws(), with_sites.draws["f"])


def test_function_sites_must_name_deterministic_sites():
    data = _signed_data()
    with pytest.raises(ppl.OptionError, match="'w' is a latent sample site"):
        ppl.compile_problem(signed, data, function_sites=("w",))
    with pytest.raises(ppl.OptionError, match="'g' is not a site of the program.*\\['f'\\]"):
        ppl.compile_problem(signed, data, function_sites=("g",))
    with pytest.raises(ppl.OptionError, match="tuple of numpyro.deterministic site names"):
        ppl.compile_problem(signed, data, function_sites=(1,))
    with pytest.raises(ppl.OptionError, match="twice"):
        ppl.compile_problem(signed, data, function_sites=("f", "f"))
    assert ppl.compile_problem(signed, data, function_sites="f").function_sites == ("f",)
    from ppl.models import LinearRegression

    with pytest.raises(ppl.OptionError, match="drop function_sites"):
        ppl.fit(LinearRegression(), (np.zeros((4, 1)), np.zeros(4)), method="exact", seed=0, function_sites=("f",))


def test_function_sites_are_saved_and_give_the_same_diagnostics_on_reload(signed_runs, tmp_path):
    post = signed_runs[0]
    post.save(tmp_path / "run")  # signed is importable by name (module level): no warning
    saved = post.diagnostics().to_dict()
    detached = ppl.load(tmp_path / "run")
    assert detached.function_sites == ("f",) and detached.draws["f"].shape == (4, 1000, 50)
    assert detached.diagnostics().to_dict() == saved
    attached = ppl.load(tmp_path / "run", model=signed)
    assert attached.function_sites == ("f",)
    attached._cache.clear()  # recomputed from the reloaded draws, not read back
    recomputed = attached.diagnostics().to_dict()
    for field in ("rhat_max", "rhat_function_max", "ess_bulk_min", "ess_tail_min", "ok", "elpd_loo"):
        assert recomputed[field] == pytest.approx(saved[field], rel=1e-12), field

    meta_path = tmp_path / "run" / "posterior.json"
    meta = json.loads(meta_path.read_text())
    for edited, match in ((["w"], "function_sites"), (["f", "f"], "function_sites"), ("f", "function_sites")):
        meta["function_sites"] = edited
        meta_path.write_text(json.dumps(meta))
        reseal(tmp_path / "run")
        with pytest.raises(ppl.RunError, match=match):
            ppl.load(tmp_path / "run")
    del meta["function_sites"]
    meta_path.write_text(json.dumps(meta))
    reseal(tmp_path / "run")
    with pytest.raises(ppl.RunError, match="'function_sites' is missing"):
        ppl.load(tmp_path / "run")


def test_reattaching_a_program_with_other_deterministic_sites_is_refused(coin_nuts, tmp_path):
    coin_nuts.save(tmp_path / "coin")
    np.testing.assert_array_equal(ppl.load(tmp_path / "coin").draws["both"], coin_nuts.draws["both"])

    def coin_without_odds(flips):
        p = numpyro.sample("p", dist.ImproperUniform(constraints.unit_interval, (), ()))
        with numpyro.plate("data", flips.shape[0]):
            numpyro.sample("flips", dist.Bernoulli(probs=p), obs=flips)

    with pytest.raises(ppl.RunError, match="deterministic sites"):
        ppl.load(tmp_path / "coin", model=coin_without_odds)


# -- saving a program that cannot be imported again ------------------------------------------------
def test_saving_a_local_program_warns_that_load_needs_it(tmp_path):
    def local_mean(values):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        with numpyro.plate("data", values.shape[0]):
            numpyro.sample("obs", dist.Normal(mu, 1.0), obs=values)

    post = ppl.fit(local_mean, {"values": np.arange(3.0)}, method="map", seed=0)
    with pytest.warns(UserWarning, match=r"defined inside a function.*ppl\.load\(.*model=local_mean\)"):
        post.save(tmp_path / "r")
    assert ppl.load(tmp_path / "r").is_detached  # saved all the same
    assert store.not_importable(coin) is None
    assert "lambda" in store.not_importable(lambda values: None)


SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np, numpyro, numpyro.distributions as dist
    import ppl
    from ppl.io import store
    def program(values):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        numpyro.deterministic("twice", 2.0 * mu)
        with numpyro.plate("data", values.shape[0]):
            numpyro.sample("obs", dist.Normal(mu, 1.0), obs=values)

    post = ppl.fit(program, {"values": np.arange(5.0)}, method="laplace", seed=0)
    post.save(sys.argv[1])
    store.save_posterior(post, sys.argv[2], with_diagnostics=False)  # as a save cut short by Ctrl-C leaves it
    """
)


def _ppl_command() -> list:
    script = Path(sys.executable).with_name("ppl")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "ppl.cli"]


@pytest.mark.slow  # out of the default run to keep it near 15 minutes; CI runs it in the slow step
def test_a_program_from_main_warns_on_save_and_shows_from_its_files(tmp_path, capsys):
    (tmp_path / "fit.py").write_text(SCRIPT)
    run, bare = tmp_path / "run", tmp_path / "bare"
    env = {**os.environ, "PYTHONWARNINGS": "default"}
    fitted = subprocess.run([sys.executable, str(tmp_path / "fit.py"), str(run), str(bare)], capture_output=True,
                            text=True, env=env, cwd=tmp_path)
    assert fitted.returncode == 0, fitted.stderr
    assert "UserWarning" in fitted.stderr and "defined in __main__" in fitted.stderr
    assert "model=program" in fitted.stderr

    shown = subprocess.run([*_ppl_command(), "show", str(run)], capture_output=True, text=True, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "program __main__.program" in shown.stdout and "deterministic sites: twice()" in shown.stdout
    assert "Diagnostics — laplace" in shown.stdout and "khat" in shown.stdout

    # Without saved diagnostics, showing them would need the program: exit 2, saying how to get them.
    assert main(["show", str(bare)]) == 2
    assert "model=<the program>" in capsys.readouterr().err
    assert main(["fit", "--resume", str(run)]) == 2
    assert "resume it in Python" in capsys.readouterr().err
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ppl.load(run).draws["twice"].shape == (1, 1000)


def test_showing_a_program_checkpoint_says_to_resume_in_python(tmp_path, capsys):
    ppl.fit(counted, {"values": np.array([0.4, 1.2, 0.9])}, method="map", seed=0, optimizer="adam", steps=100,
            checkpoint=tmp_path / "ck", checkpoint_every=50)
    assert main(["show", str(tmp_path / "ck")]) == 2
    captured = capsys.readouterr()
    assert "continue in Python" in captured.out and "ppl fit --resume" not in captured.out
    assert "model=<the program>" in captured.err
