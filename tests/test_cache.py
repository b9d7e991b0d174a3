"""The persistent compilation cache: a second process loads what the first compiled, the cache can be
moved or turned off, an unsafe folder is refused, and a cache the user configured is left alone."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from ppl.core.cache import CACHE_ENV
import ppl

# Each run is a new process, as a user's second `ppl fit` is; it prints its compile-cache events.
FIT = """
import sys, jax
jax.config.update("jax_enable_x64", True)
from ppl.models import LinearRegression
import ppl
events = {}
jax.monitoring.register_event_listener(lambda name, **_: events.__setitem__(name, events.get(name, 0) + 1))
print("folder", ppl.use_compilation_cache())
data = ppl.datasets.load("linear", seed=0)
ppl.fit(LinearRegression(noise_scale=0.5), data.train, method="map", seed=0).diagnostics()
print("hits", events.get("/jax/compilation_cache/cache_hits", 0))
print("misses", events.get("/jax/compilation_cache/cache_misses", 0))
"""


def _run(script, env, *args):
    env = {k: v for k, v in env.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    out = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)


def test_a_second_process_loads_every_program_from_the_cache(tmp_path):
    folder = tmp_path / "cache"
    env = {**os.environ, CACHE_ENV: str(folder)}
    first = _run(FIT, env)
    assert first["folder"] == str(folder)
    assert int(first["misses"]) > 0 and any(folder.iterdir())
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700  # created private: what it holds runs as code
    second = _run(FIT, env)
    assert int(second["misses"]) == 0, "the second process compiled programs the first had stored"
    assert int(second["hits"]) >= int(first["misses"])


CHOICES = """
import os, sys, ppl
print("off", ppl.use_compilation_cache())
try:
    ppl.use_compilation_cache(sys.argv[1])
except ppl.OptionError as error:
    print("refused", error)
"""


def test_off_turns_the_cache_off_and_a_shared_folder_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    out = _run(CHOICES, {**os.environ, CACHE_ENV: "off"}, str(shared))
    assert out["off"] == "None"
    assert "not private to you" in out["refused"] and "chmod go-w" in out["refused"]
    assert CACHE_ENV + "=off" in out["refused"]


def test_the_command_line_keeps_nothing_with_no_cache(tmp_path):
    folder = tmp_path / "cache"
    script = "import sys; from ppl.cli import main; sys.exit(main(sys.argv[1:]))"
    env = {**os.environ, CACHE_ENV: str(folder)}
    args = ["fit", "--model", "linear", "--data", "linear", "--method", "map", "--no-progress",
            "--out", str(tmp_path / "run"), "--no-cache"]
    _run(script, env, *args)
    assert not folder.exists()
    _run(script, env, *args[:-1], "--force")
    assert any(folder.iterdir())


def test_a_cache_the_user_configured_is_left_alone(tmp_path):
    configured = jax.config.jax_compilation_cache_dir  # this suite's own, set in conftest
    assert configured
    assert ppl.use_compilation_cache(tmp_path / "elsewhere") == Path(configured)
    assert jax.config.jax_compilation_cache_dir == configured and not (tmp_path / "elsewhere").exists()


@pytest.mark.parametrize("bad", [0, 10, 1.5e9, True, "1G"])
def test_a_bad_size_bound_is_refused(bad):
    with pytest.raises(ppl.OptionError, match="max_bytes must be a whole number of bytes"):
        ppl.use_compilation_cache(max_bytes=bad)


def test_releasing_the_compiled_programs_drops_them_and_later_calls_compile_again():
    from ppl.core.cache import release_compiled

    double = jax.jit(lambda x: 2.0 * x)
    assert float(double(1.0)) == 2.0 and double._cache_size() == 1
    release_compiled()  # also hands the freed heap back to the system (glibc), a no-op elsewhere
    assert double._cache_size() == 0
    assert float(double(3.0)) == 6.0 and double._cache_size() == 1
