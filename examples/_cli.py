"""The command line the examples share: ``--out``, ``--seed`` and, where an example offers a small
instance, ``--quick``; every value is checked before anything is fitted."""

from __future__ import annotations

import argparse
from pathlib import Path


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a seed is a non-negative integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"a seed is a non-negative integer, got {value}")
    return value


def parser(doc: str, name: str, *, out: bool = True, quick: str | None = None) -> argparse.ArgumentParser:
    """The parser of example ``name`` (its description: the first line of ``doc``); ``out`` adds
    ``--out`` (default ``runs/<name>``), ``quick`` (its help text) adds ``--quick``."""
    result = argparse.ArgumentParser(prog=f"python -m examples.{name}", description=doc.splitlines()[0])
    if out:
        result.add_argument("--out", default=f"runs/{name}", help="the folder the figures and the table go to")
    result.add_argument("--seed", type=_seed, default=0, help="the seed of every fit and draw (default 0)")
    if quick is not None:
        result.add_argument("--quick", action="store_true", help=quick)
    return result


def parse(parser: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """The arguments; ``args.out`` becomes a folder that exists (made if missing). A path that is
    an existing file is refused before anything runs."""
    args = parser.parse_args(argv)
    if getattr(args, "out", None) is not None:
        out = Path(args.out)
        if out.exists() and not out.is_dir():
            parser.error(f"--out {out}: this is a file; give a folder (it is made if missing)")
        out.mkdir(parents=True, exist_ok=True)
        args.out = out
    return args
