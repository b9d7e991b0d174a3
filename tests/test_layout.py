"""The package layout and dependency direction ppl promises, checked by parsing imports."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"ppl": "ppl", "models": "ppl.models", "inference": "ppl.inference", "diagnostics": "ppl.diagnostics"}


def _from_names(node: ast.ImportFrom) -> list[str]:
    # `from ppl.inference import laplace` imports the module ppl.inference.laplace: name it so
    if node.module in ("ppl.inference", "ppl.diagnostics"):
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


def test_models_and_diagnostics_import_only_core():
    for folder in ("models", "diagnostics"):
        for path in _files(folder):
            for name in _all_imports(path):
                if folder == "models":
                    assert not name.startswith(("ppl.inference", "ppl.diagnostics")), (path, name)
                else:
                    assert not name.startswith(("ppl.inference", "ppl.models")), (path, name)


def test_inference_does_not_import_diagnostics():
    for path in _files("inference"):
        for name in _all_imports(path):
            assert not name.startswith("ppl.diagnostics"), (path, name)


# inference/'s shared machinery, which the core builds on (the Gaussian families and the curvature
# service, the run loop, the objectives, the registry): a module of ppl/ may import these at module
# level, but never a method's own module, which it reaches through the registry.
SHARED_INFERENCE = {"_base", "_curvature", "_devices", "_flow", "_gaussian", "_loop", "guides", "objectives", "registry"}


# the modules of ppl/ above inference/ and diagnostics/: the API (they run fits and judge them),
# the loader and the verdict it decides again from a saved run's records
API = {"_fit.py", "_compare.py", "_kfold.py", "_calibrate.py", "_sbc.py", "_evaluate.py", "_load.py", "_verdict.py"}


def test_core_reaches_methods_through_the_registry():
    # the command line is the front end, above inference/ and diagnostics/: its command modules
    # import them at module level, and its package imports a command's module only when it runs
    for path in _files("ppl"):
        if path.parent == CLI or path.name in API:
            continue
        for name in _module_level_imports(path):
            assert not name.startswith("ppl.diagnostics"), (path, name)
            if name.startswith("ppl.inference."):
                assert name.split(".")[2] in SHARED_INFERENCE, (path, name)
    for name in SHARED_INFERENCE:
        for imported in _all_imports(ROOT / "inference" / f"{name}.py"):
            # the shared machinery sits below the Posterior and the methods
            assert not imported.startswith(("ppl._posterior", "ppl._fit", "ppl._io")), (name, imported)
            if imported.startswith("ppl.inference."):
                assert imported.split(".")[2] in SHARED_INFERENCE, (name, imported)


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
                "ppl", "ppl._cache", "ppl._errors", "ppl._interrupt", "ppl._methods_text", "ppl.datasets",
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


def _package_modules() -> dict:
    """{dotted name: path} of every module of the package."""
    modules = {}
    for folder, package in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = [p for p in path.relative_to(ROOT / folder).with_suffix("").parts if p != "__init__"]
            modules[".".join([package, *parts])] = path
    return modules


def _imported_modules(node, modules: dict) -> list[str]:
    """The package modules an import statement loads (`from ppl import _io` loads ppl._io)."""
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
# and the command line's listings stay fast), a platform or JAX-version fallback, the Posterior's
# diagnostics(), summary() and to_arviz(), which reach up into diagnostics/.
LATE = ("arviz", "matplotlib", "xarray", "rich", "sklearn", "flax", "equinox", "fcntl")
LATE_IN = {
    "ppl._cache": ("jax",), "ppl._interrupt": ("jax",), "ppl.inference._devices": ("jax.experimental.shard_map",),
    "ppl._posterior": ("ppl.diagnostics",),
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
    # what one module uses of another is that module's public surface (a private module, ppl._io,
    # may be imported; its underscored names stay its own)
    modules = _package_modules()
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ppl"):
                for alias in node.names:
                    private = alias.name.startswith("_") and not alias.name.startswith("__")
                    assert not private or f"{node.module}.{alias.name}" in modules, (
                        f"{path.relative_to(ROOT)}:{node.lineno} imports {alias.name} from {node.module}")
