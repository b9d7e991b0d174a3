"""What ``ppl methods`` prints: every model and method with its options and defaults.

The models and methods are classes in modules that load JAX, and ``ppl methods`` must answer in well
under a second, so the listing is kept as text in ``ppl/_methods_text.py``, written from the classes
themselves by ``python -m ppl._catalogue``. A test compares it with a fresh listing, so it cannot
drift from them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ppl.core import registry
from ppl.models import BNN, VAE, LinearRegression, LogisticRegression

__all__ = ["methods_text", "rewrite"]


def methods_text() -> str:
    """The listing, built from the model and method classes (loads JAX)."""
    models = {"linear": LinearRegression, "logistic": LogisticRegression, "bnn": BNN, "vae": VAE}
    lines = ["models (--model NAME; options with --set KEY=VALUE):"]
    for name, cls in models.items():
        lines.append(f"  {name:<14} {cls.__name__}: {(cls.__doc__ or '').strip().splitlines()[0]}")
        for field in dataclasses.fields(cls):
            if field.name == "prior":
                continue  # a Python object, set from the API only
            default = field.default if field.default is not dataclasses.MISSING else "(required)"
            lines.append(f"                 {field.name} = {default!r}")
    lines.append("methods (--method NAME; options with --set KEY=VALUE):")
    for name, description, options in registry.describe():
        lines.append(f"  {name:<14} {description}")
        for key, value in options.items():
            lines.append(f"                 {key} = {value!r}")
    return "\n".join(lines) + "\n"


def rewrite() -> Path:
    """Write a fresh listing to ``ppl/_methods_text.py`` (after a model's or a method's options change)."""
    path = Path(__file__).with_name("_methods_text.py")
    path.write_text(
        '"""What `ppl methods` prints. Written by `python -m ppl._catalogue`; do not edit."""\n\n'
        f"METHODS_TEXT = {methods_text()!r}\n"
    )
    return path


if __name__ == "__main__":
    print(f"wrote {rewrite()}")
