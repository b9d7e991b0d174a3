"""Inference backends. Methods are reached through :mod:`ppl.inference.registry`, lazily."""

from __future__ import annotations

from ppl.inference.registry import METHODS, create, describe, get

__all__ = ["METHODS", "create", "describe", "get"]
