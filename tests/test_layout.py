"""The package layout and dependency direction ppl promises, checked by parsing imports."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"ppl": "ppl", "models": "ppl.models", "inference": "ppl.inference", "diagnostics": "ppl.diagnostics"}


def _from_names(node: ast.ImportFrom) -> list[str]:
    # `from ppl.core import progress` imports the module ppl.core.progress: name it so
    if node.module in ("ppl.core", "ppl.io", "ppl.inference", "ppl.diagnostics"):
        return [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return [node.module]


def _module_level_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    names = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.extend(_from_names(node))
    return names


def _all_imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.extend(_from_names(node))
    return names


def _files(folder: str):
    return sorted((ROOT / folder).rglob("*.py"))


CLI = ROOT / "ppl" / "cli"


# The layers, bottom to top. A module may import its own layer and the layers below; the table
# lists, for each layer, the layers it must never import (at module level or inside a function).
#   core         ppl/core/: errors, records, keys, data, Problem, Posterior, Gaussian families,
#                curvature, method protocol and registry, objectives, run loop and its runtime
#   models       models/: generative programs (import only the core's errors and their own priors)
#   diagnostics  diagnostics/: pure functions of a Posterior (which they never import)
#   io           ppl/io/: run folders (store), loading, the verdict decided again on load
#   inference    inference/: one module per method family and the methods' shared algorithms
#   api          ppl/*.py: fit, compare, kfold, calibrate, sbc, evaluate, vae_report, datasets
#   cli          ppl/cli/: one module per command
FORBIDDEN = {
    "core": {"io", "inference", "api", "cli"},
    "models": {"core", "diagnostics", "io", "inference", "api", "cli"},
    "diagnostics": {"io", "inference", "api", "cli"},
    "io": {"inference", "api", "cli"},
    "inference": {"diagnostics", "io", "api", "cli"},
    "api": {"cli"},
    "cli": set(),
}
# what a layer may use of one it otherwise must not: models raise the core's errors; the Posterior's
# diagnostics(), summary() and to_arviz() apply diagnostics/ to it; the core writes run folders
# (checkpoints, Posterior.save) through the store
EXCEPT = {
    ("models", "ppl.core.errors"),
    ("ppl.core.posterior", "ppl.diagnostics"),
    ("core", "ppl.io.store"),
}
BELOW_POSTERIOR = ("ppl.diagnostics", "ppl.io.store")  # may not import the Posterior (it imports them)


def _layer(module: str) -> str:
    for prefix, layer in (("ppl.core", "core"), ("ppl.models", "models"), ("ppl.diagnostics", "diagnostics"),
                          ("ppl.io", "io"), ("ppl.inference", "inference"), ("ppl.cli", "cli")):
        if module == prefix or module.startswith(prefix + "."):
            return layer
    return "api"


def test_every_layer_imports_only_the_layers_below_it():
    modules = _package_modules()
    for name, path in modules.items():
        mine = _layer(name)
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or getattr(node, "level", 0):
                continue
            for imported in _imported_modules(node, modules):
                if imported == "ppl":
                    continue  # the package root: errors and lazy names only (checked below)
                theirs = _layer(imported)
                allowed = any((who in (mine, name) or name.startswith(who + ".")) and (
                    imported == what or imported.startswith(what + ".")) for who, what in EXCEPT)
                assert theirs not in FORBIDDEN[mine] or allowed, (
                    f"{path.relative_to(ROOT)}:{node.lineno}: {name} ({mine}) imports {imported} ({theirs})")
                if name.startswith(BELOW_POSTERIOR):
                    assert imported != "ppl.core.posterior", (path, imported)


def test_the_package_root_imports_only_errors():
    # `import ppl` is quick and below everything: every other public name is a lazy attribute
    modules = _package_modules()
    tree = ast.parse((ROOT / "ppl" / "__init__.py").read_text())
    imported = [m for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                for m in _imported_modules(node, modules) if not getattr(node, "level", 0)]
    assert set(imported) <= {"ppl.core.errors"}, imported


def test_methods_are_reached_through_the_registry():
    # nothing below the API imports a method's module; the registry names them as strings
    for path in _files("ppl"):
        if path.parent.name in ("core", "io"):
            for name in _all_imports(path):
                assert not name.startswith("ppl.inference"), (path, name)


def test_the_core_does_not_look_methods_up_by_name():
    # The registry imports a method's module on request, which from the core would reach the layer
    # above it: the Posterior hears from its method's class (declared_by), passed by the method or
    # the loader.
    for path in _files("ppl/core"):
        if path.name in ("registry.py", "__init__.py"):
            continue
        assert "ppl.core.registry" not in _all_imports(path), path


def test_the_command_line_imports_at_module_level():
    # every dependency of a command is visible at the top of its module; the one exception is
    # matplotlib, which only the VAE figure of `ppl fit --model vae` needs (a second to import)
    for path in sorted(CLI.glob("*.py")):
        inside = [n for n in _all_imports(path) if n not in _module_level_imports(path)]
        assert all(n.startswith("matplotlib") for n in inside), (path, inside)
    for name in ("__init__.py", "_arguments.py", "listings.py"):
        for module in _module_level_imports(CLI / name):
            root = module.split(".")[0]
            assert root in sys.stdlib_module_names or root == "__future__" or module in (
                "ppl", "ppl.core", "ppl.core.cache", "ppl.core.errors", "ppl.core.interrupt", "ppl._methods_text", "ppl.datasets",
                "ppl.cli._arguments"), (name, module)


def test_only_the_adapter_imports_arviz():
    for folder in FOLDERS:
        for path in _files(folder):
            if path.name == "_arviz.py":
                continue
            assert not any(n == "arviz" or n.startswith("arviz.") for n in _all_imports(path)), path


def test_import_ppl_loads_no_backend_and_not_jax():
    # every public name is imported on first use (ppl.fit loads JAX), so `import ppl` is quick
    code = ("import sys, ppl; print([m for m in sys.modules "
            "if m.startswith(('ppl.inference', 'ppl.diagnostics', 'arviz', 'jax', 'numpyro'))])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_first_map_fit_imports_no_arviz_nor_scikit_learn():
    # a second and a half of a five-second first fit: two-moons are drawn without scikit-learn, and
    # R-hat and ESS are computed without ArviZ, which loads on first use (PSIS, export, plots)
    code = ("import sys, ppl; from ppl.models import BNN; data = ppl.datasets.load('two_moons', seed=0); "
            "post = ppl.fit(BNN(hidden=(4,), likelihood='bernoulli'), data.train, method='map', seed=0, steps=20); "
            "post.diagnostics(); print(sorted({m.split('.')[0] for m in sys.modules} & {'arviz', 'sklearn', 'matplotlib'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_package_dir_mapping():
    import ppl.diagnostics
    import ppl.inference
    import ppl.models

    assert Path(ppl.models.__file__).parent.name == "models"
    assert Path(ppl.inference.__file__).parent.name == "inference"
    assert Path(ppl.diagnostics.__file__).parent.name == "diagnostics"
    import ppl.core
    import ppl.io

    assert Path(ppl.core.__file__).parent.relative_to(ROOT).as_posix() == "ppl/core"
    assert Path(ppl.io.__file__).parent.relative_to(ROOT).as_posix() == "ppl/io"


def _package_modules() -> dict:
    """{dotted name: path} of every module of the package."""
    modules = {}
    for folder, package in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = [p for p in path.relative_to(ROOT / folder).with_suffix("").parts if p != "__init__"]
            modules[".".join([package, *parts])] = path
    return modules


def _imported_modules(node, modules: dict) -> list[str]:
    """The package modules an import statement loads (`from ppl.io import store` loads ppl.io.store)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        subs = [f"{node.module}.{alias.name}" for alias in node.names if f"{node.module}.{alias.name}" in modules]
        names = subs if len(subs) == len(node.names) else [node.module, *subs]
    found = []
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name:
            found.append(name)
    return found



# Imports inside functions, and why: optional or slow dependencies loaded on first use (import ppl
# and the command line's listings stay fast) and a platform or JAX-version fallback. No module of
# the package is ever imported inside a function.
LATE = ("arviz", "matplotlib", "xarray", "rich", "sklearn", "flax", "equinox", "fcntl")
LATE_IN = {
    "ppl.core.cache": ("jax",), "ppl.core.interrupt": ("jax",), "ppl.core.devices": ("jax.experimental.shard_map",),
}


def test_the_import_graph_has_no_cycle():
    modules = _package_modules()
    edges = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and not getattr(node, "level", 0):
                edges[name].update(m for m in _imported_modules(node, modules) if m != name)

    def reach(start):
        seen, todo = set(), [start]
        while todo:
            for nxt in edges[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        return seen

    reachable = {name: reach(name) for name in modules}
    cycles = {frozenset(m for m in modules if m in reachable[name] and name in reachable[m]) for name in modules}
    assert not [sorted(c) for c in cycles if c]


def test_imports_are_at_module_level_but_the_late_ones():
    for name, path in _package_modules().items():
        tree = ast.parse(path.read_text())
        top = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or id(node) in top:
                continue
            if any(id(node) in {id(n) for n in ast.walk(stmt)} for stmt in tree.body if isinstance(stmt, ast.Try)):
                continue  # a module-level try: an import with a fallback
            for imported in [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]:
                allowed = LATE + LATE_IN.get(name, ())
                assert imported.startswith(allowed), f"{path.relative_to(ROOT)}:{node.lineno} imports {imported} inside a function"


def test_no_module_imports_a_private_name_of_another():
    # what one module uses of another is that module's public surface (a private module, ppl.io.store,
    # may be imported; its underscored names stay its own)
    modules = _package_modules()
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ppl"):
                for alias in node.names:
                    private = alias.name.startswith("_") and not alias.name.startswith("__")
                    assert not private or f"{node.module}.{alias.name}" in modules, (
                        f"{path.relative_to(ROOT)}:{node.lineno} imports {alias.name} from {node.module}")
