"""What every method shares: the options dataclass base and option parsing for the CLI."""

from __future__ import annotations

import dataclasses
import typing
from typing import ClassVar

from ppl._errors import OptionError

__all__ = ["Method", "check_choice", "check_positive_int", "check_positive"]


@dataclasses.dataclass(frozen=True)
class Method:
    """A method is a frozen, hashable options dataclass with ``run(key, problem) -> Posterior``.

    Subclasses set ``name`` and ``description`` and declare their options as dataclass fields with
    defaults; ``__post_init__`` validates them (raising :class:`ppl.OptionError`).
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""

    def run(self, key, problem):  # pragma: no cover - abstract
        raise NotImplementedError

    def check(self, problem) -> None:
        """Method-specific checks against the problem, before anything is compiled."""

    @classmethod
    def option_defaults(cls) -> dict:
        return {f.name: f.default for f in dataclasses.fields(cls)}

    @classmethod
    def parse_option(cls, key: str, text: str):
        """Convert ``--set key=text`` to the option's declared type."""
        hints = typing.get_type_hints(cls)
        if key not in hints:
            raise OptionError(f"{cls.name} has no option {key!r}; valid options: {', '.join(cls.option_defaults())}")
        return parse_value(text, hints[key], f"{cls.name} option {key}")

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def parse_value(text: str, hint, where: str):
    args = typing.get_args(hint)
    optional = type(None) in args
    if optional and text.lower() in ("none", "null"):
        return None
    base = next((a for a in args if a is not type(None)), hint) if args else hint
    try:
        if base is bool:
            if text.lower() in ("true", "1", "yes"):
                return True
            if text.lower() in ("false", "0", "no"):
                return False
            raise ValueError(text)
        if base is int:
            return int(text)
        if base is float:
            return float(text)
        if typing.get_origin(base) is tuple or base is tuple:
            return tuple(int(part) for part in text.split(",") if part.strip())
        return text
    except ValueError:
        raise OptionError(f"{where}: cannot read {text!r} as {getattr(base, '__name__', base)}") from None


def check_choice(method: str, option: str, value, choices) -> None:
    if value not in choices:
        raise OptionError(f"{method}: {option}={value!r} is not one of {', '.join(map(repr, choices))}")


def check_positive_int(method: str, option: str, value, allow_zero: bool = False) -> None:
    low = 0 if allow_zero else 1
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise OptionError(f"{method}: {option} must be an integer ≥ {low}, got {value!r}")


def check_positive(method: str, option: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value != value:
        raise OptionError(f"{method}: {option} must be a positive number, got {value!r}")
