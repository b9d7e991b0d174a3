"""Read posteriordb's reference draws and data, and compare our draws with them.

The data is a read-only copy of part of posteriordb (BSD-3) outside the repository:

    <root>/reference_draws/<posterior>.json.zip   a list of 10 chains, each {stan name: 1000 draws}
    <root>/data/<data>.json.zip                   the data block, {name: value}
    <root>/posteriors/<posterior>.json            metadata (model and data names, dimensions)

``<root>`` is ``$PPL_SHARED_DATA/posteriordb`` when that variable is set (it may also point at the
``posteriordb`` folder itself), else ``../shared/data/posteriordb`` relative to the repository root
(the layout CI has). Only ``zipfile`` and ``json`` read the files.

Stan names are 1-based (``beta[1]``, ``theta[8]``); :func:`parse_stan_name` turns them into a site
name and a 0-based index into that site's draws, and :func:`select` pulls those columns out of a
``Posterior.draws``-style dict (site -> (chain, draw, *shape)).
"""

from __future__ import annotations

import json
import math
import os
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = [
    "ENV_VAR",
    "Comparison",
    "compare",
    "data_root",
    "load_data",
    "load_metadata",
    "load_reference",
    "missing_reason",
    "parse_stan_name",
    "select",
]

ENV_VAR = "PPL_SHARED_DATA"
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_ROOT = REPO_ROOT.parent / "shared" / "data" / "posteriordb"


def data_root() -> Path | None:
    """The posteriordb folder, or None when it is absent (tests then skip)."""
    candidates = []
    if os.environ.get(ENV_VAR):
        base = Path(os.environ[ENV_VAR]).expanduser()
        candidates += [base / "posteriordb", base]
    candidates.append(DEFAULT_ROOT)
    for path in candidates:
        if (path / "reference_draws").is_dir() and (path / "data").is_dir():
            return path
    return None


def missing_reason(posterior: str | None = None) -> str | None:
    """Why the reference data cannot be used (a skip reason), or None when it is there."""
    root = data_root()
    if root is None:
        return (
            f"posteriordb reference data not found: set {ENV_VAR} to the shared data folder or provide "
            f"{DEFAULT_ROOT} (read-only copy of posteriordb's reference_draws/, data/, posteriors/)"
        )
    if posterior is not None:
        meta = root / "posteriors" / f"{posterior}.json"
        draws = root / "reference_draws" / f"{posterior}.json.zip"
        for path in (meta, draws):
            if not path.is_file():
                return f"posteriordb file {path} is missing"
    return None


def _root() -> Path:
    root = data_root()
    if root is None:
        raise FileNotFoundError(missing_reason())
    return root


def _read_zipped_json(path: Path):
    with zipfile.ZipFile(path) as archive:
        names = [n for n in archive.namelist() if n.endswith(".json")]
        if len(names) != 1:
            raise ValueError(f"{path} should hold exactly one .json file, has {archive.namelist()}")
        return json.loads(archive.read(names[0]))


def load_metadata(posterior: str) -> dict:
    """``posteriors/<posterior>.json``: model_name, data_name, dimensions, ..."""
    return json.loads((_root() / "posteriors" / f"{posterior}.json").read_text())


def load_data(posterior: str) -> dict:
    """The posterior's data block as numpy arrays (scalars stay Python numbers)."""
    name = load_metadata(posterior)["data_name"]
    raw = _read_zipped_json(_root() / "data" / f"{name}.json.zip")
    return {k: (np.asarray(v) if isinstance(v, list) else v) for k, v in raw.items()}


def load_reference(posterior: str) -> dict[str, np.ndarray]:
    """Reference draws: Stan name -> (chain, draw) float64 array, in posteriordb's column order."""
    chains = _read_zipped_json(_root() / "reference_draws" / f"{posterior}.json.zip")
    names = list(chains[0])
    return {name: np.asarray([chain[name] for chain in chains], dtype=float) for name in names}


_STAN_NAME = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(?:\[([0-9, ]+)\])?$")


def parse_stan_name(name: str) -> tuple[str, tuple[int, ...]]:
    """``"beta[3]"`` -> ``("beta", (2,))``; ``"b[1,2]"`` -> ``("b", (0, 1))``; ``"sigma"`` -> ``("sigma", ())``."""
    match = _STAN_NAME.match(name)
    if match is None:
        raise ValueError(f"not a Stan parameter name: {name!r}")
    site, index = match.groups()
    if index is None:
        return site, ()
    return site, tuple(int(i) - 1 for i in index.split(","))


def select(draws: dict, names, rename: dict | None = None) -> dict[str, np.ndarray]:
    """For each Stan name, the (chain, draw) array of our matching site element.

    ``rename`` maps a Stan site name to ours where they differ (``{"beta": "w"}``).
    """
    rename = rename or {}
    out = {}
    for name in names:
        site, index = parse_stan_name(name)
        site = rename.get(site, site)
        if site not in draws:
            raise KeyError(f"reference parameter {name!r} needs site {site!r}; our draws have {sorted(draws)}")
        values = np.asarray(draws[site])
        event_ndim = values.ndim - 2
        if len(index) != event_ndim:
            raise ValueError(f"{name!r} indexes {len(index)} dimensions, site {site!r} has {event_ndim}")
        out[name] = values[(slice(None), slice(None), *index)]
    return out


@dataclass(frozen=True)
class Comparison:
    """One parameter: our draws against the reference.

    ``z_sd = |Δmean| / ref_sd`` (posteriordb's rule: < 0.25); ``z_mcse = |Δmean| / mcse`` with
    ``mcse = sqrt(sd²/ess + ref_sd²/ref_ess)`` the standard error of the difference of the two
    Monte Carlo means (each ESS for the mean, from ArviZ); ``sd_ratio = sd / ref_sd``.
    """

    name: str
    ref_mean: float
    ref_sd: float
    ref_ess: float
    mean: float
    sd: float
    ess: float

    @property
    def delta(self) -> float:
        return abs(self.mean - self.ref_mean)

    @property
    def z_sd(self) -> float:
        return self.delta / self.ref_sd

    @property
    def mcse(self) -> float:
        return math.sqrt(self.sd**2 / self.ess + self.ref_sd**2 / self.ref_ess)

    @property
    def z_mcse(self) -> float:
        return self.delta / self.mcse

    @property
    def sd_ratio(self) -> float:
        return self.sd / self.ref_sd

    def __str__(self) -> str:
        return (
            f"{self.name:>12}: mean {self.mean:+.5g} (ref {self.ref_mean:+.5g}), |Δ|/sd {self.z_sd:.3f}, "
            f"|Δ|/mcse {self.z_mcse:.2f}, sd ratio {self.sd_ratio:.3f}, ess {self.ess:.0f} (ref {self.ref_ess:.0f})"
        )


def _ess_mean(values: np.ndarray) -> float:
    """ESS for the mean of (chain, draw) draws; independent draws (one chain) count as they are."""
    from ppl.diagnostics import _arviz

    if values.shape[0] < 2:
        return float(values.size)
    return float(_arviz.ess(values, "mean"))


def compare(ours: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> list[Comparison]:
    """One :class:`Comparison` per reference parameter; ``ours`` maps the same names to (chain, draw)."""
    rows = []
    for name, ref in reference.items():
        mine = np.asarray(ours[name], dtype=float)
        rows.append(
            Comparison(
                name=name,
                ref_mean=float(ref.mean()),
                ref_sd=float(ref.std(ddof=1)),
                ref_ess=_ess_mean(ref),
                mean=float(mine.mean()),
                sd=float(mine.std(ddof=1)),
                ess=_ess_mean(mine),
            )
        )
    return rows
