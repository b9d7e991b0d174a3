"""The package layout and dependency direction ppl promises, checked by parsing imports."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"ppl": "ppl", "models": "ppl.models", "inference": "ppl.inference", "diagnostics": "ppl.diagnostics"}


def _module_level_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    names = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    return names


def _all_imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
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


def test_core_reaches_backends_lazily():
    # the command line is the front end, above inference/ and diagnostics/: its command modules
    # import them at module level, and its package imports a command's module only when it runs
    for path in _files("ppl"):
        if path.parent == CLI:
            continue
        for name in _module_level_imports(path):
            assert not name.startswith(("ppl.inference", "ppl.diagnostics")), (path, name)


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
