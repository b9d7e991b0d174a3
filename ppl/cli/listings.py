"""``ppl datasets`` and ``ppl methods``: the lists, printed without loading JAX."""

from __future__ import annotations

from ppl._methods_text import METHODS_TEXT  # written from the classes; see ppl/_catalogue.py
from ppl.datasets import DESCRIPTIONS


def datasets(args) -> int:
    for name, text in DESCRIPTIONS.items():
        print(f"{name:<15} {text}")
    return 0


def methods(args) -> int:
    print(METHODS_TEXT, end="")
    return 0
