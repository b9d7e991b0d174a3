"""Inference backends. Methods are reached through :mod:`ppl.core.registry`, lazily."""

from __future__ import annotations

from ppl.core.registry import METHODS, create, describe, get

__all__ = ["METHODS", "create", "describe", "get"]
